#!/usr/bin/env bash
# Runs the whole test suite: the C++ tests (ctest in build/, made by scripts/install.sh), then the
# Python tests (the kvflash package is pip-installed from this tree first).
#
#   bash scripts/test.sh
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${BUILD_DIR:-$ROOT/build}"

if [ ! -f "$BUILD_DIR/CTestTestfile.cmake" ]; then
  echo "test.sh: no build in $BUILD_DIR; run scripts/install.sh first" >&2
  exit 1
fi

# Both suites run even when the first fails, so one CI log shows every failure.
echo "== C++ tests (ctest, $BUILD_DIR)"
cpp_status=0
ctest --test-dir "$BUILD_DIR" --output-on-failure -j "$(nproc)" || cpp_status=$?

python_tests=$(find "$ROOT/tests/python" -name 'test_*.py' 2>/dev/null | wc -l)
if [ "$python_tests" -eq 0 ]; then
  echo "== Python tests: none in tests/python"
  exit "$cpp_status"
fi

echo "== Python package (pip install .)"
# The extension is compiled with CUDA only where a GPU can run it: without one, the C++ build has
# already compiled the CUDA code once, and a second copy would only cost CI time.
if [ -z "${KVFLASH_CUDA:-}" ]; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    export KVFLASH_CUDA=AUTO
  else
    export KVFLASH_CUDA=OFF
  fi
fi
pip_args=(--disable-pip-version-check --quiet --root-user-action=ignore --no-build-isolation)
if python3 -c 'import os, sys, sysconfig; sys.exit(not os.path.exists(os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED")))'; then
  pip_args+=(--break-system-packages)
fi
# --no-build-isolation: build with the pinned scikit-build-core/nanobind that install.sh put in,
# and reuse the build folder (pyproject's build/{wheel_tag}, or KVFLASH_PY_BUILD_DIR) between runs.
if [ -n "${KVFLASH_PY_BUILD_DIR:-}" ]; then
  pip_args+=(--config-settings=build-dir="$KVFLASH_PY_BUILD_DIR")
fi
(cd "$ROOT" && python3 -m pip install "${pip_args[@]}" .)

echo "== Python tests (pytest tests/python)"
# Run from the tests folder so `import kvflash` finds the installed package, not python/kvflash.
cd "$ROOT/tests/python"
python_status=0
python3 -m pytest -q . || python_status=$?
# pytest exits 5 when it collected nothing: with test files present that is a failure too.
echo "== test.sh: C++ tests $([ "$cpp_status" -eq 0 ] && echo passed || echo FAILED)," \
  "Python tests $([ "$python_status" -eq 0 ] && echo passed || echo FAILED)"
[ "$cpp_status" -eq 0 ] && [ "$python_status" -eq 0 ]
