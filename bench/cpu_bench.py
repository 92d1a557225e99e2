#!/usr/bin/env python3
"""flashjit's CPU backend against PyTorch's CPU scaled_dot_product_attention, same run, same
machine, same thread count; GFLOP/s and the fraction of the CPU's peak; the forward pass, the
backward pass or both.

    python3 bench/cpu_bench.py [--pass fwd|bwd|both] [--dtypes bf16,fp32] [--d 64,128]
                               [--n 512,1024,2048,4096] [--causal off|on|both] [--reps 7]
                               [--tokens 4096] [--tune | --no-tune] [--json PATH]
                               [--markdown PATH]

What it does, in order:
  1. Makes sure PyTorch is importable: if the running python has no torch, it creates the
     git-ignored virtual environment <repo>/.venv-bench and installs torch there with
     scripts/common.sh's install_torch (as CI does: PyPI's wheel without its CUDA dependencies,
     --no-deps, ~1 GB instead of ~4 GB, plus the few small ones `import torch` needs and four
     nvidia-* libraries that libtorch links; if torch still cannot be imported, the full
     `pip install torch`), then re-runs itself with that python.
  2. Builds build/bench/cpu_bench and build/flashjit if missing (cmake --build build).
  3. `cpu_bench peak` (before and after the run): the clock (a chain of dependent adds, one per
     cycle; the higher of the two measurements) and the measured
     throughput of 12 independent FMA chains (and of vdpbf16ps where the CPU has AVX512_BF16),
     at the ISA level the CPU backend uses (FLASHJIT_CPU_ISA caps it). Peak = cores x the
     measured FMA FLOP per cycle, rounded to a power of two (32 on Zen 4, whose 512-bit FMAs
     issue as two 256-bit halves, as on any AVX2 core with two FMA pipes; 64 on Zen 5 and Intel
     server cores with two 512-bit FMA units) x the clock.
  4. Unless --no-tune: `flashjit tune --backend cpu --pass <the passes>` over the grid into
     build/bench-cpu-tuning.db (resumes: problems already tuned there are not measured again);
     the "tuned" column is what the DB serves (the default where the tuner kept it).
  5. For every (pass, dtype, d, causal, N): torch (reps/2 timed calls), flashjit's default and
     tuned configs (`cpu_bench time`, reps timed launches each), torch again (reps/2): medians.
     torch gets torch.set_num_threads(cores), the number of threads flashjit's pool runs.
     The backward: torch.autograd.grad of F.scaled_dot_product_attention w.r.t. q, k and v
     (its forward run once, outside the timed region, the graph retained); flashjit's backward
     kernels with o and lse from its forward kernel (also outside the timing).

Shapes: batch = tokens / N (tokens = 4096 unless --tokens), heads = 512 / d (the GPU
benchmark's 16k tokens x 2048 hidden scaled to a CPU), N = seqlen_q = seqlen_k; flashjit BSHD,
torch BHSD (each's native layout), both contiguous. FLOPs: 4 B H N^2 d, halved when causal (the
FlashAttention convention); the backward 2.5 times that (5 matrix products instead of 2).
The numbers are noisy on a shared machine: every sample is kept in the JSON.
"""

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BUILD = REPO / "build"
VENV = REPO / ".venv-bench"
TOKENS, HIDDEN = 4096, 512


def log(message):
    print(f"[cpu_bench] {message}", file=sys.stderr, flush=True)


# ---- 1. torch -------------------------------------------------------------------------------

def torch_importable(python):
    return subprocess.run([str(python), "-c", "import torch"], capture_output=True).returncode == 0


def ensure_torch():
    """Returns when `import torch` works in this interpreter, else re-executes under the venv."""
    try:
        import torch  # noqa: F401
        return
    except ImportError:
        pass
    python = VENV / "bin" / "python"
    if not python.exists():
        log(f"creating {VENV}")
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    if not torch_importable(python):
        log("installing torch (scripts/common.sh install_torch)")
        subprocess.run(["bash", "-c", 'source "$0" && install_torch "$1"',
                        str(REPO / "scripts" / "common.sh"), str(python)])
    if not torch_importable(python):
        sys.exit("cpu_bench: could not install an importable torch")
    os.execv(str(python), [str(python), str(Path(__file__).resolve())] + sys.argv[1:])


# ---- 2./3./4. flashjit side -----------------------------------------------------------------

def ensure_built():
    if (BUILD / "bench" / "cpu_bench").exists() and (BUILD / "flashjit").exists():
        return
    log("building build/bench/cpu_bench and build/flashjit")
    if not (BUILD / "CMakeCache.txt").exists():
        subprocess.run(["cmake", "-S", str(REPO), "-B", str(BUILD), "-DCMAKE_BUILD_TYPE=Release"],
                       check=True)
    subprocess.run(["cmake", "--build", str(BUILD), "-j", str(os.cpu_count() or 2), "--target",
                    "cpu_bench", "flashjit_cli"], check=True)


