// A 16-bit query over an fp8 e4m3 KV cache (contract 5.8): the quantisation rule of appended rows
// (x / descale in fp32, rounded to nearest even e4m3, saturating at +-448, NaN kept) on chosen
// values, in the CPU backend and in the oracle, and which batch element's descale a row takes.
// The attention itself is covered by the differential test's fp8-cache cases.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "core/numeric.h"
#include "kvflash/kvflash.h"
#include "oracle/oracle.h"
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

}  // namespace
}  // namespace kvflash::cpu_test
