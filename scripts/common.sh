# Shared by scripts/main.sh and scripts/test.sh (sourced, not run): install what the build needs
# on a fresh Debian/Ubuntu machine, then configure and build flashjit into build/.
#
# Environment: CUDA_HOME (default /usr/local/cuda), BUILD_DIR (default <repo>/build),
# JOBS (default: number of CPU cores).

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${BUILD_DIR:-${REPO_ROOT}/build}"
CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}"
JOBS="${JOBS:-$(nproc 2>/dev/null || echo 2)}"

log() { printf '[flashjit] %s\n' "$*" >&2; }

# phase_log <what> <start>: "[flashjit] <what> in N s (CPU M s)": the wall seconds since <start>
# (a $SECONDS value) and the CPU seconds (user + system) this shell's finished children used so
# far. On a shared machine wall times grow with the others' load; CPU seconds do not
# (docs/TESTING.md). A background job counts once it has been waited for. `times` must run in
# this shell, not in a $(...) subshell, whose children are its own.
phase_log() {
  local file cpu
  file=$(mktemp)
  times >"${file}"
  cpu=$(tail -n 1 "${file}" | awk '{ s = 0
    for (i = 1; i <= NF; ++i) { split($i, p, "m"); s += p[1] * 60 + p[2] }
    printf "%d", s }')
  rm -f "${file}"
  log "$1 in $((SECONDS - $2)) s (CPU ${cpu} s)"
}

