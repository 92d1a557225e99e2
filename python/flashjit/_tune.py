"""flashjit.tune(): the ``flashjit tune`` command run from Python (worker processes of this
interpreter, its JSON report returned as a dict)."""
import json as _json
import os as _os
import sys as _sys
import tempfile as _tempfile

from . import _flashjit as _C
from ._flashjit import Error, InvalidArgumentError, NoDeviceError


def _package():
    import flashjit

    return flashjit


def _list_flag(value):
    if isinstance(value, (list, tuple)):
        return ",".join(str(item) for item in value)
    return str(value)


def tune(*, passes=("fwd",), deterministic=False, head_dims=None, dtypes=None, causal=None,
         seqlens=None, tokens=None, batch=None, hidden=None, heads=None, kv_heads=None,
         recorded=False, db=None, devices=None, backend=None, shard=None, retune=False,
         min_time_ms=None, retime_top=None, jobs=None, verbose=False, score_mod=None,
         mask_mod=None, score_mod_grad=None):
    """Tunes a grid of problems (or the recorded ones) and stores the winners in the tuning DB,
    exactly as ``flashjit tune`` with the same-named flags does (progress on stderr, a table on
    stdout). Returns its JSON report as a dict ({"problems": [...], "geomean_gain", ...}; each
    problem names its "pass").

    passes: the passes to tune, "fwd" and/or "bwd" (``--pass``): ("fwd", "bwd") tunes each
    shape's forward and backward. deterministic: the backward problems' bitwise reproducible
    variant. Defaults as the command: on a GPU the standard grid (d 64,128,256, causal both,
    N 512..16384, 16k tokens, hidden 2048, bf16); on the CPU backend a small grid.
    causal: True ("on"), False ("off") or "both". Lists may be Python lists or "a,b" strings.
    recorded=True replays the recorded problems, each with its own pass (give no grid then).
    score_mod, mask_mod, score_mod_grad: user expressions applied to every problem (as on
    attention(); ``--score-mod`` ...): the configs are verified against the fp64 reference, which
    compiles the expressions for the host in double (the CPU backend's Clang JIT, else the host's
    C++ compiler: ``FLASHJIT_HOST_CXX``).
    Later attention() and attention_backward() calls serve the new results.
    """
    args = []
    passes = [passes] if isinstance(passes, str) else list(passes)
    if passes != ["fwd"]:  # the command's default; --recorded takes no --pass
        args += ["--pass", _list_flag(passes)]
    if deterministic:
        args.append("--deterministic")
    for flag, value in (("head-dims", head_dims), ("dtypes", dtypes), ("seqlens", seqlens),
                        ("tokens", tokens), ("batch", batch), ("hidden", hidden),
                        ("heads", heads), ("kv-heads", kv_heads), ("db", db),
                        ("devices", devices), ("backend", backend), ("shard", shard),
                        ("min-time-ms", min_time_ms), ("retime-top", retime_top),
                        ("jobs", jobs), ("score-mod", score_mod), ("mask-mod", mask_mod),
                        ("score-mod-grad", score_mod_grad)):
        if value is not None:
            args += [f"--{flag}", _os.fspath(value) if flag == "db" else _list_flag(value)]
    if causal is not None:
        args += ["--causal", {True: "on", False: "off"}.get(causal, str(causal))]
    for flag, value in (("recorded", recorded), ("retune", retune), ("verbose", verbose)):
        if value:
            args.append(f"--{flag}")
    with _tempfile.TemporaryDirectory(prefix="flashjit-tune-") as folder:
        report_path = _os.path.join(folder, "tune.json")
        _sys.stdout.flush()
        _sys.stderr.flush()
        # Crash isolation: the tuning runs in worker processes of this interpreter
        # (`python -m flashjit tune ...`), restarted when a candidate kernel kills one.
        _C.set_tune_worker_command([_sys.executable, "-m", "flashjit"])
        status, errors = _C.tune(args + ["--json", report_path])
        torch_paths = _package()._torch_paths
        if torch_paths is not None:  # the tune cleared the runtimes: prepared calls too
            torch_paths.clear_plans()
        if status != 0:
            lines = [line for line in errors.splitlines() if line.strip()]
            message = "\n".join(lines[-20:]) or f"flashjit tune failed (exit status {status})"
            if "no CUDA device" in message:
                raise _package()._error(NoDeviceError, "NoDevice", message)
            if status == 2:
                raise _package()._error(InvalidArgumentError, "InvalidArgument", message)
            raise _package()._error(Error, "Failed", message)
        if not _os.path.exists(report_path):  # nothing to tune
            return {"problems": [], "geomean_gain": 1.0, "seconds": 0.0}
        with open(report_path) as f:
            return _json.load(f)
