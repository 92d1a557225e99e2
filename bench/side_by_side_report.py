"""The report of bench/side_by_side.py: per-pass summaries (same-run ratios, geo-means, worst and
best shapes), the markdown section for docs/PERFORMANCE.md, hand-drawn SVG plots (and PNG with
matplotlib), and the files written into the output folder. Pure Python (no torch): the tests run
it on fake rows (tests/python/test_side_by_side.py).

A row is one shape and one pass: {"dtype", "d", "causal", "N", "B", "H", "pass", "flops",
"results": {impl: {"ms", ...} or {"error"} or {"wrong": True, ...}}}; "pass" is "fwd" (absent in
rows of older runs), "bwd" or "fwd+bwd", and "flops" counts that pass's work by the
FlashAttention convention (backward 2.5x, forward + backward 3.5x the forward's).
"""
import json
import math
import os
from collections import OrderedDict

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
# The passes a run can measure, in report order: (title, file tag, FLOPs as a multiple of the
# forward's).
PASSES = OrderedDict([
    ("fwd", ("forward", "", 1.0)),
    ("bwd", ("backward", "bwd", 2.5)),
    ("fwd+bwd", ("forward + backward", "fwdbwd", 3.5)),
])


def pass_of(row):
    return row.get("pass", "fwd")


def by_pass(rows):
    """OrderedDict pass -> its rows, in PASSES order (passes without rows left out)."""
    grouped = OrderedDict((p, []) for p in PASSES)
    for row in rows:
        grouped.setdefault(pass_of(row), []).append(row)
    return OrderedDict((p, r) for p, r in grouped.items() if r)


def shape_label(row):
    label = "%s d%d %s N%d" % (row["dtype"], row["d"], "causal" if row["causal"] else "full",
                               row["N"])
    return label if pass_of(row) == "fwd" else "%s %s" % (pass_of(row), label)


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


def summarize_by_pass(rows):
    """OrderedDict pass -> summarize(that pass's rows): ratios are taken within a pass only."""
    return OrderedDict((p, summarize(subset)) for p, subset in by_pass(rows).items())


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


def _table(rows):
    header = ["dtype", "d", "causal", "N", "B×H", "flashjit tuned", "config (source)",
              "flashjit default", "default config", "torch flash", "cuDNN", "tuned / flash",
              "tuned / cuDNN", "tuned / default"]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
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
    return lines


def _geomean_lines(summary):
    lines = []
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
    return lines


def markdown(meta, rows, summary=None, plots=()):
    """The section for docs/PERFORMANCE.md: heading, device/date/commit, then for each pass (with
    a subheading when the run has more than the forward) the table, the geo-mean ratios with the
    worst and best shapes; the problems; the plots. summary: summarize(rows) of a one-pass run,
    or summarize_by_pass(rows); None computes it."""
    groups = by_pass(rows)
    if summary is None:
        summaries = summarize_by_pass(rows)
    elif "ratios" in summary:
        summaries = OrderedDict((p, summary) for p in groups)
    else:
        summaries = summary
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
    titled = list(groups) != ["fwd"]
    for p, subset in groups.items():
        title, _, factor = PASSES.get(p, (p, p, 1.0))
        if titled:
            lines.append("")
            lines.append("### %s" % title[0].upper() + title[1:])
        lines.append("")
        lines.extend(_table(subset))
        lines.append("")
        counted = "" if factor == 1.0 else " (FLOPs: %gx the forward's)" % factor
        lines.append("TFLOP/s, %s%s; ratios > 1: flashjit faster." % (title, counted))
        lines.append("")
        lines.extend(_geomean_lines(summaries[p]))
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
    """Writes <name>.json (meta, rows, the summaries by pass), per pass and dtype an SVG plot
    (<name>-<dtype>.svg for the forward, <name>-bwd-<dtype>.svg, <name>-fwdbwd-<dtype>.svg; and
    .png with png=True and matplotlib), and <name>.md. Returns (paths, summaries by pass)."""
    os.makedirs(out_dir, exist_ok=True)
    summaries = summarize_by_pass(rows)
    paths = {}
    plots = []
    for p, pass_rows in by_pass(rows).items():
        title_word, tag, _ = PASSES.get(p, (p, p, 1.0))
        for dtype in sorted({row["dtype"] for row in pass_rows}):
            subset = [row for row in pass_rows if row["dtype"] == dtype]
            stem = "%s-%s%s" % (name, tag + "-" if tag else "", dtype)
            key = "%s%s" % (tag + "-" if tag else "", dtype)
            title = "%s %s, %s — %s, commit %s" % (dtype, title_word, meta.get("device", "?"),
                                                    meta.get("date", "?"),
                                                    meta.get("commit", "?"))
            svg_path = os.path.join(out_dir, stem + ".svg")
            with open(svg_path, "w") as f:
                f.write(svg_plot(subset, title))
            paths["svg-" + key] = svg_path
            # Links relative to docs/ (where PERFORMANCE.md is), assuming out_dir is docs/perf.
            plots.append(("%s %s TFLOP/s vs seqlen" % (dtype, title_word),
                          "perf/" + os.path.basename(svg_path)))
            if png:
                png_path = os.path.join(out_dir, stem + ".png")
                if png_plot(subset, title, png_path):
                    paths["png-" + key] = png_path
    json_path = os.path.join(out_dir, name + ".json")
    with open(json_path, "w") as f:
        json.dump({"meta": meta, "rows": rows, "summary": summaries}, f, indent=1)
    paths["json"] = json_path
    md_path = os.path.join(out_dir, name + ".md")
    with open(md_path, "w") as f:
        f.write(markdown(meta, rows, summaries, plots))
    paths["md"] = md_path
    return paths, summaries

def slug(text):
    out = "".join(c.lower() if c.isalnum() else "-" for c in text)
    while "--" in out:
        out = out.replace("--", "-")
    return out.strip("-") or "device"


