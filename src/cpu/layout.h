// Addressing of the strided tensors the CPU backend reads and writes: per-sequence rows of
// q / out / qv / new K/V, cache rows (dense or through the page table), LSE and split partials.
// Strides are in elements (TensorView); only the last dim is assumed contiguous.
#pragma once

#include <cstdint>

#include "core/problem.h"
#include "kvflash/tensor.h"

namespace kvflash::cpu {

inline char* element_at(const TensorView& t, int64_t offset_elements) {
  return static_cast<char*>(t.data) + offset_elements * int64_t(dtype_size(t.dtype));
}

// Rows of one sequence in a (b, s, heads, dim) tensor or a packed (total, heads, dim) one.
struct SeqRows {
  char* base = nullptr;
  int64_t row_stride = 0;   // bytes
  int64_t head_stride = 0;  // bytes

  // `offset`: first packed row of the sequence (used only by the packed form).
  SeqRows(const TensorView& t, int b, int offset) {
    const int64_t es = int64_t(dtype_size(t.dtype));
    if (t.rank == 4) {
      base = element_at(t, int64_t(b) * t.strides[0]);
      row_stride = t.strides[1] * es;
      head_stride = t.strides[2] * es;
    } else {
      base = element_at(t, int64_t(offset) * t.strides[0]);
      row_stride = t.strides[0] * es;
      head_stride = t.strides[1] * es;
    }
  }
  char* row(int i, int head) const { return base + i * row_stride + head * head_stride; }
};

// The K or V cache: position `pos` (absolute, leftpad included) of cache row `cache_row`.
struct CacheRows {
  char* data = nullptr;
  int64_t block_stride = 0, slot_stride = 0, head_stride = 0;  // bytes
  const int32_t* page_table = nullptr;  // nullptr: dense
  int64_t page_table_stride = 0;        // elements
  int page_size = 1;

  CacheRows(const TensorView& cache, const core::Problem& p) {
    const int64_t es = int64_t(dtype_size(cache.dtype));
    data = static_cast<char*>(cache.data);
    block_stride = cache.strides[0] * es;
    slot_stride = cache.strides[1] * es;
    head_stride = cache.strides[2] * es;
    if (p.paged) {
      page_table = p.args.page_table->ptr<const int32_t>();
      page_table_stride = p.args.page_table->strides[0];
      page_size = p.page_size;
    }
  }
  char* row(int cache_row, int pos, int head) const {
    if (!page_table) return data + cache_row * block_stride + pos * slot_stride + head * head_stride;
    const int32_t page = page_table[cache_row * page_table_stride + pos / page_size];
    return data + page * block_stride + (pos % page_size) * slot_stride + head * head_stride;
  }
};

// softmax_lse (b, h, s_q) or (h, total_q); with a leading split dim for softmax_lse_accum.
// out_accum (splits, b, h, s_q, d_v) or (splits, h, total_q, d_v). `lead` = 1 with a split dim.
struct HeadRowIndex {
  const TensorView* t = nullptr;
  bool dense = true;  // b is a dim
  int lead = 0;

  HeadRowIndex(const TensorView& view, bool varlen, bool has_split_dim)
      : t(&view), dense(!varlen), lead(has_split_dim ? 1 : 0) {}
  // Element offset of (split, b, h, row i of the sequence whose first packed row is q_offset).
  int64_t offset(int split, int b, int h, int i, int q_offset) const {
    const int64_t* s = t->strides;
    int64_t o = lead ? split * s[0] : 0;
    if (dense) return o + b * s[lead] + h * s[lead + 1] + i * s[lead + 2];
    return o + h * s[lead] + int64_t(q_offset + i) * s[lead + 1];
  }
  float* ptr(int split, int b, int h, int i, int q_offset) const {
    return t->ptr<float>() + offset(split, b, h, i, q_offset);
  }
};

// A (b, h_k) float32 tensor with arbitrary strides (fp8 descales); 1 when absent.
inline float descale_at(const OptTensor& t, int b, int hk) {
  if (!t) return 1.0f;
  return t->ptr<const float>()[b * t->strides[0] + hk * t->strides[1]];
}

}  // namespace kvflash::cpu
