"""examples/train_gpt.py on the CPU, a few steps of the tiny preset with torch SDPA and with
flashjit.sdpa (same seed, same batches): the loss decreases, the two runs' losses agree, the
script's output and JSON say so. Skips without torch or without the CPU backend."""
import importlib.util
import json
import os

import pytest

from conftest import REPO_ROOT, have_module, require_cpu_backward, require_gpu

if not have_module("torch"):
    pytest.skip("torch is not installed", allow_module_level=True)


def load_script(name="train_gpt"):
    path = os.path.join(REPO_ROOT, "examples", name + ".py")
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_train_gpt_tiny_cpu_flashjit_matches_sdpa(tmp_path, capsys):
    require_cpu_backward()
    report = tmp_path / "run.json"
    runs, agreement = load_script().main(
        ["--preset", "tiny", "--steps", "16", "--log-every", "4", "--attn", "both",
         "--eval-batches", "2", "--json", str(report)])
    out = capsys.readouterr()
    for attn in ("sdpa", "flashjit"):
        losses = runs[attn]["loss"]
        assert len(losses) == 16
        # From ln(vocabulary) ~ 4.7 at the start; 16 steps of warm-up and decay take it well down.
        assert sum(losses[-4:]) / 4 < sum(losses[:4]) / 4 - 0.3, losses
        assert runs[attn]["tokens_per_s"] > 0
        assert f"{attn:8}: loss" in out.out
    assert agreement["max_step_difference"] < 1e-3, agreement
    assert "flashjit vs sdpa" in out.out and "16/16" in out.err
    saved = json.loads(report.read_text())
    assert saved["runs"]["flashjit"]["loss"] == runs["flashjit"]["loss"]
    assert saved["meta"]["preset"] == "tiny" and saved["meta"]["dtype"] == "fp32"

    # The report: a panel with both curves and their difference, a table row.
    svg = tmp_path / "curves.svg"
    load_script("train_gpt_report").main([str(report), str(report), "--svg", str(svg)])
    text = svg.read_text()
    assert text.count('class="panel"') == 2 and text.count('data-impl="flashjit"') == 2
    assert text.count('class="difference"') == 2
    assert capsys.readouterr().out.count("| CPU") == 2


def test_train_gpt_rejects_float32_flashjit_on_cuda_clearly():
    """fp32 on a GPU: flashjit's CUDA kernels take bf16/fp16; the run stops with the library's
    message (naming autocast), not a traceback. Needs a GPU (skips without one)."""
    require_gpu()
    with pytest.raises(SystemExit, match="bfloat16 or float16.*autocast"):
        load_script().main(["--preset", "tiny", "--steps", "2", "--device", "cuda",
                            "--dtype", "fp32", "--attn", "flashjit"])
