# The CPU backend's instruction sets (included by CMakeLists.txt after kvflash_lib is defined).
#
# Portable by default: the library is compiled for the x86-64-v2 baseline, and attention.cpp (the
# only file with SIMD kernels) once more per level - avx2 (AVX2+FMA+F16C), avx512 (F/DQ/BW/VL)
# and, where the compiler has the intrinsics, avx512_bf16 (+ AVX512_BF16) - each copy in its own
# namespace; src/cpu/isa.cpp picks one at run time from the CPU's features, avx512_bf16 only
# when asked for (KVFLASH_CPU_ISA=baseline|avx2|avx512|avx512_bf16 forces one). On aarch64 the
# levels are baseline and neon (arm_neon.h intrinsics; Advanced SIMD is part of every aarch64
# CPU, so neon is the default there and takes no extra flags). On other architectures only the
# baseline copy is built, with the compiler's default flags.
#
#   KVFLASH_NATIVE=ON   compile everything with -march=native instead (this machine only).

include(CheckCXXCompilerFlag)
include(CheckCXXSourceCompiles)

set(KVFLASH_CPU_X86 OFF)
if(CMAKE_SYSTEM_PROCESSOR MATCHES "^(x86_64|AMD64|amd64)$" AND CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
  set(KVFLASH_CPU_X86 ON)
endif()
set(KVFLASH_CPU_ARM OFF)
if(CMAKE_SYSTEM_PROCESSOR MATCHES "^(aarch64|arm64|ARM64)$" AND CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
  set(KVFLASH_CPU_ARM ON)
endif()

set(KVFLASH_CPU_FLAGS "")
if(KVFLASH_NATIVE)
  set(KVFLASH_CPU_FLAGS -march=native)
elseif(KVFLASH_CPU_X86)
  check_cxx_compiler_flag(-march=x86-64-v2 KVFLASH_HAS_MARCH_X86_64_V2)
  if(KVFLASH_HAS_MARCH_X86_64_V2)
    set(KVFLASH_CPU_FLAGS -march=x86-64-v2)
  endif()
endif()
target_compile_options(kvflash_lib PRIVATE $<$<COMPILE_LANGUAGE:CXX>:${KVFLASH_CPU_FLAGS}>)

set(KVFLASH_CPU_LEVELS baseline)
if(KVFLASH_CPU_X86)
  list(APPEND KVFLASH_CPU_LEVELS avx2 avx512)
  target_compile_definitions(kvflash_lib PRIVATE KVFLASH_CPU_X86_LEVELS=1)
  # GCC >= 10 and Clang >= 9 have the BF16 intrinsics; older compilers build the other levels.
  check_cxx_source_compiles([[
    #include <immintrin.h>
    __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))
    __m512 dot(__m512 acc, __m512i a, __m512i b) { return _mm512_dpbf16_ps(acc, (__m512bh)a, (__m512bh)b); }
    int main() { return 0; }]] KVFLASH_HAS_AVX512_BF16)
  if(KVFLASH_HAS_AVX512_BF16)
    list(APPEND KVFLASH_CPU_LEVELS avx512_bf16)
    target_compile_definitions(kvflash_lib PRIVATE KVFLASH_CPU_AVX512_BF16_LEVEL=1)
  endif()
elseif(KVFLASH_CPU_ARM)
  list(APPEND KVFLASH_CPU_LEVELS neon)
  target_compile_definitions(kvflash_lib PRIVATE KVFLASH_CPU_ARM_LEVELS=1)
endif()
message(STATUS "kvflash: CPU levels ${KVFLASH_CPU_LEVELS} (flags: ${KVFLASH_CPU_FLAGS})")

set(_kvflash_level 0)
foreach(level IN LISTS KVFLASH_CPU_LEVELS)
  add_library(kvflash_cpu_${level} OBJECT src/cpu/attention.cpp)
  target_compile_definitions(kvflash_cpu_${level} PRIVATE
    KVFLASH_CPU_ISA_NS=${level} KVFLASH_CPU_ISA_LEVEL=${_kvflash_level}
    $<$<BOOL:${KVFLASH_CPU_X86}>:KVFLASH_CPU_X86_LEVELS=1> $<$<BOOL:${KVFLASH_CPU_ARM}>:KVFLASH_CPU_ARM_LEVELS=1>
    $<$<BOOL:${KVFLASH_HAS_AVX512_BF16}>:KVFLASH_CPU_AVX512_BF16_LEVEL=1>)
  target_include_directories(kvflash_cpu_${level} PRIVATE include src)
  target_compile_options(kvflash_cpu_${level} PRIVATE -Wall -Wextra ${KVFLASH_CPU_FLAGS})
  if(OpenMP_CXX_FOUND)
    target_link_libraries(kvflash_cpu_${level} PRIVATE OpenMP::OpenMP_CXX)
  endif()
  target_sources(kvflash_lib PRIVATE $<TARGET_OBJECTS:kvflash_cpu_${level}>)
  math(EXPR _kvflash_level "${_kvflash_level} + 1")
endforeach()
