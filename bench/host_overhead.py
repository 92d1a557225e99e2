#!/usr/bin/env python3
"""Host time per call: flashjit.attention, flashjit.sdpa and torch SDPA in the same process, on
the same tensors: the CPU time one call costs the calling thread.

    python3 bench/host_overhead.py [--device cuda|cpu] [--dtype bf16|fp16|fp32]
                                   [--shape B,H,S,D] [--calls 100] [--samples 40] [--json PATH]

Calls timed (each `calls` back-to-back calls between two perf_counter reads, divided by `calls`;
`samples` such batches per call, interleaved round-robin; the median and the minimum):
  forward, no autograd (under torch.no_grad):
    flashjit.attention      flashjit.attention(q, k, v, causal=True, layout="bhsd")
    flashjit.sdpa           flashjit.sdpa(q, k, v, is_causal=True)
    torch SDPA              F.scaled_dot_product_attention(q, k, v, is_causal=True)
    flashjit DLPack path    flashjit.attention(..., out=o): the arrays through DLPack and the
                            checks on every call (the path of numpy/cupy/jax arrays, and of torch
                            tensors before the fast path)
    flashjit custom op      torch.ops.flashjit.attention(...): the dispatcher's cost of the
                            operator torch.compile uses (eager calls do not go through it)
  forward recording autograd (q, k, v require grad): flashjit.sdpa, torch SDPA
  backward: o.backward(do) of one forward (timed alone), flashjit.sdpa and torch SDPA.

On a GPU the device work is overlapped, not timed: a batch issues `calls` calls without waiting
(the kernels queue up; --calls 100 keeps the queue under the driver's launch limit) and the
device is synchronized between batches, outside the timing; the default shape (1, 8, 128, 64)
is small, so that the device keeps up with the host. On the CPU backend the kernels run inside
the call: the time is the whole call for a tiny shape (1, 1, 16, 64 by default there).
Prints a table and, with --json, writes every sample.
"""
import argparse
import json
import os
import statistics
import sys
import time

DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default=None, help="cuda or cpu (default: cuda if available)")
    parser.add_argument("--dtype", default=None, choices=sorted(DTYPES),
                        help="default bf16 on CUDA, fp32 on the CPU")
    parser.add_argument("--shape", default=None,
                        help="B,H,S,D (default 1,8,128,64 on CUDA, 1,1,16,64 on the CPU)")
    parser.add_argument("--calls", type=int, default=100, help="calls per timed batch")
    parser.add_argument("--samples", type=int, default=40, help="batches per implementation")
    parser.add_argument("--json", default=None, help="write the results here")
    return parser.parse_args(argv)


def time_batches(impls, calls, samples, sync):
    """{name: [us per call, one per batch]}: impls interleaved round-robin, one warm-up batch
    each (not kept)."""
    results = {name: [] for name, _ in impls}
    for round_ in range(samples + 1):
        for name, call in impls:
            sync()
            start = time.perf_counter()
            for _ in range(calls):
                call()
            elapsed = time.perf_counter() - start
            if round_ > 0:
                results[name].append(elapsed / calls * 1e6)
    sync()
    return results


def time_backward(impls, samples, sync):
    """{name: [us]} of one backward call each, the forward outside the timing."""
    results = {name: [] for name, _ in impls}
    for round_ in range(samples + 1):
        for name, (forward, do) in impls:
            out = forward()
            sync()
            start = time.perf_counter()
            out.backward(do)
            elapsed = time.perf_counter() - start
            if round_ > 0:
                results[name].append(elapsed * 1e6)
    sync()
    return results


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    import torch
    import torch.nn.functional as F

    import flashjit

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    cuda = device.startswith("cuda")
    dtype_name = args.dtype or ("bf16" if cuda else "fp32")
    dtype = getattr(torch, DTYPES[dtype_name])
    shape = tuple(int(x) for x in (args.shape or ("1,8,128,64" if cuda else "1,1,16,64"))
                  .split(","))
    if len(shape) != 4:
        sys.exit("--shape: expected B,H,S,D")
    sync = torch.cuda.synchronize if cuda else (lambda: None)

    generator = torch.Generator(device=device).manual_seed(0)
    q, k, v, do = (torch.randn(shape, device=device, dtype=dtype, generator=generator)
                   for _ in range(4))
    o = torch.empty_like(q)
    with torch.no_grad():
        ref = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        mine = flashjit.sdpa(q, k, v, is_causal=True)
        error = ((mine.float() - ref.float()).norm() / ref.float().norm()).item()
    if not error < 2e-2:
        sys.exit(f"flashjit.sdpa differs from torch SDPA: relative error {error:.3g}")

    forward = [
        ("flashjit.attention", lambda: flashjit.attention(q, k, v, causal=True, layout="bhsd")),
        ("flashjit.sdpa", lambda: flashjit.sdpa(q, k, v, is_causal=True)),
        ("torch SDPA", lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)),
        ("flashjit DLPack path",
         lambda: flashjit.attention(q, k, v, causal=True, layout="bhsd", out=o)),
        ("flashjit custom op",
         lambda: torch.ops.flashjit.attention(q, k, v, True, None, "bhsd", False, None)),
    ]
    with torch.no_grad():
        no_grad = time_batches(forward, args.calls, args.samples, sync)
    qg, kg, vg = (x.clone().requires_grad_() for x in (q, k, v))
    recording = [
        ("flashjit.sdpa", lambda: flashjit.sdpa(qg, kg, vg, is_causal=True)),
        ("torch SDPA", lambda: F.scaled_dot_product_attention(qg, kg, vg, is_causal=True)),
    ]
    with_grad = time_batches(recording, args.calls, args.samples, sync)
    backward = time_backward([(name, (call, do)) for name, call in recording], args.samples, sync)

    def row(group, name, values):
        return {"group": group, "impl": name, "median_us": statistics.median(values),
                "min_us": min(values), "samples_us": values}

    rows = ([row("forward, no autograd", n, v) for n, v in no_grad.items()] +
            [row("forward, recording autograd", n, v) for n, v in with_grad.items()] +
            [row("backward", n, v) for n, v in backward.items()])
    device_name = torch.cuda.get_device_name() if cuda else "CPU"
    print(f"host us/call on {device_name} ({device}), torch {torch.__version__}, "
          f"{dtype_name} {shape} causal, {args.calls} calls x {args.samples} batches")
    print(f"{'':30} {'':22} {'median':>8} {'min':>8}")
    for r in rows:
        print(f"{r['group']:30} {r['impl']:22} {r['median_us']:8.1f} {r['min_us']:8.1f}")
    by = {(r["group"], r["impl"]): r["median_us"] for r in rows}
    for group in ("forward, no autograd", "forward, recording autograd", "backward"):
        ratio = by[(group, "flashjit.sdpa")] / by[(group, "torch SDPA")]
        print(f"{group}: flashjit.sdpa / torch SDPA = {ratio:.2f}")
    if args.json:
        meta = {"device": device_name, "torch": torch.__version__, "dtype": dtype_name,
                "shape": shape, "calls": args.calls, "samples": args.samples,
                "commit": os.environ.get("COMMIT")}
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)
    return rows


if __name__ == "__main__":
    main()
