// One rank's partial attention (attend_shard): store the rank's new K/V, then run the ordinary
// calls of shard_calls.h for every sequence and gather their out / LSE into float32 partials.
//
// Why per-sequence calls built from views, rather than one call per rank: the call's window is one
// pair for the whole batch, but a rank's shifted window differs per sequence (it depends on where
// the sequence's keys fall). Views (q rows, the page-table row or cache row, descale rows) make
// each call address one sequence without copying anything but the tiny leftpad value. When every
// sequence fits one call with the same window (decode without a window), the batch is one call.
//
// Host tensors only for now: the appends are memcpy, the page table and cache_batch_idx are read
// on the host, the leftpad / seqlens tensors and the out / LSE scratch are host memory, and the
// conversion of out (q's dtype) to the float32 partial is a host loop. A CUDA version needs a
// device copy for the appends, device-resident leftpad / seqlens, and a small conversion kernel.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <limits>
#include <string>
#include <vector>

#include "core/numeric.h"
#include "core/validate.h"
#include "kvflash/context_parallel.h"
#include "parallel/shard_calls.h"

namespace kvflash::cp {
namespace {

using std::to_string;

// A view of t[index, start : start + length, ...] with the leading dimension kept (size 1).
TensorView slice(const TensorView& t, int64_t index, int64_t start, int64_t length) {
  TensorView v = t;
  const int64_t offset = index * t.strides[0] + (t.rank > 1 ? start * t.strides[1] : 0);
  v.data = static_cast<char*>(t.data) + offset * int64_t(dtype_size(t.dtype));
  v.shape[0] = 1;
  if (t.rank > 1) v.shape[1] = length;
  return v;
}

TensorView row_of(const TensorView& t, int64_t index) {
  return slice(t, index, 0, t.rank > 1 ? t.shape[1] : 1);
}

float load_float(DType dtype, const void* p) {
  switch (dtype) {
    case DType::f32: return *static_cast<const float*>(p);
    case DType::bf16: return core::bf16_to_float(*static_cast<const uint16_t*>(p));
    case DType::f16: return core::fp16_to_float(*static_cast<const uint16_t*>(p));
    default:
      core::fail(ErrorKind::invalid_type, "out", std::string("unexpected output dtype ") +
                                                     dtype_name(dtype));
  }
}

void require_absent(const OptTensor& t, const char* name, const char* why) {
  if (t) core::fail(ErrorKind::unsupported, name, std::string(name) + " is not taken here: " + why);
}

void check_shard(const ShardArgs& shard) {
  const KvCacheArgs& a = shard.call;
  shard.layout.check();
  if (shard.rank < 0 || shard.rank >= shard.layout.world_size) {
    core::fail(ErrorKind::invalid_value, "rank",
               "rank must be in [0, world_size) (got " + to_string(shard.rank) + " with world_size " +
                   to_string(shard.layout.world_size) + ")");
  }
  if (!a.q || !a.k_cache || !a.v_cache || a.only_qv) {
    core::fail(ErrorKind::unsupported, "q", "context parallelism needs q, k_cache and v_cache");
  }
  core::require_rank(*a.q, "q", 4, "(batch_size, seqlen_q, num_heads, head_size)");
  if (a.q->device.type != DeviceType::cpu) {
    core::fail(ErrorKind::unsupported, "q",
               "context-parallel partials run on host tensors in this build (q is on " +
                   device_name(a.q->device) + ")");
  }
  const char* derived = "the rank's lengths follow from global_cache_seqlens and the layout";
  require_absent(a.cache_seqlens, "cache_seqlens", derived);
  require_absent(a.cache_leftpad, "cache_leftpad", derived);
  if (a.cache_seqlens_value) {
    core::fail(ErrorKind::unsupported, "cache_seqlens", std::string("cache_seqlens is not taken here: ") + derived);
  }
  require_absent(a.cu_seqlens_q, "cu_seqlens_q", "q must be dense (b, s_q, h, d)");
  require_absent(a.cu_seqlens_k_new, "cu_seqlens_k_new", "k / v must be dense (b, s_new, h_k, d)");
  const char* rotary = "rotate the new keys and the queries before the call";
  require_absent(a.rotary_cos, "rotary_cos", rotary);
  require_absent(a.rotary_sin, "rotary_sin", rotary);
  require_absent(a.rotary_seqlens, "rotary_seqlens", rotary);
  require_absent(a.scheduler_metadata, "scheduler_metadata", "each rank plans its own calls");
  if (a.plan) core::fail(ErrorKind::unsupported, "plan", "plan is not taken here: each rank plans its own calls");
  // The whole call on this rank's cache, as the contract checks it: shapes, dtypes and devices of
  // q, the caches, k / v (which this layer stores itself), page_table, descales, sinks, windows.
  KvCacheArgs whole = a;
  whole.cache_seqlens_value = 0;
  validate(whole);
  if (int64_t(shard.global_cache_seqlens.size()) != a.q->shape[0]) {
    core::fail(ErrorKind::invalid_value, "global_cache_seqlens",
               "global_cache_seqlens must have one length per batch element (expected " +
                   to_string(a.q->shape[0]) + ", got " + to_string(shard.global_cache_seqlens.size()) + ")");
  }
}

// Where this rank's cache keeps its local position `pos` of cache row `row`, as an element offset
// (same for k_cache and v_cache up to their strides).
struct CacheAddress {
  const KvCacheArgs& a;
  int64_t page_size() const { return a.page_table ? a.k_cache->shape[1] : 0; }
  int64_t capacity() const {
    return a.page_table ? a.page_table->shape[1] * a.k_cache->shape[1] : a.k_cache->shape[1];
  }
  int64_t offset(const TensorView& cache, int64_t row, int64_t pos) const {
    if (!a.page_table) return row * cache.strides[0] + pos * cache.strides[1];
    const TensorView& pt = *a.page_table;
    const int32_t page = pt.ptr<const int32_t>()[row * pt.strides[0] + (pos / page_size()) * pt.strides[1]];
    return int64_t(page) * cache.strides[0] + (pos % page_size()) * cache.strides[1];
  }
};

// Copies one token (h_k, d) of new K or V into the cache at element offset `at`.
void store_token(const TensorView& cache, int64_t at, const TensorView& knew, int64_t b, int64_t t) {
  const size_t elem = dtype_size(cache.dtype);
  const size_t row_bytes = size_t(knew.shape[3]) * elem;
  for (int64_t h = 0; h < knew.shape[2]; ++h) {
    const char* src = static_cast<const char*>(knew.data) +
                      (b * knew.strides[0] + t * knew.strides[1] + h * knew.strides[2]) * int64_t(elem);
    char* dst = static_cast<char*>(cache.data) + (at + h * cache.strides[2]) * int64_t(elem);
    std::memcpy(dst, src, row_bytes);
  }
}

// New token t of sequence b sits at global position og + t; the owner stores it at its next
// local position, so a rank's cache stays in global order.
void append_owned(const ShardArgs& shard, const CacheAddress& cache, int64_t b, int64_t row, int64_t og) {
  const KvCacheArgs& a = shard.call;
  if (!a.k) return;
  for (int64_t t = 0; t < a.k->shape[1]; ++t) {
    const int64_t global = og + t;
    if (shard.layout.owner(global) != shard.rank) continue;
    const int64_t local = shard.layout.owned_before(shard.rank, global);
    store_token(*a.k_cache, cache.offset(*a.k_cache, row, local), *a.k, b, t);
    store_token(*a.v_cache, cache.offset(*a.v_cache, row, local), *a.v, b, t);
  }
}

float sink_of(const KvCacheArgs& a, int64_t h) {
  const TensorView& s = *a.sinks;
  return load_float(s.dtype, static_cast<const char*>(s.data) + h * s.strides[0] * int64_t(dtype_size(s.dtype)));
}

struct Partial {
  float* out;  // (b, s_q, h, d_v)
  float* lse;  // (b, s_q, h)
  int64_t seqlen_q, heads, headdim_v;
};

// One flash_attn_with_kvcache call: query rows [row0, row0 + rows) of `count` sequences from b0.
// count 1 addresses one sequence through views; otherwise the call is the whole batch, with
// per-sequence lengths in tensors.
struct CallSpan {
  int64_t b0 = 0;
  int64_t count = 1;
  int64_t cache_row = 0;  // count 1: the sequence's cache row
  ShardCall call;         // rows and window; count 1: its leftpad and seqlen
  std::vector<int32_t> leftpad, seqlen;  // count > 1: per sequence
};

KvCacheArgs call_args(const ShardArgs& shard, const CallSpan& span, int32_t& leftpad) {
  const KvCacheArgs& a = shard.call;
  KvCacheArgs c = a;
  c.k = c.v = std::nullopt;  // appended already, by their owners
  c.causal = false;
  c.window_left = span.call.window_left;
  c.window_right = span.call.window_right;
  c.attention_chunk = 0;
  if (shard.rank != 0) c.sinks = std::nullopt;  // counted once, by rank 0
  if (span.count > 1) {
    c.cache_seqlens = TensorView::contiguous(const_cast<int32_t*>(span.seqlen.data()), DType::i32, {span.count});
    const bool padded = std::any_of(span.leftpad.begin(), span.leftpad.end(), [](int32_t x) { return x > 0; });
    if (padded) c.cache_leftpad = TensorView::contiguous(const_cast<int32_t*>(span.leftpad.data()), DType::i32, {span.count});
    return c;
  }
  c.q = slice(*a.q, span.b0, span.call.row0, span.call.rows);
  if (a.qv) c.qv = slice(*a.qv, span.b0, span.call.row0, span.call.rows);
  c.cache_batch_idx = std::nullopt;
  if (a.page_table) {
    c.page_table = row_of(*a.page_table, span.cache_row);
  } else {
    c.k_cache = row_of(*a.k_cache, span.cache_row);
    c.v_cache = row_of(*a.v_cache, span.cache_row);
  }
  c.cache_seqlens_value = int(span.call.seqlen);
  leftpad = int32_t(span.call.leftpad);
  if (leftpad > 0) c.cache_leftpad = TensorView::contiguous(&leftpad, DType::i32, {1});
  for (OptTensor* descale : {&c.q_descale, &c.k_descale, &c.v_descale}) {
    if (*descale) *descale = row_of(**descale, span.b0);
  }
  return c;
}

// Runs the call and writes its rows into the partial as float32, (b, s_q, h) order.
void run_span(const ShardArgs& shard, const CallSpan& span, const Partial& partial, const RunOptions& options) {
  int32_t leftpad = 0;
  const KvCacheArgs c = call_args(shard, span, leftpad);
  const DType out_dtype = shard.call.q->dtype == DType::e4m3 ? DType::bf16 : shard.call.q->dtype;
  const int64_t n = span.count, m = span.call.rows, h = partial.heads, dv = partial.headdim_v;
  std::vector<char> out_bytes(size_t(n * m * h * dv) * dtype_size(out_dtype));
  std::vector<float> lse(size_t(n * h * m));
  Outputs outs;
  outs.out = TensorView::contiguous(out_bytes.data(), out_dtype, {n, m, h, dv});
  outs.softmax_lse = TensorView::contiguous(lse.data(), DType::f32, {n, h, m});
  RunOptions call_options = options;
  call_options.workspace = {};  // the caller's workspace was sized for another problem
  flash_attn_with_kvcache(c, outs, call_options);

  const size_t elem = dtype_size(out_dtype);
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t t = 0; t < m; ++t) {
      for (int64_t head = 0; head < h; ++head) {
        const int64_t at = ((span.b0 + j) * partial.seqlen_q + span.call.row0 + t) * h + head;
        const int64_t from = (j * m + t) * h + head;
        partial.lse[at] = lse[size_t((j * h + head) * m + t)];
        for (int64_t x = 0; x < dv; ++x) {
          partial.out[at * dv + x] = load_float(out_dtype, out_bytes.data() + size_t(from * dv + x) * elem);
        }
      }
    }
  }
}

