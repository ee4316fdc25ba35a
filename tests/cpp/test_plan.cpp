// The planner: tile table, FA3's heuristics (expected values computed by hand from contract 6),
// the FA3 int32 layout round trip, and the checks that reject a Plan made for another problem.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "core/heuristics.h"
#include "core/mask.h"
#include "core/planner.h"
#include "core/problem.h"
#include "core/split_rule.h"
#include "core/tile_size.h"
#include "kvflash/errors.h"
#include "kvflash/kvflash.h"
#include "test_plan_util.h"

namespace kvflash::core {
namespace {

// The tile table is constexpr: kernels instantiate templates from it.
static_assert(tile_size_sm90({128, 128}).block_n == 176);
static_assert(tile_size_sm90({128, 128, 2, /*causal=*/true}).block_n == 128);
static_assert(tile_size_sm90({64, 512}).block_m == 64);
static_assert(tile_size_sm90({256, 256, /*elem_bytes=*/1}).block_n == 128);
static_assert(family_tile(KernelFamily::sm80, {128, 128}).block_m == 128 &&
              family_tile(KernelFamily::sm80, {128, 128}).block_n == 64);
static_assert(family_tile(KernelFamily::cpu, {64, 64}).block_n == 128);
static_assert(family_tile(KernelFamily::cpu, {256, 256}).block_m == 64);
// The sm90 family's tile is its kernels' (128 x 128, 64 keys at d 256), not FA3's table.
static_assert(family_tile(KernelFamily::sm90, {128, 128}).block_m == 128 &&
              family_tile(KernelFamily::sm90, {128, 128}).block_n == 128);
static_assert(family_tile(KernelFamily::sm90, {256, 256}).block_n == 64);


Plan plan_for(const PlanKey& key, const std::vector<SeqLengths>& lengths) {
  Plan plan = static_plan(key);
  plan_batches(plan, lengths);
  return plan;
}

// Hopper plans: the sm90 family (FA3's split rule at the family's own tile), which the rule picks
// on sm_90 for the calls its kernels take (decode shapes stay on sm80).
Plan hopper_plan_for(const PlanKey& key, const std::vector<SeqLengths>& lengths) {
  Plan plan = static_plan(key, KernelFamily::sm90);
  plan_batches(plan, lengths);
  return plan;
}

std::vector<SeqLengths> same_lengths(int batch, int seqlen_q, int seqlen_k) {
  return std::vector<SeqLengths>(static_cast<size_t>(batch), SeqLengths{seqlen_q, seqlen_k});
}

TEST(PlanHeuristics, SplitsFillTheSmsByWaveEfficiency) {
  // 8 tiles on 132 SMs, 47 key blocks: s splits make 8s tiles; 15 is the fewest reaching 85% of
  // the best efficiency (33 splits = exactly 2 waves); 14 gives 112/132 = 0.848.
  EXPECT_EQ(num_splits_heuristic(8, 132, 47, 1, 1 << 20, false, 128), 15);
  EXPECT_EQ(num_splits_heuristic(8, 132, 4, 1, 1 << 20, false, 128), 1);  // too few key blocks
  // SMs nearly full: no split unless one KV head overflows the 50 MB L2 (120 MB: 3 splits) with
  // many query tiles, and never for causal/local.
  EXPECT_EQ(num_splits_heuristic(200, 132, 47, 1, 1 << 20, false, 128), 1);
  EXPECT_EQ(num_splits_heuristic(1000, 132, 1000, 300, 120ll << 20, false, 128), 3);
  EXPECT_EQ(num_splits_heuristic(1000, 132, 1000, 300, 120ll << 20, true, 128), 1);
  EXPECT_EQ(num_splits_heuristic(1000, 132, 1000, 100, 120ll << 20, false, 128), 1);
}

TEST(PlanHeuristics, LongContextDecodeSplitsOnHopper) {
  // d = 128: tile (128, 128); 8192 keys = 64 blocks; the upper bound assumes one sequence:
  // 8 KV heads x 1 M tile = 8 tiles -> 15 (120 / 132 of a wave, see above).
  const Plan one = hopper_plan_for(decode_key(1, 8192), same_lengths(1, 1, 8192));
  EXPECT_EQ(one.block_m, 128);
  EXPECT_EQ(one.block_n, 128);
  EXPECT_EQ(one.num_splits, 15);
  EXPECT_TRUE(one.pack_gqa);  // forced by the split
  // Dynamic: 64 blocks x 1.1 x 8 heads / 132 SMs -> 5 blocks per SM -> ceil(64 / 5) = 13.
  EXPECT_EQ(one.num_splits_dynamic, std::vector<int32_t>{13});
  EXPECT_EQ(one.num_m_blocks, std::vector<int32_t>{1});

  // 64 such sequences given by cu_seqlens_q: 3008 blocks -> 201 per SM -> one split each (15
  // stays the upper bound).
  PlanKey varlen = decode_key(64, 8192);
  varlen.varlen_q = true;
  const Plan many = hopper_plan_for(varlen, same_lengths(64, 1, 8192));
  EXPECT_EQ(many.num_splits, 15);
  EXPECT_EQ(many.num_splits_dynamic, std::vector<int32_t>(64, 1));
  // A padded batch has every sequence's query tiles (512, most of the SMs): the sm90 family
  // (whose kernels run one split) bounds it at 1, unlike FA3's upper bound.
  EXPECT_EQ(hopper_plan_for(decode_key(64, 8192), same_lengths(64, 1, 8192)).num_splits, 1);

  // Above 992 sequences the bound counts the whole batch (8000 tiles): no split at all.
  const Plan huge = static_plan(decode_key(1000, 8192), KernelFamily::sm90);
  EXPECT_EQ(huge.num_splits, 1);
  EXPECT_TRUE(huge.has_semaphore);  // sm90's scheduler always has one
}

TEST(PlanHeuristics, PortableCudaSplitsCountCtaSlots) {
  // arch 80 (the portable CUDA kernels), 132 SMs: 396 CTA slots. d = 128: 64-key blocks, 8192
  // keys = 128 blocks, 8 KV heads x 1 query tile. Static bound: one wave min(ceil(128 / 2),
  // ceil(396 / 8)) = 50, several waves min(ceil(128 / 16), ceil(4 x 396 / 8)) = 8.
  const Plan one = plan_for(decode_key(1, 8192, 80), same_lengths(1, 1, 8192));
  EXPECT_EQ(one.block_n, 64);
  EXPECT_EQ(one.num_splits, 50);
  // 1024 block-tiles over 396 slots: 3 blocks per split -> 43 splits (344 CTAs, one wave).
  EXPECT_EQ(one.num_splits_dynamic, std::vector<int32_t>{43});
  // Batch 64, 65536 block-tiles: 1 wave -> 166 blocks per split, 1 split (512 CTAs fill their
  // last wave of 396 to 0.65); 2 waves -> 83, 2 splits (0.86); 3 waves -> 56, 3 splits (1536
  // CTAs, 0.97); 4 waves -> 42, 4 splits (0.86). Three splits each.
  const Plan many = plan_for(decode_key(64, 8192, 80), same_lengths(64, 1, 8192));
  EXPECT_EQ(many.num_splits, 50);
  EXPECT_EQ(many.num_splits_dynamic, std::vector<int32_t>(64, 3));
  // Batch 48: 384 unsplit CTAs give every SM one and fill 3/4 of one wave: no split. Batch 32
  // x 1024 keys (16 blocks each): resident and short, no split either. Batch 32 x 8192: 256
  // long CTAs fill 2/3 of the wave: 4 waves of 21 blocks, 7 splits (1792 CTAs, 0.905 of 5
  // waves). Batch 8 (64 CTAs) would leave SMs idle unsplit: the wave rule splits it.
  const Plan resident = plan_for(decode_key(48, 8192, 80), same_lengths(48, 1, 8192));
  EXPECT_EQ(resident.num_splits_dynamic, std::vector<int32_t>(48, 1));
  const Plan short_ctas = plan_for(decode_key(32, 1024, 80), same_lengths(32, 1, 1024));
  EXPECT_EQ(short_ctas.num_splits_dynamic, std::vector<int32_t>(32, 1));
  const Plan long_ctas = plan_for(decode_key(32, 8192, 80), same_lengths(32, 1, 8192));
  EXPECT_EQ(long_ctas.num_splits_dynamic, std::vector<int32_t>(32, 7));
  const Plan few = plan_for(decode_key(8, 8192, 80), same_lengths(8, 1, 8192));
  EXPECT_GT(few.num_splits_dynamic[0], 1);
  // One long sequence among short ones gets the splits; one without query rows gets 1.
  const Plan mixed = plan_for(decode_key(3, 8192, 80), {{1, 8192}, {1, 100}, {0, 8192}});
  EXPECT_EQ(mixed.num_splits_dynamic, (std::vector<int32_t>{43, 1, 1}));
  // Few key blocks (<= 4) or a batch above 992: no split, as FA3.
  EXPECT_EQ(static_plan(decode_key(1, 256, 80)).num_splits, 1);
  EXPECT_EQ(static_plan(decode_key(1000, 8192, 80)).num_splits, 1);
  // A requested num_splits is the upper bound the rule stays under.
  PlanKey capped = decode_key(1, 8192, 80);
  capped.num_splits = 8;
  EXPECT_EQ(plan_for(capped, same_lengths(1, 1, 8192)).num_splits_dynamic, std::vector<int32_t>{8});
  // Hopper plans and the CPU keep FA3's rule.
  EXPECT_EQ(static_plan(decode_key(1, 8192, 90), KernelFamily::sm90).num_splits, 15);
  EXPECT_EQ(static_plan(decode_key(1, 8192, 0, 64)).num_splits, 7);
}

// A padded prefill batch: the bound's fp32 partials over every query row would pass 64 MiB, so
// the bound is cut (32 prompts of 512, 16 heads, d 128: 128 MiB a split -> 1); with cu_seqlens_q
// the rows are unknown when planning and the bound stays.
TEST(PlanHeuristics, PortableSplitsOfPaddedBatchesFitThePartialBudget) {
  PlanKey raw;
  raw.batch = 32, raw.max_seqlen_q = 512, raw.max_seqlen_k = 512, raw.causal = true;
  raw.num_heads = raw.num_heads_k = 16, raw.headdim = raw.headdim_v = 128, raw.dtype = DType::bf16;
  raw.page_size = 16;
  EXPECT_EQ(static_plan(canonical_key(raw, DeviceInfo{132, 80})).num_splits, 1);
  PlanKey varlen = raw;
  varlen.varlen_q = true;
  EXPECT_GT(static_plan(canonical_key(varlen, DeviceInfo{132, 80})).num_splits, 1);
  PlanKey fewer = raw;  // 8 prompts of 64: 4 MiB a split, the bound stands (several splits)
  fewer.batch = 8, fewer.max_seqlen_q = 64, fewer.max_seqlen_k = 4096;
  EXPECT_GT(static_plan(canonical_key(fewer, DeviceInfo{132, 80})).num_splits, 1);
  // Decode keeps its bound: batch 128 x 4 query tokens is 8 MiB a split, 8 splits fit.
  PlanKey decode = decode_key(128, 8192, 80);
  decode.max_seqlen_q = 4;
  EXPECT_EQ(static_plan(canonical_key(decode, DeviceInfo{132, 80})).num_splits, 8);
}

TEST(PlanHeuristics, PortableSplitsFitTheirGrid) {
  // Random batches of mixed lengths: every sequence's splits lie in [1, num_splits] and they add
  // up to at most portable_split_columns, the grid the CUDA backend launches.
  uint64_t state = 99;
  const auto next = [&state](int n) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<int>((state >> 33) % static_cast<uint64_t>(n));
  };
  int split_sequences = 0;
  for (int trial = 0; trial < 400; ++trial) {
    PlanKey key = decode_key(1 + next(300), 64 * (1 + next(600)), 80, 1 + next(160));
    key.max_seqlen_q = 1 + next(40);
    key.num_splits = next(4) == 0 ? 1 + next(64) : 0;
    std::vector<SeqLengths> lengths;
    for (int b = 0; b < key.batch; ++b) {
      const int seqlen_k = next(8) == 0 ? key.max_seqlen_k : next(key.max_seqlen_k / 8 + 1);
      lengths.push_back({next(key.max_seqlen_q + 1), seqlen_k});
    }
    SCOPED_TRACE("trial " + std::to_string(trial));
    const Plan plan = plan_for(key, lengths);
    int64_t columns = 0;
    for (int32_t splits : plan.num_splits_dynamic) {
      EXPECT_GE(splits, 1);
      EXPECT_LE(splits, plan.num_splits);
      columns += splits;
      split_sequences += splits > 1;
    }
    EXPECT_LE(columns, portable_split_columns(key.batch, plan.num_splits, scheduled_heads(plan),
                                              usable_sms(key)));
  }
  EXPECT_GT(split_sequences, 100);  // the draw does exercise splitting
}

TEST(PlanHeuristics, PortableSplitsOfOneSequenceNeedNoBatch) {
  // A batch of one skips the prepare kernel: the kernels' portable_splits_alone must give what
  // the batch rule gives (here and on the device, the same header).
  for (int sms : {1, 7, 132}) {
    for (int seqlen_k : {0, 1, 64, 300, 4096, 8192, 65536, 300000}) {
      for (int seqlen_q : {0, 1, 5, 40}) {
        PlanKey key = decode_key(1, 300000, 80, sms);
        key.max_seqlen_q = 40;
        const Plan plan = plan_for(key, {{seqlen_q, seqlen_k}});
        const int m = num_m_blocks(plan, seqlen_q);
        const int64_t n = (seqlen_k + plan.block_n - 1) / plan.block_n;
        EXPECT_EQ(plan.num_splits_dynamic[0],
                  portable_splits_alone(m, n, scheduled_heads(plan), portable_slots(usable_sms(key)),
                                        plan.num_splits))
            << sms << " SMs, seqlen_q " << seqlen_q << ", seqlen_k " << seqlen_k;
      }
    }
  }
  EXPECT_EQ(portable_splits_alone(1, 128, 8, 396, 50), 43);  // the b1 x 8192 decode above
}

TEST(PlanHeuristics, SplitRuleCeilDivIsExactAcrossItsTwoWidths) {
  // The 32-bit path (both operands below 2^31) and the 64-bit one must agree with exact arithmetic,
  // at the edges where a 32-bit sum a + b - 1 would overflow a signed int.
  const int64_t big = int64_t{1} << 31;
  const int64_t values[] = {0, 1, 2, 63, 64, 65, 8191, big - 2, big - 1, big, big + 1, big * 7 + 3};
  for (const int64_t a : values) {
    for (const int64_t b : {int64_t{1}, int64_t{3}, int64_t{64}, big - 1, big, big + 5}) {
      const int64_t want = a / b + (a % b != 0 ? 1 : 0);
      EXPECT_EQ(ceil_div(a, b), want) << a << " / " << b;
    }
  }
}

TEST(PlanHeuristics, PackGqa) {
  EXPECT_TRUE(should_pack_gqa(true, 128, 4, 128));    // varlen q
  EXPECT_TRUE(should_pack_gqa(false, 1, 8, 128));     // 1/128 filled vs 8/128
  EXPECT_FALSE(should_pack_gqa(false, 128, 4, 128));  // already full tiles
  PlanKey key = decode_key(1, 1024, 90);
  key.num_splits = 1;
  const MaskShape mask = normalise_mask(key);
  const KernelFamily sm90 = KernelFamily::sm90;
  const TileSize tile = family_tile(sm90, tile_inputs(key, mask, false));
  EXPECT_TRUE(get_pack_gqa(key, sm90, tile, false, 1));
  key.pack_gqa = 0;  // a request is honoured where nothing forces packing
  EXPECT_FALSE(get_pack_gqa(key, sm90, tile, false, 1));
  EXPECT_TRUE(get_pack_gqa(key, sm90, tile, false, 2));  // splits force it
  EXPECT_TRUE(get_pack_gqa(key, KernelFamily::sm80, tile, false, 1));  // sm8x kernels are packed
  EXPECT_TRUE(get_pack_gqa(key, family_of(key), tile, false, 1));      // the H200's family today
  key = decode_key(1, 1024, 90);
  key.num_heads_k = 32;
  EXPECT_FALSE(get_pack_gqa(key, sm90, tile, false, 1));  // nothing to pack
}

TEST(PlanHeuristics, WindowNormalisation) {
  PlanKey key = decode_key(1, 4096);
  key.causal = true;
  MaskShape mask = normalise_mask(key);  // one query row: causal is dropped
  EXPECT_FALSE(mask.is_causal);
  EXPECT_FALSE(mask.is_local);
  key.page_size = 16;  // ... except d in (64, 128] with paged KV
  EXPECT_TRUE(normalise_mask(key).is_causal);

  key = decode_key(1, 4096);
  key.max_seqlen_q = 64;
  key.causal = true;
  mask = normalise_mask(key);
  EXPECT_TRUE(mask.is_causal);
  EXPECT_EQ(mask.window_left, 4095);
  EXPECT_EQ(mask.window_right, 0);
  key.window_left = 4095;  // covers the whole cache: still causal
  EXPECT_TRUE(normalise_mask(key).is_causal);
  key.window_left = 100;
  mask = normalise_mask(key);
  EXPECT_TRUE(mask.is_local);
  EXPECT_EQ(mask.window_left, 100);
  key = decode_key(1, 4096);
  key.max_seqlen_q = 64;
  key.attention_chunk = 32;
  mask = normalise_mask(key);
  EXPECT_TRUE(mask.is_local);
  EXPECT_EQ(mask.window_left, 31);
  EXPECT_EQ(mask.window_right, 31);
}

TEST(PlanHeuristics, PagedTma) {
  PlanKey key = decode_key(1, 4096);
  key.max_seqlen_q = 64;  // 64 x 4 packed rows > block_m 128
  key.causal = true;      // tile (128, 128)
  key.page_size = 256;
  EXPECT_TRUE(use_pagedkv_tma(key, KernelFamily::sm90, normalise_mask(key)));
  key.page_size = 64;  // not a multiple of block_n
  EXPECT_FALSE(use_pagedkv_tma(key, KernelFamily::sm90, normalise_mask(key)));
  key.page_size = 256;
  key.has_leftpad = true;
  EXPECT_FALSE(use_pagedkv_tma(key, KernelFamily::sm90, normalise_mask(key)));
  key.has_leftpad = false;
  key.max_seqlen_k_new = 1;
  EXPECT_FALSE(use_pagedkv_tma(key, KernelFamily::sm90, normalise_mask(key)));
  key.max_seqlen_k_new = 0;
  key.max_seqlen_q = 16;  // 64 packed rows: too short for TMA
  EXPECT_FALSE(use_pagedkv_tma(key, KernelFamily::sm90, normalise_mask(key)));
  key.max_seqlen_q = 64;
  EXPECT_TRUE(use_pagedkv_tma(key, KernelFamily::sm90, normalise_mask(key)));
  EXPECT_FALSE(use_pagedkv_tma(key, KernelFamily::sm80, normalise_mask(key)));
  EXPECT_FALSE(use_pagedkv_tma(key, family_of(key), normalise_mask(key)));  // arch 90 runs sm80
}

TEST(PlanHeuristics, BatchOrderAndHeadsInL2) {
  PlanKey key = decode_key(3, 4096);
  key.max_seqlen_q = 128;
  key.causal = true;
  key.num_splits = 1;
  // Causal: ordered by n * block_n - m * block_m, longest first, ties in batch order.
  const Plan plan = hopper_plan_for(key, {{128, 1000}, {128, 4000}, {128, 1000}});
  EXPECT_EQ(plan.batch_order, (std::vector<int32_t>{1, 0, 2}));
  ASSERT_EQ(plan.num_nheads_in_l2.size(), 3u);
  // 8 MB / (128 keys x 256 x 2 bytes) = 128 blocks; 8 blocks x 16 heads fits; 32 blocks x 4.
  // Not packed (128 rows fill tiles), so times the group of 4, at most 32 heads.
  EXPECT_FALSE(plan.pack_gqa);
  EXPECT_EQ(plan.num_nheads_in_l2, (std::vector<int32_t>{32, 16, 32}));
}

// Ties keep batch order in batches long enough that the sort is not an insertion sort (work_order
// sorts with the index as tie-break instead of a stable sort).
TEST(PlanHeuristics, BatchOrderKeepsTiesInBatchOrderInLongBatches) {
  const int batch = 40;
  PlanKey key = decode_key(batch, 4096);
  key.max_seqlen_q = 128;
  key.causal = true;
  key.num_splits = 1;
  std::vector<SeqLengths> lengths;
  std::vector<int32_t> expected_long, expected_short;
  for (int b = 0; b < batch; ++b) {
    const bool long_one = b % 3 == 1;
    lengths.push_back({128, long_one ? 4000 : 1000});
    (long_one ? expected_long : expected_short).push_back(b);
  }
  std::vector<int32_t> expected = expected_long;
  expected.insert(expected.end(), expected_short.begin(), expected_short.end());
  EXPECT_EQ(hopper_plan_for(key, lengths).batch_order, expected);
}

// Five sequences of different lengths (b_r = 8) under one mask kind.
Plan five_sequence_plan(bool causal, int window_left) {
  PlanKey key = decode_key(5, 8192);
  key.max_seqlen_q = 16;
  key.causal = causal;
  key.window_left = window_left;
  return plan_for(key, {{16, 100}, {3, 8000}, {16, 2500}, {1, 0}, {9, 5000}});
}

TEST(PlanLayout, RoundTripAndOffsets) {
  struct Case {
    const char* name;
    Plan plan;
    size_t vectors;
  };
  const Case cases[] = {
      {"causal", five_sequence_plan(true, -1), 4},  // splits, m, order, heads in L2
      {"local", five_sequence_plan(false, 256), 3},  // splits, m, heads in L2
      {"neither", five_sequence_plan(false, -1), 3},  // splits, m, order
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const Plan& plan = c.plan;
    const std::vector<int32_t> data = plan.to_fa3();
    ASSERT_EQ(data.size(), 8 * c.vectors + 1);  // + the sm90 semaphore word
    ASSERT_EQ(plan.fa3_size(), data.size());
    for (size_t i = 0; i < 5; ++i) {
      const size_t b = plan.is_local ? i : static_cast<size_t>(plan.batch_order[i]);
      EXPECT_EQ(data[i], plan.num_splits_dynamic[b]);
      EXPECT_EQ(data[8 + i], plan.num_m_blocks[b]);
      if (!plan.is_local) EXPECT_EQ(data[16 + i], plan.batch_order[i]);
      if (plan.is_causal) EXPECT_EQ(data[24 + i], plan.num_nheads_in_l2[b]);
      if (plan.is_local) EXPECT_EQ(data[16 + i], plan.num_nheads_in_l2[b]);
    }
    expect_same_plan(Plan::from_fa3(data.data(), data.size(), plan.key), plan);
  }
  EXPECT_TRUE(cases[0].plan.is_causal);
  EXPECT_TRUE(cases[1].plan.is_local);
  EXPECT_FALSE(cases[2].plan.is_causal || cases[2].plan.is_local);
  EXPECT_NE(cases[2].plan.batch_order, (std::vector<int32_t>{0, 1, 2, 3, 4}));  // really sorted
}

// Many keys and lengths (deterministic): every plan is in range, has FA3's length and survives
// the round trip.
TEST(PlanLayout, RandomPlansKeepTheirInvariants) {
  uint64_t state = 12345;
  const auto next = [&state](int n) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<int>((state >> 33) % static_cast<uint64_t>(n));
  };
  const int archs[] = {0, 80, 90};
  const int headdims[] = {64, 96, 128, 192, 256};
  const DType dtypes[] = {DType::bf16, DType::f16, DType::e4m3, DType::f32};
  for (int trial = 0; trial < 300; ++trial) {
    PlanKey key;
    key.batch = 1 + next(12);
    key.max_seqlen_q = 1 + next(300);
    key.max_seqlen_k = next(20000);
    key.num_heads_k = 1 + next(8);
    key.num_heads = key.num_heads_k * (1 + next(8));
    key.headdim = headdims[next(5)];
    key.headdim_v = next(4) == 0 ? 512 : key.headdim;
    key.dtype = dtypes[next(4)];
    key.page_size = next(3) == 0 ? 0 : 1 << next(9);
    key.max_seqlen_k_new = next(3) == 0 ? 1 : 0;
    key.varlen_q = next(2) == 1;
    key.has_leftpad = next(4) == 0;
    key.causal = next(2) == 1;
    key.window_left = next(3) == 0 ? next(5000) : -1;
    key.window_right = next(4) == 0 ? next(200) : -1;
    key.attention_chunk = next(5) == 0 ? 64 * (1 + next(8)) : 0;
    key.has_softcap = next(3) == 0;
    key.num_splits = next(3) == 0 ? 1 + next(20) : 0;
    key.pack_gqa = next(3) - 1;
    key.sm_margin = next(4);
    key = canonical_key(key, DeviceInfo{1 + next(200), archs[next(3)]});
    std::vector<SeqLengths> lengths;
    for (int b = 0; b < key.batch; ++b) {
      lengths.push_back({next(key.max_seqlen_q + 1), next(key.max_seqlen_k + 1)});
    }
    SCOPED_TRACE("trial " + std::to_string(trial));
    const Plan plan = plan_for(key, lengths);
    ASSERT_NO_THROW(check_plan_vectors(plan));
    EXPECT_GE(plan.num_splits, 1);
    EXPECT_LE(plan.num_splits, kMaxSplits);
    const size_t b_r = (static_cast<size_t>(key.batch) + 3) / 4 * 4;
    const size_t vectors = 2 + (plan.is_local ? 0 : 1) + (plan.is_causal || plan.is_local ? 1 : 0);
    const std::vector<int32_t> data = plan.to_fa3();
    EXPECT_EQ(data.size(), b_r * vectors + (plan.has_semaphore ? 1 : 0));
    expect_same_plan(Plan::from_fa3(data.data(), data.size(), key), plan);
  }
}

