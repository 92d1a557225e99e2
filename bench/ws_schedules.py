#!/usr/bin/env python3
"""Markdown table of the -ws tile in each schedule vs. PyTorch SDPA peers, one GPU run.

    python3 bench/ws_schedules.py ws.json peers.json

ws.json:    bench_attention --json rows of one -ws tile per head dim, each in several
            schedules (configs "...-ws", "-ws-pp", "-ws-persist", "-ws-pp-persist").
peers.json: peers_bench.py --json rows (backend = flash|cudnn).
One row per shape: TFLOP/s of each schedule, the best one, and the best / torch flash and
/ cuDNN. Then geo-means per schedule: over cuDNN and over the plain -ws tile (what each
scheduling lever gave). Rows are matched on (dtype, d, causal, N). Pure stdlib.
"""
import json
import math
import sys

from compare import key, load, tflops

SCHEDULES = ("", "-pp", "-persist", "-pp-persist")


def schedule_of(config):
    rest = config.split("-ws", 1)[1] if "-ws" in config else None
    return rest if rest in SCHEDULES else None


def geo_mean(values):
    values = [v for v in values if v]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def fmt(value, digits=1):
    return "-" if value is None else f"{value:.{digits}f}"


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    ours = {}  # shape key -> {schedule: row}
    tiles = {}  # head dim -> the tile's name without its schedule
    for row in load(sys.argv[1]):
        schedule = schedule_of(str(row.get("config", "")))
        if schedule is None or tflops(row) is None:
            continue
        ours.setdefault(key(row), {})[schedule] = row
        tiles[int(row["d"])] = row["config"][: len(row["config"]) - len(schedule)]
    peers = {}
    for row in load(sys.argv[2]):
        peers.setdefault(key(row), {})[row.get("backend")] = row

    names = ["-ws" + s for s in SCHEDULES]
    print("| dtype | d | causal | N | tile | " + " | ".join(names) +
          " | best | torch flash | cuDNN | best/flash | best/cuDNN |")
    print("|" + "---|" * (11 + len(names) - 1))
    over_cudnn = {s: [] for s in SCHEDULES + ("best",)}
    over_plain = {s: [] for s in SCHEDULES + ("best",)}
    for k in sorted(ours):
        by_schedule = ours[k]
        values = {s: tflops(by_schedule.get(s)) for s in SCHEDULES}
        present = {s: v for s, v in values.items() if v}
        best = max(present, key=present.get)
        flash = tflops(peers.get(k, {}).get("flash"))
        cudnn = tflops(peers.get(k, {}).get("cudnn"))
        plain = values[""]
        for s in SCHEDULES + ("best",):
            v = present[best] if s == "best" else values[s]
            if v and cudnn:
                over_cudnn[s].append(v / cudnn)
            if v and plain:
                over_plain[s].append(v / plain)
        dtype, d, causal, n = k
        print(f"| {dtype} | {d} | {'yes' if causal else 'no'} | {n} | {tiles[d]} | " +
              " | ".join(fmt(values[s]) for s in SCHEDULES) +
              f" | -ws{best} | {fmt(flash)} | {fmt(cudnn)} | "
              f"{fmt(present[best] / flash if flash else None, 2)} | "
              f"{fmt(present[best] / cudnn if cudnn else None, 2)} |")
    print()
    for s in SCHEDULES + ("best",):
        name = "best of each shape" if s == "best" else "-ws" + s
        worst = min(over_cudnn[s]) if over_cudnn[s] else None
        print(f"- {name}: geo-mean / cuDNN {fmt(geo_mean(over_cudnn[s]), 3)} "
              f"(worst {fmt(worst, 2)}, {len(over_cudnn[s])} shapes), "
              f"/ plain -ws {fmt(geo_mean(over_plain[s]), 3)}")


if __name__ == "__main__":
    main()
