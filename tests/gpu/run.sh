#!/usr/bin/env bash
# The GPU test runner, one call on a GPU machine: build (all instantiations, sm_80 + sm_90a),
# resource usage of the kernels, >= 1000 random differential cases against the oracle (the sm90
# family's draws on its default kernels (small tiles for short prompts; 1,000 from SHARDS processes
# at once), the persistent one and the 128- and 192-row tiles alone, then rung 3's alone, then
# with rung 8 over small pages (opt-in)), 300 MLA ones on the portable kernels, 300 on the sm90_mla
# kernel, its bench rows, 300 fp8 ones, 300 all-fp8 prefill ones on the sm90 fp8 kernel,
# compute-sanitizer memcheck, racecheck, initcheck and synccheck over a subset (memcheck also over
# issue 18's malformed-call table), bitwise determinism and batch invariance, the same cases from
# several threads on their own streams, the CUDA-graph
# decode test, timings,
# issue 3's speed floors measured by `kvflash bench`, issue 15's fp8 prefill against bf16 (sm90
# fp8 kernel), then a summary table. Logs go to $OUT (or
# ./gpu-logs).
# SKIP="memcheck racecheck" leaves the named steps out (to split the runner over two device calls).
# With `.prebuilt` carried (scripts/prebuild_gpu.sh, run on the dev machine from this same tree)
# the build step unpacks its programs instead of compiling, and the resource step has no objects.
#   CASES=1000 SM90_CASES=1000 SHARDS=14 SM90_TIMEOUT=120 FP8_CASES=300 SM90_FP8_CASES=300 MEMCHECK_CASES=40 RACECHECK_CASES=12 INITCHECK_CASES=12 SYNCCHECK_CASES=12 JOBS=16 tests/gpu/run.sh
set -u -o pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/gpu-logs}
mkdir -p "$OUT"
CASES=${CASES:-1000}
MEMCHECK_CASES=${MEMCHECK_CASES:-40}
RACECHECK_CASES=${RACECHECK_CASES:-12}
INITCHECK_CASES=${INITCHECK_CASES:-12}
SYNCCHECK_CASES=${SYNCCHECK_CASES:-12}
JOBS=${JOBS:-$(nproc)}
BUILD=${BUILD:-build-gpu}
declare -A status

step() {  # step NAME LOG COMMAND...: runs, records PASS/FAIL, keeps the log
  local name=$1 log=$2
  shift 2
  case " ${SKIP:-} " in *" $name "*) status[$name]="skipped (SKIP)"; return 0 ;; esac
  local t0=$SECONDS
  if "$@" >"$OUT/$log" 2>&1; then status[$name]="PASS ($((SECONDS - t0)) s)"; else status[$name]="FAIL ($((SECONDS - t0)) s, see $log)"; fi
  tail -n 4 "$OUT/$log"
}

cmake_extra=()
[ -d .cutlass/include ] && cmake_extra=(-DKVFLASH_CUTLASS_INCLUDE="$PWD/.cutlass/include")
[ -d .deps ] && cmake_extra+=(-DCMAKE_PREFIX_PATH="$PWD/.deps")  # CLI11, nlohmann_json (scripts/device_deps.sh)
# The runner and the program prebuilt from this very tree (scripts/prebuild_gpu.sh, carried as
# .prebuilt) replace the build; otherwise (none, or built from other sources) they are built here.
if [ -f .prebuilt/SOURCE ] && [ "$(cat .prebuilt/SOURCE)" = "$(bash scripts/prebuild_gpu.sh --source-hash)" ]; then
  mkdir -p "$BUILD"
  for program in kvflash_gpu_runner kvflash; do
    python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' \
      ".prebuilt/$program.xz" "$BUILD/$program" && chmod +x "$BUILD/$program"  # xz may be missing there
  done
  status[build]="prebuilt ($(cat .prebuilt/SOURCE))"