TEST(PlanLayout, CpuPlanWithoutSplitsHasNoSemaphore) {
  PlanKey key = decode_key(2, 1024, /*arch=*/0, /*num_sms=*/4);
  key.num_splits = 1;
  const Plan plan = plan_for(key, same_lengths(2, 1, 1024));
  EXPECT_FALSE(plan.has_semaphore);
  EXPECT_EQ(plan.to_fa3().size(), 4u * 3);
  key.num_splits = 3;
  EXPECT_TRUE(plan_for(key, same_lengths(2, 1, 1024)).has_semaphore);
}

TEST(PlanLayout, FromFa3RejectsBadLengthAndValues) {
  const Plan plan = five_sequence_plan(true, -1);  // num_splits > 1, 4 vectors, b_r = 8
  const std::vector<int32_t> good = plan.to_fa3();
  ASSERT_GT(plan.num_splits, 1);
  expect_error([&] { Plan::from_fa3(good.data(), good.size() - 1, plan.key); },
               {"scheduler_metadata must have shape (33), got (32)"});
  const auto with = [&](size_t offset, int32_t value) {
    std::vector<int32_t> bad = good;
    bad[offset] = value;
    return bad;
  };
  const auto rejects = [&](size_t offset, int32_t value, const char* what) {
    const std::vector<int32_t> bad = with(offset, value);
    expect_error([&] { Plan::from_fa3(bad.data(), bad.size(), plan.key); },
                 {"scheduler_metadata[" + std::to_string(offset) + "] (" + what + ")"});
  };
  rejects(1, 0, "num_splits_dynamic");
  rejects(2, plan.num_splits + 1, "num_splits_dynamic");
  rejects(9, -1, "num_m_blocks");
  rejects(9, 1000, "num_m_blocks");  // more tiles than max_seqlen_q has
  rejects(17, good[16], "batch_order");  // a duplicate
  rejects(18, 5, "batch_order");         // not a batch index
  rejects(26, 0, "num_nheads_in_l2");
  // Padding and the semaphore word are not read.
  const std::vector<int32_t> padded = with(6, 77);
  expect_same_plan(Plan::from_fa3(padded.data(), padded.size(), plan.key), plan);
  const std::vector<int32_t> semaphore = with(32, 123);
  expect_same_plan(Plan::from_fa3(semaphore.data(), semaphore.size(), plan.key), plan);
}

