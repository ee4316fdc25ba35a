// The CUDA backend's host half for fp8 (contract 5.8) on the CPU: the family rule and the
// instantiation table for calls over an fp8 cache, FA3's all-fp8 prefill on the sm90 family unless
// switched off (KVFLASH_SM90_FP8=0), the parameter blocks those calls' kernels get, and the GPU
// runner's fp8 draws.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <set>
#include <string>
#include <vector>

#include "core/heuristics.h"
#include "core/kernel_family.h"
#include "core/planner.h"
#include "core/problem.h"
#include "cuda/host/call_params.h"
#include "kvflash/errors.h"
#include "kvflash/kvflash.h"
#include "oracle/random_case.h"
#include "cpp/cuda_host_util.h"
#include "cpp/scoped_env.h"

namespace kvflash {
namespace {

using namespace testing;  // the table and the calls (cuda_host_util.h), ScopedEnv

// Every head-dim pair an fp8 cache takes up to 256 without qv (multiples of 16; MLA's qv and
// latent widths: test_cuda_mla_fp8.cpp) has its sm80 row, under both 16-bit queries (and fp8's, which runs
// bf16's): 64, 128 or 256, the wider dim rounded up; sm_90 gives no such call to its own family,
// prefill shapes included (the all-fp8 call opted in: Sm90Fp8RuleRow).
TEST(KernelFamily, EveryFp8HeadDimHasAnInstantiation) {
  for (int d = 16; d <= 256; d += 16) {
    for (int dv = 16; dv <= 256; dv += 16) {
      for (int64_t rows : {1, 9, 16, 17, 4096}) {
        core::FamilyInputs in{90, /*sixteen_bit=*/false, d, dv, rows};
        in.max_seqlen_q = int(rows), in.one_split = true;
        const KernelChoice k = core::choose_kernel(in);
        EXPECT_EQ(k.family, KernelFamily::sm80) << d << " x " << dv;
        const int widest = std::max(d, dv);
        EXPECT_EQ(k.headdim, widest <= 64 ? 64 : widest <= 128 ? 128 : 256) << d << " x " << dv;
        EXPECT_EQ(k.headdim_v, k.headdim);
        for (DType q : {bf16, f16}) EXPECT_TRUE(in_table(k, q, true)) << d << " x " << dv;
        // The kernel's compiled tile is the one the planner plans with.
        const core::TileSize planned = core::family_tile(KernelFamily::sm80, core::TileInputs{d, dv});
        const core::TileSize compiled = core::family_tile(KernelFamily::sm80, core::TileInputs{k.headdim, k.headdim_v});
        EXPECT_EQ(planned.block_m, compiled.block_m) << d << " x " << dv;
        EXPECT_EQ(planned.block_n, compiled.block_n) << d << " x " << dv;
      }
    }
  }
}


// The fp8 forms of a decode call (contract 5.8): a 16-bit query over an fp8 cache, or FA3's
// all-fp8 call (bf16 out), with the descales of both batch elements and KV heads.
struct Fp8DecodeCall : DecodeCall {
  std::vector<float> descales = std::vector<float>(3 * 2 * 2, 0.5f);
  Fp8DecodeCall(DType q_dtype, bool rotary) : DecodeCall(2, rotary) {
    args.k_cache->dtype = args.v_cache->dtype = DType::e4m3;
    for (OptTensor* t : {&args.q, &args.k, &args.v, &args.rotary_cos, &args.rotary_sin}) {
      if (*t) (*t)->dtype = q_dtype;
    }
    outputs.out.dtype = q_dtype == DType::e4m3 ? DType::bf16 : q_dtype;
    int i = 0;
    for (OptTensor* t : {&args.q_descale, &args.k_descale, &args.v_descale}) {
      if (t == &args.q_descale && q_dtype != DType::e4m3) continue;  // refused with a 16-bit q
      *t = TensorView::contiguous(descales.data() + 4 * i++, DType::f32, {2, 2});
    }
  }
};

// The CUDA backend takes both fp8 forms (decode: the sm80 kernels, the sm90 family takes prefill
// shapes alone). An fp8 q reaches the kernels as bf16 in the workspace (rotated or not); the
// descales reach the kernels that read fp8.
TEST(CudaParams, Fp8CallsRunOnThePortableKernels) {
  const ScopedEnv on("KVFLASH_SM90_FP8", "1");  // decode stays on sm80 even so
  for (DType q : {DType::bf16, DType::f16, DType::e4m3}) {
    for (bool rotary : {false, true}) {
      SCOPED_TRACE(std::string(dtype_name(q)) + (rotary ? " rotary" : ""));
      Fp8DecodeCall call(q, rotary);
      const core::Problem p = call.problem();
      EXPECT_NO_THROW(cuda::check_supported(p, call.outputs));
      EXPECT_EQ(p.key.dtype, DType::e4m3);
      const Plan plan = core::static_plan(p.key);
      EXPECT_EQ(plan.kernel.family, KernelFamily::sm80);
      const cuda::WorkspaceLayout layout = cuda::workspace_layout(p, plan);
      std::vector<char> workspace(layout.total);
      const cuda::CallParams c = cuda::call_params(p, plan, call.outputs, workspace.data());
      const bool fp8_q = q == DType::e4m3;
      EXPECT_EQ(c.copy_q, rotary || fp8_q);
      if (c.copy_q) {
        EXPECT_EQ(c.attention.q.data, workspace.data() + layout.q_copy);
        EXPECT_EQ(layout.total - layout.q_copy, size_t(2 * 4 * 64 * 2));  // b x h x d, 2 bytes each
      }
      EXPECT_EQ(c.out_type, q == DType::f16 ? cuda::ElemType::f16 : cuda::ElemType::bf16);
      EXPECT_EQ(c.attention.q_descale.data, fp8_q ? call.descales.data() : nullptr);
      const float* k_descale = call.descales.data() + (fp8_q ? 4 : 0);
      EXPECT_EQ(c.attention.k_descale.data, k_descale);
      EXPECT_EQ(c.attention.v_descale.data, k_descale + 4);
      EXPECT_EQ(c.attention.k_descale.batch_stride, 2);
      EXPECT_EQ(c.attention.k_descale.head_stride, 1);
      EXPECT_EQ(c.append_params.k_descale.data, k_descale);
      EXPECT_EQ(c.append_params.v_descale.data, k_descale + 4);
    }
  }
  // Descales are ignored without fp8 (spec 12.8): a 16-bit call hands the kernels none.
  DecodeCall plain(2);
  std::vector<float> ones(4, 1.0f);
  plain.args.k_descale = TensorView::contiguous(ones.data(), DType::f32, {2, 2});
  const core::Problem p = plain.problem();
  const cuda::CallParams c = cuda::call_params(p, core::static_plan(p.key), plain.outputs, nullptr);
  EXPECT_EQ(c.attention.k_descale.data, nullptr);
  EXPECT_EQ(c.append_params.k_descale.data, nullptr);
}

// A prefill-shaped call over an fp8 cache an H200 would give the sm90 family in 16 bits: a 16-bit
// query stays on sm80 always, FA3's all-fp8 call takes the sm90 fp8 kernel unless KVFLASH_SM90_FP8=0.
TEST(KernelFamily, Fp8PrefillOnSm90UnlessSwitchedOff) {
  const PlanKey key = core::canonical_key(prefill_key(), core::DeviceInfo{132, 90});
  ASSERT_EQ(core::static_plan(key).kernel.family, KernelFamily::sm90);
  PlanKey mixed = key;
  mixed.dtype = DType::e4m3;
  PlanKey all_fp8 = mixed;
  all_fp8.fp8_query = true;
  for (const char* value : {"1", "true", ""}) {  // switched off by "0" alone
    const ScopedEnv env("KVFLASH_SM90_FP8", value);
    EXPECT_EQ(core::static_plan(mixed).kernel.family, KernelFamily::sm80) << value;
    EXPECT_EQ(core::static_plan(all_fp8).kernel.family, KernelFamily::sm90) << value;
  }
  {
    const ScopedEnv restore("KVFLASH_SM90_FP8", "0");
    unsetenv("KVFLASH_SM90_FP8");  // unset (the default), restored at the end of the scope
    EXPECT_EQ(core::static_plan(all_fp8).kernel.family, KernelFamily::sm90);
  }
  const ScopedEnv off("KVFLASH_SM90_FP8", "0");
  EXPECT_EQ(core::static_plan(mixed).kernel.family, KernelFamily::sm80);
  EXPECT_EQ(core::static_plan(all_fp8).kernel.family, KernelFamily::sm80);
}

// The GPU runner's fp8 step (tests/gpu/run.sh: `random 300 30001 fp8`) keeps the draws over an
// fp8 cache (the CUDA backend takes them all): its 300 cases reach both fp8 forms, every feature
// of the contract on them, MLA's (qv, only_qv, the latent width 512), and the prefill kernel
// (more than 16 packed query rows), also at head dims above 128 (its one-stage loop) and MLA's.
TEST(KernelFamily, GpuRunnerFp8StepCoversTheContract) {
  std::set<std::string> tags;
  int kept = 0, prefill = 0, wide_prefill = 0, mla_prefill = 0;
  for (uint64_t seed = 30001; kept < 300; ++seed) {
    const std::vector<std::string> f = oracle::random_case_features(seed);
    const auto has = [&](const char* tag) { return std::find(f.begin(), f.end(), tag) != f.end(); };
    const bool fp8_cache = has("dtype=e4m3") || has("fp8_kv_cache_q_bf16") || has("fp8_kv_cache_q_f16");
    if (!fp8_cache) continue;
    ++kept;
    tags.insert(f.begin(), f.end());
    const oracle::Case c = oracle::make_random_case(seed);
    const core::Problem p = core::resolve(c.args);
    if (int64_t{p.seqlen_q} * p.group > 16) {
      ++prefill;
      wide_prefill += std::max(p.headdim, p.headdim_v) > 128;
      mla_prefill += p.headdim_v > 256 || p.has_qv;
    }
  }
  for (const char* tag :
       {"dtype=e4m3", "fp8_kv_cache_q_bf16", "fp8_kv_cache_q_f16", "fp8_descales", "fp8_kv_descales",
        "fp8_rotary", "fp8_kv_rotary", "fp8_kv_append", "fp8_kv_saturating", "paged", "varlen_q",
        "cache_leftpad", "cache_batch_idx", "append_dense", "append_packed", "causal", "window",
        "attention_chunk", "softcap", "sinks_f32", "sinks_bf16", "heads=32/8", "heads=63/7",
        "num_splits=many", "pack_gqa_forced", "fp8_kv_qv", "only_qv", "fp8_kv_q_absent",
        "k_cache_absent", "fp8_kv_headdim_v=512"}) {
    EXPECT_TRUE(tags.count(tag)) << tag;
  }
  EXPECT_GE(prefill, 80);  // 112 of 300
  EXPECT_GE(wide_prefill, 30);  // 67
  EXPECT_GE(mla_prefill, 5);  // 8: the (64, 512) prefill kernel over fp8
}

// FA3's all-fp8 call as the family rule sees it on an H200, opted in: a 4096-row prefill at d 128.
core::FamilyInputs sm90_fp8_inputs() {
  core::FamilyInputs in{90, /*sixteen_bit=*/false, 128, 128, 4096};
  in.max_seqlen_q = 4096;
  in.one_split = true;
  in.fp8_query = in.sm90_fp8 = true;
  return in;
}

// The all-fp8 calls the sm90 family takes (opted in): d == d_v in {64, 128, 256}, its 128 x
// sm90_block_n tile, rung 3's prefill shape; one condition changed at a time, the rest stay sm80.
TEST(KernelFamily, Sm90Fp8RuleRow) {
  for (int d : {64, 128, 256}) {
    core::FamilyInputs in = sm90_fp8_inputs();
    in.headdim = in.headdim_v = d;
    EXPECT_EQ(core::choose_kernel(in), (KernelChoice{KernelFamily::sm90, KernelShape::prefill, d, d})) << d;
    const core::TileSize tile = core::family_tile(KernelFamily::sm90, core::TileInputs{d, d});
    EXPECT_EQ(tile.block_m, 128);
    EXPECT_EQ(tile.block_n, d <= 128 ? 128 : 64);
  }
  const auto with = [](auto change) {
    core::FamilyInputs c = sm90_fp8_inputs();
    change(c);
    return core::kernel_family(c);
  };
  EXPECT_EQ(with([](auto&) {}), KernelFamily::sm90);
  EXPECT_EQ(with([](auto& c) { c.sm90_fp8 = false; }), KernelFamily::sm80);    // not opted in
  EXPECT_EQ(with([](auto& c) { c.fp8_query = false; }), KernelFamily::sm80);   // a 16-bit q over fp8
  EXPECT_EQ(with([](auto& c) { c.sm90_enabled = false; }), KernelFamily::sm80);  // KVFLASH_SM90=0
  EXPECT_EQ(with([](auto& c) { c.arch = 100; }), KernelFamily::sm80);
  EXPECT_EQ(with([](auto& c) { c.headdim = c.headdim_v = 96; }), KernelFamily::sm80);  // 16-bit widths
  EXPECT_EQ(with([](auto& c) { c.headdim = c.headdim_v = 192; }), KernelFamily::sm80);
  EXPECT_EQ(with([](auto& c) { c.headdim = 192, c.headdim_v = 128; }), KernelFamily::sm80);
  EXPECT_EQ(with([](auto& c) { c.headdim_v = 64; }), KernelFamily::sm80);  // d != d_v
  EXPECT_EQ(with([](auto& c) { c.headdim = c.headdim_v = 112; }), KernelFamily::sm80);  // not rounded up
  EXPECT_EQ(with([](auto& c) { c.has_qv = true; }), KernelFamily::sm80);
  EXPECT_EQ(with([](auto& c) { c.max_seqlen_q = 63; }), KernelFamily::sm80);
  EXPECT_EQ(with([](auto& c) { c.one_split = false; }), KernelFamily::sm80);
  EXPECT_EQ(with([](auto& c) { c.page_size = 256, c.has_leftpad = true; }), KernelFamily::sm80);
  EXPECT_EQ(with([](auto& c) { c.page_size = 16; }), KernelFamily::sm90);  // the family's page rule
  EXPECT_EQ(with([](auto& c) { c.page_size = 3; }), KernelFamily::sm80);
}

// Every kernel the opted-in rule gives an all-fp8 call has its sm90 e4m3 row (an e4m3 query over
// the fp8 cache) and is compiled at the tile the planner plans with.
TEST(KernelFamily, EverySm90Fp8KernelHasAnInstantiation) {
  int taken = 0;
  for (int d = 16; d <= 256; d += 16) {
    for (int dv = 16; dv <= 256; dv += 16) {
      core::FamilyInputs in = sm90_fp8_inputs();
      in.headdim = d, in.headdim_v = dv;
      const KernelChoice k = core::choose_kernel(in);
      if (k.family != KernelFamily::sm90) continue;
      ++taken;
      EXPECT_TRUE(in_table(k, DType::e4m3, true)) << d << " x " << dv;
      const core::TileSize planned = core::family_tile(KernelFamily::sm90, core::TileInputs{d, dv}, k.shape);
      const core::TileSize compiled = core::family_tile(KernelFamily::sm90, core::TileInputs{k.headdim, k.headdim_v}, k.shape);
      EXPECT_EQ(planned.block_m, compiled.block_m) << d << " x " << dv;
      EXPECT_EQ(planned.block_n, compiled.block_n) << d << " x " << dv;
    }
  }
  EXPECT_EQ(taken, 3);
}

// The fp8 kernel exists as rung 3's 128-row shape alone: a short prompt that gets the small tiles
// in bf16 gets the 128-row prefill in fp8, in the rule and in the planner.
TEST(KernelFamily, Sm90Fp8NeverGetsSmallTiles) {
  core::FamilyInputs in = sm90_fp8_inputs();
  in.max_seqlen_q = in.middle_row_keys = 512;
  in.sm90_small_tiles = true;
  for (int d : {64, 128}) {
    in.headdim = in.headdim_v = d;
    EXPECT_EQ(core::choose_kernel(in).shape, KernelShape::prefill) << d;
    core::FamilyInputs bf16_call = in;
    bf16_call.sixteen_bit = true, bf16_call.fp8_query = false;
    EXPECT_EQ(core::choose_kernel(bf16_call).shape, KernelShape::prefill_small_tiles) << d;
  }
  const ScopedEnv on("KVFLASH_SM90_FP8", "1");
  PlanKey raw = prefill_key();
  raw.batch = 8, raw.max_seqlen_q = raw.max_seqlen_k = 512;
  const Plan bf16_plan = core::static_plan(core::canonical_key(raw, core::DeviceInfo{132, 90}));
  EXPECT_EQ(bf16_plan.kernel.shape, KernelShape::prefill_small_tiles);
  raw.dtype = DType::e4m3, raw.fp8_query = true;
  const Plan plan = core::static_plan(core::canonical_key(raw, core::DeviceInfo{132, 90}));
  EXPECT_EQ(plan.kernel, (KernelChoice{KernelFamily::sm90, KernelShape::prefill, 128, 128}));
  EXPECT_EQ(plan.block_m, 128);
  EXPECT_EQ(plan.block_n, 128);
  EXPECT_EQ(cuda::rows_per_cta(plan), 128);
}

// The planner, switched on, on all-fp8 prefill keys: the sm90 family's plan (one split, the
// persistent scheduler's semaphore word), the same kernel back from FA3's int32 layout; the calls
// the fp8 kernel does not take stay on sm80.
TEST(KernelFamily, Sm90Fp8PlansAllFp8Prefill) {
  const ScopedEnv on("KVFLASH_SM90_FP8", "1");
  const auto fp8_key = [](auto change, int arch = 90) {
    PlanKey raw = prefill_key();
    raw.dtype = DType::e4m3, raw.fp8_query = true;
    change(raw);
    return core::canonical_key(raw, core::DeviceInfo{132, arch});
  };
  for (int d : {64, 128, 256}) {
    const PlanKey key = fp8_key([d](PlanKey& k) { k.headdim = k.headdim_v = d; });
    Plan plan = core::static_plan(key);
    EXPECT_EQ(plan.kernel, (KernelChoice{KernelFamily::sm90, KernelShape::prefill, d, d})) << d;
    EXPECT_EQ(plan.block_n, core::sm90_block_n(d));
    EXPECT_EQ(plan.num_splits, 1);
    EXPECT_TRUE(plan.has_semaphore);
    core::plan_batches(plan, {core::SeqLengths{4096, 4096}});
    const std::vector<int32_t> fa3 = plan.to_fa3();
    EXPECT_EQ(Plan::from_fa3(fa3.data(), fa3.size(), key).kernel, plan.kernel);
  }
  const auto family = [&](auto change) { return core::static_plan(fp8_key(change)).kernel.family; };
  EXPECT_EQ(family([](PlanKey&) {}), KernelFamily::sm90);
  EXPECT_EQ(family([](PlanKey& k) { k.fp8_query = false; }), KernelFamily::sm80);  // bf16 q over fp8
  EXPECT_EQ(family([](PlanKey& k) { k.headdim = k.headdim_v = 96; }), KernelFamily::sm80);
  EXPECT_EQ(family([](PlanKey& k) { k.headdim = k.headdim_v = 192; }), KernelFamily::sm80);
  EXPECT_EQ(family([](PlanKey& k) { k.headdim_v = 64; }), KernelFamily::sm80);
  EXPECT_EQ(family([](PlanKey& k) { k.headdim = 64, k.headdim_v = 512, k.has_qv = true; }), KernelFamily::sm80);
  EXPECT_EQ(family([](PlanKey& k) { k.max_seqlen_q = 63; }), KernelFamily::sm80);
  EXPECT_EQ(family([](PlanKey& k) { k.num_splits = 2; }), KernelFamily::sm80);
  EXPECT_EQ(family([](PlanKey& k) { k.max_seqlen_q = 64, k.max_seqlen_k = 65536; }), KernelFamily::sm80);  // FA3 splits
  EXPECT_EQ(family([](PlanKey& k) { k.page_size = 256, k.has_leftpad = true; }), KernelFamily::sm80);
  EXPECT_EQ(family([](PlanKey& k) { k.page_size = 256; }), KernelFamily::sm90);
  EXPECT_EQ(core::static_plan(fp8_key([](PlanKey&) {}, 80)).kernel.family, KernelFamily::sm80);  // an A100
}

// An all-fp8 prefill call with its own buffers: 128 query rows, 4 / 2 heads, d 128, a dense cache
// of 256 keys, e4m3 q / caches with their descales, bf16 out; with rotary it appends its 128 new
// rows (rotary needs new k / v) and rotates q.
struct Fp8PrefillCall {
  static constexpr int kRows = 128, kHeads = 4, kHeadsK = 2, kDim = 128, kKeys = 256;
  std::vector<uint8_t> q, k_cache, v_cache, k, v, cos, sin;
  std::vector<uint16_t> out;
  std::vector<float> descales = std::vector<float>(3 * kHeadsK, 0.5f), lse;
  KvCacheArgs args;
  Outputs outputs;

