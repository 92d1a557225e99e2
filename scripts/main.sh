#!/usr/bin/env bash
# The main job: build flashjit, list devices, then time the kernel on a GPU, or, on a machine
# without one, plan, compile (NVRTC) and show the kernel for sm90.
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
else
  # No GPU (and no CPU backend yet): what can be done without one.
  step plan --arch sm90 --head-dim 128
  step compile --arch sm90 --head-dim 128
  printf '\n$ flashjit show --arch sm90 --head-dim 128 | head -60\n'
  # Captured first: head closing a pipe early would be a failure under pipefail.
  source_text="$("${flashjit}" show --arch sm90 --head-dim 128)"
  head -60 <<<"${source_text}"
fi
log "main job done in $((SECONDS - start)) s"