// One batched call when every sequence's rows fit one call and the windows agree (decode without
// a window: every rank sees all its keys); nullopt otherwise.
std::optional<CallSpan> batched_span(const std::vector<std::vector<LocalRange>>& ranges) {
  CallSpan span;
  span.count = int64_t(ranges.size());
  bool window_set = false;
  for (const auto& rows : ranges) {
    const std::optional<ShardCall> whole = whole_sequence_call(rows);
    if (!whole) return std::nullopt;
    const bool has_keys = whole->seqlen > whole->leftpad;
    if (has_keys && window_set &&
        (whole->window_left != span.call.window_left || whole->window_right != span.call.window_right)) {
      return std::nullopt;
    }
    if (has_keys && !window_set) {
      span.call = *whole;
      window_set = true;
    }
    span.leftpad.push_back(int32_t(whole->leftpad));
    span.seqlen.push_back(int32_t(whole->seqlen));
  }
  span.call.row0 = 0;
  span.call.rows = ranges.empty() ? 0 : int(ranges[0].size());
  return span;
}

void check_lengths(const ShardArgs& shard, const CacheAddress& cache, int64_t b, int64_t seqlen_new) {
  const int64_t og = shard.global_cache_seqlens[size_t(b)];
  if (og < 0) {
    core::fail(ErrorKind::invalid_value, "global_cache_seqlens",
               "global_cache_seqlens[" + to_string(b) + "] must be >= 0 (got " + to_string(og) + ")");
  }
  const ShardLayout& layout = shard.layout;
  if (layout.kind == ShardLayout::Kind::contiguous && og + seqlen_new > layout.positions_per_rank * layout.world_size) {
    core::fail(ErrorKind::invalid_value, "global_cache_seqlens",
               "batch " + to_string(b) + " has " + to_string(og + seqlen_new) + " tokens, more than the " +
                   to_string(layout.world_size) + " ranks of " + to_string(layout.positions_per_rank) +
                   " positions hold");
  }
  const int64_t owned = layout.owned_before(shard.rank, og + seqlen_new);
  if (owned > cache.capacity()) {
    core::fail(ErrorKind::invalid_value, "k_cache",
               "rank " + to_string(shard.rank) + "'s cache holds " + to_string(cache.capacity()) +
                   " positions per sequence; it owns " + to_string(owned) + " of batch " + to_string(b) +
                   "'s " + to_string(og + seqlen_new) + " tokens");
  }
}

}  // namespace

