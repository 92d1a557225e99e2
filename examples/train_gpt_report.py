#!/usr/bin/env python3
"""The report of examples/train_gpt.py --attn both runs: one SVG of the loss curves (a panel per
run: torch SDPA and flashjit on the same axes, and their relative difference per step) and a
markdown table of the losses, their agreement and the throughput, for docs/PERFORMANCE.md.

    python3 examples/train_gpt_report.py RUN.json [RUN.json ...] --svg PATH [--markdown PATH]
                                         [--svg-link RELATIVE_PATH]

Pure Python (no torch); the SVG is drawn by hand with bench/side_by_side_report.py's helpers.
"""
import argparse
import json
import math
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "bench"))
from side_by_side_report import _escape, _nice_ceiling  # noqa: E402

SERIES = (("sdpa", "torch SDPA", "#1f77b4"), ("flashjit", "flashjit.sdpa", "#d62728"))


def title_of(report):
    m = report["meta"]
    return "%s: %s, %s%s" % (m["device_name"], m["preset"], m["dtype"],
                             ", torch.compile" if m["compile"] else "")


def svg_loss_curves(reports):
    """Panels side by side: loss per step (both runs, same axes), then under each its relative
    difference |flashjit - sdpa| / sdpa in percent."""
    panel_w, panel_h, diff_h = 320, 220, 70
    margin_l, margin_t, gap_x = 60, 70, 60
    width = max(margin_l + len(reports) * (panel_w + gap_x), 720)  # the title fits
    height = margin_t + panel_h + 40 + diff_h + 50
    out = ['<?xml version="1.0" encoding="UTF-8"?>',
           '<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" '
           'viewBox="0 0 %d %d" font-family="sans-serif" font-size="11">'
           % (width, height, width, height),
           '<rect width="100%" height="100%" fill="white"/>',
           '<text x="%d" y="22" font-size="15" font-weight="bold">examples/train_gpt.py: '
           'training loss, torch SDPA vs flashjit.sdpa (same seed, same batches)</text>'
           % margin_l]
    x = margin_l
    for _, label, color in SERIES:
        out.append('<line x1="%d" y1="40" x2="%d" y2="40" stroke="%s" stroke-width="2.5"/>'
                   % (x, x + 24, color))
        out.append('<text x="%d" y="44">%s</text>' % (x + 30, _escape(label)))
        x += 50 + 7 * len(label)
    for index, report in enumerate(reports):
        runs = report["runs"]
        steps = max(len(runs[name]["loss"]) for name, _, _ in SERIES)
        losses = [v for name, _, _ in SERIES for v in runs[name]["loss"]]
        y_lo = math.floor(min(losses) * 2) / 2
        y_hi = _nice_ceiling(max(losses))
        x0 = margin_l + index * (panel_w + gap_x)
        y0 = margin_t

        def px(step, x0=x0):
            return x0 + (step - 1) / max(1, steps - 1) * panel_w

        def py(value, y0=y0, y_lo=y_lo, y_hi=y_hi):
            return y0 + panel_h - (value - y_lo) / (y_hi - y_lo) * panel_h

        out.append('<g class="panel" data-run="%d">' % index)
        out.append('<text x="%.1f" y="%d" font-size="12" text-anchor="middle">%s</text>'
                   % (x0 + panel_w / 2, y0 - 8, _escape(title_of(report))))
        out.append('<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="#444"/>'
                   % (x0, y0, panel_w, panel_h))
        for k in range(6):
            value = y_lo + (y_hi - y_lo) * k / 5
            y = py(value)
            out.append('<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#ddd"/>'
                       % (x0, y, x0 + panel_w, y))
            out.append('<text x="%d" y="%.1f" text-anchor="end">%.2f</text>' % (x0 - 4, y + 4,
                                                                               value))
        if index == 0:
            out.append('<text x="%d" y="%.1f" text-anchor="middle" transform="rotate(-90 %d '
                       '%.1f)">loss</text>' % (x0 - 42, y0 + panel_h / 2, x0 - 42,
                                               y0 + panel_h / 2))
        for name, _, color in SERIES:
            points = " ".join("%.1f,%.1f" % (px(i + 1), py(v))
                              for i, v in enumerate(runs[name]["loss"]))
            out.append('<polyline class="series" data-impl="%s" fill="none" stroke="%s" '
                       'stroke-width="1.5" stroke-opacity="0.8" points="%s"/>'
                       % (name, color, points))
        # The relative difference, percent, under the panel.
        d0 = y0 + panel_h + 40
        diffs = [abs(a - b) / b * 100 for a, b in zip(runs["flashjit"]["loss"],
                                                       runs["sdpa"]["loss"])]
        d_hi = _nice_ceiling(max(diffs + [1e-3]))
        out.append('<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="#444"/>'
                   % (x0, d0, panel_w, diff_h))
        out.append('<text x="%d" y="%d" text-anchor="end">%.3g%%</text>' % (x0 - 4, d0 + 4, d_hi))
        out.append('<text x="%d" y="%d" text-anchor="end">0</text>' % (x0 - 4, d0 + diff_h + 4))
        out.append('<text x="%.1f" y="%d" text-anchor="middle">|flashjit - SDPA| / SDPA per step'
                   '</text>' % (x0 + panel_w / 2, d0 - 6))
        points = " ".join("%.1f,%.1f" % (px(i + 1), d0 + diff_h - v / d_hi * diff_h)
                          for i, v in enumerate(diffs))
        out.append('<polyline class="difference" fill="none" stroke="#555" stroke-width="1" '
                   'points="%s"/>' % points)
        for step in sorted({1, steps // 2, steps}):
            out.append('<text x="%.1f" y="%d" text-anchor="middle">%d</text>'
                       % (px(step), d0 + diff_h + 14, step))
        out.append('<text x="%.1f" y="%d" text-anchor="middle">step</text>'
                   % (x0 + panel_w / 2, d0 + diff_h + 30))
        out.append("</g>")
    out.append("</svg>")
    return "\n".join(out) + "\n"


def markdown(reports, svg_link=None):
    lines = ["| run | steps | loss SDPA | loss flashjit | apart | val SDPA | val flashjit | "
             "max apart (any step) | tokens/s SDPA | tokens/s flashjit | flashjit / SDPA |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for report in reports:
        m, runs, agreement = report["meta"], report["runs"], report["agreement"]
        mine, theirs = runs["flashjit"], runs["sdpa"]
        lines.append("| %s (%d layers, d_model %d, context %d, batch %d) | %d | %.4f | %.4f | "
                     "%.2g%% | %.4f | %.4f | %.2g%% | %.0f | %.0f | %.2fx |"
                     % (title_of(report), m["layers"], m["d_model"], m["context"], m["batch"],
                        m["steps"], theirs["final_loss"], mine["final_loss"],
                        100 * agreement["final_loss"], theirs["val_loss"], mine["val_loss"],
                        100 * agreement["max_step_difference"], theirs["tokens_per_s"],
                        mine["tokens_per_s"], mine["tokens_per_s"] / theirs["tokens_per_s"]))
    lines.append("")
    lines.append("loss: the mean training loss of the last 10 steps; val: the validation split's "
                 "loss after training; tokens/s after the first 10 steps (compilation and "
                 "warm-up excluded).")
    if svg_link:
        lines += ["", "![train_gpt loss curves](%s)" % svg_link]
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", help="train_gpt.py --attn both --json outputs")
    parser.add_argument("--svg", required=True)
    parser.add_argument("--markdown", default=None)
    parser.add_argument("--svg-link", default=None, help="the SVG's path as the markdown links it")
    args = parser.parse_args(argv)
    reports = []
    for path in args.runs:
        with open(path) as f:
            report = json.load(f)
        if set(report["runs"]) != {"sdpa", "flashjit"}:
            sys.exit(f"{path}: not a --attn both run (runs: {sorted(report['runs'])})")
        reports.append(report)
    with open(args.svg, "w") as f:
        f.write(svg_loss_curves(reports))
    text = markdown(reports, args.svg_link or os.path.basename(args.svg))
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(text)
    print(text, end="")


if __name__ == "__main__":
    main()
