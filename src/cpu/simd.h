// Eight-lane float vectors for the CPU kernels: AVX2/FMA intrinsics at the avx2 and avx512
// levels, two NEON registers at the neon level (aarch64), a plain array (which the compiler
// vectorises with the baseline's SSE or NEON as it can) at the baseline; sixteen-lane ones (AVX-512 or two eight-lane) for the inner loops. Only what the
// kernels use. Compiled once per level (cpu/isa_target.h), in that level's namespace.
#pragma once

#include <cmath>
#include <cstdint>

#include "cpu/isa_target.h"

namespace kvflash::cpu::KVFLASH_CPU_ISA_NS {

constexpr int kLanes = 8;

#if KVFLASH_CPU_AVX2

struct Vec8 {
  __m256 v;
};
inline Vec8 load8(const float* p) { return {_mm256_loadu_ps(p)}; }
inline void store8(float* p, Vec8 a) { _mm256_storeu_ps(p, a.v); }
inline Vec8 splat8(float x) { return {_mm256_set1_ps(x)}; }
inline Vec8 zero8() { return {_mm256_setzero_ps()}; }
inline Vec8 fma8(Vec8 a, Vec8 b, Vec8 c) { return {_mm256_fmadd_ps(a.v, b.v, c.v)}; }
inline Vec8 mul8(Vec8 a, Vec8 b) { return {_mm256_mul_ps(a.v, b.v)}; }
inline Vec8 add8(Vec8 a, Vec8 b) { return {_mm256_add_ps(a.v, b.v)}; }
inline Vec8 sub8(Vec8 a, Vec8 b) { return {_mm256_sub_ps(a.v, b.v)}; }
// Summed as ((a0+a1)+(a2+a3)) + ((a4+a5)+(a6+a7)), the order hsum8x8 gives every lane, so a dot
// product has the same bits whichever of the two reduced it.
inline float hsum8(Vec8 a) {
  const __m256 t = _mm256_hadd_ps(a.v, a.v);
  const __m256 u = _mm256_hadd_ps(t, t);
  return _mm_cvtss_f32(_mm_add_ss(_mm256_castps256_ps128(u), _mm256_extractf128_ps(u, 1)));
}

// The eight horizontal sums of v[0..8) as one vector (lane i = sum of v[i]): 7 shuffles+adds
// instead of eight separate reductions.
inline Vec8 hsum8x8(const Vec8* v) {
  const __m256 t0 = _mm256_hadd_ps(v[0].v, v[1].v), t1 = _mm256_hadd_ps(v[2].v, v[3].v);
  const __m256 t2 = _mm256_hadd_ps(v[4].v, v[5].v), t3 = _mm256_hadd_ps(v[6].v, v[7].v);
  const __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
  return {_mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31))};
}

// exp(x) for x <= 0 (scores minus their running max), within ~2 ulp; NaN stays NaN, large
// negative x gives 0. Cody-Waite reduction x = n ln2 + r, degree-6 polynomial for e^r.
inline Vec8 exp8(Vec8 a) {
  const __m256 lo = _mm256_set1_ps(-87.0f);
  const __m256 x = _mm256_max_ps(lo, a.v);  // NaN in a.v passes through (second operand)
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  __m256 y = _mm256_mul_ps(p, _mm256_castsi256_ps(e));
  // Below the clamp the true value is < 2^-125: flush to 0 so masked-like scores add nothing.
  return {_mm256_blendv_ps(y, _mm256_setzero_ps(), _mm256_cmp_ps(a.v, lo, _CMP_LT_OQ))};
}

#elif KVFLASH_CPU_NEON

