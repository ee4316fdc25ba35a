// The few tensor-core and async-copy instructions the sm80 attention kernels use, as thin inline
// PTX wrappers: mma.sync m16n8k16 (fp32 accumulate), ldmatrix, movmatrix and cp.async with zero
// fill.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <type_traits>

namespace kvflash::cuda {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared, or (valid false) 16 zero bytes, reading nothing from src (which
// must still be a valid address). The ignore-src predicate form: no per-copy byte arithmetic.
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, bool valid) {
  asm volatile(
      "{\n.reg .pred ignore;\nsetp.eq.u32 ignore, %2, 0;\n"
      "cp.async.cg.shared.global [%0], [%1], 16, ignore;\n}\n" ::"r"(dst),
      "l"(src), "r"(int(valid)));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::); }
// Waits until at most kPending of this thread's most recent copy groups are still in flight.
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}
// Zeros as wide as the widest row a kernel copies (d_v 512, 16-bit): rows a copy loop does not
// read point here, so their copies fill zeros with no per-row predicate.
static __device__ __align__(128) uint4 kZeroRow[64] = {};

__device__ __forceinline__ void ldmatrix_x4(uint32_t addr, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t addr, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// The transpose of an 8x8 16-bit matrix held in mma fragment layout (thread l: row l / 4, columns
// 2 (l % 4) and + 1), returned in the same layout.
__device__ __forceinline__ uint32_t movmatrix_trans(uint32_t x) {
  uint32_t y;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
  return y;
}

// D (16x8 fp32) += A (16x16 row) * B (16x8 col).
template <class Elem>
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                          uint32_t b1) {
  if constexpr (std::is_same_v<Elem, __nv_bfloat16>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

template <class Elem>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  if constexpr (std::is_same_v<Elem, __nv_bfloat16>) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  } else {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  }
}

// Storage elements (bf16, fp16, fp8 e4m3) to and from fp32. Into e4m3 to nearest even, saturating
// at +-448 (infinities included), NaN kept: the quantisation rule of contract 5.8
// (cvt.rn.satfinite from sm_89, CUDA's exact emulation of it before).
template <class Elem>
__device__ __forceinline__ float to_float(Elem x) {
  if constexpr (std::is_same_v<Elem, __nv_bfloat16>) return __bfloat162float(x);
  else if constexpr (std::is_same_v<Elem, __nv_fp8_e4m3>) return float(x);
  else return __half2float(x);
}

template <class Elem>
__device__ __forceinline__ Elem from_float(float x) {
  if constexpr (std::is_same_v<Elem, __nv_bfloat16>) return __float2bfloat16_rn(x);
  else if constexpr (std::is_same_v<Elem, __nv_fp8_e4m3>) return __nv_fp8_e4m3(x);
  else return __float2half_rn(x);
}

// Programmatic dependent launch (sm_90+; no-ops before): a kernel launched after this one with
// programmatic stream serialization may start once every CTA here has called launch_dependents,
// and must call wait_for_prerequisites before reading what this grid writes (it returns once the
// grid finished and its writes are visible).
__device__ __forceinline__ void launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void wait_for_prerequisites() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

// 2^x with ex2.approx (exp2(-inf) = 0, which the online softmax relies on).
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

}  // namespace kvflash::cuda
