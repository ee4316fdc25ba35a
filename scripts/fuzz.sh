#!/usr/bin/env bash
# Builds the libFuzzer targets of fuzz/ (clang, ASan + UBSan, into build-fuzz/) and runs each from
# its seed corpus (fuzz/corpus/TARGET) for a bounded time. Fails on any crash, sanitizer report,
# leak, timeout (hang: one input over 10 s) or out-of-memory. Prints each target's executions.
#
#   bash scripts/fuzz.sh                      # FUZZ_SECONDS=40 per target (CI)
#   FUZZ_SECONDS=3600 FUZZ_JOBS=2 bash scripts/fuzz.sh   # a longer run, 2 processes per target
#   bash scripts/fuzz.sh fuzz_plan            # one target
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${FUZZ_BUILD_DIR:-$ROOT/build-fuzz}"
SECONDS_PER_TARGET="${FUZZ_SECONDS:-40}"
JOBS="${FUZZ_JOBS:-1}"
TARGETS=("$@")
[ ${#TARGETS[@]} -gt 0 ] || TARGETS=(fuzz_call fuzz_c_api fuzz_metadata fuzz_plan)

if [ ! -f "$BUILD_DIR/CMakeCache.txt" ]; then
  launcher=()
  command -v ccache >/dev/null 2>&1 && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  CC=clang-14 CXX=clang++-14 cmake -S "$ROOT" -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DKVFLASH_CUDA=OFF -DKVFLASH_TESTS=OFF -DKVFLASH_TOOLS=OFF -DKVFLASH_FUZZ=ON "${launcher[@]}"
fi
cmake --build "$BUILD_DIR" -j "$(nproc)" --target "${TARGETS[@]}"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
total=0
for target in "${TARGETS[@]}"; do
  mkdir -p "$work/$target"
  # New inputs go to the scratch corpus; the seeds in the repository are only read.
  log="$work/$target.log"
  status=0
  (cd "$work" && "$BUILD_DIR/fuzz/$target" -max_total_time="$SECONDS_PER_TARGET" -timeout=10 \
     -rss_limit_mb=2048 -print_final_stats=1 -jobs="$JOBS" -workers="$JOBS" \
     "$work/$target" "$ROOT/fuzz/corpus/$target") >"$log" 2>&1 || status=$?
  if [ "$JOBS" -gt 1 ]; then cat "$work"/fuzz-*.log >>"$log" 2>/dev/null || true; fi
  runs=$(grep -h '^stat::number_of_executed_units' "$log" | awk '{s += $2} END {print s + 0}')
  total=$((total + runs))
  if [ "$status" -ne 0 ] || grep -qE '^(==[0-9]+==ERROR|SUMMARY: )' "$log"; then
    grep -hE 'ERROR|SUMMARY|runtime error|Test unit written|^    #[0-9]' "$log" | head -40 >&2
    cp "$work"/crash-* "$work"/leak-* "$work"/timeout-* "$work"/oom-* "$ROOT"/ 2>/dev/null || true
    echo "fuzz.sh: $target FAILED after $runs executions (reproducer copied to $ROOT)" >&2
    exit 1
  fi
  echo "fuzz.sh: $target: $runs executions in ${SECONDS_PER_TARGET} s, no finding"
done
echo "fuzz.sh: ${#TARGETS[@]} targets, $total executions, no finding"
