// The portable (sm80+) attention forward kernel for many query rows (prefill, extend): FA2-style,
// tensor cores through mma.sync m16n8k16. Calls with at most 16 packed query rows per KV head use
// the decode kernel (decode_kernel.cuh) instead.
//
// A CTA owns kBlockM packed query rows (the query heads sharing KV head hk, packed row-major as
// (query index, head in group)) of one batch element and one split, and walks the split's key
// blocks with an online softmax. Each warp owns kWarpRows (16 or 32) query rows and every key of
// a block.
//
// At d_v 512 (MLA) a warp's 16 rows x 512 accumulators would take 256 registers: kWarpsV warps
// share each 16 rows, each accumulating its slice of V's dims (and each computing the rows'
// scores, the same values in the same order, so their softmax states agree). With qv the scores
// add QV V^T: QV's tile beside Q's, V's tile read as K's; without q.k (only_qv: headdim 0) Q and K
// are neither read nor multiplied.
//
// Over an fp8 cache (E4m3Cache rows) K / V chunks are converted into the query's type on their way
// to shared memory (common/fp8.cuh load_chunk) and the descales scale the scores and the output.
//
// Loads are cp.async with zero fill: K / V rows outside the CTA's key range, at a bad page id or
// beyond the real head dim are never read, so NaN in unused cache slots cannot reach the output,
// and masked scores are selected to -inf before the exponent.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <type_traits>

#include "core/mask.h"
#include "core/tile_size.h"
#include "cuda/common/cta_work.cuh"
#include "cuda/common/fp8.cuh"
#include "cuda/common/lengths.cuh"
#include "cuda/common/mma.cuh"
#include "cuda/common/params.h"

