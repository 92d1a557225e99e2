#!/usr/bin/env python3
"""A small Llama-style model from Hugging Face transformers (built from a config: random weights,
nothing downloaded) run with transformers' "sdpa" attention and with flashjit's ("fjit", after
flashjit.hf.register()): the one-line switch

    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")   # before
    flashjit.hf.register()
    model = AutoModelForCausalLM.from_config(config, attn_implementation="fjit")   # after

    python3 examples/hf_generate.py [--device cpu|cuda] [--dtype fp32|bf16|fp16]
                                    [--preset tiny|small|medium] [--batch 4] [--prompt-len 64]
                                    [--new-tokens 32] [--pad 0,7,1,...] [--seed 0] [--json PATH]

Compares, in one process and on the same weights and prompts (left-padded per --pad: padding
tokens per prompt, cycled over the batch):
  * the prefill logits over the real tokens (max |difference|, and relative to the logits' max);
  * greedy generation of --new-tokens tokens (prefill + cached decode through generate()): the
    tokens must be identical in fp32; in bf16 / fp16 they may part only at a near tie of sdpa's
    own logits (its two best within --tolerance: two correct kernels round differently there),
    which the output names;
  * tokens/s of each implementation (batch * new tokens / the generate() call's time, after one
    warm-up call of the same length: every key length seen once, so that per-shape setup (torch's
    cuDNN attention builds an execution graph per key length; flashjit compiles or loads a kernel
    per problem) is out of the timed call; the warm-up's own tokens/s is printed too).
    bench/hf_profile.py splits the time into prefill and decode and names the kernels each path
    runs; examples/hf_reference.py compares both implementations' tokens with an fp32 reference.
Exit status 1 when the tokens differ (other than at such a near tie) or the logits are further
apart than --tolerance (default 1e-4 absolute for fp32; 0.1 of the largest logit for bf16 / fp16).

Presets (layers, hidden, heads, kv heads, intermediate, vocab): tiny = 2, 128, 4, 2, 256, 256
(CI: seconds on a CPU); small = 4, 512, 8, 2, 1024, 2048 (head_dim 64); medium = 8, 1024, 16, 4,
2816, 32000 (a GPU run). --dtype defaults to bf16 on CUDA (flashjit's CUDA kernels take bf16 /
fp16) and fp32 on the CPU.
"""
import argparse
import json
import sys
import time

PRESETS = {  # layers, hidden, heads, kv heads, intermediate, vocab
    "tiny": (2, 128, 4, 2, 256, 256),
    "small": (4, 512, 8, 2, 1024, 2048),
    "medium": (8, 1024, 16, 4, 2816, 32000),
}
DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def add_model_args(parser, dtypes=tuple(DTYPES), dtype=None, new_tokens=32):
    """The flags of the model and its prompts that the hf scripts share (this one,
    hf_reference.py, bench/hf_profile.py): device, dtype (of `dtypes`; None: by the device, see
    finish_model_args), preset, batch, prompt length, new tokens, padding, seed."""
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    parser.add_argument("--dtype", choices=dtypes, default=dtype)
    parser.add_argument("--preset", choices=tuple(PRESETS), default="tiny")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=new_tokens)
    parser.add_argument("--pad", default="0,7,1,0",
                        help="left-padding tokens per prompt, comma-separated, cycled")
    parser.add_argument("--seed", type=int, default=0)


def finish_model_args(parser, args):
    """add_model_args' flags parsed: no --dtype is bf16 on CUDA, else fp32; --pad a list of ints,
    each leaving a real token in every prompt (else parser.error)."""
    if args.dtype is None:
        args.dtype = "bf16" if args.device.startswith("cuda") else "fp32"
    args.pad = [int(x) for x in args.pad.split(",") if x.strip()] or [0]
    if max(args.pad) >= args.prompt_len:
        parser.error(f"--pad {max(args.pad)} leaves no real token in a prompt of "
                     f"{args.prompt_len}")
    return args


