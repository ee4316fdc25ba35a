#!/usr/bin/env bash
# The installed package as a user gets it: `cmake --install` of a build folder into a scratch
# prefix, then a consumer built with find_package(kvflash) (static library) and one with
# pkg-config (shared library), both run, and the C ABI called through ctypes from the shared library.
#
#   bash tests/package/run.sh BUILD_DIR       (ctest runs it as the `package` test)
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
BUILD_DIR="$(cd "$1" && pwd)"
SCRATCH="$(mktemp -d)"
trap 'rm -rf "$SCRATCH"' EXIT
PREFIX="$SCRATCH/prefix"
VERSION="$(sed -n 's/^#define KVFLASH_VERSION_STRING "\(.*\)"$/\1/p' "$BUILD_DIR/include/kvflash/version.h")"

cmake --install "$BUILD_DIR" --prefix "$PREFIX" >/dev/null
echo "package: installed kvflash $VERSION into a scratch prefix"

cmake -S "$HERE/consumer" -B "$SCRATCH/consumer" -G Ninja -DCMAKE_PREFIX_PATH="$PREFIX" >/dev/null
cmake --build "$SCRATCH/consumer" >/dev/null
"$SCRATCH/consumer/consumer"

export PKG_CONFIG_PATH="$PREFIX/lib/pkgconfig"
# shellcheck disable=SC2046  # pkg-config's output is a list of flags
g++ -std=c++20 "$HERE/consumer/main.cpp" -o "$SCRATCH/consumer_pc" $(pkg-config --cflags --libs kvflash) \
  -Wl,-rpath,"$PREFIX/lib"
"$SCRATCH/consumer_pc" | sed 's/^consumer:/consumer (pkg-config, libkvflash.so):/'

python3 "$HERE/ctypes_smoke.py" "$PREFIX/lib/libkvflash.so" "$VERSION"
