// core::FastDivisor (the kernels' page lookups) against integer division: every page size an
// engine uses, awkward ones, powers of two up to 2^30, and the numerators where a rounding error
// would show (0, multiples of d and their neighbours, the top of the int range).
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "core/fast_divisor.h"

namespace kvflash {
namespace {

std::vector<int> divisors() {
  std::vector<int> d;
  for (int i = 1; i <= 1100; ++i) d.push_back(i);
  for (int s = 11; s <= 30; ++s) {
    d.push_back(1 << s);
    d.push_back((1 << s) - 1);
    d.push_back((1 << s) + 1);
  }
  d.push_back(2147483647);
  d.push_back(1000003);
  return d;
}

TEST(FastDivisor, MatchesIntegerDivision) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> any(0, 2147483647);
  int64_t checked = 0;
  for (const int d : divisors()) {
    const core::FastDivisor f(d);
    std::vector<int> n = {0, 1, d - 1, 2147483647, 2147483646, 2147483647 - d};
    for (int64_t k : {int64_t(1), int64_t(2), int64_t(3), int64_t(2147483647) / d}) {
      for (int64_t delta = -1; delta <= 1; ++delta) {
        const int64_t x = k * d + delta;
        if (x >= 0 && x <= 2147483647) n.push_back(int(x));
      }
    }
    for (int i = 0; i < 200; ++i) n.push_back(any(rng));
    for (const int x : n) {
      if (x < 0) continue;
      ASSERT_EQ(f.div(x), x / d) << x << " / " << d;
      ++checked;
    }
  }
  EXPECT_GT(checked, 200000);
}

// A wrong multiplier must show: the check above is not vacuous.
TEST(FastDivisor, OffByOneMultiplierFails) {
  core::FastDivisor f(3);
  f.multiplier -= 1;
  bool differs = false;
  for (int x = 0; x < 2147483647 - 3 && !differs; x += 3 * 4099) differs = f.div(x) != x / 3;
  EXPECT_TRUE(differs);
}

}  // namespace
}  // namespace kvflash