def start(parse_args, argv):
    """A script's start: its arguments (argv, or the command line's when None), then torch,
    transformers and flashjit.hf with its attention registered: (args, torch, transformers,
    the attention's name)."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    import torch
    import transformers

    import flashjit.hf

    return args, torch, transformers, flashjit.hf.register()


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_model_args(parser)
    parser.add_argument("--tolerance", type=float, default=None)
    parser.add_argument("--json", default=None, help="write the results here")
    args = finish_model_args(parser, parser.parse_args(argv))
    if args.tolerance is None:
        args.tolerance = 1e-4 if args.dtype == "fp32" else 0.1
    return args


def build_model(args, torch, transformers):
    layers, hidden, heads, kv_heads, intermediate, vocab = PRESETS[args.preset]
    config = transformers.LlamaConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate,
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
        max_position_embeddings=args.prompt_len + args.new_tokens + 16, initializer_range=0.1,
        attention_dropout=0.0, pad_token_id=0, bos_token_id=1, eos_token_id=None)
    torch.manual_seed(args.seed)
    model = transformers.LlamaForCausalLM(config)
    model.generation_config.eos_token_id = None  # always --new-tokens tokens
    model.generation_config.pad_token_id = 0
    return model.to(device=args.device, dtype=getattr(torch, DTYPES[args.dtype])).eval()


def prompts(args, torch, vocab):
    generator = torch.Generator().manual_seed(args.seed + 1)
    ids = torch.randint(1, vocab, (args.batch, args.prompt_len), generator=generator)
    mask = torch.ones_like(ids)
    for b in range(args.batch):
        pad = args.pad[b % len(args.pad)]
        ids[b, :pad] = 0
        mask[b, :pad] = 0
    return ids.to(args.device), mask.to(args.device)


def synchronize(torch, device):
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)


def run(model, implementation, ids, mask, args, torch):
    """(prefill logits float32, generated tokens, seconds of the timed generate(), seconds of
    the first one). The first generate() of the same length is the warm-up: every key length
    it meets is new (torch's cuDNN attention builds an execution graph per shape, flashjit
    compiles or loads a kernel per problem), the timed one meets them again."""
    model.set_attn_implementation(implementation)
    times = []
    with torch.no_grad():
        logits = model(ids, attention_mask=mask).logits.float()
        for _ in range(2):
            synchronize(torch, args.device)
            start = time.perf_counter()
            tokens = model.generate(ids, attention_mask=mask, max_new_tokens=args.new_tokens,
                                    min_new_tokens=args.new_tokens, do_sample=False)
            synchronize(torch, args.device)
            times.append(time.perf_counter() - start)
    return logits, tokens[:, ids.shape[1]:], times[1], times[0]


def first_difference(model, ids, mask, expected, tokens, args, torch):
    """(the first new-token position where the two generations differ, the largest gap between
    the two best of sdpa's logits there over the rows that differ): a gap within the logits'
    tolerance is a near tie, where rounding may pick either token."""
    differs = (expected != tokens).any(dim=0)
    first = int(torch.nonzero(differs)[0])
    model.set_attn_implementation("sdpa")
    with torch.no_grad():
        out = model.generate(ids, attention_mask=mask, max_new_tokens=first + 1,
                             min_new_tokens=first + 1, do_sample=False, output_logits=True,
                             return_dict_in_generate=True)
    rows = expected[:, first] != tokens[:, first]
    best = out.logits[first][rows].float().topk(2, dim=-1).values
    return first, float((best[:, 0] - best[:, 1]).max())


def main(argv=None):
    args, torch, transformers, name = start(parse_args, argv)
    import flashjit

    model = build_model(args, torch, transformers)
    ids, mask = prompts(args, torch, model.config.vocab_size)
    results = {}
    for implementation in ("sdpa", name):
        logits, tokens, seconds, first = run(model, implementation, ids, mask, args, torch)
        results[implementation] = dict(logits=logits, tokens=tokens, seconds=seconds,
                                       tokens_per_s=args.batch * args.new_tokens / seconds,
                                       tokens_per_s_first=args.batch * args.new_tokens / first)
    real = mask.bool()
    reference = results["sdpa"]["logits"][real]
    difference = (results[name]["logits"][real] - reference).abs().max().item()
    relative = difference / max(reference.abs().max().item(), 1e-12)
    same = torch.equal(results["sdpa"]["tokens"], results[name]["tokens"])
    first, gap = None, None
    if not same:
        first, gap = first_difference(model, ids, mask, results["sdpa"]["tokens"],
                                      results[name]["tokens"], args, torch)
    device = (torch.cuda.get_device_name(args.device) if args.device.startswith("cuda")
              else "CPU")
    layers, hidden, heads, kv_heads, _, vocab = PRESETS[args.preset]
    print(f"model: Llama-style {args.preset} ({layers} layers, hidden {hidden}, {heads} heads, "
          f"{kv_heads} kv heads, vocab {vocab}), {args.dtype} on {device}; batch {args.batch}, "
          f"prompt {args.prompt_len} (left padding {args.pad}), {args.new_tokens} new tokens")
    print(f"prefill logits: max |fjit - sdpa| = {difference:.3g} ({relative:.3g} of the max "
          f"logit; tolerance {args.tolerance:g})")
    if same:
        print("greedy tokens: identical")
    else:
        print(f"greedy tokens: differ from new token {first}, where sdpa's two best logits are "
              f"{gap:.3g} apart ({'a near tie' if gap <= args.tolerance else 'not a tie'}: "
              f"tolerance {args.tolerance:g})")
    for implementation in ("sdpa", name):
        result = results[implementation]
        print(f"{implementation:>5}: {result['tokens_per_s']:9.1f} tokens/s "
              f"({result['seconds'] * 1e3:.1f} ms for {args.batch} x {args.new_tokens} tokens; "
              f"the first call of that length: {result['tokens_per_s_first']:.1f} tokens/s)")
    summary = dict(
        preset=args.preset, device=device, dtype=args.dtype, batch=args.batch,
        prompt_len=args.prompt_len, new_tokens=args.new_tokens, pad=args.pad,
        logits_max_difference=difference, logits_relative_difference=relative,
        tokens_identical=same, first_difference=first, sdpa_top2_gap_there=gap,
        flashjit_version=flashjit.__version__,
        transformers_version=transformers.__version__, torch_version=torch.__version__,
        tokens_per_s={k: v["tokens_per_s"] for k, v in results.items()},
        tokens_per_s_first_call={k: v["tokens_per_s_first"] for k, v in results.items()},
        tokens=results[name]["tokens"].tolist())
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=1)
    # fp32: the tokens must be identical. bf16 / fp16: two correct kernels round differently,
    # so greedy decoding may part at a near tie of sdpa's own logits (within the tolerance),
    # never elsewhere.
    tie = gap is not None and gap <= args.tolerance and args.dtype != "fp32"
    # The logits: absolute in fp32; relative to the largest logit in bf16 / fp16, whose rounding
    # scales with it (an 8-layer bf16 model's logits of ~20 differ by ~1 between two kernels).
    close = (difference if args.dtype == "fp32" else relative) <= args.tolerance
    ok = (same or tie) and close
    summary["ok"] = ok
    if argv is None and not ok:
        sys.exit(1)
    return summary


if __name__ == "__main__":
    main()