TEST(PlanKeys, FirstDifferenceNamesEveryField) {
  const PlanKey base = decode_key(4, 4096);
  EXPECT_EQ(first_difference(base, base), "");
  PlanKey call = base;
  call.max_seqlen_k = 8192;
  EXPECT_EQ(first_difference(base, call), "max_seqlen_k (plan made for 4096, call has 8192)");

  struct Change {
    const char* name;
    void (*apply)(PlanKey&);
  };
  const Change changes[] = {
      {"batch", [](PlanKey& k) { k.batch = 5; }},
      {"max_seqlen_q", [](PlanKey& k) { k.max_seqlen_q = 2; }},
      {"max_seqlen_k", [](PlanKey& k) { k.max_seqlen_k = 1; }},
      {"num_heads", [](PlanKey& k) { k.num_heads = 16; }},
      {"num_heads_k", [](PlanKey& k) { k.num_heads_k = 4; }},
      {"headdim (", [](PlanKey& k) { k.headdim = 64; }},
      {"headdim_v", [](PlanKey& k) { k.headdim_v = 64; }},
      {"dtype", [](PlanKey& k) { k.dtype = DType::f16; }},
      {"fp8_query", [](PlanKey& k) { k.fp8_query = true; }},
      {"page_size", [](PlanKey& k) { k.page_size = 16; }},
      {"max_seqlen_k_new", [](PlanKey& k) { k.max_seqlen_k_new = 1; }},
      {"varlen_q", [](PlanKey& k) { k.varlen_q = true; }},
      {"has_leftpad", [](PlanKey& k) { k.has_leftpad = true; }},
      {"causal", [](PlanKey& k) { k.causal = true; }},
      {"window_left", [](PlanKey& k) { k.window_left = 7; }},
      {"window_right", [](PlanKey& k) { k.window_right = 0; }},
      {"attention_chunk", [](PlanKey& k) { k.attention_chunk = 64; }},
      {"has_softcap", [](PlanKey& k) { k.has_softcap = true; }},
      {"has_qv", [](PlanKey& k) { k.has_qv = true; }},
      {"num_splits", [](PlanKey& k) { k.num_splits = 2; }},
      {"pack_gqa", [](PlanKey& k) { k.pack_gqa = 1; }},
      {"sm_margin", [](PlanKey& k) { k.sm_margin = 4; }},
      {"num_sms", [](PlanKey& k) { k.num_sms = 114; }},
      {"arch", [](PlanKey& k) { k.arch = 0; }},
  };
  for (const Change& change : changes) {
    call = base;
    change.apply(call);
    const std::string diff = first_difference(base, call);
    EXPECT_EQ(diff.rfind(change.name, 0), 0u) << change.name << ": " << diff;
    EXPECT_NE(diff.find("plan made for"), std::string::npos) << diff;
  }
  call = base;
  call.arch = 0;
  EXPECT_EQ(first_difference(base, call), "arch (plan made for sm90, call has CPU)");
  call = base;
  call.fp8_query = true;
  EXPECT_EQ(first_difference(call, base), "fp8_query (q float8_e4m3fn) (plan made for true, call has false)");
}

