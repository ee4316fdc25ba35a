// Merging split-KV partials through their LSE (FA3's combine): one CTA per output row (a few
// consecutive rows per CTA for calls with very many rows, see combine_kernel), its threads spread
// over the splits (the LSEs, and the partial rows, warp w taking splits w, w + kWarps, ...). The
// first kWarps x kBatch partial rows load together with the LSEs, so a row of up to 64 splits
// costs one memory round trip after the attention kernel.
// A split whose LSE is -inf (empty) adds nothing: its partial row is selected away, never
// multiplied, so garbage or NaN in it cannot leak; a row with every split empty gets out 0 and
// LSE -inf.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>

#include "core/limits.h"
#include "cuda/ops/kernels.h"
#include "cuda/common/launch.cuh"
#include "cuda/common/lengths.cuh"
#include "cuda/common/mma.cuh"
#include "cuda/common/split_rule.cuh"

namespace kvflash::cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kThreads = 32 * kWarps;
using core::kMaxSplits;
// A kernel per bound on d_v: 256 (every head dim up to 256) and 512 (MLA). A warp holds kBatch
// partial rows of kMaxDv / 32 channels per lane: 64 registers either way.
template <int kMaxDv>
struct RowShape {
  static constexpr int kLaneChannels = kMaxDv / 32;
  static constexpr int kBatch = 8 * 256 / kMaxDv;  // partial rows per warp per round
};

template <class Out>
__device__ __forceinline__ void store(void* base, int64_t at, float v) {
  if constexpr (std::is_same_v<Out, float>) static_cast<float*>(base)[at] = v;
  else static_cast<Out*>(base)[at] = from_float<Out>(v);
}

// The CTA-wide max (is_max) or sum of v; every thread gets it.
__device__ float block_reduce(float v, bool is_max, float* scratch) {
  for (int o = 16; o > 0; o /= 2) {
    const float other = __shfl_xor_sync(0xffffffffu, v, o);
    v = is_max ? fmaxf(v, other) : v + other;
  }
  __syncthreads();  // the previous reduction's readers are done with scratch
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = v;
  __syncthreads();
  float r = scratch[0];
  for (int w = 1; w < kWarps; ++w) r = is_max ? fmaxf(r, scratch[w]) : r + scratch[w];
  return r;
}

// One output row (a, bb, c). Returns at once where the attention kernel wrote the row itself.
template <class Out, int kMaxDv>
__device__ __forceinline__ void combine_row(const CombineParams& p, int64_t row, float* scale,
                                            float (*warp_out)[kMaxDv], float* scratch) {
  constexpr int kLaneChannels = RowShape<kMaxDv>::kLaneChannels, kBatch = RowShape<kMaxDv>::kBatch;
  const int c = int(row % p.dim_c);
  const int bb = int((row / p.dim_c) % p.dim_b);
  const int a = int(row / (int64_t(p.dim_c) * p.dim_b));
  int splits = p.num_splits;
  int64_t token = bb;
  if (p.splits_per_batch || p.splits_alone) {
    // The element's split count first: most rows of a prefill-shaped call stop here.
    if (!p.splits_alone) {
      splits = clamp_int(p.splits_per_batch[a], 1, p.num_splits);
      if (splits == 1) return;  // the attention kernel wrote this row itself
    }
    const SeqLens seq = seq_lens(p.len, a);
    if (p.splits_alone) {
      splits = clamp_int(splits_alone(p.rule, seq.seqlen_q, seq.seqlen_k, p.num_splits), 1, p.num_splits);
      if (splits == 1) return;
    }
    if (p.len.cu_seqlens_q.data) {
      if (bb >= seq.seqlen_q) return;
      token = seq.q_offset + bb;
    }
  }
  wait_for_prerequisites();  // the attention kernel's partials (when launched to overlap it)
  const float* lse_row = p.lse_partial + a * p.lp_a + token * p.lp_b + c * p.lp_c;
  const float* out_row = p.out_partial + a * p.op_a + token * p.op_b + c * p.op_c;

  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  // Partial rows of splits s0 + u * kWarps (zero past the splits and the channels).
  float x[kBatch][kLaneChannels];
  auto load_round = [&](int s0) {
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int s = s0 + u * kWarps;
      const float* src = out_row + (s < splits ? s : 0) * p.op_split;
#pragma unroll
      for (int k = 0; k < kLaneChannels; ++k) {
        const int d = lane + 32 * k;
        x[u][k] = s < splits && d < p.headdim_v ? src[d] : 0.0f;
      }
    }
  };
  load_round(warp);

  constexpr int kPerThread = kMaxSplits / kThreads;
  float lse_s[kPerThread];
  float max_lse = -INFINITY;
