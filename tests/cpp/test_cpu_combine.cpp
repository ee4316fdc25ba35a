// kvflash::combine (FA3's flash_attn_combine) on the CPU with hand-made partials.
#include <gtest/gtest.h>

#include <cmath>

#include "kvflash/kvflash.h"
#include "test_cpu_util.h"

namespace kvflash::cpu_test {
namespace {

// Rows (batch 0, token 0, head h) of 2 splits with d = 8:
//   head 0: LSE (0, log 3), outs all 1 and all 5 -> LSE log 4, out 1/4 + 15/4 = 4
//   head 1: both -inf, outs NaN (never read) -> out 0, LSE -inf
//   head 2: (-inf, 2.5), outs NaN and all -3 -> LSE 2.5, out -3
TEST(CpuCombine, MergesThroughLseAndIgnoresEmptySplits) {
  const int splits = 2, h = 3, d = 8;
  HostTensor out_partial(DType::f32, {splits, 1, 1, h, d}), lse_partial(DType::f32, {splits, 1, 1, h});
  HostTensor out(DType::f32, {1, 1, h, d}), lse(DType::f32, {1, 1, h});
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float lses[2][3] = {{0.0f, -kInf, -kInf}, {std::log(3.0f), -kInf, 2.5f}};
  const float outs[2][3] = {{1.0f, nan, nan}, {5.0f, nan, -3.0f}};
  for (int s = 0; s < splits; ++s)
    for (int hq = 0; hq < h; ++hq) {
      lse_partial.set({s, 0, 0, hq}, lses[s][hq]);
      for (int c = 0; c < d; ++c) out_partial.set({s, 0, 0, hq, c}, outs[s][hq]);
    }
  combine(out_partial, lse_partial, out, lse.view());
  EXPECT_NEAR(lse.get({0, 0, 0}), std::log(4.0), 1e-6);
  EXPECT_EQ(lse.get({0, 0, 1}), -kInf);
  EXPECT_EQ(lse.get({0, 0, 2}), 2.5f);
  for (int c = 0; c < d; ++c) {
    EXPECT_NEAR(out.get({0, 0, 0, c}), 4.0f, 1e-6);
    EXPECT_EQ(out.get({0, 0, 1, c}), 0.0f);
    EXPECT_EQ(out.get({0, 0, 2, c}), -3.0f);
  }
}

// Varlen form (splits, total, h, d) into a bf16 out.
TEST(CpuCombine, VarlenFormRoundsToTheOutputType) {
  const int splits = 3, total = 2, h = 1, d = 8;
  HostTensor out_partial(DType::f32, {splits, total, h, d}), lse_partial(DType::f32, {splits, total, h});
  HostTensor out(DType::bf16, {total, h, d});
  for (int s = 0; s < splits; ++s)
    for (int t = 0; t < total; ++t) {
      lse_partial.set({s, t, 0}, t == 0 ? 1.0f : -kInf);
      for (int c = 0; c < d; ++c) out_partial.set({s, t, 0, c}, float(c));
    }
  combine(out_partial, lse_partial, out);
  for (int c = 0; c < d; ++c) {
    EXPECT_NEAR(out.get({0, 0, c}), float(c), 0.02f * float(c));
    EXPECT_EQ(out.get({1, 0, c}), 0.0f);
  }
}

}  // namespace
}  // namespace kvflash::cpu_test
