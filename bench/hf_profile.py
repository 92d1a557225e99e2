#!/usr/bin/env python3
"""Where the time of transformers' generate() goes with "sdpa" and with flashjit's "fjit"
attention: tokens/s cold and warm, prefill and decode apart, and the attention operators and GPU
kernels each path actually runs (issue 32: why examples/hf_generate.py's fjit ran ~6x sdpa's
tokens/s on an H200).

    python3 bench/hf_profile.py [--device cpu|cuda] [--dtype bf16|fp16|fp32] [--preset ...]
                                [--batch 8] [--prompt-len 512] [--new-tokens 64]
                                [--pad 0,37,5,0] [--repeats 2] [--sdpa-backends LIST]
                                [--no-unpadded] [--no-profile] [--json PATH]

The model and prompts are examples/hf_generate.py's. For the padding of --pad and, unless
--no-unpadded, for none (sdpa then gets no mask: its flash / cuDNN paths), per implementation
(sdpa under each of --sdpa-backends: "default" is torch's own choice, the others are forced with
torch.nn.attention.sdpa_kernel; fjit once):
  * cold: the first generate() of --new-tokens tokens in the process under that setting (every
    key length new: what per-shape setup costs, e.g. a cuDNN execution graph built per key length
    or a flashjit kernel compiled or loaded; the caches are the process's, so a backend forced
    after "default" chose it runs warm);
  * warm: the median of --repeats more of the same call (every shape seen), between
    torch.cuda.synchronize() calls; prefill: the median of --repeats generate() calls of one new
    token; decode per step: (warm - prefill) / (new tokens - 1);
  * profiles (torch.profiler, default backend only): the prefill of a prompt of an unseen length
    (cold) and of the same length again (warm), then one cached decode step at an unseen key
    length (cold) and the same step again (warm): wall time, the host time of the attention
    calls (transformers' attention function per implementation, wrapped in a record_function),
    the aten / flashjit operators they run (aten::_scaled_dot_product_cudnn_attention,
    _flash_attention, _efficient_attention, _attention_math, flashjit.attention) and the GPU
    kernels by name, classed as cudnn / flash / efficient / math / flashjit / other.
The log ends with the explanation those figures give (the JSON has every figure).
"""
import argparse
import contextlib
import inspect
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "examples"))
import hf_generate  # noqa: E402

BACKENDS = ("default", "cudnn", "flash", "efficient", "math")
SDPA_OPS = {  # aten operator -> the SDPA backend it is
    "aten::_scaled_dot_product_cudnn_attention": "cudnn",
    "aten::_scaled_dot_product_flash_attention": "flash",
    "aten::_scaled_dot_product_efficient_attention": "efficient",
    "aten::_scaled_dot_product_attention_math": "math",
    "aten::_scaled_dot_product_flash_attention_for_cpu": "cpu-flash",
    "aten::_scaled_dot_product_fused_attention_overrideable": "overrideable",
}
FLASHJIT_OPS = ("flashjit.attention", "flashjit.attention(varlen)")


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    hf_generate.add_model_args(parser, new_tokens=16)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--sdpa-backends", default=None,
                        help=f"comma-separated of {','.join(BACKENDS)} (default: all on CUDA, "
                             f"'default' on the CPU)")
    parser.add_argument("--no-unpadded", action="store_true",
                        help="skip the runs without padding")
    parser.add_argument("--no-profile", action="store_true")
    parser.add_argument("--json", default=None)
    args = hf_generate.finish_model_args(parser, parser.parse_args(argv))
    cuda = args.device.startswith("cuda")
    if args.new_tokens < 2 or args.repeats < 1:
        parser.error(f"--new-tokens {args.new_tokens} (>= 2: prefill and decode apart), "
                     f"--repeats {args.repeats} (>= 1)")
    backends = args.sdpa_backends or (",".join(BACKENDS) if cuda else "default")
    args.sdpa_backends = [b.strip() for b in backends.split(",") if b.strip()]
    unknown = [b for b in args.sdpa_backends if b not in BACKENDS]
    if unknown or not args.sdpa_backends:
        parser.error(f"--sdpa-backends {backends!r}: expected a list of {', '.join(BACKENDS)}")
    return args