#pragma unroll
  for (int i = 0; i < kPerThread; ++i) {
    const int s = tid + i * kThreads;
    lse_s[i] = s < splits ? lse_row[s * p.lp_split] : -INFINITY;
    max_lse = fmaxf(max_lse, lse_s[i]);
  }
  max_lse = block_reduce(max_lse, true, scratch);
  const bool empty = max_lse == -INFINITY || isnan(max_lse);
  float sum = 0.0f;
#pragma unroll
  for (int i = 0; i < kPerThread; ++i) {
    if (!empty && lse_s[i] != -INFINITY) sum += expf(lse_s[i] - max_lse);
  }
  sum = block_reduce(sum, false, scratch);
  const float lse = empty ? -INFINITY : max_lse + logf(sum);
#pragma unroll
  for (int i = 0; i < kPerThread; ++i) {
    const int s = tid + i * kThreads;
    if (s < splits) scale[s] = empty || lse_s[i] == -INFINITY ? 0.0f : expf(lse_s[i] - lse);
  }
  __syncthreads();

  float acc[kLaneChannels];
#pragma unroll
  for (int k = 0; k < kLaneChannels; ++k) acc[k] = 0.0f;
  for (int s0 = warp; s0 < splits; s0 += kBatch * kWarps) {
    if (s0 != warp) load_round(s0);
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int s = s0 + u * kWarps;
      const float sc = s < splits ? scale[s] : 0.0f;
#pragma unroll
      for (int k = 0; k < kLaneChannels; ++k) acc[k] = sc != 0.0f ? fmaf(sc, x[u][k], acc[k]) : acc[k];
    }
  }
#pragma unroll
  for (int k = 0; k < kLaneChannels; ++k) {
    const int d = lane + 32 * k;
    if (d < p.headdim_v) warp_out[warp][d] = acc[k];
  }
  __syncthreads();
  for (int d = tid; d < p.headdim_v; d += kThreads) {
    float v = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) v += warp_out[w][d];
    store<Out>(p.out, a * p.o_a + token * p.o_b + c * p.o_c + d, v);
  }
  if (tid == 0 && p.lse) p.lse[a * p.l_a + token * p.l_b + c * p.l_c] = lse;
}

// rows_per_cta consecutive rows per CTA (one, unless the call has very many rows): a CTA that only
// finds rows its attention kernel wrote itself costs one launch for all of them, not one each.
// (Batched prefill with a split bound > 1 but one split per sequence launched 262k CTAs that
// each exited at once: issue 13's regression.) The rows' shared memory reuse is ordered by the
// block reductions' barriers.
template <class Out, int kMaxDv>
__global__ void __launch_bounds__(kThreads) combine_kernel(const CombineParams p, int64_t rows, int rows_per_cta) {
  __shared__ float scale[kMaxSplits];
  __shared__ float warp_out[kWarps][kMaxDv];
  __shared__ float scratch[kWarps];
  launch_dependents();  // the next attention call's CTAs may start (and wait) now
  const int64_t first = int64_t(blockIdx.x) * rows_per_cta;
  const int64_t last = first + rows_per_cta < rows ? first + rows_per_cta : rows;
  for (int64_t row = first; row < last; ++row) combine_row<Out, kMaxDv>(p, row, scale, warp_out, scratch);
}

template <class Out>
void launch_typed(const CombineParams& p, unsigned blocks, int64_t rows, int rows_per_cta, bool overlap_previous,
                  cudaStream_t stream) {
  static_assert(core::kCudaMaxHeadDimV == 512, "the widest kernel below");
  auto* kernel = p.headdim_v <= 256 ? combine_kernel<Out, 256> : combine_kernel<Out, 512>;
  launch_kernel(kernel, blocks, kThreads, 0, overlap_previous, stream, p, rows, rows_per_cta);
}

}  // namespace

void launch_combine(const CombineParams& p, ElemType out_type, bool overlap_previous, cudaStream_t stream) {
  const int64_t rows = int64_t(p.dim_a) * p.dim_b * p.dim_c;
  if (rows == 0) return;
  // Decode-shaped calls keep one row per CTA; from 64k rows on, CTAs take up to 32 rows (at
  // least 8192 CTAs remain).
  const int rows_per_cta = rows < 65536 ? 1 : int(rows / 8192 < 32 ? rows / 8192 : 32);
  const unsigned blocks = unsigned((rows + rows_per_cta - 1) / rows_per_cta);
  switch (out_type) {
    case ElemType::bf16: return launch_typed<__nv_bfloat16>(p, blocks, rows, rows_per_cta, overlap_previous, stream);
    case ElemType::f16: return launch_typed<__half>(p, blocks, rows, rows_per_cta, overlap_previous, stream);
    case ElemType::f32: return launch_typed<float>(p, blocks, rows, rows_per_cta, overlap_previous, stream);
  }
}

}  // namespace kvflash::cuda
