// Plain-data parameter blocks the CUDA kernels take (plain host C++ fills them from a resolved
// Problem and its Plan: cuda/host/call_params.cpp). Every length or index read from device memory
// is clamped or skipped on the device (lengths.cuh), so no value, however wrong, makes a kernel
// touch memory outside its tensors.
#pragma once

#include <cstdint>

#include "core/fast_divisor.h"

namespace kvflash::cuda {

// An optional int32 vector in device memory (nullptr: absent).
struct IntVec {
  const int32_t* data = nullptr;
  int64_t stride = 1;
};

// Everything needed to derive one sequence's lengths (contract 5.1) on the device.
struct LengthParams {
  int batch = 0;
  int seqlen_q = 0;        // static s_q (dense) / max_seqlen_q (varlen)
  int total_q = 0;         // rows of q
  IntVec cu_seqlens_q;
  IntVec cache_seqlens;
  int cache_seqlens_value = -1;  // one value for every sequence (-1: none)
  IntVec cache_leftpad;
  IntVec cache_batch_idx;
  int num_cache_seqs = 0;  // rows a cache_batch_idx may name (b_k dense, page_table rows paged)
  int capacity = 0;        // keys one cache sequence holds (s_k, or pages_per_seq * page_size)
  bool has_knew = false;
  IntVec cu_seqlens_k_new;
  int seqlen_knew = 0;     // static s_new (dense k)
  int total_knew = 0;      // rows of k (packed) or b * s_new
  IntVec rotary_seqlens;
};

// Where key position p (absolute, leftpad included) of cache sequence `row` lives.
struct CacheParams {
  void* k = nullptr;
  void* v = nullptr;
  int64_t k_row_stride = 0, k_pos_stride = 0, k_head_stride = 0;  // row: batch row or page
  int64_t v_row_stride = 0, v_pos_stride = 0, v_head_stride = 0;
  bool paged = false;
  core::FastDivisor page_size;  // keys per page (.divisor) and its fast division (.div)
  int num_pages = 0;       // k_cache.shape[0] when paged
  const int32_t* page_table = nullptr;
  int64_t page_table_row_stride = 0, page_table_col_stride = 1;
  int pages_per_seq = 0;
};

// An fp8 tensor's descale, (b, h_k) fp32 (data nullptr: 1; contract 5.8).
struct DescaleView {
  const float* data = nullptr;
  int64_t batch_stride = 0, head_stride = 0;
};

// A strided (batch, token, head) row space over a [.., d] tensor; varlen tensors use batch
// stride 0 and absolute token indices.
struct RowLayout {
  void* data = nullptr;
  int64_t batch_stride = 0, token_stride = 0, head_stride = 0;
};

// What kvflash's portable split rule (core/split_rule.h) needs besides the lengths.
struct SplitRule {
  int block_m = 64, block_n = 64;  // the plan's tiles
  int group = 1;                   // packed query heads per KV head (1 when not packed)
  int heads = 1;                   // heads the scheduler iterates (h_k with PackGQA)
  int num_sms = 1;                 // usable SMs
  int ctas_per_sm = 3;             // the family's CTA slots per SM (core::family_ctas_per_sm)
  bool batch_invariant = false;    // core::batch_invariant_splits: each sequence alone
};

// One (sequence, split) column of the split-KV grid, written by the prepare kernel: grid z
// index -> batch element, split and that element's split count (batch -1: an unused column).
struct alignas(8) SplitWork {
  int32_t batch = -1;
  int16_t split = 0;
  int16_t num_splits = 1;
};

struct AttentionParams {
  LengthParams len;
  CacheParams cache;
  RowLayout q;             // q, or its copy in the workspace (unread when headdim is 0)
  RowLayout qv;            // qv or its copy, d_v wide: scores add qv.v (data nullptr: no qv)
  RowLayout out;
  float* lse = nullptr;    // softmax_lse or nullptr
  int64_t lse_batch_stride = 0, lse_head_stride = 0, lse_token_stride = 0;
  // Split partials (num_splits > 1): fp32, same (batch, token, head) addressing plus a split stride.
  float* out_partial = nullptr;
  int64_t op_split_stride = 0, op_batch_stride = 0, op_token_stride = 0, op_head_stride = 0;
  float* lse_partial = nullptr;
  int64_t lp_split_stride = 0, lp_batch_stride = 0, lp_token_stride = 0, lp_head_stride = 0;