TEST(PlanKeys, CanonicalKeyFoldsEquivalentRequests) {
  PlanKey a = decode_key(1, 64);
  PlanKey b = a;
  a.num_splits = -1;
  b.num_splits = 0;
  a.max_seqlen_k_new = 5;
  b.max_seqlen_k_new = 1;
  EXPECT_TRUE(canonical_key(a, {132, 90}) == canonical_key(b, {132, 90}));
}

TEST(PlanCpu, RequestedSplitsAreHonouredPerSequence) {
  PlanKey key = decode_key(4, 2048, /*arch=*/0, /*num_sms=*/64);
  key.num_splits = 4;
  // CPU tile for d = 128: 64 keys per block. 1000 keys = 16 blocks, 100 = 2, 0 = 0, 64 = 1.
  const Plan plan = plan_for(key, {{1, 1000}, {1, 100}, {1, 0}, {1, 64}});
  EXPECT_EQ(plan.block_n, 64);
  EXPECT_EQ(plan.num_splits, 4);
  EXPECT_EQ(plan.num_splits_dynamic, (std::vector<int32_t>{4, 2, 1, 1}));
  // The backend's partition covers each sequence's keys exactly, in order.
  const int seqlen_k = 1000;
  int next = 0;
  for (int split = 0; split < plan.num_splits_dynamic[0]; ++split) {
    const KeyRange r = split_keys(split, plan.num_splits_dynamic[0], seqlen_k, plan.block_n);
    EXPECT_EQ(r.lo, next);
    EXPECT_GT(r.hi, r.lo);
    next = r.hi;
  }
  EXPECT_EQ(next, seqlen_k);
}

