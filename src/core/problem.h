// Problem: the resolved form of a validated KvCacheArgs, the single source of truth the
// planner and the backends read. resolve() assumes validate() has passed.
#pragma once

#include "kvflash/args.h"
#include "kvflash/plan.h"

namespace kvflash::core {

struct Problem {
  KvCacheArgs args;       // the caller's views (absent tensors are nullopt)
  Device device{};
  DType dtype = DType::bf16;      // of q (qv's when q is absent); the caches' unless fp8_cache
  DType out_dtype = DType::bf16;  // q's (or qv's) dtype, bf16 for fp8 input

  int batch = 0;
  int seqlen_q = 0;        // static s_q (max_seqlen_q when varlen)
  int total_q = 0;         // rows of q / out (b * s_q when dense)
  bool varlen_q = false;
  int num_heads = 0;
  int num_heads_k = 0;
  int group = 1;           // num_heads / num_heads_k
  int headdim = 0;         // d of q / k (0 when only_qv without q)
  int headdim_v = 0;

  bool paged = false;
  int page_size = 1;       // 1 when not paged
  int max_pages_per_seq = 0;
  int num_cache_rows = 0;  // k_cache.shape[0]: b_k dense, num_pages paged
  int seqlen_k = 0;        // static capacity s_k of one sequence

  bool has_knew = false;
  bool knew_packed = false;  // cu_seqlens_k_new given
  int seqlen_knew = 0;       // static s_new (dense k) or max over batch (packed, host-known)
  int rotary_dim = 0;        // 0: no rotary
  bool rotary_interleaved = true;

  bool has_q = true;       // false with only_qv and q absent
  bool has_k = true;       // false with only_qv and k_cache absent
  bool has_qv = false;
  bool only_qv = false;
  bool fp8 = false;        // q (and the cache) float8_e4m3fn: FA3's fp8 call
  bool fp8_cache = false;  // k_cache / v_cache float8_e4m3fn, under an fp8 or a 16-bit q
  bool has_sinks = false;

  float softmax_scale = 0.0f;
  float softcap = 0.0f;    // 0: off
  // Mask, as given after causal is folded in (window_right = 0); -1 = unbounded side.
  int window_left = -1;
  int window_right = -1;
  int attention_chunk = 0;
  // Normalised flags (contract 5.4): they choose kernels and plans, never change results.
  bool is_causal = false;
  bool is_local = false;
  bool rotate_q_per_row = false;  // causal or local: query row i at rotary start + i

  PlanKey key;             // this call's plan key
};

Problem resolve(const KvCacheArgs& args);

// Per-sequence lengths (contract 5.1), read from host-visible tensors.
struct SeqInfo {
  int q_offset = 0;      // first row of this sequence in q / out (packed or b * s_q)
  int seqlen_q = 0;
  int leftpad = 0;
  int cache_seqlen = 0;  // cache_seqlens[b] (includes leftpad)
  int seqlen_k_og = 0;   // cache_seqlen - leftpad
  int knew_offset = 0;   // first row of this sequence in k / v
  int seqlen_knew = 0;
  int seqlen_k = 0;      // keys attended: seqlen_k_og + seqlen_knew
  int rotary_start = 0;  // rotary_seqlens[b] or cache_seqlen
  int cache_row = 0;     // cache_batch_idx[b] or b (page_table row when paged)
};

SeqInfo seq_info(const Problem& p, int b);

}  // namespace kvflash::core
