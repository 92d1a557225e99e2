#!/usr/bin/env bash
# The test job: build flashjit with its tests and run them with ctest. GPU tests skip on a
# machine without a GPU. The Python tests (pip install . and torch into build/pyenv, then pytest
# tests/python) run as the ctest tests python_tests and python_torch_tests. CI reads ctest's
# closing "N% tests passed, M tests failed out of T".
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

start=${SECONDS}
install_test_tools
prepare_python_tests || exit 1
log "Python package installed in $((SECONDS - start)) s"
configure_and_build ON
log "build done in $((SECONDS - start)) s"
finish_python_tests
log "torch ready in $((SECONDS - start)) s"

# Two at a time: GPU tests share one device, and CI machines have two cores.
ctest --test-dir "${BUILD_DIR}" --output-on-failure -j "${CTEST_JOBS:-2}"
log "test job done in $((SECONDS - start)) s"
