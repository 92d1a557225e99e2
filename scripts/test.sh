#!/usr/bin/env bash
# The test job: build flashjit with its tests and run them with ctest. GPU tests skip on a
# machine without a GPU. The Python tests (pip install . and torch into build/pyenv, then pytest
# tests/python) run as the ctest tests python_tests and python_torch_tests. CI reads ctest's
# closing "N% tests passed, M tests failed out of T".
#
#   scripts/test.sh              build/ and every test but the compile sweeps (ctest -LE sweep)
#   scripts/test.sh --sweeps     the every-config compile sweeps (ctest -L sweep: NVRTC and hipRTC
#                                compile every legal config, no GPU), after the default step
#                                (reuses build/). .ci/run runs both steps: CI checks everything.
#   scripts/test.sh --sanitize   the C++ suite built with AddressSanitizer + UndefinedBehavior-
#                                Sanitizer (g++, -fno-sanitize-recover=undefined) into build-asan/
#                                and run by ctest, without the tests SANITIZE_EXCLUDE names (why:
#                                docs/RELIABILITY.md). A finding fails its test. Without Python.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

start=${SECONDS}
if [[ "${1:-}" == "--sanitize" ]]; then
  # cli_package_test (its gtest names, which ctest runs by: PackageTest.*): builds
  # examples/cpp_consumer, without the sanitizer flags, against the installed (instrumented)
  # library: its link cannot resolve the sanitizer runtime.
  SANITIZE_EXCLUDE="${SANITIZE_EXCLUDE:-^PackageTest\.}"
  BUILD_DIR="${BUILD_DIR_ASAN:-${REPO_ROOT}/build-asan}"
  sanitize="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
  # --as-needed after the sanitizers: g++ links libasan with --no-as-needed, which would keep
  # the CUDA driver stub (named by CUDA::nvrtc) as a dependency: libcuda.so.1 is dlopen'ed and
  # absent on machines without a GPU, so the binaries would not start.
  link="-fsanitize=address,undefined -Wl,--as-needed"
  CMAKE_EXTRA_ARGS=(-DCMAKE_CXX_FLAGS="${sanitize}" -DCMAKE_C_FLAGS="${sanitize}"
    -DCMAKE_EXE_LINKER_FLAGS="${link}" -DCMAKE_SHARED_LINKER_FLAGS="${link}"
    -DFLASHJIT_BUILD_BENCH=OFF)
  if command -v ccache >/dev/null; then CMAKE_EXTRA_ARGS+=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache); fi
  install_test_tools
  configure_and_build ON
  phase_log "sanitizer build done" "${start}"
  # Leaks are findings too; a sanitizer report ends the test with a failure.
  export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0:halt_on_error=1}"
  export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
  ctest --test-dir "${BUILD_DIR}" --output-on-failure -j "${CTEST_JOBS:-2}" -E "${SANITIZE_EXCLUDE}"
  phase_log "sanitizer job done" "${start}"
  exit 0
fi
if [[ "${1:-}" == "--sweeps" ]]; then
  # The build is the default step's (incremental here); the sweeps need no Python.
  install_test_tools
  configure_and_build ON
  phase_log "build done" "${start}"
  ctest --test-dir "${BUILD_DIR}" --output-on-failure -j "${CTEST_JOBS:-2}" -L sweep
  phase_log "sweep job done" "${start}"
  exit 0
fi
install_test_tools
# `pip install .` and the test build share the library's objects through ccache (common.sh).
use_ccache
prepare_python_tests || exit 1
phase_log "Python package installed" "${start}"
configure_and_build ON
phase_log "build done" "${start}"
finish_python_tests
phase_log "torch ready" "${start}"

# Two at a time: GPU tests share one device, and CI machines have two cores. The compile sweeps
# (label "sweep") are the --sweeps step.
ctest --test-dir "${BUILD_DIR}" --output-on-failure -j "${CTEST_JOBS:-2}" -LE sweep
phase_log "test job done" "${start}"
