#!/usr/bin/env python3
"""flashjit vs PyTorch SDPA, side by side, in one process on one GPU.

    python3 bench/side_by_side.py [--quick] [--tune] [--dtypes bf16,fp16] [--out-dir docs/perf]

Implementations, timed alike on the same inputs:
  flashjit-tuned    flashjit.attention(q, k, v, causal=...): the config the tuning DB serves
                    ($FLASHJIT_DB or ~/.local/share/flashjit/tuning.db; run `flashjit tune` first,
                    or pass --tune to tune the grid's missing problems here)
  flashjit-default  flashjit.attention(..., config="default"): the SRAM-formula default
  torch-flash       F.scaled_dot_product_attention under SDPBackend.FLASH_ATTENTION (FA2)
  cudnn             F.scaled_dot_product_attention under SDPBackend.CUDNN_ATTENTION

Grid (the standard one): d in {64, 128, 256}, causal off/on, N = 512 ... 16384, 16k tokens
(batch = 16384 / N), hidden 2048 (heads = 2048 / d), bf16 and fp16. flashjit gets BSHD
contiguous tensors; SDPA gets the same values as BHSD contiguous tensors (its native layout; the
copies are made before timing; --sdpa-input views passes transposed views of the BSHD tensors).

Each flashjit output (tuned and default) is checked against SDPA's output once per shape before
timing (relative L2 error < 1e-2; NaN fails).

Timing (the same for every implementation): inputs rotate over enough copies that one pass
touches at least twice the L2 cache; a sample is one batch of back-to-back calls between two CUDA
events (about --batch-ms of device time), divided by the batch's calls; the implementations'
batches are interleaved round-robin so that clock and thermal drift hit all alike; the result is
the median sample after at least --min-samples samples and --min-time-ms of device time per
implementation. TFLOP/s by the FlashAttention convention: 4 * B * H * N^2 * d, halved when
causal. host us/call is the CPU time spent issuing one call (a call costing more host time than
device time would be host-bound).

Writes into --out-dir (default docs/perf): <device>-<date>.md (a section for
docs/PERFORMANCE.md: device, date, commit, the table, geo-means, the plot), <device>-<date>.json
(every number), <device>-<date>-<dtype>.svg (TFLOP/s vs seqlen: one panel per head dim and causal
setting, one line per implementation; drawn here, no matplotlib needed) and, with --png and
matplotlib installed, the same as PNG. Exit status 1 when a flashjit output was wrong or an
implementation failed everywhere; 2 on bad arguments.

The pure parts (grid, summary, table, SVG, the timing loop with a pluggable timer) import no torch:
tests/python/test_side_by_side.py runs them on the CPU with fake timings.
"""
import argparse
import datetime
import json
import math
import os
import statistics
import subprocess
import sys
import time
from collections import OrderedDict

TOTAL_TOKENS = 16384
HIDDEN = 2048
IMPLS = OrderedDict([
    ("flashjit-tuned", "flashjit tuned"),
    ("flashjit-default", "flashjit default"),
    ("torch-flash", "torch SDPA flash"),
    ("cudnn", "torch SDPA cuDNN"),
])
COLORS = {
    "flashjit-tuned": "#d62728",
    "flashjit-default": "#ff9896",
    "torch-flash": "#1f77b4",
    "cudnn": "#2ca02c",
}
DTYPES = {"bf16": "bfloat16", "fp16": "float16"}
MAX_REL_ERROR = 1e-2


# --- grid -----------------------------------------------------------------------------------------

def make_grid(dtypes, head_dims, causals, seqlens, tokens=TOTAL_TOKENS, hidden=HIDDEN):
    """Shapes in (dtype, d, causal, N) order: dicts with dtype, d, causal, N, B, H, flops."""
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


def shape_label(row):
    return "%s d%d %s N%d" % (row["dtype"], row["d"], "causal" if row["causal"] else "full",
                              row["N"])


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


# --- summary, table, plot -------------------------------------------------------------------------

def tflops_of(row, impl):
    result = row.get("results", {}).get(impl) or {}
    ms = result.get("ms")
    if not ms or ms <= 0 or result.get("error") or result.get("wrong"):
        return None
    return row["flops"] / (ms * 1e-3) / 1e12


