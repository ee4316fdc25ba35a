// Kernel launches that may overlap the stream's previous kernel (programmatic dependent launch,
// sm_90+): such a kernel's CTAs may start while that kernel finishes, so every kernel launched
// this way calls wait_for_prerequisites() (mma.cuh) before its first global memory access.
#pragma once

#include <cuda_runtime.h>

namespace kvflash::cuda {

template <class... Params, class... Args>
void launch_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, bool overlap_previous,
                   cudaStream_t stream, const Args&... args) {
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  cudaLaunchAttribute overlap[1];
  overlap[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  overlap[0].val.programmaticStreamSerializationAllowed = 1;
  if (overlap_previous) {
    config.attrs = overlap;
    config.numAttrs = 1;
  }
  cudaLaunchKernelEx(&config, kernel, args...);
}

}  // namespace kvflash::cuda
