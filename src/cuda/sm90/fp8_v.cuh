// The sm90 prefill kernel's fp8 e4m3 pieces (FA3's all-fp8 call, prefill_kernel.cuh with
// Elem = __nv_fp8_e4m3): V^T stages for the P V GEMM and P as its 8-bit A operand.
//
// An 8-bit wgmma reads both shared-memory operands K-major: for O = P V that is V^T (head dim x
// keys, keys contiguous), while TMA brings V as (keys x head dim). The producer group's warps 1-3
// (the transposers) turn each V stage into a V^T stage. Keys go into V^T in the order P's
// accumulator holds them, so that P turns into the A operand in place, register by register:
// the A fragment of a 32-key slice gives a thread 4 consecutive K positions (slots) per 16, the
// accumulator 2 + 2 keys 8 apart, so slot 16h + 4q + j of a slice holds key 16h + 8 (j / 2) +
// 2q + j % 2 (h < 2, q = lane % 4, j < 4). The sum over slots of P V is the same sum over keys.
//
// Keys past the sequence's end are written as zeros (their P is 0, but 0 * NaN in an unused cache
// slot would be NaN), as the 16-bit kernel zeroes those V rows.
#pragma once

#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>

namespace kvflash::cuda::sm90 {

using namespace cute;

// The threads of the producer group that transpose V (warps 1-3; warp 0 issues the TMA copies).
constexpr int kTransposeThreads = 96;

__device__ __forceinline__ uint32_t lds32(uint32_t addr) {
  uint32_t v;
  asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(v) : "r"(addr) : "memory");
  return v;
}

__device__ __forceinline__ void sts32(uint32_t addr, uint32_t v) {
  asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
}

__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t selector) {
  uint32_t r;
  asm("prmt.b32 %0, %1, %2, %3;\n" : "=r"(r) : "r"(a), "r"(b), "r"(selector));
  return r;
}

// Key of slot `slot` (< 32) of a 32-key slice (the order above).
__host__ __device__ constexpr int fp8_slot_key(int slot) {
  return (slot / 16) * 16 + ((slot % 4) / 2) * 8 + ((slot / 4) % 4) * 2 + slot % 2;
}

// The slots of a slice hold each of its 32 keys once, and a thread's accumulator values for rows
// r of half h (value (c, r, v): key 8v + 2q + c) are its A fragment's slots 16h + 4q + j in order
// j = c + 2 (v - 2h): what scores_as_a_fp8 relies on.
constexpr bool fp8_slots_match_the_accumulator() {
  unsigned seen = 0;
  for (int slot = 0; slot < 32; ++slot) seen |= 1u << fp8_slot_key(slot);
  for (int q = 0; q < 4; ++q)
    for (int h = 0; h < 2; ++h)
      for (int v = 2 * h; v < 2 * h + 2; ++v)
        for (int c = 0; c < 2; ++c)
          if (fp8_slot_key(16 * h + 4 * q + c + 2 * (v - 2 * h)) != 8 * v + 2 * q + c) return false;
  return seen == 0xffffffffu;
}
static_assert(fp8_slots_match_the_accumulator());

// Byte offset of element (row, col) in an 8-bit K-major tile of kRows x kCols bytes built from
// CuTe's swizzle atoms (ss_smem_selector: 8 rows x W bytes, W = 128, or 64 when a row is 64
// bytes; the atoms down the rows first): the 16-byte chunk of a row XORed with its row in the
// atom (W 64: half of it). Unsigned, so that it compiles to shifts and masks; the traits check it
// against CuTe's layouts (fp8_tile_matches, in transpose_v).
template <int kRows, int kCols>
__host__ __device__ constexpr uint32_t fp8_tile_offset(uint32_t row, uint32_t col) {
  constexpr uint32_t W = kCols % 128 == 0 ? 128 : 64;
  static_assert(kCols % W == 0 && kRows % 8 == 0);
  const uint32_t in_atom = row % 8, swizzle = W == 128 ? in_atom : in_atom / 2;
  const uint32_t chunk = ((col % W) / 16) ^ swizzle;
  return (col / W) * (kRows * W) + (row / 8) * (8 * W) + in_atom * W + chunk * 16 + col % 16;
}

