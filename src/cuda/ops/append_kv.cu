// Appending new K/V rows into the cache (contract 5.2), with rotary on K (quantised into an fp8
// cache: 5.8), and copying q or qv into the workspace (QueryCopyParams: q rotated; an fp8 q
// converted to bf16 there, rotary or not, unless the kernel reads e4m3: then rotated in e4m3; q
// and qv scaled by their descales with qv over an fp8 cache). Positions come from the device
// lengths (lengths.cuh); a row whose position or page is out of range is skipped, never written
// out of bounds.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "cuda/ops/kernels.h"
#include "cuda/common/fp8.cuh"
#include "cuda/common/lengths.cuh"
#include "cuda/common/mma.cuh"

namespace kvflash::cuda {
namespace {

// Whether channel c at `pos` is rotated (else it keeps its bits in a cache of its own type).
__device__ __forceinline__ bool rotated(int c, int pos, const RotaryParams& r) {
  return c < r.dim && pos >= 0 && pos < r.rows;
}

// Channel c of a row at rotary position `pos` (contract 5.2), in fp32: pairs (2p, 2p+1) when
// interleaved, (p, p + dim/2) otherwise; channels >= dim pass through. The tables are of the
// row's type. The caller rounds once.
template <class T>
__device__ __forceinline__ float rotate_channel(const T* row, int c, int pos, const RotaryParams& r) {
  const float x = to_float(row[c]);
  if (!rotated(c, pos, r)) return x;
  const int half = r.dim / 2;
  const bool first = r.interleaved ? (c % 2 == 0) : (c < half);
  const int pair = r.interleaved ? c / 2 : (first ? c : c - half);
  const int partner = r.interleaved ? (c ^ 1) : (first ? c + half : c - half);
  const int64_t at = int64_t(pos) * r.row_stride + int64_t(pair) * r.col_stride;
  const float cs = to_float(static_cast<const T*>(r.cos)[at]);
  const float sn = to_float(static_cast<const T*>(r.sin)[at]);
  const float y = to_float(row[partner]);
  return first ? x * cs - y * sn : y * sn + x * cs;
}

// Channel c of a new row into a cache of type Cache. Same type: the bits, or the rotated value
// rounded once. A 16-bit row into an fp8 cache (contract 5.8): the (rotated) fp32 value divided
// by the descale, in fp32, then rounded once to e4m3, saturating.
template <class Src, class Cache>
__device__ __forceinline__ Cache new_element(const Src* row, int c, int pos, const RotaryParams& r, float descale) {
  if constexpr (std::is_same_v<Src, Cache>) {
    return rotated(c, pos, r) ? from_float<Cache>(rotate_channel(row, c, pos, r)) : row[c];
  } else {
    return from_float<Cache>(rotate_channel(row, c, pos, r) / descale);
  }
}

// V is never rotated (dim 0), K with the call's tables.
template <class Src, class Cache>
__global__ void append_kv_kernel(const AppendParams p) {
  const int b = blockIdx.y;
  const SeqLens seq = seq_lens(p.len, b);
  const RotaryParams no_rotary;
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
      const Src* row = static_cast<const Src*>(src.data) + batch * src.batch_stride +
                       token * src.token_stride + hk * src.head_stride;
      const int64_t off = is_k ? cache_offset(p.cache, seq.cache_row, pos, p.cache.k_row_stride,
                                              p.cache.k_pos_stride, p.cache.k_head_stride, hk)
                               : cache_offset(p.cache, seq.cache_row, pos, p.cache.v_row_stride,
                                              p.cache.v_pos_stride, p.cache.v_head_stride, hk);
      if (off < 0) continue;
      Cache* dst = static_cast<Cache*>(is_k ? p.cache.k : p.cache.v) + off;
      const float descale = std::is_same_v<Src, Cache> ? 1.0f : descale_at(is_k ? p.k_descale : p.v_descale, b, hk);
      dst[c] = new_element<Src, Cache>(row, c, seq.rotary_start + t, is_k ? p.rotary : no_rotary, descale);
    }
  }
}

