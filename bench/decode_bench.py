#!/usr/bin/env python3
"""Decode bandwidth: flashjit's decode family vs PyTorch SDPA (flash, cuDNN), same run.

Issue 18's grid: one query token per sequence, GQA 32:8, d = 128, bf16, batch x seqlen_k.
flashjit runs in the C++ benchmark (build-device/bench/decode_bench, contiguous and paged);
torch here, on the same GPU, in the same call of this script; each side measures the
device-to-device copy bandwidth in its own process, and every bandwidth is reported as a share
of that copy (2 * bytes / time: a copy reads and writes each byte):

    decode bandwidth = bytes of K and V of the 8 kv heads (2 * B * Sk * 8 * 128 * 2) / time

torch's flash and cuDNN backends are asked for GQA natively (enable_gqa=True); a backend that
refuses it runs with K and V expanded to the 32 query heads (marked "expanded": it then reads 4x
the bytes, so its share is understated). Writes OUT_DIR/decode.md (table), decode.json and
decode.svg (bandwidth share vs seqlen_k, one line per batch and implementation).

    python3 bench/decode_bench.py [--bench build-device/bench/decode_bench] [--out-dir DIR]
                                  [--batch 1,4,16,64] [--seqlen-k 1024,8192,32768,131072]
"""
import argparse
import json
import os
import subprocess
import sys


def parse_list(text):
    return [int(x) for x in text.split(",") if x]


