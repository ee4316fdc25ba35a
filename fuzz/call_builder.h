// A flash_attn_with_kvcache call built from fuzzer bytes: small sizes around a consistent call
// (so most inputs get past the first checks), then shapes, strides, ranks, dtypes, devices,
// optional tensors and index values perturbed. Every view gets memory for every offset it can
// address (negative and zero strides included), so a sanitizer report is kvflash's, not the
// harness's. Views too large for that are built without memory: only the checks run on them.
#pragma once

#include <fuzzer/FuzzedDataProvider.h>

#include <cstdint>
#include <cstring>
#include <deque>
#include <vector>

#include "kvflash/kvflash.h"

namespace kvflash::fuzz {

constexpr int64_t kMaxBufferBytes = int64_t{1} << 20;

class CallBuilder {
 public:
  explicit CallBuilder(FuzzedDataProvider& in) : in_(in) {}

  KvCacheArgs args;
  bool has_memory = true;  // false: some view spans more than kMaxBufferBytes; do not run

  // A call of small consistent sizes, then perturbed.
  void build() {
    const int batch = in_.ConsumeIntegralInRange(0, 4);
    const int seqlen_q = in_.ConsumeIntegralInRange(0, 5);
    const int heads_k = in_.ConsumeIntegralInRange(1, 3);
    const int heads = heads_k * in_.ConsumeIntegralInRange(1, 3);
    const int64_t headdims[] = {8, 16, 32, 64, 0, 24, 264};
    const int64_t d = headdims[in_.ConsumeIntegralInRange(0, 6)];
    const int64_t dv = in_.ConsumeBool() ? d : headdims[in_.ConsumeIntegralInRange(0, 6)];
    const DType dtypes[] = {DType::f32, DType::bf16, DType::f16, DType::e4m3, DType::i32, DType::f64};
    const DType dtype = dtypes[in_.ConsumeIntegralInRange(0, 5)];
    const bool paged = in_.ConsumeBool();
    const int page_size = in_.ConsumeIntegralInRange(1, 6);
    const int pages_per_seq = in_.ConsumeIntegralInRange(0, 4);
    const int num_pages = in_.ConsumeIntegralInRange(0, 9);
    const int seqlen_k = paged ? pages_per_seq * page_size : in_.ConsumeIntegralInRange(0, 20);
    const bool varlen = in_.ConsumeBool();
    const int64_t total_q = int64_t{batch} * seqlen_q;

    args.q = varlen ? tensor(dtype, {total_q, heads, d}) : tensor(dtype, {batch, seqlen_q, heads, d});
    if (varlen) {
      args.cu_seqlens_q = index_tensor(batch + 1, [&](int b) { return b * seqlen_q; });
      args.max_seqlen_q = in_.ConsumeBool() ? seqlen_q : in_.ConsumeIntegralInRange(-2, 8);
    }
    const int64_t rows = paged ? num_pages : batch;
    const int64_t row_len = paged ? page_size : seqlen_k;
    args.k_cache = tensor(dtype, {rows, row_len, heads_k, d});
    args.v_cache = tensor(dtype, {rows, row_len, heads_k, dv});
    if (paged) {
      args.page_table = index_tensor(int64_t{batch} * pages_per_seq,
                                     [&](int i) { return num_pages ? i % num_pages : 0; });
      args.page_table->rank = 2;
      args.page_table->shape[0] = batch, args.page_table->shape[1] = pages_per_seq;
      args.page_table->strides[0] = pages_per_seq, args.page_table->strides[1] = 1;
    }
    if (in_.ConsumeBool()) {
      args.cache_seqlens = index_tensor(batch, [&](int b) { return (b * 3) % (seqlen_k + 1); });
    } else if (in_.ConsumeBool()) {
      args.cache_seqlens_value = in_.ConsumeIntegralInRange(-1, seqlen_k + 1);
    }
    if (in_.ConsumeBool()) add_new_keys(batch, heads_k, d, dv, dtype);
    add_optional_indices(batch);
    add_scalars();
    perturb_tensors();
  }