struct Vec8 {
  float32x4_t lo, hi;
};
inline Vec8 load8(const float* p) { return {vld1q_f32(p), vld1q_f32(p + 4)}; }
inline void store8(float* p, Vec8 a) { vst1q_f32(p, a.lo), vst1q_f32(p + 4, a.hi); }
inline Vec8 splat8(float x) { return {vdupq_n_f32(x), vdupq_n_f32(x)}; }
inline Vec8 zero8() { return splat8(0.0f); }
inline Vec8 fma8(Vec8 a, Vec8 b, Vec8 c) { return {vfmaq_f32(c.lo, a.lo, b.lo), vfmaq_f32(c.hi, a.hi, b.hi)}; }
inline Vec8 mul8(Vec8 a, Vec8 b) { return {vmulq_f32(a.lo, b.lo), vmulq_f32(a.hi, b.hi)}; }
inline Vec8 add8(Vec8 a, Vec8 b) { return {vaddq_f32(a.lo, b.lo), vaddq_f32(a.hi, b.hi)}; }
inline Vec8 sub8(Vec8 a, Vec8 b) { return {vsubq_f32(a.lo, b.lo), vsubq_f32(a.hi, b.hi)}; }
// Pairwise adds give ((a0+a1)+(a2+a3)) + ((a4+a5)+(a6+a7)), the avx2 level's order: a dot
// product has the same bits whichever of hsum8 / hsum8x8 reduced it.
inline float32x4_t pairs8(Vec8 a) { return vpaddq_f32(a.lo, a.hi); }  // a0+a1, a2+a3, a4+a5, a6+a7
inline float hsum8(Vec8 a) {
  const float32x4_t quads = vpaddq_f32(pairs8(a), pairs8(a));
  return vgetq_lane_f32(quads, 0) + vgetq_lane_f32(quads, 1);
}

// The eight horizontal sums of v[0..8) as one vector (lane i = sum of v[i]): three rounds of
// pairwise adds, 14 instructions instead of eight separate reductions.
inline Vec8 hsum8x8(const Vec8* v) {
  float32x4_t quads[4];  // quads[i]: v[2i]'s two half sums, then v[2i + 1]'s
  for (int i = 0; i < 4; ++i) quads[i] = vpaddq_f32(pairs8(v[2 * i]), pairs8(v[2 * i + 1]));
  return {vpaddq_f32(quads[0], quads[1]), vpaddq_f32(quads[2], quads[3])};
}

// exp(x) for x <= 0, the avx2 level's exp8 lane for lane (same reduction and polynomial); NaN
// stays NaN (vmaxq_f32 returns it), large negative x gives 0.
inline float32x4_t exp4(float32x4_t a) {
  const float32x4_t lo = vdupq_n_f32(-87.0f);
  const float32x4_t x = vmaxq_f32(lo, a);
  const float32x4_t n = vrndnq_f32(vmulq_f32(x, vdupq_n_f32(1.44269504088896341f)));
  float32x4_t r = vfmsq_f32(x, n, vdupq_n_f32(0.693359375f));
  r = vfmsq_f32(r, n, vdupq_n_f32(-2.12194440e-4f));
  float32x4_t p = vdupq_n_f32(1.9875691500e-4f);
  p = vfmaq_f32(vdupq_n_f32(1.3981999507e-3f), p, r);
  p = vfmaq_f32(vdupq_n_f32(8.3334519073e-3f), p, r);
  p = vfmaq_f32(vdupq_n_f32(4.1665795894e-2f), p, r);
  p = vfmaq_f32(vdupq_n_f32(1.6666665459e-1f), p, r);
  p = vfmaq_f32(vdupq_n_f32(5.0000001201e-1f), p, r);
  p = vfmaq_f32(vaddq_f32(r, vdupq_n_f32(1.0f)), p, vmulq_f32(r, r));
  const int32x4_t e = vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(n), vdupq_n_s32(127)), 23);
  const float32x4_t y = vmulq_f32(p, vreinterpretq_f32_s32(e));
  // Below the clamp the true value is < 2^-125: flush to 0 so masked-like scores add nothing.
  return vbslq_f32(vcltq_f32(a, lo), vdupq_n_f32(0.0f), y);
}
inline Vec8 exp8(Vec8 a) { return {exp4(a.lo), exp4(a.hi)}; }

#else  // portable fallback

