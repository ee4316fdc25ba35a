// Per-batch split counts on the device (FA3's dynamic rule, spec 6.3, as core/heuristics.cpp
// writes it for the host): a Plan's static decisions stay, its per-batch vector is recomputed from
// the lengths in device memory, so a plan refreshes for a new decode step without a host sync and
// inside a CUDA graph. One CTA: FA3 computes dynamic splits only for batches up to 992.
#include <cmath>

#include "cuda/kernels.h"
#include "cuda/lengths.cuh"

namespace kvflash::cuda {
namespace {

constexpr int kMaxDynamicSplitBatch = 992;  // core::kMaxDynamicSplitBatch
constexpr int kThreads = 1024;

__device__ __forceinline__ int ceil_div_int(int a, int b) { return (a + b - 1) / b; }

__global__ void __launch_bounds__(kThreads) prepare_kernel(const PrepareParams p) {
  __shared__ unsigned long long total_blocks;
  if (threadIdx.x == 0) total_blocks = 0;
  __syncthreads();
  const bool dynamic = p.len.batch <= kMaxDynamicSplitBatch && p.num_splits > 1;
  if (dynamic) {
    unsigned long long mine = 0;
    for (int b = threadIdx.x; b < p.len.batch; b += kThreads) {
      const SeqLens s = seq_lens(p.len, b);
      mine += (unsigned long long)ceil_div_int(s.seqlen_q * p.group, p.block_m) *
              (unsigned long long)ceil_div_int(s.seqlen_k, p.block_n);
    }
    atomicAdd(&total_blocks, mine);
  }
  __syncthreads();
  const float per_sm = ceilf(__fdiv_rn(__fmul_rn(__fmul_rn(float(total_blocks), 1.1f), float(p.heads)),
                                       float(p.num_sms)));
  const long long blocks_per_sm = per_sm < 1.0f ? 1 : (long long)per_sm;
  for (int b = threadIdx.x; b < p.len.batch; b += kThreads) {
    int splits = 1;
    if (dynamic) {
      const SeqLens s = seq_lens(p.len, b);
      const long long n_blocks = ceil_div_int(s.seqlen_k, p.block_n);
      const long long wanted = (n_blocks + blocks_per_sm - 1) / blocks_per_sm;
      splits = int(wanted < 1 ? 1 : (wanted > p.num_splits ? p.num_splits : wanted));
    }
    p.splits_out[b] = splits;
  }
}

}  // namespace

void launch_prepare(const PrepareParams& p, cudaStream_t stream) {
  if (p.len.batch == 0) return;
  prepare_kernel<<<1, kThreads, 0, stream>>>(p);
}

}  // namespace kvflash::cuda
