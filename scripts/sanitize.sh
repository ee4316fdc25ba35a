#!/usr/bin/env bash
# The C++ test suite under sanitizers, each in its own build folder (CPU backend only):
#   asan: AddressSanitizer + UndefinedBehaviorSanitizer (g++), every test; the differential test
#         draws KVFLASH_DIFF_CASES random calls (default here 300 of its 2000, for CI's time)
#   tsan: ThreadSanitizer (clang, libomp with its archer tool so OpenMP's synchronisation is
#         seen), the determinism, concurrency and batch-invariance tests
#   python: the Python tests against an extension built with ASan + UBSan (build-pyasan/, the
#         runtimes LD_PRELOADed into the interpreter; leak checks off: CPython keeps objects
#         alive at exit by design)
# Any report aborts the test binary, so the script fails.
#
#   bash scripts/sanitize.sh            # all three
#   bash scripts/sanitize.sh asan|tsan|python
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MODES=("$@")
[ ${#MODES[@]} -gt 0 ] || MODES=(asan tsan python)

configure_and_build() {  # dir, compiler, sanitizers
  local dir="$1" cxx="$2" sanitize="$3"
  if [ ! -f "$dir/CMakeCache.txt" ]; then
    local launcher=()
    command -v ccache >/dev/null 2>&1 && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
    CXX="$cxx" cmake -S "$ROOT" -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVFLASH_CUDA=OFF \
      -DKVFLASH_TOOLS=OFF -DKVFLASH_SANITIZE="$sanitize" "${launcher[@]}"
  fi
  cmake --build "$dir" -j "$(nproc)" --target kvflash_tests
}

python_under_asan() {
  local dir="$ROOT/build-pyasan" py
  py="$(command -v python3)"
  if [ ! -f "$dir/CMakeCache.txt" ]; then
    local launcher=()
    command -v ccache >/dev/null 2>&1 && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
    cmake -S "$ROOT" -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVFLASH_PYTHON=ON \
      -DKVFLASH_TESTS=OFF -DKVFLASH_TOOLS=OFF -DKVFLASH_CUDA=OFF -DKVFLASH_SANITIZE=address,undefined \
      -DPython_EXECUTABLE="$py" -Dnanobind_ROOT="$("$py" -m nanobind --cmake_dir)" "${launcher[@]}"
  fi
  cmake --build "$dir" -j "$(nproc)" --target _kvflash
  # The package as pip would lay it out, with the instrumented extension.
  rm -rf "$dir/pkg" && mkdir -p "$dir/pkg/kvflash"
  cp -r "$ROOT/python/kvflash/." "$dir/pkg/kvflash/" && rm -rf "$dir/pkg/kvflash/__pycache__"
  cp "$dir"/python/_kvflash*.so "$dir/pkg/kvflash/"
  echo "== sanitize.sh: Python tests under ASan + UBSan"
  (cd "$ROOT/tests/python" &&
    PYTHONPATH="$dir/pkg" LD_PRELOAD="$(g++ -print-file-name=libasan.so) $(g++ -print-file-name=libubsan.so)" \
    ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
      "$py" -m pytest -q -p no:cacheprovider .)
}

for mode in "${MODES[@]}"; do
  case "$mode" in
    asan)
      configure_and_build "$ROOT/build-asan" g++ address,undefined
      echo "== sanitize.sh: C++ tests under ASan + UBSan"
      ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:strict_string_checks=1 \
      UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
      KVFLASH_DIFF_CASES="${KVFLASH_DIFF_CASES:-300}" \
        "$ROOT/build-asan/kvflash_tests" --gtest_brief=1
      ;;
    tsan)
      configure_and_build "$ROOT/build-tsan" clang++-14 thread
      echo "== sanitize.sh: determinism and concurrency tests under TSan"
      OMP_TOOL_LIBRARIES="$(clang++-14 -print-resource-dir)/../../libarcher.so" \
      TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:ignore_noninstrumented_modules=1:suppressions=$ROOT/scripts/tsan.supp" \
        "$ROOT/build-tsan/kvflash_tests" --gtest_filter='Determinism.*:Concurrency.*:BatchInvariance.*' --gtest_brief=1
      ;;
    python)
      python_under_asan
      ;;
    *) echo "sanitize.sh: unknown mode $mode (asan, tsan, python)" >&2; exit 2 ;;
  esac
done
