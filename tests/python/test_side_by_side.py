"""bench/side_by_side.py without a GPU: the grid, the timing loop (with a fake device clock), the
summary, the markdown table and the hand-drawn SVG plot, on fake timings, for the forward, the
backward and forward + backward; and the per-shape run on the CPU with stand-ins for the GPU
(where torch is installed)."""
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


# --- the backward and forward + backward rows ---------------------------------------------------

def test_passes_and_their_flops(bench):
    assert bench.parse_args([]).passes == ["fwd", "bwd", "fwd+bwd"]
    assert bench.parse_args(["--pass", "fwd"]).passes == ["fwd"]
    assert bench.parse_args(["--pass", "bwd"]).passes == ["bwd", "fwd+bwd"]
    assert bench.parse_args(["--pass", "bwd,fwd"]).passes == ["fwd", "bwd", "fwd+bwd"]
    for bad in (["--pass", "sideways"], ["--pass", ""], ["--pass", "fwd+bwd"]):
        with pytest.raises(SystemExit):
            bench.parse_args(bad)
    (shape,) = bench.make_grid(["bf16"], [128], [True], [4096])
    forward, backward, both = (bench.row_for(shape, p) for p in ("fwd", "bwd", "fwd+bwd"))
    assert forward["flops"] == shape["flops"] == 4.0 * 4 * 16 * 4096 * 4096 * 128 / 2
    assert backward["flops"] == 2.5 * shape["flops"] and both["flops"] == 3.5 * shape["flops"]
    assert (backward["pass"], backward["results"]) == ("bwd", {})
    assert "pass" not in shape  # the shape itself is untouched


def fake_pass_rows(bench):
    """fake_rows for each pass: flashjit tuned 1.1x torch flash forward, 0.8x backward, 0.9x
    forward + backward (bf16 and fp16 alike)."""
    speed = {"fwd": 1.1, "bwd": 0.8, "fwd+bwd": 0.9}
    rows = []
    for shape in bench.make_grid(["bf16", "fp16"], [64, 128], [False, True], [512, 2048]):
        for pass_, factor in speed.items():
            row = bench.row_for(shape, pass_)
            base = 100.0 + shape["N"] / 100 + shape["d"]
            speeds = {"torch-flash": base, "cudnn": base * 1.6, "flashjit-tuned": base * factor,
                      "flashjit-default": base}
            row["results"] = {impl: {"ms": row["flops"] / (tf * 1e12) * 1e3}
                              for impl, tf in speeds.items()}
            row["results"]["flashjit-tuned"].update(config="m64n128w8s2", source="exact")
            rows.append(row)
    rows[5]["results"]["flashjit-tuned"]["ms"] *= 2  # one slow fwd+bwd: the worst shape
    return rows


def test_summaries_are_per_pass(bench):
    rows = fake_pass_rows(bench)
    summaries = bench.summarize_by_pass(rows)
    assert list(summaries) == ["fwd", "bwd", "fwd+bwd"]
    flash = {p: {e["title"]: e for e in s["ratios"]}["flashjit tuned / torch flash"]
             for p, s in summaries.items()}
    assert flash["fwd"]["overall"]["geomean"] == pytest.approx(1.1)
    assert flash["bwd"]["overall"]["geomean"] == pytest.approx(0.8)
    assert flash["bwd"]["overall"]["shapes"] == 16
    assert flash["fwd+bwd"]["worst"]["ratio"] == pytest.approx(0.45)
    assert flash["fwd+bwd"]["worst"]["shape"] == "fwd+bwd bf16 d64 full N2048"
    # TFLOP/s count each pass's FLOPs: the same time per FLOP gives the same rate.
    assert summaries["bwd"]["tflops"]["torch-flash"]["geomean"] == pytest.approx(
        summaries["fwd"]["tflops"]["torch-flash"]["geomean"])


def test_markdown_has_a_section_per_pass(bench):
    rows = fake_pass_rows(bench)
    rows[1]["results"]["flashjit-default"]["wrong"] = True
    rows[1]["results"]["flashjit-default"]["rel_error"] = 0.3
    meta = {"device": "NVIDIA H100 80GB HBM3", "date": "2026-11-23", "commit": "abc1234"}
    lines = bench.markdown(meta, rows).splitlines()
    headings = [line for line in lines if line.startswith("### ")]
    assert headings == ["### Forward", "### Backward", "### Forward + backward"]
    sections = {}
    for line in lines:
        if line.startswith("### "):
            current = line
        elif line.startswith("| bf16 ") or line.startswith("| fp16 "):
            sections.setdefault(current, []).append(line)
    assert [len(v) for v in sections.values()] == [16, 16, 16]
    assert "TFLOP/s, backward (FLOPs: 2.5x the forward's); ratios > 1: flashjit faster." in lines
    assert ("TFLOP/s, forward + backward (FLOPs: 3.5x the forward's); ratios > 1: flashjit "
            "faster.") in lines
    assert any(line.startswith("- geo-mean flashjit tuned / torch flash: **0.800**")
               for line in lines)
    assert "  - flashjit default bwd bf16 d64 full N512: WRONG (relative error 0.3000)" in lines
    # A forward-only run reads as before: no subheadings.
    forward = [row for row in rows if row["pass"] == "fwd"]
    assert not any(line.startswith("### ") for line in bench.markdown(meta, forward).splitlines())