// Whether fp8_tile_offset is CuTe's `Layout` (rows, cols, stages) in stage 1 (stages lie kRows x
// kCols bytes apart) at the first two atoms' rows and the last atom's, at one 4-byte word of each
// 16-byte chunk of a row (a word of each offset in turn): a full check exceeds the compiler's
// constexpr budget, and every other atom repeats these offsets.
template <class Layout, int kRows, int kCols>
constexpr bool fp8_tile_matches() {
  for (int r = 0; r < kRows; r = r == 15 ? kRows - 8 : r + 1) {
    for (int c = 0; c < kCols; c += 16) {
      const int col = c + 4 * ((c / 16) % 4);
      if (uint32_t(Layout{}(r, col, 1)) != kRows * kCols + fp8_tile_offset<kRows, kCols>(r, col)) return false;
    }
  }
  return true;
}

// One V stage into its V^T stage (shared-memory addresses of the stages). A thread's unit: the 4
// slots 16h + 4q .. + 3 of a 32-key slice and 4 channels c0 .. c0 + 3: 4 loads (a key's 4
// channels each), a 4 x 4 byte transpose, 4 stores (a channel's 4 slots each). A warp's 32 lanes
// take the 8 slot groups of one slice times 4 channel groups of 4 (16 channels); the warps walk
// the (slice, 16 channels) pairs. `valid`: the block's keys before the sequence's end.
// Bank spread (d 128: no conflict; d 64 loads and d 256 stores two-way): the lanes of h = 1 take
// the neighbouring 16 channels (16-byte chunk ^ 1), so that their keys, 16 apart and in the same
// swizzle row, hit other banks; lanes with u & 2 store their 4 channels in the order i ^ 2.
template <class T>
__device__ __forceinline__ void transpose_v_stage(uint32_t v_stage, uint32_t vt_stage, int valid, int warp, int lane) {
  constexpr int N = T::kBlockN, D = T::kHeadDimV, kSlices = N / 32, kUnits = kSlices * (D / 16);
  static_assert(D % 32 == 0, "channel chunks in pairs");
  const uint32_t h = lane / 16, q = (lane / 4) % 4, u = lane % 4, flip = u & 2;
  CUTLASS_PRAGMA_NO_UNROLL
  for (int it = warp; it < kUnits; it += kTransposeThreads / 32) {
    const uint32_t slice = uint32_t(it) % kSlices, c0 = ((uint32_t(it) / kSlices) ^ h) * 16 + 4 * u;
    const uint32_t slot0 = 32 * slice + 16 * h + 4 * q;
    uint32_t w[4];
    CUTLASS_PRAGMA_UNROLL
    for (int j = 0; j < 4; ++j) {
      const uint32_t key = 32 * slice + fp8_slot_key(16 * h + 4 * q + j);
      const uint32_t word = lds32(v_stage + fp8_tile_offset<N, D>(key, c0));
      w[j] = int(key) < valid ? word : 0u;
    }
    // o[i] byte j = w[j] byte i: channel c0 + i of the 4 keys, in slot order.
    const uint32_t lo01 = prmt(w[0], w[1], 0x5140), lo23 = prmt(w[2], w[3], 0x5140);
    const uint32_t hi01 = prmt(w[0], w[1], 0x7362), hi23 = prmt(w[2], w[3], 0x7362);
    const uint32_t o[4] = {prmt(lo01, lo23, 0x5410), prmt(lo01, lo23, 0x7632), prmt(hi01, hi23, 0x5410),
                           prmt(hi01, hi23, 0x7632)};
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < 4; ++i) {
      sts32(vt_stage + fp8_tile_offset<D, N>(c0 + (i ^ flip), slot0), flip ? o[i ^ 2] : o[i]);
    }
  }
}

