// The sm90 family's attention launcher, as the dispatcher (backend.cu) sees it: one instantiation
// per (dtype, head dims) row of src/cuda/instantiations.def (d == d_v in {64, 96, 128, 192, 256},
// and 192 / 128).
#pragma once

#include <cuda_runtime.h>

#include "cuda/common/params.h"
#include "kvflash/kernel_family.h"

namespace kvflash::cuda {

template <class Elem, int kHeadDim, int kHeadDimV>
void launch_sm90_attention(const AttentionParams& p, KernelShape shape, bool overlap_previous,
                           cudaStream_t stream);

}  // namespace kvflash::cuda