else
  [ -f .prebuilt/SOURCE ] && echo ".prebuilt/ is from other sources: building"
  step build build.log bash -c "cmake -S . -B $BUILD -G Ninja -DKVFLASH_CUDA=ON -DKVFLASH_TESTS=OFF -DKVFLASH_TOOLS=ON \
    -DKVFLASH_GPU_TESTS=ON ${cmake_extra[*]} && ninja -C $BUILD -j$JOBS kvflash_gpu_runner kvflash_cli"
fi
RUNNER=$BUILD/kvflash_gpu_runner
if [ ! -x "$RUNNER" ]; then
  echo "build failed"; tail -n 40 "$OUT/build.log"; exit 1
fi
# Registers / spills / tensor-core instructions of the attention kernels (sm_90a cubins).
# (At most 8 files come back from a device call: the GPU line heads resources.txt.)
(nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
 for o in "$BUILD"/CMakeFiles/kvflash_cuda_sm80.dir/kvflash_inst/sm80_{bf16_128x128,bf16_64x512,bf16_e4m3_128x128}.cu.o; do
   cuobjdump --dump-resource-usage "$o" | grep -E "Function|REG"
   echo "HMMA in sm_90 SASS: $(cuobjdump --dump-sass -arch sm_90a "$o" | grep -c HMMA)"
   echo "LDGSTS: $(cuobjdump --dump-sass -arch sm_90a "$o" | grep -c LDGSTS)"
 done
 for o in "$BUILD"/CMakeFiles/kvflash_cuda_sm90_mla.dir/kvflash_inst/sm90_mla_bf16_64x512.cu.o; do
   cuobjdump --dump-resource-usage "$o" | grep -E "Function|REG"
   echo "HGMMA in sm90_mla SASS: $(cuobjdump --dump-sass -arch sm_90a "$o" | grep -c HGMMA)"
 done) >"$OUT/resources.txt" 2>&1

# random_sharded COUNT FIRST_SEED SUBSET: the runner's random cases from SHARDS processes at once
# (each case's float64 oracle runs on one core: ~1.6 sm90 cases per second serially), each over
# its own seeds (the runner draws at most 20 x its count) and stopping after SM90_TIMEOUT seconds
# (KVFLASH_RUNNER_SECONDS: it reports what ran; `timeout` kills a hang a minute later, and the
# shard's last traced case names it). SHARDS=1 is the serial run. The summary adds the shards'
# counts up.
random_sharded() {
  local shards=${SHARDS:-8} seconds=${SM90_TIMEOUT:-300} pids=() rc=0 i
  local per=$(( ($1 + shards - 1) / shards ))
  for ((i = 0; i < shards; ++i)); do
    KVFLASH_RUNNER_TRACE=1 KVFLASH_RUNNER_SECONDS=$seconds timeout $((seconds + 60)) \
      "$RUNNER" random "$per" "$(( $2 + i * 20 * per ))" "$3" >"$OUT/shard$i.tmp" 2>&1 &
    pids+=($!)
  done
  for i in "${!pids[@]}"; do wait "${pids[$i]}" || rc=1; cat "$OUT/shard$i.tmp"; rm -f "$OUT/shard$i.tmp"; done
  return $rc
}

step random random.log "$RUNNER" random "$CASES" 1
# The Hopper prefill family (sm_90 only): random prefill-shaped calls it takes (from SHARDS
# processes), then its rungs timed; the same prefill shapes on the portable kernels (KVFLASH_SM90=0),
# which sm_90 no longer picks.
step sm90 sm90.log random_sharded "${SM90_CASES:-1000}" 1 sm90
# The same draws on the persistent rung (opt-in KVFLASH_SM90_PERSISTENT=1: slower than rung 3 so far;
# the small-tile kernel off, or it would take the short prompts).
step sm90persistent sm90persistent.log env KVFLASH_SM90_PERSISTENT=1 KVFLASH_SM90_SMALL_TILES=0 KVFLASH_RUNNER_TRACE=1 \
  timeout "${SM90_TIMEOUT:-300}" "$RUNNER" random "${SM90_PERSISTENT_CASES:-300}" 1 sm90
