// The sm90_mla family's attention launcher, as the dispatcher (backend.cu) sees it: one
// instantiation per dtype at MLA's head dims (64, 512) (src/cuda/instantiations.def).
#pragma once

#include <cuda_runtime.h>

#include "cuda/common/params.h"
#include "kvflash/kernel_family.h"

namespace kvflash::cuda {

template <class Elem, int kHeadDim, int kHeadDimV>
void launch_sm90_mla_attention(const AttentionParams& p, KernelShape shape, bool overlap_previous,
                               cudaStream_t stream);

}  // namespace kvflash::cuda
