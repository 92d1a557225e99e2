#!/usr/bin/env python3
"""Context-parallel attention throughput: flashjit.distributed.ring_attention against torch's
experimental context_parallel over SDPA, in the same run, on the GPUs of one torchrun job.

    torchrun --standalone --nproc-per-node 2 bench/ring_bench.py            # 2 GPUs (NCCL)
    torchrun --standalone --nproc-per-node 1 bench/ring_bench.py            # the 1-GPU line
    python3 bench/ring_bench.py --device cpu --n 2048 --nproc 2   # CPU smoke (gloo, 2 ranks)
        [--seqlens 32768,65536,131072,262144 (alias --n; under torchrun spell it --seqlens:
         torchrun's own parser takes --n for an abbreviation of its options)]
        [--batch 1] [--heads 16] [--heads-kv 16] [--head-dim 128] [--dtype bf16] [--no-causal] [--split zigzag] [--pass fwd|fwdbwd|both]
        [--warmup 1] [--reps 3] [--no-torch-cp] [--json PATH]

Per total sequence length N (split over the R ranks: N / R rows each), for each implementation:
the time of one forward (and of forward + backward), the slowest rank's (an all_reduce MAX of
each rank's median over --reps after --warmup), and from it tokens/s (batch * N / time) and
per-rank TFLOP/s (FlashAttention's count: 4 * batch * heads * N^2 * head_dim per forward, half of
it causal; the backward 2.5 times the forward). Implementations:
  ring      flashjit.distributed.ring_attention (zig-zag split for causal by default);
  local     flashjit.attention on one GPU at N / R rows, no communication (each rank alone): the
            per-GPU throughput the ring is measured against ("ring / 1-GPU" column; with one rank
            it is the 1-GPU line itself);
  torch-cp  torch.distributed.tensor.experimental.context_parallel over
            F.scaled_dot_product_attention (its head-tail load balancing for causal, allgather
            rotation), where it runs (an error prints "n/a" and the reason; --no-torch-cp skips).
The issue's target (2 GPUs, causal, d 128, bf16): ring's per-rank TFLOP/s at N 128k at least 90%
of one GPU's at N 64k (the `local` line of a 1-GPU run, or this run's `local` at N / R), and at
least torch-cp's.

--device cpu runs with gloo in float32 (a smoke test of the script: the numbers mean nothing).
"""
import argparse
import json
import os
import statistics
import sys
import time


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--seqlens", "--n", dest="n", default=None,
                        help="total sequence lengths, comma-separated (default 32k,64k,128k,256k "
                             "on CUDA, 2048 on the CPU)")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, default=None, help="default 16 (CUDA), 4 (CPU)")
    parser.add_argument("--heads-kv", type=int, default=None, help="default: --heads")
    parser.add_argument("--head-dim", type=int, default=None, help="default 128 (CUDA), 64 (CPU)")
    parser.add_argument("--dtype", choices=("bf16", "fp16", "fp32"), default=None)
    parser.add_argument("--no-causal", action="store_true")
    parser.add_argument("--split", choices=("zigzag", "contiguous"), default=None,
                        help="default zigzag for causal, contiguous otherwise")
    parser.add_argument("--pass", dest="passes", choices=("fwd", "fwdbwd", "both"),
                        default="both")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--no-torch-cp", action="store_true")
    parser.add_argument("--json", default=None)
    parser.add_argument("--nproc", type=int, default=None,
                        help="without torchrun: spawn this many ranks here (one per GPU)")
    return parser.parse_args(argv)


