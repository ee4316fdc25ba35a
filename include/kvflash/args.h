// The arguments and outputs of flash_attn_with_kvcache: every argument of FA3's Python function
// (same names, same meaning, see docs/contract.md section 3), plus sinks, only_qv and
// a caller-provided out. Tensors are non-owning views; absent optional tensors are nullopt.
#pragma once

#include <optional>

#include "kvflash/tensor.h"

namespace kvflash {

struct Plan;

struct KvCacheArgs {
  // q: (b, s_q, h, d) or (total_q, h, d) with cu_seqlens_q. Absent only with only_qv.
  OptTensor q;
  // k_cache: (b_k, s_k, h_k, d) dense or (num_pages, page_size, h_k, d) with page_table.
  // Absent only with only_qv. v_cache: same with d_v; always required.
  OptTensor k_cache;
  OptTensor v_cache;
  // New tokens appended in place at cache_seqlens[b]: (b, s_new, h_k, d|d_v) or packed
  // (total_k_new, h_k, d|d_v) with cu_seqlens_k_new.
  OptTensor k;
  OptTensor v;
  // qv: (b, s_q, h, d_v) or (total_q, h, d_v); adds qv·v to the scores (MLA absorbed query).
  OptTensor qv;
  // rotary_cos / rotary_sin: (seqlen_ro, rotary_dim / 2), q's dtype.
  OptTensor rotary_cos;
  OptTensor rotary_sin;
  // cache_seqlens: an int32 (b,) tensor, or one int for every sequence (expanded to the batch
  // size, not to k_cache.shape[0] as sgl-kernel does), or neither (full capacity).
  OptTensor cache_seqlens;
  std::optional<int> cache_seqlens_value;
  OptTensor cache_batch_idx;  // (b,) int32: cache row of each batch element
  OptTensor cache_leftpad;    // (b,) int32: first valid cache row
  OptTensor page_table;       // (b_k, max_num_pages_per_seq) int32
  OptTensor cu_seqlens_q;     // (b + 1,) int32; needs max_seqlen_q
  OptTensor cu_seqlens_k_new; // (b + 1,) int32; packs k / v
  std::optional<int> max_seqlen_q;
  OptTensor rotary_seqlens;   // (b,) int32: rotary start position (default cache_seqlens)
  OptTensor q_descale;        // (b, h_k) float32, fp8 only
  OptTensor k_descale;
  OptTensor v_descale;
  std::optional<float> softmax_scale;  // default (d + d_v if qv else d) ** -0.5
  bool causal = false;
  int window_left = -1;   // window_size[0]
  int window_right = -1;  // window_size[1]
  int attention_chunk = 0;
  float softcap = 0.0f;
  bool rotary_interleaved = true;
  // Scheduler metadata: a typed Plan (checked against this call's problem field by field), or
  // FA3's int32 layout as a tensor (checked for length and for agreement with this call's lengths).
  const Plan* plan = nullptr;
  OptTensor scheduler_metadata;
  int num_splits = 0;  // 0 or negative: heuristic; 1: no split; >1: upper bound (<= 256)
  std::optional<bool> pack_gqa;
  int sm_margin = 0;
  OptTensor sinks;     // (h,) float32 or bfloat16: per-head sink logit
  bool only_qv = false;  // scores use qv·v only; q and k_cache may be absent
  // Checked mode (also KVFLASH_CHECK=1): device-resident indices and lengths are copied to the
  // host and validated before the kernels run; the first bad entry is reported by name.
  bool checked = false;
  // Batch-invariant mode (not in FA3): every sequence is split by a fixed number of key blocks
  // (core/split_rule.h), so its output and LSE are bitwise the same whatever else is in the
  // batch. The default splits by the whole batch's work (faster), which changes a sequence's bits
  // with its neighbours' lengths.
  bool batch_invariant = false;
};

// Outputs, all caller-provided. out is required: (b, s_q, h, d_v) or (total_q, h, d_v), q's dtype
// (bf16 for fp8 input). softmax_lse: float32 (b, h, s_q) or (h, total_q). When given,
// out_accum (num_splits, b, h, s_q, d_v) | (num_splits, h, total_q, d_v) and softmax_lse_accum
// (num_splits, b, h, s_q) | (num_splits, h, total_q) receive the split-KV partials (FA3's shapes);
// otherwise partials live in the workspace. Use output_spec() to learn the shapes.
struct Outputs {
  TensorView out;
  OptTensor softmax_lse;
  OptTensor out_accum;
  OptTensor softmax_lse_accum;
};

// Shapes and dtypes the outputs must have for a given call (and Plan).
struct TensorSpec {
  DType dtype = DType::f32;
  int rank = 0;
  int64_t shape[kMaxRank] = {};
  int64_t numel() const;
};

struct OutputSpec {
  TensorSpec out;
  TensorSpec softmax_lse;
  TensorSpec out_accum;          // rank 0 (empty) when num_splits == 1
  TensorSpec softmax_lse_accum;  // rank 0 (empty) when num_splits == 1
  int num_splits = 1;
};

}  // namespace kvflash
