// Launching the sm90_mla family's attention (mla_kernel.cuh); included by the units CMake
// generates from the instantiation table, one per dtype.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "cuda/sm90_mla/launch.h"
#include "cuda/sm90_mla/mla_kernel.cuh"

namespace kvflash::cuda {

template <class Elem, int kHeadDim, int kHeadDimV>
void launch_sm90_mla_attention(const AttentionParams& p, KernelShape /*shape*/, bool overlap_previous,
                               cudaStream_t stream) {
  static_assert(kHeadDim == 64 && kHeadDimV == 512, "the sm90_mla family runs MLA's 64 / 512 rows");
  sm90::launch_mla<Elem>(p, overlap_previous, stream);
}

}  // namespace kvflash::cuda
