#!/usr/bin/env bash
# One run on the GPU machine, from the repository root:
#
#   bench/device_run.sh MODE [CTEST_REGEX or a gtest filter]
#
# MODE: tests gpu-tests bench tune all ws ws-tests ws-bench ws-sanitize sanitize sanitize-cases
# decode variants bmask owed bwd-quick bwd-ws concurrent concurrent3 py py-tests py-bench py-torch
# py-adapters py-ring. What each does, how long it takes, its environment variables (BENCH_ARGS,
# DTYPES, PASSES, RING_LENGTHS, ...) and the files it leaves in $OUT: docs/DEVICE_RUN.md.

set -euo pipefail

what="${1:-all}"
DTYPES="${DTYPES:-bf16}"
ctest_regex="${2:-}"
case "$what" in
  tests|gpu-tests|bench|tune|all|ws|ws-tests|ws-bench|ws-sanitize|sanitize|sanitize-cases|py|py-tests|py-bench|py-torch|py-adapters|py-ring|decode|concurrent|concurrent3|variants|bmask|owed|bwd-quick|bwd-ws) ;;
  *) echo "usage: bench/device_run.sh [tests|gpu-tests|bench|tune|all|ws|ws-tests|ws-bench|" \
       "ws-sanitize|sanitize|sanitize-cases|decode|concurrent|concurrent3|variants|bmask|owed|bwd-quick|bwd-ws|py|py-tests|py-bench|py-torch|py-adapters|py-ring] [CTEST_REGEX]" >&2
     exit 2 ;;
esac

# sanitize_cases FLASHJIT: the compute-sanitizer sweep's runs, one line each: TOOL NAME FLAGS...
# (the flags of `flashjit run`), configs picked from FLASHJIT's plans for sm90.
sanitize_cases() {
  local flashjit=$1
  local small="--batch 1 --heads 4 --seqlen 300"
  local variant="--causal --window 100,-1 --softcap 30 --alibi"
  local docs="--heads 4 --docs 100,1,17,300"  # a 1-key document, partial tiles
  local decode="--batch 3 --heads 8 --kv-heads 2 --seqlen-q 1 --seqlen-k 3000"
  local bwd_gqa="--batch 1 --heads 28 --kv-heads 14 --seqlen-q 100 --seqlen-k 1200"
  first_legal() {  # first_legal PLAN SUFFIX_REGEX: the first legal config whose suffix matches
    awk -v re="$2" '$NF == "legal" && $1 ~ /^m[0-9]+n[0-9]+w[0-9]+s[0-9]+/ {
      name = $1; sub(/^m[0-9]+n[0-9]+w[0-9]+s[0-9]+/, "", name); if (name ~ re) { print $1; exit } }' <<<"$1"
  }
  for d in 64 128 256; do
    local plan="$flashjit plan --arch sm90 --head-dim $d"
    local fwd_plan bwd_plan docs_plan var_plan bwd_var_plan decode_plan
    fwd_plan=$($plan)
    bwd_plan=$($plan --pass bwd)
    docs_plan=$($plan $docs)
    var_plan=$($plan $small $variant)
    bwd_var_plan=$($plan --pass bwd $small $variant)
    decode_plan=$($plan $decode)
    local mma wgmma ws bwd_mma bwd_wgmma docs_mma docs_wgmma var_wgmma var_ws bwd_var_mma
    local bwd_var_wgmma decode_tile
    mma=$(first_legal "$fwd_plan" '^$')
    wgmma=$(first_legal "$fwd_plan" '^-wgmma$')
    ws=$(sed -n 's/^-ws tile: \([^ ]*\).*/\1/p' <<<"$fwd_plan")
    bwd_mma=$(first_legal "$bwd_plan" '^(-[a-z]+)?$')
    bwd_wgmma=$(first_legal "$bwd_plan" '^-wgmma')
    docs_mma=$(first_legal "$docs_plan" '^$')
    docs_wgmma=$(first_legal "$docs_plan" '^-wgmma$')
    var_wgmma=$(first_legal "$var_plan" '^-wgmma$')
    var_ws=$(first_legal "$var_plan" '^-ws$')
    bwd_var_mma=$(first_legal "$bwd_var_plan" '^$')
    bwd_var_wgmma=$(first_legal "$bwd_var_plan" '^-wgmma$')
    decode_tile=$(first_legal "$decode_plan" '^-decode$')
    local docs_ws docs_bwd_plan docs_bwd_mma docs_bwd_wgmma
    docs_ws=$(first_legal "$docs_plan" '^-ws$')
    docs_bwd_plan=$($plan --pass bwd $docs)
    docs_bwd_mma=$(first_legal "$docs_bwd_plan" '^$')
    docs_bwd_wgmma=$(first_legal "$docs_bwd_plan" '^-wgmma')
    local bwd_ws
    bwd_ws=$(first_legal "$bwd_plan" '^-ws$')  # the fused ws backward (plain problems, d <= 128)
    for causal in "" --causal; do
      tag="d$d${causal:+-causal}"
      for tool in memcheck racecheck synccheck; do
        [[ -n "$mma" ]] && echo "$tool fwd-mma-$tag --config $mma --head-dim $d $small $causal"
        [[ -n "$wgmma" ]] && echo "$tool fwd-wgmma-$tag --config $wgmma --head-dim $d $small $causal"
        # 18 heads x 1000 rows: more tiles than 132 SMs, so persistent CTAs walk two.
        [[ -n "$ws" ]] && echo "$tool fwd-ws-$tag --config $ws --head-dim $d --batch 1 --heads 18 --seqlen 1000 $causal"
        [[ -n "$ws" ]] && echo "$tool fwd-ws-pp-persist-$tag --config $ws-pp-persist --head-dim $d --batch 1 --heads 18 --seqlen 1000 $causal"
        [[ -n "$bwd_mma" ]] && echo "$tool bwd-mma-$tag --pass bwd --config $bwd_mma --head-dim $d $small $causal"
        [[ -n "$bwd_wgmma" ]] && echo "$tool bwd-wgmma-$tag --pass bwd --config $bwd_wgmma --head-dim $d $small $causal"
        [[ -n "$docs_mma" ]] && echo "$tool fwd-mma-docs-$tag --config $docs_mma --head-dim $d $docs $causal"
        [[ -n "$docs_wgmma" ]] && echo "$tool fwd-wgmma-docs-$tag --config $docs_wgmma --head-dim $d $docs $causal"
        # GQA, ragged (partial query and key tiles): 14 kv heads x 10 key tiles, more than 132 SMs:
        # -persist CTAs walk two; few query rows keep racecheck short.
        for c in ${bwd_ws:+$bwd_ws $bwd_ws-persist}; do
          echo "$tool bwd-${c#*-}-$tag --pass bwd --config $c --head-dim $d $bwd_gqa $causal"
        done
      done
    done
    for tool in memcheck racecheck synccheck; do
      # Auto splits: 32 for this shape (the plan's splits(auto)); then 4 splits, paged and not.
      echo "$tool decode-paged-d$d --head-dim $d $decode --page-size 64"
      echo "$tool decode-paged-split4-d$d --head-dim $d $decode --page-size 64 --splits 4"
      # The table check kernel before the decode (run_case sets FLASHJIT_CHECK_TABLES=1 for
      # names with "-checked").
      echo "$tool decode-paged-checked-d$d --head-dim $d $decode --page-size 64"
      [[ -n "$decode_tile" ]] && echo "$tool decode-split4-d$d --config $decode_tile --head-dim $d $decode --splits 4"
      echo "$tool fwd-mma-variant-d$d --config $mma --head-dim $d $small $variant"
      [[ -n "$var_wgmma" ]] && echo "$tool fwd-wgmma-variant-d$d --config $var_wgmma --head-dim $d $small $variant"
      [[ -n "$var_ws" ]] && echo "$tool fwd-ws-variant-d$d --config $var_ws --head-dim $d --batch 1 --heads 18 --seqlen 1000 $variant"
      [[ -n "$bwd_var_mma" ]] && echo "$tool bwd-mma-variant-d$d --pass bwd --config $bwd_var_mma --head-dim $d $small $variant"
      [[ -n "$bwd_var_wgmma" ]] && echo "$tool bwd-wgmma-variant-d$d --pass bwd --config $bwd_var_wgmma --head-dim $d $small $variant"
      # Packed documents on the -ws forward and in the backward (both families), causal.
      [[ -n "$docs_ws" ]] && echo "$tool fwd-ws-docs-d$d --config $docs_ws --head-dim $d $docs --causal"
      [[ -n "$docs_bwd_mma" ]] && echo "$tool bwd-mma-docs-d$d --pass bwd --config $docs_bwd_mma --head-dim $d $docs --causal"
      [[ -n "$docs_bwd_wgmma" ]] && echo "$tool bwd-wgmma-docs-d$d --pass bwd --config $docs_bwd_wgmma --head-dim $d $docs --causal"
    done
    :  # a family without a legal config is no error (set -e, pipefail)
  done | sed 's/ *$//'  # xargs -L continues a line that ends in a blank
}

