"""examples/hf_generate.py briefly: the tiny Llama-style preset with transformers' sdpa and with
flashjit ("fjit") in one process: the prefill logits within the tolerance, identical greedy
tokens (bf16: or parted at a near tie of sdpa's logits), both throughputs and the JSON written;
on the CPU backend (float32) and on CUDA (bfloat16, skips without a GPU); the near-tie check
itself. Skips without torch or transformers."""
import importlib.util
import json
import os

import pytest

from conftest import REPO_ROOT, have_module, require_cpu_backward, require_gpu

if not have_module("torch"):
    pytest.skip("torch is not installed", allow_module_level=True)
if not have_module("transformers"):
    pytest.skip("transformers is not installed (scripts/common.sh installs it for the tests)",
                allow_module_level=True)


def load_example():
    path = os.path.join(REPO_ROOT, "examples", "hf_generate.py")
    spec = importlib.util.spec_from_file_location("hf_generate", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_hf_generate_tiny(device, tmp_path, capsys):
    if device == "cuda":
        require_gpu()
    else:
        require_cpu_backward()
    report = tmp_path / "run.json"
    summary = load_example().main(["--device", device, "--batch", "3", "--prompt-len", "13",
                                   "--new-tokens", "5", "--pad", "0,4", "--json", str(report)])
    out = capsys.readouterr().out
    # fp32: identical tokens; bf16: identical, or parted at a near tie of sdpa's logits.
    assert summary["ok"], out
    if device == "cpu":
        assert summary["tokens_identical"], out
    assert summary["logits_max_difference"] < (1e-4 if device == "cpu" else 0.1), out
    assert set(summary["tokens_per_s"]) == {"sdpa", "fjit"}
    assert all(rate > 0 for rate in summary["tokens_per_s"].values())
    assert len(summary["tokens"]) == 3 and all(len(row) == 5 for row in summary["tokens"])
    assert "greedy tokens: " in out and "fjit:" in out and "sdpa:" in out
    assert json.loads(report.read_text())["tokens"] == summary["tokens"]


def test_first_difference_names_the_step_and_sdpa_gap():
    require_cpu_backward()
    import torch
    import transformers

    example = load_example()
    args = example.parse_args(["--batch", "2", "--prompt-len", "9", "--new-tokens", "4"])
    model = example.build_model(args, torch, transformers)
    ids, mask = example.prompts(args, torch, model.config.vocab_size)
    model.set_attn_implementation("sdpa")
    with torch.no_grad():
        expected = model.generate(ids, attention_mask=mask, max_new_tokens=4, min_new_tokens=4,
                                  do_sample=False, output_logits=True,
                                  return_dict_in_generate=True)
    tokens = expected.sequences[:, 9:].clone()
    altered = tokens.clone()
    altered[1, 2] = (altered[1, 2] + 1) % model.config.vocab_size
    first, gap = example.first_difference(model, ids, mask, tokens, altered, args, torch)
    best = expected.logits[2][1].float().topk(2).values
    assert first == 2 and abs(gap - float(best[0] - best[1])) < 1e-6
