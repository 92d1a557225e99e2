#!/usr/bin/env bash
# Builds the libFuzzer targets of tests/fuzz with clang 14 (address + undefined sanitizers) into
# build-fuzz/ and runs each for a while, printing its executions, speed, corpus and crashes.
#
#   scripts/fuzz.sh [--seconds N] [--runs N] [--jobs J] [--workers W] [--prebuilt DIR] [target...]
#
# Targets: cli_flags problem_config tuning_db python_arrays (default: all). --seconds: time per
# target (default 60 when neither is given); --runs: executions per target (both: whichever
# comes first). --jobs: build jobs (default
# $JOBS or the core count). New inputs go to build-fuzz/corpus/<target>/ (the seeds of
# tests/fuzz/corpus/<target>/ are read, never written); a crash is written to
# build-fuzz/crashes/<target>/ and ends that target's run: minimize it, fix the library, and add
# it to tests/fuzz/corpus/<target>/ (ctest replays that folder: fuzz_replay_<target>).
# --workers W: W libFuzzer processes per target (-jobs=W -workers=W, one corpus), --runs split
# among them, --seconds for each; their logs in build-fuzz/<target>-logs/. --prebuilt DIR: no
# build, DIR/fuzz_<target> run with DIR on LD_LIBRARY_PATH (a binary built here, carried to a
# machine with more cores with this machine's libsqlite3.so.0 beside it: docs/RELIABILITY.md).
# Exit status 1 if any target crashed. Environment: CLANGXX (default clang++-14), CLANG (clang-14).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

ALL_TARGETS=(cli_flags problem_config tuning_db python_arrays)
seconds=""
runs=""
workers=1
prebuilt=""
targets=()
while (($#)); do
  case "$1" in
    --seconds) seconds="$2"; shift 2 ;;
    --runs) runs="$2"; shift 2 ;;
    --jobs) JOBS="$2"; shift 2 ;;
    --workers) workers="$2"; shift 2 ;;
    --prebuilt) prebuilt="$(cd "$2" && pwd)"; shift 2 ;;
    -h | --help) sed -n '2,18p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) log "unknown option $1 (see --help)"; exit 2 ;;
    *) targets+=("$1"); shift ;;
  esac
done
((${#targets[@]})) || targets=("${ALL_TARGETS[@]}")
[[ -n "${seconds}${runs}" ]] || seconds=60
for target in "${targets[@]}"; do
  [[ " ${ALL_TARGETS[*]} " == *" ${target} "* ]] || {
    log "unknown target ${target}; allowed: ${ALL_TARGETS[*]}"
    exit 2
  }
done

FUZZ_DIR="${REPO_ROOT}/build-fuzz"
bin_dir="${FUZZ_DIR}/tests/fuzz"
if [[ -n "${prebuilt}" ]]; then
  bin_dir="${prebuilt}"
  export LD_LIBRARY_PATH="${prebuilt}${LD_LIBRARY_PATH:+:${LD_LIBRARY_PATH}}"
fi
if [[ -z "${prebuilt}" ]]; then
  CLANGXX="${CLANGXX:-clang++-14}"
  CLANG="${CLANG:-clang-14}"
  command -v "${CLANGXX}" >/dev/null || { log "ERROR: ${CLANGXX} not found (apt-get install clang-14)"; exit 1; }
  check_cuda_toolkit
  launcher=()
  command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
  sanitize="-fsanitize=address,undefined,fuzzer-no-link -fno-sanitize-recover=undefined"
  # The targets need no backend: CPU (LLVM) and HIP off keep the build small. --as-needed (Debian's
  # g++ default, not clang's): CUDA::nvrtc names the driver stub, which must not become a
  # dependency (libcuda is dlopen'ed; there is none on a machine without a GPU).
  log "configuring ${FUZZ_DIR} (clang, ${sanitize})"
  cmake -S "${REPO_ROOT}" -B "${FUZZ_DIR}" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_CXX_COMPILER="${CLANGXX}" -DCMAKE_C_COMPILER="${CLANG}" "${launcher[@]}" \
    -DCMAKE_CXX_FLAGS="${sanitize}" -DCMAKE_C_FLAGS="${sanitize}" \
    -DCMAKE_EXE_LINKER_FLAGS="-Wl,--as-needed" \
    -DCUDAToolkit_ROOT="${CUDA_HOME}" -DFLASHJIT_FUZZ=ON -DFLASHJIT_BUILD_TESTS=OFF \
    -DFLASHJIT_BUILD_BENCH=OFF -DFLASHJIT_CPU_BACKEND=OFF -DFLASHJIT_HIP_BACKEND=OFF >/dev/null
  cmake --build "${FUZZ_DIR}" -j "${JOBS}" --target "${targets[@]/#/fuzz_}"
fi

status=0
printf '%-15s %10s %9s %8s %8s\n' target execs exec/s corpus crashes
for target in "${targets[@]}"; do
  corpus="${FUZZ_DIR}/corpus/${target}"
  crashes="${FUZZ_DIR}/crashes/${target}"
  mkdir -p "${corpus}" "${crashes}"
  limit=()
  [[ -n "${seconds}" ]] && limit+=(-max_total_time="${seconds}")
  [[ -n "${runs}" ]] && limit+=(-runs="$(((runs + workers - 1) / workers))")
  log=${FUZZ_DIR}/${target}.log
  logs=("${log}")
  parallel=()
  if ((workers > 1)); then
    # Each job's output goes to fuzz-<N>.log in the working folder.
    rm -rf "${FUZZ_DIR}/${target}-logs" && mkdir -p "${FUZZ_DIR}/${target}-logs"
    parallel=(-jobs="${workers}" -workers="${workers}")
  fi
  rc=0
  # -timeout: an input that takes over 10 s is a hang (a finding); -rss_limit_mb: 2 GB.
  (if ((workers > 1)); then cd "${FUZZ_DIR}/${target}-logs"; fi
   "${bin_dir}/fuzz_${target}" "${limit[@]}" "${parallel[@]}" -timeout=10 -rss_limit_mb=2048 \
     -print_final_stats=1 -artifact_prefix="${crashes}/" "${corpus}" \
     "${REPO_ROOT}/tests/fuzz/corpus/${target}") >"${log}" 2>&1 || rc=$?
  ((workers > 1)) && logs=("${FUZZ_DIR}/${target}-logs"/fuzz-*.log)
  # Executions summed over the workers, and their speeds.
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "${logs[@]}" | awk '{ s += $1 } END { print s }')
  speed=$(sed -n 's/^stat::average_exec_per_sec: *//p' "${logs[@]}" | awk '{ s += $1 } END { print s }')
  found=$(find "${crashes}" -type f | wc -l)
  printf '%-15s %10s %9s %8s %8s\n' "${target}" "${execs:-?}" "${speed:-?}" \
    "$(find "${corpus}" -type f | wc -l)" "${found}"
  if ((rc != 0 || found > 0)); then
    status=1
    log "${target}: exit ${rc}; log ${log}; crashes in ${crashes}"
    grep -h -m3 -E 'ERROR|runtime error|invariant' "${logs[@]}" >&2 || true
  fi
done
exit "${status}"
