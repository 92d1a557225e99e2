"""`python -m flashjit ...`: the flashjit command line, for pip users without the C++ build.

The same program as the `flashjit` executable (cli/commands.hpp), run inside the extension
module: `python -m flashjit plan --backend cpu`, `python -m flashjit tune --pass fwd,bwd`,
`python -m flashjit db ls`, `python -m flashjit report --db ... --out report.html`. `pip install`
also puts it on PATH as the `flashjit` script. Exits with the command's status (0 ok, 1 the work
failed, 2 a usage error).
"""
import sys

from flashjit import _flashjit


def main(argv=None):
    """Runs `flashjit <argv...>` (default: sys.argv[1:]) and returns its exit status."""
    args = sys.argv[1:] if argv is None else argv
    # `tune` runs its tuning in worker processes of this same command (crash isolation).
    _flashjit.set_tune_worker_command([sys.executable, "-m", "flashjit"])
    sys.stdout.flush()
    sys.stderr.flush()
    return _flashjit.cli([str(arg) for arg in args])


if __name__ == "__main__":
    sys.exit(main())