namespace kvflash::cuda {

// kMTiles: m16 tiles (16 query rows each) per warp. Two let every K / V fragment read from shared
// memory feed two mma instead of one, halving shared-memory traffic per mma (FA2's layout).
// Row: the query's 16-bit type, or E4m3Cache<it> over an fp8 cache (common/fp8.cuh).
template <class Row, int kHeadDim_, int kHeadDimV_, int kBlockM_, int kBlockN_, int kMinBlocks_,
          int kMTiles_, int kWarpsV_>
struct AttentionTraits {
  using Elem = typename RowTypes<Row>::Query;   // q, shared-memory tiles, mma, out
  using Cache = typename RowTypes<Row>::Cache;  // k_cache / v_cache elements
  static constexpr bool kFp8Cache = !std::is_same_v<Elem, Cache>;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kHeadDimV = kHeadDimV_;
  static constexpr int kBlockM = kBlockM_;
  static constexpr int kBlockN = kBlockN_;
  static constexpr int kMTiles = kMTiles_;
  static constexpr int kWarpRows = 16 * kMTiles;
  static constexpr int kWarpsM = kBlockM / kWarpRows;
  static constexpr int kWarpsV = kWarpsV_;  // warps sharing rows, each a slice of V's dims
  static constexpr int kSliceV = kHeadDimV / kWarpsV;
  static constexpr int kThreads = 32 * kWarpsM * kWarpsV;
  // qv exists only with d_v >= 256: the d_v 512 kernels take it (its tile beside Q's).
  static constexpr bool kTakesQv = kHeadDimV == 512;
  // Rows padded by 16 bytes so ldmatrix over 8 consecutive rows hits 8 different bank groups.
  static constexpr int kQStride = kHeadDim + 8;
  static constexpr int kVStride = kHeadDimV + 8;
  static constexpr int kOStride = kHeadDimV + 4;  // fp32 epilogue rows
  static constexpr int kMinBlocks = kMinBlocks_;  // CTAs per SM the register budget aims at
  // Two K/V stages (the next tile loads while this one is used) when they fit the 160 KB an sm80
  // CTA may have; otherwise one, loading V under the scores and the next K under P·V (FA2's order).
  static constexpr int kStageBytes = kBlockN * (kQStride + kVStride) * int(sizeof(Elem));
  static constexpr int kQvElems = kTakesQv ? kBlockM * kVStride : 0;
  static constexpr int kQBytes = (kBlockM * kQStride + kQvElems) * int(sizeof(Elem));
  static constexpr int kStages = kQBytes + 2 * kStageBytes <= 160 * 1024 ? 2 : 1;
  static constexpr int kTileBytes = kQBytes + kStages * kStageBytes;
  static constexpr int kEpilogueBytes = kBlockM * kOStride * 4;
  // Each row's LSE and visible key range [lo, hi) (rounded to 16 bytes: the row sources after
  // them are read 16 bytes at a time).
  static constexpr int kStatsBytes = (kBlockM * 4 + kBlockM * 8 + 15) / 16 * 16;
  // Sources of the K and V rows of two key blocks (the one loading and the next), so the paged
  // address of a row is computed once per block, not once per 16-byte copy.
  static constexpr int kRowSourceBytes = 2 * 2 * kBlockN * 16;
  static constexpr int kSmemBytes =
      (kTileBytes > kEpilogueBytes ? kTileBytes : kEpilogueBytes) + kStatsBytes + kRowSourceBytes;
  static_assert(kHeadDim % 16 == 0 && kHeadDimV % 16 == 0, "head dims are multiples of 16");
  static_assert(kBlockM % kWarpRows == 0 && kBlockN % 16 == 0 && kSliceV % 16 == 0, "tiles are whole mma steps");
  // qv's scores need V before P.V: the single-stage order loads V under the scores.
  static_assert(!kTakesQv || kStages == 2, "qv kernels load K and V together");
  static_assert(!kTakesQv || kSmemBytes <= core::kCudaMla512PrefillSmemKB * 1024, "core/limits.h's figure");
};

// Where a tile row comes from: a valid global address, and whether to copy it (else zero fill,
// reading nothing from the address). Src: the tensor's element (an fp8 cache's, converted on load).
template <class Src>
struct alignas(16) RowSource {
  const Src* ptr;
  int valid;
};

// Rows [0, rows) x chunks of 8 elements of one tile, global -> shared (common/fp8.cuh load_chunk).
// row_src(r) gives the RowSource of row r; chunks at or past `valid_chunks` are zero (and read at
// the row's start, a valid address, so no copy is handed an address past its tensor).
template <int kRows, int kDim, int kStride, int kThreads, class Elem, class RowSrc>
__device__ __forceinline__ void load_tile(Elem* smem, int valid_chunks, RowSrc row_src) {
  constexpr int kChunks = kDim / 8;
  constexpr int kTotal = kRows * kChunks;
  constexpr int kIters = (kTotal + kThreads - 1) / kThreads;
  // When the chunks of a row divide the threads, a thread keeps its chunk and steps rows by a
  // constant: no division per copy and no per-copy row index held in registers. (A key row's
  // source is a shared-memory read, computed once per block: no long latency needs batching.)
  constexpr bool kFixedChunk = kThreads % kChunks == 0;
  const int tid = threadIdx.x;
#pragma unroll
  for (int it = 0; it < kIters; ++it) {
    const int e = tid + it * kThreads;
    if (kTotal % kThreads != 0 && e >= kTotal) continue;
    const int r = kFixedChunk ? tid / kChunks + it * (kThreads / kChunks) : e / kChunks;
    const int c = kFixedChunk ? tid % kChunks : e - r * kChunks;
    const bool chunk_ok = c < valid_chunks;
    const auto row = row_src(r);
    load_chunk(smem + r * kStride + c * 8, row.ptr + (chunk_ok ? c * 8 : 0), chunk_ok && row.valid);
  }
}

template <class T>
__global__ void __launch_bounds__(T::kThreads, T::kMinBlocks) attention_kernel(const AttentionParams p) {
  using Elem = typename T::Elem;
  using Cache = typename T::Cache;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  Elem* sQ = reinterpret_cast<Elem*>(smem_raw);
  Elem* sQv = sQ + T::kBlockM * T::kQStride;             // [kBlockM][kVStride] (kTakesQv)
  Elem* sK = sQv + T::kQvElems;                          // [kStages][kBlockN][kQStride]
  Elem* sV = sK + T::kStages * T::kBlockN * T::kQStride;  // [kStages][kBlockN][kVStride]
  float* sO = reinterpret_cast<float*>(smem_raw);
  const int stats_offset = T::kTileBytes > T::kEpilogueBytes ? T::kTileBytes : T::kEpilogueBytes;
  float* sLse = reinterpret_cast<float*>(smem_raw + stats_offset);  // [kBlockM]
  int2* sRowKeys = reinterpret_cast<int2*>(sLse + T::kBlockM);       // [kBlockM]
  auto* sRowK = reinterpret_cast<RowSource<Cache>*>(smem_raw + stats_offset + T::kStatsBytes);  // [2][kBlockN]
  auto* sRowV = sRowK + 2 * T::kBlockN;                                                      // [2][kBlockN]

  // Last query block first: with causal masks it has the most keys, and launching the longest
  // CTAs first leaves short ones for the tail of the grid.
  const int m_block = gridDim.x - 1 - blockIdx.x;
  const int hk = blockIdx.y;
  const int row0 = m_block * T::kBlockM;
  CtaStart start;
  if (!start_cta<Elem>(p, row0, T::kBlockM, start)) return;
  const SeqLens& seq = start.col.seq;
  const int packed_rows = start.packed_rows;
  const int n_lo = start.keys.lo, n_hi = start.keys.hi;
  const bool add_sink = start.add_sink;

  const int tid = threadIdx.x;
  const int wm = tid / 32 / T::kWarpsV, wv = tid / 32 % T::kWarpsV, lane = tid % 32;
  const int g = lane / 4, t = lane % 4;
  constexpr int kMT = T::kMTiles;
  // CTA row of this thread's half h (rows g and g + 8) of its warp's m16 tile mt.
  auto warp_row = [&](int mt, int h) { return wm * T::kWarpRows + mt * 16 + g + 8 * h; };

  // Each row's visible key range to shared memory (read only by blocks that need a mask), and
  // [full_lo, full_hi): the keys every row of this thread sees, where no mask is needed.
  int full_lo = n_lo, full_hi = n_hi;
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int idx = row0 + warp_row(mt, h);
      const core::KeyRange vis = row_keys(p, seq, idx);
      const bool row_ok = idx < packed_rows;
      const int lo = max(vis.lo, n_lo);
      const int hi = row_ok ? min(vis.hi, n_hi) : lo;
      if (t == 0 && wv == 0) sRowKeys[warp_row(mt, h)] = make_int2(lo, hi);  // one writer per row
      full_lo = max(full_lo, lo);
      full_hi = min(full_hi, hi);
    }
  }

  // Q's tile (and qv's): rows past the sequence are zero.
  auto load_rows = [&](Elem* dst, const RowLayout& t, auto dim_c, auto stride_c, int valid_chunks) {
    const Elem* base = static_cast<const Elem*>(t.data);
    const int64_t batch = p.len.cu_seqlens_q.data ? 0 : int64_t(start.col.b) * t.batch_stride;
    load_tile<T::kBlockM, decltype(dim_c)::value, decltype(stride_c)::value, T::kThreads>(
        dst, valid_chunks, [&](int r) -> RowSource<Elem> {
          const int idx = row0 + r;
          if (idx >= packed_rows) return {base, false};
          const int i = idx / p.group;
          const int h = hk * p.group + (idx - i * p.group);
          return {base + batch + int64_t(seq.q_offset + i) * t.token_stride + h * t.head_stride, true};
        });
  };
  const bool uses_qk = !T::kTakesQv || p.headdim > 0;  // only_qv runs the d_v 512 kernels
  const bool has_qv = T::kTakesQv && p.qv.data != nullptr;
  load_rows(sQ, p.q, std::integral_constant<int, T::kHeadDim>{}, std::integral_constant<int, T::kQStride>{},
            p.headdim / 8);
  if constexpr (T::kTakesQv) {
    if (has_qv) {
      load_rows(sQv, p.qv, std::integral_constant<int, T::kHeadDimV>{}, std::integral_constant<int, T::kVStride>{},
                p.headdim_v / 8);
    }
  }

  const Cache* k_base = static_cast<const Cache*>(p.cache.k);
  const Cache* v_base = static_cast<const Cache*>(p.cache.v);
  // Row sources of key block n0 into slot `slot` (zero fill: outside the CTA's keys or a bad page).
  auto fill_row_sources = [&](int n0, int slot) {
    for (int r = threadIdx.x; r < T::kBlockN; r += T::kThreads) {
      const int j = n0 + r;
      int64_t unit = 0;
      int pos_in_unit = 0;
      const bool ok = j >= n_lo && j < n_hi &&
                      cache_location(p.cache, seq.cache_row, seq.leftpad + j, unit, pos_in_unit);
      sRowK[slot * T::kBlockN + r] =
          ok ? RowSource<Cache>{k_base + unit * p.cache.k_row_stride + pos_in_unit * p.cache.k_pos_stride +
                                    hk * p.cache.k_head_stride, true}
             : RowSource<Cache>{k_base, false};
      sRowV[slot * T::kBlockN + r] =
          ok ? RowSource<Cache>{v_base + unit * p.cache.v_row_stride + pos_in_unit * p.cache.v_pos_stride +
                                    hk * p.cache.v_head_stride, true}
             : RowSource<Cache>{v_base, false};
    }
  };
  auto load_k = [&](int stage, int slot) {
    load_tile<T::kBlockN, T::kHeadDim, T::kQStride, T::kThreads>(
        sK + stage * T::kBlockN * T::kQStride, p.headdim / 8, [&](int r) { return sRowK[slot * T::kBlockN + r]; });
  };
  auto load_v = [&](int stage, int slot) {
    load_tile<T::kBlockN, T::kHeadDimV, T::kVStride, T::kThreads>(
        sV + stage * T::kBlockN * T::kVStride, p.headdim_v / 8, [&](int r) { return sRowV[slot * T::kBlockN + r]; });
  };

  const Fp8Descales descales = T::kFp8Cache ? Fp8Descales(p, start.col.b, hk) : Fp8Descales();
  const ScoreScale scale(p, descales.qk);
  const float exp_scale = scale.exp_scale;

  constexpr int kNTiles = T::kBlockN / 8;
  constexpr int kOTiles = T::kSliceV / 8;  // this warp's slice of V's dims
  float o_acc[kMT][kOTiles][4];
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int i = 0; i < kOTiles; ++i) o_acc[mt][i][0] = o_acc[mt][i][1] = o_acc[mt][i][2] = o_acc[mt][i][3] = 0.0f;
  }
  float row_max[kMT][2], row_sum[kMT][2];  // max in log2 units
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
    row_max[mt][0] = row_max[mt][1] = -INFINITY;
    row_sum[mt][0] = row_sum[mt][1] = 0.0f;
  }

  // m16 tile mt of this warp's Q rows is at sQ_addr + mt * 16 rows.
  const uint32_t sQ_addr = smem_addr(sQ + (wm * T::kWarpRows + (lane % 16)) * T::kQStride + (lane / 16) * 8);
  // K (non-transposed): matrix mi = lane / 8 covers keys (mi / 2) * 8.., dims (mi % 2) * 8..
  const uint32_t sK_addr = smem_addr(sK + ((lane / 16) * 8 + (lane % 8)) * T::kQStride + ((lane / 8) % 2) * 8);
  // V (transposed): matrix mi covers keys (mi % 2) * 8.., dims (mi / 2) * 8..
  const uint32_t sV_addr =
      smem_addr(sV + (((lane / 8) % 2) * 8 + (lane % 8)) * T::kVStride + (lane / 16) * 8 + wv * T::kSliceV);
  // With qv: QV's rows as Q's, V's tile (non-transposed) as K's.
  const uint32_t sQv_addr = smem_addr(sQv + (wm * T::kWarpRows + (lane % 16)) * T::kVStride + (lane / 16) * 8);
  const uint32_t sV_scores_addr = smem_addr(sV + ((lane / 16) * 8 + (lane % 8)) * T::kVStride + ((lane / 8) % 2) * 8);

  // The three steps of a key block; `stage` picks the K/V buffers. Each K / V fragment read from
  // shared memory feeds the warp's kMT m16 tiles.
  constexpr uint32_t kKStageBytes = T::kBlockN * T::kQStride * 2, kVStageBytes = T::kBlockN * T::kVStride * 2;
  float s[kMT][kNTiles][4];
  // s += A B^T over the dims of A's rows (kSteps 16-wide steps, rows kStride elements apart): A
  // the warp's query rows at a_addr (Q or QV), B the block's key rows at b_addr (K, or V).
  auto add_scores = [&](uint32_t a_addr, uint32_t b_addr, auto steps_c, auto stride_c) {
    constexpr int kSteps = decltype(steps_c)::value, kStride = decltype(stride_c)::value;
#pragma unroll
    for (int kk = 0; kk < kSteps; ++kk) {
      uint32_t a[kMT][4];
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) ldmatrix_x4(a_addr + mt * 16 * kStride * 2 + kk * 32, a[mt]);
#pragma unroll
      for (int np = 0; np < kNTiles / 2; ++np) {
        uint32_t bk[4];
        ldmatrix_x4(b_addr + (np * 16 * kStride) * 2 + kk * 32, bk);
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          mma_16816<Elem>(s[mt][2 * np], a[mt], bk[0], bk[1]);
          mma_16816<Elem>(s[mt][2 * np + 1], a[mt], bk[2], bk[3]);
        }
      }
    }
  };
  auto scores = [&](int stage) {
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
      for (int i = 0; i < kNTiles; ++i) s[mt][i][0] = s[mt][i][1] = s[mt][i][2] = s[mt][i][3] = 0.0f;
    }
    if (uses_qk) {
      add_scores(sQ_addr, sK_addr + stage * kKStageBytes, std::integral_constant<int, T::kHeadDim / 16>{},
                 std::integral_constant<int, T::kQStride>{});
    }
    if constexpr (T::kTakesQv) {
      if (has_qv) {
        add_scores(sQv_addr, sV_scores_addr + stage * kVStageBytes, std::integral_constant<int, T::kHeadDimV / 16>{},
                   std::integral_constant<int, T::kVStride>{});
      }
    }
  };
  auto online_softmax = [&](int n0) {
    if (!scale.fold) {
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt) {
#pragma unroll
          for (int e = 0; e < 4; ++e) s[mt][nt][e] = scale.map(s[mt][nt][e]);
        }
      }
    }
    // Mask only where the block crosses one of this thread's row ranges (the CTA's key range
    // ends, a causal diagonal, a window edge, rows past the sequence).
    if (n0 < full_lo || n0 + T::kBlockN > full_hi) {
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int2 keys = sRowKeys[warp_row(mt, h)];
#pragma unroll
          for (int nt = 0; nt < kNTiles; ++nt) {
#pragma unroll
            for (int e = 2 * h; e < 2 * h + 2; ++e) {
              const int j = n0 + 2 * t + nt * 8 + (e & 1);
              if (j < keys.x || j >= keys.y) s[mt][nt][e] = -INFINITY;
            }
          }
        }
      }
    }
    // This thread's scores of row half h of m16 tile mt reduced by op as a tree (short
    // dependency chains instead of one chain through every score).
    auto reduce_row = [&](int mt, int h, auto op) {
      static_assert((kNTiles & (kNTiles - 1)) == 0, "a tree over a power of two");
      float v[kNTiles];
#pragma unroll
      for (int nt = 0; nt < kNTiles; ++nt) v[nt] = op(s[mt][nt][2 * h], s[mt][nt][2 * h + 1]);
#pragma unroll
      for (int level = 2; level <= kNTiles; level *= 2) {
#pragma unroll
        for (int i = 0; i < kNTiles / level; ++i) v[i] = op(v[i], v[i + kNTiles / level]);
      }
      return v[0];
    };
    float alpha[kMT][2];  // rescale of the accumulated row state
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
      float tile_max[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        tile_max[h] = reduce_row(mt, h, [](float x, float y) { return fmaxf(x, y); });
        tile_max[h] = fmaxf(tile_max[h], __shfl_xor_sync(0xffffffffu, tile_max[h], 1));
        tile_max[h] = fmaxf(tile_max[h], __shfl_xor_sync(0xffffffffu, tile_max[h], 2));
        const float new_max = fmaxf(row_max[mt][h], tile_max[h] * exp_scale);
        const float base = new_max == -INFINITY ? 0.0f : new_max;  // all masked: exp2(-inf) = 0
        alpha[mt][h] = fast_exp2(row_max[mt][h] - base);
        row_max[mt][h] = new_max;
        row_sum[mt][h] *= alpha[mt][h];
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt) {
          s[mt][nt][2 * h] = fast_exp2(fmaf(s[mt][nt][2 * h], exp_scale, -base));
          s[mt][nt][2 * h + 1] = fast_exp2(fmaf(s[mt][nt][2 * h + 1], exp_scale, -base));
        }
        row_sum[mt][h] += reduce_row(mt, h, [](float x, float y) { return x + y; });
      }
    }
    // The accumulators only change where a row max grew: once the maxima settle (most blocks of a
    // long row), the warp skips the multiplies by exactly 1.
    bool grew = false;
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) grew = grew || alpha[mt][0] != 1.0f || alpha[mt][1] != 1.0f;
    if (__any_sync(0xffffffffu, grew)) {
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
        for (int i = 0; i < kOTiles; ++i) {
          o_acc[mt][i][0] *= alpha[mt][0];
          o_acc[mt][i][1] *= alpha[mt][0];
          o_acc[mt][i][2] *= alpha[mt][1];
          o_acc[mt][i][3] *= alpha[mt][1];
        }
      }
    }
  };
  auto accumulate = [&](int stage) {
    const uint32_t v_addr = sV_addr + stage * kVStageBytes;
#pragma unroll
    for (int ks = 0; ks < T::kBlockN / 16; ++ks) {
      uint32_t a[kMT][4];
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
        a[mt][0] = pack2<Elem>(s[mt][2 * ks][0], s[mt][2 * ks][1]);
        a[mt][1] = pack2<Elem>(s[mt][2 * ks][2], s[mt][2 * ks][3]);
        a[mt][2] = pack2<Elem>(s[mt][2 * ks + 1][0], s[mt][2 * ks + 1][1]);
        a[mt][3] = pack2<Elem>(s[mt][2 * ks + 1][2], s[mt][2 * ks + 1][3]);
      }
#pragma unroll
      for (int dp = 0; dp < kOTiles / 2; ++dp) {
        uint32_t bv[4];
        ldmatrix_x4_trans(v_addr + (ks * 16 * T::kVStride + dp * 16) * 2, bv);
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          mma_16816<Elem>(o_acc[mt][2 * dp], a[mt], bv[0], bv[1]);
          mma_16816<Elem>(o_acc[mt][2 * dp + 1], a[mt], bv[2], bv[3]);
        }
      }
    }
  };

  // Row-source slots: block b of the CTA uses slot b % 2, filled one block ahead.
  fill_row_sources(n_lo, 0);
  fill_row_sources(n_lo + T::kBlockN, 1);
  __syncthreads();
  if constexpr (T::kStages == 2) {
    if (n_lo < n_hi) {
      load_k(0, 0);
      load_v(0, 0);
    }
    cp_async_commit();
    int stage = 0;  // also the row-source slot: both alternate per block
    for (int n0 = n_lo; n0 < n_hi; n0 += T::kBlockN, stage ^= 1) {
      cp_async_wait_all();
      // One barrier per block: this block (and Q) landed for every warp, and every warp is done
      // with the previous block, whose tile stage is refilled next.
      __syncthreads();
      const auto load_next = [&] {  // the next block loads while this one is used
        if (n0 + T::kBlockN < n_hi) {
          load_k(stage ^ 1, stage ^ 1);
          load_v(stage ^ 1, stage ^ 1);
        }
      };
      // An fp8 cache's loads are synchronous (converted on their way, fp8.cuh): after this block's
      // math, whose score registers are free by then (before it, d 128 spills on sm_90a).
      if constexpr (!T::kFp8Cache) load_next();
      cp_async_commit();
      scores(stage);
      online_softmax(n0);
      accumulate(stage);
      if constexpr (T::kFp8Cache) load_next();
      // This slot's block was loaded before the barrier; the next barrier orders this write
      // before the loads that read it.
      fill_row_sources(n0 + 2 * T::kBlockN, stage);
    }
  } else {
    if (n_lo < n_hi) load_k(0, 0);
    cp_async_commit();
    int slot = 0;
    for (int n0 = n_lo; n0 < n_hi; n0 += T::kBlockN, slot ^= 1) {
      cp_async_wait_all();
      __syncthreads();  // K (and Q) landed; every warp is done with the previous V
      load_v(0, slot);
      cp_async_commit();
      scores(0);
      online_softmax(n0);
      cp_async_wait_all();
      __syncthreads();  // V landed; every warp is done with K; the next block's sources are in
      if (n0 + T::kBlockN < n_hi) load_k(0, slot ^ 1);
      cp_async_commit();
      accumulate(0);
      fill_row_sources(n0 + 2 * T::kBlockN, slot);  // read by load_v above, before the barrier
    }
  }
  cp_async_wait_all();

  // Epilogue: each warp normalises its rows (adding the sink's term, split 0 only) into sO, which
  // reuses the tiles' memory, then the CTA stores the real rows and channels coalesced.
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      row_sum[mt][h] += __shfl_xor_sync(0xffffffffu, row_sum[mt][h], 1);
      row_sum[mt][h] += __shfl_xor_sync(0xffffffffu, row_sum[mt][h], 2);
    }
  }
  __syncthreads();  // every warp is done with the tiles