def backend_context(torch, backend):
    if backend in (None, "default"):
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel({"cudnn": SDPBackend.CUDNN_ATTENTION,
                        "flash": SDPBackend.FLASH_ATTENTION,
                        "efficient": SDPBackend.EFFICIENT_ATTENTION,
                        "math": SDPBackend.MATH}[backend])


class Clock:
    def __init__(self, torch, device):
        self.torch, self.cuda = torch, device.startswith("cuda")

    def sync(self):
        if self.cuda:
            self.torch.cuda.synchronize()

    def time(self, fn):
        self.sync()
        start = time.perf_counter()
        out = fn()
        self.sync()
        return time.perf_counter() - start, out


def generate_seconds(model, ids, mask, new_tokens, clock, torch):
    def call():
        with torch.no_grad():
            return model.generate(ids, attention_mask=mask, max_new_tokens=new_tokens,
                                  min_new_tokens=new_tokens, do_sample=False)
    return clock.time(call)[0]


def timings(model, ids, mask, args, clock, torch):
    """cold / warm / prefill seconds of generate() (see the module's documentation)."""
    n = args.new_tokens
    cold = generate_seconds(model, ids, mask, n, clock, torch)
    warm = statistics.median(generate_seconds(model, ids, mask, n, clock, torch)
                             for _ in range(args.repeats))
    prefill = statistics.median(generate_seconds(model, ids, mask, 1, clock, torch)
                                for _ in range(args.repeats))
    tokens = args.batch * n
    return dict(cold_s=cold, warm_s=warm, prefill_s=prefill,
                decode_ms_per_step=1e3 * max(warm - prefill, 0.0) / (n - 1),
                cold_decode_ms_per_step=1e3 * max(cold - prefill, 0.0) / (n - 1),
                tokens_per_s_cold=tokens / cold, tokens_per_s_warm=tokens / warm)


# --- profiles ----------------------------------------------------------------------------------

@contextlib.contextmanager
def traced_attention(torch, transformers, names):
    """Wraps transformers' attention functions `names` and flashjit.attention in
    record_function ranges ("attention: NAME", "flashjit.attention[(varlen)]") meanwhile."""
    import flashjit

    mapping = transformers.AttentionInterface._global_mapping
    saved = {name: mapping[name] for name in names if name in mapping}
    original = flashjit.attention

    def wrap(name, fn):
        def traced(*a, **k):
            with torch.profiler.record_function(f"attention: {name}"):
                return fn(*a, **k)
        return traced

    def traced_flashjit(*a, **k):
        label = FLASHJIT_OPS[1] if k.get("cu_seqlens_q") is not None else FLASHJIT_OPS[0]
        with torch.profiler.record_function(label):
            return original(*a, **k)

    try:
        for name, fn in saved.items():
            mapping[name] = wrap(name, fn)
        flashjit.attention = traced_flashjit
        yield
    finally:
        mapping.update(saved)
        flashjit.attention = original


def kernel_class(name):
    low = name.lower()
    if low.startswith("flashjit_"):
        return "flashjit"
    if "cudnn" in low and any(x in low for x in ("sdpa", "fmha", "attn", "flash")):
        return "cudnn"
    if "flash_fwd" in low or "pytorch_flash" in low or "flash::" in low:
        return "flash"
    if "fmha" in low or "cutlassf" in low or "efficient" in low or "mem_eff" in low:
        return "efficient"
    if "softmax" in low:
        return "softmax (math)"
    if "gemm" in low or "gemv" in low or "cublas" in low or "nvjet" in low:
        return "matmul"
    return "other"


