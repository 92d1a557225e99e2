"""The Python examples of README.md ("## Python"), run verbatim in a fresh interpreter as a user
would after `pip install .`: the numpy one on the CPU backend, the torch one on a GPU, the torch
training one (autograd, torch.compile) on the CPU backend (as tests/runtime/readme_example_test.cpp
does for the C++ example)."""
import os
import re
import subprocess
import sys

import pytest

from conftest import REPO_ROOT, have_module, require_cpu_backend, require_gpu


def python_blocks():
    """(numpy on the CPU, torch on a GPU, torch training on the CPU): the section's examples."""
    with open(os.path.join(REPO_ROOT, "README.md")) as f:
        text = f.read()
    section = re.search(r"^## Python\n(.*?)(?=^## )", text, re.S | re.M)
    assert section, "README.md has no '## Python' section"
    blocks = re.findall(r"```python\n(.*?)```", section.group(1), re.S)
    assert len(blocks) == 3, "expected three python examples (CPU, GPU, training) under '## Python'"
    cpu = [b for b in blocks if "import torch" not in b]
    gpu = [b for b in blocks if "import torch" in b and 'device="cuda"' in b]
    training = [b for b in blocks if "flashjit.sdpa" in b and 'device="cuda"' not in b]
    assert len(cpu) == 1 and len(gpu) == 1 and len(training) == 1
    return cpu[0], gpu[0], training[0]


def run(code):
    # Outside the repository, so that `import flashjit` is the installed package.
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            cwd=os.path.expanduser("~") if os.path.isdir(os.path.expanduser("~"))
                            else "/", timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_readme_cpu_example():
    require_cpu_backend()
    out = run(python_blocks()[0])
    lines = out.splitlines()
    assert lines[0] == "(2, 1000, 8, 64) float16"
    assert "'config': 'm" in lines[1] and "'device': 'cpu'" in lines[1]
    assert lines[2] == "(2, 1000, 8, 64) (2, 1000, 2, 64) (2, 1000, 2, 64)"


def test_readme_gpu_example():
    require_gpu()
    out = run(python_blocks()[1])
    match = re.search(r"^relative error vs SDPA: ([0-9.e+-]+)", out, re.M)
    assert match, out
    assert float(match.group(1)) < 1e-2
    # Both sides are bf16 approximations of the exact gradient: twice flashjit's tolerance.
    match = re.search(r"^dq relative error vs SDPA: ([0-9.e+-]+)", out, re.M)
    assert match, out
    assert float(match.group(1)) < 2e-2


def test_readme_training_example():
    """Autograd through flashjit.sdpa and torch.compile, float32 on the CPU backend."""
    require_cpu_backend()
    if not have_module("torch"):
        pytest.skip("torch is not installed")
    out = run(python_blocks()[2])
    match = re.search(r"^dq relative error vs SDPA: ([0-9.e+-]+)", out, re.M)
    assert match, out
    assert float(match.group(1)) < 1e-4  # float32 on both sides
    assert "compiled == eager: True" in out