  explicit Fp8PrefillCall(bool rotary)
      : q(kRows * kHeads * kDim), k_cache(kKeys * kHeadsK * kDim), v_cache(k_cache.size()),
        out(q.size()), lse(kHeads * kRows) {
    const DType e4m3 = DType::e4m3;
    args.q = TensorView::contiguous(q.data(), e4m3, {1, kRows, kHeads, kDim});
    args.k_cache = TensorView::contiguous(k_cache.data(), e4m3, {1, kKeys, kHeadsK, kDim});
    args.v_cache = TensorView::contiguous(v_cache.data(), e4m3, {1, kKeys, kHeadsK, kDim});
    args.cache_seqlens_value = kKeys - kRows;
    args.causal = true;
    for (int i : {0, 1, 2}) {
      OptTensor& t = i == 0 ? args.q_descale : i == 1 ? args.k_descale : args.v_descale;
      t = TensorView::contiguous(descales.data() + kHeadsK * i, DType::f32, {1, kHeadsK});
    }
    if (rotary) {
      k.resize(kRows * kHeadsK * kDim), v.resize(k.size()), cos.resize(kKeys * kDim / 2), sin.resize(cos.size());
      args.k = TensorView::contiguous(k.data(), e4m3, {1, kRows, kHeadsK, kDim});
      args.v = TensorView::contiguous(v.data(), e4m3, {1, kRows, kHeadsK, kDim});
      args.rotary_cos = TensorView::contiguous(cos.data(), e4m3, {kKeys, kDim / 2});
      args.rotary_sin = TensorView::contiguous(sin.data(), e4m3, {kKeys, kDim / 2});
    }
    outputs.out = TensorView::contiguous(out.data(), DType::bf16, {1, kRows, kHeads, kDim});
    outputs.softmax_lse = TensorView::contiguous(lse.data(), DType::f32, {1, kHeads, kRows});
  }