def profile_call(fn, torch, clock, cuda):
    """Runs fn() under torch.profiler: (fn's result, the summary dict)."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    clock.sync()
    with profile(activities=activities) as prof:
        start = time.perf_counter()
        out = fn()
        clock.sync()
        wall = time.perf_counter() - start
    ops, kernels = {}, {}
    for event in prof.events():
        name = event.name
        us = event.time_range.elapsed_us()
        if "CUDA" in str(getattr(event, "device_type", "")):
            entry = kernels.setdefault(name, dict(count=0, ms=0.0, cls=kernel_class(name)))
        elif (name.startswith("attention: ") or name in SDPA_OPS or name in FLASHJIT_OPS or
              name == "aten::scaled_dot_product_attention"):
            entry = ops.setdefault(name, dict(count=0, ms=0.0))
        else:
            continue
        entry["count"] += 1
        entry["ms"] += us / 1e3
    classes = {}
    for entry in kernels.values():
        c = classes.setdefault(entry["cls"], dict(count=0, ms=0.0))
        c["count"] += entry["count"]
        c["ms"] += entry["ms"]
    top = sorted(kernels.items(), key=lambda kv: -kv[1]["ms"])[:12]
    return out, dict(
        wall_ms=wall * 1e3, ops=ops, kernel_classes=classes,
        kernels_ms=sum(e["ms"] for e in kernels.values()),
        top_kernels=[dict(name=k[:160], **v) for k, v in top],
        sdpa_backends=sorted({SDPA_OPS[n] for n in ops if n in SDPA_OPS}),
        flashjit_calls=sum(ops[n]["count"] for n in FLASHJIT_OPS if n in ops))


def profiles(model, ids, mask, args, clock, torch):
    """Prefill cold / warm and one decode step cold / warm (see the module's documentation)."""
    cuda = args.device.startswith("cuda")
    extra = args.new_tokens + 8  # a prompt length no generate() above has seen
    generator = torch.Generator().manual_seed(args.seed + 2)
    more = torch.randint(1, model.config.vocab_size, (ids.shape[0], extra), generator=generator)
    long_ids = torch.cat((ids, more.to(ids.device)), 1)
    long_mask = torch.cat((mask, torch.ones_like(more).to(mask.device)), 1)
    positions = (long_mask.long().cumsum(-1) - 1).clamp(min=0)

    def prefill():
        with torch.no_grad():
            return model(long_ids, attention_mask=long_mask, position_ids=positions,
                         use_cache=True)

    result = {}
    out_a, result["prefill_cold"] = profile_call(prefill, torch, clock, cuda)
    out_b, result["prefill_warm"] = profile_call(prefill, torch, clock, cuda)
    token = out_a.logits[:, -1].argmax(-1, keepdim=True)
    step_mask = torch.cat((long_mask, torch.ones_like(token)), 1)
    step_position = positions[:, -1:] + 1
    # transformers 5.2x names the cache argument and output "cache" ("past_key_values" before).
    name = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    for label, out in (("decode_cold", out_a), ("decode_warm", out_b)):
        cache = getattr(out, "cache", None)
        cache = out.past_key_values if cache is None else cache

        def step(cache=cache):
            with torch.no_grad():
                return model(token, attention_mask=step_mask, position_ids=step_position,
                             use_cache=True, **{name: cache})
        _, result[label] = profile_call(step, torch, clock, cuda)
    return result


# --- the run -----------------------------------------------------------------------------------

def measure(args, torch, transformers, name="fjit"):
    clock = Clock(torch, args.device)
    model = hf_generate.build_model(args, torch, transformers)
    paddings = [("padded", args.pad)]
    if not args.no_unpadded and any(args.pad):
        paddings.append(("unpadded", [0]))
    runs = []
    for padding, pads in paddings:
        settings = [("sdpa", b) for b in args.sdpa_backends] + [(name, None)]
        run_args = argparse.Namespace(**{**vars(args), "pad": pads})
        ids, mask = hf_generate.prompts(run_args, torch, model.config.vocab_size)
        for implementation, backend in settings:
            model.set_attn_implementation(implementation)
            entry = dict(padding=padding, pads=pads, implementation=implementation,
                         backend=backend or "flashjit")
            try:
                with backend_context(torch, backend):
                    entry.update(timings(model, ids, mask, args, clock, torch))
                    if not args.no_profile and backend in (None, "default"):
                        with traced_attention(torch, transformers, ("sdpa", name)):
                            entry["profile"] = profiles(model, ids, mask, args, clock, torch)
            except RuntimeError as error:  # a backend that cannot run this call
                entry["error"] = str(error).strip().splitlines()[0][:300]
            runs.append(entry)
            print(line(entry, args), flush=True)
    device = torch.cuda.get_device_name(args.device) if clock.cuda else "CPU"
    summary = dict(preset=args.preset, device=device, dtype=args.dtype, batch=args.batch,
                   prompt_len=args.prompt_len, new_tokens=args.new_tokens, pad=args.pad,
                   repeats=args.repeats, runs=runs, torch_version=torch.__version__,
                   transformers_version=transformers.__version__)
    summary["explanation"] = explain(summary, name)
    return summary


def line(entry, args):
    label = f"{entry['padding']:>8} {entry['implementation']:>4} {entry['backend']:<9}"
    if "error" in entry:
        return f"{label} cannot run: {entry['error']}"
    return (f"{label} tokens/s cold {entry['tokens_per_s_cold']:8.1f} warm "
            f"{entry['tokens_per_s_warm']:8.1f}; prefill {entry['prefill_s'] * 1e3:7.1f} ms; "
            f"decode {entry['decode_ms_per_step']:6.2f} ms/step warm, "
            f"{entry['cold_decode_ms_per_step']:6.2f} cold")


def describe_profile(label, p):
    ops = ", ".join(f"{k} x{v['count']} {v['ms']:.2f} ms" for k, v in sorted(p["ops"].items()))
    ordered = sorted(p["kernel_classes"].items(), key=lambda kv: -kv[1]["ms"])
    classes = ", ".join(f"{k} x{v['count']} {v['ms']:.3f} ms" for k, v in ordered)
    text = f"{label}: wall {p['wall_ms']:.2f} ms; host ops: {ops or 'none'}"
    if p["kernel_classes"]:
        text += f"; GPU kernels {p['kernels_ms']:.3f} ms: {classes}"
    return text


def attention_host_ms(p):
    return sum(v["ms"] for n, v in p["ops"].items() if n.startswith("attention: "))


def explain(summary, name):
    """Sentences drawn from the figures (the log's last lines)."""
    runs = [r for r in summary["runs"] if "error" not in r]
    out = []
    for padding in ("padded", "unpadded"):
        by = {(r["implementation"], r["backend"]): r for r in runs if r["padding"] == padding}
        sdpa, fjit = by.get(("sdpa", "default")), by.get((name, "flashjit"))
        if not sdpa or not fjit:
            continue
        out.append(
            f"{padding}: tokens/s fjit / sdpa (torch's default backend) = "
            f"{fjit['tokens_per_s_cold'] / sdpa['tokens_per_s_cold']:.2f} cold, "
            f"{fjit['tokens_per_s_warm'] / sdpa['tokens_per_s_warm']:.2f} warm; prefill "
            f"{fjit['prefill_s'] * 1e3:.1f} vs {sdpa['prefill_s'] * 1e3:.1f} ms, decode "
            f"{fjit['decode_ms_per_step']:.2f} vs {sdpa['decode_ms_per_step']:.2f} ms/step warm, "
            f"{fjit['cold_decode_ms_per_step']:.2f} vs {sdpa['cold_decode_ms_per_step']:.2f} cold")
        forced = [r for (i, b), r in by.items() if i == "sdpa" and b != "default"]
        if forced:
            best = max(forced, key=lambda r: r["tokens_per_s_warm"])
            out.append(f"{padding}: the fastest forced sdpa backend warm is {best['backend']} "
                       f"({best['tokens_per_s_warm']:.1f} tokens/s, cold "
                       f"{best['tokens_per_s_cold']:.1f}); fjit warm "
                       f"{fjit['tokens_per_s_warm']:.1f} "
                       f"({fjit['tokens_per_s_warm'] / best['tokens_per_s_warm']:.2f}x)")
        backends = None
        for implementation, run in (("sdpa", sdpa), (name, fjit)):
            p = run.get("profile")
            if not p:
                continue
            if implementation == "sdpa":
                backends = p["decode_cold"]["sdpa_backends"]
                out.append(f"{padding} sdpa runs: prefill "
                           f"{'/'.join(p['prefill_warm']['sdpa_backends']) or '?'}, decode "
                           f"{'/'.join(p['decode_warm']['sdpa_backends']) or '?'}")
            else:
                kernels = sorted({k["name"][:60] for k in p["decode_warm"]["top_kernels"]
                                  if k["cls"] == "flashjit"})
                out.append(f"{padding} fjit runs: {p['decode_warm']['flashjit_calls']} flashjit "
                           f"calls per decode step" +
                           (f", kernels {', '.join(kernels)}" if kernels else ""))
            cold, warm = p["decode_cold"], p["decode_warm"]
            out.append(f"{padding} {implementation} decode step at a new key length: wall "
                       f"{cold['wall_ms']:.2f} ms (attention host {attention_host_ms(cold):.2f} "
                       f"ms), the same step again {warm['wall_ms']:.2f} ms "
                       f"({attention_host_ms(warm):.2f} ms)" +
                       (f"; GPU kernels {warm['kernels_ms']:.3f} ms of it (the rest is host "
                        f"time)" if warm["kernel_classes"] else ""))
        cold_extra = sdpa["cold_decode_ms_per_step"] - sdpa["decode_ms_per_step"]
        if cold_extra > max(1.0, sdpa["decode_ms_per_step"]):
            cause = ("torch's cuDNN attention builds one execution graph per problem shape "
                     "(the key length included) and caches it: each decode step of a first pass "
                     "has a new key length, a cache miss" if backends and "cudnn" in backends
                     else "per-shape setup on its backend")
            out.append(f"{padding}: sdpa's first pass costs {cold_extra:.1f} ms more per decode "
                       f"step than its warm pass ({cause}); the warm figures are the fair "
                       f"comparison of the kernels, the cold ones what a single generate() of "
                       f"new lengths costs")
    return out


def main(argv=None):
    args, torch, transformers, name = hf_generate.start(parse_args, argv)
    layers, hidden, heads, kv_heads, _, vocab = hf_generate.PRESETS[args.preset]
    print(f"model: Llama-style {args.preset} ({layers} layers, hidden {hidden}, {heads} heads, "
          f"{kv_heads} kv heads, vocab {vocab}), {args.dtype} on {args.device}; batch "
          f"{args.batch}, prompt {args.prompt_len} (left padding {args.pad}), {args.new_tokens} "
          f"new tokens; torch {torch.__version__}, transformers {transformers.__version__}",
          flush=True)
    summary = measure(args, torch, transformers, name)
    for run in summary["runs"]:
        for label, p in (run.get("profile") or {}).items():
            print(describe_profile(f"{run['padding']} {run['implementation']} {label}", p))
            for k in p["top_kernels"][:6]:
                print(f"      {k['count']:4d} x {k['ms']:8.3f} ms  [{k['cls']}] {k['name'][:110]}")
    print("explanation:")
    for sentence in summary["explanation"]:
        print(f"  - {sentence}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=1)
    return summary


if __name__ == "__main__":
    main()