[[ "$what" == sanitize-cases ]] && { sanitize_cases "${FLASHJIT:-build-device/flashjit}"; exit 0; }

export PYTHONUNBUFFERED=1
OUT="${OUT:-$PWD/device-out}"
mkdir -p "$OUT"
# Compiled kernels survive between test processes and the benchmark within this machine's life.
export FLASHJIT_CACHE_DIR="$PWD/build-device/kcache"
# Tuning results of this run stay in the build folder, not in the machine's home.
export FLASHJIT_DB="$PWD/build-device/tuning.db"
# GPU tests fail instead of skipping when the GPU cannot be used here.
export FLASHJIT_EXPECT_GPU=1

echo "== device"
nvidia-smi -L || echo "nvidia-smi failed"
# COMMIT (set by the caller) wins: the device copy's .git may lag behind its working tree.
commit="${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || true)}"
echo "== commit ${commit:-${COMMIT:-unknown}}"
echo "== $(nproc) cores, $(cmake --version | head -1)"

cmake_args=(-DCMAKE_BUILD_TYPE=Release -DFLASHJIT_BUILD_TESTS=ON -DFLASHJIT_BUILD_BENCH=ON)
# The GPU machines have libsqlite3.so.0 but no sqlite3.h: use the header carried in .deps/sqlite
# (on the dev machine: mkdir -p .deps/sqlite && cp /usr/include/sqlite3.h .deps/sqlite/; then
# name .deps in the device tool's carry list).
if [[ ! -f /usr/include/sqlite3.h && -f .deps/sqlite/sqlite3.h ]]; then
  cmake_args+=(-DFLASHJIT_SQLITE3_INCLUDE_DIR="$PWD/.deps/sqlite")
fi

# step LOG NAME SECONDS COMMAND...: runs COMMAND under `timeout` with FLASHJIT_EXPECT_GPU=1, its
# output in $OUT/LOG-NAME.log, and one line "PASSED|FAILED (exit N) NAME in S s: <gtest/pytest
# summary>" in $OUT/LOG.log; a failure sets status=1.
step() {
  local log=$1 name=$2 limit=$3 step_start=$SECONDS verdict
  shift 3
  if FLASHJIT_EXPECT_GPU=1 timeout "$limit" "$@" >"$OUT/$log-$name.log" 2>&1; then
    verdict=PASSED
  else
    verdict="FAILED (exit $?)"
    status=1
  fi
  echo "$verdict $name in $((SECONDS - step_start)) s: $(grep -E '^\[  (PASSED|FAILED|SKIPPED) |[0-9]+ (passed|failed)' \
      "$OUT/$log-$name.log" | tail -n 3 | tr '\n' ' ')" | tee -a "$OUT/$log.log"
}

status=0
start=$SECONDS
if [[ "$what" != py* ]]; then
  echo "== configure + build (Release, build-device/)"
  cmake -S . -B build-device "${cmake_args[@]}" 2>&1 | tail -n 5
  targets=()
  if [[ "$what" == ws* ]]; then
    targets=(--target runtime_cuda_tma_probe_test runtime_cuda_wgmma_probe_test
             runtime_cuda_attention_test templates_cuda_compile_test bench_attention flashjit_cli)
  fi
  if [[ "$what" == decode ]]; then
    targets=(--target runtime_cuda_decode_test runtime_decode_table_check_test decode_bench)
  fi
  if [[ "$what" == concurrent* || "$what" == sanitize ]]; then
    targets=(--target flashjit_cli)
  fi
  if [[ "$what" == variants ]]; then
    targets=(--target runtime_cuda_variant_test)
  fi
  if [[ "$what" == bmask ]]; then
    targets=(--target runtime_cuda_block_mask_test templates_cuda_block_mask_compile_test
             runtime_cuda_variant_test flashjit_cli)
  fi
  if [[ "$what" == bwd-quick || "$what" == bwd-ws ]]; then
    targets=(--target flashjit_cli runtime_cuda_backward_test)
  fi
  if [[ "$what" == owed ]]; then
    targets=(--target flashjit_cli runtime_cuda_variant_test runtime_cuda_backward_variant_test
             tuner_variant_functions_test runtime_host_compiler_test)
  fi
  if ! cmake --build build-device -j16 "${targets[@]}" >build-device/build.log 2>&1; then
    tail -n 80 build-device/build.log
    echo "== build FAILED"
    exit 1
  fi
  grep -E 'warning:' build-device/build.log | sort -u | head -n 20 || true
  echo "== built in $((SECONDS - start)) s"