#pragma unroll
  for (int rh = 0; rh < 2 * kMT; ++rh) {
    const int mt = rh / 2, h = rh % 2;
    const int r = warp_row(mt, h);
    float l = row_sum[mt][h];
    float m = row_max[mt][h];
    float keys_scale = 1.0f;  // of the keys' state, when the sink raises the maximum
    if (add_sink) keys_scale = fold_sink(sink_log2(p, hk, min(row0 + r, packed_rows - 1)), m, l);
    const bool nonempty = l > 0.0f && m != -INFINITY;
    const float factor = nonempty ? keys_scale / l * descales.v : 0.0f;
    if (t == 0 && wv == 0) sLse[r] = nonempty ? (m + log2f(l)) * kLn2 : -INFINITY;
    float* o_row = sO + r * T::kOStride + 2 * t + wv * T::kSliceV;
#pragma unroll
    for (int i = 0; i < kOTiles; ++i) {
      o_row[i * 8] = o_acc[mt][i][2 * h] * factor;
      o_row[i * 8 + 1] = o_acc[mt][i][2 * h + 1] * factor;
    }
  }
  __syncthreads();
  store_rows<Elem>(p, start.dst_rows, hk, row0, T::kBlockM,
                   [&](int r, int c) { return *reinterpret_cast<const float4*>(sO + r * T::kOStride + c); },
                   [&](int r) { return sLse[r]; });
}

