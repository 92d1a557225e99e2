#!/usr/bin/env bash
# The main job: build flashjit, list devices, then time the kernel on a GPU; on a machine without
# one, tune a small grid on the CPU backend (Clang/LLVM JIT) and show a winner's source; without
# either, plan, compile (NVRTC) and show the kernel for sm90.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

start=${SECONDS}
install_build_tools
configure_and_build OFF --target flashjit_cli
log "build done in $((SECONDS - start)) s"

flashjit="${BUILD_DIR}/flashjit"
step() {
  printf '\n$ flashjit %s\n' "$*"
  "${flashjit}" "$@"
}

step --version
printf '\n$ flashjit devices\n'
devices_text="$("${flashjit}" devices)"
printf '%s\n' "${devices_text}"
if grep -q '^device 0: ' <<<"${devices_text}"; then
  # A usable GPU: time the d=128 bf16 forward at N=4096, non-causal and causal.
  step run --batch 2 --heads 16 --seqlen 4096 --head-dim 128 --dtype bf16
  step run --batch 2 --heads 16 --seqlen 4096 --head-dim 128 --dtype bf16 --causal
elif grep -q '^  fingerprint: cpu|' <<<"${devices_text}"; then
  # No GPU, but the CPU backend (Clang/LLVM JIT): tune a small grid on the CPU into a DB under
  # the build directory, list it, and show the generated source of one winner.
  db="${BUILD_DIR}/main-cpu-tuning.db"
  rm -f "${db}" "${db}-wal" "${db}-shm"
  step plan --backend cpu --head-dim 128
  step tune --backend cpu --db "${db}" --head-dims 64,128 --seqlens 256,512 --causal both \
    --batch 1 --heads 4 --min-time-ms 20 --retime-top 2
  step db ls --db "${db}"
  printf '\n$ FLASHJIT_DB=%s flashjit show --backend cpu --head-dim 128 --seqlen 512 --heads 4 \\\n' "${db}"
  printf '    --causal --config <winner> | head -60\n'
  winner="$(FLASHJIT_DB="${db}" FLASHJIT_LOG=1 FLASHJIT_BACKEND=cpu "${flashjit}" run \
    --head-dim 128 --seqlen 512 --batch 1 --heads 4 --causal --reps 3 2>&1 |
    sed -n 's/.* -> \(m[0-9]*n[0-9]*w1s1\) .*/\1/p' | head -1)"
  source_text="$("${flashjit}" show --backend cpu --head-dim 128 --seqlen 512 --heads 4 --causal \
    ${winner:+--config "${winner}"})"
  head -60 <<<"${source_text}"
else
  # No GPU and no CPU backend: what can be done without one.
  step plan --arch sm90 --head-dim 128
  step compile --arch sm90 --head-dim 128
  printf '\n$ flashjit show --arch sm90 --head-dim 128 | head -60\n'
  # Captured first: head closing a pipe early would be a failure under pipefail.
  source_text="$("${flashjit}" show --arch sm90 --head-dim 128)"
  head -60 <<<"${source_text}"
fi
log "main job done in $((SECONDS - start)) s"
