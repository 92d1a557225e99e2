"""flashjit.tune(): tunes a grid of problems through the library's tuning service
(tuner/tune_run.hpp), in worker processes of this interpreter, and returns its report as a dict."""
import json as _json
import os as _os
import sys as _sys

from . import _flashjit as _C
from ._flashjit import Error, InvalidArgumentError, NoDeviceError


def _package():
    import flashjit

    return flashjit


def _list(value, kind, name):
    """A list of `kind` from a list/tuple, a single value or an "a,b" string."""
    if value is None:
        return None
    items = value.split(",") if isinstance(value, str) else (
        list(value) if isinstance(value, (list, tuple)) else [value])
    try:
        return [kind(item) for item in items]
    except (TypeError, ValueError):
        raise _package()._error(InvalidArgumentError, "InvalidArgument",
                                f"{name} = {value!r}: expected a list of {kind.__name__}") from None


def _spec(passes, deterministic, head_dims, dtypes, causal, seqlens, tokens, batch, hidden,
          heads, kv_heads, recorded, db, devices, backend, shard, retune, min_time_ms,
          retime_top, jobs, verbose, score_mod, mask_mod, score_mod_grad):
    """The keyword arguments as the extension's tune() takes them (JSON-serializable: the
    worker process gets them on its command line)."""
    bad = lambda message: _package()._error(InvalidArgumentError, "InvalidArgument", message)
    if causal is not None:
        causal = {True: "on", False: "off"}.get(causal, causal)
        if causal not in ("on", "off", "both"):
            raise bad(f"causal = {causal!r}: allowed: True, False, 'both'")
    all_devices = False
    if isinstance(devices, str) and devices == "all":
        all_devices, devices = True, None
    if isinstance(shard, str):
        parts = shard.split("/")
        try:
            shard = [int(part) for part in parts]
        except ValueError:
            shard = None
        if shard is None or len(parts) != 2:
            raise bad(f"shard = {'/'.join(parts)!r}: expected 'I/N' with 0 <= I < N, e.g. '0/4'")
    return {
        "passes": _list(passes, str, "passes"), "deterministic": bool(deterministic),
        "head_dims": _list(head_dims, int, "head_dims"), "dtypes": _list(dtypes, str, "dtypes"),
        "causal": causal, "seqlens": _list(seqlens, int, "seqlens"), "tokens": tokens,
        "batch": batch, "hidden": hidden, "heads": heads, "kv_heads": kv_heads,
        "recorded": bool(recorded), "db": None if db is None else _os.fspath(db),
        "devices": _list(devices, int, "devices"), "all_devices": all_devices,
        "backend": backend, "shard": None if shard is None else list(shard),
        "retune": bool(retune), "min_time_ms": None if min_time_ms is None else float(min_time_ms),
        "retime_top": retime_top, "jobs": jobs, "verbose": bool(verbose), "score_mod": score_mod,
        "mask_mod": mask_mod, "score_mod_grad": score_mod_grad,
    }


def tune(*, passes=("fwd",), deterministic=False, head_dims=None, dtypes=None, causal=None,
         seqlens=None, tokens=None, batch=None, hidden=None, heads=None, kv_heads=None,
         recorded=False, db=None, devices=None, backend=None, shard=None, retune=False,
         min_time_ms=None, retime_top=None, jobs=None, verbose=False, score_mod=None,
         mask_mod=None, score_mod_grad=None):
    """Tunes a grid of problems (or the recorded ones) and stores the winners in the tuning DB,
    as ``flashjit tune`` with the same-named flags does (progress on stderr, a table on stdout).
    Returns the report as a dict, the keys of ``flashjit tune --json``'s ({"problems": [...],
    "geomean_gain", ...}; each problem names its "pass").

    passes: the passes to tune, "fwd" and/or "bwd": ("fwd", "bwd") tunes each shape's forward
    and backward. deterministic: the backward problems' bitwise reproducible variant. Defaults
    as the command: on a GPU the standard grid (d 64,128,256, causal both, N 512..16384, 16k
    tokens, hidden 2048, bf16); on the CPU backend a small grid. causal: True, False or "both".
    Lists may be Python lists or "a,b" strings; devices a list or "all"; shard "I/N" or (I, N).
    recorded=True replays the recorded problems, each with its own pass (give no grid then).
    score_mod, mask_mod, score_mod_grad: user expressions applied to every problem (as on
    attention()): the configs are verified against the fp64 reference, which compiles the
    expressions for the host in double (the CPU backend's Clang JIT, else the host's C++
    compiler: ``FLASHJIT_HOST_CXX``).
    Bad arguments raise InvalidArgumentError naming the argument; no device of the backend,
    NoDeviceError; a run that fails (a device error, a problem without a usable config), Error.
    Later attention() and attention_backward() calls serve the new results.
    """
    spec = _spec(passes, deterministic, head_dims, dtypes, causal, seqlens, tokens, batch,
                 hidden, heads, kv_heads, recorded, db, devices, backend, shard, retune,
                 min_time_ms, retime_top, jobs, verbose, score_mod, mask_mod, score_mod_grad)
    # Crash isolation: the tuning runs in worker processes of this interpreter
    # (`python -m flashjit tune-worker <spec>`), restarted when a candidate kernel kills one.
    spec["worker"] = [_sys.executable, "-m", "flashjit", "tune-worker", _json.dumps(spec)]
    _sys.stdout.flush()
    _sys.stderr.flush()
    status, message, report = _C.tune(spec)
    torch_paths = _package()._torch_paths
    if torch_paths is not None:  # the tune cleared the runtimes: prepared calls too
        torch_paths.clear_plans()
    if status != 0:
        message = message or f"flashjit tune failed (exit status {status})"
        if status == 2 and message.startswith(("no CUDA device", "no AMD GPU")):
            raise _package()._error(NoDeviceError, "NoDevice", message)
        if status == 2:
            raise _package()._error(InvalidArgumentError, "InvalidArgument", message)
        raise _package()._error(Error, "Failed", message)
    if not report["problems"]:  # nothing to tune
        return {"problems": [], "geomean_gain": 1.0, "seconds": 0.0}
    return report


def _worker_main(args):
    """`python -m flashjit tune-worker <spec>`: the worker process of tune() (the supervisor set
    FLASHJIT_TUNE_WORKER): tunes in this process and hands the report to the supervisor. Returns
    the exit status."""
    if len(args) != 1:
        print("flashjit tune-worker: expects one argument (the request as JSON)", file=_sys.stderr)
        return 2
    spec = _json.loads(args[0])
    spec["worker"] = []
    status, message, _ = _C.tune(spec)
    return status