# The same draws with the small-tile kernel off (KVFLASH_SM90_SMALL_TILES=0): rung 3 (rung 8 at
# d 64) takes the short prompts that step sm90 plans on rung 6.
step sm90bigtiles sm90bigtiles.log env KVFLASH_SM90_SMALL_TILES=0 KVFLASH_RUNNER_TRACE=1 timeout "${SM90_TIMEOUT:-300}" \
  "$RUNNER" random "${SM90_BIG_TILES_CASES:-300}" 1 sm90
# The same draws with the small tiles off and the three-group tiles too (KVFLASH_SM90_THREE_GROUPS=0):
# rung 3 alone, at d 64 too (sm90bigtiles above runs rung 8 there).
step sm90rung3 sm90rung3.log env KVFLASH_SM90_THREE_GROUPS=0 KVFLASH_SM90_SMALL_TILES=0 \
  KVFLASH_RUNNER_TRACE=1 timeout "${SM90_TIMEOUT:-300}" "$RUNNER" random "${SM90_RUNG3_CASES:-300}" 1 sm90
# The same draws with rung 8 planned over pages smaller than a block (opt-in
# KVFLASH_SM90_THREE_GROUP_PAGES=1) and the small tiles off, so d 64 draws take rung 8.
sm90_three_group_pages() { KVFLASH_SM90_THREE_GROUP_PAGES=1 KVFLASH_SM90_SMALL_TILES=0 random_sharded "$@"; }
step sm90tgpages sm90tgpages.log sm90_three_group_pages "${SM90_TG_PAGES_CASES:-300}" 70001 sm90
step sm80prefill sm80prefill.log env KVFLASH_SM90=0 "$RUNNER" random "${SM80_PREFILL_CASES:-300}" 20001 prefill
# MLA (d 64 / d_v 512, qv, only_qv, 1 KV head, 16 or 128 query heads; a fifth over an fp8 e4m3
# latent cache with descales), which a plain draw rarely makes.
step mla mla.log env KVFLASH_SM90_MLA=0 "$RUNNER" random "${MLA_CASES:-300}" 1 mla
# The same draws' calls the sm90_mla kernel takes (decode shapes with qv), then its bench rows
# (16 heads b64 x 8k page 64: TB/s; 128 heads b128 x 8k: TFLOP/s) beside the portable kernels'.
step sm90mla sm90mla.log env KVFLASH_RUNNER_TRACE=1 timeout "${SM90_TIMEOUT:-300}" "$RUNNER" random "${MLA_CASES:-300}" 1 sm90mla
step mlabench mlabench.log bash -c "'$RUNNER' bench mla && KVFLASH_SM90_MLA=0 '$RUNNER' bench mla"
# fp8 (issue 15): FA3's all-fp8 calls and 16-bit queries over an fp8 e4m3 cache (MLA's qv / only_qv
# among them, issue 16), from the plain draw.
step fp8 fp8.log "$RUNNER" random "${FP8_CASES:-300}" 30001 fp8
# FA3's all-fp8 prefill on the sm90 family's fp8 kernel: d = d_v 64 / 128 / 256, >= 64 query rows,
# one split; held to the fp8 tensor cores' bound (oracle::gpu_tolerance_profile).
step sm90fp8 sm90fp8.log env KVFLASH_RUNNER_TRACE=1 timeout "${SM90_TIMEOUT:-300}" \
  "$RUNNER" random "${SM90_FP8_CASES:-300}" 40001 sm90fp8