def torch_rows(batches, seqlens, target_ms):
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    dev = torch.device("cuda")
    hq, hkv, d = 32, 8, 128

    def timed(fn, reps_hint=20):
        fn(0)
        torch.cuda.synchronize()
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn(1)
        stop.record()
        torch.cuda.synchronize()
        once = max(start.elapsed_time(stop), 1e-3)
        reps = max(5, min(1000, int(target_ms / 10 / once)))
        times = []
        call = 0
        for _ in range(10):
            start.record()
            for _ in range(reps):
                fn(call)
                call += 1
            stop.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(stop) / reps)
        times.sort()
        return times[len(times) // 2]

    n = 1 << 30
    a = torch.empty(n, dtype=torch.uint8, device=dev)
    b = torch.empty_like(a)
    copy_ms = timed(lambda i: b.copy_(a))
    copy_gbps = 2 * n / (copy_ms * 1e-3) / 1e9
    del a, b
    l2 = torch.cuda.get_device_properties(dev).L2_cache_size
    rows = []
    for batch in batches:
        for sk in seqlens:
            kv_bytes = 2.0 * batch * sk * hkv * d * 2
            if kv_bytes > 30e9:
                continue
            copies = int(max(1, min(2 * l2 / kv_bytes + 1, 30e9 / kv_bytes)))
            q = torch.randn(batch, hq, 1, d, device=dev, dtype=torch.bfloat16)
            ks = [torch.randn(batch, hkv, sk, d, device=dev, dtype=torch.bfloat16)
                  for _ in range(copies)]
            vs = [torch.randn_like(k) for k in ks]
            for name, backend in (("torch-flash", SDPBackend.FLASH_ATTENTION),
                                  ("torch-cudnn", SDPBackend.CUDNN_ATTENTION)):
                row = {"impl": name, "batch": batch, "seqlen_k": sk, "kv_bytes": kv_bytes}
                try:
                    with sdpa_kernel([backend]):
                        def run(i):
                            c = i % copies
                            return F.scaled_dot_product_attention(q, ks[c], vs[c],
                                                                  enable_gqa=True)
                        ms = timed(run)
                    row["mode"] = "gqa"
                except Exception:  # the backend does not take GQA: expand K and V
                    try:
                        ek = [k.repeat_interleave(hq // hkv, dim=1) for k in ks[:1]]
                        ev = [v.repeat_interleave(hq // hkv, dim=1) for v in vs[:1]]
                        with sdpa_kernel([backend]):
                            ms = timed(lambda i: F.scaled_dot_product_attention(q, ek[0], ev[0]))
                        row["mode"] = "expanded"
                        del ek, ev
                    except Exception as error:  # noqa: BLE001
                        row["error"] = str(error).splitlines()[0][:120]
                        rows.append(row)
                        continue
                row["ms"] = ms
                row["gbps"] = kv_bytes / (ms * 1e-3) / 1e9
                row["share"] = row["gbps"] / copy_gbps
                rows.append(row)
            del ks, vs, q
            torch.cuda.empty_cache()
    return {"device": torch.cuda.get_device_name(dev), "copy_gbps": copy_gbps,
            "torch": torch.__version__, "rows": rows}


def svg_plot(rows, path):
    """Bandwidth share vs seqlen_k (log2 axis): one line per (impl, batch)."""
    series = {}
    for r in rows:
        if "share" in r:
            series.setdefault((r["impl"], r["batch"]), []).append((r["seqlen_k"], r["share"]))
    if not series:
        return
    import math
    xs = sorted({x for pts in series.values() for x, _ in pts})
    w, h, left, bottom = 760, 420, 60, 40
    x0, x1 = math.log2(xs[0]), math.log2(xs[-1]) if len(xs) > 1 else math.log2(xs[0]) + 1
    ymax = max(1.1, max(y for pts in series.values() for _, y in pts) * 1.05)
    colors = {"flashjit": "#d62728", "flashjit-paged": "#ff7f0e", "torch-flash": "#1f77b4",
              "torch-cudnn": "#2ca02c"}
    dashes = ["", "6,3", "2,2", "8,2,2,2", "1,3"]
    batches = sorted({b for _, b in series})

    def px(x):
        return left + (math.log2(x) - x0) / max(x1 - x0, 1e-9) * (w - left - 150)

    def py(y):
        return h - bottom - y / ymax * (h - bottom - 20)

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" '
           'font-family="sans-serif" font-size="11">',
           f'<line x1="{left}" y1="{py(0)}" x2="{w - 150}" y2="{py(0)}" stroke="black"/>',
           f'<line x1="{left}" y1="{py(0)}" x2="{left}" y2="20" stroke="black"/>']
    for y in [i / 10 for i in range(0, int(ymax * 10) + 1, 2)]:
        out.append(f'<text x="{left - 30}" y="{py(y) + 4}">{int(y * 100)}%</text>')
        out.append(f'<line x1="{left}" y1="{py(y)}" x2="{w - 150}" y2="{py(y)}" '
                   'stroke="#ddd"/>')
    for x in xs:
        out.append(f'<text x="{px(x) - 12}" y="{h - bottom + 15}">{x // 1024}k</text>')
    out.append(f'<text x="{(w - 150) / 2}" y="{h - 5}">seqlen_k (keys per sequence)</text>')
    legend_y = 30
    for (impl, batch), pts in sorted(series.items()):
        pts.sort()
        color = colors.get(impl, "#7f7f7f")
        dash = dashes[batches.index(batch) % len(dashes)]
        path_d = " ".join(f"{'M' if i == 0 else 'L'}{px(x):.1f},{py(y):.1f}"
                          for i, (x, y) in enumerate(pts))
        out.append(f'<path d="{path_d}" fill="none" stroke="{color}" stroke-width="1.6" '
                   f'stroke-dasharray="{dash}"/>')
        out.append(f'<text x="{w - 140}" y="{legend_y}" fill="{color}">{impl} b{batch}</text>')
        legend_y += 13
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bench", default="build-device/bench/decode_bench")
    parser.add_argument("--out-dir", default="device-out")
    parser.add_argument("--batch", default="1,4,16,64")
    parser.add_argument("--seqlen-k", default="1024,8192,32768,131072")
    parser.add_argument("--target-ms", type=float, default=100)
    args = parser.parse_args()
    os.makedirs(args.out_dir, exist_ok=True)
    batches, seqlens = parse_list(args.batch), parse_list(args.seqlen_k)

    flashjit_json = os.path.join(args.out_dir, "decode-flashjit.json")
    status = subprocess.call([args.bench, "--batch", args.batch, "--seqlen-k", args.seqlen_k,
                              "--target-ms", str(args.target_ms), "--json", flashjit_json])
    ours = {"rows": [], "copy_gbps": 1}
    if os.path.exists(flashjit_json):
        with open(flashjit_json) as f:
            ours = json.load(f)
    peers = torch_rows(batches, seqlens, args.target_ms)

    rows = []
    for r in ours["rows"]:
        impl = "flashjit-paged" if r["page_size"] else "flashjit"
        rows.append({"impl": impl, "batch": r["batch"], "seqlen_k": r["seqlen_k"], "ms": r["ms"],
                     "gbps": r["gbps"], "share": r["gbps"] / ours["copy_gbps"],
                     "config": r["config"], "splits": r["splits"], "kv_bytes": r["kv_bytes"],
                     "host_us": r.get("host_us")})
    rows += peers["rows"]
    report = {"device": peers["device"], "torch": peers["torch"],
              "commit": os.environ.get("COMMIT", "unknown"),
              "copy_gbps": {"flashjit": ours["copy_gbps"], "torch": peers["copy_gbps"]},
              "rows": rows}
    with open(os.path.join(args.out_dir, "decode.json"), "w") as f:
        json.dump(report, f, indent=1)
    svg_plot(rows, os.path.join(args.out_dir, "decode.svg"))

    def find(impl, b, sk):
        for r in rows:
            if r["impl"] == impl and r["batch"] == b and r["seqlen_k"] == sk:
                return r
        return None

    lines = [f"# Decode bandwidth on {peers['device']} (commit {report['commit']}, torch "
             f"{peers['torch']})", "",
             f"GQA 32:8, d 128, bf16, one query per sequence. Share of the device-to-device copy "
             f"({ours['copy_gbps']:.0f} GB/s in flashjit's process, {peers['copy_gbps']:.0f} GB/s "
             f"in torch's). Paged: 16 keys per page, pages shuffled.", "",
             "| batch | seqlen_k | flashjit | paged | torch flash | torch cuDNN | vs best peer "
             "| paged/contig | flashjit config (splits) | host us/call |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|:---|---:|"]
    worst = None
    for b in batches:
        for sk in seqlens:
            ours_row, paged = find("flashjit", b, sk), find("flashjit-paged", b, sk)
            fl, cu = find("torch-flash", b, sk), find("torch-cudnn", b, sk)

            def share(r):
                if r is None:
                    return "-"
                if "share" not in r:
                    return "error"
                mark = " (exp.)" if r.get("mode") == "expanded" else ""
                return f"{100 * r['share']:.0f}%{mark}"
            peer_best = max([r["share"] for r in (fl, cu) if r and "share" in r], default=None)
            ratio = (f"{ours_row['share'] / peer_best:.2f}x"
                     if ours_row and peer_best else "-")
            if ours_row and peer_best:
                worst = min(worst or 1e9, ours_row["share"] / peer_best)
            pc = (f"{paged['share'] / ours_row['share']:.2f}" if paged and ours_row else "-")
            cfg = f"{ours_row['config']} ({ours_row['splits']})" if ours_row else "-"
            host = (f"{ours_row['host_us']:.1f}"
                    if ours_row and ours_row.get("host_us") is not None else "-")
            lines.append(f"| {b} | {sk} | {share(ours_row)} | {share(paged)} | {share(fl)} | "
                         f"{share(cu)} | {ratio} | {pc} | {cfg} | {host} |")
    if worst is not None:
        lines += ["", f"Worst flashjit / best peer: {worst:.2f}x."]
    text = "\n".join(lines) + "\n"
    with open(os.path.join(args.out_dir, "decode.md"), "w") as f:
        f.write(text)
    print(text)
    return 0 if status == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
