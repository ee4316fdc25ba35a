// The family rule: which kernel family, kernel shape, instantiation and tile run a call, from the
// values a PlanKey holds (real arch, dtype, head dims, shape). The planner records its answer in
// the Plan (Plan::kernel, block_m, block_n) and plans splits the family's way; the CUDA
// dispatcher launches exactly the Plan's kernel from the instantiation table
// (src/cuda/instantiations.def). Host and device, constexpr.
//
// Adding a family: one row in kernel_family() (and in family_tile() if it has its own tile
// table), its rows in the instantiation table, and its folder src/cuda/<family>/.
#pragma once

#include "core/limits.h"
#include "core/tile_size.h"
#include "kvflash/kernel_family.h"

namespace kvflash::core {

// What the rule reads (a PlanKey's fields; see family_inputs() in the planner).
struct FamilyInputs {
  int arch = 0;             // 0: CPU, else compute capability * 10 as the device reports it
  bool sixteen_bit = true;  // fp16 / bf16 inputs
  int headdim = 0;
  int headdim_v = 0;
  int64_t packed_rows = 0;  // max_seqlen_q x query heads per KV head (the kernels pack GQA)
};

// Rows, first match wins. Every GPU runs the portable sm80 kernels until a family with its own
// kernels adds its row above (e.g. arch >= 90 && sixteen_bit && ... -> sm90).
KVFLASH_HD constexpr KernelFamily kernel_family(const FamilyInputs& in) {
  if (in.arch == 0) return KernelFamily::cpu;
  return KernelFamily::sm80;
}

// The family's tile table (core/tile_size.h).
KVFLASH_HD constexpr TileSize family_tile(KernelFamily family, const TileInputs& in) {
  return family == KernelFamily::sm90 ? tile_size_sm90(in) : tile_size_sm80(in);
}

// Head dims of the instantiation that runs (d, d_v): (192, 128) for its own shape, else the
// wider rounded dim for both (core/tile_size.h round_up_headdim).
struct InstanceDims {
  int headdim = 0;
  int headdim_v = 0;
};
KVFLASH_HD constexpr InstanceDims instance_dims(int headdim, int headdim_v) {
  const int d = round_up_headdim(headdim), dv = round_up_headdim(headdim_v);
  if (d == 192 && dv <= 128) return {192, 128};
  const int widest = d > dv ? d : dv;
  return {widest, widest};
}

// The sm80 family's kernel: the decode kernel up to 16 packed query rows per KV head, with both
// 8-row tiles in one CTA (K and V read once) where their registers fit (widest head dim <= 128),
// else one CTA per 8 rows; the prefill kernel beyond.
KVFLASH_HD constexpr KernelShape sm80_shape(int64_t packed_rows, const InstanceDims& dims) {
  const int widest = dims.headdim > dims.headdim_v ? dims.headdim : dims.headdim_v;
  if (packed_rows <= 8) return KernelShape::decode_8;
  if (packed_rows <= 16) return widest <= 128 ? KernelShape::decode_16 : KernelShape::decode_8;
  return KernelShape::prefill;
}

// The kernel of `family` for a call (the planner asks for the rule's family; tests for others).
KVFLASH_HD constexpr KernelChoice family_kernel(KernelFamily family, const FamilyInputs& in) {
  if (family == KernelFamily::cpu) return KernelChoice{};
  const InstanceDims dims = instance_dims(in.headdim, in.headdim_v);
  const KernelShape shape = family == KernelFamily::sm80 ? sm80_shape(in.packed_rows, dims)
                                                         : KernelShape::prefill;
  return KernelChoice{family, shape, dims.headdim, dims.headdim_v};
}

KVFLASH_HD constexpr KernelChoice choose_kernel(const FamilyInputs& in) {
  return family_kernel(kernel_family(in), in);
}

}  // namespace kvflash::core
