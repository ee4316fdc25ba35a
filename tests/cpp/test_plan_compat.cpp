// The scheduler-metadata compatibility rule (core::accept_plan, python/README.md): for every
// PlanKey field, a plan made for another value of it is accepted when the static decisions are
// this call's own (and the call then runs with exactly its own plan), and refused, naming the
// field and the decision it changes, when they are not. batch must be equal.
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "core/heuristics.h"
#include "core/planner.h"
#include "core/problem.h"
#include "kvflash/errors.h"
#include "kvflash/kvflash.h"
#include "cpp/scoped_env.h"
#include "test_plan_util.h"

namespace kvflash::core {
namespace {

constexpr DeviceInfo kCpu{8, 0};      // 8 hardware threads
constexpr DeviceInfo kHopper{132, 90};
// kGpuFamilies: on a GPU, calls are planned by kernel family (core/kernel_family.h). The sm80
// family's tiles depend on the head dims alone and the sm90 family's tile on the head dim and the
// prompt's length, so dtype, page_size, max_seqlen_k_new, has_leftpad and has_softcap change no
// static decision of an sm_90 plan any more (they did under FA3's Hopper tile table,
// which planned arch 90 before the families): a plan made for another value of them is accepted
// there, and their refused side is the one a decision still shows (num_splits, is_causal,
// block_m rows). varlen_q and pack_gqa still do where the sm90 tile is 192 rows (d 64): FA3's GQA
// packing rule packs varlen calls always, fixed-length ones only where packing fills the tile
// better, which 192 query rows of a head already do.

// The calls of the table. The CPU base: 2 sequences of 4 query rows and 1024 keys, 8 heads over
// 2 KV heads, d 64: one packed M tile, 8 key blocks, FA3's heuristic picks 4 splits on 8 threads.
Problem cpu_call() { return dense_problem(2, 4, 1024, kCpu); }
Problem cpu_call_with(void (*tweak)(Problem&)) {
  Problem p = cpu_call();
  tweak(p);
  rekey(p);
  return p;
}
// The same shapes planned for sm90 (heuristic: 6 splits of 192-key blocks).
Problem hopper_call() { return dense_problem(2, 4, 1024, kHopper); }
// sm90 with 192 query rows and one split: 192 rows fill the 192-row tile, so GQA is not packed
// unless asked (or varlen).
Problem hopper_unpacked_call() {
  Problem p = dense_problem(2, 192, 1024, kHopper);
  p.total_q = 2 * 192;
  p.args.num_splits = 1;
  rekey(p);
  return p;
}
// sm90, paged by 192-key pages with 64 x 4 packed query rows: the paged cache is read by TMA.
Problem hopper_tma_call() {
  Problem p = dense_problem(2, 64, 1024, kHopper);
  p.total_q = 2 * 64;
  p.paged = true;
  p.page_size = 192;
  rekey(p);
  return p;
}
// sm90 fp8, d 128, sliding window: the tile depends on softcap.
Problem hopper_fp8_local_call() {
  Problem p = dense_problem(2, 4, 1024, kHopper);
  p.dtype = DType::e4m3;
  p.headdim = p.headdim_v = 128;
  p.args.window_left = 16;
  rekey(p);
  return p;
}

// FA3's all-fp8 call (e4m3 q and caches) on sm90, decode-shaped: the sm80 family's, opted in or not.
Problem hopper_all_fp8_call() {
  Problem p = dense_problem(2, 4, 1024, kHopper);
  p.dtype = DType::e4m3;
  p.fp8 = p.fp8_cache = true;
  rekey(p);
  return p;
}

// A plan made by get_scheduler_metadata-style planning for `call`'s key with one field changed.
Plan plan_for_changed_key(const Problem& call, void (*change)(PlanKey&)) {
  PlanKey key = call.key;
  change(key);
  key = canonical_key(key, DeviceInfo{key.num_sms, key.arch});
  Plan plan = static_plan(key);
  plan_batches(plan, std::vector<SeqLengths>(static_cast<size_t>(key.batch),
                                             SeqLengths{call.seqlen_q, call.seqlen_k}));
  return plan;
}

struct Case {
  const char* field;
  Problem (*call)();
  void (*change)(PlanKey&);
  const char* refused_decision;  // nullptr: accepted
};

Problem cpu_short_keys() { return cpu_call_with([](Problem& p) { p.seqlen_k = 512; }); }  // 1 split
Problem cpu_one_row() { return cpu_call_with([](Problem& p) { p.seqlen_q = 1, p.total_q = 2; }); }
Problem cpu_local() { return cpu_call_with([](Problem& p) { p.args.window_left = 16; }); }
Problem cpu_four_splits() { return cpu_call_with([](Problem& p) { p.args.num_splits = 4; }); }
// MLA's head dims (d 64, d_v 512): the tiles a call with qv has too.
Problem cpu_mla() { return cpu_call_with([](Problem& p) { p.headdim_v = 512; }); }

// Both sides of every PlanKey field.
const Case kCases[] = {
    {"batch", cpu_call, [](PlanKey& k) { k.batch = 3; }, "batch (plan made for 3, call has 2)"},
    {"max_seqlen_q", cpu_call, [](PlanKey& k) { k.max_seqlen_q = 8; }, nullptr},
    {"max_seqlen_q", cpu_call, [](PlanKey& k) { k.max_seqlen_q = 64; }, "num_splits"},
    {"max_seqlen_k", cpu_call, [](PlanKey& k) { k.max_seqlen_k = 1000; }, nullptr},
    {"max_seqlen_k", cpu_call, [](PlanKey& k) { k.max_seqlen_k = 512; }, "num_splits"},
    {"num_heads", cpu_call, [](PlanKey& k) { k.num_heads = 16; }, nullptr},
    {"num_heads", cpu_call, [](PlanKey& k) { k.num_heads = 128; }, "num_splits"},
    {"num_heads_k", cpu_short_keys, [](PlanKey& k) { k.num_heads_k = 1; }, nullptr},
    {"num_heads_k", cpu_call, [](PlanKey& k) { k.num_heads_k = 4; }, "num_splits"},
    {"headdim", cpu_call, [](PlanKey& k) { k.headdim = 48; }, nullptr},
    {"headdim", cpu_call, [](PlanKey& k) { k.headdim = 128; }, "block_n"},
    {"headdim_v", cpu_call, [](PlanKey& k) { k.headdim_v = 32; }, nullptr},
    {"headdim_v", cpu_call, [](PlanKey& k) { k.headdim_v = 256; }, "block_m"},
    {"dtype", cpu_call, [](PlanKey& k) { k.dtype = DType::f16; }, nullptr},
    {"dtype", hopper_call, [](PlanKey& k) { k.dtype = DType::e4m3; }, nullptr},  // no decision changes: see kGpuFamilies
    {"fp8_query", hopper_all_fp8_call, [](PlanKey& k) { k.fp8_query = false; }, nullptr},  // refused: see below
    {"page_size", cpu_call, [](PlanKey& k) { k.page_size = 16; }, nullptr},
    {"page_size", hopper_call, [](PlanKey& k) { k.page_size = 16; }, nullptr},  // no decision changes: see kGpuFamilies
    {"max_seqlen_k_new", cpu_call, [](PlanKey& k) { k.max_seqlen_k_new = 1; }, nullptr},
    {"max_seqlen_k_new", hopper_tma_call, [](PlanKey& k) { k.max_seqlen_k_new = 1; }, nullptr},  // no decision changes: see kGpuFamilies
    {"varlen_q", cpu_call, [](PlanKey& k) { k.varlen_q = true; }, nullptr},
    {"varlen_q", hopper_unpacked_call, [](PlanKey& k) { k.varlen_q = true; }, "pack_gqa"},  // 192-row tile: see kGpuFamilies
    {"varlen_q", hopper_tma_call, [](PlanKey& k) { k.varlen_q = true; }, nullptr},  // 128-row tile, packed either way
    {"has_leftpad", cpu_call, [](PlanKey& k) { k.has_leftpad = true; }, nullptr},
    {"has_leftpad", hopper_tma_call, [](PlanKey& k) { k.has_leftpad = true; }, nullptr},  // no decision changes: see kGpuFamilies
    {"causal", cpu_one_row, [](PlanKey& k) { k.causal = true; }, nullptr},
    {"causal", cpu_call, [](PlanKey& k) { k.causal = true; }, "is_causal"},
    {"window_left", cpu_call, [](PlanKey& k) { k.window_left = 2000; }, nullptr},
    {"window_left", cpu_call, [](PlanKey& k) { k.window_left = 16; }, "num_splits"},
    {"window_right", cpu_call, [](PlanKey& k) { k.window_right = 3; }, nullptr},
    {"window_right", cpu_call, [](PlanKey& k) { k.window_right = 0; }, "is_causal"},
    {"attention_chunk", cpu_local, [](PlanKey& k) { k.attention_chunk = 4096; }, nullptr},
    {"attention_chunk", cpu_call, [](PlanKey& k) { k.attention_chunk = 64; }, "num_splits"},
    {"has_softcap", cpu_call, [](PlanKey& k) { k.has_softcap = true; }, nullptr},
    {"has_softcap", hopper_fp8_local_call, [](PlanKey& k) { k.has_softcap = true; }, nullptr},  // no decision changes: see kGpuFamilies
    {"has_qv", cpu_mla, [](PlanKey& k) { k.has_qv = true; }, nullptr},  // qv runs the d_v 512 tiles
    {"has_qv", cpu_call, [](PlanKey& k) { k.has_qv = true; }, "block_m"},
    {"has_qv", hopper_call, [](PlanKey& k) { k.has_qv = true; }, "block_m"},  // the sm80 (64, 512) kernels
    {"num_splits", cpu_call, [](PlanKey& k) { k.num_splits = 4; }, nullptr},
    {"num_splits", cpu_call, [](PlanKey& k) { k.num_splits = 2; }, "num_splits"},
    {"pack_gqa", cpu_call, [](PlanKey& k) { k.pack_gqa = 0; }, nullptr},
    {"pack_gqa", hopper_unpacked_call, [](PlanKey& k) { k.pack_gqa = 1; }, "pack_gqa"},  // 192-row tile: see kGpuFamilies
    {"pack_gqa", hopper_tma_call, [](PlanKey& k) { k.pack_gqa = 1; }, nullptr},  // 128-row tile, packed either way
    {"sm_margin", cpu_four_splits, [](PlanKey& k) { k.sm_margin = 2; }, nullptr},
    {"sm_margin", cpu_call, [](PlanKey& k) { k.sm_margin = 1; }, "num_splits"},
    {"num_sms", cpu_four_splits, [](PlanKey& k) { k.num_sms = 16; }, nullptr},
    {"num_sms", cpu_call, [](PlanKey& k) { k.num_sms = 16; }, "num_splits"},
    {"arch", cpu_four_splits, [](PlanKey& k) { k.arch = 80; }, nullptr},
    {"arch", cpu_call, [](PlanKey& k) { k.arch = 90; }, nullptr},  // the CPU plan runs (a GPU plan's tile is not a CPU decision)
};

TEST(PlanCompatibility, EveryFieldOnBothSides) {
  for (const Case& c : kCases) {
    SCOPED_TRACE(std::string(c.field) + (c.refused_decision ? " refused" : " accepted"));
    const Problem call = c.call();
    const Plan given = plan_for_changed_key(call, c.change);
    ASSERT_FALSE(given.key == call.key) << "the case changes nothing";
    if (c.refused_decision == nullptr) {
      // The call runs with exactly the plan it makes itself.
      expect_same_plan(accept_plan(given, call), make_plan(call));
    } else if (std::string(c.field) == "batch") {
      expect_error([&] { accept_plan(given, call); },
                   {"scheduler_metadata was made for a different problem: " +
                    std::string(c.refused_decision)});
    } else {
      expect_error([&] { accept_plan(given, call); },
                   {"scheduler_metadata was made for a different problem: " +
                        std::string(c.field),
                    "(plan made for", ", which changes " + std::string(c.refused_decision) +
                    " (the plan's"});
    }
  }
}

TEST(PlanCompatibility, EveryFieldHasACase) {
  // Each PlanKey field (first_difference's names) has its rows in kCases.
  const char* fields[] = {"batch", "max_seqlen_q", "max_seqlen_k", "num_heads", "num_heads_k",
                          "headdim", "headdim_v", "dtype", "fp8_query", "page_size", "max_seqlen_k_new",
                          "varlen_q", "has_leftpad", "causal", "window_left", "window_right",
                          "attention_chunk", "has_softcap", "has_qv", "num_splits", "pack_gqa",
                          "sm_margin", "num_sms", "arch"};
  for (const char* field : fields) {
    bool accepted = false, refused = false;
    for (const Case& c : kCases) {
      if (std::string(c.field) != field) continue;
      (c.refused_decision ? refused : accepted) = true;
    }
    // Fields that feed no static decision of today's families (kGpuFamilies): accepted only;
    // fp8_query refuses only when opted in (Fp8QueryRefusedWhereTheSm90Fp8KernelWouldRun).
    const std::set<std::string> accept_only = {"dtype", "fp8_query", "page_size", "max_seqlen_k_new",
                                               "has_leftpad", "has_softcap", "arch"};
    EXPECT_TRUE(refused || accept_only.count(field)) << field;
    EXPECT_TRUE(accepted || std::string(field) == "batch") << field;  // must be equal
  }
}

// Metadata made with qkv_dtype e4m3 (fp8_query: FA3's all-fp8 call) given to a 16-bit query over
// the same fp8 cache: where the sm90 fp8 kernel takes a prefill (KVFLASH_SM90_FP8 on, the default)
// it is planned at its tile for the metadata, at the sm80 kernels' for the call, so the call refuses
// it naming fp8_query; switched off (0) both are sm80 plans and it is accepted.
TEST(PlanCompatibility, Fp8QueryRefusedWhereTheSm90Fp8KernelWouldRun) {
  Problem mixed = dense_problem(1, 4096, 4096, kHopper);
  mixed.num_heads = mixed.num_heads_k = 16, mixed.group = 1;
  mixed.headdim = mixed.headdim_v = 128;
  mixed.fp8_cache = true;  // under a bf16 q
  rekey(mixed);
  const auto fp8_metadata = [](PlanKey& k) { k.fp8_query = true; };
  {
    const testing::ScopedEnv off("KVFLASH_SM90_FP8", "0");
    expect_same_plan(accept_plan(plan_for_changed_key(mixed, fp8_metadata), mixed), make_plan(mixed));
  }
  const testing::ScopedEnv on("KVFLASH_SM90_FP8", "1");
  const Plan given = plan_for_changed_key(mixed, fp8_metadata);
  ASSERT_EQ(given.kernel.family, KernelFamily::sm90);
  expect_error([&] { accept_plan(given, mixed); },
               {"scheduler_metadata was made for a different problem: fp8_query (q float8_e4m3fn) (plan made for "
                "true, call has false), which changes block_n (the plan's 128, this call's 64)"});
}

TEST(PlanCompatibility, AcceptsItsOwnPlan) {
  Problem p = dense_problem(3, 4, 1000);
  p.args.num_splits = 3;
  rekey(p);
  const Plan plan = make_plan(p);
  EXPECT_EQ(plan.num_splits, 3);
  EXPECT_EQ(plan.num_splits_dynamic, (std::vector<int32_t>{3, 3, 3}));  // 8 blocks each
  expect_same_plan(accept_plan(plan, p), plan);
}

TEST(PlanCompatibility, PerSequenceVectorsAreBoundedAndTheCallsOwnRun) {
  Problem p = dense_problem(2, 4, 1024);
  p.args.num_splits = 4;
  rekey(p);
  const Plan good = make_plan(p);

  Plan plan = good;
  plan.block_n = 32;  // an edited decision: the keys agree, so the decision is named
  expect_error([&] { accept_plan(plan, p); },
               {"scheduler_metadata: block_n is 32, but this call's plan has 128"});
  plan = good;
  plan.num_splits = 8;  // out_accum would be sized for 4
  expect_error([&] { accept_plan(plan, p); }, {"num_splits is 8"});
  plan = good;
  plan.num_splits_dynamic[1] = 5;
  expect_error([&] { accept_plan(plan, p); }, {"num_splits_dynamic[1] is 5"});
  plan = good;
  plan.num_m_blocks.pop_back();
  expect_error([&] { accept_plan(plan, p); }, {"num_m_blocks has 1 entries, expected 2"});
  plan = good;
  plan.batch_order = {1, 1};
  expect_error([&] { accept_plan(plan, p); }, {"batch_order[1] is 1"});
  // In range but not this call's (made for other lengths): the call's own vectors run.
  plan = good;
  plan.num_m_blocks[0] = 0;
  plan.num_splits_dynamic = {1, 2};
  expect_same_plan(accept_plan(plan, p), good);
}

TEST(PlanCompatibility, MetadataTensor) {
  Problem p = dense_problem(2, 4, 1024);
  p.args.num_splits = 4;
  rekey(p);
  std::vector<int32_t> data = make_plan(p).to_fa3();
  const int64_t n = static_cast<int64_t>(data.size());
  const TensorView good = TensorView::contiguous(data.data(), DType::i32, {n});
  expect_same_plan(plan_from_metadata(good, p), make_plan(p));

  const TensorView shorter = TensorView::contiguous(data.data(), DType::i32, {n - 1});
  expect_error([&] { plan_from_metadata(shorter, p); },
               {"scheduler_metadata must have shape (" + std::to_string(n) + "), got (" +
                std::to_string(n - 1) + ")"});
  const TensorView wrong_type = TensorView::contiguous(data.data(), DType::f32, {n});
  expect_error([&] { plan_from_metadata(wrong_type, p); },
               {"scheduler_metadata must have dtype int32"}, ErrorKind::invalid_type);
  data[4] = 0;  // num_m_blocks[0] of other lengths, in range: the call's own vectors run
  expect_same_plan(plan_from_metadata(good, p), make_plan(p));
  data[0] = 9;  // more splits than the plan's 4
  expect_error([&] { plan_from_metadata(good, p); },
               {"scheduler_metadata[0] (num_splits_dynamic) is 9"});
}

}  // namespace
}  // namespace kvflash::core