def geomean(values):
    values = [v for v in values if v is not None and v > 0]
    if not values:
        return None
    return math.exp(sum(math.log(v) for v in values) / len(values))


RATIOS = [
    ("flashjit-tuned", "torch-flash", "flashjit tuned / torch flash"),
    ("flashjit-tuned", "cudnn", "flashjit tuned / cuDNN"),
    ("flashjit-tuned", "flashjit-default", "flashjit tuned / default"),
    ("flashjit-default", "torch-flash", "flashjit default / torch flash"),
]


def summarize(rows):
    """Geo-means of the RATIOS per dtype and overall, the worst and best shape of each, and the
    geo-mean TFLOP/s of each implementation."""
    summary = {"ratios": [], "tflops": {}}
    dtypes = sorted({row["dtype"] for row in rows})
    for mine, theirs, title in RATIOS:
        entry = {"title": title, "mine": mine, "theirs": theirs, "by_dtype": {}}
        pairs = []
        for row in rows:
            a, b = tflops_of(row, mine), tflops_of(row, theirs)
            if a and b:
                pairs.append((row, a / b))
        for dtype in dtypes:
            values = [r for row, r in pairs if row["dtype"] == dtype]
            entry["by_dtype"][dtype] = {"geomean": geomean(values), "shapes": len(values)}
        entry["overall"] = {"geomean": geomean([r for _, r in pairs]), "shapes": len(pairs)}
        if pairs:
            worst = min(pairs, key=lambda p: p[1])
            best = max(pairs, key=lambda p: p[1])
            entry["worst"] = {"shape": shape_label(worst[0]), "ratio": worst[1]}
            entry["best"] = {"shape": shape_label(best[0]), "ratio": best[1]}
        summary["ratios"].append(entry)
    for impl in IMPLS:
        values = [tflops_of(row, impl) for row in rows]
        summary["tflops"][impl] = {"geomean": geomean(values),
                                   "shapes": sum(1 for v in values if v)}
    return summary


def fmt(value, digits=1):
    return "-" if value is None else "%.*f" % (digits, value)


def cell(row, impl):
    result = row.get("results", {}).get(impl) or {}
    if result.get("error"):
        return "error"
    if result.get("wrong"):
        return "WRONG"
    return fmt(tflops_of(row, impl))


def ratio_cell(row, mine, theirs):
    a, b = tflops_of(row, mine), tflops_of(row, theirs)
    return fmt(a / b, 2) if a and b else "-"


