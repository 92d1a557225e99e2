"""flashjit.show, flashjit.devices, flashjit.tune and config_for: the functions around
attention(), on whatever this machine has (sm90 table rendering needs no GPU)."""
import os

import numpy as np
import pytest

import flashjit
from conftest import require_cpu_backend


def test_version():
    assert flashjit.__version__.count(".") == 2


def test_devices_lists_the_cpu():
    listed = flashjit.devices()
    cpus = [d for d in listed if d["backend"] == "cpu"]
    assert len(cpus) == 1
    assert cpus[0]["cores"] >= 1 and cpus[0]["available"] == flashjit.have_cpu_backend()
    if flashjit.have_cpu_backend():
        assert cpus[0]["fingerprint"].startswith("cpu|")
    for gpu in (d for d in listed if d["backend"] == "cuda" and "error" not in d):
        assert gpu["arch"].startswith("sm") and gpu["fingerprint"].startswith("cuda|")


def test_show_table_arch_needs_no_gpu():
    source = flashjit.show(head_dim=128, causal=True, arch="sm90")
    first = source.splitlines()[0]
    assert first.startswith("// flashjit show: attention(batch=2, heads_q=16")
    assert "| config m" in first and "(default) | sm90 (table)" in first
    assert "__global__" in source
    given = flashjit.show(head_dim=64, arch="sm80", config="m64n32w4s2")
    assert "config m64n32w4s2 (given)" in given.splitlines()[0]


def test_show_errors():
    with pytest.raises(flashjit.InvalidArgumentError, match="head_dim = 100"):
        flashjit.show(head_dim=100, arch="sm90")
    with pytest.raises(flashjit.InvalidArgumentError, match="sm42"):
        flashjit.show(arch="sm42")
    with pytest.raises(flashjit.InvalidArgumentError, match="config = 'm512n512w4s2' is not "
                       "legal on sm90"):
        flashjit.show(arch="sm90", config="m512n512w4s2")
    with pytest.raises(flashjit.InvalidArgumentError, match="device = 'gpu'"):
        flashjit.show(device="gpu")
    with pytest.raises(flashjit.InvalidArgumentError, match="heads_kv = 5"):
        flashjit.show(heads=16, kv_heads=5, arch="sm90")


def test_show_cpu_backend():
    require_cpu_backend()
    source = flashjit.show(head_dim=64, seqlen=256, heads=4, causal=True, device="cpu")
    first = source.splitlines()[0]
    assert "(default) | cpu" in first and "causal" in first
    assert "flashjit" in source and len(source.splitlines()) > 20


def test_tune_rejects_bad_arguments_naming_them():
    # kwargs -> the tuner's request (tuner/tune_run.hpp): errors name the argument or the field.
    with pytest.raises(flashjit.InvalidArgumentError, match="head_dim = 12"):
        flashjit.tune(head_dims=[12])
    with pytest.raises(flashjit.InvalidArgumentError, match="causal = 'sometimes'"):
        flashjit.tune(causal="sometimes")
    with pytest.raises(flashjit.InvalidArgumentError, match="shard = 2/2"):
        flashjit.tune(shard="2/2", backend="cpu")
    with pytest.raises(flashjit.InvalidArgumentError, match="give tokens or batch, not both"):
        flashjit.tune(tokens=64, batch=2)


def test_tune_cpu_then_attention_serves_the_result(tmp_path, monkeypatch):
    """One small problem tuned on the CPU backend into a fresh DB; attention() then serves the
    tuned config (exact match) and still matches the reference."""
    require_cpu_backend()
    db = tmp_path / "tuning.db"
    monkeypatch.setenv("FLASHJIT_DB", str(db))
    try:
        report = flashjit.tune(backend="cpu", head_dims=[64], seqlens=[128], causal=False,
                               batch=1, heads=2, dtypes=["fp16"], min_time_ms=2, retime_top=1)
        assert db.exists()
        (problem,) = report["problems"]
        assert problem["d"] == 64 and problem["chosen"]["config"].startswith("m")
        rng = np.random.default_rng(7)
        q, k, v = (rng.standard_normal((1, 128, 2, 64)).astype(np.float16) for _ in range(3))
        chosen = flashjit.config_for(q, k, v)
        assert chosen["source"] == "exact"
        assert chosen["config"] == problem["chosen"]["config"]
        out = flashjit.attention(q, k, v)
        from conftest import reference_attention, relative_error

        assert relative_error(out, reference_attention(q, k, v)[0]) < 1e-2
        # Already tuned: resumed from the DB, nothing measured again.
        again = flashjit.tune(backend="cpu", head_dims=[64], seqlens=[128], causal=False,
                              batch=1, heads=2, dtypes=["fp16"], min_time_ms=2, retime_top=1)
        assert again["problems"][0]["chosen"]["config"] == problem["chosen"]["config"]
    finally:
        monkeypatch.undo()
        flashjit._clear_runtimes()  # later tests: no DB again


