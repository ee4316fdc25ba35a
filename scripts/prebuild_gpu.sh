#!/usr/bin/env bash
# Builds the GPU runner and the kvflash program on this machine (no GPU needed; nvcc 13.0 as on
# the lent GPU machine) into .prebuilt/ (ignored by git): stripped, xz-compressed (~10 MB each),
# with a hash of the sources they were built from. A device call that carries `.prebuilt` then
# skips tests/gpu/run.sh's build step (about 2 minutes of device time on 16 cores); run.sh builds
# as before when the hash does not match its copy of the tree. About 10 minutes on 2 cores.
# With PREBUILT_PYTHON (the GPU machine's Python minor version, 3.12, with nanobind; e.g. a
# pyenv 3.12 here) also the Python extension for it into .prebuilt/py/ (~13 MB): bench/run_peers.sh
# then uses it instead of building its own (the same objects; ~1 minute more here).
#   bash scripts/prebuild_gpu.sh                 # build and pack
#   PREBUILT_PYTHON=~/.pyenv/versions/3.12.1/bin/python3.12 bash scripts/prebuild_gpu.sh
#   bash scripts/prebuild_gpu.sh --source-hash   # print the hash of the sources (run.sh's check)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# Everything the two programs are built from, by content (the device copy's .git is not this
# checkout's, so no commit id can say it).
source_hash() {
  find CMakeLists.txt cmake include src tests/gpu tools python/src -type f -print0 | LC_ALL=C sort -z |
    xargs -0 sha256sum | sha256sum | cut -c1-16
}
if [ "${1:-}" = --source-hash ]; then source_hash; exit 0; fi

BUILD=${BUILD:-build-prebuilt}
cmake_extra=()
[ -d .cutlass/include ] && cmake_extra=(-DKVFLASH_CUTLASS_INCLUDE="$PWD/.cutlass/include")
targets=(kvflash_gpu_runner kvflash_cli)
if [ -n "${PREBUILT_PYTHON:-}" ]; then
  cmake_extra+=(-DKVFLASH_PYTHON=ON -DPython_EXECUTABLE="$PREBUILT_PYTHON"
                -Dnanobind_ROOT="$("$PREBUILT_PYTHON" -m nanobind --cmake_dir)")
  targets+=(_kvflash)
fi
mkdir -p "$BUILD"
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVFLASH_CUDA=ON -DKVFLASH_TESTS=OFF \
  -DKVFLASH_TOOLS=ON -DKVFLASH_GPU_TESTS=ON "${cmake_extra[@]}" >"$BUILD/cmake.log"
ninja -C "$BUILD" "${targets[@]}"
rm -rf .prebuilt && mkdir -p .prebuilt
for program in kvflash_gpu_runner kvflash; do
  strip -o ".prebuilt/$program" "$BUILD/$program"
  xz -T0 -6 ".prebuilt/$program"
done
if [ -n "${PREBUILT_PYTHON:-}" ]; then
  mkdir -p .prebuilt/py
  for so in "$BUILD"/python/_kvflash*.so; do
    strip -o ".prebuilt/py/$(basename "$so")" "$so" && xz -T0 -6 ".prebuilt/py/$(basename "$so")"
  done
fi
source_hash >.prebuilt/SOURCE
echo "prebuild_gpu.sh: .prebuilt/ ready ($(du -sh .prebuilt | cut -f1), sources $(cat .prebuilt/SOURCE))"