void attend_shard(const ShardArgs& shard, const TensorView& out_partial,
                  const TensorView& lse_partial, const RunOptions& options) {
  check_shard(shard);
  const KvCacheArgs& a = shard.call;
  const int64_t batch = a.q->shape[0], seqlen_q = a.q->shape[1], heads = a.q->shape[2];
  const int64_t headdim_v = a.v_cache->shape[a.v_cache->rank - 1];
  core::require_dtype(out_partial, "out_partial", DType::f32, "out_partial must have dtype float32");
  core::require_dtype(lse_partial, "lse_partial", DType::f32, "lse_partial must have dtype float32");
  core::require_shape(out_partial, "out_partial", {batch, seqlen_q, heads, headdim_v},
                      "out_partial must be (b, s_q, h, d_v)");
  core::require_shape(lse_partial, "lse_partial", {batch, seqlen_q, heads},
                      "lse_partial must be (b, s_q, h)");
  core::require_contiguous(out_partial, "out_partial");
  core::require_contiguous(lse_partial, "lse_partial");

  const Partial partial{out_partial.ptr<float>(), lse_partial.ptr<float>(), seqlen_q, heads, headdim_v};
  std::fill_n(partial.out, out_partial.numel(), 0.0f);
  for (int64_t row = 0; row < batch * seqlen_q; ++row) {
    for (int64_t h = 0; h < heads; ++h) {
      partial.lse[row * heads + h] = (a.sinks && shard.rank == 0)
                                         ? sink_of(a, h)
                                         : -std::numeric_limits<float>::infinity();
    }
  }

  const CacheAddress cache{a};
  const int64_t seqlen_new = a.k ? a.k->shape[1] : 0;
  std::vector<int64_t> cache_rows(static_cast<size_t>(batch));
  for (int64_t b = 0; b < batch; ++b) {  // everything checked before anything is written
    cache_rows[size_t(b)] = a.cache_batch_idx ? a.cache_batch_idx->ptr<const int32_t>()[b * a.cache_batch_idx->strides[0]] : b;
    check_lengths(shard, cache, b, seqlen_new);
  }
  // Causal is the window (-1, 0) in the contract (contract 5.4); the shifted windows are built from it.
  const int window_right = a.causal ? 0 : a.window_right;
  std::vector<std::vector<LocalRange>> ranges;
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t og = shard.global_cache_seqlens[size_t(b)];
    append_owned(shard, cache, b, cache_rows[size_t(b)], og);
    ranges.push_back(local_visible_keys(shard.layout, shard.rank, int(seqlen_q), og + seqlen_new,
                                        a.window_left, window_right, a.attention_chunk));
  }
  if (batch > 1) {
    if (const std::optional<CallSpan> span = batched_span(ranges)) {
      if (std::any_of(span->seqlen.begin(), span->seqlen.end(), [](int32_t x) { return x > 0; })) {
        run_span(shard, *span, partial, options);
      }
      return;
    }
  }
  for (int64_t b = 0; b < batch; ++b) {
    for (const ShardCall& call : calls_for_rows(ranges[size_t(b)])) {
      CallSpan span;
      span.b0 = b;
      span.cache_row = cache_rows[size_t(b)];
      span.call = call;
      run_span(shard, span, partial, options);
    }
  }
}

}  // namespace kvflash::cp
