#include "cpu/rotary.h"

#include "cpu/convert.h"
#include "cpu/layout.h"

namespace kvflash::cpu {

Rotary::Rotary(const core::Problem& p) : rotary_dim_(p.rotary_dim), interleaved_(p.rotary_interleaved) {
  if (rotary_dim_ > 0) {
    cos_ = &*p.args.rotary_cos;
    sin_ = &*p.args.rotary_sin;
  }
}

void Rotary::rotate(float* x, int position) const {
  if (rotary_dim_ == 0) return;
  const int half = rotary_dim_ / 2;
  float cos_row[256], sin_row[256];  // rotary_dim <= head dim <= 512
  load_row(cos_->dtype, element_at(*cos_, int64_t(position) * cos_->strides[0]), half, cos_row);
  load_row(sin_->dtype, element_at(*sin_, int64_t(position) * sin_->strides[0]), half, sin_row);
  for (int p = 0; p < half; ++p) {
    float& x1 = interleaved_ ? x[2 * p] : x[p];
    float& x2 = interleaved_ ? x[2 * p + 1] : x[p + half];
    const float a = x1, b = x2;
    x1 = a * cos_row[p] - b * sin_row[p];
    x2 = a * sin_row[p] + b * cos_row[p];
  }
}

}  // namespace kvflash::cpu
