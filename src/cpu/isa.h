// Which instruction set the CPU kernels run with. The SIMD code (attention.cpp with simd.h and
// microkernels.h) is compiled once per level, each copy in its own namespace; attend() runs the
// highest level this CPU supports short of avx512_bf16 (opt-in: measured no faster, see
// BENCHMARKS.md), or the one KVFLASH_CPU_ISA names (for tests and comparisons).
#pragma once

#include <string>
#include <vector>

namespace kvflash::cpu {

enum class Isa {
  baseline,  // portable code, vectorised as the compiler can (x86-64-v2 by default; armv8-a)
  avx2,      // x86-64: AVX2 + FMA + F16C (x86-64-v3)
  avx512,    // x86-64: AVX-512 F/DQ/BW/VL (x86-64-v4)
  avx512_bf16,  // x86-64: + AVX512_BF16: bf16 scores (Q.K) with vdpbf16ps; built where the
                // compiler has it, used only when KVFLASH_CPU_ISA names it
  neon,      // aarch64: Advanced SIMD intrinsics (every aarch64 CPU has it)
};

const char* isa_name(Isa isa);

// The levels compiled into this build that this CPU can run, lowest first (baseline always): the
// x86-64 levels on x86-64, neon on aarch64.
std::vector<Isa> supported_isas();

// The level a KVFLASH_CPU_ISA value asks for among `supported` (supported_isas()); empty or
// "auto": the highest but avx512_bf16. Throws kvflash::Error naming KVFLASH_CPU_ISA for an unknown name or a
// level not supported.
Isa requested_isa(const std::string& value, const std::vector<Isa>& supported);

// The level attend() uses: KVFLASH_CPU_ISA read at the first call, unless set_active_isa() chose.
Isa active_isa();
void set_active_isa(Isa isa);

}  // namespace kvflash::cpu
