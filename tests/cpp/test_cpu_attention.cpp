// CPU backend, steps 2 and 3 on cases with answers known by hand: one visible key gives its value
// exactly (GQA mapping, d_v != d), sink-only rows, empty sequences, NaN in unused cache slots,
// and split-KV agreeing with no split (including the empty out_accum slices).
#include <gtest/gtest.h>

#include <cmath>

#include "kvflash/kvflash.h"
#include "test_cpu_util.h"

namespace kvflash::cpu_test {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// Each q head sees one key: the output is that key's value bit for bit, LSE the scaled score.
TEST(CpuAttention, SingleKeyGivesItsValueThroughTheGqaGroup) {
  const int h = 4, h_k = 2, d = 64, d_v = 128, s_k = 5;
  HostTensor q(DType::bf16, {1, 1, h, d}), k_cache(DType::bf16, {1, s_k, h_k, d}),
      v_cache(DType::bf16, {1, s_k, h_k, d_v}), out(DType::bf16, {1, 1, h, d_v}), lse(DType::f32, {1, h, 1});
  q.fill_random(1);
  k_cache.fill_random(2);
  v_cache.fill_random(3);
  for (int pos = 1; pos < s_k; ++pos)  // beyond cache_seqlens: never read
    for (int hk = 0; hk < h_k; ++hk)
      for (int c = 0; c < d; ++c) k_cache.set({0, pos, hk, c}, kNaN);
  HostTensor seqlens = int_tensor({1});
  KvCacheArgs args = cache_call(q, k_cache, v_cache, seqlens);
  args.softmax_scale = 0.125f;
  flash_attn_with_kvcache(args, Outputs{out, lse.view()});
  for (int hq = 0; hq < h; ++hq) {
    const int hk = hq / (h / h_k);
    double score = 0.0;
    for (int c = 0; c < d; ++c) score += double(q.get({0, 0, hq, c})) * k_cache.get({0, 0, hk, c});
    EXPECT_NEAR(lse.get({0, hq, 0}), 0.125 * score, 1e-5) << "head " << hq;
    for (int c = 0; c < d_v; ++c) ASSERT_EQ(out.get({0, 0, hq, c}), v_cache.get({0, 0, hk, c})) << "head " << hq;
  }
}

// Causal with 3 queries and 1 key: rows 0 and 1 see nothing (out 0, LSE = sink), row 2 sees the key
// and the sink only enlarges the denominator.
TEST(CpuAttention, SinkOnlyRowsAndSinkInTheDenominator) {
  const int h = 2, d = 16;
  HostTensor q(DType::f32, {1, 3, h, d}), k_cache(DType::f32, {1, 4, h, d}), v_cache(DType::f32, {1, 4, h, d}),
      out(DType::f32, {1, 3, h, d}), lse(DType::f32, {1, h, 3}), sinks(DType::f32, {h});
  q.fill_random(1);
  k_cache.fill_random(2);
  v_cache.fill_random(3);
  sinks.set(0, 0.5f);
  sinks.set(1, -1.0f);
  HostTensor seqlens = int_tensor({1});
  KvCacheArgs args = cache_call(q, k_cache, v_cache, seqlens);
  args.causal = true;
  args.sinks = sinks;
  args.softmax_scale = 0.25f;
  flash_attn_with_kvcache(args, Outputs{out, lse.view()});
  for (int hq = 0; hq < h; ++hq) {
    const double sink = sinks.get(hq);
    for (int i = 0; i < 2; ++i) {
      EXPECT_EQ(lse.get({0, hq, i}), float(sink));
      for (int c = 0; c < d; ++c) EXPECT_EQ(out.get({0, i, hq, c}), 0.0f);
    }
    double score = 0.0;
    for (int c = 0; c < d; ++c) score += double(q.get({0, 2, hq, c})) * k_cache.get({0, 0, hq, c});
    score *= 0.25;
    const double weight = std::exp(score) / (std::exp(score) + std::exp(sink));
    EXPECT_NEAR(lse.get({0, hq, 2}), std::log(std::exp(score) + std::exp(sink)), 1e-5);
    for (int c = 0; c < d; ++c) EXPECT_NEAR(out.get({0, 2, hq, c}), weight * v_cache.get({0, 0, hq, c}), 1e-6);
  }
}

// Sequence 0 has no keys: out 0, LSE -inf. Unused slots of both hold NaN and never leak.
TEST(CpuAttention, EmptySequenceGivesZeroAndMinusInfinity) {
  const int b = 2, h = 2, d = 32, s_k = 64;
  HostTensor q(DType::f16, {b, 3, h, d}), k_cache(DType::f16, {b, s_k, h, d}), v_cache(DType::f16, {b, s_k, h, d}),
      out(DType::f16, {b, 3, h, d}), lse(DType::f32, {b, h, 3});
  q.fill_random(1);
  k_cache.fill(kNaN);
  v_cache.fill(kNaN);
  for (int pos = 0; pos < 40; ++pos)
    for (int hk = 0; hk < h; ++hk)
      for (int c = 0; c < d; ++c) {
        k_cache.set({1, pos, hk, c}, 0.01f * float((pos * 7 + c) % 13));
        v_cache.set({1, pos, hk, c}, 0.1f * float((pos + c) % 5));
      }
  HostTensor seqlens = int_tensor({0, 40});
  KvCacheArgs args = cache_call(q, k_cache, v_cache, seqlens);
  flash_attn_with_kvcache(args, Outputs{out, lse.view()});
  for (int hq = 0; hq < h; ++hq)
    for (int i = 0; i < 3; ++i) {
      EXPECT_EQ(lse.get({0, hq, i}), -kInf);
      EXPECT_TRUE(std::isfinite(lse.get({1, hq, i})));
      for (int c = 0; c < d; ++c) {
        EXPECT_EQ(out.get({0, i, hq, c}), 0.0f);
        EXPECT_TRUE(std::isfinite(out.get({1, i, hq, c})));
      }
    }
}

struct SplitRun {
  HostTensor out, lse;
  Plan plan;
};

// fp32, ragged lengths, GQA, a sliding window: with num_splits = 1 and with a split plan.
SplitRun run_with_splits(int num_splits, bool with_accum) {
  const int b = 3, h = 8, h_k = 2, d = 64, s_q = 4, s_k = 700;
  static HostTensor q(DType::f32, {b, s_q, h, d}), k_cache(DType::f32, {b, s_k, h_k, d}),
      v_cache(DType::f32, {b, s_k, h_k, d});
  static HostTensor seqlens = int_tensor({1, 513, 700});
  static const bool filled = [] {
    q.fill_random(21);
    k_cache.fill_random(22);
    v_cache.fill_random(23);
    return true;
  }();
  (void)filled;
  KvCacheArgs args = cache_call(q, k_cache, v_cache, seqlens);
  args.window_left = 600;
  args.window_right = 1;
  args.num_splits = num_splits;
  SplitRun run{HostTensor(DType::f32, {b, s_q, h, d}), HostTensor(DType::f32, {b, h, s_q}), make_plan(args)};
  args.plan = &run.plan;
  Outputs outputs{run.out, run.lse.view()};
  const OutputSpec spec = output_spec(args, &run.plan);
  if (!with_accum || spec.num_splits <= 1) {
    flash_attn_with_kvcache(args, outputs);
    return run;
  }
  const int splits = spec.num_splits;
  HostTensor out_accum(DType::f32, {splits, b, h, s_q, d}), lse_accum(DType::f32, {splits, b, h, s_q});
  out_accum.fill(kNaN);
  lse_accum.fill(kNaN);
  outputs.out_accum = out_accum.view();
  outputs.softmax_lse_accum = lse_accum.view();
  flash_attn_with_kvcache(args, outputs);
  for (int bi = 0; bi < b; ++bi)
    for (int s = 0; s < splits; ++s)
      for (int hq = 0; hq < h; ++hq)
        for (int i = 0; i < s_q; ++i) {
          const float l = lse_accum.get({s, bi, hq, i});
          EXPECT_FALSE(std::isnan(l)) << "split " << s << " batch " << bi;
          if (s >= run.plan.num_splits_dynamic[size_t(bi)]) {
            EXPECT_EQ(l, -kInf);
            for (int c = 0; c < d; ++c) EXPECT_EQ(out_accum.get({s, bi, hq, i, c}), 0.0f);
          }
        }
  return run;
}

void expect_close(const SplitRun& a, const SplitRun& b) {
  for (int64_t i = 0; i < a.out.numel(); ++i) ASSERT_NEAR(a.out.get(i), b.out.get(i), 2e-6) << "out " << i;
  for (int64_t i = 0; i < a.lse.numel(); ++i) {
    if (a.lse.get(i) == -kInf) ASSERT_EQ(b.lse.get(i), -kInf) << "lse " << i;  // rows with no key
    else ASSERT_NEAR(a.lse.get(i), b.lse.get(i), 2e-5) << "lse " << i;
  }
}

TEST(CpuAttention, SplitKvAgreesWithNoSplit) {
  const SplitRun single = run_with_splits(1, false);
  ASSERT_EQ(single.plan.num_splits, 1);
  const SplitRun split = run_with_splits(6, false);
  ASSERT_GT(split.plan.num_splits, 1) << "the planner did not split; the test needs a split plan";
  expect_close(single, split);
}

TEST(CpuAttention, SplitPartialsInCallerAccumIncludingEmptySlices) {
  const SplitRun single = run_with_splits(1, false);
  const SplitRun split = run_with_splits(6, true);
  expect_close(single, split);
}

// Prefill-like (many query rows, causal, GQA): the task shape follows the thread count, the bits
// of the result must not.
TEST(CpuAttention, ResultsDoNotDependOnTheThreadCount) {
  const int b = 2, h = 6, h_k = 2, d = 40, s_q = 37, s_k = 150;
  HostTensor q(DType::bf16, {b, s_q, h, d}), k_cache(DType::bf16, {b, s_k, h_k, d}),
      v_cache(DType::bf16, {b, s_k, h_k, d});
  q.fill_random(31);
  k_cache.fill_random(32);
  v_cache.fill_random(33);
  HostTensor seqlens = int_tensor({150, 77});
  KvCacheArgs args = cache_call(q, k_cache, v_cache, seqlens);
  args.causal = true;
  std::vector<std::vector<unsigned char>> results;
  for (int threads : {1, 2, 5}) {
    HostTensor out(DType::bf16, {b, s_q, h, d}), lse(DType::f32, {b, h, s_q});
    RunOptions options;
    options.num_threads = threads;
    flash_attn_with_kvcache(args, Outputs{out, lse.view()}, options);
    results.push_back(out.bytes());
    results.back().insert(results.back().end(), lse.bytes().begin(), lse.bytes().end());
  }
  EXPECT_EQ(results[0], results[1]);
  EXPECT_EQ(results[0], results[2]);
}

}  // namespace
}  // namespace kvflash::cpu_test
