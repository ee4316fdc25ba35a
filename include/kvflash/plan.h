// Plan: typed scheduler metadata. It records the problem it was made for (PlanKey), the static
// decisions (tile sizes, num_splits, pack_gqa) and the per-batch vectors of FA3's layout.
// It serialises to FA3's int32 layout (contract section 6.4) and back. Using a Plan with a call whose
// problem differs is an Error naming the first field that differs.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kvflash/kernel_family.h"
#include "kvflash/tensor.h"

namespace kvflash {

// What the heuristics depend on: everything that changes the plan. Values are the ones given by
// the caller (before window/causal normalisation), so two calls with equal keys get equal plans.
struct PlanKey {
  int batch = 0;
  int max_seqlen_q = 0;
  int max_seqlen_k = 0;      // static cache capacity s_k (dense s_k or pages_per_seq * page_size)
  int num_heads = 0;
  int num_heads_k = 0;
  int headdim = 0;
  int headdim_v = 0;
  DType dtype = DType::bf16;  // the KV cache's: e4m3 for an fp8 cache, also under a 16-bit q
  bool fp8_query = false;    // q itself e4m3 (FA3's all-fp8 call), which dtype alone cannot tell
  int page_size = 0;         // 0: not paged
  int max_seqlen_k_new = 0;  // 0: no new K/V appended (the planner keeps only 0 / 1)
  bool varlen_q = false;     // cu_seqlens_q given
  bool has_leftpad = false;
  bool causal = false;
  int window_left = -1;
  int window_right = -1;
  int attention_chunk = 0;
  bool has_softcap = false;
  bool has_qv = false;
  int num_splits = 0;        // as requested (0: heuristic)
  int pack_gqa = -1;         // as requested: -1 heuristic, 0 false, 1 true
  int sm_margin = 0;
  int num_sms = 0;           // of the device the plan targets (before sm_margin)
  int arch = 0;              // 0: CPU, else the device's compute capability x 10 (80, 90, ...)
  bool batch_invariant = false;  // fixed key blocks per split (KvCacheArgs::batch_invariant)

  bool operator==(const PlanKey&) const = default;
};

// The name of the first field in which a and b differ ("" when equal), with both values,
// e.g. "max_seqlen_k (plan made for 4096, call has 8192)".
std::string first_difference(const PlanKey& plan_key, const PlanKey& call_key);

struct Plan {
  PlanKey key;
  // Static decisions.
  KernelChoice kernel;  // family, kernel shape and instantiation (core/kernel_family.h)
  int block_m = 0;
  int block_n = 0;
  int num_splits = 1;   // upper bound of the per-batch splits; out_accum has this many
  bool pack_gqa = false;
  bool is_causal = false;  // after normalisation (contract 5.4)
  bool is_local = false;
  // Per batch element (length key.batch), indexed by batch element. (FA3's int32 layout stores
  // them by sorted position when batch_order is present; to_fa3 / from_fa3 convert.)
  std::vector<int32_t> num_splits_dynamic;  // in [1, num_splits]
  std::vector<int32_t> num_m_blocks;
  std::vector<int32_t> batch_order;         // sorted order -> batch index; present iff !is_local
  std::vector<int32_t> num_nheads_in_l2;    // present iff is_causal || is_local
  bool has_semaphore = false;

  // FA3's int32 layout: b_r = round_up(batch, 4);
  // [num_splits_dynamic | num_m_blocks | batch_order? | num_nheads_in_l2? | semaphore?].
  size_t fa3_size() const;
  std::vector<int32_t> to_fa3() const;
  // Rebuilds a Plan for `key` from FA3's layout; the static decisions are recomputed from the
  // key, the vectors read back. Throws Error if the length or any value is out of range.
  static Plan from_fa3(const int32_t* data, size_t size, const PlanKey& key);
};

}  // namespace kvflash
