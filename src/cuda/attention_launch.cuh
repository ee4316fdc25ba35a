// Launching attention: the decode kernel for at most 16 packed query rows per KV head, the prefill
// kernel otherwise. launch_attention is instantiated once per (dtype, head dims) in
// attention_inst_*.cu.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "kvflash/errors.h"
#include "cuda/attention_kernel.cuh"
#include "cuda/decode_kernel.cuh"
#include "cuda/launch.cuh"
#include "cuda/params.h"

namespace kvflash::cuda {

// One CTA per kRows packed query rows x KV head x (sequence, split) column.
template <int kRows, int kThreads, int kSmemBytes>
void launch_over_columns(void (*kernel)(AttentionParams), const AttentionParams& p, bool overlap_previous,
                         cudaStream_t stream) {
  cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
  const int packed_max = p.len.seqlen_q * p.group;
  const int columns = p.split_work ? p.num_split_work : p.len.batch * p.num_splits;
  const dim3 grid((packed_max + kRows - 1) / kRows, p.num_heads_k, columns);
  if (grid.x == 0 || grid.z == 0) return;
  if (grid.z > 65535) {
    throw Error(ErrorKind::unsupported, "num_splits",
                "batch * num_splits above 65535 is not supported on CUDA yet (got " +
                    std::to_string(grid.z) + ")");
  }
  launch_kernel(kernel, grid, kThreads, kSmemBytes, overlap_previous, stream, p);
}

template <class T>
void launch_decode(const AttentionParams& p, bool overlap_previous, cudaStream_t stream) {
  launch_over_columns<T::kRows, T::kThreads, T::kSmemBytes>(decode_kernel<T>, p, overlap_previous, stream);
}

// Never launched to overlap the previous kernel (launch.cuh): batched prefill (thousands of short
// CTAs) ran about 2x slower on the H200 once launches overlapped (b32 x 512 d128 causal 548 ->
// 992 us; b1 x 16k, whose CTAs are long, did not move), with the same kernel code, registers and
// SASS; the overlap pays for the decode kernel's one-wave grids only. For a plainly launched
// grid wait_for_prerequisites returns at once; launch_dependents still lets a combine start early.
template <class T>
void launch_prefill(const AttentionParams& p, bool /*overlap_previous*/, cudaStream_t stream) {
  launch_over_columns<T::kBlockM, T::kThreads, T::kSmemBytes>(attention_kernel<T>, p, false, stream);
}

// Up to 16 packed rows: the decode kernel, with both 8-row tiles in one CTA (K and V read once)
// where their registers fit (widest head dim <= 128), else one CTA per 8 rows.
template <class Elem, int kHeadDim, int kHeadDimV>
void launch_attention(const AttentionParams& p, bool overlap_previous, cudaStream_t stream) {
  constexpr int kDecodeRowTiles = (kHeadDim > kHeadDimV ? kHeadDim : kHeadDimV) <= 128 ? 2 : 1;
  const int packed_rows = p.len.seqlen_q * p.group;
  if (packed_rows <= 8) {
    launch_decode<DecodeTraits<Elem, kHeadDim, kHeadDimV, 1>>(p, overlap_previous, stream);
  } else if (packed_rows <= 16) {
    launch_decode<DecodeTraits<Elem, kHeadDim, kHeadDimV, kDecodeRowTiles>>(p, overlap_previous, stream);
  } else {
    launch_prefill<PrefillTraits<Elem, kHeadDim, kHeadDimV>>(p, overlap_previous, stream);
  }
}

}  // namespace kvflash::cuda
