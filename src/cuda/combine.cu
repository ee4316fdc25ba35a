// Merging split-KV partials through their LSE (FA3's combine): one warp per output row. A split
// whose LSE is -inf (empty) adds nothing, and its partial row is never read, so garbage or NaN in
// it cannot leak; a row with every split empty gets out 0 and LSE -inf.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>

#include "cuda/kernels.h"
#include "cuda/mma.cuh"

namespace kvflash::cuda {
namespace {

template <class Out>
__device__ __forceinline__ void store(void* base, int64_t at, float v) {
  if constexpr (std::is_same_v<Out, float>) static_cast<float*>(base)[at] = v;
  else static_cast<Out*>(base)[at] = from_float<Out>(v);
}

template <class Out>
__global__ void combine_kernel(const CombineParams p) {
  const int warps_per_block = blockDim.x / 32;
  const int64_t row = int64_t(blockIdx.x) * warps_per_block + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int64_t rows = int64_t(p.dim_a) * p.dim_b * p.dim_c;
  if (row >= rows) return;
  const int c = int(row % p.dim_c);
  const int bb = int((row / p.dim_c) % p.dim_b);
  const int a = int(row / (int64_t(p.dim_c) * p.dim_b));
  const float* lse_row = p.lse_partial + a * p.lp_a + bb * p.lp_b + c * p.lp_c;
  const float* out_row = p.out_partial + a * p.op_a + bb * p.op_b + c * p.op_c;

  float max_lse = -INFINITY;
  for (int s = 0; s < p.num_splits; ++s) max_lse = fmaxf(max_lse, lse_row[s * p.lp_split]);
  const bool empty = max_lse == -INFINITY || isnan(max_lse);
  float sum = 0.0f;
  if (!empty) {
    for (int s = 0; s < p.num_splits; ++s) {
      const float l = lse_row[s * p.lp_split];
      if (l != -INFINITY) sum += expf(l - max_lse);
    }
  }
  const float lse = empty ? -INFINITY : max_lse + logf(sum);
  for (int d = lane; d < p.headdim_v; d += 32) {
    float acc = 0.0f;
    if (!empty) {
      for (int s = 0; s < p.num_splits; ++s) {
        const float l = lse_row[s * p.lp_split];
        if (l != -INFINITY) acc += expf(l - lse) * out_row[s * p.op_split + d];
      }
    }
    store<Out>(p.out, a * p.o_a + bb * p.o_b + c * p.o_c + d, acc);
  }
  if (lane == 0 && p.lse) p.lse[a * p.l_a + bb * p.l_b + c * p.l_c] = lse;
}

}  // namespace

void launch_combine(const CombineParams& p, ElemType out_type, cudaStream_t stream) {
  const int64_t rows = int64_t(p.dim_a) * p.dim_b * p.dim_c;
  if (rows == 0) return;
  constexpr int kWarps = 8;
  const unsigned blocks = unsigned((rows + kWarps - 1) / kWarps);
  switch (out_type) {
    case ElemType::bf16: combine_kernel<__nv_bfloat16><<<blocks, 32 * kWarps, 0, stream>>>(p); break;
    case ElemType::f16: combine_kernel<__half><<<blocks, 32 * kWarps, 0, stream>>>(p); break;
    case ElemType::f32: combine_kernel<float><<<blocks, 32 * kWarps, 0, stream>>>(p); break;
  }
}

}  // namespace kvflash::cuda
