"""The Python examples of the docs, run verbatim in a fresh interpreter as a user would after
`pip install .`: README.md's ("## Python": numpy on the CPU backend) and docs/USAGE.md's ("## Python
examples": torch on a GPU, and torch training with autograd and torch.compile on the CPU backend),
as tests/runtime/readme_example_test.cpp does for the C++ examples."""
import os
import re
import subprocess
import sys

import pytest

from conftest import REPO_ROOT, have_module, require_cpu_backend, require_gpu


def section_blocks(path, heading):
    """The ```python blocks under `heading` (a '## ' line) of the Markdown file `path`."""
    with open(os.path.join(REPO_ROOT, path)) as f:
        text = f.read()
    section = re.search(r"^" + re.escape(heading) + r"\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    assert section, f"{path} has no '{heading}' section"
    return re.findall(r"```python\n(.*?)```", section.group(1), re.S)


def readme_block():
    """README.md's one Python example: numpy in, the CPU backend."""
    blocks = section_blocks("README.md", "## Python")
    assert len(blocks) == 1, ("expected one python example under README.md's '## Python' (add "
                              "others to docs/USAGE.md, or a test for them here)")
    assert "import torch" not in blocks[0]
    return blocks[0]


def usage_blocks():
    """docs/USAGE.md's examples: (torch on a GPU, torch training on the CPU)."""
    blocks = section_blocks(os.path.join("docs", "USAGE.md"), "## Python examples")
    gpu = [b for b in blocks if "import torch" in b and 'device="cuda"' in b]
    training = [b for b in blocks if "flashjit.sdpa" in b and 'device="cuda"' not in b]
    assert len(blocks) == 2 and len(gpu) == 1 and len(training) == 1, (
        "expected two python examples (GPU, training) under docs/USAGE.md's '## Python examples'")
    return gpu[0], training[0]


def run(code):
    # Outside the repository, so that `import flashjit` is the installed package.
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            cwd=os.path.expanduser("~") if os.path.isdir(os.path.expanduser("~"))
                            else "/", timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_readme_cpu_example():
    require_cpu_backend()
    code = readme_block()
    out = run(code)
    lines = out.splitlines()
    assert re.fullmatch(r"\(2, 1000, 8, 64\) float16 m\d+n\d+w\d+s\d+\S*", lines[0]), out
    expected = "(2, 1000, 8, 64) (2, 1000, 2, 64) (2, 1000, 2, 64)"
    assert lines[1] == expected
    assert "# " + expected in code  # the comment the README shows is what it prints


def test_readme_cpu_example_gradients_are_right():
    """The README's numbers, not only its shapes: o and the gradients against a float64 numpy
    reference (causal bottom-right, GQA 8:2) on the same inputs."""
    require_cpu_backend()
    import numpy as np
    import flashjit
    scope = {}
    code = readme_block().replace("print(", "(lambda *a: None)(")
    exec(compile(code, "README.md", "exec"), scope)
    q, k, v, do = (scope[n].astype(np.float64) for n in ("q", "k", "v", "do"))
    group = q.shape[2] // k.shape[2]
    n_q, n_k, d = q.shape[1], k.shape[1], q.shape[3]
    hidden = np.arange(n_k)[None, :] > np.arange(n_q)[:, None] + (n_k - n_q)
    o, dq = np.empty_like(q), np.empty_like(q)
    dk, dv = np.zeros_like(k), np.zeros_like(v)
    for b in range(q.shape[0]):  # one sequence at a time: [heads, n_q, n_k] float64 blocks
        kk, vv = (np.repeat(x[b], group, axis=1) for x in (k, v))
        s = np.where(hidden, -np.inf, np.einsum("qhd,khd->hqk", q[b], kk) / np.sqrt(d))
        p = np.exp(s - s.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        o[b] = np.einsum("hqk,khd->qhd", p, vv)
        dp = np.einsum("qhd,khd->hqk", do[b], vv)
        ds = p * (dp - (dp * p).sum(-1, keepdims=True)) / np.sqrt(d)
        dq[b] = np.einsum("hqk,khd->qhd", ds, kk)
        # GQA: the query heads of a group add into their key/value head.
        dk[b] = np.einsum("hqk,qhd->khd", ds, q[b]).reshape(n_k, -1, group, d).sum(2)
        dv[b] = np.einsum("hqk,qhd->khd", p, do[b]).reshape(n_k, -1, group, d).sum(2)
    for name, ref in (("o", o), ("dq", dq), ("dk", dk), ("dv", dv)):
        got = scope[name].astype(np.float64)
        err = np.linalg.norm(got - ref) / np.linalg.norm(ref)
        assert err < 2e-3, f"{name}: relative error {err}"
    assert isinstance(flashjit.config_for(scope["q"], scope["k"], scope["v"], causal=True), dict)


def test_usage_gpu_example():
    require_gpu()
    out = run(usage_blocks()[0])
    match = re.search(r"^relative error vs SDPA: ([0-9.e+-]+)", out, re.M)
    assert match, out
    assert float(match.group(1)) < 1e-2
    # Both sides are bf16 approximations of the exact gradient: twice flashjit's tolerance.
    match = re.search(r"^dq relative error vs SDPA: ([0-9.e+-]+)", out, re.M)
    assert match, out
    assert float(match.group(1)) < 2e-2


def test_usage_training_example():
    """Autograd through flashjit.sdpa and torch.compile, float32 on the CPU backend."""
    require_cpu_backend()
    if not have_module("torch"):
        pytest.skip("torch is not installed")
    out = run(usage_blocks()[1])
    match = re.search(r"^dq relative error vs SDPA: ([0-9.e+-]+)", out, re.M)
    assert match, out
    assert float(match.group(1)) < 1e-4  # float32 on both sides
    assert "compiled == eager: True" in out
