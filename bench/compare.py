#!/usr/bin/env python3
"""Markdown table of flashjit vs. PyTorch SDPA peers, from two JSON files of one GPU run.

    python3 bench/compare.py flashjit.json peers.json

flashjit.json: bench_attention --json (rows with impl, dtype, d, causal, N, fwd_tflops).
peers.json:    peers_bench.py --json (rows with backend = flash|cudnn|efficient, ...).
Rows are matched on (dtype, d, causal, N). Ratios are flashjit / peer (> 1: flashjit faster);
geo-means are over the rows where both numbers exist. Pure stdlib.
"""
import json
import math
import sys

DTYPE_NAMES = {"bfloat16": "bf16", "bf16": "bf16", "float16": "f16", "fp16": "f16",
               "f16": "f16", "half": "f16"}
PEERS = (("flash", "torch flash"), ("cudnn", "cuDNN"))


def load(path):
    with open(path) as f:
        rows = json.load(f)
    if not isinstance(rows, list):
        sys.exit(f"compare.py: {path}: expected a JSON list of rows")
    return rows


def key(row):
    dtype = DTYPE_NAMES.get(str(row.get("dtype")), str(row.get("dtype")))
    return (dtype, int(row["d"]), bool(row["causal"]), int(row["N"]))


def tflops(row):
    value = row.get("fwd_tflops") if row else None
    return float(value) if isinstance(value, (int, float)) and value > 0 else None


def fmt(value, digits=1):
    return "-" if value is None else f"{value:.{digits}f}"


def geomean(values):
    values = [v for v in values if v]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def main(argv):
    if len(argv) != 3:
        sys.exit("usage: compare.py FLASHJIT_JSON PEERS_JSON")
    # bench_attention rows: impl flashjit-tuned (the config the runtime serves) and
    # flashjit-default (the SRAM-formula default), or one forced flashjit-<config>.
    by_impl = {}
    for row in load(argv[1]):
        by_impl.setdefault(row.get("impl", "flashjit"), {})[key(row)] = row
    primary = "flashjit-tuned" if "flashjit-tuned" in by_impl else sorted(by_impl)[0]
    ours = by_impl[primary]
    defaults = by_impl.get("flashjit-default") if primary != "flashjit-default" else None
    peers = {}
    for row in load(argv[2]):
        if "backend" in row:
            peers[(row["backend"],) + key(row)] = row

    print(f"flashjit = {primary}" + ("; default = flashjit-default" if defaults else ""))
    print()
    header = ["dtype", "d", "causal", "N", "flashjit TFLOP/s", "config"]
    if defaults:
        header += ["default TFLOP/s", "default config", "vs default"]
    header += [f"{title} TFLOP/s" for _, title in PEERS]
    header += [f"vs {title}" for _, title in PEERS]
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join("---" for _ in header) + "|")

    ratios = {name: [] for name, _ in PEERS}
    gains = []
    peers_all = {name: [] for name, _ in PEERS}
    for k in sorted(ours):
        row = ours[k]
        mine = tflops(row)
        cells = [k[0], str(k[1]), "yes" if k[2] else "no", str(k[3]),
                 fmt(mine) if mine else "error", row.get("config", "") or "-"]
        if defaults:
            base = defaults.get(k)
            base_value = tflops(base)
            gain = mine / base_value if mine and base_value else None
            cells += [fmt(base_value), (base or {}).get("config", "") or "-", fmt(gain, 2)]
            if gain:
                gains.append(gain)
        peer_values, ratio_cells = [], []
        for name, _ in PEERS:
            theirs = tflops(peers.get((name,) + k))
            peer_values.append(fmt(theirs))
            ratio = mine / theirs if mine and theirs else None
            ratio_cells.append(fmt(ratio, 2))
            if ratio:
                ratios[name].append(ratio)
                peers_all[name].append(theirs)
        print("| " + " | ".join(cells + peer_values + ratio_cells) + " |")

    print()
    if defaults:
        print(f"- geo-mean {primary} / flashjit-default: {fmt(geomean(gains), 3)} over "
              f"{len(gains)} shapes")
    for name, title in PEERS:
        mean = geomean(ratios[name])
        print(f"- geo-mean flashjit / {title}: {fmt(mean, 3)} over {len(ratios[name])} shapes")
    print(f"- geo-mean flashjit TFLOP/s: {fmt(geomean([tflops(r) for r in ours.values()]))} "
          f"over {sum(1 for r in ours.values() if tflops(r))} shapes")
    for name, title in PEERS:
        print(f"- geo-mean {title} TFLOP/s (same shapes): {fmt(geomean(peers_all[name]))}")
    missing = [k for k in sorted(ours) if not tflops(ours[k])]
    if missing:
        names = ", ".join("d%d %s N%d" % (k[1], "causal" if k[2] else "full", k[3])
                          for k in missing[:8])
        print(f"- flashjit rows without a result: {len(missing)} ({names})")


if __name__ == "__main__":
    main(sys.argv)
