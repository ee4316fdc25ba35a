# Cross-compiling kvflash for aarch64 Linux on an x86-64 Debian host (scripts/cross_aarch64.sh):
#   apt-get install g++-aarch64-linux-gnu qemu-user googletest
#   cmake -S . -B build-aarch64 -DCMAKE_TOOLCHAIN_FILE=cmake/toolchains/aarch64-linux-gnu.cmake \
#         -DKVFLASH_CUDA=OFF -DKVFLASH_TOOLS=OFF -DKVFLASH_INSTALL=OFF
# ctest (and gtest_discover_tests at build time) run the aarch64 binaries under qemu-aarch64, with
# the cross toolchain's libraries (libc, libstdc++, libgomp) as the target's root. Debian's
# libgtest-dev is built for the host only: the tests build GoogleTest from its source
# (KVFLASH_GTEST_SOURCE, default /usr/src/googletest in a cross build).
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)

set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)

set(KVFLASH_AARCH64_SYSROOT /usr/aarch64-linux-gnu)
set(CMAKE_FIND_ROOT_PATH ${KVFLASH_AARCH64_SYSROOT})
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)

set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64 -L ${KVFLASH_AARCH64_SYSROOT})
