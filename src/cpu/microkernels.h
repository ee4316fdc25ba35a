// The two inner loops of attention, reading K/V rows straight from the cache in their storage
// type (converted to fp32 in registers, never through a buffer), for R <= 4 query rows at a time
// so the rows' accumulators stay in registers and each K/V vector loaded serves R rows.
#pragma once

#include <algorithm>
#include <cstdint>

#include "core/numeric.h"
#include "cpu/convert.h"
#include "cpu/simd.h"
#include "kvflash/tensor.h"

namespace kvflash::cpu::KVFLASH_CPU_ISA_NS {

constexpr int kMaxRowsPerTile = 4;

// Element c of a row of storage type T, as float.
template <DType T>
inline float element_as_float(const void* row, int c) {
  if constexpr (T == DType::f32) return static_cast<const float*>(row)[c];
  if constexpr (T == DType::f16) return core::fp16_to_float(static_cast<const uint16_t*>(row)[c]);
  if constexpr (T == DType::bf16) return core::bf16_to_float(static_cast<const uint16_t*>(row)[c]);
  if constexpr (T == DType::e4m3) return core::e4m3_to_float(static_cast<const uint8_t*>(row)[c]);
  return 0.0f;
}

// Elements [c, c + 8) of a row of storage type T, as floats.
template <DType T>
inline Vec8 load8_as_float(const void* row, int c) {
#if KVFLASH_CPU_AVX2
  if constexpr (T == DType::f32) {
    return {_mm256_loadu_ps(static_cast<const float*>(row) + c)};
  } else if constexpr (T == DType::f16) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(row) + c));
    return {_mm256_cvtph_ps(h)};
  } else if constexpr (T == DType::bf16) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(row) + c));
    return {_mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16))};
  } else {
    const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(static_cast<const uint8_t*>(row) + c));
    return {_mm256_i32gather_ps(e4m3_values(), _mm256_cvtepu8_epi32(b), 4)};
  }
#elif KVFLASH_CPU_NEON
  // fp16 through the FCVTL instructions, bf16 by widening shifts (its bits are fp32's top half).
  if constexpr (T == DType::f32) {
    return load8(static_cast<const float*>(row) + c);
  } else if constexpr (T == DType::f16) {
    const float16x8_t h = vreinterpretq_f16_u16(vld1q_u16(static_cast<const uint16_t*>(row) + c));
    return {vcvt_f32_f16(vget_low_f16(h)), vcvt_high_f32_f16(h)};
  } else if constexpr (T == DType::bf16) {
    const uint16x8_t h = vld1q_u16(static_cast<const uint16_t*>(row) + c);
    return {vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(h), 16)), vreinterpretq_f32_u32(vshll_high_n_u16(h, 16))};
  } else {  // e4m3: NEON has no gather; one lookup per lane in the table of all 256 values
    const uint8_t* bytes = static_cast<const uint8_t*>(row) + c;
    const float* table = e4m3_values();
    float x[kLanes];
    for (int i = 0; i < kLanes; ++i) x[i] = table[bytes[i]];
    return load8(x);
  }
#else
  Vec8 r;
  for (int i = 0; i < kLanes; ++i) r.v[i] = element_as_float<T>(row, c + i);
  return r;
#endif
}

// Elements [c, c + 16) of a row of storage type T, as floats.
template <DType T>
inline Vec16 load16_as_float(const void* row, int c) {
#if KVFLASH_CPU_AVX512
  if constexpr (T == DType::f32) {
    return {_mm512_loadu_ps(static_cast<const float*>(row) + c)};
  } else if constexpr (T == DType::f16) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(row) + c));
    return {_mm512_cvtph_ps(h)};
  } else if constexpr (T == DType::bf16) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(row) + c));
    return {_mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16))};
  }
#endif
  return join16(load8_as_float<T>(row, c), load8_as_float<T>(row, c + kLanes));
}

// Elements [c, c + 8) of two rows of storage type T, as floats: row0's in the low half.
template <DType T>
inline Vec16 load2x8_as_float(const void* row0, const void* row1, int c) {
#if KVFLASH_CPU_AVX512
  if constexpr (T == DType::f16 || T == DType::bf16) {
    const __m128i h0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(row0) + c));
    const __m128i h1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(row1) + c));
    const __m256i h = _mm256_inserti128_si256(_mm256_castsi128_si256(h0), h1, 1);
    if constexpr (T == DType::f16) return {_mm512_cvtph_ps(h)};
    else return {_mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16))};
  }