// Prefill shape: the sm80 tile table (core/tile_size.h), which the planner reads too. Widest head
// dim 96 or 128: 4 warps of 32 rows (two m16 tiles each, so every K / V fragment feeds two mma),
// two CTAs per SM at up to 255 registers. Head dim 64 (128 x 128 tiles, wide score rows) and
// above 128 (wide accumulators): one m16 tile per warp, whose registers fit without spilling,
// and one CTA per SM as the register budget's aim. d_v 512: two warps per 16 rows, 256 dims of
// V each (128 accumulators; 8 warps, 64 x 32 tiles).
constexpr int prefill_warps_v(int headdim_v) { return headdim_v > 256 ? 2 : 1; }
constexpr bool prefill_two_m_tiles(int headdim, int headdim_v) {
  const int widest = headdim > headdim_v ? headdim : headdim_v;
  return widest > 64 && widest <= 128;
}
constexpr int prefill_m_tiles(int headdim, int headdim_v) {
  return prefill_two_m_tiles(headdim, headdim_v) ? 2 : 1;
}
constexpr int prefill_min_blocks(int headdim, int headdim_v) {
  return prefill_two_m_tiles(headdim, headdim_v) ? 2 : 1;
}
template <class Row, int kHeadDim, int kHeadDimV,
          core::TileSize kTile = core::tile_size_sm80(core::TileInputs{kHeadDim, kHeadDimV})>
using PrefillTraits = AttentionTraits<Row, kHeadDim, kHeadDimV, kTile.block_m, kTile.block_n,
                                      prefill_min_blocks(kHeadDim, kHeadDimV),
                                      prefill_m_tiles(kHeadDim, kHeadDimV), prefill_warps_v(kHeadDimV)>;

}  // namespace kvflash::cuda