struct Vec8 {
  float v[kLanes];
};
inline Vec8 load8(const float* p) { Vec8 r; for (int i = 0; i < kLanes; ++i) r.v[i] = p[i]; return r; }
inline void store8(float* p, Vec8 a) { for (int i = 0; i < kLanes; ++i) p[i] = a.v[i]; }
inline Vec8 splat8(float x) { Vec8 r; for (int i = 0; i < kLanes; ++i) r.v[i] = x; return r; }
inline Vec8 zero8() { return splat8(0.0f); }
// A multiply and an add, which the compiler fuses where the baseline has FMA (aarch64); x86-64-v2
// has none, and std::fma would be libm's software fma there (25x slower).
inline Vec8 fma8(Vec8 a, Vec8 b, Vec8 c) {
  for (int i = 0; i < kLanes; ++i) c.v[i] = a.v[i] * b.v[i] + c.v[i];
  return c;
}
inline Vec8 mul8(Vec8 a, Vec8 b) { for (int i = 0; i < kLanes; ++i) a.v[i] *= b.v[i]; return a; }
inline Vec8 add8(Vec8 a, Vec8 b) { for (int i = 0; i < kLanes; ++i) a.v[i] += b.v[i]; return a; }
inline Vec8 sub8(Vec8 a, Vec8 b) { for (int i = 0; i < kLanes; ++i) a.v[i] -= b.v[i]; return a; }
inline float hsum8(Vec8 a) {
  return ((a.v[0] + a.v[1]) + (a.v[2] + a.v[3])) + ((a.v[4] + a.v[5]) + (a.v[6] + a.v[7]));
}
inline Vec8 hsum8x8(const Vec8* v) {
  Vec8 r;
  for (int i = 0; i < kLanes; ++i) r.v[i] = hsum8(v[i]);
  return r;
}
inline Vec8 exp8(Vec8 a) { for (int i = 0; i < kLanes; ++i) a.v[i] = std::exp(a.v[i]); return a; }

#endif

// Sixteen lanes, for loops whose lanes are independent (each lane gets the same operations as
// in two Vec8, so results do not depend on which is used): one AVX-512 register when the build
// targets it, which halves the arithmetic instructions per byte read, else two Vec8. dup16:
// eight floats in both halves.
#if KVFLASH_CPU_AVX512
struct Vec16 {
  __m512 v;
};
inline Vec16 load16(const float* p) { return {_mm512_loadu_ps(p)}; }
inline void store16(float* p, Vec16 a) { _mm512_storeu_ps(p, a.v); }
inline Vec16 splat16(float x) { return {_mm512_set1_ps(x)}; }
inline Vec16 fma16(Vec16 a, Vec16 b, Vec16 c) { return {_mm512_fmadd_ps(a.v, b.v, c.v)}; }
inline Vec16 join16(Vec8 lo, Vec8 hi) { return {_mm512_insertf32x8(_mm512_castps256_ps512(lo.v), hi.v, 1)}; }
inline Vec16 dup16(const float* p) { return {_mm512_broadcast_f32x8(_mm256_loadu_ps(p))}; }
inline Vec8 low8(Vec16 a) { return {_mm512_castps512_ps256(a.v)}; }
inline Vec8 high8(Vec16 a) { return {_mm512_extractf32x8_ps(a.v, 1)}; }
#else
struct Vec16 {
  Vec8 lo, hi;
};
inline Vec16 load16(const float* p) { return {load8(p), load8(p + kLanes)}; }
inline void store16(float* p, Vec16 a) { store8(p, a.lo), store8(p + kLanes, a.hi); }
inline Vec16 splat16(float x) { return {splat8(x), splat8(x)}; }
inline Vec16 fma16(Vec16 a, Vec16 b, Vec16 c) { return {fma8(a.lo, b.lo, c.lo), fma8(a.hi, b.hi, c.hi)}; }
inline Vec16 join16(Vec8 lo, Vec8 hi) { return {lo, hi}; }
inline Vec16 dup16(const float* p) { return {load8(p), load8(p)}; }
inline Vec8 low8(Vec16 a) { return a.lo; }
inline Vec8 high8(Vec16 a) { return a.hi; }
#endif
inline Vec16 zero16() { return splat16(0.0f); }

inline int round_up_lanes(int n) { return (n + kLanes - 1) / kLanes * kLanes; }

}  // namespace kvflash::cpu::KVFLASH_CPU_ISA_NS
