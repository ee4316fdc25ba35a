// Included by a per-level translation unit (cmake/cpu.cmake compiles attention.cpp once per level
// with KVFLASH_CPU_ISA_LEVEL 0/1/2/3 and KVFLASH_CPU_ISA_NS baseline/avx2/avx512/avx512_bf16 on
// x86-64, 0/1 and baseline/neon on aarch64) after its other headers: the code that follows is
// compiled for that level's instruction set. On x86-64 a target pragma rather than per-file -m
// flags: inline functions and templates of the headers included before it (the standard
// library's, core/) stay baseline code, so the linker cannot pick an AVX-512 copy of one of them
// for a CPU that lacks it. Everything after it lives in namespace kvflash::cpu::KVFLASH_CPU_ISA_NS,
// so the levels' own inline functions never merge either.
#pragma once

#if !defined(KVFLASH_CPU_ISA_LEVEL) || !defined(KVFLASH_CPU_ISA_NS)
#error "cpu/isa_target.h: compile with KVFLASH_CPU_ISA_LEVEL and KVFLASH_CPU_ISA_NS (see cmake/cpu.cmake)"
#endif

#if defined(__aarch64__)
// Advanced SIMD is part of every aarch64 CPU and of the compiler's default flags: no target
// pragma; the neon level only switches simd.h and microkernels.h to the arm_neon.h intrinsics.
#if KVFLASH_CPU_ISA_LEVEL >= 1
#define KVFLASH_CPU_NEON 1
#include <arm_neon.h>
#endif

#else  // x86-64
#if KVFLASH_CPU_ISA_LEVEL >= 1
#define KVFLASH_CPU_AVX2 1
#endif
#if KVFLASH_CPU_ISA_LEVEL >= 2
#define KVFLASH_CPU_AVX512 1
#endif
#if KVFLASH_CPU_ISA_LEVEL >= 3
#define KVFLASH_CPU_AVX512_BF16 1
#endif

// Pragmas take no macros: each level's feature list is spelled out for each compiler.
#if KVFLASH_CPU_ISA_LEVEL >= 1 && !defined(__GNUC__)
#error "cpu/isa_target.h: the avx2/avx512 levels need GCC or Clang"
#elif KVFLASH_CPU_ISA_LEVEL == 1 && defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c,bmi,bmi2,lzcnt,movbe"))), apply_to = function)
#elif KVFLASH_CPU_ISA_LEVEL == 1
#pragma GCC target("avx2,fma,f16c,bmi,bmi2,lzcnt,movbe")
#elif KVFLASH_CPU_ISA_LEVEL == 2 && defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c,bmi,bmi2,lzcnt,movbe,avx512f,avx512dq,avx512bw,avx512vl,avx512cd"))), apply_to = function)
#elif KVFLASH_CPU_ISA_LEVEL == 2
#pragma GCC target("avx2,fma,f16c,bmi,bmi2,lzcnt,movbe,avx512f,avx512dq,avx512bw,avx512vl,avx512cd")
#elif KVFLASH_CPU_ISA_LEVEL == 3 && defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c,bmi,bmi2,lzcnt,movbe,avx512f,avx512dq,avx512bw,avx512vl,avx512cd,avx512bf16"))), apply_to = function)
#elif KVFLASH_CPU_ISA_LEVEL == 3
#pragma GCC target("avx2,fma,f16c,bmi,bmi2,lzcnt,movbe,avx512f,avx512dq,avx512bw,avx512vl,avx512cd,avx512bf16")
#endif

#if KVFLASH_CPU_ISA_LEVEL >= 1
// GCC 12 warns inside its own AVX-512 intrinsics (they pass an undefined vector as the unused
// masked-off source; GCC bug 105593): silence that warning (-Wmaybe-uninitialized, or
// -Wuninitialized where it can prove it) for the intrinsics' lines only.
#pragma GCC diagnostic push
#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include <immintrin.h>
#pragma GCC diagnostic pop
#endif

#endif  // x86-64