def test_write_outputs_per_pass(bench, tmp_path):
    rows = fake_pass_rows(bench)
    meta = {"device": "Fake GPU", "date": "2026-11-23", "commit": "abc1234"}
    paths, summaries = bench.write_outputs(str(tmp_path), "fake", meta, rows)
    assert sorted(os.path.basename(p) for p in paths.values()) == sorted(
        ["fake-bf16.svg", "fake-fp16.svg", "fake-bwd-bf16.svg", "fake-bwd-fp16.svg",
         "fake-fwdbwd-bf16.svg", "fake-fwdbwd-fp16.svg", "fake.json", "fake.md"])
    assert list(summaries) == ["fwd", "bwd", "fwd+bwd"]
    import json

    with open(paths["json"]) as f:
        saved = json.load(f)
    assert len(saved["rows"]) == 48 and sorted(saved["summary"]) == ["bwd", "fwd", "fwd+bwd"]
    with open(paths["svg-bwd-fp16"]) as f:
        svg = f.read()
    assert "fp16 backward, Fake GPU" in svg
    with open(paths["md"]) as f:
        assert "(perf/fake-fwdbwd-bf16.svg)" in f.read()


class WallTimer:
    """Host wall time, for the CPU stand-in run below."""

    def start(self):
        import time

        return time.perf_counter()

    stop = start

    def elapsed_ms(self, start, stop):
        return (stop - start) * 1e3

    def sync(self):
        pass


class FakeFlashjit:
    """flashjit's calls as the benchmark makes them, computed with torch on the CPU (math SDPA
    through autograd); `wrong_default` corrupts the default config's dq to check that the
    benchmark flags it."""

    def __init__(self, torch, wrong_default=False):
        self.torch = torch
        self.wrong_default = wrong_default
        self.calls = []

        class C:
            @staticmethod
            def gradient_tolerance(dtype):
                return {"bf16": 2e-2, "fp16": 5e-3}[dtype]

        self._C = C

    def _outputs(self, q, k, v, causal):
        torch = self.torch
        q, k, v = (x.detach().float().transpose(1, 2).requires_grad_() for x in (q, k, v))
        o = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
        return (q, k, v), o

    def attention(self, q, k, v, causal=False, config=None, return_lse=False):
        self.calls.append(("fwd", config))
        _, o = self._outputs(q, k, v, causal)
        o = o.transpose(1, 2).detach().to(q.dtype)
        lse = self.torch.zeros(q.shape[0], q.shape[2], q.shape[1])
        return (o, lse) if return_lse else o

    def attention_backward(self, q, k, v, o, lse, do, causal=False, config=None):
        self.calls.append(("bwd", config))
        inputs, out = self._outputs(q, k, v, causal)
        grads = self.torch.autograd.grad(out, inputs, do.float().transpose(1, 2))
        grads = [g.transpose(1, 2).to(q.dtype) for g in grads]
        if self.wrong_default and config == "default":
            grads[0] = grads[0] * 1.5
        return tuple(grads)

    def config_for(self, q, k, v, causal=False, config=None, pass_="fwd"):
        return {"config": ("m64n128w8s2" if pass_ == "bwd" else "m128n64w4s2"),
                "source": "default" if config else "exact"}


@pytest.mark.parametrize("wrong_default,sdpa_input", [(False, "bhsd"), (True, "bhsd"),
                                                      (False, "views")])
def test_shape_run_on_the_cpu_with_stand_ins(bench, wrong_default, sdpa_input):
    """The GPU run's per-shape logic (inputs, the implementations of each pass, the checks of
    flashjit's results against SDPA's, the timing, the configs) on the CPU: torch's math SDPA
    stands in for the flash and cuDNN backends, FakeFlashjit for flashjit."""
    torch = pytest.importorskip("torch")
    from torch.nn.attention import SDPBackend, sdpa_kernel

    fake = FakeFlashjit(torch, wrong_default)
    env = {"torch": torch, "F": torch.nn.functional, "flashjit": fake, "sdpa_kernel": sdpa_kernel,
           "backends": {"torch-flash": SDPBackend.MATH, "cudnn": SDPBackend.MATH},
           "device": "cpu"}
    args = bench.parse_args(["--dtypes", "bf16", "--min-samples", "2", "--min-time-ms", "1",
                             "--batch-ms", "0.5", "--sdpa-input", sdpa_input])
    (shape,) = bench.make_grid(["bf16"], [64], [True], [64], tokens=128, hidden=128)
    run = bench.ShapeRun(env, args, shape, sets=2)
    statuses = {}
    for pass_ in args.passes:
        row = bench.row_for(shape, pass_)
        statuses[pass_] = bench.measure_row(run, pass_, row, WallTimer(), args)
        assert set(row["results"]) == set(bench.IMPLS), pass_
        for impl, result in row["results"].items():
            assert result.get("ms", 0) > 0 and not result.get("error"), (pass_, impl, result)
        tuned = row["results"]["flashjit-tuned"]
        assert tuned["rel_error"] < 1e-2 and not tuned.get("wrong")
        expected = {"fwd": "m128n64w4s2", "bwd": "m64n128w8s2",
                    "fwd+bwd": "m128n64w4s2 + m64n128w8s2"}[pass_]
        assert (tuned["config"], tuned["source"]) == (
            expected, "exact" if pass_ != "fwd+bwd" else "exact/exact")
        default = row["results"]["flashjit-default"]
        assert default.get("wrong", False) == (wrong_default and pass_ != "fwd"), (pass_, default)
    assert statuses == {"fwd": 0, "bwd": int(wrong_default), "fwd+bwd": int(wrong_default)}
    # The backward ran with the tuned selection (config None) and the default.
    assert ("bwd", "default") in fake.calls and ("bwd", None) in fake.calls
