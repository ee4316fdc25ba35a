// The malformed and unusual calls of issue 18, as a table over a small host call (validation_call.h):
// each case edits a valid call and either expects a clear error naming an argument (and nothing
// written), or is valid with documented semantics, checked against a clean call. The CPU suite
// runs it (test_bad_input.cpp); the GPU runner runs the same table on CUDA copies.
#pragma once

#include <climits>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "cpp/validation_call.h"
#include "kvflash/kvflash.h"

namespace kvflash::testing {

struct BadCall {
  const char* name;
  CallDims dims;
  std::function<void(Call&)> edit;
  // Refused calls: the argument the error names and a fragment of its message.
  // Valid calls: argument is nullptr and message says what the documented semantics are.
  const char* argument;
  const char* message;
  // Valid calls: the clean call to compare with is the same dims, filled alike, with this edit
  // (nullptr: none). holds(edited, clean) says whether the semantics of `message` hold
  // (nullptr: out and LSE bitwise equal to the clean call's).
  std::function<void(Call&)> clean_edit = nullptr;
  std::function<bool(const Call&, const Call&)> holds = nullptr;
};

// Deterministic values in [-1, 1) for the float32 tensors of a call.
inline void fill_values(const OptTensor& t, uint32_t seed) {
  if (!t || t->dtype != DType::f32) return;
  float* p = t->ptr<float>();
  uint32_t x = seed * 2654435761u + 12345u;
  for (int64_t i = 0; i < t->numel(); ++i) {
    x ^= x << 13, x ^= x >> 17, x ^= x << 5;
    p[i] = static_cast<float>(x % 2000) / 1000.0f - 1.0f;
  }
}

inline void fill_call(Call& c) {
  fill_values(c.args.q, 1);
  fill_values(c.args.k_cache, 2);
  fill_values(c.args.v_cache, 3);
  fill_values(c.args.k, 4);
  fill_values(c.args.v, 5);
  fill_values(c.args.rotary_cos, 6);
  fill_values(c.args.rotary_sin, 7);
}

// A view of `t` with the same data and a new shape / strides (stride-0 views of small buffers).
inline TensorView reshaped(const TensorView& t, std::vector<int64_t> shape, std::vector<int64_t> strides) {
  TensorView v = t;
  v.rank = static_cast<int>(shape.size());
  for (int i = 0; i < v.rank; ++i) v.shape[i] = shape[i], v.strides[i] = strides[i];
  return v;
}

inline void set_float(const OptTensor& t, int64_t index, float value) { t->ptr<float>()[index] = value; }

// Offset of element (b, s, h, 0) of a rank-4 tensor.
inline int64_t at4(const TensorView& t, int64_t b, int64_t s, int64_t h) {
  return b * t.strides[0] + s * t.strides[1] + h * t.strides[2];
}

const CallDims kDense{};
const CallDims kAppend{.seqlen_new = 2};
const CallDims kPagedAppend{.seqlen_new = 2, .paged = true};
const CallDims kPagedRead{.paged = true};
const CallDims kVarlenQ{.varlen_q = true};
const CallDims kPackedAppend{.seqlen_new = 2, .knew_packed = true};
const CallDims kRotaryAppend{.seqlen_new = 2, .rotary = true};
constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNan = std::numeric_limits<float>::quiet_NaN();

// Elements [first, first + n) of a float32 tensor (contiguous) all equal `value`.
inline bool all_equal(const TensorView& t, int64_t first, int64_t n, float value) {
  for (int64_t i = first; i < first + n; ++i) {
    if (!(t.ptr<float>()[i] == value)) return false;
  }
  return true;
}

// Elements [first, first + n) of two float32 tensors are bitwise equal.
inline bool same_floats(const TensorView& a, const TensorView& b, int64_t first, int64_t n) {
  return std::memcmp(a.ptr<float>() + first, b.ptr<float>() + first, n * sizeof(float)) == 0;
}

// Row (b, s, h) of a dense call: out 0 with LSE -inf, or finite out and LSE.
inline bool zero_or_finite_row(const Call& c, int b, int s, int h) {
  const float* row = c.outputs.out.ptr<float>() + at4(c.outputs.out, b, s, h);
  const TensorView& lse = *c.outputs.softmax_lse;
  const float row_lse = lse.ptr<float>()[b * lse.stride(0) + h * lse.stride(1) + s];
  bool zero = row_lse == -kInf, finite = std::isfinite(row_lse);
  for (int i = 0; i < c.outputs.out.size(3); ++i) {
    zero = zero && row[i] == 0.0f;
    finite = finite && std::isfinite(row[i]);
  }
  return zero || finite;
}

inline std::vector<BadCall> bad_calls() {
  using C = Call;
  const auto seqlens = [](Call& c, std::vector<int32_t> v) { c.args.cache_seqlens = c.ints(v); };
  const auto huge_batch = [](Call& c, int64_t batch) {  // every batch-sized tensor a stride-0 view
    for (OptTensor* t : {&c.args.q, &c.args.k_cache, &c.args.v_cache}) {
      **t = reshaped(**t, {batch, (*t)->size(1), (*t)->size(2), (*t)->size(3)},
                     {0, (*t)->stride(1), (*t)->stride(2), 1});
    }
    c.args.cache_seqlens = reshaped(*c.args.cache_seqlens, {batch}, {0});
    c.outputs.out = reshaped(c.outputs.out, {batch, 2, 4, 64}, {0, 256, 64, 1});
    c.outputs.softmax_lse.reset();
  };
  return {
      // --- page ids: out of range, negative, duplicated (kPagedAppend: 4 pages of 4 rows per
      // sequence, sequence 0 holds 3 tokens and appends 2, sequence 1 holds 5 and appends 2)
      {"page_id_past_end", kPagedAppend, [](C& c) { C::i32(c.args.page_table)[1] = 8; },
       "page_table", "page_table[0, 1] = 8 is out of range [0, 8)"},
      {"page_id_int_max", kPagedAppend, [](C& c) { C::i32(c.args.page_table)[0] = INT_MAX; },
       "page_table", "page_table[0, 0] = 2147483647 is out of range"},
      {"page_id_negative", kPagedAppend, [](C& c) { C::i32(c.args.page_table)[4] = -1; },
       "page_table", "page_table[1, 0] = -1 is out of range"},
      {"page_id_int_min", kPagedRead, [](C& c) { C::i32(c.args.page_table)[5] = INT_MIN; },
       "page_table", "page_table[1, 1] = -2147483648 is out of range"},
      {"page_ids_shared_by_two_appends", kPagedAppend,
       [](C& c) {
         Call::i32(c.args.cache_seqlens)[1] = 3;
         C::i32(c.args.page_table)[4] = 0;  // sequence 1's first page is sequence 0's
       },
       "page_table", "batch 0 and batch 1 both append into cache page 0, row 3"},
      {"page_ids_shared_read_only", kPagedRead,
       [](C& c) {
         for (int i = 0; i < 4; ++i) C::i32(c.args.page_table)[4 + i] = C::i32(c.args.page_table)[i];
       },
       nullptr, "two sequences may read the same pages (prefix sharing)",
       [](C& c) {
         for (int i = 0; i < 4; ++i) C::i32(c.args.page_table)[4 + i] = C::i32(c.args.page_table)[i];
       }},
      {"page_ids_unused_are_never_read", kPagedRead,
       [](C& c) {
         C::i32(c.args.page_table)[3] = -7;  // past sequence 0's 3 tokens
         C::i32(c.args.page_table)[7] = 1 << 30;
       },
       nullptr, "page ids past a sequence's length are not read (any value)"},
      {"append_of_no_rows_without_data", kAppend,
       [](C& c) {  // found by fuzz/fuzz_call.cpp (UBSan: offset applied to a null pointer)
         for (OptTensor* t : {&c.args.k, &c.args.v}) (*t)->shape[1] = 0, (*t)->data = nullptr;
       },
       nullptr, "new k / v of no rows append nothing",
       [](C& c) {
         c.args.k.reset();
         c.args.v.reset();
       }},
      // --- cache_seqlens
      {"cache_seqlens_past_capacity", kDense, [&](C& c) { seqlens(c, {3, 17}); }, "cache_seqlens",
       "cache_seqlens[1] + new tokens = 17 + 0 = 17 exceeds the cache capacity 16"},
      {"cache_seqlens_plus_append_past_capacity", kAppend, [&](C& c) { seqlens(c, {3, 15}); },
       "cache_seqlens", "15 + 2 = 17 exceeds the cache capacity 16"},
      {"cache_seqlens_int_max_plus_append", kAppend, [&](C& c) { seqlens(c, {INT_MAX, 0}); },
       "cache_seqlens", "2147483647 + 2 = 2147483649 exceeds the cache capacity 16"},
      {"cache_seqlens_negative", kDense, [&](C& c) { seqlens(c, {3, -1}); }, "cache_seqlens",
       "cache_seqlens[1] = -1 must be >= 0"},
      {"cache_seqlens_int_min", kAppend, [&](C& c) { seqlens(c, {INT_MIN, 0}); },
       "cache_seqlens", "cache_seqlens[0] = -2147483648 must be >= 0"},
      {"cache_seqlens_int_past_capacity", kDense,
       [](C& c) {
         c.args.cache_seqlens.reset();
         c.args.cache_seqlens_value = 17;
       },
       "cache_seqlens", "cache_seqlens = 17 is out of range [0, 16]"},
      {"cache_seqlens_int_negative", kDense,
       [](C& c) {
         c.args.cache_seqlens.reset();
         c.args.cache_seqlens_value = -3;
       },
       "cache_seqlens", "cache_seqlens = -3 is out of range"},
      {"cache_seqlens_zero", kDense, [&](C& c) { seqlens(c, {0, 0}); }, nullptr,
       "no visible key: out 0, LSE -inf",
       nullptr,
       [](const C& c, const C&) {
         return all_equal(c.outputs.out, 0, c.outputs.out.numel(), 0.0f) &&
                all_equal(*c.outputs.softmax_lse, 0, c.outputs.softmax_lse->numel(), -kInf);
       }},
      // --- cache_batch_idx and cache_leftpad
      {"cache_batch_idx_past_end", kDense, [](C& c) { c.args.cache_batch_idx = c.ints({0, 2}); },
       "cache_batch_idx", "cache_batch_idx[1] = 2 is out of range [0, 2)"},
      {"cache_batch_idx_negative", kDense, [](C& c) { c.args.cache_batch_idx = c.ints({-1, 0}); },
       "cache_batch_idx", "cache_batch_idx[0] = -1 is out of range [0, 2)"},
      {"cache_batch_idx_int_min", kAppend, [](C& c) { c.args.cache_batch_idx = c.ints({0, INT_MIN}); },
       "cache_batch_idx", "cache_batch_idx[1] = -2147483648 is out of range"},
      {"cache_batch_idx_duplicated_appends", kAppend,
       [&](C& c) {
         c.args.cache_batch_idx = c.ints({1, 1});
         seqlens(c, {3, 4});  // sequence 0 appends positions 3, 4; sequence 1 positions 4, 5
       },
       "cache_batch_idx", "batch 0 and batch 1 both append into cache row 1, position 4"},
      {"cache_batch_idx_duplicated_read_only", kDense,
       [&](C& c) {
         c.args.cache_batch_idx = c.ints({1, 1});
         seqlens(c, {5, 5});
       },
       nullptr, "two sequences may read one cache row",
       [&](C& c) {  // the same as a cache whose row 0 is a copy of row 1
         const int64_t row = c.args.k_cache->stride(0);
         for (const OptTensor* t : {&c.args.k_cache, &c.args.v_cache}) {
           std::memcpy((*t)->ptr<float>(), (*t)->ptr<float>() + row, row * sizeof(float));
         }
         c.args.cache_batch_idx = c.ints({0, 1});
         seqlens(c, {5, 5});
       }},
      {"cache_leftpad_past_seqlen", kDense, [](C& c) { c.args.cache_leftpad = c.ints({4, 0}); },
       "cache_leftpad", "cache_leftpad[0] = 4 is out of range [0, 3]"},
      {"cache_leftpad_negative", kDense, [](C& c) { c.args.cache_leftpad = c.ints({0, -1}); },
       "cache_leftpad", "cache_leftpad[1] = -1 is out of range [0, 5]"},
      {"cache_leftpad_int_min", kDense, [](C& c) { c.args.cache_leftpad = c.ints({INT_MIN, 0}); },
       "cache_leftpad", "cache_leftpad[0] = -2147483648 is out of range [0, 3]"},
      // --- cu_seqlens_q / max_seqlen_q (kVarlenQ: cu_seqlens_q = {0, 2, 4}, max_seqlen_q = 2)
      {"cu_seqlens_q_nonzero_start", kVarlenQ, [](C& c) { C::i32(c.args.cu_seqlens_q)[0] = 1; },
       "cu_seqlens_q", "cu_seqlens_q[0] = 1, expected 0"},
      {"cu_seqlens_q_non_monotonic", kVarlenQ, [](C& c) { C::i32(c.args.cu_seqlens_q)[1] = 5; },
       "cu_seqlens_q", "cu_seqlens_q[2] = 4 is less than cu_seqlens_q[1] = 5"},
      {"cu_seqlens_q_int_extremes", kVarlenQ,
       [](C& c) { C::i32(c.args.cu_seqlens_q)[1] = INT_MAX; },
       "cu_seqlens_q", "cu_seqlens_q[2] = 4 is less than cu_seqlens_q[1] = 2147483647"},
      {"cu_seqlens_q_last_past_total", kVarlenQ, [](C& c) { C::i32(c.args.cu_seqlens_q)[2] = 5; },
       "cu_seqlens_q", "cu_seqlens_q[2] = 5, expected the total 4 (q.shape[0])"},
      {"cu_seqlens_q_last_short", kVarlenQ, [](C& c) { C::i32(c.args.cu_seqlens_q)[2] = 3; },
       "cu_seqlens_q", "cu_seqlens_q[2] = 3, expected the total 4"},
      {"max_seqlen_q_below_real_max", kVarlenQ, [](C& c) { c.args.max_seqlen_q = 1; },
       "cu_seqlens_q", "cu_seqlens_q[1] - cu_seqlens_q[0] = 2 exceeds max_seqlen_q = 1"},
      {"max_seqlen_q_negative", kVarlenQ, [](C& c) { c.args.max_seqlen_q = -1; }, "max_seqlen_q",
       "max_seqlen_q must be >= 0 (got -1)"},
      {"max_seqlen_q_missing", kVarlenQ, [](C& c) { c.args.max_seqlen_q.reset(); },
       "max_seqlen_q", "max_seqlen_q must be provided if cu_seqlens_q is provided"},
      {"max_seqlen_q_above_real_max", kVarlenQ, [](C& c) { c.args.max_seqlen_q = 7; }, nullptr,
       "max_seqlen_q is a bound: a larger one gives the same output"},
      {"cu_seqlens_k_new_non_monotonic", kPackedAppend,
       [](C& c) { C::i32(c.args.cu_seqlens_k_new)[1] = 5; }, "cu_seqlens_k_new",
       "cu_seqlens_k_new[2] = 4 is less than cu_seqlens_k_new[1] = 5"},
      {"cu_seqlens_k_new_last_past_total", kPackedAppend,
       [](C& c) { C::i32(c.args.cu_seqlens_k_new)[2] = INT_MAX; }, "cu_seqlens_k_new",
       "cu_seqlens_k_new[2] = 2147483647, expected the total 4 (k.shape[0])"},
      {"cu_seqlens_k_new_int_min_start", kPackedAppend,
       [](C& c) { C::i32(c.args.cu_seqlens_k_new)[0] = INT_MIN; }, "cu_seqlens_k_new",
       "cu_seqlens_k_new[0] = -2147483648, expected 0"},
      {"rotary_seqlens_negative", kRotaryAppend, [](C& c) { c.args.rotary_seqlens = c.ints({-1, 0}); },
       "rotary_seqlens", "rotary_seqlens[0] = -1 must be >= 0"},
      {"rotary_seqlens_past_table", kRotaryAppend,
       [](C& c) { c.args.rotary_seqlens = c.ints({0, INT_MAX}); }, "rotary_cos",
       "rotary_cos / rotary_sin have 32 rows, but batch 1 rotates position 2147483648"},
      // --- dtypes, devices, ranks, strides, sizes
      {"q_dtype_int32", kDense, [](C& c) { c.args.q->dtype = DType::i32; }, "q",
       "FlashAttention only supports fp16, bf16, and fp8_e4m3 data type"},
      {"q_dtype_float64", kDense, [](C& c) { c.args.q->dtype = DType::f64; }, "q",
       "(q is float64)"},
      {"k_cache_dtype_differs", kDense, [](C& c) { c.args.k_cache->dtype = DType::f16; }, "k_cache",
       "query and key must have the same dtype"},
      {"cache_seqlens_float", kDense, [](C& c) { c.args.cache_seqlens->dtype = DType::f32; },
       "cache_seqlens", "cache_seqlens must have dtype int32 (expected int32, got float32)"},
      {"page_table_8_byte_ints", kPagedRead, [](C& c) { c.args.page_table->dtype = DType::f64; },
       "page_table", "page_table must have dtype torch.int32 (expected int32, got float64)"},
      {"cache_batch_idx_8_byte_ints", kDense,
       [](C& c) {
         c.args.cache_batch_idx = c.ints({0, 1, 0, 0});
         c.args.cache_batch_idx->dtype = DType::f64;
         c.args.cache_batch_idx->shape[0] = 2;
       },
       "cache_batch_idx", "cache_batch_idx must have dtype int32 (expected int32, got float64)"},
      {"k_cache_on_another_device", kDense,
       [](C& c) { c.args.k_cache->device = {DeviceType::cuda, 0}; }, "k_cache",
       "k_cache must be on the same device as the query (expected cpu, got cuda:0)"},
      {"q_on_unknown_device", kDense, [](C& c) { c.args.q->device = {DeviceType(9), 0}; }, "q",
       "q must be on a CPU or CUDA device"},
      {"q_rank_3_without_cu_seqlens", kDense, [](C& c) { c.args.q->rank = 3; }, "q",
       "q must have rank 4 (b, s_q, h, d)"},
      {"q_rank_7", kDense, [](C& c) { c.args.q->rank = 7; }, "q", "q must have rank 0 to 6"},
      {"v_cache_rank_5", kDense, [](C& c) { c.args.v_cache->rank = 5; }, "v_cache",
       "v_cache must have rank 4"},
      {"q_last_dim_strided", kDense, [](C& c) { c.args.q->strides[3] = 2; }, "q",
       "q must have contiguous last dimension"},
      {"v_cache_last_dim_stride_0", kDense, [](C& c) { c.args.v_cache->strides[3] = 0; }, "v_cache",
       "v_cache must have contiguous last dimension"},
      {"cache_seqlens_strided", kDense,
       [](C& c) {
         c.args.cache_seqlens = c.ints({3, 0, 5, 0});
         c.args.cache_seqlens->shape[0] = 2;
         c.args.cache_seqlens->strides[0] = 2;
       },
       "cache_seqlens", "cache_seqlens must be contiguous"},
      {"q_negative_size", kDense, [](C& c) { c.args.q->shape[0] = -1; }, "q",
       "q has a size out of range [0, 2^31) in dimension 0"},
      {"q_size_2_to_31", kDense, [](C& c) { c.args.q->shape[1] = int64_t{1} << 31; }, "q",
       "q has a size out of range [0, 2^31) in dimension 1"},
      {"k_cache_stride_past_2_to_62", kDense,
       [](C& c) { c.args.k_cache->strides[0] = INT64_MIN / 2; },  // found by fuzz/fuzz_call.cpp
       "k_cache", "k_cache has strides out of range (shape (2, 16, 2, 64), strides "
                  "(-4611686018427387904, 128, 64, 1)): byte offsets must stay below 2^62"},
      {"q_no_data", kDense, [](C& c) { c.args.q->data = nullptr; }, "q", "q has no data pointer"},
      {"k_cache_elements_past_2_to_63", kDense,
       [](C& c) {
         *c.args.k_cache = reshaped(*c.args.k_cache, {1 << 30, 1 << 30, 1 << 30, 64}, {0, 0, 0, 1});
       },
       "k_cache", "k_cache has more than 2^63 elements"},
      {"batch_2_to_24_of_stride_0_views", kDense, [&](C& c) { huge_batch(c, int64_t{1} << 24); }, "q",
       "batch_size 16777216 exceeds kvflash's limit of 1048576 sequences per call"},
      {"batch_2_to_30_of_stride_0_views", kDense, [&](C& c) { huge_batch(c, int64_t{1} << 30); }, "q",
       "batch_size 1073741824 exceeds kvflash's limit"},
      {"query_rows_past_2_to_31", kDense,
       [](C& c) {
         *c.args.q = reshaped(*c.args.q, {2, int64_t{1} << 30 | 1, 4, 64}, {0, 0, 64, 1});
       },
       "q", "batch_size * seqlen_q = 2 * 1073741825 query rows exceed 2^31 - 1"},
      {"new_rows_past_2_to_31", kAppend,
       [](C& c) { *c.args.k = reshaped(*c.args.k, {2, int64_t{1} << 30 | 1, 2, 64}, {0, 0, 64, 1}); },
       "k", "batch_size * seqlen_new = 2 * 1073741825 new rows exceed 2^31 - 1"},
      {"paged_capacity_past_2_to_31", kPagedRead,
       [](C& c) {
         for (OptTensor* t : {&c.args.k_cache, &c.args.v_cache}) {
           **t = reshaped(**t, {8, int64_t{1} << 30, 2, 64}, {0, 0, 64, 1});
         }
       },
       "page_table", "max_num_pages_per_seq * page_size = 4 * 1073741824 exceeds 2^31 - 1 keys"},
      {"headdim_100000", kDense,
       [](C& c) {
         for (OptTensor* t : {&c.args.q, &c.args.k_cache, &c.args.v_cache}) (*t)->shape[3] = 100000;
       },
       "q", "FlashAttention forward only supports head dimension at most 256 (headdim is 100000)"},
      // --- scalars
      {"num_splits_10000", kDense, [](C& c) { c.args.num_splits = 10000; }, "num_splits",
       "num_splits > 256 not supported (got 10000)"},
      {"num_splits_negative", kDense, [](C& c) { c.args.num_splits = -5; }, nullptr,
       "num_splits <= 0 means the heuristic: the same as 0", [](C& c) { c.args.num_splits = 0; }},
      {"softcap_negative", kDense, [](C& c) { c.args.softcap = -1.0f; }, "softcap",
       "softcap must be >= 0"},
      {"softcap_nan", kDense, [](C& c) { c.args.softcap = kNan; }, "softcap", "softcap must be >= 0"},
      {"softcap_infinite", kDense, [](C& c) { c.args.softcap = kInf; }, nullptr,
       "softcap = inf is no cap: the same as softcap = 0"},
      {"softmax_scale_infinite", kDense, [](C& c) { c.args.softmax_scale = kInf; }, "softmax_scale",
       "softmax_scale must be finite"},
      {"softmax_scale_nan", kDense, [](C& c) { c.args.softmax_scale = kNan; }, "softmax_scale",
       "softmax_scale must be finite"},
      {"window_left_below_minus_1", kDense, [](C& c) { c.args.window_left = -2; }, "window_size",
       "window_size[0] must be >= -1"},
      {"attention_chunk_negative", kDense, [](C& c) { c.args.attention_chunk = -1; },
       "attention_chunk", "attention_chunk must be >= 0"},
      {"sm_margin_negative", kDense, [](C& c) { c.args.sm_margin = -1; }, "sm_margin",
       "sm_margin must be >= 0"},
      // --- scheduler metadata
      {"metadata_garbage", kDense,
       [](C& c) {
         const size_t n = make_plan(c.args).fa3_size();
         c.args.scheduler_metadata = c.tensor(DType::i32, {static_cast<int64_t>(n)});
         for (size_t i = 0; i < n; ++i) C::i32(c.args.scheduler_metadata)[i] = 0x7fff0000 + int(i);
       },
       "scheduler_metadata", "scheduler_metadata"},
      {"metadata_wrong_length", kDense,
       [](C& c) { c.args.scheduler_metadata = c.ints({1, 1, 1}); }, "scheduler_metadata",
       "scheduler_metadata must have shape ("},
      {"metadata_float", kDense,
       [](C& c) {
         c.args.scheduler_metadata = c.ints({1, 1, 1});
         c.args.scheduler_metadata->dtype = DType::f32;
       },
       "scheduler_metadata", "scheduler_metadata must have dtype int32"},
      {"plan_from_another_batch", kDense,
       [](C& c) {
         static Plan other;  // made for three sequences (a longer cache alone would be accepted)
         Call wider(CallDims{.batch = 3});
         other = make_plan(wider.args);
         c.args.plan = &other;
       },
       "scheduler_metadata",
       "scheduler_metadata was made for a different problem: batch (plan made for 3, call has 2)"},
      // --- NaN and Inf in the inputs (spec 5.5: a row whose softmax sum is NaN gets out 0, LSE
      // -inf; values the call does not read never reach the output)
      {"nan_in_unread_cache_rows", kDense,
       [](C& c) {
         for (const OptTensor* t : {&c.args.k_cache, &c.args.v_cache}) {
           for (int s = 3; s < 16; ++s) set_float(*t, at4(**t, 0, s, 0), kNan);
         }
       },
       nullptr, "cache rows past cache_seqlens are never read"},
      {"inf_in_masked_keys", kDense,
       [](C& c) {
         c.args.causal = true;
         c.args.window_left = 0;  // each query row sees one key: sequence 0's rows see keys 1, 2
         set_float(c.args.k_cache, at4(*c.args.k_cache, 0, 0, 0), kInf);
         set_float(c.args.v_cache, at4(*c.args.v_cache, 0, 0, 1), -kInf);
       },
       nullptr, "masked keys are never read",
       [](C& c) {
         c.args.causal = true;
         c.args.window_left = 0;
       }},
      {"nan_in_q", kDense, [](C& c) { set_float(c.args.q, 0, kNan); }, nullptr,
       "a NaN query row has a NaN softmax sum: out 0, LSE -inf; other rows unchanged", nullptr,
       [](const C& c, const C& clean) {
         const int64_t n = c.outputs.out.numel();
         return all_equal(c.outputs.out, 0, 64, 0.0f) && all_equal(*c.outputs.softmax_lse, 0, 1, -kInf) &&
                same_floats(c.outputs.out, clean.outputs.out, 64, n - 64);
       }},
      {"nan_in_visible_value", kDense,
       [](C& c) { set_float(c.args.v_cache, at4(*c.args.v_cache, 1, 0, 0), kNan); }, nullptr,
       "a NaN value of a visible key makes that KV head's outputs NaN; other sequences unchanged",
       nullptr,
       [](const C& c, const C& clean) {
         return std::isnan(c.outputs.out.ptr<float>()[at4(c.outputs.out, 1, 0, 0)]) &&
                same_floats(c.outputs.out, clean.outputs.out, 0, c.outputs.out.stride(0));
       }},
      {"inf_in_visible_key", kDense,
       [](C& c) { set_float(c.args.k_cache, at4(*c.args.k_cache, 1, 0, 0), kInf); }, nullptr,
       "a +inf score makes the row's softmax sum NaN: out 0, LSE -inf; a -inf score is ignored; "
       "other sequences unchanged",
       nullptr,
       [](const C& c, const C& clean) {
         bool rows = true;
         for (int s = 0; s < 2; ++s) {
           for (int h = 0; h < 2; ++h) rows = rows && zero_or_finite_row(c, 1, s, h);
         }
         return rows && same_floats(c.outputs.out, clean.outputs.out, 0, c.outputs.out.stride(0));
       }},
      // --- aliasing: memory overlap, not identity (written: out, LSE, and the caches when
      // appending)
      {"k_cache_is_v_cache_with_append", kAppend, [](C& c) { c.args.v_cache = c.args.k_cache; },
       "k_cache", "k_cache and v_cache overlap in memory"},
      {"k_cache_is_v_cache_read_only", kDense, [](C& c) { c.args.v_cache = c.args.k_cache; }, nullptr,
       "caches that are only read may share memory",
       [](C& c) {
         std::memcpy(c.args.v_cache->data, c.args.k_cache->data, c.args.k_cache->numel() * sizeof(float));
       }},
      {"interleaved_kv_views_with_append", kAppend,
       [](C& c) {  // k_cache = kv[:, 0], v_cache = kv[:, 1] of one (2, 2, 16, 2, 64) buffer
         const int64_t row = c.args.k_cache->stride(0);
         TensorView kv = c.tensor(DType::f32, {2, 2, 16, 2, 64});
         for (int b = 0; b < 2; ++b) {
           std::memcpy(kv.ptr<float>() + (2 * b) * row, c.args.k_cache->ptr<float>() + b * row, row * 4);
           std::memcpy(kv.ptr<float>() + (2 * b + 1) * row, c.args.v_cache->ptr<float>() + b * row, row * 4);
         }
         *c.args.k_cache = reshaped(kv, {2, 16, 2, 64}, {2 * row, 128, 64, 1});
         *c.args.v_cache = reshaped(kv, {2, 16, 2, 64}, {2 * row, 128, 64, 1});
         c.args.v_cache->data = kv.ptr<float>() + row;
       },
       nullptr, "interleaved views of one buffer have disjoint elements: valid"},
      {"out_is_q", kDense, [](C& c) { c.outputs.out.data = c.args.q->data; }, "out",
       "out and q overlap in memory"},
      {"out_inside_k_cache", kDense, [](C& c) { c.outputs.out.data = c.args.k_cache->ptr<float>() + 64; },
       "out", "out and k_cache overlap in memory"},
      {"lse_inside_out", kDense,
       [](C& c) { c.outputs.softmax_lse->data = c.outputs.out.ptr<float>() + 5; }, "out",
       "out and softmax_lse overlap in memory"},
      {"new_k_is_rows_of_k_cache", kAppend,
       [](C& c) { c.args.k->data = c.args.k_cache->ptr<float>() + 8 * 128; }, "k_cache",
       "k_cache and k overlap in memory"},
      {"new_v_is_rows_of_v_cache", kAppend,
       [](C& c) { c.args.v->data = c.args.v_cache->ptr<float>() + 14 * 128; }, "v_cache",
       "v_cache and v overlap in memory"},
      {"new_k_is_a_view_of_q", kAppend,
       [](C& c) { *c.args.k = reshaped(*c.args.q, {2, 2, 2, 64}, {512, 256, 64, 1}); }, nullptr,
       "new keys may be read from a view of q (only read)",
       [](C& c) {
         for (int b = 0; b < 2; ++b) {
           for (int s = 0; s < 2; ++s) {
             std::memcpy(c.args.k->ptr<float>() + at4(*c.args.k, b, s, 0),
                         c.args.q->ptr<float>() + at4(*c.args.q, b, s, 0), 128 * sizeof(float));
           }
         }
       }},
      {"out_stride_0", kDense, [](C& c) { c.outputs.out.strides[1] = 0; }, "out",
       "out has elements that share memory (shape (2, 2, 4, 64), strides (512, 0, 64, 1))"},
      {"lse_stride_0", kDense, [](C& c) { c.outputs.softmax_lse->strides[0] = 0; }, "softmax_lse",
       "softmax_lse has elements that share memory"},
      {"k_cache_stride_0_with_append", kAppend, [](C& c) { c.args.k_cache->strides[0] = 0; },
       "k_cache", "k_cache has elements that share memory"},
      {"cache_stride_0_read_only", kDense,
       [](C& c) {
         c.args.k_cache->strides[0] = 0;
         c.args.v_cache->strides[0] = 0;
       },
       nullptr, "a broadcast (stride-0) cache that is only read is valid",
       [](C& c) {
         const int64_t row = c.args.k_cache->stride(0);
         for (const OptTensor* t : {&c.args.k_cache, &c.args.v_cache}) {
           std::memcpy((*t)->ptr<float>() + row, (*t)->ptr<float>(), row * sizeof(float));
         }
       }},
  };
}

}  // namespace kvflash::testing
