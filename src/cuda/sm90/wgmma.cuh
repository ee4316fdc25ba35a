// What the Hopper kernels (sm90/prefill_kernel.cuh, sm90_mla/mla_kernel.cuh) share: CuTe element
// types, views of the wgmma accumulator, one warp group's GEMM batch, and the online softmax of a
// thread's accumulator rows.
#pragma once

#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>
#include <cutlass/numeric_types.h>

#include "cuda/common/cta_work.cuh"

namespace kvflash::cuda::sm90 {

using namespace cute;

// The CuTe element type of a CUDA one.
template <class Elem> struct CuteElem;
template <> struct CuteElem<__nv_bfloat16> { using type = cutlass::bfloat16_t; };
template <> struct CuteElem<__half> { using type = cutlass::half_t; };
template <> struct CuteElem<__nv_fp8_e4m3> { using type = cutlass::float_e4m3_t; };

// The accumulator's per-thread values ((2, 2, V), M, N) as (rows, columns): rows (2, M),
// columns (2, V, N). (wgmma C fragment: value (c, r, v) is row r * 8 + lane / 4 of the warp's
// 16, column v * 8 + 2 (lane % 4) + c.)
template <class Layout>
__device__ __forceinline__ constexpr auto rows_cols(Layout l) {
  return make_layout(make_layout(get<0, 1>(l), get<1>(l)), make_layout(get<0, 0>(l), get<0, 2>(l), get<2>(l)));
}

// The same values as the A fragment of a 16-bit RS wgmma ((2, 2, 2), M, K / 16): pairs of 8-column
// groups form one k16 slice.
template <class Layout>
__device__ __forceinline__ constexpr auto acc_as_a(Layout l) {
  auto v = logical_divide(get<0, 2>(l), Tile<_2>{});  // ((2, V / 2))
  return make_layout(make_layout(get<0, 0>(l), get<0, 1>(l), get<0, 0>(v)), get<1>(l),
                     coalesce(make_layout(get<0, 1>(v), get<2>(l))));
}

// C (+)= A B over the first kSlices K slices of one tile (0: all), as one wgmma batch; waits until
// at most kPending batches of this warp group are in flight (-1: no wait). kRegsA: A is in
// registers (RS). (A runtime bound would branch between the batch's wgmmas, and ptxas then
// serialises them.)
template <bool kZeroInit, int kPending, bool kRegsA = false, int kSlices = 0, class Mma, class TA, class TB, class TC>
__device__ __forceinline__ void warpgroup_gemm(Mma& mma, TA const& a, TB const& b, TC& c) {
  constexpr int kEnd = kSlices > 0 ? kSlices : decltype(size<2>(a))::value;
  static_assert(kEnd <= decltype(size<2>(a))::value);
  if constexpr (kRegsA) warpgroup_fence_operand(const_cast<TA&>(a));
  warpgroup_fence_operand(c);
  warpgroup_arrive();
  if constexpr (kZeroInit) mma.accumulate_ = GMMA::ScaleOut::Zero;
  CUTLASS_PRAGMA_UNROLL
  for (int k = 0; k < kEnd; ++k) {
    cute::gemm(mma, a(_, _, k), b(_, _, k), c);
    mma.accumulate_ = GMMA::ScaleOut::One;
  }
  warpgroup_commit_batch();
  if constexpr (kPending >= 0) warpgroup_wait<kPending>();
  warpgroup_fence_operand(c);
  if constexpr (kRegsA) warpgroup_fence_operand(const_cast<TA&>(a));
}

// The online softmax over a thread's kRows rows of score tiles in the accumulator layout (`rc`:
// rows_cols of the tile's identity partition, so rc(r, c) is (tile row, tile column)). Tile row r
// is packed row row0 + r of the CTA's sequence (core/mask.h gives its visible keys); max in log2
// units. kMaxOffset: P is exp2(score - max + kMaxOffset), up to 2^kMaxOffset (FA3's fp8 path: 8,
// so that P in e4m3 keeps the small terms subnormals would lose; the sum carries the same factor,
// taken out in finish()).
template <int kRows, int kMaxOffset = 0>
struct RowSoftmax {
  float row_max[kRows], row_sum[kRows];
  int key_lo[kRows], key_hi[kRows];  // each row's visible keys within the CTA's range
  int full_lo = 0, full_hi = 0;      // keys every real row sees: blocks inside need no mask

