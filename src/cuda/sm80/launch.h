// The sm80 family's attention launcher, as the dispatcher (backend.cu) sees it: one instantiation
// per (dtype, head dims) row of src/cuda/instantiations.def. Row: the query's 16-bit type, or
// E4m3Cache<it> for a query over an fp8 e4m3 cache (cuda/common/fp8.cuh). overlap_previous
// (sm_90+): launched to overlap the stream's previous kernel (common/launch.cuh).
#pragma once

#include <cuda_runtime.h>

#include "cuda/common/params.h"
#include "kvflash/kernel_family.h"

namespace kvflash::cuda {

template <class Row, int kHeadDim, int kHeadDimV>
void launch_sm80_attention(const AttentionParams& p, KernelShape shape, bool overlap_previous,
                           cudaStream_t stream);

}  // namespace kvflash::cuda
