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

// P = exp2(score - max + kFp8MaxOffset) in [0, 2^8]: e4m3 (up to 448) then keeps the terms down
// to 2^-17 of the row's largest, not 2^-9 (FA3's offset; RowSoftmax takes it out of the sum).
constexpr int kFp8MaxOffset = 8;

// The threads of the producer group that transpose V (warps 1-3; warp 0 issues the TMA copies).
constexpr int kTransposeThreads = 96;

// PTX prmt.b32 (default mode): byte i of the result is byte selector[4i..4i+3] of {b, a} (a's bytes
// 0-3, b's 4-7). On the host, the same by hand (tests/cuda/sm90_fp8_layouts.cu).
__host__ __device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t selector) {
#ifdef __CUDA_ARCH__
  uint32_t r;
  asm("prmt.b32 %0, %1, %2, %3;\n" : "=r"(r) : "r"(a), "r"(b), "r"(selector));
  return r;
#else
  const uint64_t both = uint64_t(b) << 32 | a;
  uint32_t r = 0;
  for (int i = 0; i < 4; ++i) r |= uint32_t(both >> (8 * ((selector >> (4 * i)) & 7)) & 0xff) << (8 * i);
  return r;
#endif
}

// Key of slot `slot` (< 32) of a 32-key slice (the order above).
__host__ __device__ constexpr int fp8_slot_key(int slot) {
  return (slot / 16) * 16 + ((slot % 4) / 2) * 8 + ((slot / 4) % 4) * 2 + slot % 2;
}

// Byte offset of element (row, col) in an 8-bit K-major tile of kRows x kCols bytes built from
// CuTe's swizzle atoms (ss_smem_selector: 8 rows x W bytes, W = 128, or 64 when a row is 64
// bytes; the atoms down the rows first): the 16-byte chunk of a row XORed with its row in the
// atom (W 64: half of it). Unsigned, so that it compiles to shifts and masks;
// tests/cuda/sm90_fp8_layouts.cu checks it against CuTe's layouts.
template <int kRows, int kCols>
__host__ __device__ constexpr uint32_t fp8_tile_offset(uint32_t row, uint32_t col) {
  constexpr uint32_t W = kCols % 128 == 0 ? 128 : 64;
  static_assert(kCols % W == 0 && kRows % 8 == 0);
  const uint32_t swizzle = W == 128 ? row % 8 : row % 8 / 2;
  const uint32_t chunk = ((col % W) / 16) ^ swizzle;
  return (col / W) * (kRows * W) + row * W + chunk * 16 + col % 16;
}

// The matrix transposer: a warp moves a group of 32 keys (one slice) x 16 channels (one 16-byte
// chunk) with one ldmatrix.x4.trans and one stmatrix.x4, 512 bytes each: 25 SASS instructions per
// 512 bytes. It replaced (session 25) a transposer of 32-bit words, 4 loads, a 4 x 4 byte transpose
// of 6 prmt and 4 stores per 512 bytes and their address arithmetic (51 instructions: a quarter of
// the kernel's in session 24's ncu, on the consumers' schedulers); on an H100, 16k x 16k: d 128
// 658 -> 772 TFLOP/s, d 256 717 -> 899, d 64 462 -> 492 (BENCHMARKS.md, session 25).
//  - ldmatrix: lane l gives the row of key 32 slice + l (matrix l / 8, keys 8 m .. 8 m + 7 of the
//    slice) at the group's chunk. Transposed in 16-bit units, thread t (c = t / 4, q = t % 4) gets
//    from matrix m the channel pair 16 g + 2c, +1 of keys 8m + 2q, 8m + 2q + 1 (bytes: key 2q's
//    two channels, then key 2q + 1's).
//  - prmt 0x6420 of matrices (0, 1) gives channel 2c's keys 2q, 2q + 1, 8 + 2q, 9 + 2q: the slots
//    4q .. 4q + 3 of the slice's first half, in the order fp8_slot_key asks; 0x7531 channel 2c + 1;
//    matrices (2, 3) the second half.
//  - stmatrix: register m of thread t goes to row t / 4 of matrix m at bytes 4q .. 4q + 3; matrix
//    m (0, 1: the first half's 16 slots, 2, 3: the second's) has rows = channels 16 g + 2i + b,
//    b = (m % 2) ^ (i >= 4), so that the 8 rows of one matrix fall in 8 different swizzle rows
//    (conflict-free); the thread picks the prmt selector of its row's parity.
template <int N, int D>
struct Fp8MatrixTranspose {
  static constexpr uint32_t kW = D % 128 == 0 ? 128 : 64, kChunks = kW / 16;  // V's atom rows
  static constexpr uint32_t kWt = N % 128 == 0 ? 128 : 64, kChunksT = kWt / 16;  // V^T's
  static_assert(N <= kWt, "a V^T row is one atom wide");
  static constexpr int kSlices = N / 32, kGroups = kSlices * (D / 16);
  uint32_t load_lane, store_lane, store_swizzle, selector_even, selector_odd;