#endif
  return join16(load8_as_float<T>(row0, c), load8_as_float<T>(row1, c));
}

// Cache rows a kernel requests while it computes, one per key it processes (null: none), so
// the misses overlap with the arithmetic a few lines at a time instead of stalling it in one
// burst. They go to L2 (T1): they are read a while later, after this kernel's rows.
struct Ahead {
  const void* const* rows = nullptr;  // nullptr: nothing to prefetch
  int bytes = 0;                      // of each row
};

inline void prefetch_row(const Ahead& ahead, int n) {
  if (ahead.rows == nullptr || ahead.rows[n] == nullptr) return;
  const char* row = static_cast<const char*>(ahead.rows[n]);
  for (int x = 0; x < ahead.bytes; x += 64) __builtin_prefetch(row + x, 0, 2);  // 2: _MM_HINT_T1 on x86
}

// d0[r] / d1[r]: the sums of the low / high eight lanes of both[r] (two keys' dot products).
template <int R>
inline void sum_halves(const Vec16* both, float* d0, float* d1) {
  Vec8 acc0[R], acc1[R];
  for (int r = 0; r < R; ++r) acc0[r] = low8(both[r]), acc1[r] = high8(both[r]);
  if constexpr (R == 4) {  // 8 accumulators: one transposing reduction
    const Vec8 all[8] = {acc0[0], acc0[1], acc0[2], acc0[3], acc1[0], acc1[1], acc1[2], acc1[3]};
    float sums[kLanes];
    store8(sums, hsum8x8(all));
    for (int r = 0; r < R; ++r) d0[r] = sums[r], d1[r] = sums[R + r];
  } else {
    for (int r = 0; r < R; ++r) d0[r] = hsum8(acc0[r]), d1[r] = hsum8(acc1[r]);
  }
}

// s[r][n] (+)= q[r] . keys[n][0..dim) for n in [0, n_keys). Two keys per pass, sharing one
// 16-lane accumulator per row (same per-lane arithmetic as two 8-lane ones, half the FMAs);
// prefetches `ahead` along the way.
template <int R, DType T, bool Accumulate>
inline void dot_rows(const float* const* q, const void* const* keys, const Ahead& ahead, int n_keys, int dim,
                     float* const* s) {
  const int vector_dim = dim / kLanes * kLanes;
  int n = 0;
  for (; n + 2 <= n_keys; n += 2) {
    const void* k0 = keys[n];
    const void* k1 = keys[n + 1];
    prefetch_row(ahead, n);
    prefetch_row(ahead, n + 1);
    // Lanes 0-7 accumulate key n, 8-15 key n + 1.
    Vec16 both[R];
    for (int r = 0; r < R; ++r) both[r] = zero16();
    for (int c = 0; c < vector_dim; c += kLanes) {
      const Vec16 k = load2x8_as_float<T>(k0, k1, c);
      for (int r = 0; r < R; ++r) both[r] = fma16(dup16(q[r] + c), k, both[r]);
    }
    float d0[R], d1[R];
    sum_halves<R>(both, d0, d1);
    for (int r = 0; r < R; ++r) {
      for (int c = vector_dim; c < dim; ++c) {
        d0[r] += q[r][c] * element_as_float<T>(k0, c);
        d1[r] += q[r][c] * element_as_float<T>(k1, c);
      }
      s[r][n] = Accumulate ? s[r][n] + d0[r] : d0[r];
      s[r][n + 1] = Accumulate ? s[r][n + 1] + d1[r] : d1[r];
    }
  }
  for (; n < n_keys; ++n) {
    const void* k0 = keys[n];
    prefetch_row(ahead, n);
    Vec8 acc[R];
    for (int r = 0; r < R; ++r) acc[r] = zero8();
    for (int c = 0; c < vector_dim; c += kLanes) {
      const Vec8 a = load8_as_float<T>(k0, c);
      for (int r = 0; r < R; ++r) acc[r] = fma8(load8(q[r] + c), a, acc[r]);
    }
    for (int r = 0; r < R; ++r) {
      float d = hsum8(acc[r]);
      for (int c = vector_dim; c < dim; ++c) d += q[r][c] * element_as_float<T>(k0, c);
      s[r][n] = Accumulate ? s[r][n] + d : d;
    }
  }
}

