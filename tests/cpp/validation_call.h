// A small valid flash_attn_with_kvcache call on host buffers for the validation tests: the
// sizes are fields, build() makes every tensor, and a test then breaks one thing.
#pragma once

#include <cstdint>
#include <cstring>
#include <deque>
#include <vector>

#include "kvflash/kvflash.h"

namespace kvflash::testing {

struct CallDims {
  int batch = 2;
  int seqlen_q = 2;
  int heads = 4;
  int heads_k = 2;
  int headdim = 64;
  int headdim_v = 64;
  int seqlen_k = 16;  // capacity (paged: pages_per_seq * page_size)
  DType dtype = DType::f32;
  int seqlen_new = 0;  // > 0: append k / v
  bool knew_packed = false;
  bool paged = false;
  int page_size = 4;
  int num_pages = 8;
  bool varlen_q = false;
  bool rotary = false;
  int rotary_dim = 32;
  int rotary_rows = 32;
  bool qv = false;
};

class Call {
 public:
  explicit Call(CallDims dims = {}) : dims(dims) { build(); }
  Call(const Call&) = delete;

  CallDims dims;
  KvCacheArgs args;
  Outputs outputs;

  // A zeroed host tensor owned by the call.
  TensorView tensor(DType dtype, std::vector<int64_t> shape) {
    TensorView t;
    t.dtype = dtype;
    t.rank = static_cast<int>(shape.size());
    int64_t n = 1;
    for (int i = t.rank - 1; i >= 0; --i) {
      t.shape[i] = shape[i];
      t.strides[i] = n;
      n *= shape[i];
    }
    auto& buffer = buffers_.emplace_back(static_cast<size_t>(n) * dtype_size(dtype) / 8 + 1);
    t.data = buffer.data();
    return t;
  }
  TensorView ints(std::vector<int32_t> values) {
    TensorView t = tensor(DType::i32, {static_cast<int64_t>(values.size())});
    std::memcpy(t.data, values.data(), values.size() * sizeof(int32_t));
    return t;
  }
  static int32_t* i32(const OptTensor& t) { return t->ptr<int32_t>(); }

  // Every buffer the call owns (all its tensors' memory): copies compare before and after, and
  // the GPU runner mirrors them to the device.
  const std::deque<std::vector<uint64_t>>& buffers() const { return buffers_; }

  // Every tensor of the call and its outputs on `device`.
  void move_to(Device device) {
    for (OptTensor* t : {&args.q, &args.k_cache, &args.v_cache, &args.k, &args.v, &args.qv,
                         &args.rotary_cos, &args.rotary_sin, &args.cache_seqlens,
                         &args.page_table, &args.cu_seqlens_q, &outputs.softmax_lse}) {
      if (*t) (*t)->device = device;
    }
    outputs.out.device = device;
  }

  // A byte pattern (about 0.0115 in float32 and bfloat16, 1.5 in e4m3) in both caches.
  void fill_caches() {
    for (const OptTensor* t : {&args.k_cache, &args.v_cache}) {
      std::memset((*t)->data, 0x3c, static_cast<size_t>((*t)->numel()) * dtype_size((*t)->dtype));
    }
  }

 private:
  void build() {
    const CallDims& d = dims;
    const int64_t total_q = int64_t{d.batch} * d.seqlen_q;
    args.q = d.varlen_q ? tensor(d.dtype, {total_q, d.heads, d.headdim})
                        : tensor(d.dtype, {d.batch, d.seqlen_q, d.heads, d.headdim});
    if (d.varlen_q) {
      std::vector<int32_t> cu(d.batch + 1);
      for (int b = 0; b <= d.batch; ++b) cu[b] = b * d.seqlen_q;
      args.cu_seqlens_q = ints(cu);
      args.max_seqlen_q = d.seqlen_q;
    }
    const int64_t rows = d.paged ? d.num_pages : d.batch;
    const int64_t row_len = d.paged ? d.page_size : d.seqlen_k;
    args.k_cache = tensor(d.dtype, {rows, row_len, d.heads_k, d.headdim});
    args.v_cache = tensor(d.dtype, {rows, row_len, d.heads_k, d.headdim_v});
    if (d.paged) {
      const int pages_per_seq = d.seqlen_k / d.page_size;
      args.page_table = tensor(DType::i32, {d.batch, pages_per_seq});
      for (int i = 0; i < d.batch * pages_per_seq; ++i) i32(args.page_table)[i] = i % d.num_pages;
    }
    std::vector<int32_t> lengths(d.batch);
    for (int b = 0; b < d.batch; ++b) lengths[b] = 3 + 2 * (b % 2);
    args.cache_seqlens = ints(lengths);
    if (d.seqlen_new > 0) {
      const int64_t total_new = int64_t{d.batch} * d.seqlen_new;
      if (d.knew_packed) {
        args.k = tensor(d.dtype, {total_new, d.heads_k, d.headdim});
        args.v = tensor(d.dtype, {total_new, d.heads_k, d.headdim_v});
        std::vector<int32_t> cu(d.batch + 1);
        for (int b = 0; b <= d.batch; ++b) cu[b] = b * d.seqlen_new;
        args.cu_seqlens_k_new = ints(cu);
      } else {
        args.k = tensor(d.dtype, {d.batch, d.seqlen_new, d.heads_k, d.headdim});
        args.v = tensor(d.dtype, {d.batch, d.seqlen_new, d.heads_k, d.headdim_v});
      }
    }
    if (d.rotary) {
      args.rotary_cos = tensor(d.dtype, {d.rotary_rows, d.rotary_dim / 2});
      args.rotary_sin = tensor(d.dtype, {d.rotary_rows, d.rotary_dim / 2});
    }
    if (d.qv) {
      args.qv = d.varlen_q ? tensor(d.dtype, {total_q, d.heads, d.headdim_v})
                           : tensor(d.dtype, {d.batch, d.seqlen_q, d.heads, d.headdim_v});
    }
    const DType out_dtype = d.dtype == DType::e4m3 ? DType::bf16 : d.dtype;
    outputs.out = d.varlen_q ? tensor(out_dtype, {total_q, d.heads, d.headdim_v})
                             : tensor(out_dtype, {d.batch, d.seqlen_q, d.heads, d.headdim_v});
    outputs.softmax_lse = d.varlen_q ? tensor(DType::f32, {d.heads, total_q})
                                     : tensor(DType::f32, {d.batch, d.heads, d.seqlen_q});
  }

  std::deque<std::vector<uint64_t>> buffers_;
};

}  // namespace kvflash::testing
