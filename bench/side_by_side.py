#!/usr/bin/env python3
"""flashjit vs PyTorch SDPA, side by side, in one process on one GPU: the forward, the backward
and forward + backward.

    python3 bench/side_by_side.py [--quick] [--tune] [--pass fwd,bwd] [--dtypes bf16,fp16]
                                  [--out-dir docs/perf]

Implementations, timed alike on the same inputs, per pass:
  flashjit-tuned    the config the tuning DB serves for the pass ($FLASHJIT_DB or
                    ~/.local/share/flashjit/tuning.db; run `flashjit tune --pass fwd,bwd` first,
                    or pass --tune to tune the grid's missing problems here)
  flashjit-default  config="default": the SRAM-formula default of the pass
  torch-flash       F.scaled_dot_product_attention under SDPBackend.FLASH_ATTENTION (FA2)
  cudnn             F.scaled_dot_product_attention under SDPBackend.CUDNN_ATTENTION
Passes (--pass fwd,bwd, the default; bwd brings forward + backward with it):
  fwd      flashjit.attention(q, k, v); SDPA's output.
  bwd      the backward alone. flashjit.attention_backward(q, k, v, o, lse, do) with o and lse
           from flashjit's forward, made before timing; torch: torch.autograd.grad(out, (q, k, v),
           do, retain_graph=True) on an SDPA output computed before timing under the same
           backend (so its saved tensors are that backend's), with a fixed dO.
  fwd+bwd  a training step's attention: flashjit.attention(..., return_lse=True) then
           attention_backward; torch: SDPA's forward then torch.autograd.grad.

Grid (the standard one): d in {64, 128, 256}, causal off/on, N = 512 ... 16384, 16k tokens
(batch = 16384 / N), hidden 2048 (heads = 2048 / d), bf16 and fp16. flashjit gets BSHD
contiguous tensors; SDPA gets the same values as BHSD contiguous tensors (its native layout; the
copies are made before timing; --sdpa-input views passes transposed views of the BSHD tensors).

Checked once per shape before timing: each flashjit output (tuned and default) against SDPA's
(relative L2 error < 1e-2; NaN fails); each flashjit gradient against SDPA's backward's (relative
L2 error < twice flashjit's gradient tolerance, 2e-2 bf16 / 4e-3 fp16: both sides are 16-bit
approximations of the exact gradient).

Timing (the same for every implementation): inputs rotate over enough copies that one pass
touches at least twice the L2 cache; a sample is one batch of back-to-back calls between two CUDA
events (about --batch-ms of device time), divided by the batch's calls; the implementations'
batches are interleaved round-robin so that clock and thermal drift hit all alike; the result is
the median sample after at least --min-samples samples and --min-time-ms of device time per
implementation. TFLOP/s by the FlashAttention convention: forward 4 * B * H * N^2 * d, halved
when causal; backward 2.5x and forward + backward 3.5x that. host us/call is the CPU time spent
issuing one call (a call costing more host time than device time would be host-bound).

Writes into --out-dir (default docs/perf), through bench/side_by_side_report.py:
<device>-<date>.md (a section for docs/PERFORMANCE.md: device, date, commit, per pass the table,
geo-means and worst shapes, the plots), <device>-<date>.json (every number), per pass and dtype an
SVG plot (<device>-<date>-<dtype>.svg for the forward, -bwd-<dtype>.svg, -fwdbwd-<dtype>.svg:
TFLOP/s vs seqlen, one panel per head dim and causal setting, one line per implementation; drawn
here, no matplotlib needed) and, with --png and matplotlib installed, the same as PNG. Exit status
1 when a flashjit output or gradient was wrong or an implementation failed everywhere; 2 on bad
arguments.

The pure parts (grid, summary, table, SVG, the timing loop with a pluggable timer) import no torch:
tests/python/test_side_by_side.py runs them on the CPU with fake timings.
"""
import argparse
import datetime
import math
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from side_by_side_report import (  # noqa: E402,F401  (markdown ... svg_plot: for the tests)
    IMPLS, PASSES, by_pass, fmt, markdown, slug, summarize, summarize_by_pass, svg_plot,
    tflops_of, write_outputs)

TOTAL_TOKENS = 16384
HIDDEN = 2048
DTYPES = {"bf16": "bfloat16", "fp16": "float16"}
MAX_REL_ERROR = 1e-2


