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

__device__ __forceinline__ uint32_t lds32(uint32_t addr) {
  uint32_t v;
  asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(v) : "r"(addr) : "memory");
  return v;
}

__device__ __forceinline__ void sts32(uint32_t addr, uint32_t v) {
  asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
}

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

// The 4 x 4 byte transpose: byte j of o[i] = byte i of w[j].
__host__ __device__ __forceinline__ void transpose_4x4_bytes(const uint32_t (&w)[4], uint32_t (&o)[4]) {
  const uint32_t lo01 = prmt(w[0], w[1], 0x5140), lo23 = prmt(w[2], w[3], 0x5140);
  const uint32_t hi01 = prmt(w[0], w[1], 0x7362), hi23 = prmt(w[2], w[3], 0x7362);
  o[0] = prmt(lo01, lo23, 0x5410), o[1] = prmt(lo01, lo23, 0x7632);
  o[2] = prmt(hi01, hi23, 0x5410), o[3] = prmt(hi01, hi23, 0x7632);
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

// A transposer's unit (iteration `it` of lane `lane`, a tile of kSlices 32-key slices): the 4
// slots 16h + 4q .. + 3 of one slice and 4 channels c0 .. c0 + 3 of 16-channel group `group`. It
// loads 4 words (key(j)'s 4 channels each), transposes them, and stores 4 (a channel's 4 slots
// each): at step i channel store_channel(i) gets o[i ^ flip]. A warp's 32 lanes take the 8 slot
// groups of one slice times 4 channel groups of 4 (16 channels); the warps walk the (slice, 16
// channels) pairs. Bank spread (d 128: no conflict; d 64 loads and d 256 stores two-way;
// tests/cuda/sm90_fp8_layouts.cu): the lanes of h = 1 take the neighbouring 16 channels (group
// ^ 1), so that their keys, 16 apart and in the same swizzle row, hit other banks; lanes with u &
// 2 store in the order i ^ 2.
struct Fp8TransposeUnit {
  uint32_t slice, group, h, q, c0, slot0, flip;
  __host__ __device__ constexpr Fp8TransposeUnit(uint32_t it, uint32_t lane, uint32_t slices)
      : slice(it % slices), group((it / slices) ^ (lane / 16)), h(lane / 16), q((lane / 4) % 4),
        c0(group * 16 + 4 * (lane % 4)),
        slot0(32 * (it % slices) + 16 * (lane / 16) + 4 * ((lane / 4) % 4)), flip(lane & 2) {}
  __host__ __device__ constexpr uint32_t key(int j) const { return 32 * slice + fp8_slot_key(16 * h + 4 * q + j); }
  __host__ __device__ constexpr uint32_t store_channel(int i) const { return c0 + (uint32_t(i) ^ flip); }
};

// A lane's unit addresses in a V stage (N keys x D bytes) and its V^T stage (D x N): those of
// fp8_tile_offset(key(j), c0) and fp8_tile_offset(store_channel(i), slot0), decomposed so that the
// lane's own parts are computed once and a unit's take a few integer operations. Keys 16h + 2q +
// {0, 1, 8, 9} share their row in the swizzle atom but for j's parity (key % 8 = 2q + j % 2),
// and the stored channels 4u + (i ^ flip) theirs (channel % 8 = 4 (u % 2) + (i ^ flip)); XOR
// with a power of two below a field is that field's bit flipped, so the flip folds into two
// lane constants.
template <int N, int D>
struct Fp8TransposeAddresses {
  static constexpr uint32_t kW = D % 128 == 0 ? 128 : 64, kChunks = kW / 16;  // V's atom rows
  static constexpr uint32_t kWt = N % 128 == 0 ? 128 : 64;                    // V^T's
  static_assert(N <= kWt, "a V^T row is one atom wide");
  uint32_t load_base, load_swizzle, store_base, store_flip, store_swizzle, half;

  __host__ __device__ constexpr explicit Fp8TransposeAddresses(uint32_t lane)
      : load_base((16 * (lane / 16) + 2 * ((lane / 4) % 4)) * kW + 4 * (lane % 4)),
        load_swizzle(kW == 128 ? 2 * ((lane / 4) % 4) : (lane / 4) % 4),
        store_base(4 * (lane % 4) * kWt + 4 * ((lane / 4) % 4)), store_flip((lane & 2) * kWt),
        store_swizzle((kWt == 128 ? (4 * (lane % 2)) ^ (lane & 2) : (2 * (lane % 2)) ^ ((lane & 2) / 2)) << 4),
        half((lane / 16) << 4) {}
  // The 4 loads' offsets of unit (slice, group): keys +0 / +8 rows with the even swizzle, +1 / +9
  // with the odd one (W 64: the same; W 128: the last bit flipped).
  __host__ __device__ constexpr void loads(uint32_t slice, uint32_t group, uint32_t (&at)[4]) const {
    const uint32_t base = (group / kChunks) * (N * kW) + 32 * slice * kW + load_base;
    const uint32_t even = ((group % kChunks) ^ load_swizzle) << 4, odd = kW == 128 ? even ^ 16 : even;
    at[0] = base + even, at[1] = base + kW + odd, at[2] = base + 8 * kW + even, at[3] = base + 9 * kW + odd;
  }
  // The 4 stores' offsets of unit (slice, group), in step order: channel row 4u + (i ^ flip), its
  // chunk (2 slice + h) XOR the row's swizzle.
  __host__ __device__ constexpr void stores(uint32_t slice, uint32_t group, uint32_t (&at)[4]) const {
    const uint32_t base = 16 * group * kWt + store_base, chunk = ((2 * slice) << 4 | half) ^ store_swizzle;
    for (uint32_t i = 0; i < 4; ++i) {
      at[i] = base + ((i * kWt) ^ store_flip) + (chunk ^ ((kWt == 128 ? i : i / 2) << 4));
    }
  }
};

// One V stage into its V^T stage (shared-memory addresses of the stages). kMasked (the block
// holding the sequence's end): the keys from `valid` on are written as zeros.
template <class T, bool kMasked>
__device__ __forceinline__ void transpose_v_stage(uint32_t v_stage, uint32_t vt_stage, int valid, int warp, int lane,
                                                  const Fp8TransposeAddresses<T::kBlockN, T::kHeadDimV>& addr) {
  constexpr int N = T::kBlockN, D = T::kHeadDimV, kSlices = N / 32, kUnits = kSlices * (D / 16);
  static_assert(D % 32 == 0, "channel chunks in pairs");
  CUTLASS_PRAGMA_NO_UNROLL
  for (int it = warp; it < kUnits; it += kTransposeThreads / 32) {
    const Fp8TransposeUnit unit(it, lane, kSlices);
    uint32_t load_at[4], store_at[4], w[4], o[4];
    addr.loads(unit.slice, unit.group, load_at);
    CUTLASS_PRAGMA_UNROLL
    for (int j = 0; j < 4; ++j) {
      w[j] = lds32(v_stage + load_at[j]);
      if constexpr (kMasked) w[j] = int(unit.key(j)) < valid ? w[j] : 0u;
    }
    transpose_4x4_bytes(w, o);
    addr.stores(unit.slice, unit.group, store_at);
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < 4; ++i) sts32(vt_stage + store_at[i], unit.flip ? o[i ^ 2] : o[i]);
  }
}