  __host__ __device__ constexpr explicit Fp8MatrixTranspose(uint32_t lane)
      : load_lane(lane * kW), store_lane(store_channel(lane) * kWt),
        store_swizzle(kWt == 128 ? store_channel(lane) % 8 : store_channel(lane) % 8 / 2),
        selector_even(lane / 4 >= 4 ? 0x7531 : 0x6420), selector_odd(lane / 4 >= 4 ? 0x6420 : 0x7531) {}
  // The channel (within the group's 16) of row lane % 8 of matrix lane / 8 of the stmatrix.
  __host__ __device__ static constexpr uint32_t store_channel(uint32_t lane) {
    const uint32_t i = lane % 8, m = lane / 8;
    return 2 * i + ((m % 2) ^ (i >= 4 ? 1u : 0u));
  }
  // Group `group` (< kGroups): its slice and channel chunk.
  __host__ __device__ static constexpr uint32_t slice_of(uint32_t group) { return group % kSlices; }
  __host__ __device__ static constexpr uint32_t chunk_of(uint32_t group) { return group / kSlices; }
  // This lane's ldmatrix row in the V stage: key 32 slice + lane at channel 16 chunk
  // (fp8_tile_offset's swizzle: the key's row in the atom is lane % 8).
  __host__ __device__ constexpr uint32_t load_row(uint32_t lane, uint32_t group) const {
    const uint32_t g = chunk_of(group), swizzle = kW == 128 ? lane % 8 : lane % 8 / 2;
    return (g / kChunks) * (N * kW) + 32 * slice_of(group) * kW + load_lane + (((g % kChunks) ^ swizzle) << 4);
  }
  // This lane's stmatrix row in the V^T stage: channel 16 chunk + store_channel, slots from
  // 32 slice + 16 (lane / 16).
  __host__ __device__ constexpr uint32_t store_row(uint32_t lane, uint32_t group) const {
    const uint32_t slot_chunk = 2 * slice_of(group) + lane / 16;
    return 16 * chunk_of(group) * kWt + store_lane + (((slot_chunk % kChunksT) ^ store_swizzle) << 4);
  }
  // The keys (from the slice's first) of the bytes of a stored word of half `half` (thread t):
  // 16 half + {2q, 2q + 1, 8 + 2q, 9 + 2q}.
  __host__ __device__ static constexpr uint32_t word_key(uint32_t lane, uint32_t half, int byte) {
    return 16 * half + 8 * uint32_t(byte / 2) + 2 * (lane % 4) + uint32_t(byte % 2);
  }
};

__device__ __forceinline__ void ldsm_x4_trans(uint32_t addr, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}

__device__ __forceinline__ void stsm_x4(uint32_t addr, const uint32_t (&r)[4]) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(r[0]),
               "r"(r[1]), "r"(r[2]), "r"(r[3])
               : "memory");
}

// The 4 stored words from the 4 loaded ones (thread `lane`): matrices 2h, 2h + 1 of the load give
// half h's words, each with its row's selector. kMasked: the bytes of keys from `valid` (counted
// from the slice's first key) on become zeros.
template <bool kMasked, int N, int D>
__host__ __device__ __forceinline__ void fp8_matrix_words(const Fp8MatrixTranspose<N, D>& t, uint32_t lane,
                                                          const uint32_t (&in)[4], int valid, uint32_t (&out)[4]) {
  CUTLASS_PRAGMA_UNROLL
  for (uint32_t h = 0; h < 2; ++h) {
    uint32_t keep = ~0u;
    if constexpr (kMasked) {
      keep = 0;
      CUTLASS_PRAGMA_UNROLL
      for (int b = 0; b < 4; ++b) keep |= int(Fp8MatrixTranspose<N, D>::word_key(lane, h, b)) < valid ? 0xffu << (8 * b) : 0u;
    }
    out[2 * h] = prmt(in[2 * h], in[2 * h + 1], t.selector_even) & keep;
    out[2 * h + 1] = prmt(in[2 * h], in[2 * h + 1], t.selector_odd) & keep;
  }
}

// One V stage into its V^T stage (shared-memory addresses of the stages). kMasked (the block
// holding the sequence's end): the keys from `valid` on are written as zeros.
template <class T, bool kMasked>
__device__ __forceinline__ void transpose_v_stage(uint32_t v_stage, uint32_t vt_stage, int valid, int warp, int lane,
                                                  const Fp8MatrixTranspose<T::kBlockN, T::kHeadDimV>& t) {
  using Walk = Fp8MatrixTranspose<T::kBlockN, T::kHeadDimV>;
  CUTLASS_PRAGMA_NO_UNROLL
  for (int group = warp; group < Walk::kGroups; group += kTransposeThreads / 32) {
    uint32_t in[4], out[4];
    ldsm_x4_trans(v_stage + t.load_row(lane, group), in);
    fp8_matrix_words<kMasked>(t, lane, in, valid - 32 * int(Walk::slice_of(group)), out);
    stsm_x4(vt_stage + t.store_row(lane, group), out);
  }
}