TEST(PlanCpu, HeuristicUsesHardwareThreads) {
  // 2 threads: 8 tiles already fill them, no split. 64 threads: d = 128 CPU tile has 64 keys per
  // block, 8192 keys = 128 blocks; 8 tiles x s on 64 threads: s = 8 is a full wave, s = 7 the
  // fewest within 85% of it (56 / 64).
  EXPECT_EQ(static_plan(decode_key(1, 8192, 0, 2)).num_splits, 1);
  EXPECT_EQ(static_plan(decode_key(1, 8192, 0, 64)).num_splits, 7);
}

// get_scheduler_metadata's arguments for dense_problem(batch, seqlen_q, seqlen_k)'s shape (8 / 2
// heads, d 64).
SchedulerArgs dense_scheduler_args(int batch, int seqlen_q, int seqlen_k) {
  SchedulerArgs args;
  args.batch_size = batch;
  args.max_seqlen_q = seqlen_q;
  args.max_seqlen_k = seqlen_k;
  args.num_heads_q = 8;
  args.num_heads_kv = 2;
  args.headdim = 64;
  return args;
}

TEST(SchedulerMetadata, MatchesTheCallAndReadsLengths) {
  std::vector<int32_t> cache_seqlens = {1000, 10};
  SchedulerArgs args = dense_scheduler_args(2, 4, 1024);
  args.num_splits = 4;
  args.cache_seqlens = TensorView::contiguous(cache_seqlens.data(), DType::i32, {2});
  const Plan plan = get_scheduler_metadata(args);

  Problem p = dense_problem(2, 4, 1024);
  p.args.num_splits = 4;
  p.key = plan_key(p, device_info(Device{}));
  EXPECT_TRUE(plan.key == p.key) << first_difference(plan.key, p.key);
  // CPU tile for d = 64: 128 keys per block: 1000 keys = 8 blocks -> 4 splits, 10 keys -> 1.
  EXPECT_EQ(plan.num_splits_dynamic, (std::vector<int32_t>{4, 1}));
  // The call's own lengths (full capacity, no cache_seqlens) give its per-sequence vectors.
  expect_same_plan(accept_plan(plan, p), make_plan(p));

  args.window_left = 10;
  expect_error([&] { accept_plan(get_scheduler_metadata(args), p); },
               {"window_left (plan made for 10, call has -1), which changes"});
}

