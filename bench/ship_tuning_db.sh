#!/usr/bin/env bash
# Regenerates the tuning DB shipped for this machine's GPU (data/tuning/<device>.sql, built into
# share/flashjit/tuning/<device>.db by the build and installed with the package: docs/TUNING_DB.md
# "Shipped DBs"). On the GPU machine, from the repository root:
#
#   bench/ship_tuning_db.sh [PART...]
#
#   PART   fwd-bf16 fwd-fp16 bwd-bf16 bwd-fp16 (the default: all four, in that order): the
#          standard grid (d 64/128/256 x causal or not x N 512-16k, batch x heads from 16k tokens
#          and hidden 2048) of that pass and dtype, tuned into $WORK/tuning.db; bwd-det-bf16 and
#          bwd-det-fp16 tune the deterministic backward's keys too (not part of the default);
#   export writes $OUT/<device>.sql (`flashjit db export`) from everything tuned so far: copy it
#          to data/tuning/ and commit it.
#
# The device tool gives a command 10 minutes: call one or two parts at a time on the same warm
# machine, then `export`. Everything lives outside the working tree (which the device tool lays
# anew), in $WORK (default /tmp/flashjit-ship): the build, the kernel cache and the DB. A part cut
# off by the time limit resumes where it stopped when run again (the tuner skips the configs the
# DB holds). Tune on an otherwise idle GPU, with the flashjit commit to be shipped: rows are keyed
# by the device fingerprint (name, SMs, memory, driver and NVRTC versions) and the generator
# version (a hash of the templates), so a template change makes the shipped rows stale until this
# is run again. Results: $OUT (default ./device-out): tune-<part>.log/.json, <device>.sql.
set -euo pipefail

WORK="${WORK:-/tmp/flashjit-ship}"
OUT="${OUT:-$PWD/device-out}"
parts=("$@")
((${#parts[@]} > 0)) || parts=(fwd-bf16 fwd-fp16 bwd-bf16 bwd-fp16)
for part in "${parts[@]}"; do
  case "$part" in
    fwd-bf16|fwd-fp16|bwd-bf16|bwd-fp16|bwd-det-bf16|bwd-det-fp16|export) ;;
    *) echo "ship_tuning_db.sh: unknown part '$part' (fwd-bf16 fwd-fp16 bwd-bf16 bwd-fp16" \
         "bwd-det-bf16 bwd-det-fp16 export)" >&2
       exit 2 ;;
  esac
done
mkdir -p "$WORK" "$OUT"
export FLASHJIT_CACHE_DIR="$WORK/kcache"
export FLASHJIT_DB="$WORK/tuning.db"
export FLASHJIT_SYSTEM_DB=none  # tune from scratch: no shipped DB answers for the device

echo "== configure + build the flashjit CLI ($WORK/build)"
cmake_args=(-DCMAKE_BUILD_TYPE=Release -DFLASHJIT_BUILD_TESTS=OFF -DFLASHJIT_BUILD_BENCH=OFF)
# The GPU machines have libsqlite3.so.0 but no sqlite3.h: the header carried in .deps/sqlite.
if [[ ! -f /usr/include/sqlite3.h && -f .deps/sqlite/sqlite3.h ]]; then
  cmake_args+=(-DFLASHJIT_SQLITE3_INCLUDE_DIR="$PWD/.deps/sqlite")
fi
cmake -S . -B "$WORK/build" "${cmake_args[@]}" >"$WORK/configure.log" 2>&1 ||
  { tail -n 30 "$WORK/configure.log"; exit 1; }
cmake --build "$WORK/build" -j"$(nproc)" --target flashjit_cli >"$WORK/build.log" 2>&1 ||
  { tail -n 60 "$WORK/build.log"; exit 1; }
flashjit="$WORK/build/flashjit"
fingerprint="$("$flashjit" devices | sed -n 's/^  fingerprint: \(cuda|.*\)/\1/p' | head -n 1)"
if [[ -z "$fingerprint" ]]; then
  echo "ship_tuning_db.sh: no CUDA device here ($flashjit devices)" >&2
  exit 1
fi
device_name="$(cut -d'|' -f2 <<<"$fingerprint")"
slug="$(tr '[:upper:]' '[:lower:]' <<<"$device_name" | tr -cs 'a-z0-9' '-' | sed 's/^-*//; s/-*$//')"
echo "== device: $fingerprint -> data/tuning/$slug.sql"

for part in "${parts[@]}"; do
  if [[ "$part" == export ]]; then
    rm -f "$OUT/$slug.sql"
    "$flashjit" db export --db "$FLASHJIT_DB" "$OUT/$slug.sql"
    "$flashjit" db ls --db "$FLASHJIT_DB" | sed -n 1,3p
    echo "== $OUT/$slug.sql: $(grep -c '^INSERT INTO choices' "$OUT/$slug.sql") choices;" \
      "copy it to data/tuning/$slug.sql and commit it"
    continue
  fi
  pass="${part%-*}"
  dtype="${part##*-}"
  flags=(--pass "${pass%-det}" --dtypes "$dtype")
  [[ "$pass" == bwd-det ]] && flags+=(--deterministic)
  echo "== tune $part: flashjit tune ${flags[*]} (the standard grid)"
  start=$SECONDS
  "$flashjit" tune "${flags[@]}" --json "$OUT/tune-$part.json" 2>&1 | tee "$OUT/tune-$part.log" |
    tail -n 45
  echo "== $part tuned in $((SECONDS - start)) s"
done
