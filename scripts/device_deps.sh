#!/usr/bin/env bash
# Gathers the header-only C++ packages the kvflash program builds with (CLI11, nlohmann_json;
# installed here by scripts/install.sh) into .deps/, laid out as a CMake prefix, for the lent GPU
# machine, which has neither and cannot fetch them. Carry `.deps` in the device call;
# tests/gpu/run.sh passes it to CMake when present.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
rm -rf .deps && mkdir -p .deps/include .deps/share/cmake
cp -r /usr/include/CLI /usr/include/nlohmann .deps/include/
cp -r /usr/share/cmake/CLI11 /usr/share/cmake/nlohmann_json .deps/share/cmake/
echo "device_deps.sh: .deps/ ready ($(du -sh .deps | cut -f1))"