fi

if [[ "$what" == py* || "$what" == variants || "$what" == owed ||
      ( "$what" == bmask && " ${BMASK_PARTS:-bench} " == *" bench "* ) ]]; then
  # The Python module, installed into a folder of its own (not the system's site-packages, which
  # Ubuntu marks externally managed): PYTHONPATH points there for every later step. CMake finds
  # .deps/sqlite by itself (CMakeLists.txt) when /usr/include/sqlite3.h is missing.
  py="${PYTHON:-python3}"
  pysite="$PWD/build-device/pysite"
  export PYTHONPATH="$pysite${PYTHONPATH:+:$PYTHONPATH}"
  echo "== python: $("$py" --version 2>&1), $(command -v "$py")"
  "$py" - <<'PYCHECK' || { echo "== python prerequisites missing"; exit 1; }
import importlib.util, os, sysconfig, sys
missing = [m for m in ("nanobind", "scikit_build_core", "torch", "numpy", "pytest")
           if importlib.util.find_spec(m) is None]
header = os.path.join(sysconfig.get_paths()["include"], "Python.h")
if not os.path.exists(header):
    missing.append("Python.h (" + header + "; python3-dev)")
print("   missing: " + ", ".join(missing) if missing else "   nanobind, scikit-build-core, torch,"
      " numpy, pytest and Python.h present")
sys.exit(1 if missing else 0)
PYCHECK
  echo "== pip install --no-build-isolation --target build-device/pysite ."
  mkdir -p build-device
  if ! CMAKE_BUILD_PARALLEL_LEVEL=16 "$py" -m pip install --no-build-isolation --no-deps \
      --upgrade --target "$pysite" -v . >"$OUT/pip.log" 2>&1; then
    tail -n 60 "$OUT/pip.log"
    echo "== pip install FAILED (full log: pip.log)"
    exit 1
  fi
  grep -E 'warning:' "$OUT/pip.log" | sort -u | head -n 20 || true
  if ! (cd / && "$py" -c "import flashjit, json; print('   flashjit', flashjit.__version__,
'from', flashjit.__file__); print('   devices:', json.dumps([d.get('name') for d in
flashjit.devices()]))"); then
    echo "== import flashjit FAILED"
    exit 1
  fi
  echo "== installed in $((SECONDS - start)) s"
fi

if [[ "$what" == py || "$what" == py-tests ]]; then
  echo "== python tests (GPU)"
  # shellcheck disable=SC2086  # PYTEST_ARGS is a list of flags
  if ! "$py" -m pytest -q -rs tests/python ${PYTEST_ARGS:-} 2>&1 | tee "$OUT/pytest.log"; then
    status=1
    echo "== python tests FAILED"
  fi
  echo "== python tests done at $((SECONDS - start)) s"
fi

if [[ "$what" == py || "$what" == py-bench ]]; then
  echo "== flashjit.tune(): the standard grid, bf16 and fp16, passes ${PASSES:-fwd,bwd} (what the DB lacks)"
  tune_start=$SECONDS
  if ! PASSES="${PASSES:-fwd,bwd}" "$py" - "$OUT/tune.json" <<'PYTUNE' 2>&1 | tee "$OUT/tune.log"; then
import json, os, sys
import flashjit
report = flashjit.tune(dtypes=["bf16", "fp16"], passes=os.environ["PASSES"].split(","))
with open(sys.argv[1], "w") as f:
    json.dump(report, f, indent=1)
PYTUNE
    status=1
    echo "== flashjit.tune FAILED"
  fi
  echo "== tune took $((SECONDS - tune_start)) s"
  echo "== side_by_side.py (flashjit tuned + default vs torch SDPA flash + cuDNN)"
  # shellcheck disable=SC2086
  if ! COMMIT="${commit:-${COMMIT:-unknown}}" "$py" bench/side_by_side.py --out-dir "$OUT/perf" \
      ${BENCH_ARGS:-} 2>&1 | tee "$OUT/side_by_side.log"; then
    status=1
    echo "== side_by_side.py FAILED"
  fi
  echo "== py-bench done at $((SECONDS - start)) s"
fi

