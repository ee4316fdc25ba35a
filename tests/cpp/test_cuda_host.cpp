// The CUDA backend's host half, on the CPU: the family rule against the instantiation table and
// the dispatcher's view of a call, the parameter blocks the kernels get, and the pre-launch check
// that refuses a call before its first kernel (cuda/host/call_params.h; backend.cu runs it before
// the append kernel, so a refused call writes nothing).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "core/heuristics.h"
#include "core/kernel_family.h"
#include "core/planner.h"
#include "core/problem.h"
#include "cuda/common/per_device.h"
#include "cuda/host/call_params.h"
#include "kvflash/errors.h"
#include "kvflash/kvflash.h"
#include "oracle/random_case.h"
#include "cpp/cuda_host_util.h"
#include "cpp/scoped_env.h"

namespace kvflash {
namespace {

// The table and the calls (cuda_host_util.h); ScopedEnv: the library's switches are read at every
// plan / call, so a test sets one for its own scope.
using namespace testing;

// What the dispatcher must launch for a call, from the call's own values (as the kernels see
// them: packed rows = s_q x group), and what the Plan says, agree on every random case for every
// arch; the Plan's kernel is in the table, its compiled tile is the Plan's tile and the grid's
// rows per CTA are the kernel's.
// small_tiles: KVFLASH_SM90_SMALL_TILES's value (the sm90 small-tile kernel for short prompts);
// sm90_fp8: KVFLASH_SM90_FP8's (the sm90 family's fp8 kernel for FA3's all-fp8 prefill calls).
void expect_planner_and_dispatcher_agree(const char* small_tiles, const char* sm90_fp8 = "0") {
  const ScopedEnv env("KVFLASH_SM90_SMALL_TILES", small_tiles);
  const ScopedEnv fp8_env("KVFLASH_SM90_FP8", sm90_fp8);
  const int archs[] = {80, 86, 89, 90, 100, 120};
  int checked = 0, sm90 = 0, sm90_small_pages = 0, sm90_small_tiles = 0, sm90_mla = 0, fp8 = 0, sm90_fp8_plans = 0;
  std::set<std::tuple<int, int, int, int>> kernels;
  // The default draws, then prefill shapes (the sm90 family's head dims, >= 64 query rows), then
  // MLA draws (the GPU runner's mla subset).
  const oracle::CaseLimits prefill = oracle::sm90_prefill_limits();
  oracle::CaseLimits mla;
  mla.mla = true;
  for (uint64_t seed = 1; seed <= 600; ++seed) {
    oracle::Case c = oracle::make_random_case(seed, seed <= 400 ? oracle::CaseLimits{} : seed <= 500 ? prefill : mla);
    validate(c.args);
    core::Problem p = core::resolve(c.args);
    const oracle::CaseOutputs outs = oracle::allocate_outputs(output_spec(c.args), false);
    if (!cuda_supports(p, outs.outputs)) continue;
    for (int arch : archs) {
      SCOPED_TRACE(oracle::describe(c) + " arch " + std::to_string(arch));
      const PlanKey key = core::plan_key(p, core::DeviceInfo{132, arch});
      Plan plan = core::static_plan(key);
      core::plan_batches(plan, std::vector<core::SeqLengths>(size_t(p.batch), {p.seqlen_q, p.seqlen_k}));
      core::FamilyInputs call;
      call.arch = arch;
      call.sixteen_bit = !p.fp8_cache;
      call.fp8_query = p.fp8;
      call.sm90_fp8 = core::family_inputs(key).sm90_fp8;  // the switch decides it
      call.headdim = p.headdim;
      call.headdim_v = p.headdim_v;
      call.packed_rows = int64_t{p.seqlen_q} * p.group;
      call.max_seqlen_q = p.seqlen_q;
      call.page_size = p.paged ? p.page_size : 0;
      call.has_leftpad = p.args.cache_leftpad.has_value();
      call.one_split = core::family_inputs(key).one_split;
      call.sm90_enabled = true;  // the planner's split rule decides it
      call.has_qv = p.has_qv;
      call.sm90_mla = true;
      call.sm90_small_tiles = core::family_inputs(key).sm90_small_tiles;  // the switch decides it
      call.sm90_three_groups = core::family_inputs(key).sm90_three_groups;
      call.sm90_three_group_pages = core::family_inputs(key).sm90_three_group_pages;
      call.middle_row_keys = core::family_inputs(key).middle_row_keys;    // the mask's extent
      EXPECT_EQ(plan.kernel, core::choose_kernel(call));
      if (plan.kernel.family == KernelFamily::sm90) {
        ++sm90;
        EXPECT_EQ(arch, 90);  // sm_90a code
        EXPECT_EQ(plan.num_splits, 1);
        EXPECT_GE(p.seqlen_q, 64);
        // Pages smaller than a key block (the GPU runner's sm90 subset draws these limits too).
        if (p.paged && p.page_size < core::sm90_block_n(p.headdim)) ++sm90_small_pages;
        sm90_fp8_plans += p.fp8_cache;
        if (p.fp8_cache) EXPECT_TRUE(p.fp8);  // the all-fp8 call only
        if (plan.kernel.shape == KernelShape::prefill_small_tiles) {
          ++sm90_small_tiles;
          EXPECT_LE(p.seqlen_q, core::kSm90SmallTileMaxSeqlenQ);
          EXPECT_LE(call.middle_row_keys, core::kSm90SmallTileMaxKeys);
          EXPECT_EQ(plan.block_m, core::kSm90SmallTile);
        }
      } else if (plan.kernel.family == KernelFamily::sm90_mla) {
        ++sm90_mla;
        EXPECT_EQ(arch, 90);
        EXPECT_TRUE(p.has_qv);
        EXPECT_LE(p.seqlen_q, core::kSm90MlaMaxSeqlenQ);
        EXPECT_EQ(plan.kernel.shape, KernelShape::mla_decode);
        EXPECT_TRUE(plan.pack_gqa);  // the kernel packs the query heads into its rows
      } else {
        EXPECT_EQ(plan.kernel.family, KernelFamily::sm80);
      }
      const DType query = cuda::reads_fp8_query(p, plan) ? DType::e4m3 : p.fp8 ? bf16 : p.dtype;
      EXPECT_TRUE(in_table(plan.kernel, query, p.fp8_cache));
      fp8 += p.fp8_cache;
      const core::TileSize compiled = core::family_tile(
          plan.kernel.family, core::TileInputs{plan.kernel.headdim, plan.kernel.headdim_v}, plan.kernel.shape);
      EXPECT_EQ(compiled.block_m, plan.block_m);
      EXPECT_EQ(compiled.block_n, plan.block_n);
      const int rows = cuda::rows_per_cta(plan);
      EXPECT_EQ(rows, plan.kernel.shape == KernelShape::decode_8    ? 8
                      : plan.kernel.shape == KernelShape::decode_16 ? 16
                                                                    : plan.block_m);
      // The same kernel after a round trip through FA3's int32 layout.
      const std::vector<int32_t> fa3 = plan.to_fa3();
      EXPECT_EQ(Plan::from_fa3(fa3.data(), fa3.size(), key).kernel, plan.kernel);
      kernels.insert({int(plan.kernel.shape), plan.kernel.headdim, plan.kernel.headdim_v, arch});
      ++checked;
    }
  }
  EXPECT_GT(checked, 600);
  EXPECT_GT(sm90, 0);  // some random calls are prefill shapes the Hopper family takes
  EXPECT_GT(sm90_mla, 0);  // ... and some MLA decode calls the sm90_mla kernel takes
  EXPECT_GT(sm90_small_pages, 0);  // ... some of them paged by pages smaller than a key block
  EXPECT_GT(kernels.size(), 30u);  // every shape over several instantiations was reached
  EXPECT_GT(fp8, 100);  // fp8 calls and 16-bit queries over fp8 caches among them
  // ... and short prompts on the small-tile kernel exactly when the switch is on, all-fp8 prefill
  // calls on the sm90 family exactly when its fp8 switch is.
  EXPECT_EQ(sm90_small_tiles > 0, std::string(small_tiles) != "0");
  EXPECT_EQ(sm90_fp8_plans > 0, std::string(sm90_fp8) == "1");
}

TEST(KernelFamily, PlannerAndDispatcherAgreeOverTheRandomCaseSpace) { expect_planner_and_dispatcher_agree("0"); }

TEST(KernelFamily, PlannerAndDispatcherAgreeWithSm90SmallTiles) { expect_planner_and_dispatcher_agree("1"); }

TEST(KernelFamily, PlannerAndDispatcherAgreeWithSm90Fp8) { expect_planner_and_dispatcher_agree("1", "1"); }

// Every head-dim pair the CUDA backend accepts has its instantiation, in both 16-bit dtypes: d
// and d_v up to 256, d_v up to 512 with d <= 64 (the contract's MLA pairs), and qv's calls (d <=
// 64 or no q, d_v 256..512), which all run the (64, 512) kernels.
TEST(KernelFamily, EverySupportedHeadDimHasAnInstantiation) {
  int pairs = 0;
  for (int d = 0; d <= core::kCudaMaxHeadDim; d += core::kCudaHeadDimMultiple) {
    for (int dv = 8; dv <= core::kCudaMaxHeadDimV; dv += core::kCudaHeadDimMultiple) {
      for (bool qv : {false, true}) {
        const bool mla = d <= 64 && dv >= 256;
        if ((d == 0 && !qv) || (dv > 256 && d > 64) || (qv && !mla)) continue;
        ++pairs;
        for (DType dtype : {bf16, f16}) {
          for (int64_t rows : {1, 9, 16, 17, 4096}) {
            for (bool mla_kernel : {false, true}) {
              core::FamilyInputs in{90, true, d, dv, rows};
              in.has_qv = qv;
              in.max_seqlen_q = 1;
              in.sm90_mla = mla_kernel;
              const KernelChoice k = core::choose_kernel(in);
              EXPECT_TRUE(in_table(k, dtype)) << d << " x " << dv << (qv ? " qv" : "");
              if (qv || dv > 256) EXPECT_EQ(k.headdim_v, 512) << d << " x " << dv;
            }
          }
        }
      }
    }
  }
  EXPECT_EQ(pairs, 32 * 32 + 8 * 32 + 9 * 33);
}

// The GPU runner's sm90 draws (oracle::sm90_prefill_limits, kept apart from the rule so that the
// oracle does not read the kernels' choices) are exactly the head dims the sm90 family takes.
TEST(KernelFamily, Sm90DrawsAreTheFamilysHeadDims) {
  std::set<std::pair<int, int>> drawn;
  for (const auto& dims : oracle::sm90_prefill_limits().head_dims) drawn.insert(dims);
  std::set<std::pair<int, int>> taken;
  for (int d = 8; d <= 512; d += 8) {
    for (int dv = 8; dv <= 512; dv += 8) {
      if (core::sm90_head_dims(d, dv)) taken.insert({d, dv});
    }
  }
  EXPECT_EQ(drawn, taken);
}

// Calls the sm90 family takes, one condition changed at a time.
TEST(KernelFamily, Sm90RuleRow) {
  core::FamilyInputs in{90, true, 128, 128, 4096};
  in.max_seqlen_q = 64;
  in.one_split = true;
  EXPECT_EQ(core::kernel_family(in), KernelFamily::sm90);
  EXPECT_EQ(core::choose_kernel(in).shape, KernelShape::prefill);
  for (auto [d, dv] : {std::pair{64, 64}, {96, 96}, {192, 192}, {256, 256}, {192, 128}}) {
    core::FamilyInputs other = in;
    other.headdim = d, other.headdim_v = dv;
    EXPECT_EQ(core::kernel_family(other), KernelFamily::sm90) << d << " x " << dv;
    EXPECT_EQ(core::choose_kernel(other).headdim, d);
    EXPECT_EQ(core::choose_kernel(other).headdim_v, dv);
    EXPECT_TRUE(in_table(core::choose_kernel(other), bf16) && in_table(core::choose_kernel(other), f16));
  }
  auto with = [&](auto change) {
    core::FamilyInputs c = in;
    change(c);
    return core::kernel_family(c);
  };
  EXPECT_EQ(with([](auto& c) { c.sm90_enabled = false; }), KernelFamily::sm80);  // KVFLASH_SM90=0
  EXPECT_EQ(with([](auto& c) { c.arch = 100; }), KernelFamily::sm80);  // sm_90a code only
  EXPECT_EQ(with([](auto& c) { c.arch = 89; }), KernelFamily::sm80);
  EXPECT_EQ(with([](auto& c) { c.sixteen_bit = false; }), KernelFamily::sm80);
  EXPECT_EQ(with([](auto& c) { c.headdim = c.headdim_v = 80; }), KernelFamily::sm80);  // not compiled
  EXPECT_EQ(with([](auto& c) { c.headdim_v = 64; }), KernelFamily::sm80);
  EXPECT_EQ(with([](auto& c) { c.headdim = 192, c.headdim_v = 64; }), KernelFamily::sm80);
  EXPECT_EQ(with([](auto& c) { c.max_seqlen_q = 63; }), KernelFamily::sm80);
  EXPECT_EQ(with([](auto& c) { c.one_split = false; }), KernelFamily::sm80);
  EXPECT_EQ(with([](auto& c) { c.page_size = 256, c.has_leftpad = true; }), KernelFamily::sm80);
  EXPECT_EQ(with([](auto& c) { c.has_leftpad = true; }), KernelFamily::sm90);  // dense: TMA at any row
}


// Calls the sm90_mla kernel takes (MLA decode: qv, at most kSm90MlaMaxSeqlenQ query tokens, fp16
// / bf16, on sm_90, opted in), one condition changed at a time; every cache layout.
TEST(KernelFamily, Sm90MlaRuleRow) {
  core::FamilyInputs in{90, true, 64, 512, 16};
  in.max_seqlen_q = 1;
  in.has_qv = true;
  in.sm90_mla = true;
  const KernelChoice k = core::choose_kernel(in);
  EXPECT_EQ(k, (KernelChoice{KernelFamily::sm90_mla, KernelShape::mla_decode, 64, 512}));
  EXPECT_TRUE(in_table(k, bf16) && in_table(k, f16));
  const core::TileSize tile = core::family_tile(KernelFamily::sm90_mla, core::TileInputs{64, 512});
  EXPECT_EQ(tile.block_m, 64);
  EXPECT_EQ(tile.block_n, 64);
  EXPECT_EQ(core::family_ctas_per_sm(KernelFamily::sm90_mla), 1);  // its shared memory fills an SM
  EXPECT_EQ(core::family_ctas_per_sm(KernelFamily::sm80), core::kPortableCtasPerSm);
  auto with = [&](auto change) {
    core::FamilyInputs c = in;
    change(c);
    return core::kernel_family(c);
  };
  EXPECT_EQ(with([](auto& c) { c.sm90_mla = false; }), KernelFamily::sm80);  // KVFLASH_SM90_MLA=0
  EXPECT_EQ(with([](auto& c) { c.sm90_enabled = false; }), KernelFamily::sm80);  // KVFLASH_SM90=0
  EXPECT_EQ(with([](auto& c) { c.arch = 100; }), KernelFamily::sm80);  // sm_90a code only
  EXPECT_EQ(with([](auto& c) { c.arch = 89; }), KernelFamily::sm80);
  EXPECT_EQ(with([](auto& c) { c.sixteen_bit = false; }), KernelFamily::sm80);
  EXPECT_EQ(with([](auto& c) { c.has_qv = false; }), KernelFamily::sm80);  // d_v 512 without qv
  EXPECT_EQ(with([](auto& c) { c.max_seqlen_q = core::kSm90MlaMaxSeqlenQ + 1; }), KernelFamily::sm80);
  EXPECT_EQ(with([](auto& c) { c.max_seqlen_q = core::kSm90MlaMaxSeqlenQ; }), KernelFamily::sm90_mla);
  EXPECT_EQ(with([](auto& c) { c.headdim = 0; }), KernelFamily::sm90_mla);  // only_qv without q
  EXPECT_EQ(with([](auto& c) { c.headdim_v = 256; }), KernelFamily::sm90_mla);  // zero-padded to 512
  EXPECT_EQ(with([](auto& c) { c.packed_rows = 128 * 16; }), KernelFamily::sm90_mla);  // 128 heads x 16
  for (int page : {0, 1, 3, 16, 64, 256}) {
    EXPECT_EQ(with([&](auto& c) { c.page_size = page, c.has_leftpad = true; }), KernelFamily::sm90_mla) << page;
  }
}

// The persistent sm90 kernel's tiles: every (query block, head, sequence) once, the query blocks
// last to first (the longest causal ones start first), heads then sequences within a block.
TEST(KernelFamily, Sm90PersistentTilesCoverTheGridLongestFirst) {
  const int m_blocks = 4, heads = 3, sequences = 5;
  std::set<std::tuple<int, int, int>> seen;
  int previous_m = m_blocks;
  for (int t = 0; t < m_blocks * heads * sequences; ++t) {
    const core::Sm90Tile tile = core::sm90_persistent_tile(t, m_blocks, heads, sequences);
    ASSERT_TRUE(tile.m_block >= 0 && tile.m_block < m_blocks && tile.head >= 0 && tile.head < heads &&
                tile.column >= 0 && tile.column < sequences)
        << t;
    EXPECT_LE(tile.m_block, previous_m) << t;
    previous_m = tile.m_block;
    seen.insert({tile.m_block, tile.head, tile.column});
  }
  EXPECT_EQ(seen.size(), size_t(m_blocks * heads * sequences));
  const core::Sm90Tile second = core::sm90_persistent_tile(1, m_blocks, heads, sequences);
  EXPECT_EQ(second.m_block, m_blocks - 1);
  EXPECT_EQ(second.head, 1);
  EXPECT_EQ(second.column, 0);
}

// The planner on an H200: SGLang's MLA decode (one KV head, 16 query heads, page 64) runs the
// sm90_mla kernel (unless KVFLASH_SM90_MLA=0) at its 64 x 64 tile, packed; its splits count one
// CTA per SM (b64 x 8192: 2 splits each, 128 CTAs on 132 SMs, one wave: the one-wave candidate's
// 3 splits, 192 CTAs, refitted; the portable kernels count three per SM with their 32-key blocks
// at d_v 512: 13 each).
TEST(KernelFamily, Sm90MlaPlansMlaDecode) {
  PlanKey raw;
  raw.batch = 64, raw.max_seqlen_q = 1, raw.max_seqlen_k = 8192, raw.page_size = 64;
  raw.num_heads = 16, raw.num_heads_k = 1, raw.headdim = 64, raw.headdim_v = 512, raw.has_qv = true;
  raw.dtype = DType::bf16;
  const PlanKey key = core::canonical_key(raw, core::DeviceInfo{132, 90});
  const std::vector<core::SeqLengths> lengths(64, core::SeqLengths{1, 8192});
  const auto plan_of = [&](const PlanKey& k) {
    Plan plan = core::static_plan(k);
    core::plan_batches(plan, lengths);
    return plan;
  };
  {
    const ScopedEnv off("KVFLASH_SM90_MLA", "0");
    const Plan portable = plan_of(key);
    EXPECT_EQ(portable.kernel.family, KernelFamily::sm80);
    EXPECT_EQ(portable.num_splits_dynamic, std::vector<int32_t>(64, 13));
  }
  const Plan plan = plan_of(key);
  EXPECT_EQ(plan.kernel, (KernelChoice{KernelFamily::sm90_mla, KernelShape::mla_decode, 64, 512}));
  EXPECT_EQ(plan.block_m, 64);
  EXPECT_EQ(plan.block_n, 64);
  EXPECT_TRUE(plan.pack_gqa);
  EXPECT_EQ(plan.num_splits_dynamic, std::vector<int32_t>(64, 2));
  EXPECT_EQ(cuda::rows_per_cta(plan), 64);
  // 132 sequences: one unsplit CTA per SM, one wave: no split.
  PlanKey full = raw;
  full.batch = 132;
  Plan unsplit = core::static_plan(core::canonical_key(full, core::DeviceInfo{132, 90}));
  core::plan_batches(unsplit, std::vector<core::SeqLengths>(132, core::SeqLengths{1, 8192}));
  EXPECT_EQ(unsplit.num_splits_dynamic, std::vector<int32_t>(132, 1));
  // A batch of one skips the prepare kernel: the kernel's rule (portable_splits_alone at one CTA
  // per SM) gives what the planner gives, at 16 and 128 heads.
  for (int heads : {16, 128}) {
    for (int seqlen_k : {1, 300, 4096, 8192, 65536}) {
      PlanKey one = raw;
      one.batch = 1, one.num_heads = heads, one.max_seqlen_k = 65536;
      Plan alone = core::static_plan(core::canonical_key(one, core::DeviceInfo{132, 90}));
      core::plan_batches(alone, {core::SeqLengths{1, seqlen_k}});
      const int m = core::num_m_blocks(alone, 1);
      const int64_t n = (seqlen_k + alone.block_n - 1) / alone.block_n;
      EXPECT_EQ(alone.num_splits_dynamic[0],
                core::portable_splits_alone(m, n, core::scheduled_heads(alone), core::portable_slots(132, 1),
                                            alone.num_splits, 1))
          << heads << " heads, seqlen_k " << seqlen_k;
    }
  }
  // The same plan through FA3's int32 metadata.
  const std::vector<int32_t> fa3 = plan.to_fa3();
  EXPECT_EQ(Plan::from_fa3(fa3.data(), fa3.size(), key).kernel, plan.kernel);
  PlanKey other = key;  // not MLA decode: the portable kernels
  other.max_seqlen_q = 4096;
  EXPECT_EQ(core::static_plan(other).kernel.family, KernelFamily::sm80);
  other = core::canonical_key(raw, core::DeviceInfo{132, 100});
  EXPECT_EQ(core::static_plan(other).kernel.family, KernelFamily::sm80);
  other = key;
  other.has_qv = false;
  EXPECT_EQ(core::static_plan(other).kernel.family, KernelFamily::sm80);
  const ScopedEnv off("KVFLASH_SM90", "0");
  EXPECT_EQ(core::static_plan(key).kernel.family, KernelFamily::sm80);
}

// Page sizes the sm90 kernels read by TMA, at each head dim's key block (128 keys up to d 128, 64
// at d 256): whole blocks (one copy per block) and 8 or more keys dividing a block (one copy per
// page); smaller pages, and pages that straddle blocks, go to sm80.
TEST(KernelFamily, Sm90PageSizes) {
  core::FamilyInputs in{90, true, 128, 128, 4096};
  in.max_seqlen_q = 64;
  in.one_split = true;
  in.page_size = 64;
  in.sm90_small_pages = false;  // opted out: whole blocks only
  EXPECT_EQ(core::kernel_family(in), KernelFamily::sm80);
  in.page_size = 256;
  EXPECT_EQ(core::kernel_family(in), KernelFamily::sm90);
  in.sm90_small_pages = true;
  const auto family = [&](int d, int page_size, bool leftpad = false) {
    core::FamilyInputs c = in;
    c.headdim = c.headdim_v = d, c.page_size = page_size, c.has_leftpad = leftpad;
    return core::kernel_family(c);
  };
  for (int d : {64, 128}) {
    for (int page : {8, 16, 32, 64, 128, 256, 512}) EXPECT_EQ(family(d, page), KernelFamily::sm90) << d << " " << page;
    for (int page : {1, 2, 3, 4, 12, 24, 48, 96, 192, 320}) EXPECT_EQ(family(d, page), KernelFamily::sm80) << page;
  }
  for (int page : {8, 16, 32, 64, 128, 192, 256}) EXPECT_EQ(family(256, page), KernelFamily::sm90) << page;
  for (int page : {1, 4, 24, 48, 96, 160}) EXPECT_EQ(family(256, page), KernelFamily::sm80) << page;
  EXPECT_EQ(family(128, 16, true), KernelFamily::sm80);  // leftpad shifts keys off page boundaries
  EXPECT_EQ(family(256, 8, true), KernelFamily::sm80);
  for (int page = 1; page <= 1024; ++page) {
    const bool tma = page % 128 == 0 || (page >= 8 && 128 % page == 0);
    EXPECT_EQ(core::sm90_page_fits(page, 128), tma) << page;
  }
}

// The planner sends paged prefill calls of the engines' page sizes (vLLM 16, SGLang with FA3 64)
// to sm90 on an H200, and SGLang's default (page 1) to sm80.
TEST(KernelFamily, Sm90PlansPagedPrefill) {
  const PlanKey raw = prefill_key();
  const auto family = [&](int page) {
    PlanKey key = raw;
    key.page_size = page;
    key = core::canonical_key(key, core::DeviceInfo{132, 90});
    return core::static_plan(key).kernel.family;
  };
  for (int page : {16, 64, 1, 3}) {
    EXPECT_EQ(family(page), page >= 16 ? KernelFamily::sm90 : KernelFamily::sm80) << page;
  }
  const ScopedEnv off("KVFLASH_SM90_SMALL_PAGES", "0");
  for (int page : {16, 64}) EXPECT_EQ(family(page), KernelFamily::sm80) << page;
}

// A planned call: one split from FA3's rule at the sm90 tile, a requested split count above one
// sends it to sm80.
TEST(KernelFamily, Sm90NeedsOneSplit) {
  const PlanKey raw = prefill_key();
  const PlanKey key = core::canonical_key(raw, core::DeviceInfo{132, 90});
  EXPECT_EQ(core::static_plan(key).kernel.family, KernelFamily::sm90);
  EXPECT_EQ(core::static_plan(key).num_splits, 1);
  {
    const ScopedEnv off("KVFLASH_SM90", "0");
    EXPECT_EQ(core::static_plan(key).kernel.family, KernelFamily::sm80);
  }
  PlanKey split = key;
  split.num_splits = 2;
  EXPECT_EQ(core::static_plan(split).kernel.family, KernelFamily::sm80);
  PlanKey short_q = key;  // one query tile per head and many key blocks: FA3's rule splits
  short_q.max_seqlen_q = 64;
  short_q.max_seqlen_k = 65536;
  EXPECT_GT(core::static_plan(short_q, KernelFamily::sm90).num_splits, 1);
  EXPECT_EQ(core::static_plan(short_q).kernel.family, KernelFamily::sm80);
}

// The shape the family rule gives `in` changed by `change`.
template <class Change>
KernelShape shape_with(core::FamilyInputs in, Change change) {
  change(in);
  return core::choose_kernel(in).shape;
}

// The sm90 three-group kernel's row: 16-bit calls at head dims up to 64 over a dense cache or pages
// of whole 128-key blocks (pages of 8-64 keys too with KVFLASH_SM90_THREE_GROUP_PAGES=1), prompts
// too long for the small tiles; its tile is 192 x 128. On by default in the planner, off by
// KVFLASH_SM90_THREE_GROUPS=0.
TEST(KernelFamily, Sm90ThreeGroupsRuleRow) {
  core::FamilyInputs in{90, true, 64, 64, 4096};
  in.max_seqlen_q = 4096;
  in.middle_row_keys = 4096;
  in.one_split = true;
  EXPECT_EQ(core::choose_kernel(in).shape, KernelShape::prefill);  // the switch off
  in.sm90_three_groups = true;
  const KernelChoice three = core::choose_kernel(in);
  EXPECT_EQ(three.family, KernelFamily::sm90);
  EXPECT_EQ(three.shape, KernelShape::prefill_three_groups);
  const core::TileSize tile = core::family_tile(KernelFamily::sm90, core::TileInputs{64, 64}, three.shape);
  EXPECT_EQ(tile.block_m, 192);
  EXPECT_EQ(tile.block_n, 128);
  EXPECT_EQ(shape_with(in, [](auto& c) { c.headdim = c.headdim_v = 96; }), KernelShape::prefill);
  EXPECT_EQ(shape_with(in, [](auto& c) { c.page_size = 128; }), KernelShape::prefill_three_groups);
  EXPECT_EQ(shape_with(in, [](auto& c) { c.page_size = 256; }), KernelShape::prefill_three_groups);
  EXPECT_EQ(shape_with(in, [](auto& c) { c.page_size = 64; }), KernelShape::prefill);  // pages of half a block
  EXPECT_EQ(shape_with(in, [](auto& c) { c.page_size = 64, c.sm90_three_group_pages = true; }),
            KernelShape::prefill_three_groups);
  EXPECT_EQ(shape_with(in, [](auto& c) { c.page_size = 8, c.sm90_three_group_pages = true; }),
            KernelShape::prefill_three_groups);
  // Pages the family does not read (4 keys: under a swizzle atom) go to the portable family.
  EXPECT_EQ(core::choose_kernel([&] { auto c = in; c.page_size = 4; return c; }()).family, KernelFamily::sm80);
  EXPECT_EQ(shape_with(in, [](auto& c) { c.sixteen_bit = false; }), KernelShape::prefill);
  // A short prompt keeps the small tiles.
  EXPECT_EQ(shape_with(in, [](auto& c) { c.sm90_small_tiles = true, c.max_seqlen_q = 512, c.middle_row_keys = 512; }),
            KernelShape::prefill_small_tiles);
  // The planner (switch unset: on): the Plan carries the 192-row tile.
  PlanKey raw = prefill_key();
  raw.headdim = raw.headdim_v = 64;
  raw.batch = 4, raw.max_seqlen_q = raw.max_seqlen_k = 4096;
  const PlanKey key = core::canonical_key(raw, core::DeviceInfo{132, 90});
  const Plan plan = core::static_plan(key);
  EXPECT_EQ(plan.kernel.shape, KernelShape::prefill_three_groups);
  EXPECT_EQ(plan.block_m, 192);
  EXPECT_EQ(plan.block_n, 128);
  EXPECT_EQ(cuda::rows_per_cta(plan), 192);
  const ScopedEnv off("KVFLASH_SM90_THREE_GROUPS", "0");
  EXPECT_EQ(core::static_plan(key).kernel.shape, KernelShape::prefill);
}

// KVFLASH_SM90_THREE_GROUP_PAGES=1 plans the 192-row tile over pages smaller than a key block.
TEST(KernelFamily, Sm90ThreeGroupPagesOptIn) {
  PlanKey raw = prefill_key();
  raw.headdim = raw.headdim_v = 64;
  raw.batch = 4, raw.max_seqlen_q = raw.max_seqlen_k = 4096;
  raw.page_size = 16;
  const PlanKey key = core::canonical_key(raw, core::DeviceInfo{132, 90});
  EXPECT_EQ(core::static_plan(key).kernel.shape, KernelShape::prefill);
  const ScopedEnv on("KVFLASH_SM90_THREE_GROUP_PAGES", "1");
  const Plan plan = core::static_plan(key);
  EXPECT_EQ(plan.kernel.family, KernelFamily::sm90);
  EXPECT_EQ(plan.kernel.shape, KernelShape::prefill_three_groups);
  EXPECT_EQ(plan.block_m, 192);
}

// The sm90 small-tile kernel's row: short key loops (the middle query row sees <= 512 keys) of
// prompts up to 1,024 tokens, head dims up to 128, any cache layout the family reads (pages of 8-64
// keys too: one copy per page); its tile is 64 x 64. On by default in the planner, off by KVFLASH_SM90_SMALL_TILES=0.
TEST(KernelFamily, Sm90SmallTilesRuleRow) {
  core::FamilyInputs in{90, true, 128, 128, 512};
  in.max_seqlen_q = 512;
  in.middle_row_keys = 512;
  in.one_split = true;
  EXPECT_EQ(core::choose_kernel(in).shape, KernelShape::prefill);  // the switch off
  in.sm90_small_tiles = true;
  const KernelChoice small = core::choose_kernel(in);
  EXPECT_EQ(small.family, KernelFamily::sm90);
  EXPECT_EQ(small.shape, KernelShape::prefill_small_tiles);
  const core::TileSize tile = core::family_tile(KernelFamily::sm90, core::TileInputs{128, 128}, small.shape);
  EXPECT_EQ(tile.block_m, 64);
  EXPECT_EQ(tile.block_n, 64);
  EXPECT_EQ(shape_with(in, [](auto& c) { c.headdim = c.headdim_v = 64; }), KernelShape::prefill_small_tiles);
  EXPECT_EQ(shape_with(in, [](auto& c) { c.page_size = 64; }), KernelShape::prefill_small_tiles);
  EXPECT_EQ(shape_with(in, [](auto& c) { c.page_size = 128; }), KernelShape::prefill_small_tiles);
  EXPECT_EQ(shape_with(in, [](auto& c) { c.max_seqlen_q = 1024; }), KernelShape::prefill_small_tiles);
  EXPECT_EQ(shape_with(in, [](auto& c) { c.max_seqlen_q = 1025; }), KernelShape::prefill);
  EXPECT_EQ(shape_with(in, [](auto& c) { c.middle_row_keys = 513; }), KernelShape::prefill);
  EXPECT_EQ(shape_with(in, [](auto& c) { c.headdim = c.headdim_v = 256; }), KernelShape::prefill);
  for (int page : {8, 16, 32}) {
    EXPECT_EQ(shape_with(in, [&](auto& c) { c.page_size = page; }), KernelShape::prefill_small_tiles) << page;
  }
  EXPECT_EQ(shape_with(in, [](auto& c) { c.headdim = c.headdim_v = 96; }), KernelShape::prefill_small_tiles);
  EXPECT_EQ(shape_with(in, [](auto& c) { c.headdim = 192, c.headdim_v = 128; }), KernelShape::prefill);
  // The planner (switch unset: on): a short prompt gets the 64 x 64 tile in its Plan.
  const auto plan_of = [](int seqlen_q, int seqlen_k, bool causal, int window_left = -1) {
    PlanKey raw = prefill_key();
    raw.batch = 8, raw.max_seqlen_q = seqlen_q, raw.max_seqlen_k = seqlen_k;
    raw.causal = causal, raw.window_left = window_left;
    const Plan plan = core::static_plan(core::canonical_key(raw, core::DeviceInfo{132, 90}));
    EXPECT_EQ(plan.kernel.family, KernelFamily::sm90);  // one split: the sm90 family's
    return plan;
  };
  const Plan plan = plan_of(512, 512, false);
  EXPECT_EQ(plan.kernel.shape, KernelShape::prefill_small_tiles);
  EXPECT_EQ(plan.block_m, 64);
  EXPECT_EQ(plan.block_n, 64);
  EXPECT_EQ(cuda::rows_per_cta(plan), 64);
  EXPECT_EQ(plan_of(4096, 4096, false).kernel.shape, KernelShape::prefill);
  // The middle row's keys: 1,024 causal tokens (its row 511 sees 512) yes, 1,024 full no, a
  // 512-token extend over 8k of cache no, the same with a 255-key window yes (256 keys), with a
  // 512-key one no (513).
  EXPECT_EQ(plan_of(1024, 1024, true).kernel.shape, KernelShape::prefill_small_tiles);
  EXPECT_EQ(plan_of(1024, 1024, false).kernel.shape, KernelShape::prefill);
  EXPECT_EQ(plan_of(1026, 1026, true).kernel.shape, KernelShape::prefill);
  EXPECT_EQ(plan_of(512, 8192, true).kernel.shape, KernelShape::prefill);
  EXPECT_EQ(plan_of(512, 8192, true, 255).kernel.shape, KernelShape::prefill_small_tiles);
  EXPECT_EQ(plan_of(512, 8192, true, 512).kernel.shape, KernelShape::prefill);
  const ScopedEnv off("KVFLASH_SM90_SMALL_TILES", "0");
  EXPECT_EQ(plan_of(512, 512, false).kernel.shape, KernelShape::prefill);
}

// A padded batch of prompts (no cu_seqlens_q) has all its query tiles: 32 prompts of 512 at d 256
// (8 heads, 4 tiles each: 1,024) run sm90; the same shape by cu_seqlens_q might be one prompt
// among empty ones, which FA3's rule would split, so it stays on sm80.
TEST(KernelFamily, PaddedPromptBatchesRunSm90) {
  PlanKey raw;
  raw.batch = 32, raw.max_seqlen_q = 512, raw.max_seqlen_k = 512, raw.causal = true;
  raw.num_heads = raw.num_heads_k = 8, raw.headdim = raw.headdim_v = 256, raw.dtype = DType::bf16;
  const Plan padded = core::static_plan(core::canonical_key(raw, core::DeviceInfo{132, 90}));
  EXPECT_EQ(padded.kernel.family, KernelFamily::sm90);
  EXPECT_EQ(padded.num_splits, 1);
  raw.varlen_q = true;
  EXPECT_EQ(core::static_plan(core::canonical_key(raw, core::DeviceInfo{132, 90})).kernel.family,
            KernelFamily::sm80);
}

// Batch-invariant mode splits by its own rule (16 key blocks per split) on the sm80 family; a
// prefill the sm90 family takes runs there unsplit, every sequence one split whatever its length
// (the peers suite's kvflash-bi rows on the H200 caught sm90 plans of 2-16 splits, which ran one
// split and combined unwritten partials; then, kept on sm80, prefill 5-12x slower than sm90).
TEST(KernelFamily, BatchInvariantPrefillRunsSm90Unsplit) {
  PlanKey raw;
  raw.batch = 4, raw.max_seqlen_q = 4096, raw.max_seqlen_k = 4096, raw.causal = true;
  raw.num_heads = raw.num_heads_k = 32, raw.headdim = raw.headdim_v = 64, raw.dtype = DType::bf16;
  raw.batch_invariant = true;
  const PlanKey key = core::canonical_key(raw, core::DeviceInfo{132, 90});
  Plan plan = core::static_plan(key);
  EXPECT_EQ(plan.kernel.family, KernelFamily::sm90);
  EXPECT_EQ(plan.num_splits, 1);
  core::plan_batches(plan, std::vector<core::SeqLengths>(4, core::SeqLengths{4096, 4096}));
  for (int32_t splits : plan.num_splits_dynamic) EXPECT_EQ(splits, 1);
  // The same keys under one query row (decode: the sm80 family) split by the mode's rule.
  PlanKey decode = raw;
  decode.max_seqlen_q = 1;
  Plan decode_plan = core::static_plan(core::canonical_key(decode, core::DeviceInfo{132, 90}));
  EXPECT_EQ(decode_plan.kernel.family, KernelFamily::sm80);
  EXPECT_GT(decode_plan.num_splits, 1);
  core::plan_batches(decode_plan, std::vector<core::SeqLengths>(4, core::SeqLengths{1, 4096}));
  EXPECT_GT(decode_plan.num_splits_dynamic[0], 1);
}

TEST(KernelFamily, RuleRows) {
  EXPECT_EQ(core::kernel_family(core::FamilyInputs{0}), KernelFamily::cpu);
  EXPECT_EQ(core::kernel_family(core::FamilyInputs{80}), KernelFamily::sm80);
  EXPECT_EQ(core::kernel_family(core::FamilyInputs{90}), KernelFamily::sm80);  // no query rows
  const auto shape = [](int d, int64_t rows) {
    return core::choose_kernel(core::FamilyInputs{90, true, d, d, rows}).shape;
  };
  EXPECT_EQ(shape(128, 8), KernelShape::decode_8);
  EXPECT_EQ(shape(128, 16), KernelShape::decode_16);
  EXPECT_EQ(shape(256, 16), KernelShape::decode_8);  // two tiles' registers do not fit
  EXPECT_EQ(shape(128, 17), KernelShape::prefill);
  const KernelChoice narrow_v = core::choose_kernel(core::FamilyInputs{80, true, 160, 100, 1});
  EXPECT_EQ(narrow_v.headdim, 192);
  EXPECT_EQ(narrow_v.headdim_v, 128);
  EXPECT_EQ(core::choose_kernel(core::FamilyInputs{0, true, 128, 128, 1}), KernelChoice{});
}

TEST(CudaParams, AppendRotaryAndAttentionBlocks) {
  DecodeCall call(3, /*rotary=*/true);
  const core::Problem p = call.problem();
  Plan plan = core::static_plan(p.key);
  const cuda::WorkspaceLayout layout = cuda::workspace_layout(p, plan);
  std::vector<char> workspace(layout.total);
  const cuda::CallParams c = cuda::call_params(p, plan, call.outputs, workspace.data());
  ASSERT_TRUE(c.append);
  EXPECT_EQ(c.append_rows, 1);
  EXPECT_EQ(c.append_params.k_new.batch_stride, 2 * 64);
  EXPECT_EQ(c.append_params.cache.k_pos_stride, 2 * 64);
  EXPECT_EQ(c.append_params.len.cache_seqlens_value, 100);
  // One rotary block for K (append) and q (rotated into the workspace).
  EXPECT_EQ(c.append_params.rotary.dim, 64);
  EXPECT_EQ(c.append_params.rotary.rows, 256);
  EXPECT_EQ(c.append_params.rotary.row_stride, 32);
  EXPECT_EQ(c.append_params.rotary.cos, call.cos.data());
  ASSERT_TRUE(c.copy_q);
  EXPECT_EQ(c.q_copy.rotary.sin, call.sin.data());
  EXPECT_EQ(c.attention.q.data, workspace.data() + layout.q_copy);  // the kernels read rotated q
  EXPECT_EQ(c.attention.lse_batch_stride, 4);
  EXPECT_EQ(c.attention.group, 2);
  EXPECT_EQ(c.attention.split_block_n, plan.block_n);
  EXPECT_EQ(c.out_type, cuda::ElemType::bf16);

  DecodeCall plain(3);
  const cuda::CallParams no_rotary = cuda::call_params(plain.problem(), plan, plain.outputs, nullptr);
  EXPECT_EQ(no_rotary.append_params.rotary.dim, 0);  // K passes through
  EXPECT_FALSE(no_rotary.copy_q);
}

TEST(CudaParams, SplitPartialsAndCombine) {
  DecodeCall call(2);
  call.args.num_splits = 4;
  const core::Problem p = call.problem();
  Plan plan = core::static_plan(p.key);
  ASSERT_EQ(plan.num_splits, 4);
  const cuda::WorkspaceLayout layout = cuda::workspace_layout(p, plan);
  std::vector<char> workspace(layout.total);
  const cuda::CallParams c = cuda::call_params(p, plan, call.outputs, workspace.data());
  // Ours: (splits, b, h, s, dv) fp32 in the workspace, every element's splits from the prepare
  // kernel, one-split elements written by the attention kernel itself.
  EXPECT_TRUE(c.attention.single_split_writes_out);
  EXPECT_EQ(c.attention.out_partial, reinterpret_cast<float*>(workspace.data() + layout.out_partial));
  EXPECT_EQ(c.attention.op_token_stride, 64);
  EXPECT_EQ(c.attention.op_head_stride, 64);
  EXPECT_EQ(c.attention.op_batch_stride, 4 * 64);
  EXPECT_EQ(c.attention.op_split_stride, 2 * 4 * 64);
  ASSERT_TRUE(c.prepare);
  EXPECT_EQ(c.attention.splits_per_batch, c.prepare_params.splits_out);
  ASSERT_TRUE(c.combine);
  EXPECT_EQ(c.combine_params.dim_a, 2);
  EXPECT_EQ(c.combine_params.dim_b, 1);
  EXPECT_EQ(c.combine_params.dim_c, 4);
  EXPECT_EQ(c.combine_params.splits_per_batch, c.attention.splits_per_batch);
  EXPECT_EQ(c.combine_params.op_c, c.attention.op_head_stride);

  // FA3's flash_attn_combine: (splits, b, s, h, d).
  std::vector<float> partial(size_t(4) * 2 * 1 * 4 * 64), lse_partial(size_t(4) * 2 * 1 * 4);
  const TensorView op = TensorView::contiguous(partial.data(), DType::f32, {4, 2, 1, 4, 64});
  const TensorView lp = TensorView::contiguous(lse_partial.data(), DType::f32, {4, 2, 1, 4});
  const cuda::CombineParams cp = cuda::combine_params(op, lp, call.outputs.out, std::nullopt);
  EXPECT_EQ(cp.num_splits, 4);
  EXPECT_EQ(cp.dim_a, 2);
  EXPECT_EQ(cp.op_split, 2 * 4 * 64);
  EXPECT_EQ(cp.lse, nullptr);
  EXPECT_NO_THROW(cuda::check_combine(cp));
  cuda::CombineParams wide = cp;
  wide.headdim_v = 512;  // MLA's
  EXPECT_NO_THROW(cuda::check_combine(wide));
  wide.headdim_v = 520;
  try {
    cuda::check_combine(wide);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "out_partial");
    EXPECT_NE(std::string(e.what()).find("combine of head dims above 512"), std::string::npos);
  }
}

void expect_refused(const cuda::CallParams& call, const Plan& plan, const std::string& argument,
                    const std::string& part) {
  try {
    cuda::check_launchable(call, plan);
    ADD_FAILURE() << "no error; expected " << part;
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::unsupported);
    EXPECT_EQ(e.argument(), argument);
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
}

// A call whose grid cannot launch is refused by the check backend.cu runs before the append
// kernel: with out_accum (every split of every element launched), 300 x 256 columns.
TEST(CudaParams, RejectedCallIsRefusedBeforeTheFirstKernel) {
  DecodeCall call(300);
  call.args.num_splits = 256;
  const core::Problem p = call.problem();
  const Plan plan = core::make_plan(p);
  ASSERT_EQ(plan.num_splits, 256);
  std::vector<float> accum(size_t(256) * 300 * 4 * 64), lse_accum(size_t(256) * 300 * 4);
  Outputs outputs = call.outputs;
  outputs.out_accum = TensorView::contiguous(accum.data(), DType::f32, {256, 300, 4, 1, 64});
  outputs.softmax_lse_accum = TensorView::contiguous(lse_accum.data(), DType::f32, {256, 300, 4, 1});
  std::vector<char> workspace(cuda::workspace_layout(p, plan).total);
  const cuda::CallParams c = cuda::call_params(p, plan, outputs, workspace.data());
  ASSERT_TRUE(c.append);  // the append kernel would have written first
  expect_refused(c, plan, "num_splits", "batch * num_splits above 65535 is not supported on CUDA yet (got 76800)");

  // Our own partials launch only the split columns the lengths need: the same call fits.
  const cuda::CallParams ours = cuda::call_params(p, plan, call.outputs, workspace.data());
  EXPECT_NO_THROW(cuda::check_launchable(ours, plan));

  cuda::CallParams heads = ours;
  heads.attention.num_heads_k = 70000;
  expect_refused(heads, plan, "k_cache", "more than 65535 KV heads are not supported on CUDA yet");
  cuda::CallParams rows = ours;
  rows.attention.len.seqlen_q = 1 << 30;
  rows.attention.group = 64;
  expect_refused(rows, plan, "q", "more than 2^31 - 1 query tiles per KV head");
  cuda::CallParams batch = ours;
  batch.attention.len.batch = 70000;
  batch.attention.split_work = reinterpret_cast<const cuda::SplitWork*>(workspace.data());
  batch.attention.num_split_work = 1;
  const std::string big_batch =
      "a batch above 65535 with new k / v or a query copied first (rotary, an fp8 q, qv over an fp8 cache) "
      "is not supported on CUDA yet (got 70000)";
  expect_refused(batch, plan, "q", big_batch);
  batch.append = false;  // the append and the query copies put the batch in grid y
  EXPECT_NO_THROW(cuda::check_launchable(batch, plan));
  for (bool cuda::CallParams::*copy : {&cuda::CallParams::copy_q, &cuda::CallParams::copy_qv}) {
    cuda::CallParams copied = batch;
    copied.*copy = true;
    expect_refused(copied, plan, "q", big_batch);
  }
}

// qv adds qv.v to the scores through the (64, 512) kernels; only_qv drops q.k: the kernels see
// head dim 0 and read neither q nor K (without k_cache, K's addressing is V's, so every address
// they form stays inside a tensor). (On sm_80: sm_90 plans MLA decode for the sm90_mla kernel,
// KernelFamily.Sm90MlaPlansMlaDecode.)
TEST(CudaParams, QvAndOnlyQv) {
  MlaCall call(2, 1, 16);
  const core::Problem p = call.problem(80);
  EXPECT_NO_THROW(cuda::check_supported(p, call.outputs));
  const Plan plan = core::make_plan(p);
  EXPECT_EQ(plan.kernel, (KernelChoice{KernelFamily::sm80, KernelShape::decode_8, 64, 512}));
  const cuda::CallParams qv = cuda::call_params(p, plan, call.outputs, nullptr);
  EXPECT_EQ(qv.attention.headdim, 64);
  EXPECT_EQ(qv.attention.q.data, call.q.data());
  EXPECT_EQ(qv.attention.qv.data, call.qv.data());
  EXPECT_EQ(qv.attention.qv.head_stride, 512);
  EXPECT_EQ(qv.attention.qv.token_stride, 16 * 512);
  EXPECT_EQ(qv.attention.cache.k, call.k_cache.data());

  call.args.only_qv = true;  // q and k_cache given, ignored
  const cuda::CallParams ignored = cuda::call_params(call.problem(80), plan, call.outputs, nullptr);
  EXPECT_EQ(ignored.attention.headdim, 0);
  EXPECT_EQ(ignored.attention.q.data, call.qv.data());
  EXPECT_EQ(ignored.attention.cache.k, call.k_cache.data());

  call.args.q.reset();
  call.args.k_cache.reset();
  const core::Problem alone = call.problem(80);
  EXPECT_NO_THROW(cuda::check_supported(alone, call.outputs));
  EXPECT_EQ(core::make_plan(alone).kernel.headdim_v, 512);
  const cuda::CallParams absent = cuda::call_params(alone, core::make_plan(alone), call.outputs, nullptr);
  EXPECT_EQ(absent.attention.headdim, 0);
  EXPECT_EQ(absent.attention.cache.k, call.v_cache.data());
  EXPECT_EQ(absent.attention.cache.k_row_stride, absent.attention.cache.v_row_stride);
  EXPECT_EQ(absent.attention.cache.k_pos_stride, 512);
}

// The d_v 512 prefill CTA takes 151 KB of shared memory: refused where a CTA may have less
// (sm_86, sm_89, sm_120: 99 KB); its decode kernel (83 KB) runs on every sm80+ GPU. (sm_90 gives
// these calls, <= 16 query tokens, to the sm90_mla kernel: KernelFamily.Sm90MlaPlansMlaDecode.)
TEST(CudaParams, MlaPrefillNeedsLargeSharedMemory) {
  MlaCall prefill(1, 4, 16);  // 64 packed query rows
  for (int arch : {80, 87, 100, 103}) {
    const core::Problem p = prefill.problem(arch);
    const Plan plan = core::make_plan(p);
    ASSERT_EQ(plan.kernel.shape, KernelShape::prefill) << arch;
    EXPECT_NO_THROW(cuda::check_launchable(cuda::call_params(p, plan, prefill.outputs, nullptr), plan)) << arch;
  }
  for (int arch : {86, 89, 120}) {
    const core::Problem p = prefill.problem(arch);
    const Plan plan = core::make_plan(p);
    expect_refused(cuda::call_params(p, plan, prefill.outputs, nullptr), plan, "q",
                   "head dim 512 of V (MLA) with more than 16 query rows per KV head needs 151 KB of shared memory "
                   "per CTA (sm_80, sm_87, sm_90, sm_100, sm_103); sm_" + std::to_string(arch) +
                       " is not supported on CUDA yet");
    MlaCall decode(2, 1, 16);
    const core::Problem dp = decode.problem(arch);
    const Plan decode_plan = core::make_plan(dp);
    EXPECT_NE(decode_plan.kernel.shape, KernelShape::prefill);
    EXPECT_NO_THROW(cuda::check_launchable(cuda::call_params(dp, decode_plan, decode.outputs, nullptr), decode_plan));
  }
}

// The per-device caches of the CUDA host path (device attributes, shared-memory opt-ins): a slot
// reads 0 until set, keeps what was set, ignores device ids past its slots, and concurrent first
// calls from several threads on several devices leave every slot with its device's value.
TEST(PerDeviceValue, KeepsOneValuePerDeviceUnderConcurrentFirstCalls) {
  cuda::PerDeviceValue cache;
  EXPECT_EQ(cache.get(0), 0u);
  cache.set(-1, 7);
  cache.set(cuda::kCachedDevices, 7);
  EXPECT_EQ(cache.get(-1), 0u);
  EXPECT_EQ(cache.get(cuda::kCachedDevices), 0u);
  const auto value_of = [](int device) { return uint64_t(device) << 32 | uint64_t(device + 1); };
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      for (int round = 0; round < 1000; ++round) {
        for (int device = 0; device < cuda::kCachedDevices; ++device) {
          if (cache.get(device) == 0) cache.set(device, value_of(device));
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (int device = 0; device < cuda::kCachedDevices; ++device) EXPECT_EQ(cache.get(device), value_of(device));
}

}  // namespace
}  // namespace kvflash
