// Rotary embedding of one fp32 row (contract 5.2): pairs of the first rotary_dim channels, GPT-J
// interleaved (2p, 2p+1) or NeoX halves (p, p + rotary_dim/2), rotated by cos/sin at a position.
#pragma once

#include "core/problem.h"

namespace kvflash::cpu {

class Rotary {
 public:
  explicit Rotary(const core::Problem& p);
  bool enabled() const { return rotary_dim_ > 0; }
  // Rotates x[0..rotary_dim) in fp32 at `position` (a row of rotary_cos / rotary_sin).
  void rotate(float* x, int position) const;

 private:
  const TensorView* cos_ = nullptr;
  const TensorView* sin_ = nullptr;
  int rotary_dim_ = 0;
  bool interleaved_ = true;
};

}  // namespace kvflash::cpu
