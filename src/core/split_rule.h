// kvflash's split-KV rule for the portable CUDA kernels (plans of the sm80 family), shared by the
// host planner (core/heuristics.cpp) and the device prepare kernel (cuda/ops/prepare.cu), so both give
// the same splits for the same lengths. Integer arithmetic only: deterministic on both sides.
//
// Why not FA3's rule (contract 6.3): FA3 sizes splits for one persistent CTA per SM; the portable
// decode CTA is 4 warps, several of them share an SM, and a CTA with one warp per scheduler is
// bound by instruction latency, not memory (H200: batch 1 x 8192 keys ran 120 CTAs at 6 %
// occupancy). So the rule counts CTA slots (kPortableCtasPerSm per SM) instead of SMs:
//  - total = sum over sequences of scheduled heads x query tiles x key blocks;
//  - for w waves of slots, blocks per split = max(kPortableMinBlocksPerSplit,
//    ceil(total / (w * slots))), and a sequence of n key blocks gets ceil(n / that) splits,
//    at most the plan's num_splits (1 for a sequence without query rows);
//  - no split at all when the unsplit CTAs give every SM one, fit one wave of slots, and either
//    fill at least 3/4 of it or walk at most kPortableShortBlocks key blocks each on average:
//    they are all resident at once and draw the memory bandwidth, so splits would add only the
//    partials and the combine (H200, 32/8 heads, d 128, page 16: batch 48 x 4096-16384 keys and
//    batch 32 x 1024 are 4-15% faster unsplit). Fewer, longer CTAs do not (batch 17 x 8192 keys:
//    0.205 ms unsplit, 0.168 split; 17 x 32768: 0.785 against 0.581; 32 x 32768: 1.276 against
//    1.119; session 13);
//  - else w = 1 always qualifies, w = 2..kPortableMaxWaves only when their splits keep at least
//    kPortableMinMultiWaveBlocks key blocks (a partial last wave only costs much when CTAs are
//    long); the qualifying w whose CTAs fill their last wave best wins, the fewest waves on a tie;
//  - with one CTA slot per SM (the sm90_mla kernel), a w whose CTAs spill past w waves is first
//    refitted: its blocks per split scaled up by the overflow, kept where the CTAs then fit.
// Example (H200, 132 SMs, 8 KV heads, 8192 keys in 64-key blocks): batch 1 gets 43 splits (344
// CTAs, one wave of 396 slots); batch 64 gets 3 splits each (1536 CTAs, 3.9 waves) instead of
// 1 (512 CTAs: 1.3 waves, the last 116 CTAs alone on their SMs); batch 32 (256 CTAs: two per
// SM, all resident, but 2/3 of the slots and 128 blocks each) gets 7; batch 48 keeps 1.
#pragma once

#include <cstdint>

#include "core/mask.h"