// Whether this level computes the scores of bf16 keys with dot_rows_bf16, which reads the query
// as bf16 rows padded to kBf16Columns.
#if KVFLASH_CPU_AVX512_BF16
constexpr bool kBf16Scores = true;
#else
constexpr bool kBf16Scores = false;
#endif
constexpr int kBf16Columns = 16;
// It pays only where few query rows share each key: vdpbf16ps saves converting K to fp32, a cost
// shared by the rows of a tile, but on the Xeon measured (AVX512_BF16/FP16, AMX) it issues at
// under half the FMA rate, fewer multiply-adds per cycle than FMAs: per 32 keys x d 128, 1 row
// 147 ns against 223 (FMA path), 2 rows 305 against 335, 3 rows 480 against 437, 4 rows 477
// against 383.
constexpr int kBf16ScoresMaxRows = 2;

#if KVFLASH_CPU_AVX512_BF16
// Scores of bf16 keys with vdpbf16ps: one instruction multiplies 32 bf16 pairs (exactly, in
// fp32) and adds them to 16 fp32 lanes two at a time, as two FMAs would, so the arithmetic is
// the fp32 path's in another summation order. It treats inputs and results below 2^-126 as 0,
// far inside the tolerances. The query must be bf16 too: the unscaled row (exact in bf16, as q
// is a bf16 tensor), padded with zeros to a multiple of 16 columns; `scale` multiplies each dot
// product afterwards.

// Columns [c, c + 16) of two bf16 rows of `dim` columns, row0's in the low half, 0 past dim.
inline __m512i load2x16_bf16(const void* row0, const void* row1, int c, int dim) {
  const __mmask16 m = __mmask16(_bzhi_u32(0xffffu, unsigned(std::min(dim - c, kBf16Columns))));
  const __m256i h0 = _mm256_maskz_loadu_epi16(m, static_cast<const uint16_t*>(row0) + c);
  const __m256i h1 = _mm256_maskz_loadu_epi16(m, static_cast<const uint16_t*>(row1) + c);
  return _mm512_inserti64x4(_mm512_castsi256_si512(h0), h1, 1);
}

// s[r][n] = scale * (q[r] . keys[n][0..dim)) for n in [0, n_keys), two keys per pass as in
// dot_rows (an odd last key is read twice and its copy dropped); prefetches `ahead`.
template <int R>
inline void dot_rows_bf16(const uint16_t* const* q, const void* const* keys, const Ahead& ahead, int n_keys,
                          int dim, float scale, float* const* s) {
  for (int n = 0; n < n_keys; n += 2) {
    const bool pair = n + 1 < n_keys;
    const void* k0 = keys[n];
    const void* k1 = pair ? keys[n + 1] : k0;
    prefetch_row(ahead, n);
    if (pair) prefetch_row(ahead, n + 1);
    Vec16 both[R];
    for (int r = 0; r < R; ++r) both[r] = zero16();
    for (int c = 0; c < dim; c += kBf16Columns) {
      const __m512bh k = (__m512bh)load2x16_bf16(k0, k1, c, dim);
      for (int r = 0; r < R; ++r) {
        const __m512i qq = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(q[r] + c)));
        both[r].v = _mm512_dpbf16_ps(both[r].v, (__m512bh)qq, k);
      }
    }
    float d0[R], d1[R];
    sum_halves<R>(both, d0, d1);
    for (int r = 0; r < R; ++r) {
      s[r][n] = scale * d0[r];
      if (pair) s[r][n + 1] = scale * d1[r];
    }
  }
}

template <int R>
struct DotBf16Tile {
  static void run(const uint16_t* const* q, const void* const* keys, const Ahead& ahead, int n, int dim, float scale,
                  float* const* s) {
    dot_rows_bf16<R>(q, keys, ahead, n, dim, scale, s);
  }
};
#endif