  template <class RC>
  __device__ __forceinline__ RowSoftmax(const AttentionParams& p, const CtaStart& start, int row0, int block_m,
                                        const RC& rc) {
    const SeqLens& seq = start.col.seq;
    const int n_lo = start.keys.lo, n_hi = start.keys.hi;
    CUTLASS_PRAGMA_UNROLL
    for (int r = 0; r < kRows; ++r) {
      const int idx = row0 + get<0>(rc(r, 0));
      const core::KeyRange vis = row_keys(p, seq, idx);
      key_lo[r] = max(vis.lo, n_lo);
      key_hi[r] = idx < start.packed_rows ? min(vis.hi, n_hi) : key_lo[r];
      row_max[r] = -INFINITY, row_sum[r] = 0.0f;
    }
    // The visible ranges are monotone in the row.
    const int last_row = min(row0 + block_m, start.packed_rows) - 1;
    full_lo = max(row_keys(p, seq, last_row).lo, n_lo);
    full_hi = min(row_keys(p, seq, row0).hi, n_hi);
  }

  // Masks and exponentiates the scores of the kBlockN keys from n0 in place; alpha: each row's
  // rescale of what it accumulated before.
  template <int kBlockN, class TS, class RC>
  __device__ __forceinline__ void step(TS& tSrS, const RC& rc, int n0, const ScoreScale& scale,
                                       float (&alpha)[kRows]) {
    Tensor s = make_tensor(tSrS.data(), rows_cols(tSrS.layout()));
    constexpr int kCols = decltype(size<1>(s))::value;
    if (!scale.fold) {
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < size(s); ++i) s(i) = scale.map(s(i));
    }
    if (n0 < full_lo || n0 + kBlockN > full_hi) {
      CUTLASS_PRAGMA_UNROLL
      for (int r = 0; r < kRows; ++r) {
        CUTLASS_PRAGMA_UNROLL
        for (int c = 0; c < kCols; ++c) {
          const int j = n0 + get<1>(rc(r, c));
          if (j < key_lo[r] || j >= key_hi[r]) s(r, c) = -INFINITY;
        }
      }
    }
    const float exp_scale = scale.exp_scale;
    // The row's max and sum over kChains interleaved chains, not one: a consumer warp has few
    // others beside it on its scheduler to hide a chain of kCols dependent instructions.
    constexpr int kChains = 4;  // paired below: (0, 1), (2, 3)
    static_assert(kChains == 4 && kCols % kChains == 0, "whole chains, four of them");
    CUTLASS_PRAGMA_UNROLL
    for (int r = 0; r < kRows; ++r) {
      float chain[kChains];
      CUTLASS_PRAGMA_UNROLL
      for (int k = 0; k < kChains; ++k) chain[k] = s(r, k);
      CUTLASS_PRAGMA_UNROLL
      for (int c = kChains; c < kCols; ++c) chain[c % kChains] = fmaxf(chain[c % kChains], s(r, c));
      float m = fmaxf(fmaxf(chain[0], chain[1]), fmaxf(chain[2], chain[3]));
      m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
      m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
      const float new_max = fmaxf(row_max[r], m * exp_scale);
      const float base = new_max == -INFINITY ? 0.0f : new_max;  // all masked: exp2(-inf) = 0
      alpha[r] = fast_exp2(row_max[r] - base);
      row_max[r] = new_max;
      float p_base = base;
      if constexpr (kMaxOffset != 0) p_base -= float(kMaxOffset);
      CUTLASS_PRAGMA_UNROLL
      for (int k = 0; k < kChains; ++k) chain[k] = 0.0f;
      CUTLASS_PRAGMA_UNROLL
      for (int c = 0; c < kCols; ++c) {
        s(r, c) = fast_exp2(fmaf(s(r, c), exp_scale, -p_base));
        chain[c % kChains] += s(r, c);
      }
      row_sum[r] = row_sum[r] * alpha[r] + ((chain[0] + chain[1]) + (chain[2] + chain[3]));
    }
  }

