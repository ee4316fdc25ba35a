// cpu::attend: the copy of attention.cpp for the active instruction-set level (cpu/isa.h).
#include "cpu/isa.h"
#include "cpu/kernels.h"

namespace kvflash::cpu {

void attend(const core::Problem& p, const Plan& plan, const Outputs& outputs, const Partials* partials,
            int num_threads) {
  switch (active_isa()) {
#if KVFLASH_CPU_AVX512_BF16_LEVEL
    case Isa::avx512_bf16: return avx512_bf16::attend(p, plan, outputs, partials, num_threads);
#endif
#if KVFLASH_CPU_X86_LEVELS
    case Isa::avx512: return avx512::attend(p, plan, outputs, partials, num_threads);
    case Isa::avx2: return avx2::attend(p, plan, outputs, partials, num_threads);
#elif KVFLASH_CPU_ARM_LEVELS
    case Isa::neon: return neon::attend(p, plan, outputs, partials, num_threads);
#endif
    default: return baseline::attend(p, plan, outputs, partials, num_threads);
  }
}

}  // namespace kvflash::cpu
