// Which kernels run a call: a Plan records its family, the kernel's shape and the head dims of the
// instantiation (src/core/kernel_family.h has the rule that picks them, docs/contract.md section
// 6 the planning each family does). Plain data, no dependencies.
#pragma once

#include <cstdint>

namespace kvflash {

enum class KernelFamily : int8_t {
  cpu,   // the CPU backend (plans like sm80's tiles, FA3's split rule)
  sm80,  // the portable mma.sync kernels, any GPU from sm_80 on (kvflash's split rule)
  sm90,  // the Hopper kernels (sm_90a: TMA, wgmma, warp specialisation), prefill shapes only
         // (core/kernel_family.h says which calls); FA3's split rule at their own tile
  sm90_mla,  // the Hopper MLA decode kernel (sm_90a, wgmma): calls with qv and few query tokens,
             // one 576-wide key row (64 rope + 512 latent) per key; kvflash's split rule
};

enum class KernelShape : int8_t {
  none,       // the CPU backend
  decode_8,   // decode kernel, 8 packed query rows per CTA
  decode_16,  // decode kernel, 16 packed query rows per CTA (K and V read once for both tiles)
  prefill,    // prefill kernel, the plan's block_m packed rows per CTA
  mla_decode, // the sm90_mla kernel, the plan's block_m (64) packed rows per CTA
  prefill_small_tiles,  // the sm90 prefill kernel over 64 x 64 tiles, two CTAs per SM (short prompts)
  prefill_three_groups,  // the sm90 prefill kernel over 192 x 128 tiles, three consumer groups (d <= 64)
};

struct KernelChoice {
  KernelFamily family = KernelFamily::cpu;
  KernelShape shape = KernelShape::none;
  int headdim = 0;    // of the instantiation (the call's rounded up); 0 on the CPU
  int headdim_v = 0;

  constexpr bool operator==(const KernelChoice&) const = default;
};

const char* family_name(KernelFamily family);
const char* shape_name(KernelShape shape);

}  // namespace kvflash
