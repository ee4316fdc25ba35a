// resolve(): a validated KvCacheArgs into the Problem every later stage reads, and seq_info(),
// the per-sequence lengths of contract 5.1.
#include <algorithm>
#include <climits>
#include <cmath>

#include "core/heuristics.h"
#include "core/planner.h"
#include "core/problem.h"
#include "core/validate.h"

namespace kvflash::core {

namespace {

const int32_t* host_ptr(const OptTensor& t) { return t ? t->ptr<const int32_t>() : nullptr; }

// Sums and differences of caller-given int32 values, taken in 64 bits and saturated: they are
// computed before check_values() has proven the values in range, and a saturated length still
// fails its range check (int32 arithmetic here overflowed, found by fuzz/fuzz_call.cpp).
int saturate(int64_t v) { return static_cast<int>(std::clamp<int64_t>(v, INT_MIN, INT_MAX)); }
int difference(int32_t hi, int32_t lo) { return saturate(int64_t{hi} - lo); }

// The longest packed new-key run, when cu_seqlens_k_new can be read here; otherwise every
// row of k could belong to one sequence.
int packed_knew_bound(const Problem& p) {
  const TensorView& k = *p.args.k;
  if (!indices_on_host(p)) return static_cast<int>(k.size(0));
  const int32_t* cu = p.args.cu_seqlens_k_new->ptr<const int32_t>();
  int longest = 0;
  for (int b = 0; b < p.batch; ++b) longest = std::max(longest, difference(cu[b + 1], cu[b]));
  return longest;
}

float default_softmax_scale(const Problem& p) {
  const int dims = p.has_q ? p.headdim + (p.has_qv ? p.headdim_v : 0) : p.headdim_v;
  return 1.0f / std::sqrt(static_cast<float>(dims));
}

}  // namespace

bool indices_on_host(const Problem& p) { return p.device.type == DeviceType::cpu; }

HostIndices host_indices(const Problem& p) {
  const KvCacheArgs& a = p.args;
  HostIndices h;
  h.cache_seqlens = host_ptr(a.cache_seqlens);
  h.cache_batch_idx = host_ptr(a.cache_batch_idx);
  h.cache_leftpad = host_ptr(a.cache_leftpad);
  h.cu_seqlens_q = host_ptr(a.cu_seqlens_q);
  h.cu_seqlens_k_new = host_ptr(a.cu_seqlens_k_new);
  h.rotary_seqlens = host_ptr(a.rotary_seqlens);
  h.page_table = host_ptr(a.page_table);
  h.page_table_row_stride = a.page_table ? a.page_table->stride(0) : 0;
  return h;
}

Problem resolve(const KvCacheArgs& args) {
  const CallShape shape = call_shape(args);
  Problem p;
  p.args = args;
  p.device = shape.device;
  p.dtype = shape.dtype;
  p.fp8 = p.dtype == DType::e4m3;
  p.fp8_cache = shape.cache_dtype == DType::e4m3;
  p.out_dtype = p.fp8 ? DType::bf16 : p.dtype;

  p.batch = static_cast<int>(shape.batch);
  p.seqlen_q = static_cast<int>(shape.seqlen_q);
  p.total_q = static_cast<int>(shape.total_q);
  p.varlen_q = shape.varlen_q;
  p.num_heads = static_cast<int>(shape.num_heads);
  p.num_heads_k = static_cast<int>(shape.num_heads_k);
  p.group = p.num_heads / p.num_heads_k;
  p.headdim = static_cast<int>(shape.headdim);
  p.headdim_v = static_cast<int>(shape.headdim_v);

  p.paged = shape.paged;
  p.page_size = static_cast<int>(shape.page_size);
  p.max_pages_per_seq = static_cast<int>(shape.max_pages_per_seq);
  p.num_cache_rows = static_cast<int>(shape.num_cache_rows);
  p.seqlen_k = static_cast<int>(shape.seqlen_k);

  p.has_knew = args.k.has_value();
  p.knew_packed = p.has_knew && args.cu_seqlens_k_new.has_value();
  if (p.has_knew) {
    p.seqlen_knew = p.knew_packed ? packed_knew_bound(p) : static_cast<int>(args.k->size(1));
  }
  p.rotary_dim = args.rotary_cos ? static_cast<int>(2 * args.rotary_cos->size(1)) : 0;
  p.rotary_interleaved = args.rotary_interleaved;

  p.has_q = args.q.has_value();
  p.has_k = args.k_cache.has_value();
  p.has_qv = args.qv.has_value();
  p.only_qv = args.only_qv;
  p.has_sinks = args.sinks.has_value();

  p.softmax_scale = args.softmax_scale ? *args.softmax_scale : default_softmax_scale(p);
  // softcap * tanh(s / softcap) tends to s as softcap grows: infinity is no cap (spec 5.3's
  // formula would give inf * 0 = NaN).
  p.softcap = std::isinf(args.softcap) ? 0.0f : args.softcap;
  p.window_left = args.window_left;
  p.window_right = args.causal ? 0 : args.window_right;
  p.attention_chunk = args.attention_chunk;

  p.key = plan_key(p, device_info(p.device));
  // The planner's normalisation (contract 5.4) is the one definition of the flags.
  const MaskShape mask = normalise_mask(p.key);
  p.is_causal = mask.is_causal;
  p.is_local = mask.is_local;
  p.rotate_q_per_row = p.is_causal || p.is_local;
  return p;
}

SeqInfo seq_info(const Problem& p, const HostIndices& h, int b) {
  SeqInfo s;
  if (h.cu_seqlens_q) {
    s.q_offset = h.cu_seqlens_q[b];
    s.seqlen_q = difference(h.cu_seqlens_q[b + 1], h.cu_seqlens_q[b]);
  } else {
    s.q_offset = saturate(int64_t{b} * p.seqlen_q);
    s.seqlen_q = p.seqlen_q;
  }
  s.leftpad = h.cache_leftpad ? h.cache_leftpad[b] : 0;
  if (h.cache_seqlens) {
    s.cache_seqlen = h.cache_seqlens[b];
  } else {
    s.cache_seqlen = p.args.cache_seqlens_value.value_or(p.seqlen_k);
  }
  s.seqlen_k_og = difference(s.cache_seqlen, s.leftpad);
  if (p.has_knew) {
    if (p.knew_packed) {
      s.knew_offset = h.cu_seqlens_k_new[b];
      s.seqlen_knew = difference(h.cu_seqlens_k_new[b + 1], h.cu_seqlens_k_new[b]);
    } else {
      s.knew_offset = saturate(int64_t{b} * p.seqlen_knew);
      s.seqlen_knew = p.seqlen_knew;
    }
  }
  s.seqlen_k = saturate(int64_t{s.seqlen_k_og} + s.seqlen_knew);
  // rotary_seqlens is read only when rotary is on: otherwise its (unbounded) entries would feed
  // position arithmetic that is never used (rotary_start + t could overflow).
  s.rotary_start = h.rotary_seqlens && p.rotary_dim > 0 ? h.rotary_seqlens[b] : s.cache_seqlen;
  s.cache_row = h.cache_batch_idx ? h.cache_batch_idx[b] : b;
  return s;
}

SeqInfo seq_info(const Problem& p, int b) { return seq_info(p, host_indices(p), b); }

}  // namespace kvflash::core
