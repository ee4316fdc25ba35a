#include "cpu/isa.h"

#include <atomic>
#include <cstdlib>
#include <iterator>
#if KVFLASH_CPU_X86_LEVELS
#include <cpuid.h>
#endif

#include "kvflash/errors.h"

namespace kvflash::cpu {
namespace {

constexpr const char* kEnvVar = "KVFLASH_CPU_ISA";

// Every level's name is known everywhere (asking for avx2 on aarch64 says "cannot run it");
// kLevels: the ones this build compiled, lowest first.
constexpr Isa kAllLevels[] = {Isa::baseline, Isa::avx2, Isa::avx512, Isa::avx512_bf16, Isa::neon};
#if KVFLASH_CPU_AVX512_BF16_LEVEL
constexpr Isa kLevels[] = {Isa::baseline, Isa::avx2, Isa::avx512, Isa::avx512_bf16};
#elif KVFLASH_CPU_X86_LEVELS
constexpr Isa kLevels[] = {Isa::baseline, Isa::avx2, Isa::avx512};
#elif KVFLASH_CPU_ARM_LEVELS
constexpr Isa kLevels[] = {Isa::baseline, Isa::neon};
#else
constexpr Isa kLevels[] = {Isa::baseline};
#endif

#if KVFLASH_CPU_X86_LEVELS
// F16C from CPUID leaf 1 (ECX bit 29): clang 14's __builtin_cpu_supports has no "f16c".
bool has_f16c() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & (1u << 29)) != 0;
}

// AVX512_BF16 from CPUID leaf 7 subleaf 1 (EAX bit 5): GCC 12's and clang 14's
// __builtin_cpu_supports do not agree on its name. Whether the OS saves the ZMM registers is
// checked by __builtin_cpu_supports("avx512f"), which this level also requires.
bool has_avx512_bf16() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx) && (eax & (1u << 5)) != 0;
}
#endif

// __builtin_cpu_supports also checks that the OS saves the AVX / AVX-512 registers (XCR0).
bool cpu_runs(Isa isa) {
#if KVFLASH_CPU_X86_LEVELS
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && has_f16c();
  const bool avx512 = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
                      __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
  switch (isa) {
    case Isa::baseline: return true;
    case Isa::avx2: return avx2;
    case Isa::avx512: return avx512;
    case Isa::avx512_bf16: return avx512 && has_avx512_bf16();
    case Isa::neon: return false;
  }
  return false;
#elif KVFLASH_CPU_ARM_LEVELS
  // Advanced SIMD is mandatory on aarch64 Linux (the baseline code uses it too): nothing to ask.
  return isa == Isa::baseline || isa == Isa::neon;
#else
  return isa == Isa::baseline;
#endif
}

std::string names_of(const std::vector<Isa>& levels) {
  std::string names;
  for (Isa isa : levels) names += (names.empty() ? "" : ", ") + std::string(isa_name(isa));
  return names;
}

// avx512_bf16 decodes no faster than avx512 on the CPU measured (slower by about 1.5 % where
// decode is memory-bound: BENCHMARKS.md), so it runs only when asked for.
Isa highest_automatic(const std::vector<Isa>& supported) {
  return supported.back() == Isa::avx512_bf16 ? supported[supported.size() - 2] : supported.back();
}

// -1: not chosen yet (read KVFLASH_CPU_ISA at the first call).
std::atomic<int> g_active{-1};

}  // namespace

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::baseline: return "baseline";
    case Isa::avx2: return "avx2";
    case Isa::avx512: return "avx512";
    case Isa::avx512_bf16: return "avx512_bf16";
    case Isa::neon: return "neon";
  }
  return "?";
}

std::vector<Isa> supported_isas() {
  std::vector<Isa> levels;
  for (Isa isa : kLevels) {
    if (cpu_runs(isa)) levels.push_back(isa);
  }
  return levels;
}

Isa requested_isa(const std::string& value, const std::vector<Isa>& supported) {
  if (value.empty() || value == "auto") return highest_automatic(supported);
  for (Isa isa : kAllLevels) {
    if (value != isa_name(isa)) continue;
    for (Isa s : supported) {
      if (s == isa) return isa;
    }
    throw Error(ErrorKind::unsupported, kEnvVar,
                std::string(kEnvVar) + "=" + value + ": this CPU or build cannot run it (supported here: " +
                    names_of(supported) + ")");
  }
  throw Error(ErrorKind::invalid_value, kEnvVar,
              std::string(kEnvVar) + "=" + value + ": expected auto, " +
                  names_of(std::vector<Isa>(std::begin(kAllLevels), std::end(kAllLevels))));
}

Isa active_isa() {
  int level = g_active.load(std::memory_order_relaxed);
  if (level < 0) {
    const char* value = std::getenv(kEnvVar);
    level = int(requested_isa(value ? value : "", supported_isas()));
    g_active.store(level, std::memory_order_relaxed);
  }
  return Isa(level);
}

void set_active_isa(Isa isa) { g_active.store(int(isa), std::memory_order_relaxed); }

}  // namespace kvflash::cpu