  // Outputs as output_spec gives them (optional ones present or not), perhaps perturbed.
  Outputs outputs(const OutputSpec& spec) {
    Outputs o;
    o.out = tensor(spec.out.dtype, dims(spec.out));
    if (in_.ConsumeBool()) o.softmax_lse = tensor(DType::f32, dims(spec.softmax_lse));
    if (spec.num_splits > 1 && in_.ConsumeBool()) {
      o.out_accum = tensor(DType::f32, dims(spec.out_accum));
      o.softmax_lse_accum = tensor(DType::f32, dims(spec.softmax_lse_accum));
    }
    if (in_.ConsumeIntegralInRange(0, 7) == 0) perturb(o.out);
    return o;
  }

  // A view with memory behind every offset it can address (has_memory = false when too big).
  TensorView tensor(DType dtype, std::vector<int64_t> shape) {
    TensorView t;
    t.dtype = dtype;
    t.rank = static_cast<int>(shape.size());
    int64_t stride = 1;
    for (int i = t.rank - 1; i >= 0; --i) {
      t.shape[i] = shape[i];
      t.strides[i] = stride;
      stride *= shape[i] > 0 ? shape[i] : 1;
    }
    back(t);
    return t;
  }

  int32_t value() {
    switch (in_.ConsumeIntegralInRange(0, 3)) {
      case 0: return in_.ConsumeIntegral<int32_t>();
      case 1: return in_.ConsumeIntegralInRange(-2, 2);
      default: return in_.ConsumeIntegralInRange(0, 24);
    }
  }

 private:
  template <class F>
  TensorView index_tensor(int64_t n, F natural) {
    TensorView t = tensor(DType::i32, {n > 0 ? n : 0});
    for (int64_t i = 0; i < n; ++i) {
      t.ptr<int32_t>()[i] = in_.ConsumeIntegralInRange(0, 5) == 0 ? value() : natural(int(i));
    }
    return t;
  }

  static std::vector<int64_t> dims(const TensorSpec& s) { return {s.shape, s.shape + s.rank}; }

  // Backs t with zeroed memory covering its offsets (with its current shape and strides).
  void back(TensorView& t) {
    if (t.rank < 0 || t.rank > kMaxRank) return;
    __int128 low = 0, high = 0;
    for (int i = 0; i < t.rank; ++i) {
      if (t.shape[i] <= 0) return;  // no elements: any pointer
      const __int128 reach = __int128{t.shape[i] - 1} * t.strides[i];
      (reach < 0 ? low : high) += reach;
    }
    const __int128 bytes = (high - low + 1) * static_cast<__int128>(dtype_size(t.dtype));
    if (bytes > kMaxBufferBytes) {
      // Never run. The checks read only int32 tensors' values: those get no pointer at all.
      has_memory = false;
      static char unread;
      t.data = t.dtype == DType::i32 ? nullptr : &unread;
      return;
    }
    std::vector<char>& buffer = buffers_.emplace_back(static_cast<size_t>(bytes), char(0x3c));
    t.data = buffer.data() - static_cast<int64_t>(low) * static_cast<int64_t>(dtype_size(t.dtype));
  }

  void add_new_keys(int batch, int heads_k, int64_t d, int64_t dv, DType dtype) {
    const int seqlen_new = in_.ConsumeIntegralInRange(0, 3);
    if (in_.ConsumeBool()) {
      const int64_t total = int64_t{batch} * seqlen_new;
      args.k = tensor(dtype, {total, heads_k, d});
      args.v = tensor(dtype, {total, heads_k, dv});
      args.cu_seqlens_k_new = index_tensor(batch + 1, [&](int b) { return b * seqlen_new; });
    } else {
      args.k = tensor(dtype, {batch, seqlen_new, heads_k, d});
      args.v = tensor(dtype, {batch, seqlen_new, heads_k, dv});
    }
    if (in_.ConsumeBool()) {
      const int64_t rotary_half = in_.ConsumeIntegralInRange(0, 3) * 8;
      const int64_t rotary_rows = in_.ConsumeIntegralInRange(0, 30);
      args.rotary_cos = tensor(dtype, {rotary_rows, rotary_half});
      args.rotary_sin = tensor(dtype, {rotary_rows, rotary_half});
      args.rotary_interleaved = in_.ConsumeBool();
    }
  }

