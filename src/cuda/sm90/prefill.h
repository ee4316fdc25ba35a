// The Hopper (sm_90a) prefill family's entry points (prefill_kernel.cuh). The kernels are built
// only in full CUDA builds (cmake/cuda.cmake: kvflash_sm90, sm_90a, one file per dtype and head
// dim); prefill_takes says no in a build without them.
#pragma once

#include <cuda_runtime.h>

#include "core/problem.h"
#include "cuda/params.h"
#include "kvflash/plan.h"

namespace kvflash::cuda::sm90 {

// Whether this call runs on the sm90 prefill family (else the portable sm80 kernels): an sm_90
// device, bf16 / fp16, d == d_v in {64, 128, 256}, one split, at least 64 query rows, and a dense
// cache or pages holding whole key blocks without leftpad.
bool prefill_takes(const core::Problem& p, const Plan& plan);

// Keys per block of head dim d (a paged cache needs page_size % this == 0).
constexpr int prefill_block_n(int headdim) { return headdim <= 128 ? 128 : 64; }

// The rungs of the ladder the family was built by (BENCHMARKS.md, session 4), kept for timing:
// 1: one consumer warp group (64 rows); 2: two consumer groups (128 rows) with the producer's
// registers given to them; 3: 2 + the softmax of one key block overlapping the next GEMMs inside
// a group; 4: 3 + the groups taking turns at the tensor cores (ping-pong).
constexpr int kRungs = 4;
constexpr int kBestRung = 4;

// Attention over `p` (one split; rows are query indices of one head, K / V head = query head /
// kv_group) by rung `rung`'s kernel.
template <class Elem, int kHeadDim>
void launch_prefill_rung(const AttentionParams& p, int kv_group, int rung, cudaStream_t stream);

}  // namespace kvflash::cuda::sm90