if [[ "$what" == py-adapters ]]; then
  if ! "$py" -c "import transformers" 2>/dev/null; then
    if compgen -G ".deps/hf-wheels/*.whl" >/dev/null; then
      echo "== transformers from .deps/hf-wheels into build-device/hfsite"
      "$py" -m pip install -q --disable-pip-version-check --no-index --no-deps --upgrade \
        --target build-device/hfsite .deps/hf-wheels/*.whl >"$OUT/hf-pip.log" 2>&1 ||
        { tail -n 20 "$OUT/hf-pip.log"; echo "== transformers install FAILED"; status=1; }
      export PYTHONPATH="$PWD/build-device/hfsite:$PYTHONPATH"
    else
      echo "== transformers does not import and .deps/hf-wheels is empty: run" \
        "scripts/hf_wheels.sh and carry .deps/hf-wheels (test_hf*.py will skip)"
    fi
  fi
  "$py" -c "import transformers; print('   transformers', transformers.__version__)" || true
  # ADAPTER_PARTS: a subset of "tests generate reference profile" (default: all four).
  parts=" ${ADAPTER_PARTS:-tests generate reference profile} "
  # Issue 32's questions: bf16 greedy tokens of both against an fp32 reference (with the padding
  # of HF_PAD, then none: flashjit's dense path), and where the tokens/s go (bench/hf_profile.py).
  hf_shape="${HF_SHAPE:---preset medium --batch 8 --prompt-len 512 --new-tokens 64}"
  if [[ "$parts" == *" tests "* ]]; then
    echo "== flash_attn and transformers adapters, pytest -k cuda (bf16)"
    # shellcheck disable=SC2086  # PYTEST_ARGS is a list of flags
    if ! FLASHJIT_EXPECT_GPU=1 timeout 300 "$py" -m pytest -q -rs -k cuda \
        tests/python/test_flash_attn.py tests/python/test_hf.py tests/python/test_hf_generate.py \
        tests/python/test_hf_reference.py ${PYTEST_ARGS:-} 2>&1 |
        tee "$OUT/adapters-pytest.log"; then
      status=1
      echo "== adapter tests FAILED (or ran past 300 s)"
    fi
  fi
  if [[ "$parts" == *" generate "* ]]; then
    echo "== examples/hf_generate.py --device cuda"
    # shellcheck disable=SC2086  # HF_ARGS is a list of flags
    if ! timeout 240 "$py" examples/hf_generate.py --device cuda \
        ${HF_ARGS:---preset medium --batch 8 --prompt-len 512 --new-tokens 64 --pad 0,37,5,0} \
        --json "$OUT/hf-generate-cuda.json" 2>&1 | tee "$OUT/hf-generate.log"; then
      status=1
      echo "== hf_generate.py FAILED"
    fi
  fi
  if [[ "$parts" == *" reference "* ]]; then
    for pads in "${HF_PAD:-0,37,5,0}" 0; do
      echo "== examples/hf_reference.py --device cuda --pad $pads (bf16 vs an fp32 reference)"
      # shellcheck disable=SC2086  # HF_SHAPE is a list of flags
      if ! timeout 240 "$py" examples/hf_reference.py --device cuda $hf_shape --pad "$pads" \
          --json "$OUT/hf-reference-pad${pads//,/-}.json" 2>&1 |
          tee "$OUT/hf-reference-pad${pads//,/-}.log"; then
        status=1
        echo "== hf_reference.py FAILED (--pad $pads)"
      fi
    done
  fi
  if [[ "$parts" == *" profile "* ]]; then
    echo "== bench/hf_profile.py --device cuda (tokens/s cold and warm, prefill / decode, kernels)"
    # shellcheck disable=SC2086  # HF_SHAPE is a list of flags; USDT lines: the profiler's chatter
    if ! timeout 360 "$py" bench/hf_profile.py --device cuda $hf_shape --pad "${HF_PAD:-0,37,5,0}" \
        --json "$OUT/hf-profile.json" 2>&1 | grep --line-buffered -v '^USDT:' |
        tee "$OUT/hf-profile.log"; then
      status=1
      echo "== hf_profile.py FAILED"
    fi
  fi
  echo "== py-adapters done at $((SECONDS - start)) s"
fi

if [[ "$what" == py-torch ]]; then
  parts=" ${TORCH_PARTS:-tests host train} "
  if [[ "$parts" == *" tests "* ]]; then
    echo "== PyTorch integration tests (GPU)"
    # shellcheck disable=SC2086  # PYTEST_ARGS is a list of flags
    if ! timeout 330 "$py" -m pytest -q -rs tests/python/test_torch_gpu.py \
        tests/python/test_train_gpt.py ${PYTEST_ARGS:-} 2>&1 | tee "$OUT/pytest.log"; then
      status=1
      echo "== PyTorch tests FAILED (or ran past 330 s)"
    fi
    echo "== tests done at $((SECONDS - start)) s"
  fi
  if [[ "$parts" == *" host "* ]]; then
    echo "== bench/host_overhead.py (host us/call on the GPU)"
    if ! COMMIT="${commit:-unknown}" timeout 120 "$py" bench/host_overhead.py --device cuda \
        --json "$OUT/host_overhead.json" 2>&1 | tee "$OUT/host_overhead.log"; then
      status=1
      echo "== host_overhead.py FAILED"
    fi
  fi
  jsons=()
  for compile in "" --compile; do
    [[ "$parts" == *" train "* ]] || break
    name="train-gpt-cuda${compile:+-compile}"
    echo "== examples/train_gpt.py --device cuda --attn both ${compile} (nano, 200 steps)"
    # shellcheck disable=SC2086  # TRAIN_ARGS is a list of flags
    if COMMIT="${commit:-unknown}" timeout 240 "$py" examples/train_gpt.py --device cuda \
        --attn both --steps 200 $compile --json "$OUT/$name.json" ${TRAIN_ARGS:-} 2>&1 |
        tee "$OUT/$name.log"; then
      jsons+=("$OUT/$name.json")
    else
      status=1
      echo "== train_gpt.py ${compile} FAILED"
    fi
    echo "== at $((SECONDS - start)) s"
  done
  if ((${#jsons[@]})); then
    "$py" examples/train_gpt_report.py docs/perf/train-gpt-cpu*.json "${jsons[@]}" \
      --svg "$OUT/train-gpt.svg" --svg-link perf/train-gpt.svg \
      --markdown "$OUT/train-gpt-report.md" || status=1
  fi
fi

if [[ "$what" == py-ring ]]; then
  gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
  echo "== ring attention: ${gpus} GPUs"
  if ! timeout 300 "$py" -m pytest -q -rs tests/python/test_ring_attention.py -k "nccl or plan" \
      2>&1 | tee "$OUT/pytest-ring.log"; then
    status=1
    echo "== ring attention NCCL test FAILED"
  fi
  for ranks in 1 2 4; do
    ((ranks <= gpus)) || break
    lengths=${RING_LENGTHS:-32k,64k,128k,256k}
    ((ranks == 1)) && lengths=${RING_LENGTHS_1:-32k,64k,128k}
    echo "== bench/ring_bench.py on ${ranks} GPU(s), N ${lengths}"
    # shellcheck disable=SC2086  # RING_ARGS is a list of flags
    if ! COMMIT="${commit:-unknown}" timeout 420 "$py" -m torch.distributed.run --standalone \
        --nproc-per-node "$ranks" bench/ring_bench.py --seqlens "$lengths" \
        --json "$OUT/ring-${ranks}gpu.json" ${RING_ARGS:-} 2>&1 | tee "$OUT/ring-${ranks}gpu.log"; then
      status=1
      echo "== ring_bench.py on ${ranks} GPU(s) FAILED"
    fi
    echo "== at $((SECONDS - start)) s"
  done
fi

if [[ "$what" == tests || "$what" == all ]]; then
  echo "== ctest"
  ctest_args=(--test-dir build-device --output-on-failure -j1)
  if [[ -n "$ctest_regex" ]]; then ctest_args+=(-R "$ctest_regex"); fi
  if ! ctest "${ctest_args[@]}" 2>&1 | tee "$OUT/ctest.log"; then
    status=1
    echo "== ctest FAILED"
  fi
  echo "== tests done at $((SECONDS - start)) s"
fi

if [[ "$what" == concurrent* ]]; then
  # concurrent3: three rounds of 4 concurrent tuners in a row between the two lone runs (~7
  # minutes on an H100/H200: lone ~30 s, a round ~110 s), each round judged against them.
  rounds=1
  [[ "$what" == concurrent3 ]] && rounds=3
  echo "== concurrent tuners vs a lone one (bench/concurrent_tune.py, $rounds round(s))"
  # A round that would not fit in 530 s (the device tool's 10-minute call, less the build) is
  # skipped and reported as such, not cut off mid-way.
  if ! timeout 570 "${PYTHON:-python3}" bench/concurrent_tune.py --flashjit build-device/flashjit \
      --backend cuda --rounds "$rounds" --budget-s 530 --out "$OUT"; then
    status=1
    echo "== concurrent tuners FAILED (or ran past its time limit)"
  fi
  rm -rf "$OUT/locks" "$OUT"/*.db
fi

if [[ "$what" == decode ]]; then
  echo "== decode GPU tests (runtime_cuda_decode_test${ctest_regex:+, filter $ctest_regex})"
  if ! timeout 300 build-device/tests/runtime_cuda_decode_test ${ctest_regex:+--gtest_filter="$ctest_regex"} \
      >"$OUT/decode-tests.log" 2>&1; then
    status=1
    echo "== decode tests FAILED"
  fi
  grep -E '^\[ *(OK|FAILED|SKIPPED) *\]|runs \(|Failure' "$OUT/decode-tests.log" | head -n 60 || true
  # The decode table check (issue 33): a checked call (and graph capture) on good tables, the
  # check kernel's trap on each kind of bad entry (in child processes).
  echo "== decode table check GPU tests (runtime_decode_table_check_test)"
  if ! FLASHJIT_EXPECT_GPU=1 timeout 180 build-device/tests/runtime_decode_table_check_test \
      >"$OUT/decode-table-check-tests.log" 2>&1; then
    status=1
    echo "== decode table check tests FAILED"
  fi
  grep -E '^\[ *(OK|FAILED|SKIPPED) *\]|Failure' "$OUT/decode-table-check-tests.log" | head -n 30 || true
  echo "== decode tests done at $((SECONDS - start)) s"
  echo "== decode_bench.py (flashjit contiguous + paged vs torch SDPA flash + cuDNN, same run)"
  # shellcheck disable=SC2086  # BENCH_ARGS is a list of flags
  if ! COMMIT="${commit:-unknown}" timeout 360 "${PYTHON:-python3}" bench/decode_bench.py \
      --bench build-device/bench/decode_bench --out-dir "$OUT" ${BENCH_ARGS:-} \
      2>&1 | tee "$OUT/decode-bench.log"; then
    status=1
    echo "== decode bench FAILED"
  fi
  echo "== decode done at $((SECONDS - start)) s"
fi

if [[ "$what" == variants ]]; then
  echo "== variant GPU tests (runtime_cuda_variant_test${ctest_regex:+, filter $ctest_regex})"
  # ~270 s on an H100 (ce92b31, mma + wgmma + -ws configs; NVRTC compiles dominate).
  if ! timeout 400 build-device/tests/runtime_cuda_variant_test \
      ${ctest_regex:+--gtest_filter="$ctest_regex"} >"$OUT/variants-tests.log" 2>&1; then
    status=1
    echo "== variant tests FAILED"
  fi
  grep -E '^\[ *(OK|FAILED|SKIPPED|PASSED) *\]|Failure' "$OUT/variants-tests.log" | tail -n 40 || true
  echo "== variant tests done at $((SECONDS - start)) s"
  echo "== variants_bench.py (flashjit vs torch.compile'd FlexAttention and torch SDPA, same run)"
  # shellcheck disable=SC2086  # BENCH_ARGS is a list of flags
  if ! COMMIT="${commit:-unknown}" timeout "${BENCH_TIMEOUT:-300}" "$py" bench/variants_bench.py --out-dir "$OUT" \
      ${BENCH_ARGS:-} 2>&1 | tee "$OUT/variants-bench.log"; then
    status=1
    echo "== variants bench FAILED"
  fi
  echo "== variants done at $((SECONDS - start)) s"
fi

if [[ "$what" == bmask ]]; then
  # Block maps of a mask_mod (issue 31): tests, each map's tiles and build time, the bench.
  echo "== block-map tests (bmask.log; 2nd argument: the variant tests' filter; BMASK_PARTS)"
  : >"$OUT/bmask.log"
  parts=" ${BMASK_PARTS:-compile gpu run bench} "
  [[ $parts == *" compile "* ]] &&
    step bmask compile 300 build-device/tests/templates_cuda_block_mask_compile_test
  if [[ $parts == *" gpu "* ]]; then
    step bmask gpu 600 build-device/tests/runtime_cuda_block_mask_test
    step bmask variants 600 build-device/tests/runtime_cuda_variant_test \
      --gtest_filter="${ctest_regex:-*mask_mod*:*HiddenKeyBlocks*}"
  fi
  cat "$OUT/bmask.log"
  echo "== flashjit run: the 2048-token documents as a mask_mod, the map's tiles and build time"
  for n in 8192 16384; do
    [[ $parts == *" run "* ]] || break
    for config in "" m128n128w8s2 m128n128w12s2-ws; do
      build-device/flashjit run --causal --seqlen "$n" --batch $((16384 / n)) --heads 16 \
        --mask-mod '(q_idx / 2048) == (kv_idx / 2048)' ${config:+--config "$config"} 2>&1 |
        grep -E '^(problem|config|time|speed|blockmap)|rror' | tee -a "$OUT/bmask-run.log" || true
    done
  done
  echo "== variants_bench.py --backward: documents as mask_mods vs FlexAttention (same run)"
  # shellcheck disable=SC2086  # BENCH_ARGS is a list of flags
  if [[ $parts == *" bench "* ]] &&
    ! COMMIT="${commit:-unknown}" timeout "${BENCH_TIMEOUT:-600}" "$py" bench/variants_bench.py \
      --out-dir "$OUT" --backward --cases documents2048,documents-random,documents-varlen \
      --try-configs m128n128w8s2,m128n64w8s2,m128n128w12s2-ws ${BENCH_ARGS:-} 2>&1 |
      tee "$OUT/variants-bench.log"; then
    status=1
    echo "== bmask bench FAILED"
  fi
  echo "== bmask done at $((SECONDS - start)) s"
fi

if [[ "$what" == owed ]]; then
  echo "== GPU runs owed by changes tested without a GPU (owed.log)"
  : >"$OUT/owed.log"
  owed_step() {  # the steps whose names match the second argument (a bash regex; default: all)
    if [[ -n "$ctest_regex" && ! "$2" =~ $ctest_regex ]]; then
      echo "skipped $2 (not in '$ctest_regex')" | tee -a "$OUT/owed.log"
      return 0
    fi
    step "$@"
  }
  owed_step owed host-compiler-tests 120 bash -c 'build-device/tests/tuner_variant_functions_test &&
      build-device/tests/runtime_host_compiler_test'
  owed_step owed tune-score-mod 240 build-device/flashjit tune --backend cuda --pass fwd,bwd \
      --head-dims 64 --seqlens 1000 --causal on --batch 1 --heads 4 \
      --score-mod 'score - 0.1f * abs(q_idx - kv_idx)' --mask-mod '(kv_idx % 5) != 1 || q_idx < 8' \
      --score-mod-grad '1.0f' --db "$OUT/owed-tune.db"
  owed_step owed varlen-torch-compile 240 "$py" -m pytest -q -rs tests/python/test_varlen_torch.py \
      tests/python/test_variants_backward_torch.py -k "cuda and (varlen or documents)"
  owed_step owed variant-forward 300 build-device/tests/runtime_cuda_variant_test \
      --gtest_filter='Cases/CudaVariant.*:CudaVariantBlocks.*'
  owed_step owed variant-backward 450 build-device/tests/runtime_cuda_backward_variant_test \
      --gtest_filter='Cases/CudaBackwardVariant.*:CudaBackwardVariantBlocks.*:CudaBackwardVarlen.*'
  echo "== owed done at $((SECONDS - start)) s"
fi

if [[ "$what" == bwd-quick ]]; then
  echo "== the wgmma backward in a few minutes (bwd-quick.log): every legal wgmma config of d 128"
  echo "   bf16 causal and d 64 bf16 non-causal against the fp64 reference (a second argument"
  echo "   replaces that gtest filter), then \`flashjit run --pass bwd\` of the Atomic (bulk dQ)"
  echo "   and -det tiles at d 128 bf16, N 8192, B x H = 2 x 16, causal and not"
  : >"$OUT/bwd-quick.log"
  step bwd-quick all-configs 240 env FLASHJIT_TEST_FAMILIES=wgmma \
      build-device/tests/runtime_cuda_backward_test --gtest_filter="${ctest_regex:-AllGroups/CudaBackwardAllConfigs.*/d128_bf16_causal:AllGroups/CudaBackwardAllConfigs.*/d64_bf16_noncausal}"
  for causal in --causal ""; do
    for config in m64n128w8s2-wgmma m64n128w8s2-wgmma-det m64n64w4s2-wgmma-det; do
      step bwd-quick "run-$config${causal:+-causal}" 60 build-device/flashjit run --backend cuda \
          --pass bwd --batch 2 --heads 16 --seqlen 8192 --head-dim 128 $causal --config "$config"
      grep -E "backward|ms" "$OUT/bwd-quick-run-$config${causal:+-causal}.log" | head -n 4 |
          sed "s/^/   $config${causal:+ causal}: /" | tee -a "$OUT/bwd-quick.log"
    done
  done
  echo "== bwd-quick done at $((SECONDS - start)) s"
