#!/usr/bin/env python3
"""Concurrent tuners on one device (issue 15): a lone `flashjit tune` of a small grid, then N
processes tuning the same grid into one shared DB at the same time, and the comparison.

With the device's timing lock (tuner/device_lock.hpp) and the disturbance check, every concurrent
process must end with the lone run's choices within the noise rule and no gain the lone run does
not show: for each problem, each process's default TFLOP/s within --tolerance of the lone run's
(its timing was not disturbed) and its chosen config either the lone run's or one the lone run
timed within its noise of its choice; a process whose timings were unstable stores no choice
(`disturbed`), which passes. Exits 1 on a violation, with a table either way.

  python3 bench/concurrent_tune.py --flashjit build/flashjit [--backend cuda] [--processes 4]
      [--out DIR]

On the GPU machine: bench/device_run.sh concurrent. The grid: --head-dims 128 --seqlens
1024,4096 --causal both (4 problems) on CUDA; on the CPU backend d 64, N 256, fp32, causal off
(one problem; the whole CPU is the device there, so the processes' compiles disturb each other's
timings: the disturbance check is what keeps the choices honest).
"""
import argparse
import json
import os
import subprocess
import sys
import time


def grid(backend):
    if backend == "cpu":
        return ["--backend", "cpu", "--head-dims", "64", "--seqlens", "256", "--causal", "off",
                "--dtypes", "fp32", "--batch", "1", "--heads", "4", "--min-time-ms", "40"]
    return ["--backend", backend, "--head-dims", "128", "--seqlens", "1024,4096",
            "--causal", "both"]


def run_tune(flashjit, args, db, json_path, log_path, env):
    command = [flashjit, "tune", *args, "--retune", "--db", db, "--json", json_path]
    log = open(log_path, "w")
    return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env), log


def reports(path):
    with open(path) as f:
        return {p["key"]: p for p in json.load(f)["problems"]}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--flashjit", default="build/flashjit")
    parser.add_argument("--backend", default="cuda")
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--tolerance", type=float, default=0.10,
                        help="how far a concurrent run's default time may be from the lone's")
    parser.add_argument("--out", default=os.environ.get("OUT", "device-out"))
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    env = dict(os.environ)
    env.setdefault("FLASHJIT_LOCK_DIR", os.path.join(args.out, "locks"))
    tune_args = grid(args.backend)

    start = time.time()
    proc, log = run_tune(args.flashjit, tune_args, os.path.join(args.out, "lone.db"),
                         os.path.join(args.out, "lone.json"), os.path.join(args.out, "lone.log"),
                         env)
    proc.wait()
    log.close()
    if proc.returncode != 0:
        print(open(os.path.join(args.out, "lone.log")).read()[-3000:])
        sys.exit(f"the lone tune failed ({proc.returncode})")
    lone_s = time.time() - start

    start = time.time()
    runs = []
    for i in range(args.processes):
        runs.append(run_tune(args.flashjit, tune_args, os.path.join(args.out, "shared.db"),
                             os.path.join(args.out, f"concurrent-{i}.json"),
                             os.path.join(args.out, f"concurrent-{i}.log"), env))
    failed = []
    for i, (proc, log) in enumerate(runs):
        proc.wait()
        log.close()
        if proc.returncode != 0:
            failed.append(i)
    concurrent_s = time.time() - start

    lone = reports(os.path.join(args.out, "lone.json"))
    violations = []
    waits = 0
    lines = [f"# {args.processes} concurrent tuners vs a lone one ({args.backend})", "",
             f"lone: {lone_s:.0f} s; {args.processes} concurrent: {concurrent_s:.0f} s", "",
             "| problem | lone default ms | lone choice (gain) | process | default ms "
             "| choice (gain) | verdict |", "|---|---:|---|---:|---:|---|---|"]
    for i in range(args.processes):
        log_text = open(os.path.join(args.out, f"concurrent-{i}.log")).read()
        waits += log_text.count("waiting for ")
        if i in failed:
            violations.append(f"process {i} failed: {log_text[-500:]}")
            continue
        mine = reports(os.path.join(args.out, f"concurrent-{i}.json"))
        for key, ref in lone.items():
            got = mine.get(key)
            if got is None:
                violations.append(f"process {i}: {key} missing")
                continue
            ref_default = ref["default"]["ms"]
            got_default = got["default"]["ms"]
            ref_choice = ref["chosen"]["config"] if ref["chosen"] else None
            got_choice = got["chosen"]["config"] if got["chosen"] else None
            verdict = "ok"
            if got.get("disturbed"):
                verdict = "unstable: no choice stored (ok)"
            else:
                if abs(got_default - ref_default) > args.tolerance * ref_default:
                    verdict = "default disturbed"
                elif got_choice != ref_choice:
                    # The lone run's time of the concurrent choice must be within its noise.
                    times = {r["config"]: r.get("median_ms") for r in ref["results"]}
                    chosen_ms = ref["chosen"]["ms"]
                    other_ms = times.get(got_choice)
                    noise = max(ref.get("noise_ms") or 0, 0.02 * chosen_ms)
                    if other_ms is None or other_ms - chosen_ms > noise:
                        verdict = f"choice {got_choice} not within the lone run's noise"
                    else:
                        verdict = "ok (within noise)"
                if got["gain"] > ref["gain"] * (1 + args.tolerance):
                    verdict = f"gain {got['gain']:.2f}x that the lone run does not show"
            if not verdict.startswith("ok") and not verdict.startswith("unstable"):
                violations.append(f"process {i}: {key}: {verdict}")
            lines.append(f"| {key} | {ref_default:.4g} | {ref_choice} ({ref['gain']:.3f}x) | {i} "
                         f"| {got_default:.4g} | {got_choice} ({got['gain']:.3f}x) | {verdict} |")
    lines += ["", f"'waiting for' messages: {waits}",
              f"violations: {len(violations)}"] + [f"- {v}" for v in violations]
    text = "\n".join(lines) + "\n"
    print(text)
    with open(os.path.join(args.out, "concurrent.md"), "w") as f:
        f.write(text)
    sys.exit(1 if violations else 0)


if __name__ == "__main__":
    main()
