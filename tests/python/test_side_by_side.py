"""bench/side_by_side.py without a GPU: the grid, the timing loop (with a fake device clock), the
summary, the markdown table and the hand-drawn SVG plot, on fake timings."""
import importlib.util
import math
import os
import xml.etree.ElementTree as ET

import pytest

from conftest import REPO_ROOT


@pytest.fixture(scope="module")
def bench():
    path = os.path.join(REPO_ROOT, "bench", "side_by_side.py")
    spec = importlib.util.spec_from_file_location("side_by_side", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # imports no torch
    return module


def test_standard_grid(bench):
    shapes = bench.make_grid(["bf16", "fp16"], [64, 128, 256], [False, True],
                             [512, 1024, 2048, 4096, 8192, 16384])
    assert len(shapes) == 72
    first = shapes[0]
    assert (first["dtype"], first["d"], first["causal"], first["N"]) == ("bf16", 64, False, 512)
    assert (first["B"], first["H"]) == (32, 32)
    assert first["flops"] == 4.0 * 32 * 32 * 512 * 512 * 64
    causal = next(s for s in shapes if s["causal"] and s["d"] == 128 and s["N"] == 16384)
    assert (causal["B"], causal["H"]) == (1, 16)
    assert causal["flops"] == 4.0 * 16 * 16384 * 16384 * 128 / 2


class FakeDevice:
    """A device clock: each call advances it by the implementation's cost; events read it."""

    def __init__(self):
        self.clock = 0.0
        self.syncs = 0

    def start(self):
        return self.clock

    stop = start

    def elapsed_ms(self, start, stop):
        return stop - start

    def sync(self):
        self.syncs += 1


def test_measure_times_alike_and_reports_failures(bench):
    device = FakeDevice()
    calls = {"fast": [], "slow": []}

    def call(name, cost):
        def run(i):
            calls[name].append(i)
            # A little noise that the median must see through: every 7th call is 3x slower.
            device.clock += cost * (3 if len(calls[name]) % 7 == 0 else 1)
        return run

    def broken(i):
        raise RuntimeError("backend refused the shape")

    entered = []

    class Context:
        def __enter__(self):
            entered.append(1)

        def __exit__(self, *exc):
            return False

    impls = [bench.Impl("fast", call("fast", 0.25)), bench.Impl("slow", call("slow", 2.0),
                                                                  context=Context),
             bench.Impl("broken", broken)]
    results = bench.measure(impls, device, sets=3, min_samples=10, min_time_ms=60, batch_ms=4)
    assert results["broken"]["error"] == "RuntimeError: backend refused the shape"
    fast, slow = results["fast"], results["slow"]
    assert fast["batch"] == 16 and slow["batch"] == 2
    for result, cost in ((fast, 0.25), (slow, 2.0)):
        # >= 60 ms of device time, noise included (the mean call costs 9/7 of `cost`).
        assert result["samples"] >= 10
        assert result["samples"] * result["batch"] * cost * 9 / 7 >= 60
        assert cost <= result["ms"] < 1.4 * cost  # the median, not the mean of the noisy calls
        assert result["min_ms"] <= result["ms"] <= result["max_ms"]
        assert result["host_us"] > 0
    assert set(calls["fast"]) == {0, 1, 2}  # inputs rotate over every set
    assert entered  # the SDPA-style context wraps the batches


def fake_rows(bench):
    rows = []
    for shape in bench.make_grid(["bf16", "fp16"], [64, 128], [False, True], [512, 1024, 2048]):
        row = dict(shape)
        base = 100.0 + shape["N"] / 100 + shape["d"]  # TFLOP/s of torch flash
        speeds = {"torch-flash": base, "cudnn": base * 1.6,
                  "flashjit-tuned": base * (1.1 if shape["dtype"] == "bf16" else 0.9),
                  "flashjit-default": base}
        row["results"] = {impl: {"ms": shape["flops"] / (tf * 1e12) * 1e3}
                          for impl, tf in speeds.items()}
        row["results"]["flashjit-tuned"].update(config="m128n64w4s2", source="exact")
        row["results"]["flashjit-default"].update(config="m128n64w8s2", source="default")
        rows.append(row)
    return rows


def test_summary_geomeans_and_worst(bench):
    rows = fake_rows(bench)
    rows[0]["results"]["cudnn"] = {"error": "RuntimeError: no kernel"}
    summary = bench.summarize(rows)
    by_title = {entry["title"]: entry for entry in summary["ratios"]}
    flash = by_title["flashjit tuned / torch flash"]
    assert flash["by_dtype"]["bf16"]["geomean"] == pytest.approx(1.1)
    assert flash["by_dtype"]["fp16"]["geomean"] == pytest.approx(0.9)
    assert flash["overall"]["geomean"] == pytest.approx(math.sqrt(1.1 * 0.9))
    assert flash["overall"]["shapes"] == 24
    assert flash["worst"]["ratio"] == pytest.approx(0.9)
    assert flash["worst"]["shape"].startswith("fp16")
    cudnn = by_title["flashjit tuned / cuDNN"]
    assert cudnn["overall"]["shapes"] == 23  # the failed row is left out
    assert by_title["flashjit tuned / default"]["by_dtype"]["bf16"]["geomean"] == pytest.approx(1.1)


def test_markdown_table(bench):
    rows = fake_rows(bench)
    rows[1]["results"]["flashjit-default"]["wrong"] = True
    rows[1]["results"]["flashjit-default"]["rel_error"] = 0.5
    meta = {"device": "NVIDIA H100 80GB HBM3", "sm_count": 132, "date": "2026-11-23",
            "commit": "abc1234", "torch": "2.11.0", "cudnn": "91900"}
    text = bench.markdown(meta, rows, bench.summarize(rows),
                          [("bf16 TFLOP/s vs seqlen", "perf/x-bf16.svg")])
    lines = text.splitlines()
    assert lines[0] == ("## 2026-11-23 — side by side (bench/side_by_side.py), NVIDIA H100 80GB "
                        "HBM3, commit abc1234")
    table = [line for line in lines if line.startswith("| bf16 ") or line.startswith("| fp16 ")]
    assert len(table) == 24
    first = table[0].split(" | ")
    assert first[1:5] == ["64", "no", "512", "32×32"]
    assert "m128n64w4s2 (exact)" in table[0]
    assert "WRONG" in table[1]
    assert any(line.startswith("- geo-mean flashjit tuned / torch flash: **0.995**")
               for line in lines)
    assert "- problems (1):" in lines
    assert "![bf16 TFLOP/s vs seqlen](perf/x-bf16.svg)" in lines


def test_svg_plot_is_valid_and_complete(bench):
    rows = [row for row in fake_rows(bench) if row["dtype"] == "bf16"]
    svg = bench.svg_plot(rows, "bf16 <test> & co")
    root = ET.fromstring(svg.split("\n", 1)[1])  # after the XML declaration
    ns = "{http://www.w3.org/2000/svg}"
    panels = [g for g in root.iter(ns + "g") if g.get("class") == "panel"]
    assert len(panels) == 4  # d 64, 128 x causal off, on
    for panel in panels:
        series = [p for p in panel.iter(ns + "polyline")]
        assert sorted(p.get("data-impl") for p in series) == sorted(bench.IMPLS)
        for polyline in series:
            points = [tuple(map(float, p.split(","))) for p in polyline.get("points").split()]
            assert len(points) == 3
            xs = [x for x, _ in points]
            assert xs == sorted(xs)  # seqlen increases to the right
    # Faster is higher: cuDNN (1.6x) above torch flash in every panel.
    for panel in panels:
        ys = {p.get("data-impl"): [float(q.split(",")[1]) for q in p.get("points").split()]
              for p in panel.iter(ns + "polyline")}
        assert all(c < f for c, f in zip(ys["cudnn"], ys["torch-flash"]))


def test_write_outputs(bench, tmp_path):
    rows = fake_rows(bench)
    meta = {"device": "Fake GPU", "date": "2026-11-23", "commit": "abc1234"}
    paths, summary = bench.write_outputs(str(tmp_path), "fake-gpu-2026-11-23", meta, rows)
    assert sorted(os.path.basename(p) for p in paths.values()) == [
        "fake-gpu-2026-11-23-bf16.svg", "fake-gpu-2026-11-23-fp16.svg",
        "fake-gpu-2026-11-23.json", "fake-gpu-2026-11-23.md"]
    import json

    with open(paths["json"]) as f:
        saved = json.load(f)
    assert saved["meta"] == meta and len(saved["rows"]) == 24
    with open(paths["md"]) as f:
        assert "(perf/fake-gpu-2026-11-23-fp16.svg)" in f.read()


def test_arguments(bench):
    quick = bench.parse_args(["--quick"])
    assert quick.dtypes == ["bf16"] and quick.head_dims == [64, 128]
    assert quick.seqlens == [1024, 4096, 16384] and quick.min_samples == 5
    full = bench.parse_args([])
    assert full.dtypes == ["bf16", "fp16"] and full.causals == [False, True]
    assert full.impls == list(bench.IMPLS)
    for bad in (["--dtypes", "fp32"], ["--impls", "xformers"], ["--seqlens", "0"]):
        with pytest.raises(SystemExit):
            bench.parse_args(bad)
    assert bench.slug("NVIDIA H100 80GB HBM3") == "nvidia-h100-80gb-hbm3"
