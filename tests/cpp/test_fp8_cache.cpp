// A 16-bit query over an fp8 e4m3 KV cache (contract 5.8): the quantisation rule of appended rows
// (x / descale in fp32, rounded to nearest even e4m3, saturating at +-448, NaN kept) on chosen
// values, in the CPU backend and in the oracle, and which batch element's descale a row takes.
// The attention itself is covered by the differential test's fp8-cache cases; here only the
// tolerance the oracle gives the CUDA backend's scaled copies of q and qv (qv over an fp8 cache).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "core/numeric.h"
#include "kvflash/kvflash.h"
#include "oracle/oracle.h"
#include "oracle/random_case.h"
#include "oracle/scalar_types.h"
#include "test_cpu_util.h"

namespace kvflash::cpu_test {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// Values y (all exact in bf16 and fp16 once scaled by the descales below) and the e4m3 bits of
// y: the rounding ties go to the even code, everything beyond 448 (infinity too) saturates.
struct Quantised {
  float y;
  uint8_t bits;
};
const std::vector<Quantised> kRule = {
    {448.0f, 0x7e},    {500.0f, 0x7e},     {1e4f, 0x7e},     {-1e4f, 0xfe},
    {kInf, 0x7e},      {-kInf, 0xfe},      {kNaN, 0x7f},     {464.0f, 0x7e},
    {1.0625f, 0x38},   // halfway between 1 and 1.125: to 1 (mantissa 000)
    {1.1875f, 0x3a},   // halfway between 1.125 and 1.25: to 1.25 (mantissa 010)
    {-1.1875f, 0xba},  {240.0f, 0x77},   {0x1p-10f, 0x00},  // half the smallest subnormal: to 0
    {0x1.8p-9f, 0x02},  // halfway between subnormals 1 and 2 (units of 2^-9): to 2
    {0x1p-9f, 0x01},   {-0.0f, 0x80},
};

// One sequence, one KV head, d = 16: the 16 values of kRule appended as one new K row (times
// k_descale) and one new V row (times v_descale) into empty e4m3 caches.
struct RuleCall {
  static constexpr float kKDescale = 2.0f, kVDescale = 0.25f;
  HostTensor q, k_cache, v_cache, k, v, out, k_descale, v_descale, seqlens;
  KvCacheArgs args;