// A query row (q or qv, of type Src) into its workspace copy as Dst: a rotated channel is rounded
// to Src first (as if q had been rotated in memory; e4m3 saturating, as from_float rounds new K
// rows), then scaled by its (batch element, KV head)'s factor in fp32 and rounded once to Dst, or
// only converted (exactly: e4m3 -> bf16) where Dst is another type. Grid z splits a row's
// (head, channel) elements, so that MLA's wide rows (128 heads x 512) spread over many CTAs.
template <class Src, class Dst>
__global__ void query_copy_kernel(const QueryCopyParams p) {
  const int b = blockIdx.y;
  const SeqLens seq = seq_lens(p.len, b);
  const RotaryParams& rot = p.rotary;
  const int64_t batch = p.len.cu_seqlens_q.data ? 0 : b;
  for (int i = blockIdx.x; i < seq.seqlen_q; i += gridDim.x) {
    const int64_t token = seq.q_offset + i;
    const int pos = seq.rotary_start + (p.per_row ? i : 0);
    for (int e = blockIdx.z * blockDim.x + threadIdx.x; e < p.num_heads * p.headdim; e += gridDim.z * blockDim.x) {
      const int h = e / p.headdim, c = e - h * p.headdim;
      const Src* row = static_cast<const Src*>(p.src.data) + batch * p.src.batch_stride +
                       token * p.src.token_stride + h * p.src.head_stride;
      Dst* dst = static_cast<Dst*>(p.dst.data) + batch * p.dst.batch_stride +
                 token * p.dst.token_stride + h * p.dst.head_stride;
      const Src x = new_element<Src, Src>(row, c, pos, rot, 1.0f);
      if (p.scale.data) dst[c] = from_float<Dst>(to_float(x) * descale_at(p.scale, b, h / p.group));
      else if constexpr (std::is_same_v<Src, Dst>) dst[c] = x;
      else dst[c] = from_float<Dst>(to_float(x));
    }
  }
}

}  // namespace

template <class Src, class Cache>
void launch_append_kv(const AppendParams& p, int max_new_rows, cudaStream_t stream) {
  if (p.len.batch == 0 || max_new_rows <= 0) return;
  const dim3 grid(max_new_rows < 512 ? max_new_rows : 512, p.len.batch);
  append_kv_kernel<Src, Cache><<<grid, 128, 0, stream>>>(p);
}

// Up to kCopyElemsPerThread elements of a row per thread (grid z covers the rest of the row).
constexpr int kCopyThreads = 128, kCopyElemsPerThread = 8;

template <class Src, class Dst>
void launch_query_copy(const QueryCopyParams& p, cudaStream_t stream) {
  if (p.len.batch == 0 || p.len.seqlen_q <= 0) return;
  const int64_t row = int64_t(p.num_heads) * p.headdim, per_cta = kCopyThreads * kCopyElemsPerThread;
  const int64_t slices = (row + per_cta - 1) / per_cta;
  const dim3 grid(p.len.seqlen_q < 512 ? p.len.seqlen_q : 512, p.len.batch,
                  unsigned(slices < 65535 ? slices : 65535));
  query_copy_kernel<Src, Dst><<<grid, kCopyThreads, 0, stream>>>(p);
}

// 16-bit over 16-bit, a 16-bit query over an fp8 cache, fp8 over fp8 (q into bf16).
template void launch_append_kv<__nv_bfloat16, __nv_bfloat16>(const AppendParams&, int, cudaStream_t);
template void launch_append_kv<__half, __half>(const AppendParams&, int, cudaStream_t);
template void launch_append_kv<__nv_bfloat16, e4m3>(const AppendParams&, int, cudaStream_t);
template void launch_append_kv<__half, e4m3>(const AppendParams&, int, cudaStream_t);
template void launch_append_kv<e4m3, e4m3>(const AppendParams&, int, cudaStream_t);
template void launch_query_copy<__nv_bfloat16, __nv_bfloat16>(const QueryCopyParams&, cudaStream_t);
template void launch_query_copy<__half, __half>(const QueryCopyParams&, cudaStream_t);
template void launch_query_copy<e4m3, __nv_bfloat16>(const QueryCopyParams&, cudaStream_t);
template void launch_query_copy<e4m3, e4m3>(const QueryCopyParams&, cudaStream_t);  // the sm90 fp8 kernel's q

}  // namespace kvflash::cuda