namespace kvflash::core {

constexpr int kPortableCtasPerSm = 3;         // decode CTA, d <= 128: registers and shared memory
                                              // (a family of larger CTAs says its own: SplitRule)
constexpr int kPortableMinBlocksPerSplit = 2;
constexpr int kPortableMaxWaves = 4;
constexpr int kPortableMinMultiWaveBlocks = 16;
constexpr int kPortableShortBlocks = 64;  // the no-split exception's "short CTAs" (4096 keys at d 128)

// Batch-invariant mode (KvCacheArgs::batch_invariant): every sequence gets ceil(n_blocks / this)
// splits (at most the plan's num_splits), from its own lengths alone, on the host and the device.
constexpr int kBatchInvariantBlocksPerSplit = 16;

// ceil(a / b) for a >= 0, b > 0. In 32 bits when both fit: on the device a 64-bit division is a
// long software routine, and the decode kernels evaluate this rule before their first load.
KVFLASH_HD int64_t ceil_div(int64_t a, int64_t b) {
  if (((a | b) >> 31) == 0) return (uint32_t(a) + uint32_t(b) - 1u) / uint32_t(b);
  return (a + b - 1) / b;
}

KVFLASH_HD int64_t portable_slots(int usable_sms, int ctas_per_sm = kPortableCtasPerSm) {
  return int64_t{usable_sms} * ctas_per_sm;
}

KVFLASH_HD int64_t portable_blocks_per_split(int64_t total, int waves, int64_t slots) {
  const int64_t per_wave = int64_t{waves} * slots;
  const int64_t blocks = ceil_div(total, per_wave);
  return blocks > kPortableMinBlocksPerSplit ? blocks : kPortableMinBlocksPerSplit;
}

// Splits of one sequence with m_blocks query tiles and n_blocks key blocks.
KVFLASH_HD int portable_splits(int m_blocks, int64_t n_blocks, int64_t blocks_per_split,
                               int max_splits) {
  if (m_blocks <= 0) return 1;
  const int64_t wanted = ceil_div(n_blocks, blocks_per_split);
  return wanted < 1 ? 1 : (wanted > max_splits ? max_splits : static_cast<int>(wanted));
}

KVFLASH_HD int batch_invariant_splits(int m_blocks, int64_t n_blocks, int max_splits) {
  return portable_splits(m_blocks, n_blocks, kBatchInvariantBlocksPerSplit, max_splits);
}

// Does `ctas` fill its last wave of `slots` strictly better than `best_ctas`?
KVFLASH_HD bool portable_fills_better(int64_t ctas, int64_t best_ctas, int64_t slots) {
  if (best_ctas <= 0) return ctas > 0;
  if (ctas <= 0) return false;
  const int64_t waves = ceil_div(ctas, slots);
  const int64_t best_waves = ceil_div(best_ctas, slots);
  return ctas * best_waves > best_ctas * waves;  // ctas / waves > best_ctas / best_waves
}

// Key blocks per split that leave every sequence one split (more than any sequence holds).
constexpr int64_t kPortableNoSplitBlocks = int64_t{1} << 40;

// The key blocks per split the rule picks for `total` block-tiles. ctas_for(blocks) gives the
// CTAs (scheduled heads x query tiles x splits, summed over the batch) that many blocks per split
// make; it is called for each qualifying wave count in order (the device passes a CTA-wide sum,
// which every thread reaches alike). `slots` are ctas_per_sm per SM (the family's).
template <class CtasFor>
KVFLASH_HD int64_t portable_choose_blocks(int64_t total, int64_t slots, CtasFor ctas_for,
                                          int ctas_per_sm = kPortableCtasPerSm) {
  const int64_t unsplit = ctas_for(kPortableNoSplitBlocks);
  const bool resident = unsplit * ctas_per_sm >= slots && unsplit <= slots;
  const bool fills_or_short = 4 * unsplit >= 3 * slots || total <= kPortableShortBlocks * unsplit;
  if (resident && fills_or_short) return kPortableNoSplitBlocks;
  // A family of one CTA per SM: a candidate whose CTAs spill past its waves leaves most SMs idle
  // for a whole CTA; the blocks scaled up by the overflow (fewer splits) take its place when
  // their CTAs fit. (H200, sm90_mla, 16 heads, b64 x 8192: 3 splits, 192 CTAs on 132 SMs,
  // 269 us; 2 splits, 128 CTAs, 216 us.)
  auto fitted = [&](int64_t blocks, int64_t& ctas, int waves) {
    const int64_t room = waves * slots;
    if (ctas_per_sm != 1 || ctas <= room || blocks >= (int64_t{1} << 40) || ctas >= (int64_t{1} << 22)) {
      return blocks;
    }
    const int64_t wider = ceil_div(blocks * ctas, room);
    const int64_t wider_ctas = ctas_for(wider);
    if (wider_ctas > room) return blocks;
    ctas = wider_ctas;
    return wider;
  };
  int64_t best_blocks = portable_blocks_per_split(total, 1, slots);
  int64_t best_ctas = ctas_for(best_blocks);
  best_blocks = fitted(best_blocks, best_ctas, 1);
  for (int waves = 2; waves <= kPortableMaxWaves; ++waves) {
    int64_t blocks = portable_blocks_per_split(total, waves, slots);
    if (blocks < kPortableMinMultiWaveBlocks) continue;
    int64_t ctas = ctas_for(blocks);
    blocks = fitted(blocks, ctas, waves);
    if (portable_fills_better(ctas, best_ctas, slots)) {
      best_blocks = blocks;
      best_ctas = ctas;
    }
  }
  return best_blocks;
}

// Splits of a batch's only sequence (what the batch rule gives it), so a one-sequence call needs
// no prepare kernel: the attention and combine kernels compute it from the lengths they read.
KVFLASH_HD int portable_splits_alone(int m_blocks, int64_t n_blocks, int heads, int64_t slots,
                                     int max_splits, int ctas_per_sm = kPortableCtasPerSm) {
  const int64_t tiles = int64_t{heads} * m_blocks;
  const int64_t blocks = portable_choose_blocks(
      tiles * n_blocks, slots, [&](int64_t b) { return tiles * portable_splits(m_blocks, n_blocks, b, max_splits); },
      ctas_per_sm);
  return portable_splits(m_blocks, n_blocks, blocks, max_splits);
}

// Bound on the sum of the per-sequence splits over a batch of `batch` (see above: each sequence
// adds at most one split beyond n / blocks_per_split, and those add up to at most waves x slots /
// heads), so a grid of this many (sequence, split) columns always holds every split.
KVFLASH_HD int64_t portable_split_columns(int batch, int max_splits, int heads, int usable_sms,
                                          int ctas_per_sm = kPortableCtasPerSm) {
  const int64_t h = heads > 0 ? heads : 1;
  const int64_t extra = (kPortableMaxWaves * portable_slots(usable_sms, ctas_per_sm) + h - 1) / h;
  const int64_t all = int64_t{batch} * max_splits;
  return batch + extra < all ? batch + extra : all;
}

}  // namespace kvflash::core