def peak():
    out = subprocess.run([str(BUILD / "bench" / "cpu_bench"), "peak"], capture_output=True,
                         text=True, check=True).stdout
    return json.loads(out)


def tune(args, db, passes):
    for dtype in args.dtypes:
        command = [str(BUILD / "flashjit"), "tune", "--backend", "cpu", "--db", str(db),
                   "--pass", ",".join(passes),
                   "--dtypes", dtype, "--head-dims", ",".join(map(str, args.d)),
                   "--seqlens", ",".join(map(str, args.n)), "--causal", args.causal,
                   "--tokens", str(TOKENS), "--hidden", str(HIDDEN)]
        log("tuning: " + " ".join(command[1:]))
        subprocess.run(command, check=True)


def flashjit_times(pass_, dtype, d, n, causal, reps, db):
    command = [str(BUILD / "bench" / "cpu_bench"), "time", "--pass", pass_, "--dtype", dtype,
               "--d", str(d),
               "--n", str(n), "--tokens", str(TOKENS), "--hidden", str(HIDDEN), "--reps",
               str(reps), "--db", str(db)]
    if causal:
        command.append("--causal")
    out = subprocess.run(command, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(out.stderr.strip())
    rows = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    by_impl = {row["impl"]: row for row in rows}
    if "flashjit-tuned" not in by_impl:  # the DB's choice is the default config
        tuned = dict(by_impl["flashjit-default"], impl="flashjit-tuned")
        by_impl["flashjit-tuned"] = tuned
    return by_impl


# ---- 5. torch side --------------------------------------------------------------------------

def torch_samples(torch, pass_, dtype, d, n, causal, reps):
    import torch.nn.functional as F
    batch, heads = max(1, TOKENS // n), max(1, HIDDEN // d)
    torch_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype]
    generator = torch.Generator().manual_seed(20261122)
    q, k, v = (torch.randn(batch, heads, n, d, generator=generator).to(torch_dtype)
               for _ in range(3))
    if pass_ == "bwd":
        q, k, v = (t.requires_grad_() for t in (q, k, v))
        d_o = torch.randn(batch, heads, n, d, generator=generator).to(torch_dtype)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)  # not timed
        for _ in range(2):  # one warm-up call where a call takes seconds (bf16 at N = 4096)
            start = time.perf_counter()
            torch.autograd.grad(out, (q, k, v), d_o, retain_graph=True)
            if time.perf_counter() - start > 1.0:
                break
        samples = []
        for _ in range(reps):
            start = time.perf_counter()
            torch.autograd.grad(out, (q, k, v), d_o, retain_graph=True)
            samples.append((time.perf_counter() - start) * 1e3)
        return samples
    with torch.inference_mode():
        for _ in range(2):
            F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        samples = []
        for _ in range(reps):
            start = time.perf_counter()
            F.scaled_dot_product_attention(q, k, v, is_causal=causal)
            samples.append((time.perf_counter() - start) * 1e3)
    return samples