def markdown(meta, rows, summary, plots=()):
    """The section for docs/PERFORMANCE.md: heading, device/date/commit, table, geo-means, plots."""
    lines = []
    lines.append("## %s — side by side (bench/side_by_side.py), %s, commit %s"
                 % (meta.get("date", "?"), meta.get("device", "?"), meta.get("commit", "?")))
    lines.append("")
    facts = ["Device: %s (%s SMs)" % (meta.get("device", "?"), meta.get("sm_count", "?"))]
    for key, label in (("torch", "torch"), ("cudnn", "cuDNN"), ("flashjit", "flashjit"),
                       ("generator", "generator"), ("cuda_driver", "CUDA driver")):
        if meta.get(key):
            facts.append("%s %s" % (label, meta[key]))
    lines.append(", ".join(facts) + ".")
    if meta.get("ceilings"):
        lines.append("Ceilings in the same run: " + meta["ceilings"] + ".")
    lines.append("Timing: %s." % meta.get("timing", "see bench/side_by_side.py"))
    lines.append("flashjit tuned configs from %s; `source` says whether the tuning DB had the "
                 "problem (exact), a nearby one (nearest) or nothing (default)."
                 % meta.get("tuning_db", "the tuning DB"))
    lines.append("")
    header = ["dtype", "d", "causal", "N", "B×H", "flashjit tuned", "config (source)",
              "flashjit default", "default config", "torch flash", "cuDNN", "tuned / flash",
              "tuned / cuDNN", "tuned / default"]
    lines.append("| " + " | ".join(header) + " |")
    lines.append("|" + "|".join("---" for _ in header) + "|")
    for row in rows:
        tuned = row.get("results", {}).get("flashjit-tuned") or {}
        default = row.get("results", {}).get("flashjit-default") or {}
        config = tuned.get("config", "-")
        if tuned.get("source"):
            config += " (%s)" % tuned["source"]
        cells = [row["dtype"], str(row["d"]), "yes" if row["causal"] else "no", str(row["N"]),
                 "%d×%d" % (row["B"], row["H"]),
                 cell(row, "flashjit-tuned"), config,
                 cell(row, "flashjit-default"), default.get("config", "-"),
                 cell(row, "torch-flash"), cell(row, "cudnn"),
                 ratio_cell(row, "flashjit-tuned", "torch-flash"),
                 ratio_cell(row, "flashjit-tuned", "cudnn"),
                 ratio_cell(row, "flashjit-tuned", "flashjit-default")]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    lines.append("TFLOP/s, forward; ratios > 1: flashjit faster.")
    lines.append("")
    for entry in summary["ratios"]:
        parts = ["%s %s (%d shapes)" % (dtype, fmt(v["geomean"], 3), v["shapes"])
                 for dtype, v in entry["by_dtype"].items()]
        text = "- geo-mean %s: **%s** over %d shapes" % (
            entry["title"], fmt(entry["overall"]["geomean"], 3), entry["overall"]["shapes"])
        if len(entry["by_dtype"]) > 1:
            text += " (" + "; ".join(parts) + ")"
        if entry.get("worst"):
            text += "; worst %s at %s, best %s at %s" % (
                fmt(entry["worst"]["ratio"], 2), entry["worst"]["shape"],
                fmt(entry["best"]["ratio"], 2), entry["best"]["shape"])
        lines.append(text)
    lines.append("- geo-mean TFLOP/s: " + ", ".join(
        "%s %s" % (IMPLS[impl], fmt(v["geomean"])) for impl, v in summary["tflops"].items()))
    problems = []
    for row in rows:
        for impl, result in row.get("results", {}).items():
            if result.get("error"):
                problems.append("%s %s: %s" % (IMPLS.get(impl, impl), shape_label(row),
                                               result["error"]))
            elif result.get("wrong"):
                problems.append("%s %s: WRONG (relative error %s)"
                                % (IMPLS.get(impl, impl), shape_label(row),
                                   fmt(result.get("rel_error"), 4)))
    if problems:
        lines.append("- problems (%d):" % len(problems))
        lines.extend("  - " + p for p in problems[:30])
    lines.append("")
    for title, path in plots:
        lines.append("![%s](%s)" % (title, path))
        lines.append("")
    return "\n".join(lines)


def _nice_ceiling(value):
    if value <= 0:
        return 1.0
    magnitude = 10 ** math.floor(math.log10(value))
    for step in (1, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10):
        if step * magnitude >= value:
            return step * magnitude
    return 10 * magnitude


def _escape(text):
    return (str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
            .replace('"', "&quot;"))