def test_module_exports_only_its_entry_point():
    # Exported symbols of the static archives linked into the module (flashjit's libraries, a
    # statically linked libstdc++) would interpose on the process's own libstdc++ and crash torch
    # or numpy (seen on the GPU machines): python/CMakeLists.txt links with --exclude-libs,ALL.
    import shutil
    import subprocess

    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("nm (binutils) not found")
    module = flashjit._C.__file__
    listed = subprocess.run([nm, "-D", "--defined-only", module], capture_output=True, text=True,
                            check=True).stdout.split("\n")
    names = [line.split()[-1] for line in listed if line.strip()]
    assert "PyInit__flashjit" in names
    # The module's own inline template instances (weak, header code) may remain; the C++
    # runtime's and flashjit's library symbols may not (5476 of them before the fix).
    runtime = [n for n in names if n.startswith(("__cxa", "_ZNSo", "_ZNSt6locale", "_ZNKSt7codecvt",
                                                  "_ZN8flashjit"))]
    assert not runtime, f"{len(runtime)} C++ runtime/library symbols exported: {runtime[:5]}"
    assert len(names) < 200, f"{len(names)} symbols exported"


def test_import_beside_numpy_and_torch_in_any_order():
    import subprocess
    import sys

    code = ("import flashjit, numpy\n"
            "try:\n    import torch\nexcept ImportError:\n    pass\n"
            "print(len(flashjit.show(head_dim=128, causal=True, arch='sm90')) > 0)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "True", done.stderr[-2000:]


def test_show_backward_on_a_table_arch():
    from conftest import backward_unavailable

    try:
        source = flashjit.show(head_dim=128, causal=True, arch="sm80", pass_="bwd")
    except flashjit.UnsupportedError as error:
        if backward_unavailable(error):
            pytest.skip(f"not merged yet: {error}")
        raise
    first = source.splitlines()[0]
    assert first.startswith("// flashjit show: attention_backward(batch=2, heads_q=16")
    assert ("| entries flashjit_attention_bwd_preprocess, flashjit_attention_bwd_dkdv, "
            "flashjit_attention_bwd_dq") in first
    deterministic = flashjit.show(head_dim=64, arch="sm80", pass_="bwd", deterministic=True)
    assert "-det (default)" in deterministic.splitlines()[0]


def test_show_backward_on_the_cpu_backend():
    from conftest import require_cpu_backward

    require_cpu_backward()
    source = flashjit.show(head_dim=64, seqlen=256, heads=4, device="cpu", pass_="bwd")
    first = source.splitlines()[0]
    assert "(default) | cpu" in first and "attention_backward(" in first
    assert "flashjit_attention_bwd_dkdv_cpu" in first


def test_tune_passes_are_checked():
    with pytest.raises(flashjit.InvalidArgumentError,
                       match="passes = 'fwd,sideways': allowed: fwd, bwd"):
        flashjit.tune(passes=("fwd", "sideways"))
    with pytest.raises(flashjit.InvalidArgumentError, match="deterministic applies to the "
                       "backward pass only"):
        flashjit.tune(deterministic=True)
    with pytest.raises(flashjit.InvalidArgumentError, match="recorded tunes the recorded "
                       "problems .each with its pass."):
        flashjit.tune(recorded=True, passes=["bwd"])


def test_tune_cpu_backward_then_attention_backward_serves_it(tmp_path, monkeypatch):
    """The forward and the backward of one small problem tuned on the CPU into a fresh DB: the
    report names each problem's pass, and attention_backward() then serves the tuned backward
    config (exact match) with correct gradients."""
    from conftest import (gradient_tolerance, reference_gradients, relative_error,
                          require_cpu_backward)

    require_cpu_backward()
    db = tmp_path / "tuning.db"
    monkeypatch.setenv("FLASHJIT_DB", str(db))
    try:
        report = flashjit.tune(backend="cpu", passes=("fwd", "bwd"), head_dims=[64],
                               seqlens=[128], causal=True, batch=1, heads=2, dtypes=["fp16"],
                               min_time_ms=2, retime_top=1)
        assert [p["pass"] for p in report["problems"]] == ["fwd", "bwd"]
        backward = report["problems"][1]
        assert backward["key"].startswith("bwd d64 f16") and backward["chosen"]["config"]
        rng = np.random.default_rng(8)
        q, k, v, do = (rng.standard_normal((1, 128, 2, 64)).astype(np.float16) for _ in range(4))
        chosen = flashjit.config_for(q, k, v, causal=True, pass_="bwd")
        assert chosen["source"] == "exact"
        assert chosen["config"] == backward["chosen"]["config"]
        o, lse = flashjit.attention(q, k, v, causal=True, return_lse=True)
        grads = flashjit.attention_backward(q, k, v, o, lse, do, causal=True)
        for grad, ref in zip(grads, reference_gradients(q, k, v, do, causal=True)):
            assert relative_error(grad, ref) < gradient_tolerance("float16")
    finally:
        monkeypatch.undo()
        flashjit._clear_runtimes()  # later tests: no DB again


def test_tune_cpu_verifies_user_expressions(tmp_path, monkeypatch):
    """flashjit.tune(score_mod=, mask_mod=) on the CPU: the fp64 reference compiles the
    expressions itself, so configs are verified and a choice stored that attention() with the
    same expressions then serves (exact match)."""
    require_cpu_backend()
    db = tmp_path / "tuning.db"
    monkeypatch.setenv("FLASHJIT_DB", str(db))
    score_mod = "score - 0.1f * abs(q_idx - kv_idx)"
    mask_mod = "(q_idx / 16) >= (kv_idx / 16)"
    try:
        report = flashjit.tune(backend="cpu", head_dims=[32], seqlens=[80], causal=False,
                               batch=1, heads=2, dtypes=["fp32"], min_time_ms=2, retime_top=1,
                               score_mod=score_mod, mask_mod=mask_mod)
        (problem,) = report["problems"]
        assert problem["chosen"]["config"].startswith("m")
        rng = np.random.default_rng(9)
        q, k, v = (rng.standard_normal((1, 80, 2, 32)).astype(np.float32) for _ in range(3))
        chosen = flashjit.config_for(q, k, v, score_mod=score_mod, mask_mod=mask_mod)
        assert chosen["source"] == "exact"
        assert chosen["config"] == problem["chosen"]["config"]
    finally:
        monkeypatch.undo()
        flashjit._clear_runtimes()  # later tests: no DB again


# What the tuning worker runs first (sitecustomize, on PYTHONPATH): in the first worker only
# (the mark file is absent), a thread that aborts the process as soon as the worker names a
# config in flight - what a candidate kernel that kills its process does.
_ABORTING_WORKER = """
import os, threading, time
mark = os.environ.get("FLASHJIT_TEST_ABORT_MARK")
inflight = os.environ.get("FLASHJIT_TUNE_INFLIGHT")
if os.environ.get("FLASHJIT_TUNE_WORKER") == "1" and mark and inflight and not os.path.exists(mark):
    def watch():
        while True:
            try:
                if os.path.getsize(inflight) > 0:
                    open(mark, "w").close()
                    os.abort()
            except OSError:
                pass
            time.sleep(0.0005)
    threading.Thread(target=watch, daemon=True).start()
"""


def test_tune_survives_a_worker_killed_mid_config(tmp_path, monkeypatch):
    """flashjit.tune() tunes in worker processes (`python -m flashjit tune`): a worker killed
    (SIGABRT) while a config is in flight does not end the run or this interpreter; the config
    is stored as failed, the next worker finishes the problem, no finished result is lost."""
    require_cpu_backend()
    import sqlite3
    import sys

    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(_ABORTING_WORKER)
    mark = tmp_path / "aborted-once"
    db = tmp_path / "tuning.db"
    monkeypatch.setenv("FLASHJIT_DB", str(db))
    monkeypatch.setenv("FLASHJIT_TEST_ABORT_MARK", str(mark))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(hook)] + sys.path))
    try:
        report = flashjit.tune(backend="cpu", head_dims=[64], seqlens=[128], causal=False,
                               batch=1, heads=2, dtypes=["fp16"], min_time_ms=2, retime_top=1)
        assert mark.exists(), "no worker process ran the tuning"
        (problem,) = report["problems"]
        assert problem["chosen"]["config"].startswith("m")
        with sqlite3.connect(db) as connection:
            rows = connection.execute("SELECT config, status, message FROM results").fetchall()
        failed = [row for row in rows if row[1] == "launch-failed"]
        assert len(failed) == 1, rows
        assert "signal" in failed[0][2] or "died" in failed[0][2], failed
        assert sum(row[1] == "timed" for row in rows) >= 1, rows
    finally:
        monkeypatch.undo()
        flashjit._clear_runtimes()
