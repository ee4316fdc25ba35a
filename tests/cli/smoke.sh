#!/usr/bin/env bash
# The kvflash program as a user runs it (ctest's cli_smoke): --version, per-command --help, a
# small `run` and `check` with --json (parsed), `bench --quick` writing JSON, and the usage
# errors (duplicate flag, unknown flag, bad list, incompatible heads, CUDA without a GPU).
#
#   bash tests/cli/smoke.sh build/kvflash
set -euo pipefail

KVFLASH="$1"
SCRATCH="$(mktemp -d)"
trap 'rm -rf "$SCRATCH"' EXIT

fail() { echo "cli smoke: $*" >&2; exit 1; }

# expect_error STATUS TEXT command...: the command exits with STATUS and says TEXT on stderr.
expect_error() {
  local want_status="$1" want_text="$2" status=0
  shift 2
  "$@" >"$SCRATCH/out" 2>"$SCRATCH/err" || status=$?
  [ "$status" -eq "$want_status" ] || fail "'$*' exited $status, expected $want_status: $(cat "$SCRATCH/err")"
  grep -qF -- "$want_text" "$SCRATCH/err" || fail "'$*' did not say '$want_text': $(cat "$SCRATCH/err")"
}

# json_get FILE EXPR: a Python expression over the parsed JSON document `d`.
json_get() { python3 -c "import json, sys; d = json.load(open(sys.argv[1])); print($2)" "$1"; }

version="$("$KVFLASH" --version)"
[[ "$version" == "kvflash "[0-9]* ]] || fail "--version printed '$version'"
for command in run check bench; do
  "$KVFLASH" "$command" --help | grep -q -- "--threads" || fail "$command --help lists no --threads"
done

"$KVFLASH" run --batch 2 --prompt-len 40-70 --decode-steps 3 --verify-every 1 --json >"$SCRATCH/run.json" 2>/dev/null
[ "$(json_get "$SCRATCH/run.json" "d['verify']['ok'] and d['decode']['tokens'] == 6")" = True ] ||
  fail "run --json: $(cat "$SCRATCH/run.json")"
"$KVFLASH" check --cases 20 --json >"$SCRATCH/check.json" 2>/dev/null
[ "$(json_get "$SCRATCH/check.json" "d['passed'] == 20 and d['failed'] == 0")" = True ] ||
  fail "check --json: $(cat "$SCRATCH/check.json")"
# --eager: host work per call is a CUDA figure (eager minus graph replay); on the CPU it is null.
"$KVFLASH" bench --quick --eager --device cpu --out "$SCRATCH/bench.json" >/dev/null 2>&1
[ "$(json_get "$SCRATCH/bench.json" "len(d['rows']) == 6 and d['version'] in '$version' and 'bench --quick' in d['command'] and d['rows'][0]['host_us'] is None")" = True ] ||
  fail "bench --quick: $(head -c 600 "$SCRATCH/bench.json")"
# fp8: FA3's all-fp8 call, whose output is bf16.
"$KVFLASH" bench --dtype fp8 --context none --prefill 64 --heads 2 --kv-heads 2 --head-dim 64 --repeats 1 --warmup 0 \
  --device cpu --out "$SCRATCH/bench_fp8.json" >/dev/null 2>&1
[ "$(json_get "$SCRATCH/bench_fp8.json" "len(d['rows']) == 1 and d['rows'][0]['dtype'] == 'fp8'")" = True ] ||
  fail "bench --dtype fp8: $(head -c 600 "$SCRATCH/bench_fp8.json")"

expect_error 2 "--batch: At Most 1 required but received 2" "$KVFLASH" run --batch 2 --batch 3
expect_error 2 "--verbose" "$KVFLASH" run --verbose
expect_error 2 "--context: values must be positive, got -4" "$KVFLASH" bench --context 8,-4
expect_error 2 "--heads must be a multiple of --kv-heads" "$KVFLASH" run --heads 12 --kv-heads 8
if ! nvidia-smi -L >/dev/null 2>&1; then
  if "$KVFLASH" --version | grep -q "backends cpu,cuda"; then
    expect_error 1 "use --device cpu" "$KVFLASH" run --device cuda
  else
    expect_error 1 "built without CUDA support" "$KVFLASH" run --device cuda
  fi
fi
echo "cli smoke: $version: run, check, bench --quick and the usage errors as expected"
