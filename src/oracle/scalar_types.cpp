#include "scalar_types.h"

#include <cmath>
#include <cstring>
#include <algorithm>
#include <limits>
#include <stdexcept>

namespace kvflash::oracle {

double f16_to_double(uint16_t bits) {
  const int sign = bits >> 15;
  const int exponent = (bits >> 10) & 0x1f;
  const int mantissa = bits & 0x3ff;
  double magnitude;
  if (exponent == 0x1f) {
    magnitude = mantissa ? std::numeric_limits<double>::quiet_NaN()
                         : std::numeric_limits<double>::infinity();
  } else if (exponent == 0) {
    magnitude = std::ldexp(static_cast<double>(mantissa), -24);
  } else {
    magnitude = std::ldexp(static_cast<double>(1024 + mantissa), exponent - 25);
  }
  return sign ? -magnitude : magnitude;
}

double bf16_to_double(uint16_t bits) {
  // bf16 is the upper half of an fp32.
  const uint32_t widened = static_cast<uint32_t>(bits) << 16;
  float value;
  std::memcpy(&value, &widened, sizeof value);
  return value;
}

double e4m3_to_double(uint8_t bits) {
  // OCP e4m3fn: bias 7, no infinities, S.1111.111 is NaN.
  const int sign = bits >> 7;
  const int exponent = (bits >> 3) & 0xf;
  const int mantissa = bits & 0x7;
  double magnitude;
  if (exponent == 0xf && mantissa == 0x7) {
    magnitude = std::numeric_limits<double>::quiet_NaN();
  } else if (exponent == 0) {
    magnitude = std::ldexp(static_cast<double>(mantissa), -9);
  } else {
    magnitude = std::ldexp(static_cast<double>(8 + mantissa), exponent - 10);
  }
  return sign ? -magnitude : magnitude;
}

uint16_t float_to_f16(float x) {
  const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  if (std::isnan(x)) return 0x7e00;
  const double magnitude = std::fabs(static_cast<double>(x));
  if (magnitude >= 65520.0) return sign | 0x7c00;  // rounds to infinity
  int exponent;
  std::frexp(magnitude, &exponent);  // magnitude = m * 2^exponent, m in [0.5, 1)
  exponent -= 1;                     // now magnitude in [2^exponent, 2^(exponent+1))
  if (magnitude == 0.0 || exponent < -14) {
    // Subnormal: units of 2^-24; a result of 1024 is the smallest normal, bits line up.
    return sign | static_cast<uint16_t>(std::nearbyint(magnitude * 0x1p24));
  }
  auto significand = static_cast<int>(std::nearbyint(std::ldexp(magnitude, 10 - exponent)));
  if (significand == 2048) {
    significand = 1024;
    exponent += 1;
  }
  return sign | static_cast<uint16_t>(((exponent + 15) << 10) | (significand - 1024));
}

uint8_t float_to_e4m3(float x) {
  const uint8_t sign = std::signbit(x) ? 0x80 : 0;
  const double magnitude = std::fabs(static_cast<double>(x));
  if (std::isnan(x) || magnitude >= 464.0) return sign | 0x7f;  // e4m3fn has no infinity
  int exponent;
  std::frexp(magnitude, &exponent);
  exponent -= 1;
  if (magnitude == 0.0 || exponent < -6) {
    return sign | static_cast<uint8_t>(std::nearbyint(magnitude * 0x1p9));  // subnormal: 2^-9 units
  }
  auto significand = static_cast<int>(std::nearbyint(std::ldexp(magnitude, 3 - exponent)));
  if (significand == 16) {
    significand = 8;
    exponent += 1;
  }
  return sign | static_cast<uint8_t>(((exponent + 7) << 3) | (significand - 8));
}

uint8_t float_to_e4m3_saturating(float x) {
  if (std::isnan(x)) return float_to_e4m3(x);
  return float_to_e4m3(std::clamp(x, -448.0f, 448.0f));  // 448: e4m3fn's largest finite value
}

uint16_t float_to_bf16(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  if (std::isnan(x)) return static_cast<uint16_t>((bits >> 16) | 0x40);
  const uint32_t round_half_even = 0x7fff + ((bits >> 16) & 1);
  return static_cast<uint16_t>((bits + round_half_even) >> 16);
}

size_t storage_bytes(DType dtype) {
  switch (dtype) {
    case DType::f16:
    case DType::bf16: return 2;
    case DType::e4m3: return 1;
    case DType::f64: return 8;
    default: return 4;
  }
}

uint32_t element_bits(const TensorView& t, int64_t offset) {
  const auto* base = static_cast<const unsigned char*>(t.data);
  const size_t size = storage_bytes(t.dtype);
  uint32_t bits = 0;
  std::memcpy(&bits, base + offset * static_cast<int64_t>(size), size);  // little-endian host
  return bits;
}

void store_bits(const TensorView& t, int64_t offset, uint32_t bits) {
  auto* base = static_cast<unsigned char*>(t.data);
  const size_t size = storage_bytes(t.dtype);
  std::memcpy(base + offset * static_cast<int64_t>(size), &bits, size);
}

double bits_value(DType dtype, uint32_t bits) {
  switch (dtype) {
    case DType::f32: {
      float value;
      std::memcpy(&value, &bits, sizeof value);
      return value;
    }
    case DType::f16: return f16_to_double(static_cast<uint16_t>(bits));
    case DType::bf16: return bf16_to_double(static_cast<uint16_t>(bits));
    case DType::e4m3: return e4m3_to_double(static_cast<uint8_t>(bits));
    case DType::i32: return static_cast<int32_t>(bits);
    case DType::f64: break;
  }
  throw std::logic_error("oracle: no value reading for this dtype");
}

double element_value(const TensorView& t, int64_t offset) {
  if (t.dtype == DType::f64) return static_cast<const double*>(t.data)[offset];
  return bits_value(t.dtype, element_bits(t, offset));
}

uint32_t round_to_storage(DType dtype, float x) {
  switch (dtype) {
    case DType::f32: {
      uint32_t bits;
      std::memcpy(&bits, &x, sizeof bits);
      return bits;
    }
    case DType::f16: return float_to_f16(x);
    case DType::bf16: return float_to_bf16(x);
    case DType::e4m3: return float_to_e4m3(x);
    default: break;
  }
  throw std::logic_error("oracle: no rounding to this dtype");
}

double ulp(DType dtype, double x) {
  int mantissa_bits = 23, min_exponent = -126;
  switch (dtype) {
    case DType::f32: break;
    case DType::f16: mantissa_bits = 10; min_exponent = -14; break;
    case DType::bf16: mantissa_bits = 7; min_exponent = -126; break;
    case DType::e4m3: mantissa_bits = 3; min_exponent = -6; break;
    default: throw std::logic_error("oracle: no ulp for this dtype");
  }
  int exponent;
  std::frexp(std::fabs(x), &exponent);
  exponent = std::max(exponent - 1, min_exponent);
  return std::ldexp(1.0, exponent - mantissa_bits);
}

int64_t offset_of(const TensorView& t, std::initializer_list<int64_t> index) {
  int64_t offset = 0;
  int dim = 0;
  for (int64_t i : index) offset += i * t.strides[dim++];
  return offset;
}

int32_t int_at(const TensorView& t, int64_t i) {
  return static_cast<const int32_t*>(t.data)[i * t.strides[0]];
}

}  // namespace kvflash::oracle