fi

if [[ "$what" == bwd-ws ]]; then
  echo "== the ws fused backward (bwd-ws.log; BWD_WS_DIMS, BWD_WS_STEPS: docs/DEVICE_RUN.md)"
  : >"$OUT/bwd-ws.log"
  parts=" ${BWD_WS_STEPS:-tests sanitize time} "
  [[ $parts == *" tests "* ]] && step bwd-ws all-configs 300 env FLASHJIT_TEST_FAMILIES=ws \
      build-device/tests/runtime_cuda_backward_test \
      --gtest_filter="${ctest_regex:-AllGroups/CudaBackwardAllConfigs.*/d128_*:AllGroups/CudaBackwardAllConfigs.*/d64_*}"
  for d in 128 64; do
    [[ $parts == *" sanitize "* ]] || break
    small="--batch 1 --heads 4 --kv-heads 2 --seqlen-q 300 --seqlen-k 257 --head-dim $d --causal"
    for tool in racecheck synccheck memcheck; do
      config=m64n128w12s2-ws-pp
      [[ $d == 64 ]] && config=m64n128w12s2-ws-pp-persist
      step bwd-ws "sanitize-$tool-d$d-$config" 120 compute-sanitizer --tool "$tool" \
          --error-exitcode 1 build-device/flashjit run --backend cuda --pass bwd $small \
          --config "$config" --reps 2
    done
  done
  shapes=("2 16 8192 --causal" "2 16 8192" "1 16 16384")
  peers=()
  for d in ${BWD_WS_DIMS:-64 128}; do
    [[ $parts == *" time "* ]] || break
    configs=(m64n128w12s2-ws m64n128w12s2-ws-pp)
    [[ $d == 64 ]] && configs=(m64n128w12s2-ws m64n128w12s2-ws-pp m64n128w12s2-ws-pp-persist
                               m128n64w4s2-wgmma-det)
    for shape in "${shapes[@]}"; do
      read -r b h n causal <<<"$shape"
      peers+=("$b,$h,$n,$d,${causal:+1}")
      for config in "${configs[@]}"; do
        tag="$config-d$d-b$b-n$n${causal:+-causal}"
        step bwd-ws "run-$tag" 90 build-device/flashjit run --backend cuda --pass bwd \
            --batch "$b" --heads "$h" --seqlen "$n" --head-dim "$d" $causal --config "$config"
        grep -E "backward|ms" "$OUT/bwd-ws-run-$tag.log" | head -n 4 | sed "s/^/   $tag: /" |
            tee -a "$OUT/bwd-ws.log"
      done
    done
  done
  peers=("${peers[@]/%,/,0}")
  [[ ${#peers[@]} -gt 0 ]] && timeout 300 python3 bench/bwd_peers_quick.py "${peers[@]}" 2>&1 | tee -a "$OUT/bwd-ws.log" ||
      status=1
  echo "== bwd-ws done at $((SECONDS - start)) s"
fi

if [[ "$what" == gpu-tests ]]; then
  echo "== GPU tests (each test executable directly, FLASHJIT_EXPECT_GPU=1)"
  : >"$OUT/gpu-tests.log"
  for test in runtime_cuda_tma_probe_test runtime_cuda_wgmma_probe_test \
      runtime_cuda_variant_test runtime_cuda_decode_test \
      runtime_cuda_cuda_backend_test runtime_cuda_nvrtc_compiler_test runtime_runtime_test \
      runtime_readme_example_test tuner_tuner_test tuner_tuner_reliability_test tuner_tuner_gpu_fault_test \
      cli_tune_command_test cli_backward_commands_test runtime_cuda_attention_test \
      runtime_cuda_backward_test; do
    [[ -x "build-device/tests/$test" ]] || { echo "MISSING $test" | tee -a "$OUT/gpu-tests.log"; status=1; continue; }
    step gpu-tests "$test" 300 "build-device/tests/$test" --gtest_filter="${ctest_regex:-*}"
  done
  echo "== GPU tests done at $((SECONDS - start)) s"
fi

if [[ "$what" == ws || "$what" == ws-tests ]]; then
  echo "== -ws tests: probes, then every legal -ws config vs the fp64 reference"
  # Time limits on everything that launches a -ws kernel: a pipeline that never completes a
  # phase hangs its kernel, and the limit turns that into a failure instead of a lost session.
  for test in runtime_cuda_tma_probe_test runtime_cuda_wgmma_probe_test; do
    if ! timeout 120 "build-device/tests/$test" 2>&1 | tee -a "$OUT/ctest.log"; then
      status=1
      echo "== $test FAILED"
    fi
  done
  if ! FLASHJIT_TEST_FAMILIES=ws timeout 420 build-device/tests/runtime_cuda_attention_test \
      --gtest_filter="${ctest_regex:-*CudaAttentionAllConfigs*:*WsSchedulesWalking*}" 2>&1 |
      tee -a "$OUT/ctest.log"; then
    status=1
    echo "== runtime_cuda_attention_test (-ws) FAILED"
  fi
  echo "== every legal -ws config through NVRTC + ptxas: no spill, setmaxnreg kept (compile.log)"
  if ! FLASHJIT_COMPILE_ALL=1 FLASHJIT_TEST_FAMILIES=ws timeout 300 \
      build-device/tests/templates_cuda_compile_test \
      --gtest_filter='AllGroups/CudaCompileAllConfigs.*/sm90*:CudaCompileWs.*' \
      >"$OUT/compile.log" 2>&1; then
    status=1
    echo "== templates_cuda_compile_test (-ws, all tiles) FAILED"
  fi
  grep -E '^\[ +(OK|FAILED|PASSED|total) |compiles for|Failure' "$OUT/compile.log" | tail -n 40
  echo "== tests done at $((SECONDS - start)) s"
fi

if [[ "$what" == ws || "$what" == ws-bench ]]; then
  echo "== bench: the -ws tile per head dim in each schedule, and the default config"
  : >"$OUT/bench.log"
  rm -f "$OUT"/ws-d*.json
  for d in 64 128 256; do
    ws_tile=$(build-device/flashjit plan --arch sm90 --head-dim "$d" |
              sed -n 's/^-ws tile: \([^ ]*\).*/\1/p')
    for schedule in "" -pp -persist -pp-persist; do
      echo "   d$d: $ws_tile$schedule"
      # shellcheck disable=SC2086
      if ! timeout 120 build-device/bench/bench_attention --dtype bf16 --d "$d" \
          --config "$ws_tile$schedule" --json "$OUT/ws-d$d$schedule.json" ${BENCH_ARGS:-} 2>&1 |
          tee -a "$OUT/bench.log"; then
        status=1
        echo "== bench_attention $ws_tile$schedule FAILED (rows with errors are in the JSON)"
      fi
    done
  done
  # shellcheck disable=SC2086
  build-device/bench/bench_attention --dtype bf16 --json "$OUT/flashjit.json" ${BENCH_ARGS:-} \
    2>&1 | tee -a "$OUT/bench.log" || status=1
  python3 -c 'import json, sys; print(json.dumps([r for p in sys.argv[1:] for r in json.load(open(p))]))' \
    "$OUT"/ws-d*.json >"$OUT/ws.json" || status=1
  echo "== N = 8192 probe: d 128, the same FLOPs as B x H = 2 x 16 over 1 x 32 and 4 x 8"
  d128_tile=$(build-device/flashjit plan --arch sm90 --head-dim 128 |
              sed -n 's/^-ws tile: \([^ ]*\).*/\1/p')
  for shape in "8192 4096" "16384 2048" "32768 1024"; do
    read -r tokens hidden <<<"$shape"
    for schedule in "" -persist; do
      timeout 60 build-device/bench/bench_attention --dtype bf16 --d 128 --n 8192 \
        --tokens "$tokens" --hidden "$hidden" --config "$d128_tile$schedule" 2>&1 |
        grep -E '^bf16' | tee -a "$OUT/ws-dip.log" || status=1
    done
  done
  echo "== peers (torch SDPA flash + cuDNN, forward only, same run)"
  # shellcheck disable=SC2086
  if ! python3 bench/peers_bench.py --bf16 --fwd-only --backends flash,cudnn \
      --json "$OUT/peers.json" ${PEERS_ARGS:-} 2>&1 | tee "$OUT/peers.log"; then
    status=1
    echo "== peers_bench.py FAILED"
  fi
  if [[ -s "$OUT/peers.json" ]]; then
    echo "== -ws tiles in each schedule vs peers"
    python3 bench/ws_schedules.py "$OUT/ws.json" "$OUT/peers.json" | tee "$OUT/ws.md"
    echo "== default configs vs peers"
    python3 bench/compare.py "$OUT/flashjit.json" "$OUT/peers.json" | tee "$OUT/compare.md"
  fi
  echo "== ws done at $((SECONDS - start)) s"
fi

if [[ "$what" == ws-sanitize ]]; then
  echo "== compute-sanitizer racecheck + synccheck: the -ws tile of d 64/128/256, plain and" \
       "-pp-persist, causal and not"
  sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  for d in 64 128 256; do
    ws_tile=$(build-device/flashjit plan --arch sm90 --head-dim "$d" |
              sed -n 's/^-ws tile: \([^ ]*\).*/\1/p')
    # 18 heads x 1000 rows: more tiles than the H100's 132 SMs, so persistent CTAs walk two.
    for ws_config in "$ws_tile" "$ws_tile-pp-persist"; do
      for causal in "" --causal; do
        for tool in racecheck synccheck; do
          echo "-- $tool d$d $ws_config ${causal:-non-causal}"
          if ! timeout 120 "$sanitizer" --tool "$tool" --error-exitcode 3 build-device/flashjit run \
              --config "$ws_config" --head-dim "$d" --seqlen 1000 --batch 1 --heads 18 --reps 1 \
              $causal 2>&1 | tail -n 4 | tee -a "$OUT/sanitizer.log"; then
            status=1
            echo "== $tool FAILED on d$d $ws_config $causal"
          fi
        done
      done
    done
  done
  echo "== ws-sanitize done at $((SECONDS - start)) s"
fi

if [[ "$what" == sanitize ]]; then
  echo "== compute-sanitizer memcheck, racecheck, synccheck: one config per family x d x causal"
  sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  mkdir -p "$OUT/sanitize"
  cases="build-device/sanitize-cases.txt"
  # The kernels new since the last full sweep (packed documents, variants, split decode) first,
  # so that a call cut off by its time limit has checked them.
  sanitize_cases build-device/flashjit >"$cases.all"
  new='bwd-ws|checked|docs|variant|split4'
  { grep -E "$new" "$cases.all" || true; grep -vE "$new" "$cases.all" || true; } >"$cases"
  echo "$(wc -l <"$cases") sanitizer runs"
  run_case() {  # run_case TOOL NAME FLAGS...: one sanitizer run, its verdict line
    local tool=$1 name=$2 check=0
    shift 2
    [[ "$name" == *-checked* ]] && check=1
    if FLASHJIT_CHECK_TABLES=$check timeout 300 "$sanitizer" --tool "$tool" --error-exitcode 3 build-device/flashjit run \
        --backend cuda --reps 1 "$@" \
        >"$OUT/sanitize/$tool-$name.full" 2>&1; then
      echo "PASSED $tool $name"
      tail -n 4 "$OUT/sanitize/$tool-$name.full" >"$OUT/sanitize/$tool-$name.log"
    else
      echo "FAILED (exit $?) $tool $name: $*"
      head -n 400 "$OUT/sanitize/$tool-$name.full" >"$OUT/sanitize/$tool-$name.log"
    fi
    rm -f "$OUT/sanitize/$tool-$name.full"
  }
  export -f run_case
  export sanitizer OUT
  # First each config once without a sanitizer (fills the kernel cache: no NVRTC under the tools).
  awk '{ $1 = ""; $2 = ""; print }' "$cases" | sort -u |
    xargs -P 16 -L 1 bash -c 'build-device/flashjit run --backend cuda --reps 1 "$@" >/dev/null 2>&1 ||
      echo "plain run failed: $*"' _
  echo "== kernel cache filled at $((SECONDS - start)) s"
  xargs -P 12 -L 1 bash -c 'run_case "$@"' _ <"$cases" | tee "$OUT/sanitize.log"
  if grep -q '^FAILED' "$OUT/sanitize.log"; then
    status=1
    echo "== sanitizer findings or failures: $(grep -c '^FAILED' "$OUT/sanitize.log")"
  fi
  echo "== $(grep -c '^PASSED' "$OUT/sanitize.log") of $(wc -l <"$cases") clean;" \
       "sanitize done at $((SECONDS - start)) s"
  tar czf "$OUT/sanitize-logs.tgz" -C "$OUT" sanitize && rm -rf "$OUT/sanitize"
fi

if [[ "$what" == tune ]]; then
  echo "== flashjit tune (standard grid, ${DTYPES:-bf16})"
  tune_start=$SECONDS
  # shellcheck disable=SC2086  # TUNE_ARGS is a list of flags
  if ! build-device/flashjit tune --dtypes "${DTYPES:-bf16}" --json "$OUT/tune.json" ${TUNE_ARGS:-} 2>&1 |
      tee "$OUT/tune.log"; then
    status=1
    echo "== flashjit tune FAILED"
  fi
  echo "== tune took $((SECONDS - tune_start)) s"
  echo "== fresh process, tuned problem (d128 bf16 causal N4096, 4 x 16 heads)"
  FLASHJIT_LOG=1 build-device/flashjit run --head-dim 128 --seqlen 4096 --batch 4 --heads 16 \
    --causal 2>&1 | tee "$OUT/fresh_run.log" || status=1
fi

if [[ "$what" == bench || "$what" == tune || "$what" == all ]]; then
  jsons=()
  for dtype in ${DTYPES//,/ }; do
    echo "== bench_attention ($dtype)"
    # shellcheck disable=SC2086  # BENCH_ARGS is a list of flags
    if ! build-device/bench/bench_attention --dtype "$dtype" --json "$OUT/flashjit-$dtype.json" \
        ${BENCH_ARGS:-} 2>&1 | tee -a "$OUT/bench.log"; then
      status=1
      echo "== bench_attention FAILED (rows with errors are in the JSON)"
    fi
    jsons+=("$OUT/flashjit-$dtype.json")
  done
  # One list of rows for compare.py.
  python3 -c 'import json, sys; print(json.dumps([r for p in sys.argv[1:] for r in json.load(open(p))]))' \
    "${jsons[@]}" >"$OUT/flashjit.json" || status=1
  peers_dtype=(--bf16)
  [[ "${DTYPES:-bf16}" == bf16 ]] || peers_dtype=()
  echo "== peers (torch SDPA flash + cuDNN, forward only)"
  # shellcheck disable=SC2086
  if ! python3 bench/peers_bench.py "${peers_dtype[@]}" --fwd-only --backends flash,cudnn \
      --json "$OUT/peers.json" ${PEERS_ARGS:-} 2>&1 | tee "$OUT/peers.log"; then
    status=1
    echo "== peers_bench.py FAILED"
  fi
  if [[ -s "$OUT/flashjit.json" && -s "$OUT/peers.json" ]]; then
    echo "== comparison"
    python3 bench/compare.py "$OUT/flashjit.json" "$OUT/peers.json" | tee "$OUT/compare.md"
  fi
  echo "== bench done at $((SECONDS - start)) s"
fi

exit "$status"