def _lengths(text):
    out = []
    for part in text.split(","):
        part = part.strip().lower()
        scale = 1024 if part.endswith("k") else 1
        out.append(int(part.rstrip("k")) * scale)
    return out


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.nproc and "RANK" not in os.environ:
        import socket

        import torch.multiprocessing as mp

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        mp.spawn(_spawned, args=(args.nproc, port, sys.argv[1:] if argv is None else argv),
                 nprocs=args.nproc, join=True)
        return None
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    import flashjit
    from flashjit import distributed as fd

    cuda = args.device == "cuda"
    if "RANK" not in os.environ:  # a plain `python bench/ring_bench.py`: one rank
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=os.environ.get("MASTER_PORT", "29511"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if cuda:
        if not torch.cuda.is_available():
            raise SystemExit("ring_bench: no CUDA device (use --device cpu for the smoke mode)")
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    dist.init_process_group("nccl" if cuda else "gloo")
    world, rank = dist.get_world_size(), dist.get_rank()
    causal = not args.no_causal
    split = args.split or ("zigzag" if causal else "contiguous")
    heads = args.heads or (16 if cuda else 4)
    heads_kv = args.heads_kv or heads
    head_dim = args.head_dim or (128 if cuda else 64)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[
        args.dtype or ("bf16" if cuda else "fp32")]
    lengths = _lengths(args.n or ("32k,64k,128k,256k" if cuda else "2048"))
    passes = ("fwd", "fwdbwd") if args.passes == "both" else (args.passes,)
    chunks = 2 * world if split == "zigzag" else world
    for n in lengths:
        if n % chunks:
            raise SystemExit(f"--n {n}: not divisible into {chunks} chunks ({split}, {world} "
                             f"ranks)")

    def sync():
        if cuda:
            torch.cuda.synchronize(device)

    def timed(fn):
        """The slowest rank's median time of fn (seconds)."""
        for _ in range(args.warmup):
            fn()
        sync()
        times = []
        for _ in range(args.reps):
            dist.barrier()
            sync()
            start = time.perf_counter()
            fn()
            sync()
            times.append(time.perf_counter() - start)
        mine = torch.tensor([statistics.median(times)], dtype=torch.float64,
                            device=device if cuda else "cpu")
        dist.all_reduce(mine, op=dist.ReduceOp.MAX)
        return mine.item()

    def flops(n, pass_):
        fwd = 4 * args.batch * heads * n * n * head_dim * (0.5 if causal else 1.0)
        return fwd * (3.5 if pass_ == "fwdbwd" else 1.0)

    def runner(fn_fwd, inputs, pass_):
        if pass_ == "fwd":
            def run():
                with torch.no_grad():
                    fn_fwd(*inputs)
            return run
        leaves = [x.detach().requires_grad_() for x in inputs]
        grad = None

        def run():
            nonlocal grad
            o = fn_fwd(*leaves)
            if grad is None:
                grad = torch.randn_like(o)
            o.backward(grad)
            for x in leaves:
                x.grad = None
        return run

    rows = []
    name = torch.cuda.get_device_name(device) if cuda else "CPU"
    if rank == 0:
        print(f"ring_bench: {world} rank(s) on {name} ({'NCCL' if cuda else 'gloo'}), batch "
              f"{args.batch}, heads {heads}/{heads_kv}, head_dim {head_dim}, {dtype}, "
              f"{'causal' if causal else 'full'}, {split} split; torch {torch.__version__}",
              flush=True)
        print(f"{'N':>8} {'pass':7} {'impl':9} {'ms':>10} {'tokens/s':>12} {'TFLOP/s/rank':>13} "
              f"{'ring/1-GPU':>10}", flush=True)
    for n in lengths:
        local_n = n // world
        g = torch.Generator(device=device).manual_seed(1000 + rank)
        q = torch.randn(args.batch, local_n, heads, head_dim, device=device, dtype=dtype,
                        generator=g)
        k = torch.randn(args.batch, local_n, heads_kv, head_dim, device=device, dtype=dtype,
                        generator=g)
        v = torch.randn_like(k)
        for pass_ in passes:
            results = {}

            def ring(q, k, v):
                return fd.ring_attention(q, k, v, causal=causal, split=split,
                                         check_shapes=False)

            def local(q, k, v):
                return flashjit.attention(q, k, v, causal=causal)

            # `local`: each rank alone at N / R (its FLOPs are those of an N / R problem)
            for impl, fn, work in (("ring", ring, flops(n, pass_) / world),
                                   ("local", local, flops(local_n, pass_))):
                try:
                    seconds = timed(runner(fn, (q, k, v), pass_))
                    results[impl] = (seconds, work / seconds / 1e12)
                except flashjit.Error as error:
                    results[impl] = (None, f"{type(error).__name__}: {error}")
            if not args.no_torch_cp:
                results["torch-cp"] = _torch_cp(torch, dist, F, args, device, n, heads,
                                                heads_kv, head_dim, dtype, causal, pass_, timed,
                                                runner, flops(n, pass_) / world)
            for impl, (seconds, tflops) in results.items():
                row = {"n": n, "pass": pass_, "impl": impl, "ranks": world, "local_n": local_n}
                if seconds is None:
                    row["error"] = tflops
                    if rank == 0:
                        print(f"{n:>8} {pass_:7} {impl:9} {'n/a':>10}  ({tflops[:150]})",
                              flush=True)
                else:
                    row.update(ms=seconds * 1e3, tokens_per_s=args.batch * n / seconds,
                               tflops_per_rank=tflops)
                    ratio = ""
                    if impl == "ring" and results.get("local", (None,))[0] is not None:
                        row["ring_over_local"] = tflops / results["local"][1]
                        ratio = f"{row['ring_over_local']:.2f}"
                    if rank == 0:
                        print(f"{n:>8} {pass_:7} {impl:9} {seconds * 1e3:>10.2f} "
                              f"{row['tokens_per_s']:>12.0f} {tflops:>13.2f} {ratio:>10}",
                              flush=True)
                rows.append(row)
        del q, k, v
        if cuda:
            torch.cuda.empty_cache()
    if args.json and rank == 0:
        meta = {"ranks": world, "device": name, "batch": args.batch, "heads": heads,
                "heads_kv": heads_kv, "head_dim": head_dim, "dtype": str(dtype),
                "causal": causal, "split": split, "torch": torch.__version__,
                "flashjit": flashjit.__version__, "commit": os.environ.get("COMMIT")}
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)
    dist.destroy_process_group()
    return rows


