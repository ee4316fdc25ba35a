// One sequence's lengths (contract 5.1) derived on the device from LengthParams, with every value read
// from memory clamped into the range the tensors allow: a wrong length can make results wrong, never
// an access out of bounds. Also the paged / dense address of a cache row.
#pragma once

#include <cuda_runtime.h>

#include "cuda/common/params.h"

namespace kvflash::cuda {

__device__ __forceinline__ int clamp_int(int v, int lo, int hi) { return v < lo ? lo : (v > hi ? hi : v); }

__device__ __forceinline__ int load_int(const IntVec& v, int i, int fallback) {
  return v.data ? __ldg(v.data + int64_t(i) * v.stride) : fallback;
}

struct SeqLens {
  int q_offset = 0;      // first row of this sequence in packed q / out (0 when dense)
  int seqlen_q = 0;
  int leftpad = 0;
  int cache_seqlen = 0;  // includes leftpad
  int knew_offset = 0;   // first row of this sequence in packed k / v (0 when dense)
  int seqlen_knew = 0;   // new keys that fit in the cache
  int seqlen_k = 0;      // keys attended
  int rotary_start = 0;
  int cache_row = 0;
};

__device__ inline SeqLens seq_lens(const LengthParams& p, int b) {
  SeqLens s;
  if (p.cu_seqlens_q.data) {
    s.q_offset = clamp_int(load_int(p.cu_seqlens_q, b, 0), 0, p.total_q);
    const int end = clamp_int(load_int(p.cu_seqlens_q, b + 1, 0), s.q_offset, p.total_q);
    s.seqlen_q = min(end - s.q_offset, p.seqlen_q);
  } else {
    s.seqlen_q = p.seqlen_q;
  }
  s.cache_row = load_int(p.cache_batch_idx, b, b);
  const bool row_ok = s.cache_row >= 0 && s.cache_row < p.num_cache_seqs;
  if (!row_ok) s.cache_row = 0;
  const int given = p.cache_seqlens_value >= 0 ? p.cache_seqlens_value : p.capacity;
  s.cache_seqlen = clamp_int(load_int(p.cache_seqlens, b, given), 0, p.capacity);
  s.leftpad = clamp_int(load_int(p.cache_leftpad, b, 0), 0, s.cache_seqlen);
  if (p.has_knew) {
    if (p.cu_seqlens_k_new.data) {
      s.knew_offset = clamp_int(load_int(p.cu_seqlens_k_new, b, 0), 0, p.total_knew);
      const int end = clamp_int(load_int(p.cu_seqlens_k_new, b + 1, 0), s.knew_offset, p.total_knew);
      s.seqlen_knew = end - s.knew_offset;
    } else {
      s.seqlen_knew = p.seqlen_knew;  // dense k: addressed by batch index, knew_offset stays 0
    }
    s.seqlen_knew = min(s.seqlen_knew, p.capacity - s.cache_seqlen);
  }
  s.seqlen_k = s.cache_seqlen - s.leftpad + s.seqlen_knew;
  s.rotary_start = load_int(p.rotary_seqlens, b, s.cache_seqlen);
  if (!row_ok) {  // a bad cache_batch_idx: nothing is read or written for this sequence
    s.seqlen_k = 0;
    s.seqlen_knew = 0;
  }
  return s;
}

// Where key position `pos` (absolute) of cache sequence `row` lives: `unit` (batch row or page)
// and `slot` in it; false when the page id is out of range (the row is then skipped: zero-filled
// on reads, not written). pos >= 0 (a key index plus leftpad).
__device__ __forceinline__ bool cache_location(const CacheParams& c, int row, int pos, int64_t& unit,
                                               int& slot) {
  if (!c.paged) {
    unit = row;
    slot = pos;
    return true;
  }
  const int page_idx = c.page_size.div(pos);
  if (page_idx >= c.pages_per_seq) return false;
  const int page = __ldg(c.page_table + int64_t(row) * c.page_table_row_stride +
                         int64_t(page_idx) * c.page_table_col_stride);
  if (page < 0 || page >= c.num_pages) return false;
  unit = page;
  slot = pos - page_idx * c.page_size.divisor;
  return true;
}

// Element offset of that position for head `hk`, or -1 when it is skipped.
__device__ __forceinline__ int64_t cache_offset(const CacheParams& c, int row, int pos,
                                                int64_t row_stride, int64_t pos_stride,
                                                int64_t head_stride, int hk) {
  int64_t unit = 0;
  int slot = 0;
  if (!cache_location(c, row, pos, unit, slot)) return -1;
  return unit * row_stride + int64_t(slot) * pos_stride + hk * head_stride;
}

}  // namespace kvflash::cuda