step sm90bench sm90bench.log "$RUNNER" sm90bench
step graph graph.log "$RUNNER" graph
step combine combine.log "$RUNNER" combine
step badinput badinput.log "$RUNNER" badinput
step bitwise bitwise.log "$RUNNER" bitwise 200
step streams streams.log "$RUNNER" streams 100
# Sanitizers: any cases, then the split-KV, prefill-shaped, MLA and fp8 subsets (the decode shape
# dominates a plain random draw; sm90fp8: all-fp8 prefill on the sm90 fp8 kernel) and the
# CUDA-graph test (splits + append), all appended to one log each.
sanitize() {  # sanitize TOOL CASES FIRST_SEED
  local t="timeout ${SANITIZER_TIMEOUT:-150} compute-sanitizer --tool $1 --error-exitcode 9"
  $t "$RUNNER" random "$2" "$3" && $t "$RUNNER" random "$(( ($2 + 1) / 2 ))" "$(( $3 + 100 ))" split &&
    $t "$RUNNER" random "$(( ($2 + 1) / 2 ))" "$(( $3 + 200 ))" prefill &&
    $t "$RUNNER" random "$(( ($2 + 1) / 2 ))" "$(( $3 + 300 ))" sm90 &&
    env KVFLASH_SM90_PERSISTENT=1 KVFLASH_SM90_SMALL_TILES=0 \
      $t "$RUNNER" random "$(( ($2 + 1) / 2 ))" "$(( $3 + 700 ))" sm90 &&
    env KVFLASH_SM90_SMALL_TILES=0 $t "$RUNNER" random "$(( ($2 + 1) / 2 ))" "$(( $3 + 800 ))" sm90 &&
    $t "$RUNNER" random "$(( ($2 + 1) / 2 ))" "$(( $3 + 400 ))" mla &&
    $t "$RUNNER" random "$(( ($2 + 1) / 2 ))" "$(( $3 + 500 ))" sm90mla &&
    $t "$RUNNER" random "$(( ($2 + 1) / 2 ))" "$(( $3 + 600 ))" fp8 &&
    $t "$RUNNER" random "$(( ($2 + 1) / 2 ))" "$(( $3 + 900 ))" sm90fp8 &&
    $t "$RUNNER" sm90bench small && $t "$RUNNER" graph
}
step memcheck memcheck.log sanitize memcheck "$MEMCHECK_CASES" 5001
step racecheck racecheck.log sanitize racecheck "$RACECHECK_CASES" 7001
step initcheck initcheck.log sanitize initcheck "$INITCHECK_CASES" 8001
step synccheck synccheck.log sanitize synccheck "$SYNCCHECK_CASES" 9001
step memcheck_badinput memcheck_badinput.log \
  timeout "${SANITIZER_TIMEOUT:-150}" compute-sanitizer --tool memcheck --error-exitcode 9 "$RUNNER" badinput
