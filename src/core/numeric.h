// Scalar conversions between the storage types kvflash takes (fp16, bf16, fp8 e4m3) and float.
// Host only; exact (round to nearest even), NaN and Inf preserved where the format has them.
#pragma once

#include <cstdint>
#include <cstring>

namespace kvflash::core {

inline float bits_to_float(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }
inline uint32_t float_to_bits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }

inline float bf16_to_float(uint16_t h) { return bits_to_float(uint32_t(h) << 16); }

inline uint16_t float_to_bf16(float f) {
  uint32_t u = float_to_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

inline float fp16_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0x1f) return bits_to_float(sign | 0x7f800000u | (mant << 13));
  if (exp == 0) {
    if (mant == 0) return bits_to_float(sign);
    float f = float(mant) * (1.0f / 16777216.0f);  // mant * 2^-24
    return sign ? -f : f;
  }
  return bits_to_float(sign | ((exp + 112) << 23) | (mant << 13));
}

inline uint16_t float_to_fp16(float f) {
  const uint32_t u = float_to_bits(f);
  const uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return uint16_t(sign | 0x7e00u);  // NaN
  if (a >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // overflow (and Inf) -> Inf
  if (a < 0x38800000u) {  // subnormal or zero in fp16: round a * 2^24 to an integer
    const float v = bits_to_float(a) * 16777216.0f;
    const uint32_t r = uint32_t(v);
    const float frac = v - float(r);
    uint32_t m = r + ((frac > 0.5f || (frac == 0.5f && (r & 1u))) ? 1u : 0u);
    return uint16_t(sign | m);
  }
  uint32_t m = a + 0xfffu + ((a >> 13) & 1u) - (112u << 23);
  return uint16_t(sign | (m >> 13));
}

// float8 e4m3fn: 1 sign, 4 exponent (bias 7), 3 mantissa; no Inf; S.1111.111 is NaN; max 448.
inline float e4m3_to_float(uint8_t x) {
  const uint32_t sign = uint32_t(x & 0x80u) << 24;
  const uint32_t exp = (x >> 3) & 0xfu;
  const uint32_t mant = x & 0x7u;
  if (exp == 0xf && mant == 0x7) return bits_to_float(sign | 0x7fc00000u);
  if (exp == 0) {
    const float f = float(mant) * (1.0f / 512.0f);  // mant * 2^-9
    return sign ? -f : f;
  }
  return bits_to_float(sign | ((exp + 120) << 23) | (mant << 20));
}

// Saturating (to +-448), round to nearest even; NaN stays NaN.
inline uint8_t float_to_e4m3(float f) {
  const uint32_t u = float_to_bits(f);
  const uint8_t sign = uint8_t((u >> 24) & 0x80u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return uint8_t(sign | 0x7f);
  const float v = bits_to_float(a);
  if (v >= 448.0f) return uint8_t(sign | 0x7e);
  if (v < 0.015625f) {  // below 2^-6: subnormal, step 2^-9
    const float s = v * 512.0f;
    uint32_t r = uint32_t(s);
    const float frac = s - float(r);
    if (frac > 0.5f || (frac == 0.5f && (r & 1u))) ++r;
    return uint8_t(sign | r);  // r == 8 becomes the smallest normal, which is correct
  }
  uint32_t m = a + 0x7ffffu + ((a >> 20) & 1u);  // round mantissa to 3 bits
  const uint32_t exp = (m >> 23) - 120;
  return uint8_t(sign | (exp << 3) | ((m >> 20) & 0x7u));
}

}  // namespace kvflash::core