// The matrix transposer (opt-in, KVFLASH_SM90_FP8_LDSM=1: correct on an H100, 47 random cases and
// memcheck in session 24, its speed not yet measured against the word transposer): a warp moves a
// group of 32 keys (one slice) x 16 channels (one 16-byte chunk) with one ldmatrix.x4.trans and one
// stmatrix.x4, 512 bytes each, where the word transposer above takes
// 4 x 32-bit loads and stores and their address arithmetic per 512 bytes (session 24's ncu: a
// quarter of the kernel's instructions, on the consumers' schedulers).
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

// One V stage into its V^T stage by the matrix transposer (see transpose_v_stage).
template <class T, bool kMasked>
__device__ __forceinline__ void transpose_v_stage_matrix(uint32_t v_stage, uint32_t vt_stage, int valid, int warp,
                                                         int lane, const Fp8MatrixTranspose<T::kBlockN, T::kHeadDimV>& t) {
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
// kMatrix: the matrix transposer (ldmatrix / stmatrix), else the word one.
template <class T, bool kMatrix>
__device__ __forceinline__ void transpose_v(typename T::SharedStorage& ss, typename T::Pipeline& pipe_v,
                                            typename T::VtPipeline& pipe_vt, int seqlen_k, int n_first, int n_last) {
  const int thread = int(threadIdx.x) - 32, warp = thread / 32, lane = thread % 32;
  const uint32_t v_base = cast_smem_ptr_to_uint(ss.v.data()), vt_base = cast_smem_ptr_to_uint(ss.vt.data());
  cutlass::PipelineState<T::kStages> v_state;  // V's consumer: phase 0
  auto vt_state = cutlass::make_producer_start_state<typename T::VtPipeline>();  // V^T's buffers start empty
  using Walk = conditional_t<kMatrix, Fp8MatrixTranspose<T::kBlockN, T::kHeadDimV>,
                             Fp8TransposeAddresses<T::kBlockN, T::kHeadDimV>>;
  const Walk walk(lane);
  for (int n = n_last; n >= n_first; --n) {
    pipe_v.consumer_wait(v_state);
    pipe_vt.producer_acquire(vt_state);
    const uint32_t v = v_base + v_state.index() * uint32_t(T::kBlockN * T::kHeadDimV);
    const uint32_t vt = vt_base + v_state.index() * uint32_t(T::kBlockN * T::kHeadDimV);
    const int valid = seqlen_k - n * T::kBlockN;
    if constexpr (kMatrix) {
      if (valid >= T::kBlockN) transpose_v_stage_matrix<T, false>(v, vt, valid, warp, lane, walk);
      else transpose_v_stage_matrix<T, true>(v, vt, valid, warp, lane, walk);
    } else {
      if (valid >= T::kBlockN) transpose_v_stage<T, false>(v, vt, valid, warp, lane, walk);
      else transpose_v_stage<T, true>(v, vt, valid, warp, lane, walk);
    }
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
// register (two F2FP, the second merging into the first's register), where the cuda_fp8.h pair
// returns each half zero-extended and costs a LOP3 and a shift more per four values.
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