// acc[r][0..dim) += sum_n p[r][n] * values[n] for n in [0, n_keys). Thirty-two columns per
// pass: 2R independent accumulators in registers (enough chains to hide the FMA latency), each
// broadcast of p serving two FMAs. `ahead` is prefetched a share per pass.
template <int R, DType T>
inline void accumulate_rows(const float* const* p, const void* const* values, const Ahead& ahead, int n_keys,
                            int dim, float* const* acc) {
  constexpr int kWide = 4 * kLanes;
  // Pass i of the wide loop prefetches rows [i * per_pass, (i + 1) * per_pass).
  const int passes = std::max(dim / kWide, 1);
  const int per_pass = (n_keys + passes - 1) / passes;
  int c = 0;
  for (; c + kWide <= dim; c += kWide) {
    const int first = c / kWide * per_pass;
    for (int n = first; n < std::min(first + per_pass, n_keys); ++n) prefetch_row(ahead, n);
    Vec16 a0[R], a1[R];
    for (int r = 0; r < R; ++r) {
      a0[r] = load16(acc[r] + c);
      a1[r] = load16(acc[r] + c + 2 * kLanes);
    }
    for (int n = 0; n < n_keys; ++n) {
      const Vec16 v0 = load16_as_float<T>(values[n], c);
      const Vec16 v1 = load16_as_float<T>(values[n], c + 2 * kLanes);
      for (int r = 0; r < R; ++r) {
        const Vec16 w = splat16(p[r][n]);
        a0[r] = fma16(w, v0, a0[r]);
        a1[r] = fma16(w, v1, a1[r]);
      }
    }
    for (int r = 0; r < R; ++r) {
      store16(acc[r] + c, a0[r]);
      store16(acc[r] + c + 2 * kLanes, a1[r]);
    }
  }
  for (; c + kLanes <= dim; c += kLanes) {
    Vec8 a[R];
    for (int r = 0; r < R; ++r) a[r] = load8(acc[r] + c);
    for (int n = 0; n < n_keys; ++n) {
      const Vec8 v = load8_as_float<T>(values[n], c);
      for (int r = 0; r < R; ++r) a[r] = fma8(splat8(p[r][n]), v, a[r]);
    }
    for (int r = 0; r < R; ++r) store8(acc[r] + c, a[r]);
  }
  for (; c < dim; ++c) {
    for (int n = 0; n < n_keys; ++n) {
      const float v = element_as_float<T>(values[n], c);
      for (int r = 0; r < R; ++r) acc[r][c] += p[r][n] * v;
    }
  }
}

// The row count of a tile (1..kMaxRowsPerTile) as a template argument.
template <template <int> class Kernel, class... Args>
inline void dispatch_rows(int rows, Args&&... args) {
  switch (rows) {
    case 1: Kernel<1>::run(args...); break;
    case 2: Kernel<2>::run(args...); break;
    case 3: Kernel<3>::run(args...); break;
    default: Kernel<4>::run(args...); break;
  }
}

template <template <int, DType> class Kernel, DType T>
struct WithType {
  template <int R>
  using Rows = Kernel<R, T>;
};

// The row count of a tile and the storage type as template arguments.
template <template <int, DType> class Kernel, class... Args>
inline void dispatch_tile(int rows, DType dtype, Args&&... args) {
  switch (dtype) {
    case DType::f32: dispatch_rows<WithType<Kernel, DType::f32>::template Rows>(rows, args...); break;
    case DType::f16: dispatch_rows<WithType<Kernel, DType::f16>::template Rows>(rows, args...); break;
    case DType::bf16: dispatch_rows<WithType<Kernel, DType::bf16>::template Rows>(rows, args...); break;
    default: dispatch_rows<WithType<Kernel, DType::e4m3>::template Rows>(rows, args...); break;
  }
}

template <int R, DType T>
struct DotTile {
  static void run(const float* const* q, const void* const* keys, const Ahead& ahead, int n, int dim,
                  float* const* s) {
    dot_rows<R, T, false>(q, keys, ahead, n, dim, s);
  }
};
template <int R, DType T>
struct DotAddTile {
  static void run(const float* const* q, const void* const* keys, const Ahead& ahead, int n, int dim,
                  float* const* s) {
    dot_rows<R, T, true>(q, keys, ahead, n, dim, s);
  }
};
template <int R, DType T>
struct AccumulateTile {
  static void run(const float* const* p, const void* const* values, const Ahead& ahead, int n, int dim,
                  float* const* acc) {
    accumulate_rows<R, T>(p, values, ahead, n, dim, acc);
  }
};

}  // namespace kvflash::cpu::KVFLASH_CPU_ISA_NS