# --- grid -----------------------------------------------------------------------------------------

def make_grid(dtypes, head_dims, causals, seqlens, tokens=TOTAL_TOKENS, hidden=HIDDEN):
    """Shapes in (dtype, d, causal, N) order: dicts with dtype, d, causal, N, B, H, flops (the
    forward's)."""
    shapes = []
    for dtype in dtypes:
        for d in head_dims:
            for causal in causals:
                for n in seqlens:
                    b = max(1, tokens // n)
                    h = max(1, hidden // d)
                    shapes.append({"dtype": dtype, "d": d, "causal": causal, "N": n, "B": b,
                                   "H": h, "flops": flops(b, h, n, n, d, causal)})
    return shapes


def flops(batch, heads, seqlen_q, seqlen_k, head_dim, causal):
    f = 4.0 * batch * heads * seqlen_q * seqlen_k * head_dim
    return f / 2 if causal else f


def expand_passes(passes):
    """The passes measured for --pass: the backward brings forward + backward with it; in report
    order."""
    wanted = set(passes)
    if "bwd" in wanted:
        wanted.add("fwd+bwd")
    return [p for p in PASSES if p in wanted]


def row_for(shape, pass_):
    """The row of one shape and pass: the shape, "pass", and its FLOPs (2.5x / 3.5x the
    forward's for bwd / fwd+bwd)."""
    row = dict(shape)
    row["pass"] = pass_
    row["flops"] = shape["flops"] * PASSES[pass_][2]
    row["results"] = {}
    return row


# --- timing ---------------------------------------------------------------------------------------

class Impl:
    """One implementation to time: call(i) issues one call on input set i; context() wraps a
    batch (e.g. an SDPA backend selection)."""

    def __init__(self, name, call, context=None):
        self.name = name
        self.call = call
        self.context = context


class _NullContext:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def measure(impls, timer, sets, min_samples=10, min_time_ms=100.0, batch_ms=4.0,
            max_batch=1000, warmup_calls=3, max_samples=400):
    """Times `impls` alike: returns {name: {ms, min_ms, max_ms, samples, batch, host_us}} or
    {name: {error}} for an implementation whose call raised.

    timer: start() -> token; stop(token) -> token; elapsed_ms(start, stop) (may block until the
    device is done); sync(). CUDA events on a GPU; a fake in the tests.
    """
    results = {}
    live = []
    for impl in impls:
        context = impl.context or _NullContext
        try:
            with context():
                for i in range(warmup_calls):
                    impl.call(i % sets)
            timer.sync()
            # Estimate: one small batch.
            with context():
                start = timer.start()
                for i in range(warmup_calls):
                    impl.call(i % sets)
                stop = timer.stop()
            estimate = max(timer.elapsed_ms(start, stop) / warmup_calls, 1e-4)
        except Exception as error:  # an SDPA backend that refuses the shape, a flashjit error
            results[impl.name] = {"error": "%s: %s" % (type(error).__name__, str(error)[:200])}
            continue
        batch = int(min(max_batch, max(1, math.ceil(batch_ms / estimate))))
        live.append((impl, batch))

    samples = {impl.name: [] for impl, _ in live}
    host = {impl.name: [] for impl, _ in live}
    device_ms = {impl.name: 0.0 for impl, _ in live}
    # Two rounds in flight: round r's events are read after round r + 1 is enqueued, so the
    # device never waits for the host between batches. Round 0 only fills the queue (its first
    # batch would include the host's time to issue the first call) and is not kept.
    in_flight = []  # [(round, name, start, stop, calls)]
    rounds = 0
    while live:
        for impl, batch in live:
            context = impl.context or _NullContext
            with context():
                host_start = time.perf_counter()
                start = timer.start()
                for i in range(batch):
                    impl.call((rounds + i) % sets)
                stop = timer.stop()
                if rounds > 0:
                    host[impl.name].append((time.perf_counter() - host_start) / batch * 1e6)
            in_flight.append((rounds, impl.name, start, stop, batch))
        rounds += 1
        while in_flight and in_flight[0][0] < rounds - 1:
            round_, name, start, stop, calls = in_flight.pop(0)
            ms = timer.elapsed_ms(start, stop)
            if round_ > 0:
                samples[name].append(ms / calls)
                device_ms[name] += ms
        done = all(len(samples[impl.name]) >= min_samples and
                   device_ms[impl.name] >= min_time_ms for impl, _ in live)
        if done or rounds > max_samples:
            break
    timer.sync()
    for impl, batch in live:
        values = samples[impl.name]
        results[impl.name] = {
            "ms": statistics.median(values),
            "min_ms": min(values),
            "max_ms": max(values),
            "samples": len(values),
            "batch": batch,
            "host_us": statistics.median(host[impl.name]),
        }
    return results


class CudaEventTimer:
    """Timer on CUDA events of torch's current stream."""

    def __init__(self, torch):
        self.torch = torch

    def start(self):
        event = self.torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    stop = start

    def elapsed_ms(self, start, stop):
        stop.synchronize()
        return start.elapsed_time(stop)

    def sync(self):
        self.torch.cuda.synchronize()


# --- the GPU run ----------------------------------------------------------------------------------

def parse_args(argv):
    parser = argparse.ArgumentParser(
        description="flashjit (tuned, default) vs torch SDPA flash and cuDNN on one GPU: forward, "
                    "backward, forward + backward.")
    parser.add_argument("--quick", action="store_true",
                        help="d 64,128 x N 1024,4096,16384, bf16, few samples: a smoke test")
    parser.add_argument("--pass", dest="passes", default="fwd,bwd",
                        help="fwd, bwd or fwd,bwd (default); bwd also measures fwd+bwd")
    parser.add_argument("--dtypes", default=None, help="bf16,fp16 (default both)")
    parser.add_argument("--head-dims", default=None, help="default 64,128,256")
    parser.add_argument("--seqlens", default=None,
                        help="default 512,1024,2048,4096,8192,16384")
    parser.add_argument("--causal", default="both", choices=("both", "on", "off"))
    parser.add_argument("--tokens", type=int, default=TOTAL_TOKENS,
                        help="tokens per batch: batch = tokens / N (default %d)" % TOTAL_TOKENS)
    parser.add_argument("--hidden", type=int, default=HIDDEN,
                        help="hidden size: heads = hidden / d (default %d)" % HIDDEN)
    parser.add_argument("--impls", default=",".join(IMPLS),
                        help="subset of " + ",".join(IMPLS))
    parser.add_argument("--tune", action="store_true",
                        help="first tune the grid's problems the DB lacks (flashjit.tune, the "
                             "passes measured)")
    parser.add_argument("--out-dir", default=None, help="default <repo>/docs/perf")
    parser.add_argument("--name", default=None, help="file stem (default <device>-<date>)")
    parser.add_argument("--commit", default=None, help="default $COMMIT, else git rev-parse")
    parser.add_argument("--min-samples", type=int, default=None, help="default 15 (quick 5)")
    parser.add_argument("--min-time-ms", type=float, default=None,
                        help="device time per implementation and shape (default 120, quick 20)")
    parser.add_argument("--batch-ms", type=float, default=4.0,
                        help="device time of one timed batch (default 4)")
    parser.add_argument("--sdpa-input", default="bhsd", choices=("bhsd", "views"),
                        help="SDPA inputs: BHSD contiguous copies (default) or transposed views "
                             "of flashjit's BSHD tensors")
    parser.add_argument("--png", action="store_true", help="also PNG plots (needs matplotlib)")
    parser.add_argument("--no-verify", action="store_true", help="skip the output check")
    parser.add_argument("--no-ceilings", action="store_true",
                        help="skip the matmul and copy ceilings (about a second)")
    args = parser.parse_args(argv)

    def int_list(text, flag):
        try:
            values = [int(x) for x in text.split(",") if x]
        except ValueError:
            parser.error("%s: expected comma-separated integers, got %r" % (flag, text))
        if not values or min(values) <= 0:
            parser.error("%s: expected positive integers, got %r" % (flag, text))
        return values

    passes = [x for x in args.passes.split(",") if x]
    if not passes or any(p not in ("fwd", "bwd") for p in passes):
        parser.error("--pass: expected fwd, bwd or fwd,bwd, got %r" % args.passes)
    args.passes = expand_passes(passes)
    args.dtypes = (args.dtypes or ("bf16" if args.quick else "bf16,fp16")).split(",")
    for dtype in args.dtypes:
        if dtype not in DTYPES:
            parser.error("--dtypes: %r is not one of %s" % (dtype, ",".join(DTYPES)))
    args.head_dims = int_list(args.head_dims or ("64,128" if args.quick else "64,128,256"),
                              "--head-dims")
    args.seqlens = int_list(args.seqlens or ("1024,4096,16384" if args.quick
                                             else "512,1024,2048,4096,8192,16384"), "--seqlens")
    args.causals = {"both": [False, True], "on": [True], "off": [False]}[args.causal]
    args.impls = [x for x in args.impls.split(",") if x]
    for impl in args.impls:
        if impl not in IMPLS:
            parser.error("--impls: %r is not one of %s" % (impl, ",".join(IMPLS)))
    if args.tokens <= 0 or args.hidden <= 0:
        parser.error("--tokens and --hidden must be positive")
    if args.min_samples is None:
        args.min_samples = 5 if args.quick else 15
    if args.min_time_ms is None:
        args.min_time_ms = 20.0 if args.quick else 120.0
    return args


def git_commit(repo):
    try:
        return subprocess.run(["git", "-C", repo, "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, timeout=10,
                              check=True).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def relative_error(torch, out, ref):
    out = out.float()
    ref = ref.float()
    if torch.isnan(out).any() or torch.isinf(out).any():
        return float("inf")
    return (torch.linalg.norm(out - ref) / torch.linalg.norm(ref).clamp_min(1e-30)).item()


def ceilings(torch, timer):
    """bf16 matmul 8192^3 TFLOP/s and device-to-device copy GB/s, for context."""
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn_like(a)
    mm = measure([Impl("mm", lambda i: a @ b)], timer, 1, min_samples=5, min_time_ms=50)
    x = torch.empty(1024 ** 3 // 2, device="cuda", dtype=torch.bfloat16)
    y = torch.empty_like(x)
    cp = measure([Impl("copy", lambda i: y.copy_(x))], timer, 1, min_samples=5, min_time_ms=50)
    text = "bf16 matmul 8192³ %.0f TFLOP/s, device-to-device copy %.0f GB/s" % (
        2 * 8192 ** 3 / (mm["mm"]["ms"] * 1e-3) / 1e12,
        2 * x.numel() * 2 / (cp["copy"]["ms"] * 1e-3) / 1e9)
    return text  # a, b, x, y are freed with this frame


class ShapeRun:
    """One shape on the GPU: its input sets, the implementations of each pass, their checks.
    env: torch, F (torch.nn.functional), flashjit, sdpa_kernel, backends ({"torch-flash": ...,
    "cudnn": ...} SDPBackend values) and optionally device ("cuda" unless given: the tests run it
    on the CPU with stand-ins).

    Input set i: flashjit's BSHD q, k, v (and do with the backward), ours[i]; the same values for
    SDPA as BHSD copies (or views), theirs[i] (q, k, v requiring grad with the backward) and
    theirs_fwd[i] (q, k, v without autograd, for the forward: no graph, as an inference call).
    """

    def __init__(self, env, args, shape, sets):
        self.env, self.args, self.shape, self.sets = env, args, shape, sets
        torch = env["torch"]
        dtype = getattr(torch, DTYPES[shape["dtype"]])
        b, h, n, d = shape["B"], shape["H"], shape["N"], shape["d"]
        self.causal = shape["causal"]
        self.backward = any(p != "fwd" for p in args.passes)
        count = 4 if self.backward else 3
        device = env.get("device", "cuda")
        self.ours = [[torch.randn(b, n, h, d, device=device, dtype=dtype) for _ in range(count)]
                     for _ in range(sets)]
        if args.sdpa_input == "views":
            self.theirs = [[x.transpose(1, 2) for x in s] for s in self.ours]
        else:
            self.theirs = [[x.transpose(1, 2).contiguous() for x in s] for s in self.ours]
        self.theirs_fwd = [[x.detach() for x in s[:3]] for s in self.theirs]
        if self.backward:
            for s in self.theirs:
                for x in s[:3]:
                    x.requires_grad_()
        self.forward_outputs = None  # flashjit's (o, lse) per set, made on first need
        self.graphs = {}  # SDPA outputs per backend and set, for timing the backward alone

    # -- the implementations -------------------------------------------------------------------

    def sdpa(self, i):
        F = self.env["F"]
        return F.scaled_dot_product_attention(*self.theirs_fwd[i], is_causal=self.causal)

    def sdpa_step(self, i):
        torch, F = self.env["torch"], self.env["F"]
        q, k, v, do = self.theirs[i]
        out = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        return torch.autograd.grad(out, (q, k, v), do)

    def sdpa_backward(self, impl):
        """torch.autograd.grad of an SDPA output made under `impl`'s backend before timing."""
        torch, F = self.env["torch"], self.env["F"]
        if impl not in self.graphs:
            with self.env["sdpa_kernel"]([self.env["backends"][impl]]):
                self.graphs[impl] = [
                    F.scaled_dot_product_attention(*s[:3], is_causal=self.causal)
                    for s in self.theirs]

        def call(i):
            q, k, v, do = self.theirs[i]
            return torch.autograd.grad(self.graphs[impl][i], (q, k, v), do, retain_graph=True)
        return call

    def flashjit_forward(self, config, i):
        flashjit = self.env["flashjit"]
        return flashjit.attention(*self.ours[i][:3], causal=self.causal, config=config)

    def flashjit_backward(self, config, i):
        flashjit = self.env["flashjit"]
        if self.forward_outputs is None:
            self.forward_outputs = [
                flashjit.attention(*s[:3], causal=self.causal, return_lse=True)
                for s in self.ours]
        q, k, v, do = self.ours[i]
        o, lse = self.forward_outputs[i]
        return flashjit.attention_backward(q, k, v, o, lse, do, causal=self.causal,
                                           config=config)

    def flashjit_step(self, config, i):
        flashjit = self.env["flashjit"]
        q, k, v, do = self.ours[i]
        o, lse = flashjit.attention(q, k, v, causal=self.causal, config=config, return_lse=True)
        return flashjit.attention_backward(q, k, v, o, lse, do, causal=self.causal,
                                           config=config)

    def impls(self, pass_):
        """The Impls of `pass_`, and an error per implementation that could not be set up."""
        made, errors = [], {}
        for impl in self.args.impls:
            if impl in ("flashjit-tuned", "flashjit-default"):
                config = None if impl == "flashjit-tuned" else "default"
                method = {"fwd": self.flashjit_forward, "bwd": self.flashjit_backward,
                          "fwd+bwd": self.flashjit_step}[pass_]
                made.append(Impl(impl, lambda i, m=method, c=config: m(c, i)))
                continue
            context = (lambda choice=self.env["backends"][impl]:
                       self.env["sdpa_kernel"]([choice]))
            try:
                if pass_ == "fwd":
                    call = self.sdpa
                elif pass_ == "bwd":
                    call = self.sdpa_backward(impl)  # runs SDPA's forward now
                else:
                    call = self.sdpa_step
            except Exception as error:  # the backend refuses the shape
                errors[impl] = {"error": "%s: %s" % (type(error).__name__, str(error)[:200])}
                continue
            made.append(Impl(impl, call, context=context))
        return made, errors

    # -- checks --------------------------------------------------------------------------------

    def reference(self, pass_):
        """SDPA's result on set 0 in flashjit's layout (flash, else cuDNN): o for the forward,
        (dq, dk, dv) otherwise; None when neither backend runs the shape."""
        for impl in ("torch-flash", "cudnn"):
            try:
                with self.env["sdpa_kernel"]([self.env["backends"][impl]]):
                    if pass_ == "fwd":
                        return self.sdpa(0).transpose(1, 2)
                    return tuple(g.transpose(1, 2) for g in self.sdpa_step(0))
            except Exception:  # this backend cannot run the shape: try the next
                self.sync()
        return None

    def sync(self):
        if self.env.get("device", "cuda") == "cuda":
            self.env["torch"].cuda.synchronize()

    def checks(self, pass_):
        """{impl: relative error (the worst tensor) or an error string} for flashjit's
        implementations of `pass_` on set 0, against SDPA's."""
        torch = self.env["torch"]
        reference = self.reference(pass_)
        found = {}
        if reference is None:
            return found
        for impl, config in (("flashjit-tuned", None), ("flashjit-default", "default")):
            if impl not in self.args.impls:
                continue
            try:
                if pass_ == "fwd":
                    found[impl] = relative_error(torch, self.flashjit_forward(config, 0),
                                                 reference)
                else:
                    method = self.flashjit_backward if pass_ == "bwd" else self.flashjit_step
                    grads = method(config, 0)
                    found[impl] = max(relative_error(torch, g, r)
                                      for g, r in zip(grads, reference))
            except Exception as error:
                found[impl] = "%s: %s" % (type(error).__name__, str(error)[:200])
        return found

    def configs(self, pass_, result, impl):
        """The config flashjit used for `pass_` and where it came from, into `result`."""
        flashjit = self.env["flashjit"]
        config = None if impl == "flashjit-tuned" else "default"
        q, k, v = self.ours[0][:3]
        names = ["fwd", "bwd"] if pass_ == "fwd+bwd" else [pass_]
        chosen = [flashjit.config_for(q, k, v, causal=self.causal, config=config, pass_=name)
                  for name in names]
        result["config"] = " + ".join(c["config"] for c in chosen)
        result["source"] = "/".join(c["source"] for c in chosen)


def run(args):
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import flashjit

    if not torch.cuda.is_available():
        print("side_by_side.py: torch sees no CUDA device", file=sys.stderr)
        return 2
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    props = torch.cuda.get_device_properties(0)
    now = datetime.datetime.now(datetime.timezone.utc)
    gpus = [d for d in flashjit.devices() if d.get("device") == "cuda:0"]
    meta = {
        "device": props.name,
        "sm_count": props.multi_processor_count,
        "date": now.strftime("%Y-%m-%d"),
        "time": now.isoformat(timespec="seconds"),
        "commit": args.commit or os.environ.get("COMMIT") or git_commit(repo) or "unknown",
        "torch": torch.__version__,
        "cudnn": str(torch.backends.cudnn.version()),
        "flashjit": flashjit.__version__,
        "generator": flashjit._C.generator_version(),
        "fingerprint": gpus[0].get("fingerprint") if gpus else None,
        "tuning_db": os.environ.get("FLASHJIT_DB") or "~/.local/share/flashjit/tuning.db",
        "sdpa_input": args.sdpa_input,
        "passes": args.passes,
        "timing": ("CUDA events around batches of back-to-back calls (~%g ms each), "
                   "implementations interleaved round-robin, inputs rotated over >= 2x L2, "
                   "median of >= %d samples and >= %g ms per implementation and shape; the "
                   "backward alone: flashjit.attention_backward on the forward's o and lse, "
                   "torch.autograd.grad of an SDPA output made before timing (same backend), "
                   "fixed dO" % (args.batch_ms, args.min_samples, args.min_time_ms)),
        "argv": sys.argv[1:],
    }
    name = args.name or "%s-%s" % (slug(props.name), meta["date"])
    out_dir = args.out_dir or os.path.join(repo, "docs", "perf")
    print("# %s (%d SMs), torch %s, cuDNN %s, flashjit %s, commit %s, passes %s"
          % (props.name, props.multi_processor_count, meta["torch"], meta["cudnn"],
             meta["flashjit"], meta["commit"], ",".join(args.passes)), flush=True)

    timer = CudaEventTimer(torch)
    if not args.no_ceilings:
        try:
            meta["ceilings"] = ceilings(torch, timer)
            print("# ceilings: " + meta["ceilings"], flush=True)
        except Exception as error:  # context only: never stops the run
            print("# ceilings failed: %s: %s" % (type(error).__name__, error), flush=True)

    shapes = make_grid(args.dtypes, args.head_dims, args.causals, args.seqlens, args.tokens,
                       args.hidden)
    if args.tune and "flashjit-tuned" in args.impls:
        # fwd+bwd uses the tuned forward too.
        tune_passes = ["fwd", "bwd"] if "bwd" in args.passes else ["fwd"]
        print("# tuning the grid's problems the DB lacks (flashjit.tune, passes %s)"
              % ",".join(tune_passes), flush=True)
        start = time.time()
        flashjit.tune(passes=tune_passes, head_dims=args.head_dims, dtypes=args.dtypes,
                      seqlens=args.seqlens,
                      causal={"both": "both", "on": True, "off": False}[args.causal],
                      tokens=args.tokens, hidden=args.hidden)
        print("# tuned in %.0f s" % (time.time() - start), flush=True)

    l2 = getattr(props, "L2_cache_size", 50 * 2 ** 20) or 50 * 2 ** 20
    env = {"torch": torch, "F": F, "flashjit": flashjit, "sdpa_kernel": sdpa_kernel,
           "backends": {"torch-flash": SDPBackend.FLASH_ATTENTION,
                        "cudnn": SDPBackend.CUDNN_ATTENTION}}
    rows = []
    status = 0
    print("%-7s %-6s %4s %6s %6s  " % ("pass", "dtype", "d", "causal", "N") + "  ".join(
        "%16s" % impl for impl in args.impls), flush=True)
    for shape in shapes:
        set_bytes = 3 * shape["B"] * shape["N"] * shape["H"] * shape["d"] * 2
        sets = max(2, math.ceil(2 * l2 / set_bytes))
        try:
            shape_run = ShapeRun(env, args, shape, sets)
        except torch.cuda.OutOfMemoryError as error:
            for pass_ in args.passes:
                row = row_for(shape, pass_)
                row["results"] = {impl: {"error": "out of memory: %s" % str(error)[:100]}
                                  for impl in args.impls}
                rows.append(row)
            status = 1
            continue
        for pass_ in args.passes:
            row = row_for(shape, pass_)
            status = max(status, measure_row(shape_run, pass_, row, timer, args))
            rows.append(row)
            print_row(row, args.impls)
        shape_run = None  # free this shape's tensors and graphs before the next one's
        torch.cuda.empty_cache()

    paths, summaries = write_outputs(out_dir, name, meta, rows, png=args.png)
    print()
    for pass_, summary in summaries.items():
        for entry in summary["ratios"]:
            text = "%s geo-mean %s: %s over %d shapes" % (
                pass_, entry["title"], fmt(entry["overall"]["geomean"], 3),
                entry["overall"]["shapes"])
            if entry.get("worst"):
                text += ", worst %s at %s" % (fmt(entry["worst"]["ratio"], 2),
                                               entry["worst"]["shape"])
            print(text)
    for key, path in paths.items():
        print("wrote %s" % path)
    for pass_, pass_rows in by_pass(rows).items():
        for impl in args.impls:
            if not any(tflops_of(row, impl) for row in pass_rows):
                print("side_by_side.py: %s produced no %s timing at all" % (impl, pass_),
                      file=sys.stderr)
                status = 1
    return status


def measure_row(shape_run, pass_, row, timer, args):
    """Checks flashjit's results of `pass_` against SDPA's, then times every implementation
    into row["results"]. Returns 1 when a flashjit result was wrong or failed, else 0."""
    status = 0
    checks = {} if args.no_verify else shape_run.checks(pass_)
    impls, errors = shape_run.impls(pass_)
    try:
        row["results"] = measure(impls, timer, shape_run.sets, min_samples=args.min_samples,
                                 min_time_ms=args.min_time_ms, batch_ms=args.batch_ms)
    except Exception as error:  # e.g. out of memory in the middle of a shape
        message = "%s: %s" % (type(error).__name__, str(error)[:200])
        row["results"] = {impl: {"error": message} for impl in args.impls}
        status = 1
        shape_run.sync()
    row["results"].update(errors)
    limit = (MAX_REL_ERROR if pass_ == "fwd"
             else 2 * shape_run.env["flashjit"]._C.gradient_tolerance(row["dtype"]))
    for impl in ("flashjit-tuned", "flashjit-default"):
        result = row["results"].get(impl)
        if result is None:
            continue
        try:
            shape_run.configs(pass_, result, impl)
        except Exception as error:
            result.setdefault("error", str(error)[:200])
        check = checks.get(impl)
        if isinstance(check, float):
            result["rel_error"] = check
            if not check < limit:
                result["wrong"] = True
                status = 1
        elif isinstance(check, str):
            result["error"] = check
            status = 1
        if result.get("error"):
            status = 1
    return status


def print_row(row, impls):
    cells = []
    for impl in impls:
        result = row["results"].get(impl, {})
        if result.get("error"):
            cells.append("%16s" % "error")
        elif result.get("wrong"):
            cells.append("%16s" % "WRONG")
        else:
            cells.append("%9s TFLOP/s" % fmt(tflops_of(row, impl)))
    print("%-7s %-6s %4d %6s %6d  " % (row["pass"], row["dtype"], row["d"],
                                       "yes" if row["causal"] else "no", row["N"])
          + "  ".join(cells), flush=True)


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