def _spawned(rank, world, port, argv):
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    main(argv)


_MESH = {}


def _torch_cp(torch, dist, F, args, device, n, heads, heads_kv, head_dim, dtype, causal, pass_,
              timed, runner, work):
    """(seconds, TFLOP/s per rank) of torch's context_parallel over SDPA at total length n, or
    (None, reason)."""
    try:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.experimental import context_parallel
        from torch.distributed.tensor.experimental._attention import set_rotate_method
    except ImportError as error:
        return None, f"torch has no context_parallel ({error})"
    try:
        set_rotate_method("allgather")
        mesh = _MESH.get(device.type)
        if mesh is None:
            mesh = _MESH[device.type] = init_device_mesh(device.type, (dist.get_world_size(),))
        g = torch.Generator(device=device).manual_seed(2000)
        # full (batch, heads, n, head_dim) buffers, sharded in place by context_parallel
        q = torch.randn(args.batch, heads, n, head_dim, device=device, dtype=dtype, generator=g)
        k = torch.randn(args.batch, heads_kv, n, head_dim, device=device, dtype=dtype,
                        generator=g)
        v = torch.randn_like(k)
        gqa = heads != heads_kv

        def sdpa(q, k, v):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)

        with context_parallel(mesh, buffers=[q, k, v], buffer_seq_dims=[2, 2, 2],
                              no_restore_buffers={q, k, v}):
            seconds = timed(runner(sdpa, (q, k, v), pass_))
        return seconds, work / seconds / 1e12
    except Exception as error:  # noqa: BLE001 (any failure of the experimental API: reported)
        return None, f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"


if __name__ == "__main__":
    main()