def svg_plot(rows, title, impls=tuple(IMPLS)):
    """TFLOP/s vs seqlen (log2 axis): one panel per (head dim, causal), one polyline per
    implementation. Plain SVG 1.1 text."""
    head_dims = sorted({row["d"] for row in rows})
    causals = sorted({row["causal"] for row in rows})
    seqlens = sorted({row["N"] for row in rows})
    values = [tflops_of(row, impl) for row in rows for impl in impls]
    y_max = _nice_ceiling(max([v for v in values if v] or [1.0]) * 1.05)
    panel_w, panel_h = 300, 220
    margin_l, margin_t, gap_x, gap_y = 60, 60, 50, 70
    legend_h = 30
    width = margin_l + len(head_dims) * (panel_w + gap_x)
    height = margin_t + len(causals) * (panel_h + gap_y) + legend_h
    x_lo, x_hi = math.log2(seqlens[0]), math.log2(seqlens[-1])
    if x_hi == x_lo:
        x_lo, x_hi = x_lo - 1, x_hi + 1

    out = ['<?xml version="1.0" encoding="UTF-8"?>',
           '<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" '
           'viewBox="0 0 %d %d" font-family="sans-serif" font-size="11">'
           % (width, height, width, height),
           '<rect width="100%" height="100%" fill="white"/>',
           '<text x="%d" y="22" font-size="15" font-weight="bold">%s</text>'
           % (margin_l, _escape(title))]
    # Legend.
    x = margin_l
    for impl in impls:
        out.append('<line x1="%d" y1="38" x2="%d" y2="38" stroke="%s" stroke-width="2.5"/>'
                   % (x, x + 24, COLORS.get(impl, "black")))
        out.append('<text x="%d" y="42">%s</text>' % (x + 30, _escape(IMPLS.get(impl, impl))))
        x += 40 + 7 * len(IMPLS.get(impl, impl))
    for ci, causal in enumerate(causals):
        for di, d in enumerate(head_dims):
            x0 = margin_l + di * (panel_w + gap_x)
            y0 = margin_t + legend_h + ci * (panel_h + gap_y)

            def px(n, x0=x0):
                return x0 + (math.log2(n) - x_lo) / (x_hi - x_lo) * panel_w

            def py(v, y0=y0):
                return y0 + panel_h - v / y_max * panel_h

            out.append('<g class="panel" data-d="%d" data-causal="%s">' % (d, str(causal).lower()))
            out.append('<text x="%.1f" y="%d" font-size="13" text-anchor="middle">d = %d, %s</text>'
                       % (x0 + panel_w / 2, y0 - 8, d, "causal" if causal else "non-causal"))
            out.append('<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="#444"/>'
                       % (x0, y0, panel_w, panel_h))
            for k in range(6):
                v = y_max * k / 5
                y = py(v)
                out.append('<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#ddd"/>'
                           % (x0, y, x0 + panel_w, y))
                out.append('<text x="%d" y="%.1f" text-anchor="end">%s</text>'
                           % (x0 - 4, y + 4, fmt(v, 0)))
            for n in seqlens:
                x = px(n)
                out.append('<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#eee"/>'
                           % (x, y0, x, y0 + panel_h))
                label = "%dk" % (n // 1024) if n >= 1024 and n % 1024 == 0 else str(n)
                out.append('<text x="%.1f" y="%d" text-anchor="middle">%s</text>'
                           % (x, y0 + panel_h + 14, label))
            out.append('<text x="%.1f" y="%d" text-anchor="middle">seqlen</text>'
                       % (x0 + panel_w / 2, y0 + panel_h + 30))
            if di == 0:
                out.append('<text x="%d" y="%.1f" text-anchor="middle" '
                           'transform="rotate(-90 %d %.1f)">TFLOP/s</text>'
                           % (x0 - 40, y0 + panel_h / 2, x0 - 40, y0 + panel_h / 2))
            for impl in impls:
                points = []
                for row in sorted((r for r in rows if r["d"] == d and r["causal"] == causal),
                                  key=lambda r: r["N"]):
                    v = tflops_of(row, impl)
                    if v:
                        points.append((px(row["N"]), py(v)))
                if not points:
                    continue
                color = COLORS.get(impl, "black")
                out.append('<polyline class="series" data-impl="%s" fill="none" stroke="%s" '
                           'stroke-width="2" points="%s"/>'
                           % (impl, color, " ".join("%.1f,%.1f" % p for p in points)))
                for x, y in points:
                    out.append('<circle cx="%.1f" cy="%.1f" r="2.5" fill="%s"/>' % (x, y, color))
            out.append("</g>")
    out.append("</svg>")
    return "\n".join(out) + "\n"


def png_plot(rows, title, path, impls=tuple(IMPLS)):
    """The same figure with matplotlib; returns False when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    head_dims = sorted({row["d"] for row in rows})
    causals = sorted({row["causal"] for row in rows})
    fig, axes = plt.subplots(len(causals), len(head_dims), squeeze=False,
                             figsize=(4 * len(head_dims), 3.2 * len(causals)), sharey=True)
    for ci, causal in enumerate(causals):
        for di, d in enumerate(head_dims):
            ax = axes[ci][di]
            for impl in impls:
                pts = [(row["N"], tflops_of(row, impl)) for row in rows
                       if row["d"] == d and row["causal"] == causal]
                pts = sorted(p for p in pts if p[1])
                if pts:
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o",
                            color=COLORS.get(impl), label=IMPLS.get(impl, impl))
            ax.set_xscale("log", base=2)
            ax.set_title("d = %d, %s" % (d, "causal" if causal else "non-causal"))
            ax.set_xlabel("seqlen")
            ax.grid(True, alpha=0.3)
            if di == 0:
                ax.set_ylabel("TFLOP/s")
    axes[0][0].legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def write_outputs(out_dir, name, meta, rows, png=False):
    """Writes <name>.json, <name>-<dtype>.svg (and .png), <name>.md; returns the paths."""
    os.makedirs(out_dir, exist_ok=True)
    summary = summarize(rows)
    paths = {}
    plots = []
    for dtype in sorted({row["dtype"] for row in rows}):
        subset = [row for row in rows if row["dtype"] == dtype]
        title = "%s forward, %s — %s, commit %s" % (dtype, meta.get("device", "?"),
                                                    meta.get("date", "?"), meta.get("commit", "?"))
        svg_path = os.path.join(out_dir, "%s-%s.svg" % (name, dtype))
        with open(svg_path, "w") as f:
            f.write(svg_plot(subset, title))
        paths["svg-" + dtype] = svg_path
        # Links relative to docs/ (where PERFORMANCE.md is), assuming out_dir is docs/perf.
        plots.append(("%s TFLOP/s vs seqlen" % dtype, "perf/" + os.path.basename(svg_path)))
        if png:
            png_path = os.path.join(out_dir, "%s-%s.png" % (name, dtype))
            if png_plot(subset, title, png_path):
                paths["png-" + dtype] = png_path
    json_path = os.path.join(out_dir, name + ".json")
    with open(json_path, "w") as f:
        json.dump({"meta": meta, "rows": rows, "summary": summary}, f, indent=1)
    paths["json"] = json_path
    md_path = os.path.join(out_dir, name + ".md")
    with open(md_path, "w") as f:
        f.write(markdown(meta, rows, summary, plots))
    paths["md"] = md_path
    return paths, summary


def slug(text):
    out = "".join(c.lower() if c.isalnum() else "-" for c in text)
    while "--" in out:
        out = out.replace("--", "-")
    return out.strip("-") or "device"


# --- the GPU run ----------------------------------------------------------------------------------

def parse_args(argv):
    parser = argparse.ArgumentParser(
        description="flashjit (tuned, default) vs torch SDPA flash and cuDNN on one GPU.")
    parser.add_argument("--quick", action="store_true",
                        help="d 64,128 x N 1024,4096,16384, bf16, few samples: a smoke test")
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
                        help="first tune the grid's problems the DB lacks (flashjit.tune)")
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
        "timing": ("CUDA events around batches of back-to-back calls (~%g ms each), "
                   "implementations interleaved round-robin, inputs rotated over >= 2x L2, "
                   "median of >= %d samples and >= %g ms per implementation and shape"
                   % (args.batch_ms, args.min_samples, args.min_time_ms)),
        "argv": sys.argv[1:],
    }
    name = args.name or "%s-%s" % (slug(props.name), meta["date"])
    out_dir = args.out_dir or os.path.join(repo, "docs", "perf")
    print("# %s (%d SMs), torch %s, cuDNN %s, flashjit %s, commit %s"
          % (props.name, props.multi_processor_count, meta["torch"], meta["cudnn"],
             meta["flashjit"], meta["commit"]), flush=True)

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
        print("# tuning the grid's problems the DB lacks (flashjit.tune)", flush=True)
        start = time.time()
        flashjit.tune(head_dims=args.head_dims, dtypes=args.dtypes, seqlens=args.seqlens,
                      causal={"both": "both", "on": True, "off": False}[args.causal],
                      tokens=args.tokens, hidden=args.hidden)
        print("# tuned in %.0f s" % (time.time() - start), flush=True)

    l2 = getattr(props, "L2_cache_size", 50 * 2 ** 20) or 50 * 2 ** 20
    backends = {"torch-flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}
    rows = []
    status = 0
    header = "%-6s %4s %6s %6s  " % ("dtype", "d", "causal", "N") + "  ".join(
        "%16s" % impl for impl in args.impls)
    print(header, flush=True)
    for shape in shapes:
        row = dict(shape)
        row["results"] = {}
        dtype = getattr(torch, DTYPES[shape["dtype"]])
        b, h, n, d, causal = shape["B"], shape["H"], shape["N"], shape["d"], shape["causal"]
        set_bytes = 3 * b * n * h * d * 2
        sets = max(2, math.ceil(2 * l2 / set_bytes))
        try:
            ours = [[torch.randn(b, n, h, d, device="cuda", dtype=dtype) for _ in range(3)]
                    for _ in range(sets)]
            if args.sdpa_input == "views":
                theirs = [[x.transpose(1, 2) for x in s] for s in ours]
            else:
                theirs = [[x.transpose(1, 2).contiguous() for x in s] for s in ours]
        except torch.cuda.OutOfMemoryError as error:
            row["results"] = {impl: {"error": "out of memory: %s" % str(error)[:100]}
                              for impl in args.impls}
            rows.append(row)
            status = 1
            continue

        def flashjit_call(config):
            return lambda i: flashjit.attention(*ours[i], causal=causal, config=config)

        def sdpa_call(i):
            return F.scaled_dot_product_attention(*theirs[i], is_causal=causal)

        impls = []
        for impl in args.impls:
            if impl == "flashjit-tuned":
                impls.append(Impl(impl, flashjit_call(None)))
            elif impl == "flashjit-default":
                impls.append(Impl(impl, flashjit_call("default")))
            else:
                backend = backends[impl]
                impls.append(Impl(impl, sdpa_call,
                                  context=lambda choice=backend: sdpa_kernel([choice])))

        # Verification: each flashjit output against SDPA's (flash, else cuDNN) on set 0.
        checks = {}
        if not args.no_verify:
            reference = None
            for impl in ("torch-flash", "cudnn"):
                try:
                    with sdpa_kernel([backends[impl]]):
                        reference = F.scaled_dot_product_attention(
                            *theirs[0], is_causal=causal).transpose(1, 2)
                    break
                except Exception:  # this backend cannot run the shape: try the next
                    reference = None
            for impl, config in (("flashjit-tuned", None), ("flashjit-default", "default")):
                if impl not in args.impls or reference is None:
                    continue
                try:
                    out = flashjit.attention(*ours[0], causal=causal, config=config)
                    checks[impl] = relative_error(torch, out, reference)
                    out = None
                except Exception as error:
                    checks[impl] = "%s: %s" % (type(error).__name__, str(error)[:200])
            reference = None

        try:
            row["results"] = measure(impls, timer, sets, min_samples=args.min_samples,
                                     min_time_ms=args.min_time_ms, batch_ms=args.batch_ms)
        except Exception as error:  # e.g. out of memory in the middle of a shape
            message = "%s: %s" % (type(error).__name__, str(error)[:200])
            row["results"] = {impl: {"error": message} for impl in args.impls}
            status = 1
            torch.cuda.synchronize()
        for impl, config in (("flashjit-tuned", None), ("flashjit-default", "default")):
            result = row["results"].get(impl)
            if result is None:
                continue
            try:
                chosen = flashjit.config_for(*ours[0], causal=causal, config=config)
                result["config"], result["source"] = chosen["config"], chosen["source"]
            except Exception as error:
                result.setdefault("error", str(error)[:200])
            check = checks.get(impl)
            if isinstance(check, float):
                result["rel_error"] = check
                if not check < MAX_REL_ERROR:
                    result["wrong"] = True
                    status = 1
            elif isinstance(check, str):
                result["error"] = check
                status = 1
        for impl in ("flashjit-tuned", "flashjit-default"):
            if row["results"].get(impl, {}).get("error"):
                status = 1
        rows.append(row)
        cells = []
        for impl in args.impls:
            result = row["results"].get(impl, {})
            if result.get("error"):
                cells.append("%16s" % "error")
            elif result.get("wrong"):
                cells.append("%16s" % "WRONG")
            else:
                cells.append("%9s TFLOP/s" % fmt(tflops_of(row, impl)))
        print("%-6s %4d %6s %6d  " % (shape["dtype"], d, "yes" if causal else "no", n)
              + "  ".join(cells), flush=True)
        ours = theirs = impls = None  # free this shape's tensors before the next one's
        torch.cuda.empty_cache()

    paths, summary = write_outputs(out_dir, name, meta, rows, png=args.png)
    print()
    for entry in summary["ratios"]:
        print("geo-mean %s: %s over %d shapes" % (entry["title"],
                                                   fmt(entry["overall"]["geomean"], 3),
                                                   entry["overall"]["shapes"]))
    for key, path in paths.items():
        print("wrote %s" % path)
    for impl in args.impls:
        if not any(tflops_of(row, impl) for row in rows):
            print("side_by_side.py: %s produced no timing at all" % impl, file=sys.stderr)
            status = 1
    return status


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