// get_scheduler_metadata's one qkv_dtype: e4m3 plans FA3's all-fp8 call (PlanKey::fp8_query), so
// its key is the all-fp8 call's exactly; a 16-bit query over the same fp8 cache differs in
// fp8_query alone, accepted where the decisions agree (here the CPU's; refused where they differ:
// PlanCompatibility.Fp8QueryRefusedWhereTheSm90Fp8KernelWouldRun).
TEST(SchedulerMetadata, Fp8QkvDtypeMeansTheAllFp8Call) {
  SchedulerArgs args = dense_scheduler_args(2, 4, 1024);
  args.qkv_dtype = DType::e4m3;
  const Plan plan = get_scheduler_metadata(args);
  EXPECT_TRUE(plan.key.fp8_query);
  args.qkv_dtype = DType::bf16;
  EXPECT_FALSE(get_scheduler_metadata(args).key.fp8_query);

  Problem all_fp8 = dense_problem(2, 4, 1024, device_info(Device{}));  // the CPU's threads, as the plan's
  all_fp8.dtype = DType::e4m3, all_fp8.fp8 = all_fp8.fp8_cache = true;
  rekey(all_fp8);
  EXPECT_EQ(first_difference(plan.key, all_fp8.key), "");
  Problem mixed = all_fp8;
  mixed.dtype = DType::bf16, mixed.fp8 = false;
  rekey(mixed);
  EXPECT_EQ(first_difference(plan.key, mixed.key), "fp8_query (q float8_e4m3fn) (plan made for true, call has false)");
  expect_same_plan(accept_plan(plan, mixed), make_plan(mixed));
}

