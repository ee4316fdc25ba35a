// Defaults the spec leaves to the implementation: the softmax scale when only_qv drops q.
// FA3's Python default is (d + d_v) ** -0.5 when qv is given; with only_qv and no q the scores
// are qv.v alone, so kvflash takes d_v ** -0.5 (documented in the README).
#include <gtest/gtest.h>

#include <cmath>
#include <deque>
#include <optional>
#include <random>
#include <vector>

#include "validation_call.h"

namespace kvflash::testing {
namespace {

void fill_random(const TensorView& t, std::mt19937& rng) {
  std::normal_distribution<float> normal;
  for (int64_t i = 0; i < t.numel(); ++i) t.ptr<float>()[i] = normal(rng);
}

// softmax_lse of the call with the given scale (nullopt: the default).
std::vector<float> lse_with_scale(Call& call, std::optional<float> scale) {
  call.args.softmax_scale = scale;
  flash_attn_with_kvcache(call.args, call.outputs);
  const TensorView& lse = *call.outputs.softmax_lse;
  return std::vector<float>(lse.ptr<float>(), lse.ptr<float>() + lse.numel());
}

Call& qv_call(std::mt19937& rng, bool drop_q) {
  static std::deque<Call> calls;
  Call& call = calls.emplace_back(CallDims{.headdim = 64, .headdim_v = 256, .qv = true});
  for (const OptTensor* t : {&call.args.q, &call.args.k_cache, &call.args.v_cache, &call.args.qv}) {
    fill_random(**t, rng);
  }
  call.args.only_qv = drop_q;
  if (drop_q) call.args.q.reset();
  return call;
}

TEST(Defaults, OnlyQvWithoutQScalesByHeaddimV) {
  std::mt19937 rng(7);
  Call& call = qv_call(rng, true);
  const std::vector<float> by_default = lse_with_scale(call, std::nullopt);
  EXPECT_EQ(by_default, lse_with_scale(call, 1.0f / std::sqrt(256.0f)));
  EXPECT_NE(by_default, lse_with_scale(call, 1.0f / std::sqrt(64.0f + 256.0f)));
}

TEST(Defaults, QvScalesByBothHeadDims) {
  std::mt19937 rng(8);
  Call& call = qv_call(rng, false);
  const std::vector<float> by_default = lse_with_scale(call, std::nullopt);
  EXPECT_EQ(by_default, lse_with_scale(call, 1.0f / std::sqrt(64.0f + 256.0f)));
  EXPECT_NE(by_default, lse_with_scale(call, 1.0f / std::sqrt(256.0f)));
}

}  // namespace
}  // namespace kvflash::testing