def flops(pass_, d, n, causal):
    batch, heads = max(1, TOKENS // n), max(1, HIDDEN // d)
    f = 4.0 * batch * heads * n * n * d * (2.5 if pass_ == "bwd" else 1.0)
    return f / 2 if causal else f


def main():
    global TOKENS
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pass", dest="pass_", default="fwd", choices=["fwd", "bwd", "both"])
    parser.add_argument("--dtypes", default="bf16,fp32")
    parser.add_argument("--d", default="64,128")
    parser.add_argument("--n", default="512,1024,2048,4096")
    parser.add_argument("--causal", default="both", choices=["off", "on", "both"])
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--tokens", type=int, default=TOKENS,
                        help="batch = tokens / N (default 4096; the backward at N = 2048 in bf16 "
                             "takes torch ~15 s a call on 2 cores: 1024 keeps a run short)")
    parser.add_argument("--tune", dest="tune", action="store_true", default=True)
    parser.add_argument("--no-tune", dest="tune", action="store_false")
    parser.add_argument("--db", default=str(BUILD / "bench-cpu-tuning.db"))
    parser.add_argument("--json", default=str(BUILD / "cpu-bench.json"))
    parser.add_argument("--markdown", default=None, help="also write the markdown table here")
    args = parser.parse_args()
    TOKENS = args.tokens
    args.dtypes = args.dtypes.split(",")
    args.d = [int(x) for x in args.d.split(",")]
    args.n = [int(x) for x in args.n.split(",")]

    ensure_torch()
    import torch
    ensure_built()
    machine = peak()
    cores = machine["cores"]
    torch.set_num_threads(cores)
    log(f"{cores} cores, {machine['isa']}, clock {machine['clock_ghz']:.2f} GHz now; measured FMA "
        f"{machine['fma_gflops_per_core']:.0f} GFLOP/s per core "
        f"({machine['fma_flop_per_cycle']:.1f} FLOP/cycle)")
    log(f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"CPU capability {torch.backends.cpu.get_cpu_capability()}")
    passes = {"fwd": ["fwd"], "bwd": ["bwd"], "both": ["fwd", "bwd"]}[args.pass_]
    if args.tune:
        tune(args, args.db, passes)

    causal_values = {"off": [False], "on": [True], "both": [False, True]}[args.causal]
    half = max(1, args.reps // 2)
    rows = []
    print(f"{'pass':4} {'dtype':5} {'d':>4} {'causal':>6} {'N':>5}  {'default':>8} {'tuned':>8} "
          f"{'torch':>8}  {'ratio':>6}  config   (GFLOP/s, medians)")
    grid = [(p, dtype, d, causal, n) for p in passes for dtype in args.dtypes for d in args.d
            for causal in causal_values for n in args.n]
    for pass_, dtype, d, causal, n in grid:
        torch_ms = torch_samples(torch, pass_, dtype, d, n, causal, half)
        fj = flashjit_times(pass_, dtype, d, n, causal, args.reps, args.db)
        torch_ms += torch_samples(torch, pass_, dtype, d, n, causal, half)
        f = flops(pass_, d, n, causal)
        torch_gflops = f / (statistics.median(torch_ms) * 1e-3) / 1e9
        tuned = fj["flashjit-tuned"]
        row = {
            "pass": pass_, "dtype": dtype, "d": d, "causal": causal, "N": n,
            "B": max(1, TOKENS // n), "H": max(1, HIDDEN // d),
            "default_gflops": fj["flashjit-default"]["gflops"],
            "default_config": fj["flashjit-default"]["config"],
            "tuned_gflops": tuned["gflops"], "tuned_config": tuned["config"],
            "torch_gflops": torch_gflops,
            "ratio_tuned_vs_torch": tuned["gflops"] / torch_gflops,
            "samples_ms": {"default": fj["flashjit-default"]["samples_ms"],
                           "tuned": tuned["samples_ms"], "torch": torch_ms},
        }
        rows.append(row)
        print(f"{pass_:4} {dtype:5} {d:4} {'yes' if causal else 'no':>6} {n:5}  "
              f"{row['default_gflops']:8.1f} {row['tuned_gflops']:8.1f} "
              f"{torch_gflops:8.1f}  {row['ratio_tuned_vs_torch']:5.2f}x  "
              f"{row['tuned_config']}", flush=True)

    # The peak at the higher of the clocks measured before and after (the other load on a shared
    # machine only ever makes the measured clock lower).
    again = peak()
    clock = max(machine["clock_ghz"], again["clock_ghz"])
    flop_per_cycle = 2 ** round(math.log2(max(machine["fma_flop_per_cycle"], 1.0)))
    fp32_peak = cores * flop_per_cycle * clock
    log(f"fp32 peak = {cores} cores x {flop_per_cycle} FMA FLOP/cycle (measured "
        f"{machine['fma_flop_per_cycle']:.1f}) x "
        f"{clock:.2f} GHz = {fp32_peak:.0f} GFLOP/s (clock measured {machine['clock_ghz']:.2f} "
        f"GHz before, {again['clock_ghz']:.2f} GHz after)")
    for row in rows:
        row["tuned_fraction_of_fp32_peak"] = row["tuned_gflops"] / fp32_peak
    result = {"machine": machine, "machine_at_end": again, "clock_ghz": clock,
              "fp32_peak_gflops": fp32_peak, "torch": torch.__version__, "threads": cores,
              "tokens": TOKENS, "hidden": HIDDEN, "reps": args.reps, "rows": rows}
    Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    log(f"wrote {args.json}")
    lines = ["| pass | dtype | d | causal | N | flashjit default | flashjit tuned (config) "
             "| torch | tuned / torch | tuned, % of fp32 peak |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['pass']} | {r['dtype']} | {r['d']} | {'yes' if r['causal'] else 'no'} "
                     f"| {r['N']} "
                     f"| {r['default_gflops']:.0f} | {r['tuned_gflops']:.0f} "
                     f"({r['tuned_config']}) | {r['torch_gflops']:.0f} "
                     f"| {r['ratio_tuned_vs_torch']:.2f}x "
                     f"| {100 * r['tuned_fraction_of_fp32_peak']:.0f}% |")
    print("\n".join(lines))
    if args.markdown:
        Path(args.markdown).write_text("\n".join(lines) + "\n")
        log(f"wrote {args.markdown}")

if __name__ == "__main__":
    main()