step bench bench.log "$RUNNER" bench
# The floors by the program users run: paged decode (page 16, 32/8 heads, d 128; --eager: the host
# work per eager call, issue 14, paged and dense), dense prefill,
# and batched prefill (32 prompts of 512, causal, page 16): on sm_90 the sm90 family (pages of 16
# keys by TMA), and the same row on the portable kernels (KVFLASH_SM90=0), by default and with
# --num-splits 1: the two must match. A split bound above 1 with one split per sequence cost this
# row 2.8x (0.731 against 0.265 ms, session 7; issue 13's regression since 90df2b1), and padded
# batches are now planned with one split here (core/heuristics.cpp padded_partial_cap).
floors() {
  "$BUILD/kvflash" bench --device cuda --batch 1,64 --context 8192 --prefill none --dtype bf16 --eager &&
    "$BUILD/kvflash" bench --device cuda --batch 1 --context 8192 --prefill none --dtype bf16 --eager --page-size 0 &&
    "$BUILD/kvflash" bench --device cuda --batch 1 --context 1024 --prefill 16384 --dtype bf16 --non-causal \
      --heads 16 --kv-heads 16 --page-size 0 &&
    "$BUILD/kvflash" bench --device cuda --context none --prefill 512 --prefill-batch 32 --dtype bf16 \
      --heads 16 --kv-heads 16 --page-size 16 &&
    KVFLASH_SM90=0 "$BUILD/kvflash" bench --device cuda --context none --prefill 512 --prefill-batch 32 \
      --dtype bf16 --heads 16 --kv-heads 16 --page-size 16 &&
    KVFLASH_SM90=0 "$BUILD/kvflash" bench --device cuda --context none --prefill 512 --prefill-batch 32 \
      --dtype bf16 --heads 16 --kv-heads 16 --page-size 16 --num-splits 1
}
step floors floors.log floors
# Issue 15's fp8 prefill: FA3's all-fp8 call on the sm90 fp8 kernel beside bf16 in one
# program run each, 16k tokens, 16 heads, dense: d 128 / 64 / 256 non-causal, d 128 causal
# (targets, d 128 non-causal: >= 1,000 TFLOP/s and >= 1.4x bf16).
fp8_prefill() {
  local d mask
  for d in 128:--non-causal 64:--non-causal 256:--non-causal 128:; do
    mask=${d#*:}
    "$BUILD/kvflash" bench --device cuda --context none --prefill 16384 --prefill-batch 1 \
      --heads 16 --kv-heads 16 --head-dim "${d%%:*}" --page-size 0 --dtype fp8,bf16 $mask || return 1
  done
}
step fp8prefill fp8prefill.log fp8_prefill
# The fp8 tensor cores' accumulation precision (torch, cuBLASLt), the basis of the oracle's
# fp8_tensor_cores bound (src/oracle/compare.cpp; BENCHMARKS.md session 24).
step fp8acc fp8acc.log python3 bench/fp8_accumulation.py

echo
echo "=== summary ($(head -1 "$OUT/resources.txt")) ==="
printf '%-10s %s\n' step result
for s in build random sm90 sm90persistent sm90bigtiles sm90rung3 sm90tgpages sm80prefill mla sm90mla mlabench fp8 sm90fp8 sm90bench graph combine badinput bitwise streams memcheck racecheck initcheck synccheck memcheck_badinput bench floors fp8prefill fp8acc; do printf '%-10s %s\n' "$s" "${status[$s]:-not run}"; done
grep -h "^random:" "$OUT/random.log" || true
grep -h "^random sm90" "$OUT/sm90.log" "$OUT/sm90persistent.log" "$OUT/sm90bigtiles.log" "$OUT/sm90rung3.log" || true
for log in sm90 sm90tgpages; do
  awk -v step=$log '/^random sm90: / { p += $3; f += $5; n++ }
    END { if (n) printf "random sm90 (step %s) over %d shards: %d passed, %d failed\n", step, n, p, f }' \
    "$OUT/$log.log" 2>/dev/null || true
done
grep -h "^random prefill" "$OUT/sm80prefill.log" || true
grep -h "^random mla" "$OUT/mla.log" || true
grep -h "^random sm90mla" "$OUT/sm90mla.log" || true
grep -hE "^mla |plan:" "$OUT/mlabench.log" || true
grep -h "^random fp8" "$OUT/fp8.log" || true
grep -h "^random sm90fp8" "$OUT/sm90fp8.log" || true
grep -h "^sm90bench\|^b[0-9]" "$OUT/sm90bench.log" || true
grep -h "^random " "$OUT/memcheck.log" "$OUT/racecheck.log" "$OUT/initcheck.log" "$OUT/synccheck.log" || true
grep -h "^badinput:" "$OUT/badinput.log" "$OUT/memcheck_badinput.log" || true
grep -h "^bitwise:" "$OUT/bitwise.log" || true
grep -h "^streams:" "$OUT/streams.log" || true
grep -h "^graph " "$OUT/graph.log" || true
grep -h "^combine" "$OUT/combine.log" | tail -3 || true
grep -h "ERROR SUMMARY\|RACECHECK SUMMARY" "$OUT/memcheck.log" "$OUT/racecheck.log" "$OUT/initcheck.log" \
  "$OUT/synccheck.log" "$OUT/memcheck_badinput.log" || true
grep -hE "Function|REG" "$OUT/resources.txt" | head -12 || true
grep -h "HMMA\|HGMMA\|LDGSTS" "$OUT/resources.txt" || true
tail -n 6 "$OUT/bench.log"
grep -hE "^(decode|prefill) " "$OUT/floors.log" || tail -n 12 "$OUT/floors.log"
grep -hE "^(decode|prefill) " "$OUT/fp8prefill.log" || tail -n 12 "$OUT/fp8prefill.log"
tail -n 8 "$OUT/fp8acc.log" || true
