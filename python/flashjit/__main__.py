"""`python -m flashjit ...`: the flashjit command line, for pip users without the C++ build.

Runs the `flashjit` executable shipped inside the package (the same program as the C++ build's
CLI, cli/main.cpp): `python -m flashjit plan --backend cpu`, `python -m flashjit tune --pass
fwd,bwd`, `python -m flashjit db ls`, `python -m flashjit report --db ... --out report.html`.
`pip install` also puts it on PATH as the `flashjit` script. Exits with the command's status (0
ok, 1 the work failed, 2 a usage error). `python -m flashjit tune-worker <spec>` is flashjit.tune()'s
worker process (python/flashjit/_tune.py), not a command for users.
"""
import os
import subprocess
import sys


def executable():
    """The path of the shipped `flashjit` executable (next to the extension module)."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "flashjit")


def main(argv=None):
    """Runs `flashjit <argv...>` (default: sys.argv[1:]) and returns its exit status."""
    args = [str(arg) for arg in (sys.argv[1:] if argv is None else argv)]
    if args[:1] == ["tune-worker"]:
        from flashjit._tune import _worker_main

        return _worker_main(args[1:])
    program = executable()
    if not os.access(program, os.X_OK):
        print(f"flashjit: the command-line program is missing from the package ({program}); "
              "reinstall flashjit", file=sys.stderr)
        return 1
    sys.stdout.flush()
    sys.stderr.flush()
    status = subprocess.call([program, *args])
    return 128 - status if status < 0 else status


if __name__ == "__main__":
    sys.exit(main())
