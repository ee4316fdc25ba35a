#include "core/heuristics.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <string>

#include "core/env_switch.h"
#include "core/split_rule.h"
#include "core/validate.h"
#include "kvflash/errors.h"

namespace kvflash::core {
namespace {

int group_size(const PlanKey& key) {
  return key.num_heads_k > 0 ? key.num_heads / key.num_heads_k : 1;
}

// Bytes per K/V element as the L2 estimates count them.
int kv_elem_bytes(const PlanKey& key) { return static_cast<int>(dtype_size(key.dtype)); }

// FA3's L2 model: a KV head larger than this is worth splitting even when the SMs are full.
constexpr int64_t kL2BytesForSplits = 50ll * 1024 * 1024;
// ... and the (deliberately small) L2 assumed when counting KV heads that stay resident.
constexpr int64_t kL2BytesForHeads = 8ll * 1024 * 1024;

}  // namespace

PlanKey canonical_key(PlanKey raw, const DeviceInfo& info) {
  raw.num_sms = info.num_sms;
  raw.arch = info.arch;
  raw.num_splits = std::max(raw.num_splits, 0);
  raw.max_seqlen_k_new = raw.max_seqlen_k_new > 0 ? 1 : 0;
  raw.pack_gqa = raw.pack_gqa < 0 ? -1 : (raw.pack_gqa > 0 ? 1 : 0);
  return raw;
}

MaskShape normalise_mask(const PlanKey& key) {
  const int s_q = key.max_seqlen_q;
  const int s_k = key.max_seqlen_k;
  int left = key.window_left;
  int right = key.window_right;
  bool causal = key.causal;
  // A window covering the whole static extent is no window.
  if (left >= s_k - 1) left = -1;
  if (right >= s_q - 1) right = -1;
  // One query row sees every key under causal too; FA3 keeps causal only where it picks a better
  // tile (64 < d <= 128 with paged KV). Results do not change, the plan's layout does.
  if (s_q == 1 && left < 0 && right < 0 && key.attention_chunk == 0) {
    const bool keeps_causal_tile = key.headdim > 64 && key.headdim <= 128 && key.page_size > 0;
    if (!keeps_causal_tile) causal = false;
  }
  if (causal) right = 0;

  MaskShape mask;
  mask.is_causal = left < 0 && right == 0 && key.attention_chunk == 0;
  mask.is_local = (left >= 0 || right >= 0 || key.attention_chunk >= 1) && !mask.is_causal;
  if (left < 0) left = s_k - 1;
  if (right < 0) right = s_q - 1;
  if (key.attention_chunk > 0) {
    left = std::min(left, key.attention_chunk - 1);
    right = std::min(right, key.attention_chunk - 1);
  }
  mask.window_left = left;
  mask.window_right = right;
  return mask;
}

// Float arithmetic as upstream, so the chosen split counts agree with FA3's at the thresholds.
int num_splits_heuristic(int64_t total_mblocks, int num_sms, int num_n_blocks, int num_m_blocks,
                         int64_t size_one_kv_head, bool causal_or_local, int max_splits) {
  if (static_cast<float>(total_mblocks) >= 0.8f * static_cast<float>(num_sms)) {
    // The SMs are (nearly) full already; splitting only pays when one KV head overflows L2 and
    // enough query tiles re-read it; never under causal/local, whose tiles are uneven already.
    const bool overflows_l2 = size_one_kv_head > kL2BytesForSplits;
    if (overflows_l2 && num_m_blocks >= 2 * int64_t{num_sms} && !causal_or_local) {
      return static_cast<int>(
          std::min<int64_t>(ceil_div(size_one_kv_head, kL2BytesForSplits), max_splits));
    }
    return 1;
  }
  if (num_n_blocks <= 4) return 1;  // too few key blocks for partials to pay off
  const int limit = std::min({max_splits, num_sms, num_n_blocks});
  // Wave efficiency of s splits: how full the last wave of total_mblocks * s tiles is.
  std::vector<float> efficiency(static_cast<size_t>(limit));
  float best = 0.0f;
  for (int s = 1; s <= limit; ++s) {
    const float waves = static_cast<float>(total_mblocks * s) / static_cast<float>(num_sms);
    efficiency[s - 1] = waves / std::ceil(waves);
    best = std::max(best, efficiency[s - 1]);
  }
  // The fewest splits within 85% of the best: fewer partials to combine.
  for (int s = 1; s <= limit; ++s) {
    if (efficiency[s - 1] >= 0.85f * best) return s;
  }
  return 1;
}

bool should_pack_gqa(bool varlen_q, int seqlen_q, int qheads_per_kvhead, int block_m) {
  if (varlen_q) return true;  // sequence lengths unknown: packing is the safe bet
  if (seqlen_q <= 0 || block_m <= 0) return false;
  auto tile_fill = [block_m](int64_t rows) {
    return static_cast<float>(rows) / static_cast<float>(ceil_div(rows, block_m) * block_m);
  };
  return tile_fill(seqlen_q) < 0.9f * tile_fill(int64_t{seqlen_q} * qheads_per_kvhead);
}

TileInputs tile_inputs(const PlanKey& key, const MaskShape& mask, bool paged_non_tma) {
  TileInputs in;
  in.headdim = key.headdim;
  in.headdim_v = key.headdim_v;
  in.elem_bytes = key.dtype == DType::e4m3 ? 1 : 2;
  in.causal = mask.is_causal;
  in.local = mask.is_local;
  in.paged_non_tma = paged_non_tma;
  in.softcap = key.has_softcap;
  in.qv = key.has_qv;
  return in;
}

namespace {

// The bound of batch-invariant mode: what the longest sequence the cache holds gets.
int batch_invariant_num_splits(const PlanKey& key, TileSize tile) {
  const int64_t n_blocks = ceil_div(key.max_seqlen_k, tile.block_n);
  return static_cast<int>(std::clamp<int64_t>(
      ceil_div(n_blocks, kBatchInvariantBlocksPerSplit), 1, kMaxHeuristicSplits));
}

// The split bound a plan of `family` at `tile` gets: asked for, batch-invariant, or heuristic.
// The family choice asks it too, so a family that runs one split never gets a plan of more.
// Batch-invariant mode on the sm90 family: one split, a rule of the sequence alone as much as 16
// key blocks per split is (on sm80 its splits made batch-invariant prefill 5-12x slower than the
// default call: bench/results/2026-12-04's kvflash-bi rows).
int planned_num_splits(const PlanKey& key, KernelFamily family, const MaskShape& mask, TileSize tile) {
  if (key.num_splits > 0) return key.num_splits;
  if (key.batch_invariant) return family == KernelFamily::sm90 ? 1 : batch_invariant_num_splits(key, tile);
  return get_num_splits(key, family, mask, tile);
}

// The keys the middle query row, (s_q - 1) / 2, sees under the normalised mask (diagonals are
// bottom-right aligned: row r's is key s_k - s_q + r).
int middle_row_keys(const PlanKey& key, const MaskShape& mask) {
  const int64_t s_k = key.max_seqlen_k, diagonal = s_k - key.max_seqlen_q + (key.max_seqlen_q - 1) / 2;
  const int64_t first = std::max<int64_t>(0, diagonal - mask.window_left);
  const int64_t last = std::min<int64_t>(s_k - 1, diagonal + mask.window_right);
  return int(std::max<int64_t>(0, last - first + 1));
}

}  // namespace

FamilyInputs family_inputs(const PlanKey& key) {
  FamilyInputs in;
  in.arch = key.arch;
  in.sixteen_bit = key.dtype == DType::f16 || key.dtype == DType::bf16;
  in.headdim = key.headdim;
  in.headdim_v = key.headdim_v;
  in.packed_rows = int64_t{key.max_seqlen_q} * group_size(key);
  in.max_seqlen_q = key.max_seqlen_q;
  in.page_size = key.page_size;
  in.has_leftpad = key.has_leftpad;
  in.has_qv = key.has_qv;
  in.fp8_query = key.fp8_query;
  // The switches (core/env_switch.h), read only on sm_90 where they decide: KVFLASH_SM90=0 keeps
  // every call on the portable kernels (to compare with, or fall back to); KVFLASH_SM90_SMALL_PAGES=0
  // sends pages smaller than a key block back to them (on since session 7's H200 run);
  // KVFLASH_SM90_MLA=0 keeps MLA decode calls on the portable kernels (the sm90_mla kernel is on
  // since session 10's H200 run).
  const bool sm90 = key.arch == 90;
  in.sm90_enabled = sm90 && env_switch_on("KVFLASH_SM90");
  in.sm90_small_pages = sm90 && env_switch_on("KVFLASH_SM90_SMALL_PAGES");
  in.sm90_mla = sm90 && env_switch_on("KVFLASH_SM90_MLA");
  // KVFLASH_SM90_SMALL_TILES=0 keeps short prompts off the sm90 small-tile kernel (on since
  // session 16's H100 run).
  in.sm90_small_tiles = sm90 && env_switch_on("KVFLASH_SM90_SMALL_TILES");
  // KVFLASH_SM90_THREE_GROUPS=0 keeps d 64 on rung 3's 128-row tiles (192 on since session 25).
  in.sm90_three_groups = sm90 && env_switch_on("KVFLASH_SM90_THREE_GROUPS");
  in.sm90_three_group_pages = sm90 && env_opted_in("KVFLASH_SM90_THREE_GROUP_PAGES");
  // FA3's all-fp8 prefill calls go to the sm90 family's fp8 kernel (on since session 24's H100
  // runs: oracle-clean under the fp8 tensor cores' bound, at the sm90 bf16 kernel's speed, where the
  // portable kernels convert fp8 to bf16 and run bf16 prefill at about half of it);
  // KVFLASH_SM90_FP8=0 keeps them on the portable kernels.
  in.sm90_fp8 = sm90 && env_switch_on("KVFLASH_SM90_FP8");
  const MaskShape mask = normalise_mask(key);
  in.middle_row_keys = middle_row_keys(key, mask);
  // The sm90 kernels run one split: a call that asks for more, or that FA3's rule would split at
  // the sm90 tile, stays on the sm80 family (batch-invariant mode plans it one split).
  if (key.num_splits <= 1 && key.arch == 90) {
    const TileSize tile = family_tile(KernelFamily::sm90, tile_inputs(key, mask, false),
                                      family_kernel(KernelFamily::sm90, in).shape);
    in.one_split = planned_num_splits(key, KernelFamily::sm90, mask, tile) == 1;
  }
  return in;
}

KernelFamily family_of(const PlanKey& key) { return kernel_family(family_inputs(key)); }

bool use_pagedkv_tma(const PlanKey& key, KernelFamily family, const MaskShape& mask) {
  if (family != KernelFamily::sm90 || key.page_size <= 0 || key.has_leftpad || key.max_seqlen_k_new > 0) {
    return false;
  }
  const TileSize tile = tile_size_sm90(tile_inputs(key, mask, /*paged_non_tma=*/false));
  // Short (packed) query sides are not compute bound and load faster without TMA.
  const int64_t packed_rows = int64_t{key.max_seqlen_q} * group_size(key);
  return key.page_size % tile.block_n == 0 && packed_rows > tile.block_m;
}

int usable_sms(const PlanKey& key) { return std::max(1, key.num_sms - key.sm_margin); }

bool splits_by_portable_rule(KernelFamily family) {
  return family == KernelFamily::sm80 || family == KernelFamily::sm90_mla;
}

namespace {

// The static bound of kvflash's portable rule (core/split_rule.h): one sequence of n_blocks key
// blocks and m_blocks query tiles alone in the batch splits the most, at most
// min(ceil(n / min blocks per split), ceil(slots / tiles)) in one wave and
// min(ceil(n / min multi-wave blocks), ceil(max waves x slots / tiles)) over several.
// A padded batch (no cu_seqlens_q) fills batch x max_seqlen_q query rows; when the bound's fp32
// partials over all of them would pass kPortablePartialBytes, the bound is cut to fit. Such a
// batch has many query tiles of its own (the splits would only serve one sequence with a much
// longer cache than the rest), while the partials, the prepare kernel and a combine over every row
// cost each call: 32 prompts of 512 at d 128 planned 4 splits (512 MiB of partials) and ran 2.8x
// slower than with one (H200, session 7, `kvflash bench` floors).
constexpr int64_t kPortablePartialBytes = 64ll << 20;

int64_t padded_partial_cap(const PlanKey& key) {
  if (key.varlen_q) return kMaxHeuristicSplits;  // rows unknown until the call: no cap
  // One split's bytes, batch x max_seqlen_q x heads x d_v x 4, stopping once past the budget
  // (a key from scheduler metadata may hold any sizes: the full product can overflow).
  int64_t split_bytes = 4;
  for (int64_t factor : {int64_t{key.batch}, int64_t{key.max_seqlen_q}, int64_t{key.num_heads},
                         int64_t{key.headdim_v}}) {
    if (factor <= 0) return kMaxHeuristicSplits;  // no rows: nothing to cap
    if (split_bytes > kPortablePartialBytes / factor) return 1;
    split_bytes *= factor;
  }
  return std::max<int64_t>(1, kPortablePartialBytes / split_bytes);
}

int portable_num_splits(const PlanKey& key, KernelFamily family, int64_t n_blocks, int64_t m_blocks) {
  if (key.batch > kMaxDynamicSplitBatch || n_blocks <= 4) return 1;
  const int64_t tiles = std::max<int64_t>(1, int64_t{key.num_heads_k} * m_blocks);
  const int64_t slots = portable_slots(usable_sms(key), family_ctas_per_sm(family));
  const int64_t one_wave = std::min(ceil_div(n_blocks, kPortableMinBlocksPerSplit),
                                    ceil_div(slots, tiles));
  const int64_t waves = std::min(ceil_div(n_blocks, kPortableMinMultiWaveBlocks),
                                 ceil_div(kPortableMaxWaves * slots, tiles));
  const int64_t bound = std::min(std::max(one_wave, waves), padded_partial_cap(key));
  return static_cast<int>(std::clamp<int64_t>(bound, 1, kMaxHeuristicSplits));
}

}  // namespace

int get_num_splits(const PlanKey& key, KernelFamily family, const MaskShape& mask, TileSize tile) {
  const int64_t s_k = key.max_seqlen_k;
  // A local mask reads at most its window (plus one M tile of diagonal shift) of the keys.
  const int64_t keys_loaded =
      mask.is_local ? std::clamp<int64_t>(int64_t{mask.window_left} + mask.window_right + 1 +
                                              tile.block_m, 0, s_k)
                    : s_k;
  const int64_t n_blocks = ceil_div(keys_loaded, tile.block_n);
  const int64_t m_blocks = ceil_div(int64_t{key.max_seqlen_q} * group_size(key), tile.block_m);
  if (splits_by_portable_rule(family)) return portable_num_splits(key, family, n_blocks, m_blocks);
  const int64_t size_one_kv_head = s_k * (key.headdim + key.headdim_v) * kv_elem_bytes(key);
  // With per-sequence (dynamic) splits this is only an upper bound, computed as if the batch
  // were one long sequence among short ones. Not for the sm90 family's padded batches: its
  // kernels run one split, so the count only decides whether they take the call, and a batch
  // without cu_seqlens_q has every sequence's query tiles (32 prompts of 512 at d 256 went to the
  // portable kernels, 2.5x slower, for splits one sequence alone would want).
  const bool dynamic = key.batch <= kMaxDynamicSplitBatch && (family != KernelFamily::sm90 || key.varlen_q);
  const int64_t total_mblocks = (dynamic ? 1 : key.batch) * int64_t{key.num_heads_k} * m_blocks;
  const auto clamp_int = [](int64_t v) {
    return static_cast<int>(std::min<int64_t>(v, INT32_MAX));
  };
  return num_splits_heuristic(total_mblocks, usable_sms(key), clamp_int(n_blocks),
                              clamp_int(m_blocks), size_one_kv_head,
                              mask.is_causal || mask.is_local, kMaxHeuristicSplits);
}

bool get_pack_gqa(const PlanKey& key, KernelFamily family, TileSize tile, bool pagedkv_tma,
                  int num_splits) {
  // FA3 builds its sm8x, non-TMA paged and split kernels only packed; the CPU plans like sm8x.
  if (family != KernelFamily::sm90 || (key.page_size > 0 && !pagedkv_tma) || num_splits > 1) return true;
  if (key.pack_gqa >= 0) return key.pack_gqa == 1;
  if (key.num_heads == key.num_heads_k) return false;
  return should_pack_gqa(key.varlen_q, key.max_seqlen_q, group_size(key), tile.block_m);
}

namespace {

// A PlanKey is a public struct (Plan::from_fa3 takes any): its fields must be ones a call can
// have before the heuristics compute with them (max_seqlen_k = INT_MIN overflowed, found by
// fuzz/fuzz_plan.cpp).
void check_key_ranges(const PlanKey& k) {
  const auto in_range = [](const char* name, int64_t value, int64_t low, int64_t high) {
    if (value < low || value > high) {
      throw Error(ErrorKind::invalid_value, "scheduler_metadata",
                  "scheduler_metadata's problem has " + std::string(name) + " = " +
                      std::to_string(value) + ", expected a value in [" + std::to_string(low) +
                      ", " + std::to_string(high) + "]");
    }
  };
  in_range("batch", k.batch, 0, kMaxBatch);
  in_range("max_seqlen_q", k.max_seqlen_q, 0, INT32_MAX);
  in_range("max_seqlen_k", k.max_seqlen_k, 0, INT32_MAX);
  in_range("num_heads_k", k.num_heads_k, 1, INT32_MAX);
  in_range("num_heads", k.num_heads, k.num_heads_k, INT32_MAX);
  in_range("headdim", k.headdim, 0, kMaxHeaddim);
  in_range("headdim_v", k.headdim_v, 1, kMaxHeaddimV);
  in_range("dtype", static_cast<int>(k.dtype), 0, static_cast<int>(DType::f64));
  in_range("page_size", k.page_size, 0, INT32_MAX);
  in_range("window_left", k.window_left, -1, INT32_MAX);
  in_range("window_right", k.window_right, -1, INT32_MAX);
  in_range("attention_chunk", k.attention_chunk, 0, INT32_MAX);
  in_range("num_splits", k.num_splits, 0, kMaxSplits);
  in_range("pack_gqa", k.pack_gqa, -1, 1);
  in_range("sm_margin", k.sm_margin, 0, INT32_MAX);
  in_range("num_sms", k.num_sms, 0, 1 << 16);  // a device's SMs (2 * num_sms overflowed)
  in_range("arch", k.arch, 0, 1000);
}

}  // namespace

namespace {

// The plan of a key whose ranges were checked (the family rule reads the mask, whose
// normalisation assumes them), on `family` given the rule's inputs `in`.
Plan checked_key_plan(const PlanKey& key, KernelFamily family, const FamilyInputs& in) {
  Plan plan;
  plan.key = key;
  plan.kernel = family_kernel(family, in);
  const MaskShape mask = normalise_mask(key);
  plan.is_causal = mask.is_causal;
  plan.is_local = mask.is_local;
  const bool pagedkv_tma = use_pagedkv_tma(key, family, mask);
  const bool paged_non_tma = key.page_size > 0 && !pagedkv_tma;
  const TileSize tile = family_tile(family, tile_inputs(key, mask, paged_non_tma), plan.kernel.shape);
  plan.block_m = tile.block_m;
  plan.block_n = tile.block_n;
  plan.num_splits = planned_num_splits(key, family, mask, tile);
  plan.pack_gqa = get_pack_gqa(key, family, tile, pagedkv_tma, plan.num_splits);
  // The tile-count word FA3's persistent scheduler (sm90) and its split combine use.
  plan.has_semaphore = family == KernelFamily::sm90 || plan.num_splits > 1;
  return plan;
}

}  // namespace

Plan static_plan(const PlanKey& key) {
  check_key_ranges(key);
  const FamilyInputs in = family_inputs(key);
  return checked_key_plan(key, kernel_family(in), in);
}

Plan static_plan(const PlanKey& key, KernelFamily family) {
  check_key_ranges(key);
  return checked_key_plan(key, family, family_inputs(key));
}

int num_m_blocks(const Plan& plan, int seqlen_q) {
  const int64_t rows = int64_t{std::max(seqlen_q, 0)} * (plan.pack_gqa ? group_size(plan.key) : 1);
  return static_cast<int>(ceil_div(rows, plan.block_m));
}

int scheduled_heads(const Plan& plan) {
  return plan.pack_gqa ? plan.key.num_heads_k : plan.key.num_heads;
}

namespace {

// kvflash's portable rule (core/split_rule.h), as prepare.cu computes it on the device.
std::vector<int32_t> portable_splits_per_sequence(const Plan& plan, const std::vector<int>& m_blocks,
                                                  const std::vector<int>& n_blocks) {
  const int64_t heads = scheduled_heads(plan);
  int64_t total = 0;
  for (size_t b = 0; b < n_blocks.size(); ++b) total += heads * m_blocks[b] * n_blocks[b];
  const int ctas_per_sm = family_ctas_per_sm(plan.kernel.family);
  const int64_t best_blocks = portable_choose_blocks(
      total, portable_slots(usable_sms(plan.key), ctas_per_sm),
      [&](int64_t blocks) {
        int64_t ctas = 0;
        for (size_t b = 0; b < n_blocks.size(); ++b) {
          ctas += heads * m_blocks[b] * portable_splits(m_blocks[b], n_blocks[b], blocks, plan.num_splits);
        }
        return ctas;
      },
      ctas_per_sm);
  std::vector<int32_t> splits(n_blocks.size());
  for (size_t b = 0; b < n_blocks.size(); ++b) {
    splits[b] = portable_splits(m_blocks[b], n_blocks[b], best_blocks, plan.num_splits);
  }
  return splits;
}

// Splits per sequence, each in [1, plan.num_splits].
//  - CPU plans with a requested num_splits > 1 honour it exactly, capped by the sequence's key
//    blocks: min(num_splits, n_blocks), at least 1. The CPU backend thus really runs split-KV
//    and the combine whenever a caller asks for splits (tests rely on it).
//  - sm80-family plans (the portable CUDA kernels), batch <= 992 and num_splits > 1: kvflash's rule
//    (core/split_rule.h).
//  - Otherwise FA3's dynamic rule: one split each when batch > 992 or num_splits == 1; else
//    spread the batch's total m x n blocks (10% margin, times the scheduled heads) over the
//    usable SMs (CPU: hardware threads) and give each sequence ceil(n_blocks / blocks_per_sm).
std::vector<int32_t> splits_per_sequence(const Plan& plan, const std::vector<int>& m_blocks,
                                         const std::vector<int>& n_blocks) {
  const size_t batch = n_blocks.size();
  const int upper = plan.num_splits;
  std::vector<int32_t> splits(batch, 1);
  if (plan.key.batch_invariant) {
    for (size_t b = 0; b < batch; ++b) {
      splits[b] = batch_invariant_splits(m_blocks[b], n_blocks[b], upper);
    }
    return splits;
  }
  if (plan.kernel.family == KernelFamily::cpu && plan.key.num_splits > 0) {
    for (size_t b = 0; b < batch; ++b) {
      splits[b] = std::clamp(std::min(upper, n_blocks[b]), 1, upper);
    }
    return splits;
  }
  if (plan.key.batch > kMaxDynamicSplitBatch || upper == 1) return splits;
  if (splits_by_portable_rule(plan.kernel.family)) {
    return portable_splits_per_sequence(plan, m_blocks, n_blocks);
  }
  int64_t total_blocks = 0;
  for (size_t b = 0; b < batch; ++b) total_blocks += int64_t{m_blocks[b]} * n_blocks[b];
  const float per_sm = std::ceil(static_cast<float>(total_blocks) * 1.1f *
                                 static_cast<float>(scheduled_heads(plan)) /
                                 static_cast<float>(usable_sms(plan.key)));
  const int64_t blocks_per_sm = std::max<int64_t>(1, static_cast<int64_t>(per_sm));
  for (size_t b = 0; b < batch; ++b) {
    const int64_t wanted = ceil_div(n_blocks[b], blocks_per_sm);
    splits[b] = static_cast<int32_t>(std::clamp<int64_t>(wanted, 1, upper));
  }
  return splits;
}

// Longest work first, so the persistent scheduler does not end on a long tail. Causal tiles of a
// sequence shrink with its query length, hence the key n*block_n - m*block_m there. Equal work
// keeps batch order: the index breaks ties, so std::sort gives stable_sort's order without the
// scratch buffer stable_sort allocates (this runs on every call).
void work_order(const Plan& plan, const std::vector<int>& m_blocks, const std::vector<int>& n_per_split,
                std::vector<int32_t>& order) {
  const auto work = [&](int32_t b) {
    return plan.is_causal ? int64_t{n_per_split[b]} * plan.block_n - int64_t{m_blocks[b]} * plan.block_m
                          : int64_t{n_per_split[b]};
  };
  order.resize(n_per_split.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    const int64_t wa = work(a), wb = work(b);
    return wa != wb ? wa > wb : a < b;
  });
}

// How many heads of one sequence to schedule together so their K/V blocks share L2: 16, 8, 4,
// 2 or 1 KV heads of n_per_split blocks each within the assumed L2 (times the group when the
// query heads are not packed), at most the heads there are.
int32_t heads_in_l2(const Plan& plan, int n_per_split) {
  const int64_t block_bytes = int64_t{plan.block_n} *
                              (plan.key.headdim + plan.key.headdim_v) * kv_elem_bytes(plan.key);
  const int64_t blocks_in_l2 = kL2BytesForHeads / std::max<int64_t>(block_bytes, 1);
  const int64_t n = std::max(n_per_split, 1);
  int32_t heads = 1;
  for (int32_t candidate : {16, 8, 4, 2}) {
    if (n * candidate <= blocks_in_l2) {
      heads = candidate;
      break;
    }
  }
  if (!plan.pack_gqa) heads *= group_size(plan.key);
  return std::clamp(heads, 1, std::max(scheduled_heads(plan), 1));
}

// Everything plan_batches reads of a plan: its key and static decisions.
bool same_static_plan(const Plan& a, const Plan& b) {
  return a.key == b.key && a.kernel == b.kernel && a.block_m == b.block_m && a.block_n == b.block_n &&
         a.num_splits == b.num_splits && a.pack_gqa == b.pack_gqa && a.is_causal == b.is_causal &&
         a.is_local == b.is_local && a.has_semaphore == b.has_semaphore;
}

// This thread's last plan_batches input and result. Batches beyond kMaxMemoBatch are planned
// each time: their copy would cost about what planning does, and the memo would hold their
// vectors.
constexpr size_t kMaxMemoBatch = 4096;
struct BatchPlanMemo {
  Plan plan;  // static decisions and the vectors made for them
  std::vector<SeqLengths> lengths;
  bool valid = false;
};
thread_local BatchPlanMemo last_batch_plan;

void compute_batches(Plan& plan, const std::vector<SeqLengths>& lengths) {
  // Every call plans: the vectors are sized once and filled in place (allocations were most of
  // a decode call's planning time).
  std::vector<int32_t>& m_blocks = plan.num_m_blocks;
  m_blocks.resize(lengths.size());
  std::vector<int> n_blocks(lengths.size());
  for (size_t b = 0; b < lengths.size(); ++b) {
    m_blocks[b] = num_m_blocks(plan, lengths[b].seqlen_q);
    n_blocks[b] = static_cast<int>(ceil_div(std::max(lengths[b].seqlen_k, 0), plan.block_n));
  }
  plan.num_splits_dynamic = splits_per_sequence(plan, m_blocks, n_blocks);
  // n_blocks becomes the key blocks per split of each sequence.
  std::vector<int>& n_per_split = n_blocks;
  for (size_t b = 0; b < lengths.size(); ++b) {
    n_per_split[b] = static_cast<int>(ceil_div(n_blocks[b], plan.num_splits_dynamic[b]));
  }
  plan.batch_order.clear();
  if (!plan.is_local) work_order(plan, m_blocks, n_per_split, plan.batch_order);
  plan.num_nheads_in_l2.clear();
  if (plan.is_causal || plan.is_local) {
    plan.num_nheads_in_l2.resize(lengths.size());
    for (size_t b = 0; b < lengths.size(); ++b) plan.num_nheads_in_l2[b] = heads_in_l2(plan, n_per_split[b]);
  }
}

}  // namespace

void plan_batches(Plan& plan, const std::vector<SeqLengths>& lengths) {
  if (lengths.size() != static_cast<size_t>(std::max(plan.key.batch, 0))) {
    throw Error(ErrorKind::invalid_value, "scheduler_metadata",
                "internal: " + std::to_string(lengths.size()) + " sequence lengths for batch " +
                    std::to_string(plan.key.batch));
  }
  BatchPlanMemo& memo = last_batch_plan;
  if (memo.valid && same_static_plan(memo.plan, plan) && memo.lengths == lengths) {
    plan.num_splits_dynamic = memo.plan.num_splits_dynamic;
    plan.num_m_blocks = memo.plan.num_m_blocks;
    plan.batch_order = memo.plan.batch_order;
    plan.num_nheads_in_l2 = memo.plan.num_nheads_in_l2;
    return;
  }
  compute_batches(plan, lengths);
  if (lengths.size() > kMaxMemoBatch) return;
  memo.valid = false;  // stays invalid if a copy below throws
  memo.plan = plan;
  memo.lengths = lengths;
  memo.valid = true;
}

}  // namespace kvflash::core
