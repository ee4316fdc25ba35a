#!/usr/bin/env bash
# kvflash against its peers on a GPU machine, in one command (no network needed): installs the
# carried wheels (.whl/*.whl) into /tmp/site, puts FlashInfer's precompiled kernels (.whl/flashinfer-aot)
# where FlashInfer looks for them, builds kvflash's extension (all instantiations: the suite needs bf16
# d 64/128/256), runs `python -m kvflash.bench` into $OUT and prints the markdown table last.
#   OUT=/tmp/o bench/run_peers.sh                 # the default suite
#   OUT=/tmp/o bench/run_peers.sh --quick         # arguments go to python -m kvflash.bench
#   TOTAL=570   seconds for the whole script (the suite gets what the setup leaves; default 570,
#               240 with --quick)
#   VARIANTS=1  also time the sm90 family's opt-in variants first (bench/sm90_variants.py, into
#               variants.txt; its time comes out of the suite's)
#   PREBUILT=dir  use dir/_kvflash*.so (built for this Python) instead of building; by default
#               .prebuilt/py's (scripts/prebuild_gpu.sh with PREBUILT_PYTHON) when it was built
#               from this tree's sources for this Python
# Files in $OUT (at most 8 come back from a device call): results.csv, results.md, decode.png,
# prefill.png, bench.log, build.log, env.txt (and variants.txt).
set -u -o pipefail
T0=$SECONDS
cd "$(dirname "$0")/.."
ROOT=$PWD
OUT=${OUT:-$ROOT/bench-logs}
mkdir -p "$OUT"
PY=$(command -v python3)

# --- peers' wheels --------------------------------------------------------------------------
if ls .whl/*.whl >/dev/null 2>&1; then
  if "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
      >"$OUT/build.log" 2>&1; then
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
  else
    echo "wheel install failed (peers will report their import errors):"; tail -n 5 "$OUT/build.log"
  fi
fi
if [ -d .whl/flashinfer-aot ] && [ -d /tmp/site/flashinfer ]; then  # precompiled sm_90a modules
  mkdir -p /tmp/site/flashinfer/data/aot && cp -r .whl/flashinfer-aot/. /tmp/site/flashinfer/data/aot/
fi
export FLASHINFER_WORKSPACE_BASE=${FLASHINFER_WORKSPACE_BASE:-/tmp/flashinfer-ws}
NOT_RUN=()  # system=reason lines for peers whose wheels could not be carried
if [ -f .whl/NOT_CARRIED ]; then
  while IFS= read -r line; do [ -n "$line" ] && NOT_RUN+=(--not-run "$line"); done <.whl/NOT_CARRIED
fi

# --- kvflash's extension (tests/python/gpu_run.sh's build, all instantiations) ----------------
BUILD=${BUILD:-build-gpupy}  # shared with tests/python/gpu_run.sh on the GPU machine
ext_suffix=$("$PY" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
if [ -z "${PREBUILT:-}" ] && [ -f ".prebuilt/py/_kvflash$ext_suffix.xz" ] &&
    [ "$(cat .prebuilt/SOURCE)" = "$(bash scripts/prebuild_gpu.sh --source-hash)" ]; then
  PREBUILT=/tmp/kvflash-prebuilt-py && mkdir -p "$PREBUILT"
  "$PY" -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' \
    ".prebuilt/py/_kvflash$ext_suffix.xz" "$PREBUILT/_kvflash$ext_suffix"  # xz may be missing there
  echo "kvflash extension: .prebuilt/py ($(cat .prebuilt/SOURCE))" >>"$OUT/build.log"
fi
if [ -n "${PREBUILT:-}" ]; then
  mkdir -p "$BUILD/python" && cp "$PREBUILT"/_kvflash*.so "$BUILD/python/"
fi
if ! ls "$BUILD"/python/_kvflash*.so >/dev/null 2>&1 || [ -z "${PREBUILT:-}" ]; then
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVFLASH_PYTHON=ON -DKVFLASH_TESTS=OFF \
    -DKVFLASH_TOOLS=OFF -DKVFLASH_CUDA=ON -DKVFLASH_CUDA_MINIMAL="${MINIMAL:-OFF}" \
    -DPython_EXECUTABLE="$PY" -Dnanobind_ROOT="$("$PY" -m nanobind --cmake_dir)" >>"$OUT/build.log" 2>&1 &&
    ninja -C "$BUILD" -j"$(nproc)" _kvflash >>"$OUT/build.log" 2>&1 ||
    { echo "kvflash CUDA build failed:"; grep -E "error|FAILED" "$OUT/build.log" | head -n 20; }
fi
rm -rf "$BUILD/pkg" && mkdir -p "$BUILD/pkg/kvflash"
cp python/kvflash/*.py "$BUILD/pkg/kvflash/" && cp -r python/kvflash/bench "$BUILD/pkg/kvflash/"
cp "$BUILD"/python/_kvflash*.so "$BUILD/pkg/kvflash/" 2>/dev/null
export PYTHONPATH="$ROOT/$BUILD/pkg${PYTHONPATH:+:$PYTHONPATH}"
export KVFLASH_COMMIT=${KVFLASH_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git status --porcelain --untracked-files=no 2>/dev/null | grep -q . && echo +dirty)}
(nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
 "$PY" -c "import sys, torch; print(sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda)"
 "$PY" -c "import kvflash; print('kvflash backends', kvflash.build_backends())"
 echo "setup took $((SECONDS - T0)) s; commit $KVFLASH_COMMIT") 2>&1 | tee "$OUT/env.txt"

if [ -n "${VARIANTS:-}" ]; then
  timeout 150 "$PY" bench/sm90_variants.py >"$OUT/variants.txt" 2>&1 || echo "sm90_variants.py failed (variants.txt)"
  cat "$OUT/variants.txt"
fi

# --- the suite ------------------------------------------------------------------------------
DEFAULT_TOTAL=570
for a in "$@"; do [ "$a" = --quick ] && DEFAULT_TOTAL=240; done
BUDGET=$(( ${TOTAL:-$DEFAULT_TOTAL} - (SECONDS - T0) - 25 ))
[ "$BUDGET" -lt 60 ] && BUDGET=60
# The suite checks its budget between cases, and one slow compile can overrun it (session 26: a
# 525 s budget still running at the device's 600 s limit, in the flex stage): stopped 30 s past
# it, it leaves results.csv / results.md of the stages it finished (and rows.partial.csv).
PYTHONUNBUFFERED=1 timeout $((BUDGET + 30)) "$PY" -m kvflash.bench --out "$OUT" --budget "$BUDGET" "${NOT_RUN[@]}" "$@" \
  >"$OUT/bench.log" 2>&1
status=$?
[ $status -eq 124 ] && echo "python -m kvflash.bench stopped 30 s past its budget of $BUDGET s"
grep -E "^\[bench\] (wrote|time budget|[a-z0-9-]+: )" "$OUT/bench.log" | tail -n 20
[ $status -ne 0 ] && { echo "python -m kvflash.bench exited with $status:"; tail -n 30 "$OUT/bench.log"; }
echo "total $((SECONDS - T0)) s"
[ -f "$OUT/results.md" ] && cat "$OUT/results.md"
exit $status