TEST(SchedulerMetadata, RejectsBadArguments) {
  SchedulerArgs args = dense_scheduler_args(1, 1, 128);
  args.num_heads_q = 6;
  args.num_heads_kv = 4;
  expect_error([&] { get_scheduler_metadata(args); },
               {"Number of heads in key/value must divide number of heads in query"});
  args.num_heads_kv = 2;
  args.qkv_dtype = DType::i32;
  expect_error([&] { get_scheduler_metadata(args); },
               {"FlashAttention only supports fp16, bf16, and fp8_e4m3 data type"},
               ErrorKind::invalid_type);
  args.qkv_dtype = DType::f32;  // the CPU backend takes float32
  EXPECT_NO_THROW(get_scheduler_metadata(args));
  args.num_splits = 257;
  expect_error([&] { get_scheduler_metadata(args); }, {"num_splits > 256 not supported"});
  args.num_splits = 0;
  std::vector<int32_t> lengths = {5, 3};  // one entry too many
  args.cache_seqlens = TensorView::contiguous(lengths.data(), DType::i32, {2});
  expect_error([&] { get_scheduler_metadata(args); },
               {"cache_seqlens must have shape (1), got (2)"});
  std::vector<int32_t> cu = {0, 3};  // 3 rows > max_seqlen_q
  args.cache_seqlens.reset();
  args.cu_seqlens_q = TensorView::contiguous(cu.data(), DType::i32, {2});
  expect_error([&] { get_scheduler_metadata(args); }, {"cu_seqlens_q", "more than max_seqlen_q"});
}