# Installs the Debian packages whose probe fails; nothing when all are present. Needs root
# (or passwordless sudo) and network only when something is missing.
#   ensure_packages "probe-command-1" package-1 "probe-command-2" package-2 ...
ensure_packages() {
  local missing=()
  while (($# >= 2)); do
    if ! eval "$1" >/dev/null 2>&1; then missing+=("$2"); fi
    shift 2
  done
  ((${#missing[@]} == 0)) && return 0
  local sudo=()
  if ((EUID != 0)); then
    if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
      sudo=(sudo -n)
    else
      log "missing packages: ${missing[*]}; not root, so not installing them (the build may fail)"
      return 0
    fi
  fi
  if ! command -v apt-get >/dev/null 2>&1; then
    log "missing packages: ${missing[*]}; no apt-get here, install them by hand"
    return 0
  fi
  log "installing: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  # An offline machine cannot install; say so and let the build report what is really missing.
  "${sudo[@]}" apt-get update -qq || log "apt-get update failed (offline?)"
  "${sudo[@]}" apt-get install -y --no-install-recommends "${missing[@]}" ||
    log "apt-get install failed for: ${missing[*]}"
}

have_gtest() {
  [[ -f /usr/include/gtest/gtest.h ]] &&
    { compgen -G "/usr/lib/*/libgtest.a" || compgen -G "/usr/lib/*/libgtest.so"; } >/dev/null
}

install_build_tools() {
  ensure_packages \
    "command -v cmake" cmake \
    "command -v g++" g++ \
    "command -v make" make \
    "have_sqlite3" libsqlite3-dev \
    "have_llvm14" llvm-14-dev \
    "have_clang14" libclang-14-dev \
    "have_clang_cpp14" libclang-cpp14-dev
}

# The optional CPU backend (Clang/LLVM 14 in-process): its CMake packages and shared libraries.
# Where apt cannot install them, the build goes on without the CPU backend.
have_llvm14() { [[ -f /usr/lib/llvm-14/lib/cmake/llvm/LLVMConfig.cmake ]]; }
have_clang14() { [[ -f /usr/lib/llvm-14/include/clang/Frontend/CompilerInstance.h ]]; }
have_clang_cpp14() { compgen -G "/usr/lib/llvm-14/lib/libclang-cpp.so*" >/dev/null; }

# sqlite3.h from libsqlite3-dev. Where it cannot be installed, configure_and_build falls back to
# a copy in .deps/sqlite (with the system's libsqlite3.so.0).
have_sqlite3() { [[ -f /usr/include/sqlite3.h ]]; }

# The optional HIP backend: the ROCm headers (build) and libamdhip64 with hipRTC (the tests
# compile every HIP config for gfx90a; no AMD GPU needed). Debian 12 ships ROCm 5.2. Where apt
# cannot install it, the build goes on without the HIP backend.
have_hip() { [[ -f /usr/include/hip/hiprtc.h && -f /usr/include/hip/hip_runtime_api.h ]]; }

install_test_tools() {
  install_build_tools
  ensure_packages "have_gtest" libgtest-dev
  # Its own call: if apt cannot install it, the packages above are not held back with it.
  ensure_packages "have_hip" libamdhip64-dev
  # ccache: `pip install .` and the test build compile the same library sources with the same
  # flags; with ccache the second build takes them from the first (use_ccache).
  ensure_packages "command -v ccache" ccache
  # Headless Chromium renders `flashjit report` in tests/python/test_cli_report.py (~30 s to
  # install; the test skips without it).
  ensure_packages "command -v chromium" chromium
}

# flashjit needs the CUDA toolkit's headers (cuda.h) and NVRTC; not the driver, not a GPU.
check_cuda_toolkit() {
  if [[ ! -f "${CUDA_HOME}/include/cuda.h" || ! -f "${CUDA_HOME}/include/nvrtc.h" ]]; then
    log "ERROR: CUDA toolkit not found at ${CUDA_HOME} (need include/cuda.h, include/nvrtc.h" \
      "and lib64/libnvrtc.so). Install CUDA 12+ there or set CUDA_HOME."
    exit 1
  fi
}

# The Python tests (tests/python): a venv at $BUILD_DIR/pyenv (not the system's python) with numpy
# and pytest, and the package installed into it exactly as a user would: `pip install .` (which
# builds the extension through CMake with scikit-build-core + nanobind, fetched by pip). Sets
# PYTEST_PYTHON to the venv's python: configure_and_build then registers tests/python as the ctest
# tests python_tests and python_torch_tests (torch downloaded in the background from here and
# installed by finish_python_tests). Set
# FLASHJIT_SKIP_PYTHON_TESTS=1 to skip (e.g. offline).
prepare_python_tests() {
  if [[ "${FLASHJIT_SKIP_PYTHON_TESTS:-0}" == 1 ]]; then
    log "FLASHJIT_SKIP_PYTHON_TESTS=1: no Python tests"
    return 0
  fi
  local python="${PYTHON:-python3}" venv="${BUILD_DIR}/pyenv"
  if [[ ! -x "${venv}/bin/python" ]]; then
    log "creating the venv ${venv} ($("${python}" --version 2>&1))"
    "${python}" -m venv "${venv}" || {
      log "ERROR: '${python} -m venv' failed (Debian: apt-get install python3-venv)"
      return 1
    }
  fi
  log "pip install numpy pytest, then pip install . (builds the extension, ${JOBS} jobs)"
  "${venv}/bin/python" -m pip install -q --disable-pip-version-check numpy pytest || return 1
  start_torch_download "${venv}/bin/python"
  CMAKE_BUILD_PARALLEL_LEVEL="${JOBS}" "${venv}/bin/python" -m pip install -q \
    --disable-pip-version-check "${REPO_ROOT}" || {
    log "ERROR: pip install . failed"
    return 1
  }
  PYTEST_PYTHON="${venv}/bin/python"
}

# After prepare_python_tests (and whatever build ran meanwhile): torch and transformers in its
# venv, from the background job (start_torch_download).
finish_python_tests() {
  [[ -n "${PYTEST_PYTHON:-}" ]] || return 0
  if [[ -n "${TORCH_JOB_PID:-}" ]]; then
    log "waiting for the background torch install (pid ${TORCH_JOB_PID})"
    wait "${TORCH_JOB_PID}" || true
    TORCH_JOB_PID=
    sed 's/^/  /' "${BUILD_DIR}/torch-wheels/install.log" >&2 || true
  fi
  install_torch "${PYTEST_PYTHON}" ||
    log "torch could not be installed (offline?): the PyTorch tests will skip"
  install_transformers "${PYTEST_PYTHON}" ||
    log "transformers could not be installed (offline?): tests/python/test_hf.py will skip"
}

# Hugging Face transformers into the Python environment of $1 (tests/python/test_hf.py,
# examples/hf_generate.py: flashjit.hf), once torch imports there. transformers (>= 4.53:
# AttentionInterface and AttentionMaskInterface) does not depend on torch; its own dependencies
# (huggingface-hub, tokenizers, safetensors, regex, pyyaml, tqdm, ...) come with it, ~30 MB.
# Nothing when it imports already or FLASHJIT_SKIP_TRANSFORMERS=1.
install_transformers() {
  local python="$1"
  [[ "${FLASHJIT_SKIP_TRANSFORMERS:-0}" == 1 ]] && return 0
  "${python}" -c "import torch" 2>/dev/null || return 0
  "${python}" -c "import transformers" 2>/dev/null && return 0
  log "installing transformers into $("${python}" -c 'import sys; print(sys.prefix)') (PyPI)"
  "${python}" -m pip install -q --disable-pip-version-check "transformers>=4.53" &&
    "${python}" -c "import torch, transformers; transformers.AttentionMaskInterface"
}

# torch into the Python environment of $1 (tests/python/test_torch_*.py and examples/train_gpt.py
# in CI, bench/cpu_bench.py), as /work/shared/TOOLCHAIN.md found works on these machines: PyPI's
# torch with --no-deps (~1 GB, not the ~4 GB of its CUDA libraries: the CPU tests need none), the
# small packages `import torch` needs, and the four nvidia-* libraries libtorch_cuda.so links
# (loaded at import even without a GPU); if torch still does not import, the full
# `pip install torch`. Nothing when torch imports already. FLASHJIT_SKIP_TORCH=1 skips it.
# The wheels install_torch needs: torch (--no-deps) and the nvidia-* libraries it links.
TORCH_WHEELS=(torch nvidia-cufile nvidia-cusparselt-cu13 nvidia-nvshmem-cu13 nvidia-nccl-cu13)

# start_torch_download <python>: in the background, fetch TORCH_WHEELS into
# ${BUILD_DIR}/torch-wheels (~1 GB: network-bound), install torch from there and then
# transformers (install_torch, install_transformers), so that all of it overlaps the builds
# (`pip install .` and configure_and_build) instead of following them. Its log:
# ${BUILD_DIR}/torch-wheels/install.log. finish_python_tests waits for it, then runs both
# installs again in the foreground: nothing when they succeeded, the fallback when not. Nothing
# when torch imports already or FLASHJIT_SKIP_TORCH=1. Start it after pip has installed numpy:
# the two pips must not install the same package at once.
start_torch_download() {
  local python="$1"
  [[ "${FLASHJIT_SKIP_TORCH:-0}" == 1 ]] && return 0
  "${python}" -c "import torch" 2>/dev/null && return 0
  mkdir -p "${BUILD_DIR}/torch-wheels"
  log "downloading and installing torch in the background (${BUILD_DIR}/torch-wheels)"
  (
    "${python}" -m pip download -q --disable-pip-version-check --no-deps \
      -d "${BUILD_DIR}/torch-wheels" "${TORCH_WHEELS[@]}" ||
      log "the background download failed: install_torch falls back to PyPI"
    install_torch "${python}" && install_transformers "${python}"
  ) >"${BUILD_DIR}/torch-wheels/install.log" 2>&1 &
  TORCH_JOB_PID=$!
}

install_torch() {
  local python="$1"
  local pip=("${python}" -m pip install -q --disable-pip-version-check)
  if [[ "${FLASHJIT_SKIP_TORCH:-0}" == 1 ]]; then
    log "FLASHJIT_SKIP_TORCH=1: torch not installed"
    return 0
  fi
  "${python}" -c "import torch" 2>/dev/null && return 0
  local start=${SECONDS}
  # The wheels start_torch_download fetched first; pip falls back to the index for anything the
  # folder lacks.
  if compgen -G "${BUILD_DIR}/torch-wheels/*.whl" >/dev/null; then
    pip+=(--find-links "${BUILD_DIR}/torch-wheels")
  fi
  log "installing torch into $("${python}" -c 'import sys; print(sys.prefix)') (PyPI, --no-deps)"
  "${pip[@]}" --no-deps torch &&
    "${pip[@]}" filelock fsspec jinja2 networkx sympy typing-extensions numpy setuptools &&
    "${pip[@]}" --no-deps "${TORCH_WHEELS[@]:1}"
  if ! "${python}" -c "import torch" 2>/dev/null; then
    log "torch does not import yet: the full pip install torch"
    "${pip[@]}" torch || return 1
  fi
  log "torch installed in $((SECONDS - start)) s"
}

# use_ccache: compile through ccache (when installed and FLASHJIT_CCACHE is not 0) in every CMake
# build this shell starts from here on: `pip install .`'s (scikit-build-core, build/python-*) and
# configure_and_build's. They compile the library's sources with the same flags and absolute
# paths, so the second build takes ~all of them from the first (a fresh clone on a cold cache:
# the library is compiled once, not twice). CMake reads CMAKE_<LANG>_COMPILER_LAUNCHER from the
# environment when it first configures a build directory. One compiler name for both: ccache
# keys on it, and scikit-build-core would otherwise pick Python's (sysconfig CC/CXX: gcc, g++)
# while CMake picks c++. CCACHE_BASEDIR, where set, makes paths relative to each build
# directory, and build/python-* is one level deeper than build/: leave it unset for this.
use_ccache() {
  [[ "${FLASHJIT_CCACHE:-1}" == 0 ]] && return 0
  command -v ccache >/dev/null 2>&1 || return 0
  export CMAKE_C_COMPILER_LAUNCHER="${CMAKE_C_COMPILER_LAUNCHER:-ccache}"
  export CMAKE_CXX_COMPILER_LAUNCHER="${CMAKE_CXX_COMPILER_LAUNCHER:-ccache}"
  if [[ -z "${CC:-}" && -z "${CXX:-}" ]] && command -v gcc >/dev/null && command -v g++ >/dev/null
  then
    export CC=gcc CXX=g++
  fi
}

# configure_and_build <ON|OFF: tests> [cmake --build args...]
# CMAKE_EXTRA_ARGS (an array, optional): more -D arguments for the configure step.
configure_and_build() {
  local tests="$1"
  shift
  check_cuda_toolkit
  log "configuring (Release, tests ${tests}) in ${BUILD_DIR}"
  local extra=()
  if [[ ! -f /usr/include/sqlite3.h && -f "${REPO_ROOT}/.deps/sqlite/sqlite3.h" ]]; then
    extra+=(-DFLASHJIT_SQLITE3_INCLUDE_DIR="${REPO_ROOT}/.deps/sqlite")
  fi
  if [[ -n "${PYTEST_PYTHON:-}" ]]; then extra+=(-DFLASHJIT_PYTEST_PYTHON="${PYTEST_PYTHON}"); fi
  if declare -p CMAKE_EXTRA_ARGS >/dev/null 2>&1; then extra+=("${CMAKE_EXTRA_ARGS[@]}"); fi
  cmake -S "${REPO_ROOT}" -B "${BUILD_DIR}" -DCMAKE_BUILD_TYPE=Release \
    -DCUDAToolkit_ROOT="${CUDA_HOME}" -DFLASHJIT_BUILD_TESTS="${tests}" "${extra[@]}" >/dev/null
  log "building with ${JOBS} jobs"
  cmake --build "${BUILD_DIR}" -j "${JOBS}" "$@"
}