// The transposers' loop over a tile's key blocks (last to first, as the producer loads them): wait
// for V's stage, take the V^T stage once the consumers are done with it, transpose, make the
// writes visible to wgmma (the async proxy), hand V^T to the consumers and V back to the TMA.
template <class T>
__device__ __forceinline__ void transpose_v(typename T::SharedStorage& ss, typename T::Pipeline& pipe_v,
                                            typename T::VtPipeline& pipe_vt, int seqlen_k, int n_first, int n_last) {
  static_assert(fp8_tile_matches<typename T::SmemLayoutV, T::kBlockN, T::kHeadDimV>() &&
                    fp8_tile_matches<typename T::SmemLayoutVt, T::kHeadDimV, T::kBlockN>(),
                "the transposers' addresses are CuTe's V and V^T layouts");
  const int thread = int(threadIdx.x) - 32;
  const uint32_t v_base = cast_smem_ptr_to_uint(ss.v.data()), vt_base = cast_smem_ptr_to_uint(ss.vt.data());
  cutlass::PipelineState<T::kStages> v_state;  // V's consumer: phase 0
  auto vt_state = cutlass::make_producer_start_state<typename T::VtPipeline>();  // V^T's buffers start empty
  for (int n = n_last; n >= n_first; --n) {
    pipe_v.consumer_wait(v_state);
    pipe_vt.producer_acquire(vt_state);
    const uint32_t stage = v_state.index() * uint32_t(T::kBlockN * T::kHeadDimV);
    transpose_v_stage<T>(v_base + stage, vt_base + stage, seqlen_k - n * T::kBlockN, thread / 32, thread % 32);
    cutlass::arch::fence_view_async_shared();
    pipe_vt.producer_commit(vt_state);
    pipe_v.consumer_release(v_state);
    ++v_state;
    ++vt_state;
  }
}

// Four floats as e4m3 bytes (first lowest), to nearest, saturating.
__device__ __forceinline__ uint32_t pack4_e4m3(float a, float b, float c, float d) {
  const uint32_t lo = __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, __NV_E4M3);
  const uint32_t hi = __nv_cvt_float2_to_fp8x2(make_float2(c, d), __NV_SATFINITE, __NV_E4M3);
  return lo | hi << 16;
}

// P (the exponentiated scores, wgmma accumulator order) as the 8-bit A operand of the P V GEMM:
// per 32-key slice ((4, 2, 2) values: slot j, row r (+8), half h (+16 slots)), register
// 4 slice + 2h + r holds slots 16h + 4q + j = accumulator values (j % 2) + 2r + 4 (4 slice + 2h +
// j / 2) (value (c, r, v) of the accumulator is key 8v + 2q + c of row r).
template <class E, class TS>
__device__ __forceinline__ auto scores_as_a_fp8(TS const& tSrS) {
  constexpr int kSlices = decltype(size(tSrS))::value / 16;
  Tensor rP = make_tensor<E>(make_layout(Shape<Shape<_4, _2, _2>, _1, Int<kSlices>>{}));
  uint32_t* regs = reinterpret_cast<uint32_t*>(raw_pointer_cast(rP.data()));
  CUTLASS_PRAGMA_UNROLL
  for (int s = 0; s < kSlices; ++s) {
    CUTLASS_PRAGMA_UNROLL
    for (int h = 0; h < 2; ++h) {
      CUTLASS_PRAGMA_UNROLL
      for (int r = 0; r < 2; ++r) {
        const int c = 16 * s + 8 * h + 2 * r;
        regs[4 * s + 2 * h + r] = pack4_e4m3(tSrS(c), tSrS(c + 1), tSrS(c + 4), tSrS(c + 5));
      }
    }
  }
  return rP;
}

}  // namespace kvflash::cuda::sm90
