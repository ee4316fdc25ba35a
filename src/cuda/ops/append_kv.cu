// Appending new K/V rows into the cache (contract 5.2), with rotary on K, and rotating q into the
// workspace. Positions come from the device lengths (lengths.cuh); a row whose position or page
// is out of range is skipped, never written out of bounds.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda/ops/kernels.h"
#include "cuda/common/lengths.cuh"
#include "cuda/common/mma.cuh"

namespace kvflash::cuda {
namespace {

// Channel c of a row at rotary position `pos` (contract 5.2): pairs (2p, 2p+1) when interleaved,
// (p, p + dim/2) otherwise; channels >= dim pass through. fp32 math, rounded once.
template <class Elem>
__device__ __forceinline__ Elem rotate_channel(const Elem* row, int c, int pos, const RotaryParams& r) {
  const float x = to_float(row[c]);
  if (c >= r.dim || pos < 0 || pos >= r.rows) return row[c];
  const int half = r.dim / 2;
  const bool first = r.interleaved ? (c % 2 == 0) : (c < half);
  const int pair = r.interleaved ? c / 2 : (first ? c : c - half);
  const int partner = r.interleaved ? (c ^ 1) : (first ? c + half : c - half);
  const int64_t at = int64_t(pos) * r.row_stride + int64_t(pair) * r.col_stride;
  const float cs = to_float(static_cast<const Elem*>(r.cos)[at]);
  const float sn = to_float(static_cast<const Elem*>(r.sin)[at]);
  const float y = to_float(row[partner]);
  return from_float<Elem>(first ? x * cs - y * sn : y * sn + x * cs);
}

template <class Elem>
__global__ void append_kv_kernel(const AppendParams p) {
  const int b = blockIdx.y;
  const SeqLens seq = seq_lens(p.len, b);
  const RotaryParams& rot = p.rotary;  // dim 0 without rotary
  const int64_t batch = p.len.cu_seqlens_k_new.data ? 0 : b;
  for (int t = blockIdx.x; t < seq.seqlen_knew; t += gridDim.x) {
    const int pos = seq.cache_seqlen + t;
    const int64_t token = seq.knew_offset + t;
    for (int e = threadIdx.x; e < p.num_heads_k * (p.headdim + p.headdim_v); e += blockDim.x) {
      const bool is_k = e < p.num_heads_k * p.headdim;
      const int dim = is_k ? p.headdim : p.headdim_v;
      const int rel = is_k ? e : e - p.num_heads_k * p.headdim;
      const int hk = rel / dim, c = rel - hk * dim;
      const RowLayout& src = is_k ? p.k_new : p.v_new;
      const Elem* row = static_cast<const Elem*>(src.data) + batch * src.batch_stride +
                        token * src.token_stride + hk * src.head_stride;
      const int64_t off = is_k ? cache_offset(p.cache, seq.cache_row, pos, p.cache.k_row_stride,
                                              p.cache.k_pos_stride, p.cache.k_head_stride, hk)
                               : cache_offset(p.cache, seq.cache_row, pos, p.cache.v_row_stride,
                                              p.cache.v_pos_stride, p.cache.v_head_stride, hk);
      if (off < 0) continue;
      Elem* dst = static_cast<Elem*>(is_k ? p.cache.k : p.cache.v) + off;
      dst[c] = is_k ? rotate_channel(row, c, seq.rotary_start + t, rot) : row[c];
    }
  }
}

template <class Elem>
__global__ void rotate_q_kernel(const RotateQParams p) {
  const int b = blockIdx.y;
  const SeqLens seq = seq_lens(p.len, b);
  const RotaryParams& rot = p.rotary;
  const int64_t batch = p.len.cu_seqlens_q.data ? 0 : b;
  for (int i = blockIdx.x; i < seq.seqlen_q; i += gridDim.x) {
    const int64_t token = seq.q_offset + i;
    const int pos = seq.rotary_start + (p.per_row ? i : 0);
    for (int e = threadIdx.x; e < p.num_heads * p.headdim; e += blockDim.x) {
      const int h = e / p.headdim, c = e - h * p.headdim;
      const Elem* row = static_cast<const Elem*>(p.q.data) + batch * p.q.batch_stride +
                        token * p.q.token_stride + h * p.q.head_stride;
      Elem* dst = static_cast<Elem*>(p.q_rot.data) + batch * p.q_rot.batch_stride +
                  token * p.q_rot.token_stride + h * p.q_rot.head_stride;
      dst[c] = rotate_channel(row, c, pos, rot);
    }
  }
}

}  // namespace

template <class Elem>
void launch_append_kv(const AppendParams& p, int max_new_rows, cudaStream_t stream) {
  if (p.len.batch == 0 || max_new_rows <= 0) return;
  const dim3 grid(max_new_rows < 512 ? max_new_rows : 512, p.len.batch);
  append_kv_kernel<Elem><<<grid, 128, 0, stream>>>(p);
}

template <class Elem>
void launch_rotate_q(const RotateQParams& p, cudaStream_t stream) {
  if (p.len.batch == 0 || p.len.seqlen_q <= 0) return;
  const dim3 grid(p.len.seqlen_q < 512 ? p.len.seqlen_q : 512, p.len.batch);
  rotate_q_kernel<Elem><<<grid, 128, 0, stream>>>(p);
}

template void launch_append_kv<__nv_bfloat16>(const AppendParams&, int, cudaStream_t);
template void launch_append_kv<__half>(const AppendParams&, int, cudaStream_t);
template void launch_rotate_q<__nv_bfloat16>(const RotateQParams&, cudaStream_t);
template void launch_rotate_q<__half>(const RotateQParams&, cudaStream_t);

}  // namespace kvflash::cuda
