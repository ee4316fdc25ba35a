// Division of a non-negative int by a divisor fixed for a whole call (the page size) as one
// 32 x 32 -> 64-bit multiply and a shift: the kernels' page lookups run once per 16 keys of every
// warp, where a general integer division costs ~25 instructions on the GPU. Host and device; the
// host builds it once per call (cuda/host/call_params.cpp).
//
// With s = ceil(log2 d) and m = ceil(2^(31 + s) / d) (< 2^32 because d > 2^(s - 1)), for every
// 0 <= n < 2^31: floor(n m / 2^(31 + s)) = floor(n / d). Write m d = 2^(31 + s) + e, 0 <= e < d;
// then n m / 2^(31 + s) = n / d + n e / (d 2^(31 + s)), and the second term is below
// 2^31 d / (d 2^(31 + s)) = 2^-s <= 1 / d, too little to carry n / d past the next integer
// (its fraction is at most (d - 1) / d).
#pragma once

#include <cstdint>

#include "core/limits.h"

namespace kvflash::core {

struct FastDivisor {
  int divisor = 1;  // d itself: the one copy of it, so that d and its multiplier never disagree
  uint32_t multiplier = 1u << 31;
  int shift = 31;  // 31 + s

  FastDivisor() = default;
  // d >= 1.
  explicit FastDivisor(int d) : divisor(d) {
    int s = 0;
    while ((int64_t(1) << s) < d) ++s;
    shift = 31 + s;
    multiplier = uint32_t(((uint64_t(1) << shift) + uint64_t(d) - 1) / uint64_t(d));
  }

  // floor(n / d) for 0 <= n < 2^31.
  KVFLASH_HD int div(int n) const { return int((uint64_t(uint32_t(n)) * multiplier) >> shift); }
};

}  // namespace kvflash::core