  // Row r's end, packed row `idx` of KV head hk (its sum across the 4 threads of the row, the
  // sink's term on the split that adds it): returns the factor its accumulated output takes and
  // sets its LSE.
  __device__ __forceinline__ float finish(const AttentionParams& p, const CtaStart& start, int hk, int idx, int r,
                                          float& lse) const {
    float l = row_sum[r];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    constexpr float kOffsetScale = 1.0f / float(1 << kMaxOffset);  // the sum and output carry 2^kMaxOffset
    if constexpr (kMaxOffset != 0) l *= kOffsetScale;
    float m = row_max[r];
    const float keys_scale =
        start.add_sink ? fold_sink(sink_log2(p, hk, min(idx, start.packed_rows - 1)), m, l) : 1.0f;
    const bool nonempty = l > 0.0f && m != -INFINITY;
    lse = nonempty ? (m + log2f(l)) * kLn2 : -INFINITY;
    if constexpr (kMaxOffset != 0) return nonempty ? keys_scale / l * kOffsetScale : 0.0f;
    return nonempty ? keys_scale / l : 0.0f;
  }
};

// Each accumulator row r of a thread times alpha[r].
template <class TO, int kRows>
__device__ __forceinline__ void rescale_rows(TO& tOrO, const float (&alpha)[kRows]) {
  Tensor o = make_tensor(tOrO.data(), rows_cols(tOrO.layout()));
  static_assert(decltype(size<0>(o))::value == kRows);
  CUTLASS_PRAGMA_UNROLL
  for (int r = 0; r < kRows; ++r) {
    CUTLASS_PRAGMA_UNROLL
    for (int c = 0; c < size<1>(o); ++c) o(r, c) *= alpha[r];
  }
}

// A thread's accumulator rows into an O tile: store(tile_row, column, value) of each value of
// row r (tile row `tile_row`) times factor(r, tile_row).
template <class TO, class TC, class Factor, class Store>
__device__ __forceinline__ void write_scaled_rows(const TO& tOrO, const TC& tOcO, Factor factor, Store store) {
  Tensor o = make_tensor(tOrO.data(), rows_cols(tOrO.layout()));
  Tensor orc = make_tensor(tOcO.data(), rows_cols(tOcO.layout()));
  CUTLASS_PRAGMA_UNROLL
  for (int r = 0; r < size<0>(o); ++r) {
    const int tile_row = get<0>(orc(r, 0));
    const float f = factor(r, tile_row);
    CUTLASS_PRAGMA_UNROLL
    for (int c = 0; c < size<1>(o); ++c) store(tile_row, get<1>(orc(r, c)), o(r, c) * f);
  }
}

// P (the exponentiated scores) in the P V GEMM's A layout, converted to 16-bit. Register fragments
// are compact (value i at offset i), and the A layout regroups the same offsets, so value i
// converts into element i.
template <class Elem, class E, class TS>
__device__ __forceinline__ auto scores_as_a(TS const& tSrS) {
  Tensor rP = make_tensor<E>(acc_as_a(tSrS.layout()));
  E* out = raw_pointer_cast(rP.data());
  CUTLASS_PRAGMA_UNROLL
  for (int i = 0; i < size(tSrS); i += 2) {
    *reinterpret_cast<uint32_t*>(out + i) = pack2<Elem>(tSrS(i), tSrS(i + 1));
  }
  return rP;
}

}  // namespace kvflash::cuda::sm90
