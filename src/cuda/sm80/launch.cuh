// Launching the sm80 family's attention: the decode kernel (8 or 16 packed query rows per CTA)
// or the prefill kernel, as the Plan's kernel shape says (core/kernel_family.h).
// launch_sm80_attention is instantiated once per row of the instantiation table
// (src/cuda/instantiations.def), in units CMake generates.
#pragma once

#include <cuda_runtime.h>

#include "core/kernel_family.h"
#include "cuda/common/launch.cuh"
#include "cuda/common/params.h"
#include "cuda/sm80/decode_kernel.cuh"
#include "cuda/sm80/launch.h"
#include "cuda/sm80/prefill_kernel.cuh"
#include "kvflash/kernel_family.h"

namespace kvflash::cuda {

// The grid fits (the host checked it before the call's first kernel: cuda/host/call_params.h).
template <auto kKernel, int kRows, int kThreads, int kSmemBytes>
void launch_over_columns(const AttentionParams& p, bool overlap_previous, cudaStream_t stream) {
  opt_in_dynamic_smem<kKernel>(kSmemBytes);
  const AttentionGrid g = attention_grid(p, kRows);
  if (g.x == 0 || g.z == 0) return;
  launch_kernel(kKernel, dim3(unsigned(g.x), unsigned(g.y), unsigned(g.z)), kThreads, kSmemBytes,
                overlap_previous, stream, p);
}

template <class T>
void launch_decode(const AttentionParams& p, bool overlap_previous, cudaStream_t stream) {
  launch_over_columns<decode_kernel<T>, T::kRows, T::kThreads, T::kSmemBytes>(p, overlap_previous, stream);
}

template <class T>
void launch_prefill(const AttentionParams& p, bool overlap_previous, cudaStream_t stream) {
  launch_over_columns<attention_kernel<T>, T::kBlockM, T::kThreads, T::kSmemBytes>(p, overlap_previous, stream);
}

// The two-tile decode CTA is compiled only for head dims the rule gives it to.
template <class Row, int kHeadDim, int kHeadDimV>
void launch_sm80_attention(const AttentionParams& p, KernelShape shape, bool overlap_previous,
                           cudaStream_t stream) {
  constexpr bool kTwoTiles =
      core::sm80_shape(16, core::InstanceDims{kHeadDim, kHeadDimV}) == KernelShape::decode_16;
  if (shape == KernelShape::prefill) {
    return launch_prefill<PrefillTraits<Row, kHeadDim, kHeadDimV>>(p, overlap_previous, stream);
  }
  if constexpr (kTwoTiles) {
    if (shape == KernelShape::decode_16) {
      return launch_decode<DecodeTraits<Row, kHeadDim, kHeadDimV, 2>>(p, overlap_previous, stream);
    }
  }
  launch_decode<DecodeTraits<Row, kHeadDim, kHeadDimV, 1>>(p, overlap_previous, stream);
}

}  // namespace kvflash::cuda