  void add_optional_indices(int batch) {
    if (in_.ConsumeIntegralInRange(0, 3) == 0) {
      args.cache_batch_idx = index_tensor(batch, [](int b) { return b; });
    }
    if (in_.ConsumeIntegralInRange(0, 3) == 0) {
      args.cache_leftpad = index_tensor(batch, [](int) { return 0; });
    }
    if (in_.ConsumeIntegralInRange(0, 5) == 0) {
      args.rotary_seqlens = index_tensor(batch, [](int) { return 0; });
    }
    if (in_.ConsumeIntegralInRange(0, 7) == 0) {
      args.sinks = tensor(in_.ConsumeBool() ? DType::f32 : DType::bf16, {args.q->size(-2)});
    }
    if (in_.ConsumeIntegralInRange(0, 7) == 0) {
      const int64_t n = in_.ConsumeIntegralInRange(0, 40);
      args.scheduler_metadata = index_tensor(n, [&](int) { return value(); });
    }
  }

  void add_scalars() {
    args.causal = in_.ConsumeBool();
    if (in_.ConsumeBool()) {
      args.window_left = in_.ConsumeIntegralInRange(-2, 6);
      args.window_right = in_.ConsumeIntegralInRange(-2, 6);
    }
    if (in_.ConsumeIntegralInRange(0, 3) == 0) args.attention_chunk = in_.ConsumeIntegralInRange(-1, 8);
    if (in_.ConsumeIntegralInRange(0, 3) == 0) args.softcap = in_.ConsumeFloatingPoint<float>();
    if (in_.ConsumeIntegralInRange(0, 3) == 0) args.softmax_scale = in_.ConsumeFloatingPoint<float>();
    if (in_.ConsumeBool()) args.num_splits = in_.ConsumeIntegralInRange(-2, 300);
    if (in_.ConsumeBool()) args.pack_gqa = in_.ConsumeBool();
    if (in_.ConsumeIntegralInRange(0, 7) == 0) args.sm_margin = in_.ConsumeIntegralInRange(-1, 200);
    args.checked = in_.ConsumeBool();
    args.batch_invariant = in_.ConsumeBool();
  }

  // Shape, stride, rank, dtype and device changes of a few tensors, or removal.
  void perturb_tensors() {
    OptTensor* all[] = {&args.q, &args.k_cache, &args.v_cache, &args.k, &args.v, &args.rotary_cos,
                        &args.cache_seqlens, &args.page_table, &args.cu_seqlens_q,
                        &args.cu_seqlens_k_new, &args.cache_batch_idx};
    const int changes = in_.ConsumeIntegralInRange(0, 3);
    for (int i = 0; i < changes; ++i) {
      OptTensor& t = *all[in_.ConsumeIntegralInRange(0, 10)];
      if (!t) continue;
      if (in_.ConsumeIntegralInRange(0, 5) == 0) {
        t.reset();
      } else {
        perturb(*t);
      }
    }
    if (in_.ConsumeIntegralInRange(0, 7) == 0) args.only_qv = true;
  }

  void perturb(TensorView& t) {
    switch (in_.ConsumeIntegralInRange(0, 5)) {
      case 0: t.rank = in_.ConsumeIntegralInRange(-1, 7); break;
      case 1: t.dtype = static_cast<DType>(in_.ConsumeIntegralInRange(0, 5)); break;
      case 2: t.device = {static_cast<DeviceType>(in_.ConsumeIntegralInRange(0, 3)), 0}; return;
      case 3: t.data = nullptr; return;
      case 4: t.shape[in_.ConsumeIntegralInRange(0, kMaxRank - 1)] = value(); break;
      default: {
        const int64_t strides[] = {0, 1, -1, 2, -64, 1000003, INT64_MIN / 2};
        t.strides[in_.ConsumeIntegralInRange(0, kMaxRank - 1)] = strides[in_.ConsumeIntegralInRange(0, 6)];
      }
    }
    back(t);  // new memory for the new layout
  }

  FuzzedDataProvider& in_;
  std::deque<std::vector<char>> buffers_;
};

// The checks (output_spec), then the call itself on one CPU thread when every view has memory
// behind it. Throws kvflash::Error when the call is refused.
inline void check_and_run(CallBuilder& call) {
  const OutputSpec spec = output_spec(call.args);
  if (!call.has_memory) return;
  const Outputs outputs = call.outputs(spec);
  if (!call.has_memory) return;
  RunOptions options;
  options.num_threads = 1;
  flash_attn_with_kvcache(call.args, outputs, options);
}

}  // namespace kvflash::fuzz
