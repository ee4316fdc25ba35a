#!/usr/bin/env bash
# The CPU backend cross-compiled for aarch64 (cmake/toolchains/aarch64-linux-gnu.cmake) and its
# CPU suites run under qemu-user (ctest's emulator) at both aarch64 levels, KVFLASH_CPU_ISA=baseline
# and =neon, so the NEON kernels are tested on an x86-64 machine: CpuIsa, CpuAttention, CpuCombine,
# CpuAppend, the oracle's spec examples and KVFLASH_DIFF_CASES random differential cases (default
# 60 per level). Under qemu the oracle and the kernels run many times slower than natively: the
# rest of the differential suite is left out here (AwkwardConfigurations alone takes 3 minutes
# per level); `ctest --test-dir build-aarch64 -R cpu_isa_` runs the full per-level entries
# (about 11 minutes).
#
#   bash scripts/cross_aarch64.sh                       # BUILD_DIR=build-aarch64
#   KVFLASH_DIFF_CASES=500 bash scripts/cross_aarch64.sh
#
# Packages: g++-aarch64-linux-gnu (the cross compiler and the target's libc, libstdc++, libgomp),
# qemu-user, googletest (GoogleTest's source: Debian's libgtest-dev is built for the host only).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${BUILD_DIR:-$ROOT/build-aarch64}"

# shellcheck source=scripts/apt.sh
source "$ROOT/scripts/apt.sh"
install_apt_packages cmake ninja-build g++-aarch64-linux-gnu qemu-user googletest

if [ ! -f "$BUILD_DIR/CMakeCache.txt" ]; then
  launcher=()
  command -v ccache >/dev/null 2>&1 && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  # The tests only: the kvflash program and the install rules need no second architecture.
  cmake -S "$ROOT" -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_TOOLCHAIN_FILE="$ROOT/cmake/toolchains/aarch64-linux-gnu.cmake" \
    -DKVFLASH_CUDA=OFF -DKVFLASH_TOOLS=OFF -DKVFLASH_INSTALL=OFF "${launcher[@]}"
fi
cmake --build "$BUILD_DIR" -j "$(nproc)" --target kvflash_tests

TESTS='^(CpuIsa|CpuAttention|CpuCombine|CpuAppend)\.|^Differential\.(OracleFollowsTheSpecExamples|RandomCasesMatchOracle)$'
for level in baseline neon; do
  echo "cross_aarch64.sh: KVFLASH_CPU_ISA=$level"
  KVFLASH_CPU_ISA=$level KVFLASH_DIFF_CASES="${KVFLASH_DIFF_CASES:-60}" \
    ctest --test-dir "$BUILD_DIR" -R "$TESTS" -j "$(nproc)" --output-on-failure
done
