// Kernel launches that may overlap the stream's previous kernel (programmatic dependent launch,
// sm_90+): such a kernel's CTAs may start while that kernel finishes, so every kernel launched
// this way calls wait_for_prerequisites() (mma.cuh) before its first global memory access.
#pragma once

#include <cuda_runtime.h>

#include "cuda/common/per_device.h"

namespace kvflash::cuda {

// cudaFuncSetAttribute(kernel, MaxDynamicSharedMemorySize, bytes), once per device: the attribute
// stays set in the device's context, and asking the runtime again on every launch cost host time
// on every call. kKernel is the kernel's own function, so each kernel has its own slots. A failed
// opt-in is not recorded: its error is left for the launch's cudaGetLastError() to report.
template <auto kKernel>
void opt_in_dynamic_smem(int bytes) {
  static PerDeviceValue done;
  int device = -1;
  if (cudaGetDevice(&device) == cudaSuccess && done.get(device) == uint64_t(bytes)) return;
  if (cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes) == cudaSuccess)
    done.set(device, uint64_t(bytes));
}

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
