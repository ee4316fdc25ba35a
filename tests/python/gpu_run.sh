#!/usr/bin/env bash
# The Python tests and the overhead figure on a GPU machine, in one command (no network needed):
# builds the extension by CMake directly (the machine's Python may lack scikit-build-core's pin),
# assembles the package in build-gpupy/pkg, runs pytest (torch / CUDA / torch.compile / CUDA-graph
# tests included) and bench/python_overhead.py. Logs go to $OUT. If the CUDA build fails, a
# CPU-only build still runs the torch tests that need no GPU.
#   MINIMAL=ON tests/python/gpu_run.sh     # one attention instantiation (bf16, d 128): fast build
#   PREBUILT=dir tests/python/gpu_run.sh    # use dir/_kvflash*.so (built for this Python) if it loads
# Wheels of nanobind / pytest unpacked in build-python/pydeps are used when the machine lacks them.
set -u -o pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
OUT=${OUT:-$ROOT/gpu-logs}
mkdir -p "$OUT"
[ -d build-python/pydeps ] && export PYTHONPATH="$ROOT/build-python/pydeps${PYTHONPATH:+:$PYTHONPATH}"
PY=$(command -v python3)
"$PY" -c "import sys, torch; print(sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.cuda.is_available())" | tee "$OUT/env.txt"

build() {  # build DIR KVFLASH_CUDA LOG
  cmake -S . -B "$1" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVFLASH_PYTHON=ON -DKVFLASH_TESTS=OFF \
    -DKVFLASH_TOOLS=OFF -DKVFLASH_CUDA="$2" -DKVFLASH_CUDA_MINIMAL="${MINIMAL:-ON}" \
    -DPython_EXECUTABLE="$PY" -Dnanobind_ROOT="$("$PY" -m nanobind --cmake_dir)" >"$OUT/$3" 2>&1 &&
    ninja -C "$1" -j"$(nproc)" _kvflash >>"$OUT/$3" 2>&1
}
BUILD=build-gpupy
if [ -n "${PREBUILT:-}" ]; then  # a folder holding _kvflash*.so built elsewhere for this Python
  mkdir -p "$BUILD/python" && cp "$PREBUILT"/_kvflash*.so "$BUILD/python/"
  if ! PYTHONPATH="$ROOT/$BUILD/python${PYTHONPATH:+:$PYTHONPATH}" "$PY" -c "import _kvflash" 2>>"$OUT/build.log"; then
    echo "prebuilt extension does not load here; building"; rm -f "$BUILD"/python/_kvflash*.so
  fi
fi
if ls "$BUILD"/python/_kvflash*.so >/dev/null 2>&1; then
  echo "using the prebuilt extension from ${PREBUILT:-$BUILD}"
elif ! build $BUILD ON build.log; then
  echo "CUDA build failed:"; grep -E "error|FAILED" "$OUT/build.log" | head -n 20
  BUILD=build-gpupy-cpu
  build $BUILD OFF build-cpu.log || { echo "CPU build failed"; tail -n 30 "$OUT/build-cpu.log"; exit 1; }
fi
rm -rf "$BUILD/pkg" && mkdir -p "$BUILD/pkg/kvflash"
# The whole package (its subpackages too: kvflash.bench has tests here), then the extension.
cp -r python/kvflash/. "$BUILD/pkg/kvflash/" && rm -rf "$BUILD/pkg/kvflash/__pycache__" &&
  cp "$BUILD"/python/_kvflash*.so "$BUILD/pkg/kvflash/"
export PYTHONPATH="$ROOT/$BUILD/pkg${PYTHONPATH:+:$PYTHONPATH}"
export KVFLASH_PACKAGE_NOT_INSTALLED=1  # test_packaging.py's installed-package checks skip
"$PY" -c "import kvflash; print('backends', kvflash.build_backends(), 'cuda', kvflash.cuda_available())" | tee -a "$OUT/env.txt"
status=0
(cd tests/python && timeout "${PYTEST_TIMEOUT:-240}" "$PY" -m pytest -q -rs . 2>&1) | tee "$OUT/pytest.log" | tail -n 60 || status=1
timeout 90 "$PY" bench/python_overhead.py --json "$OUT/overhead.json" 2>&1 | tee "$OUT/overhead.txt"
exit $status