  explicit RuleCall(DType dtype)
      : q(dtype, {1, 1, 1, 16}), k_cache(DType::e4m3, {1, 4, 1, 16}), v_cache(DType::e4m3, {1, 4, 1, 16}),
        k(dtype, {1, 1, 1, 16}), v(dtype, {1, 1, 1, 16}), out(dtype, {1, 1, 1, 16}),
        k_descale(DType::f32, {1, 1}), v_descale(DType::f32, {1, 1}), seqlens(int_tensor({0})) {
    for (int c = 0; c < 16; ++c) {
      k.set(c, kRule[size_t(c)].y * kKDescale);
      v.set(c, kRule[size_t(c)].y * kVDescale);
    }
    k_descale.set(0, kKDescale);
    v_descale.set(0, kVDescale);
    args = cache_call(q, k_cache, v_cache, seqlens);
    args.k = k;
    args.v = v;
    args.k_descale = k_descale;
    args.v_descale = v_descale;
  }
};

class Fp8CacheRule : public ::testing::TestWithParam<DType> {};

TEST_P(Fp8CacheRule, CpuBackendQuantisesAppendedRowsByTheRule) {
  RuleCall call(GetParam());
  flash_attn_with_kvcache(call.args, Outputs{call.out});
  for (int c = 0; c < 16; ++c) {
    EXPECT_EQ(call.k_cache.bytes()[size_t(c)], kRule[size_t(c)].bits) << "k channel " << c;
    EXPECT_EQ(call.v_cache.bytes()[size_t(c)], kRule[size_t(c)].bits) << "v channel " << c;
  }
}

TEST_P(Fp8CacheRule, OracleQuantisesAppendedRowsByTheRule) {
  RuleCall call(GetParam());
  const oracle::OracleResult ref = oracle::run_oracle(call.args);
  ASSERT_EQ(ref.appended.size(), 32u);
  for (const oracle::AppendedElement& e : ref.appended) {
    EXPECT_EQ(e.bits, kRule[size_t(e.offset)].bits)
        << (e.in_v_cache ? "v" : "k") << " channel " << e.offset;
  }
}

INSTANTIATE_TEST_SUITE_P(Query, Fp8CacheRule, ::testing::Values(DType::bf16, DType::f16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

// The backend's rounding (core::float_to_e4m3) and the oracle's (written separately) agree on
// every bf16 and fp16 value divided by a few descales.
TEST(Fp8Cache, BackendAndOracleRoundEveryInputAlike) {
  const float descales[] = {1.0f, 0.37f, 3.1f, 1.0f / 512, 448.0f};
  int checked = 0;
  for (uint32_t bits = 0; bits < 0x10000; ++bits) {
    const float inputs[] = {core::bf16_to_float(uint16_t(bits)), core::fp16_to_float(uint16_t(bits))};
    for (float x : inputs) {
      for (float d : descales) {
        const float scaled = x / d;
        ASSERT_EQ(core::float_to_e4m3(scaled), oracle::float_to_e4m3_saturating(scaled))
            << "x = " << x << ", descale = " << d;
        ++checked;
      }
    }
  }
  EXPECT_EQ(checked, 2 * 5 * 0x10000);
}

// Two sequences whose cache rows are swapped by cache_batch_idx: each row is quantised with the
// descale of its query's batch element, the one attention reads it back with.
TEST(Fp8Cache, AppendedRowTakesItsBatchElementsDescale) {
  HostTensor q(DType::bf16, {2, 1, 1, 16}), k_cache(DType::e4m3, {2, 4, 1, 16}),
      v_cache(DType::e4m3, {2, 4, 1, 16}), k(DType::bf16, {2, 1, 1, 16}), v(DType::bf16, {2, 1, 1, 16}),
      out(DType::bf16, {2, 1, 1, 16}), k_descale(DType::f32, {2, 1}), seqlens = int_tensor({1, 2}),
      batch_idx = int_tensor({1, 0});
  k.fill(3.0f);
  v.fill(3.0f);
  k_descale.set(0, 1.0f);  // batch 0 -> cache row 1: 3 / 1 = 3
  k_descale.set(1, 0.5f);  // batch 1 -> cache row 0: 3 / 0.5 = 6
  KvCacheArgs args = cache_call(q, k_cache, v_cache, seqlens);
  args.k = k;
  args.v = v;
  args.k_descale = k_descale;
  args.cache_batch_idx = batch_idx;
  flash_attn_with_kvcache(args, Outputs{out});
  EXPECT_EQ(k_cache.get({1, 1, 0, 0}), 3.0f);
  EXPECT_EQ(k_cache.get({0, 2, 0, 0}), 6.0f);
  EXPECT_EQ(v_cache.get({1, 1, 0, 0}), 3.0f);  // no v_descale: 1
}

// q as the CUDA backend scales it with qv over an fp8 cache: each element times k_descale[b, hk]
// in fp32, rounded once to q's type; into `bytes` (q's span), viewed with q's shape and strides.
TensorView scaled_q_copy(const KvCacheArgs& a, std::vector<unsigned char>& bytes) {
  const TensorView& q = *a.q;
  int64_t span = 1;
  for (int i = 0; i < q.rank; ++i) span += (q.shape[i] - 1) * q.strides[i];
  bytes.assign(static_cast<const unsigned char*>(q.data), static_cast<const unsigned char*>(q.data) + span * 2);
  TensorView copy = q;
  copy.data = bytes.data();
  const int64_t group = q.shape[2] / a.v_cache->shape[2];
  for (int64_t b = 0; b < q.shape[0]; ++b) {
    for (int64_t i = 0; i < q.shape[1]; ++i) {
      for (int64_t h = 0; h < q.shape[2]; ++h) {
        const auto k_descale = static_cast<float>(oracle::element_value(*a.k_descale, oracle::offset_of(*a.k_descale, {b, h / group})));
        for (int64_t c = 0; c < q.shape[3]; ++c) {
          const int64_t at = oracle::offset_of(q, {b, i, h, c});
          const auto x = static_cast<float>(oracle::element_value(q, at));
          const auto bits = static_cast<uint16_t>(oracle::round_to_storage(q.dtype, x * k_descale));
          std::memcpy(bytes.data() + at * 2, &bits, 2);
        }
      }
    }
  }
  return copy;
}

// The oracle's tolerance covers the CUDA backend's one extra rounding with qv over an fp8 cache
// (oracle::scaled_query_rounding), and needs it: the CPU backend, given q scaled by k_descale and
// rounded to q's type (the CUDA copy) and no k_descale, passes compare() against the call's own
// reference, though its LSE leaves the bound without that term on some cases. (Cases without
// v_descale, rotary, new k / v or varlen q, so that q's copy is the only rounding and the CPU
// can be handed it as q.)
TEST(Fp8Cache, ScaledQueryCopiesAreWithinTheOraclesTolerance) {
  int cases = 0, beyond_fp32_budget = 0;
  for (uint64_t seed = 1; cases < 8 && seed < 40000; ++seed) {
    const std::vector<std::string> f = oracle::random_case_features(seed);
    const auto has = [&](const char* tag) { return std::find(f.begin(), f.end(), tag) != f.end(); };
    if (!has("fp8_kv_qv") || has("only_qv") || has("varlen_q") || has("append_dense") || has("append_packed")) continue;
    oracle::Case c = oracle::make_random_case(seed);
    KvCacheArgs& a = c.args;
    if (a.rotary_cos || !a.k_descale) continue;
    a.v_descale.reset();  // qv's copy would be qv itself
    SCOPED_TRACE(oracle::describe(c));
    ++cases;
    EXPECT_EQ(oracle::scaled_query_rounding(a), a.q->dtype == DType::f16 ? 0x1p-11 : 0x1p-8);
    const oracle::OracleResult ref = oracle::run_oracle(a);
    KvCacheArgs emulated = a;
    std::vector<unsigned char> q_bytes;
    emulated.q = scaled_q_copy(a, q_bytes);
    emulated.k_descale.reset();
    oracle::CaseOutputs run = oracle::allocate_outputs(output_spec(emulated), false);
    flash_attn_with_kvcache(emulated, run.outputs);
    const oracle::Comparison cmp = oracle::compare(c, ref, run.outputs);
    EXPECT_TRUE(cmp.ok) << cmp.first_failure;
    const oracle::Tolerance fp32_only = oracle::tolerance_for(a.q->dtype);
    const float* lse = run.outputs.softmax_lse->ptr<float>();
    bool beyond = false;
    for (int64_t token = 0; token < ref.total_q; ++token) {
      for (int h = 0; h < ref.num_heads; ++h) {
        const int64_t at = ref.lse_index(token, h);
        if (std::isfinite(ref.lse[at]) &&
            std::fabs(lse[at] - ref.lse[at]) > oracle::lse_tolerance(fp32_only, ref, ref.row_index(token, h))) {
          beyond = true;
        }
      }
    }
    beyond_fp32_budget += beyond;
  }
  EXPECT_EQ(cases, 8);
  EXPECT_GT(beyond_fp32_budget, 0);
  EXPECT_EQ(oracle::scaled_query_rounding(KvCacheArgs{}), 0.0);  // no qv
}

// The fp8_tensor_cores profile (the sm90 fp8 kernel's scores from fp8 tensor cores) widens the
// LSE bound by fp8_tensor_core_accumulation(d) times the row's score bound, and by no more: an
// LSE moved by 3/4 of that term passes it and fails any_backend; moved by 3/2 of it, fails both.
// The CPU backend's answer to FA3's all-fp8 prefill calls (drawn as the GPU runner's sm90fp8
// subset draws them) is the unmoved starting point.
TEST(Fp8TensorCores, ProfileWidensTheScoreBoundByTheAccumulationAndNoMore) {
  int cases = 0;
  for (uint64_t seed = 1; cases < 4 && seed < 200; ++seed) {
    oracle::Case c = oracle::make_random_case(seed, oracle::sm90_fp8_prefill_limits());
    if (c.args.q->dtype != DType::e4m3) continue;
    SCOPED_TRACE(oracle::describe(c));
    const oracle::OracleResult ref = oracle::run_oracle(c.args);
    oracle::CaseOutputs run = oracle::allocate_outputs(output_spec(c.args), false);
    flash_attn_with_kvcache(c.args, run.outputs);
    // The finite row of the largest score bound, so that the moves leave any_backend's budget.
    int64_t worst = -1, worst_row = -1;
    for (int64_t token = 0; token < ref.total_q; ++token) {
      for (int h = 0; h < ref.num_heads; ++h) {
        const int64_t at = ref.lse_index(token, h), row = ref.row_index(token, h);
        if (std::isfinite(ref.lse[at]) && (worst < 0 || ref.score_scale[row] > ref.score_scale[worst_row])) {
          worst = at, worst_row = row;
        }
      }
    }
    if (worst < 0 || ref.score_scale[worst_row] < 1.0) continue;
    ++cases;
    const int d = int(c.args.q->size(-1));
    const Plan sm90_plan = [] {
      Plan p;
      p.kernel.family = KernelFamily::sm90;
      return p;
    }();
    EXPECT_EQ(oracle::gpu_tolerance_profile(c.args, sm90_plan), oracle::ToleranceProfile::fp8_tensor_cores);
    EXPECT_EQ(oracle::gpu_tolerance_profile(c.args, Plan{}), oracle::ToleranceProfile::any_backend);
    EXPECT_GT(oracle::fp8_tensor_core_accumulation(d), 0.0);
    auto check = [&](oracle::ToleranceProfile profile) { return oracle::compare(c, ref, run.outputs, nullptr, profile).ok; };
    EXPECT_TRUE(check(oracle::ToleranceProfile::fp8_tensor_cores));
    float& lse = run.outputs.softmax_lse->ptr<float>()[worst];
    const double term = oracle::fp8_tensor_core_accumulation(d) * ref.score_scale[worst_row];
    lse = float(ref.lse[worst] + 0.75 * term);
    EXPECT_TRUE(check(oracle::ToleranceProfile::fp8_tensor_cores));
    EXPECT_FALSE(check(oracle::ToleranceProfile::any_backend));
    lse = float(ref.lse[worst] + 1.5 * term);
    EXPECT_FALSE(check(oracle::ToleranceProfile::fp8_tensor_cores));
  }
  EXPECT_EQ(cases, 4);
}

}  // namespace
}  // namespace kvflash::cpu_test