// A small float32 decode call on the CPU: 2 sequences (400 and 37 cached keys of 512), 4 query
// heads over 2 KV heads, d = 64 (CPU tile: 128 keys per block, so 4 and 1 key blocks).
class PublicCall : public ::testing::Test {
 protected:
  static constexpr int kBatch = 2, kHeads = 4, kHeadsK = 2, kDim = 64, kCapacity = 512;

  PublicCall()
      : q_(fill(kBatch * kHeads * kDim, 1)),
        k_cache_(fill(kBatch * kCapacity * kHeadsK * kDim, 2)),
        v_cache_(fill(kBatch * kCapacity * kHeadsK * kDim, 3)),
        cache_seqlens_{400, 37} {
    args_.q = TensorView::contiguous(q_.data(), DType::f32, {kBatch, 1, kHeads, kDim});
    args_.k_cache = TensorView::contiguous(k_cache_.data(), DType::f32,
                                           {kBatch, kCapacity, kHeadsK, kDim});
    args_.v_cache = TensorView::contiguous(v_cache_.data(), DType::f32,
                                           {kBatch, kCapacity, kHeadsK, kDim});
    args_.cache_seqlens = TensorView::contiguous(cache_seqlens_.data(), DType::i32, {kBatch});
    args_.num_splits = 4;
  }

  static std::vector<float> fill(size_t n, uint32_t seed) {
    std::vector<float> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = std::sin(0.37f * static_cast<float>(i * seed + seed));
    return v;
  }

  SchedulerArgs scheduler_args() const {
    SchedulerArgs s;
    s.batch_size = kBatch;
    s.max_seqlen_q = 1;
    s.max_seqlen_k = kCapacity;
    s.num_heads_q = kHeads;
    s.num_heads_kv = kHeadsK;
    s.headdim = kDim;
    s.qkv_dtype = DType::f32;
    s.cache_seqlens = args_.cache_seqlens;
    s.num_splits = 4;
    return s;
  }

  std::vector<float> run(const KvCacheArgs& args) const {
    std::vector<float> out(kBatch * kHeads * kDim, -7.0f);
    Outputs outputs{TensorView::contiguous(out.data(), DType::f32, {kBatch, 1, kHeads, kDim})};
    flash_attn_with_kvcache(args, outputs);
    return out;
  }

  std::vector<float> q_, k_cache_, v_cache_;
  std::vector<int32_t> cache_seqlens_;
  KvCacheArgs args_;
};

TEST_F(PublicCall, PrecomputedPlanIsAcceptedAndAgrees) {
  const Plan plan = get_scheduler_metadata(scheduler_args());
  EXPECT_EQ(plan.num_splits_dynamic, (std::vector<int32_t>{4, 1}));
  const std::vector<float> fresh = run(args_);

  KvCacheArgs with_plan = args_;
  with_plan.plan = &plan;
  EXPECT_EQ(run(with_plan), fresh);

  std::vector<int32_t> metadata = plan.to_fa3();
  KvCacheArgs with_tensor = args_;
  with_tensor.scheduler_metadata = TensorView::contiguous(
      metadata.data(), DType::i32, {static_cast<int64_t>(metadata.size())});
  EXPECT_EQ(run(with_tensor), fresh);

  // Splitting changes only the order of the sums.
  KvCacheArgs unsplit = args_;
  unsplit.num_splits = 1;
  const std::vector<float> reference = run(unsplit);
  for (size_t i = 0; i < fresh.size(); ++i) EXPECT_NEAR(fresh[i], reference[i], 1e-5f) << i;
}

TEST_F(PublicCall, PlanOfAnotherCompatibleProblemGivesTheCallsOwnResult) {
  // FA3's usual pattern: metadata made once with new keys and a larger capacity, used by a call
  // that appends nothing. Same static decisions: accepted, and the call runs its own plan.
  SchedulerArgs other = scheduler_args();
  other.max_seqlen_k = 4096;
  other.max_seqlen_k_new = 3;
  const Plan plan = get_scheduler_metadata(other);
  KvCacheArgs call = args_;
  call.plan = &plan;
  EXPECT_EQ(run(call), run(args_));
}

TEST_F(PublicCall, PlanForAnotherProblemIsAnErrorAndWritesNothing) {
  SchedulerArgs other = scheduler_args();
  other.num_splits = 2;
  const Plan plan = get_scheduler_metadata(other);
  KvCacheArgs call = args_;
  call.plan = &plan;
  std::vector<float> out(kBatch * kHeads * kDim, -7.0f);
  Outputs outputs{TensorView::contiguous(out.data(), DType::f32, {kBatch, 1, kHeads, kDim})};
  expect_error([&] { flash_attn_with_kvcache(call, outputs); },
               {"scheduler_metadata was made for a different problem: num_splits (plan made "
                "for 2, call has 4), which changes num_splits (the plan's 2, this call's 4)"});
  EXPECT_EQ(out, std::vector<float>(out.size(), -7.0f));

  // FA3's tensor form: a layout of another length is named by its shape.
  other = scheduler_args();
  other.causal = true;
  other.max_seqlen_q = 2;  // keeps causal: 4 vectors instead of 3
  std::vector<int32_t> metadata = get_scheduler_metadata(other).to_fa3();
  call = args_;
  call.scheduler_metadata = TensorView::contiguous(metadata.data(), DType::i32,
                                                   {static_cast<int64_t>(metadata.size())});
  expect_error([&] { flash_attn_with_kvcache(call, outputs); },
               {"scheduler_metadata must have shape (13), got (17)"});
}

}  // namespace
}  // namespace kvflash::core
