// The sm80 family's attention launcher, as the dispatcher (backend.cu) sees it: one instantiation
// per (dtype, head dims) row of src/cuda/instantiations.def. overlap_previous (sm_90+): launched
// to overlap the stream's previous kernel (common/launch.cuh).
#pragma once

#include <cuda_runtime.h>

#include "cuda/common/params.h"
#include "kvflash/kernel_family.h"

namespace kvflash::cuda {

template <class Elem, int kHeadDim, int kHeadDimV>
void launch_sm80_attention(const AttentionParams& p, KernelShape shape, bool overlap_previous,
                           cudaStream_t stream);

}  // namespace kvflash::cuda
