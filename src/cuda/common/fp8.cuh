// fp8 e4m3 on the portable kernels (contract 5.8): the cache element types an instantiation reads,
// the on-the-fly conversion of cache chunks into the query's 16-bit type and the descales (the
// saturating quantisation of new rows is mma.cuh's from_float<e4m3>).
//
// e4m3 values are exact in fp16 and bf16, so a K / V chunk converted on its way into shared memory
// feeds the same mma as a 16-bit cache; the descales are fp32 factors folded into the score scale
// (k_descale, and q_descale for an fp8 query) and the output scale (v_descale), never into the
// elements.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <type_traits>

#include "cuda/common/mma.cuh"
#include "cuda/common/params.h"

namespace kvflash::cuda {

using e4m3 = __nv_fp8_e4m3;

// An instantiation's row type: a 16-bit type names both the query's and the cache's element;
// E4m3Cache<Q> a query of type Q over an fp8 e4m3 cache (an fp8 query is converted to bf16 before
// the attention kernel: it runs E4m3Cache<bf16>).
template <class Query>
struct E4m3Cache {};

template <class Row>
struct RowTypes {
  using Query = Row;
  using Cache = Row;
};
template <class Q>
struct RowTypes<E4m3Cache<Q>> {
  using Query = Q;
  using Cache = e4m3;
};

// The descale of batch element b, KV head hk (1 when absent).
__device__ __forceinline__ float descale_at(const DescaleView& d, int b, int hk) {
  return d.data ? d.data[b * d.batch_stride + hk * d.head_stride] : 1.0f;
}

// Two e4m3 values (the low 16 bits of `pair`, first value lowest) as fp16, exactly. From sm_89
// one cvt; before, CUDA's emulation loops over subnormals, so bits instead: e4m3's 7 magnitude
// bits shifted into fp16's exponent and mantissa fields are the value times 2^-8 (subnormals
// included, fp16 keeping its subnormals), times 256 exactly in fp16; e4m3's NaN (magnitude 0x7f)
// becomes fp16's NaN.
__device__ __forceinline__ __half2 e4m3x2_to_half2(uint32_t pair) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  return __half2(__nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(pair), __NV_E4M3));
#else
  const uint32_t spread = (pair & 0xffu) | ((pair & 0xff00u) << 8);  // one byte per 16-bit lane
  const uint32_t magnitude = spread & 0x007f007fu;
  const uint32_t bits = ((spread & 0x00800080u) << 8) | (magnitude << 7);
  const __half2 scaled = __hmul2(*reinterpret_cast<const __half2*>(&bits), __float2half2_rn(256.0f));
  const uint32_t nan_lanes = __vcmpeq2(magnitude, 0x007f007fu);  // 0xffff: an fp16 NaN
  const uint32_t out = *reinterpret_cast<const uint32_t*>(&scaled) | nan_lanes;
  return *reinterpret_cast<const __half2*>(&out);
#endif
}

// Four e4m3 values (first value lowest) as two fp16 pairs, bytes 0-1 in .x and 2-3 in .y,
// exactly. From sm_89 the upper pair's cvt reads the word's high half directly (no shift).
__device__ __forceinline__ uint2 e4m3x4_to_half2x2(uint32_t four) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  uint2 h;
  asm("{\n.reg .b16 lo, hi;\nmov.b32 {lo, hi}, %2;\ncvt.rn.f16x2.e4m3x2 %0, lo;\ncvt.rn.f16x2.e4m3x2 %1, hi;\n}\n"
      : "=r"(h.x), "=r"(h.y)
      : "r"(four));
  return h;
#else
  const __half2 lo = e4m3x2_to_half2(four), hi = e4m3x2_to_half2(four >> 16);
  return make_uint2(*reinterpret_cast<const uint32_t*>(&lo), *reinterpret_cast<const uint32_t*>(&hi));
#endif
}

// Two e4m3 values (the low 16 bits of `pair`, first value lowest) as a packed pair of Elem, exactly.
template <class Elem>
__device__ __forceinline__ uint32_t e4m3x2_to(uint32_t pair) {
  const __half2 h = e4m3x2_to_half2(pair);
  if constexpr (std::is_same_v<Elem, __half>) {
    return *reinterpret_cast<const uint32_t*>(&h);
  } else {
    const float2 f = __half22float2(h);
    return pack2<Elem>(f.x, f.y);
  }
}

// Eight e4m3 values (8 bytes) as eight Elem (16 bytes), exactly.
template <class Elem>
__device__ __forceinline__ uint4 e4m3x8_to(uint2 raw) {
  return make_uint4(e4m3x2_to<Elem>(raw.x), e4m3x2_to<Elem>(raw.x >> 16), e4m3x2_to<Elem>(raw.y),
                    e4m3x2_to<Elem>(raw.y >> 16));
}

// One chunk of 8 elements, global -> shared as Elem (valid false: zeros, reading nothing from src,
// which must still be a valid address). A 16-bit cache's chunk is a 16-byte cp.async; an fp8
// chunk is an 8-byte load converted on the way (a plain store: the kernels' barriers that follow
// the cp.async waits also order it).
template <class Elem, class Src>
__device__ __forceinline__ void load_chunk(Elem* dst, const Src* src, bool valid) {
  if constexpr (std::is_same_v<Src, Elem>) {
    cp_async_16(smem_addr(dst), src, valid);
  } else {
    static_assert(std::is_same_v<Src, e4m3>, "a 16-bit element or an fp8 cache");
    const uint2 raw = valid ? *reinterpret_cast<const uint2*>(src) : make_uint2(0u, 0u);
    *reinterpret_cast<uint4*>(dst) = e4m3x8_to<Elem>(raw);
  }
}

}  // namespace kvflash::cuda
