// kvflash::get_scheduler_metadata: FA3's get_scheduler_metadata (contract 6.5) as a typed Plan.
//
// It builds the PlanKey the later flash_attn_with_kvcache call will build (both go through
// core::canonical_key), so the call accepts the Plan exactly when the arguments that shape the
// plan agree. As upstream: page_size given means paged, max_seqlen_k_new > 0 means new K/V,
// has_softcap means softcap > 0, headdim_v defaults to headdim. max_seqlen_k must be the call's
// cache capacity (k_cache.shape[1], or pages per sequence * page_size when paged).
//
// Lengths are read on the host (CPU tensors); without cache_seqlens every sequence has
// max_seqlen_k cached keys. cu_seqlens_k_new counts only when max_seqlen_k_new > 0: without new
// K/V the call attends no new keys, so upstream's use of it there (contract 8.4) would plan for
// longer sequences than the call has.
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "core/heuristics.h"
#include "core/planner.h"
#include "core/validate.h"
#include "kvflash/errors.h"
#include "kvflash/kvflash.h"

namespace kvflash {
namespace {

[[noreturn]] void bad_value(const std::string& argument, const std::string& message) {
  throw Error(ErrorKind::invalid_value, argument, message);
}

std::string at(const char* name, int64_t i) {
  return std::string(name) + "[" + std::to_string(i) + "]";
}

void check_at_least(const char* name, int64_t value, int64_t minimum) {
  if (value < minimum) {
    bad_value(name, std::string(name) + " must be >= " + std::to_string(minimum) + ", got " +
                        std::to_string(value));
  }
}

void check_at_most(const char* name, int64_t value, int64_t maximum, const char* why) {
  if (value > maximum) {
    bad_value(name, std::string(name) + " must be <= " + std::to_string(maximum) + " (" + why +
                        "), got " + std::to_string(value));
  }
}

void check_scalars(const SchedulerArgs& a) {
  const bool accepted_dtype = a.qkv_dtype == DType::f16 || a.qkv_dtype == DType::bf16 ||
                              a.qkv_dtype == DType::e4m3 ||
                              (a.qkv_dtype == DType::f32 && a.device.type == DeviceType::cpu);
  if (!accepted_dtype) {
    throw Error(ErrorKind::invalid_type, "qkv_dtype",
                "FlashAttention only supports fp16, bf16, and fp8_e4m3 data type");
  }
  check_at_least("batch_size", a.batch_size, 0);
  check_at_least("max_seqlen_q", a.max_seqlen_q, 0);
  check_at_least("max_seqlen_k", a.max_seqlen_k, 0);
  check_at_least("num_heads_q", a.num_heads_q, 1);
  check_at_least("num_heads_kv", a.num_heads_kv, 1);
  check_at_least("headdim", a.headdim, 0);
  if (a.headdim_v) check_at_least("headdim_v", *a.headdim_v, 1);
  // The call's limits, so a plan is never made for a call that would be refused (and a batch
  // of 2^30 allocates nothing).
  check_at_most("batch_size", a.batch_size, core::kMaxBatch, "kvflash's sequences per call");
  check_at_most("headdim", a.headdim, core::kMaxHeaddim, "FlashAttention's largest head dimension");
  if (a.headdim_v) {
    check_at_most("headdim_v", *a.headdim_v, core::kMaxHeaddimV,
                  "FlashAttention's largest value head dimension");
  }
  if (a.page_size) check_at_least("page_size", *a.page_size, 1);
  check_at_least("max_seqlen_k_new", a.max_seqlen_k_new, 0);
  check_at_least("sm_margin", a.sm_margin, 0);
  if (a.num_heads_q % a.num_heads_kv != 0) {
    bad_value("num_heads_kv", "Number of heads in key/value must divide number of heads in query");
  }
  if (a.num_splits > core::kMaxSplits) bad_value("num_splits", "num_splits > 256 not supported");
}

// A (length,) int32 tensor read on the host (any stride).
std::vector<int32_t> read_host_int32(const TensorView& t, const char* name, int64_t length) {
  if (t.dtype != DType::i32) {
    throw Error(ErrorKind::invalid_type, name,
                std::string(name) + " must have dtype int32, got " + dtype_name(t.dtype));
  }
  if (t.device.type != DeviceType::cpu) {
    throw Error(ErrorKind::unsupported, name,
                std::string(name) + " must be a CPU tensor: get_scheduler_metadata reads it on the "
                                    "host (got " + device_name(t.device) + ")");
  }
  if (t.rank != 1 || t.shape[0] != length) {
    const std::string got =
        t.rank == 1 ? "(" + std::to_string(t.shape[0]) + ")" : t.shape_string();
    bad_value(name, std::string(name) + " must have shape (" + std::to_string(length) + "), got " +
                        got);
  }
  std::vector<int32_t> values(static_cast<size_t>(length));
  const int32_t* data = t.ptr<const int32_t>();
  for (int64_t i = 0; i < length; ++i) values[i] = data[i * t.strides[0]];
  return values;
}

// Per-sequence lengths from prefix sums (b + 1 entries), each in [0, max_length].
std::vector<int> lengths_from_prefix_sums(const TensorView& t, const char* name, int batch,
                                          const char* max_name, int max_length) {
  const std::vector<int32_t> cu = read_host_int32(t, name, int64_t{batch} + 1);
  std::vector<int> lengths(static_cast<size_t>(batch));
  for (int b = 0; b < batch; ++b) {
    const int64_t length = int64_t{cu[b + 1]} - cu[b];
    if (length < 0) {
      bad_value(name, std::string(name) + " must be non-decreasing, but " + at(name, b + 1) +
                          " (" + std::to_string(cu[b + 1]) + ") < " + at(name, b) + " (" +
                          std::to_string(cu[b]) + ")");
    }
    if (length > max_length) {
      bad_value(name, "sequence " + std::to_string(b) + " of " + name + " has " +
                          std::to_string(length) + " rows, more than " + max_name + " (" +
                          std::to_string(max_length) + ")");
    }
    lengths[b] = static_cast<int>(length);
  }
  return lengths;
}

// Contract 5.1 over the arguments get_scheduler_metadata has.
std::vector<core::SeqLengths> sequence_lengths(const SchedulerArgs& a) {
  const int batch = a.batch_size;
  std::vector<int> q_rows(batch, a.max_seqlen_q);
  if (a.cu_seqlens_q) {
    q_rows = lengths_from_prefix_sums(*a.cu_seqlens_q, "cu_seqlens_q", batch, "max_seqlen_q",
                                      a.max_seqlen_q);
  }
  std::vector<int32_t> cache(batch, a.max_seqlen_k);
  if (a.cache_seqlens) cache = read_host_int32(*a.cache_seqlens, "cache_seqlens", batch);
  std::vector<int32_t> leftpad(batch, 0);
  if (a.cache_leftpad) leftpad = read_host_int32(*a.cache_leftpad, "cache_leftpad", batch);
  std::vector<int> new_keys(batch, a.max_seqlen_k_new);
  if (a.max_seqlen_k_new > 0 && a.cu_seqlens_k_new) {
    new_keys = lengths_from_prefix_sums(*a.cu_seqlens_k_new, "cu_seqlens_k_new", batch,
                                        "max_seqlen_k_new", a.max_seqlen_k_new);
  }
  std::vector<core::SeqLengths> lengths(batch);
  for (int b = 0; b < batch; ++b) {
    if (cache[b] < 0) {
      bad_value("cache_seqlens", at("cache_seqlens", b) + " is " + std::to_string(cache[b]) +
                                     ", expected >= 0");
    }
    if (leftpad[b] < 0 || leftpad[b] > cache[b]) {
      bad_value("cache_leftpad", at("cache_leftpad", b) + " is " + std::to_string(leftpad[b]) +
                                     ", expected a value in [0, cache_seqlens[" +
                                     std::to_string(b) + "] = " + std::to_string(cache[b]) + "]");
    }
    // In 64 bits: cache_seqlens near 2^31 plus new keys overflowed (fuzz/fuzz_plan.cpp).
    const int64_t end = int64_t{cache[b]} + new_keys[b];
    if (a.cache_seqlens && end > a.max_seqlen_k) {
      bad_value("cache_seqlens",
                at("cache_seqlens", b) + " + new keys = " + std::to_string(end) +
                    " exceeds max_seqlen_k = " + std::to_string(a.max_seqlen_k) +
                    " (the cache capacity)");
    }
    lengths[b] = {q_rows[b], static_cast<int>(std::min<int64_t>(end - leftpad[b], INT32_MAX))};
  }
  return lengths;
}

PlanKey scheduler_key(const SchedulerArgs& a) {
  PlanKey raw;
  raw.batch = a.batch_size;
  raw.max_seqlen_q = a.max_seqlen_q;
  raw.max_seqlen_k = a.max_seqlen_k;
  raw.num_heads = a.num_heads_q;
  raw.num_heads_k = a.num_heads_kv;
  raw.headdim = a.headdim;
  raw.headdim_v = a.headdim_v.value_or(a.headdim);
  raw.dtype = a.qkv_dtype;
  // FA3's one qkv_dtype: e4m3 plans the all-fp8 call (a 16-bit query over an fp8 cache has
  // fp8_query false: contract 6.5).
  raw.fp8_query = a.qkv_dtype == DType::e4m3;
  raw.page_size = a.page_size.value_or(0);
  raw.max_seqlen_k_new = a.max_seqlen_k_new;
  raw.varlen_q = a.cu_seqlens_q.has_value();
  raw.has_leftpad = a.cache_leftpad.has_value();
  raw.causal = a.causal;
  raw.window_left = a.window_left;
  raw.window_right = a.window_right;
  raw.attention_chunk = a.attention_chunk;
  raw.has_softcap = a.has_softcap;
  raw.has_qv = a.has_qv;
  raw.num_splits = a.num_splits;
  raw.pack_gqa = a.pack_gqa ? (*a.pack_gqa ? 1 : 0) : -1;
  raw.sm_margin = a.sm_margin;
  raw.batch_invariant = a.batch_invariant;
  return core::canonical_key(raw, core::device_info(a.device));
}

}  // namespace

Plan get_scheduler_metadata(const SchedulerArgs& args) {
  check_scalars(args);
  const std::vector<core::SeqLengths> lengths = sequence_lengths(args);
  Plan plan = core::static_plan(scheduler_key(args));
  core::plan_batches(plan, lengths);
  return plan;
}

}  // namespace kvflash
