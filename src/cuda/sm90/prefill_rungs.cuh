// The tile of each head dim and rung; included by the instantiation files (prefill_inst_*.cu) only.
#pragma once

#include "cuda/sm90/prefill.h"
#include "cuda/sm90/prefill_kernel.cuh"

namespace kvflash::cuda::sm90 {

template <class Elem, int kHeadDim>
void launch_prefill_rung(const AttentionParams& p, int kv_group, int rung, cudaStream_t stream) {
  // 128 keys per block up to head dim 128; 64 at 256 (two stages of K and V then fit beside Q).
  constexpr int kBlockN = prefill_block_n(kHeadDim);
  switch (rung) {
    case 1: return launch_prefill<PrefillTraits<Elem, kHeadDim, 64, kBlockN, 2, 1, false>>(p, kv_group, stream);
    case 2: return launch_prefill<PrefillTraits<Elem, kHeadDim, 128, kBlockN, 2, 2, false>>(p, kv_group, stream);
    case 3: return launch_prefill<PrefillTraits<Elem, kHeadDim, 128, kBlockN, 2, 2, true>>(p, kv_group, stream);
    default: return launch_prefill<PrefillTraits<Elem, kHeadDim, 128, kBlockN, 2, 2, true, true>>(p, kv_group, stream);
  }
}

}  // namespace kvflash::cuda::sm90