// The transposers' loop over a tile's key blocks (last to first, as the producer loads them): wait
// for V's stage, take the V^T stage once the consumers are done with it, transpose, make the
// writes visible to wgmma (the async proxy), hand V^T to the consumers and V back to the TMA.
template <class T>
__device__ __forceinline__ void transpose_v(typename T::SharedStorage& ss, typename T::Pipeline& pipe_v,
                                            typename T::VtPipeline& pipe_vt, int seqlen_k, int n_first, int n_last) {
  const int thread = int(threadIdx.x) - 32, warp = thread / 32, lane = thread % 32;
  const uint32_t v_base = cast_smem_ptr_to_uint(ss.v.data()), vt_base = cast_smem_ptr_to_uint(ss.vt.data());
  cutlass::PipelineState<T::kStages> v_state;  // V's consumer: phase 0
  auto vt_state = cutlass::make_producer_start_state<typename T::VtPipeline>();  // V^T's buffers start empty
  const Fp8MatrixTranspose<T::kBlockN, T::kHeadDimV> walk(lane);
  for (int n = n_last; n >= n_first; --n) {
    pipe_v.consumer_wait(v_state);
    pipe_vt.producer_acquire(vt_state);
    const uint32_t v = v_base + v_state.index() * uint32_t(T::kBlockN * T::kHeadDimV);
    const uint32_t vt = vt_base + v_state.index() * uint32_t(T::kBlockN * T::kHeadDimV);
    const int valid = seqlen_k - n * T::kBlockN;
    if (valid >= T::kBlockN) transpose_v_stage<T, false>(v, vt, valid, warp, lane, walk);
    else transpose_v_stage<T, true>(v, vt, valid, warp, lane, walk);
    cutlass::arch::fence_view_async_shared();
    pipe_vt.producer_commit(vt_state);
    pipe_v.consumer_release(v_state);
    ++v_state;
    ++vt_state;
  }
}

// The A operand's register fragment of kSlices 32-key slices, compact.
template <int kSlices>
__host__ __device__ constexpr auto fp8_p_layout() {
  return make_layout(Shape<Shape<_4, _2, _2>, _1, Int<kSlices>>{});
}

// Four floats as e4m3 bytes (first lowest), to nearest, saturating: two cvt into the halves of one
// register (SASS: two F2FP and a PRMT), where the cuda_fp8.h pair returns each half zero-extended
// and costs LOP3s and shifts more per four values.
__device__ __forceinline__ uint32_t pack4_e4m3(float a, float b, float c, float d) {
  uint32_t out;
  asm("{\n.reg .b16 lo, hi;\n"
      "cvt.rn.satfinite.e4m3x2.f32 lo, %2, %1;\n"  // the second source is the low byte
      "cvt.rn.satfinite.e4m3x2.f32 hi, %4, %3;\n"
      "mov.b32 %0, {lo, hi};\n}"
      : "=r"(out)
      : "f"(a), "f"(b), "f"(c), "f"(d));
  return out;
}

// P's 8-bit A operand from the accumulator (value (c, r, v): key 8v + 2q + c of row r): A value
// (j, r, h) of 32-key slice s ((4, 2, 2) values: slot j, row r (+8), half h (+16 slots)), index
// j + 4r + 8h + 16s, holds slot 16h + 4q + j = accumulator value (j % 2) + 2r + 4 (4s + 2h + j / 2).
__host__ __device__ constexpr int fp8_p_source(int a_index) {
  const int j = a_index % 4, r = (a_index / 4) % 2, h = (a_index / 8) % 2, s = a_index / 16;
  return j % 2 + 2 * r + 4 * (4 * s + 2 * h + j / 2);
}

// P (the exponentiated scores, in the accumulator) as the P V GEMM's A operand, 4 values per
// register.
template <class E, class TS>
__device__ __forceinline__ auto scores_as_a_fp8(TS const& tSrS) {
  constexpr int kSlices = decltype(size(tSrS))::value / 16;
  Tensor rP = make_tensor<E>(fp8_p_layout<kSlices>());
  uint32_t* regs = reinterpret_cast<uint32_t*>(raw_pointer_cast(rP.data()));
  CUTLASS_PRAGMA_UNROLL
  for (int i = 0; i < 4 * kSlices * 4; i += 4) {
    regs[i / 4] = pack4_e4m3(tSrS(fp8_p_source(i)), tSrS(fp8_p_source(i + 1)), tSrS(fp8_p_source(i + 2)),
                             tSrS(fp8_p_source(i + 3)));
  }
  return rP;
}

}  // namespace kvflash::cuda::sm90
