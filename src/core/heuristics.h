// FA3's scheduling decisions (contract section 6), written from the contract's prose: window/causal
// normalisation, paged TMA, num_splits, pack_gqa (the static half of a Plan), and the per-batch
// vectors of the prepare step (dynamic splits, work order, heads in L2).
//
// kvflash always plans the way FA3 plans a varlen call (a flash_attn_with_kvcache call with
// cache_seqlens is varlen, contract section 4): the split heuristic assumes one long sequence
// when batch <= 992, and splits are chosen per sequence. A call without cache_seqlens gets the
// plan of one whose cache_seqlens are the full capacity. This keeps a Plan a function of its key
// and the per-batch lengths only.
#pragma once

#include <cstdint>
#include <vector>

#include "core/kernel_family.h"
#include "core/limits.h"
#include "core/planner.h"
#include "core/tile_size.h"
#include "kvflash/plan.h"

namespace kvflash::core {

// The PlanKey both plan_key() (a call) and get_scheduler_metadata() produce from the raw values
// they gather (page_size 0 when not paged, headdim_v already defaulted): fills the device fields
// and folds equivalent requests into one value: negative num_splits is 0 (heuristic),
// max_seqlen_k_new keeps only present (1) / absent (0), because no decision depends on its value
// and a call with packed k / v has no such argument, pack_gqa is -1, 0 or 1. Both must go through
// here so equal problems get equal keys.
PlanKey canonical_key(PlanKey raw, const DeviceInfo& info);

// Window/causal normalisation of contract 5.4 on the key's static sizes (max_seqlen_q, max_seqlen_k).
struct MaskShape {
  bool is_causal = false;
  bool is_local = false;
  // After step 5: an unbounded left side is max_seqlen_k - 1, an unbounded right side
  // max_seqlen_q - 1, both at most attention_chunk - 1 when chunked.
  int window_left = 0;
  int window_right = 0;
};
MaskShape normalise_mask(const PlanKey& key);

// Contract 6.3: how many splits fill the SMs best. size_one_kv_head in bytes.
int num_splits_heuristic(int64_t total_mblocks, int num_sms, int num_n_blocks, int num_m_blocks,
                         int64_t size_one_kv_head, bool causal_or_local, int max_splits);
// Contract 6.3: pack the query heads of a KV head into one M tile when that fills tiles better.
bool should_pack_gqa(bool varlen_q, int seqlen_q, int qheads_per_kvhead, int block_m);

TileInputs tile_inputs(const PlanKey& key, const MaskShape& mask, bool paged_non_tma);
// The family rule's inputs (core/kernel_family.h) from a key, and its family.
FamilyInputs family_inputs(const PlanKey& key);
KernelFamily family_of(const PlanKey& key);

// Contract 6.2 (only the sm90 family reads paged KV by TMA).
bool use_pagedkv_tma(const PlanKey& key, KernelFamily family, const MaskShape& mask);
// Contract 6.3, for key.num_splits <= 0 (kvflash's bound for the sm80 family, see above).
int get_num_splits(const PlanKey& key, KernelFamily family, const MaskShape& mask, TileSize tile);
// Contract 6.3; returns the pack_gqa the kernels run with (forced true outside the sm90 family, for
// non-TMA paged KV or num_splits > 1, whatever was requested).
bool get_pack_gqa(const PlanKey& key, KernelFamily family, TileSize tile, bool pagedkv_tma,
                  int num_splits);

// SMs (CPU: hardware threads) the plan may use: num_sms - sm_margin, at least 1.
int usable_sms(const PlanKey& key);
// Plans of the sm80 family (the portable CUDA kernels) and the sm90_mla kernel split by kvflash's
// rule (core/split_rule.h, counting family_ctas_per_sm slots per SM) instead of FA3's: num_splits
// is that rule's bound for the key's sizes and the per-batch splits are that rule's.
bool splits_by_portable_rule(KernelFamily family);

// A Plan with the static decisions made from `key` for the family the rule picks
// (family_of(key)), and empty per-batch vectors.
Plan static_plan(const PlanKey& key);
// The same for a given family (tests plan the sm90 family this way: the rule picks it for no
// call until its kernels land).
Plan static_plan(const PlanKey& key, KernelFamily family);

// Lengths of one sequence as the planner sees them.
struct SeqLengths {
  int seqlen_q = 0;  // query rows
  int seqlen_k = 0;  // keys attended: cache_seqlens - leftpad + new keys

  bool operator==(const SeqLengths&) const = default;
};

// Fills plan's per-batch vectors (indexed by batch element) for these lengths, one per batch
// element of plan.key. See heuristics.cpp for the split rule. The vectors are a function of the
// key, the static decisions and the lengths: each thread keeps its last result and serves a copy
// when all three are equal (a decode step plans one problem per layer; on a GPU, whose lengths
// are the static bounds, every step too).
void plan_batches(Plan& plan, const std::vector<SeqLengths>& lengths);

// The per-batch vectors of `plan` have the lengths its key needs and every value in range:
// num_splits_dynamic in [1, num_splits], num_m_blocks in [0, blocks of max_seqlen_q], batch_order
// a permutation of [0, batch), num_nheads_in_l2 in [1, scheduled heads]. Throws
// Error(invalid_value, "scheduler_metadata") naming the first bad entry.
void check_plan_vectors(const Plan& plan);

// num_m_blocks of a sequence with seqlen_q query rows under plan's tiles and packing.
int num_m_blocks(const Plan& plan, int seqlen_q);
// Heads the scheduler iterates per batch element: num_heads_k with PackGQA, else num_heads.
int scheduled_heads(const Plan& plan);

}  // namespace kvflash::core