  core::Problem problem() const { return planned_problem(args); }
};

// On the sm90 fp8 plan the attention reads q as e4m3: the caller's q itself (no workspace), or
// with rotary a rotated e4m3 copy (1 byte an element); the descales and the bf16 out as on sm80.
// Without the switch the same call converts q to bf16 (2 bytes an element) for the sm80 kernels.
TEST(CudaParams, Sm90Fp8PlanReadsQAsE4m3) {
  const size_t q_elements = size_t(Fp8PrefillCall::kRows) * Fp8PrefillCall::kHeads * Fp8PrefillCall::kDim;
  for (bool rotary : {false, true}) {
    SCOPED_TRACE(rotary ? "rotary" : "no rotary");
    Fp8PrefillCall call(rotary);
    const core::Problem p = call.problem();
    EXPECT_NO_THROW(cuda::check_supported(p, call.outputs));
    EXPECT_TRUE(p.key.fp8_query);
    for (bool opted_in : {true, false}) {
      SCOPED_TRACE(opted_in ? "KVFLASH_SM90_FP8=1" : "KVFLASH_SM90_FP8=0");
      const ScopedEnv env("KVFLASH_SM90_FP8", opted_in ? "1" : "0");
      const Plan plan = core::make_plan(p);
      EXPECT_EQ(plan.kernel.family, opted_in ? KernelFamily::sm90 : KernelFamily::sm80);
      EXPECT_EQ(cuda::reads_fp8_query(p, plan), opted_in);
      const cuda::WorkspaceLayout layout = cuda::workspace_layout(p, plan);
      std::vector<char> workspace(layout.total);
      const cuda::CallParams c = cuda::call_params(p, plan, call.outputs, workspace.data());
      const bool copy = rotary || !opted_in;
      EXPECT_EQ(c.copy_q, copy);
      if (copy) {
        EXPECT_EQ(c.q_copy.src.data, call.q.data());
        EXPECT_EQ(c.attention.q.data, workspace.data() + layout.q_copy);
        EXPECT_EQ(layout.total - layout.q_copy, q_elements * (opted_in ? 1 : 2));
      } else {
        EXPECT_EQ(layout.total, 0u);  // one split, no copy: no workspace at all
        EXPECT_EQ(c.attention.q.data, call.q.data());
        EXPECT_EQ(c.attention.q.token_stride, Fp8PrefillCall::kHeads * Fp8PrefillCall::kDim);
        EXPECT_EQ(c.attention.q.head_stride, Fp8PrefillCall::kDim);
      }
      EXPECT_EQ(c.append, rotary);
      EXPECT_EQ(c.attention.q_descale.data, call.descales.data());
      EXPECT_EQ(c.attention.k_descale.data, call.descales.data() + 2);
      EXPECT_EQ(c.attention.v_descale.data, call.descales.data() + 4);
      EXPECT_EQ(c.attention.out.data, call.out.data());
      EXPECT_EQ(c.out_type, cuda::ElemType::bf16);
      EXPECT_FALSE(c.combine);
    }
  }
}

// The GPU runner's sm90fp8 draws (oracle::sm90_fp8_prefill_limits, kept apart from the rule) are
// exactly the head dims the fp8 kernel takes, all FA3's all-fp8 call with >= 64 query rows; opted
// in, many of them plan the sm90 family (`random N seed sm90fp8` keeps those), densely and paged.
TEST(KernelFamily, GpuRunnerSm90Fp8DrawsReachTheFamily) {
  const oracle::CaseLimits limits = oracle::sm90_fp8_prefill_limits();
  std::set<std::pair<int, int>> drawn(limits.head_dims.begin(), limits.head_dims.end()), taken;
  for (int d = 8; d <= 512; d += 8) {
    for (int dv = 8; dv <= 512; dv += 8) {
      if (core::sm90_fp8_head_dims(d, dv)) taken.insert({d, dv});
    }
  }
  EXPECT_EQ(drawn, taken);
  const ScopedEnv on("KVFLASH_SM90_FP8", "1");
  int sm90 = 0, paged = 0;
  std::set<int> dims;
  for (uint64_t seed = 1; seed <= 200; ++seed) {
    const oracle::Case c = oracle::make_random_case(seed, limits);
    SCOPED_TRACE(oracle::describe(c));
    validate(c.args);
    core::Problem p = core::resolve(c.args);
    EXPECT_TRUE(p.fp8);
    EXPECT_GE(p.seqlen_q, 64);
    p.key = core::plan_key(p, core::DeviceInfo{132, 90});  // as on the runner's H100 / H200
    if (core::make_plan(p).kernel.family != KernelFamily::sm90) continue;
    ++sm90;
    paged += p.paged;
    dims.insert(p.headdim);
  }
  EXPECT_GE(sm90, 50);
  EXPECT_GT(paged, 0);
  EXPECT_EQ(dims, (std::set<int>{64, 128, 256}));
}

}  // namespace
}  // namespace kvflash