  int num_heads = 0, num_heads_k = 0, group = 1;
  // Actual (the kernels' are rounded up). headdim 0: no q.k term (only_qv), q and K are not read.
  int headdim = 0, headdim_v = 0;
  float softmax_scale = 1.0f;
  float softcap = 0.0f;
  int window_left = -1, window_right = -1, attention_chunk = 0;
  const float* sinks_f32 = nullptr;       // one of the two, or neither
  const uint16_t* sinks_bf16 = nullptr;
  int64_t sinks_stride = 1;
  // fp8 (contract 5.8), set only on the fp8 instantiations' calls: q.k scores take q_descale (an
  // fp8 q's) times k_descale, the output v_descale. With qv the score descales are absent (1): q
  // and qv come scaled (cuda/host/call_params.cpp scales_queries).
  DescaleView q_descale, k_descale, v_descale;
  int num_splits = 1;                     // plan's upper bound
  const int32_t* splits_per_batch = nullptr;  // device, per batch element (nullptr: num_splits)
  // Split columns (grid z) from the prepare kernel: only the splits the lengths need are
  // launched. nullptr: batch * num_splits columns, z = b * num_splits + split.
  const SplitWork* split_work = nullptr;
  int num_split_work = 0;
  // A batch of one without a prepare kernel: every CTA computes its sequence's splits by `rule`.
  bool splits_alone = false;
  SplitRule rule;
  // The combine reads only each element's used splits: an element with one split writes out
  // and LSE itself (the combine skips its rows), splits past an element's count write nothing.
  // Otherwise, with num_splits > 1, every split of every element writes its partial.
  bool single_split_writes_out = false;
  int split_block_n = 64;                 // plan.block_n: split boundaries (core::split_keys)
};

// Rotary embedding tables (docs/contract.md section 5.2): cos / sin (rows, dim / 2) of the
// query's dtype; channels at or past dim pass through (dim 0: no rotary).
struct RotaryParams {
  const void* cos = nullptr;
  const void* sin = nullptr;
  int64_t row_stride = 0, col_stride = 1;
  int rows = 0;
  int dim = 0;
  bool interleaved = true;
};

// Appending new K/V (with rotary on K) into the cache.
struct AppendParams {
  LengthParams len;
  CacheParams cache;
  RowLayout k_new, v_new;  // token index: absolute row of packed k, or position in dense k
  int num_heads_k = 0, headdim = 0, headdim_v = 0;
  RotaryParams rotary;
  // A 16-bit row into an fp8 cache is divided by these (contract 5.8's quantisation rule).
  DescaleView k_descale, v_descale;
};

// A query tensor (q, or qv) copied into the workspace, where the attention reads it instead:
// rotated (q with rotary), converted (an fp8 q the kernel reads in 16 bits) and / or scaled by
// a per-(batch element, KV head) factor (q by k_descale and qv by v_descale with qv over an fp8
// cache: one score scale in the kernels cannot hold both, contract 5.8).
struct QueryCopyParams {
  LengthParams len;
  RowLayout src;
  RowLayout dst;      // workspace, dense (total, h, dim) or (b, s_q, h, dim): src's type, or bf16
                      // for an fp8 q the kernel reads in 16 bits (host/call_params.h reads_fp8_query)
  int num_heads = 0, headdim = 0;  // headdim: the rows' width (d_v for qv)
  int group = 1;      // query heads per KV head: head h takes scale[b, h / group]
  RotaryParams rotary;  // dim 0: not rotated (qv never is)
  bool per_row = false;  // causal / local: row i at start + i
  DescaleView scale;  // data nullptr: not scaled
};

// Merging split partials: rows addressed as (a, b, c) with per-tensor strides.
struct CombineParams {
  const float* out_partial = nullptr;
  int64_t op_split = 0, op_a = 0, op_b = 0, op_c = 0;
  const float* lse_partial = nullptr;
  int64_t lp_split = 0, lp_a = 0, lp_b = 0, lp_c = 0;
  void* out = nullptr;
  int64_t o_a = 0, o_b = 0, o_c = 0;
  float* lse = nullptr;
  int64_t l_a = 0, l_b = 0, l_c = 0;
  int dim_a = 1, dim_b = 1, dim_c = 1;  // row space
  int num_splits = 1;
  int headdim_v = 0;
  // After attention: a is the batch element, whose split count this holds (rows of an element
  // with one split were written by the attention kernel and are skipped), b the query index in
  // it (varlen: rows past its seqlen_q are skipped, the token is its q_offset + b).
  const int32_t* splits_per_batch = nullptr;
  LengthParams len;
  bool splits_alone = false;  // as AttentionParams::splits_alone: counts from `rule` instead
  SplitRule rule;
};

enum class ElemType { f16, bf16, f32 };

// The prepare kernel: per-batch split counts on the device (kvflash's portable rule,
// core/split_rule.h) and the split columns of the attention grid.
struct PrepareParams {
  LengthParams len;
  int num_splits = 1;     // static upper bound
  SplitRule rule;
  int32_t* splits_out = nullptr;  // (batch,)
  SplitWork* work_out = nullptr;  // (num_work,): every split of every element, then unused;
  int num_work = 0;               // core::portable_split_columns (nullptr / 0: none wanted)
};

}  // namespace kvflash::cuda

namespace kvflash::cuda {

// The attention grid of every family: one CTA per rows_per_cta packed query rows x KV head x
// (sequence, split) column. The launchers and the host's pre-launch check (cuda/host) both use it.
struct AttentionGrid {
  int64_t x = 0, y = 0, z = 0;
};
inline AttentionGrid attention_grid(const AttentionParams& p, int rows_per_cta) {
  const int64_t packed_max = int64_t(p.len.seqlen_q) * p.group;
  const int64_t columns = p.split_work ? p.num_split_work : int64_t(p.len.batch) * p.num_splits;
  return AttentionGrid{(packed_max + rows_per_cta - 1) / rows_per_cta, p.num_heads_k, columns};
}

}  // namespace kvflash::cuda
