// The Hopper (sm_90a) MLA decode kernel, laid out the way FlashMLA's sm90 decode is. MLA has one KV
// head whose key row is 576 wide: 512 latent channels (v_cache, also the values) and 64 rope
// channels (k_cache); a query row is qv (512) and q (64), and its scores are qv.v + q.k (only_qv:
// qv.v alone). A CTA owns 64 packed query rows (the query heads x tokens of one sequence, packed
// as the portable kernels pack GQA) and walks its split's keys in blocks of 64, last to first, so
// that every key row is read once for all the heads of the tile:
//  - The query rows are the M dimension of both GEMMs: S = [qv | q] [v | k]^T is one 64 x 64 x 576
//    wgmma batch (operands in shared memory), O += P V one 64 x 512 x 64 batch.
//  - Warp group 0 computes S, the online softmax and O's first 256 latent channels (P from its
//    registers); it hands P and the rows' rescale to group 1 through shared memory.
//  - Warp group 1 loads: Q once, then each key block by cp.async into the other of two stages
//    while the block before is computed. Rows are gathered one by one through the page table, so
//    pages of any size (1, 16, 64 ...), dense caches and leftpad take the same path; it also
//    computes O's other 256 channels from group 0's P.
// Keys outside the CTA's range (its split, the sequence, a bad page id) are never read: their
// rows are zero-filled and their scores masked, so unused cache slots (NaN too) cannot reach the
// output. Splits, masks (causal bottom-right, windows), softcap, sinks, varlen and the LSE follow
// the portable kernels' helpers (cta_work.cuh); partials go to the shared combine.
#pragma once

#include <cuda_runtime.h>

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/cutlass.h>
#include <cutlass/gemm/collective/builders/sm90_common.inl>

#include "core/kernel_family.h"
#include "cuda/common/cta_work.cuh"
#include "cuda/common/launch.cuh"
#include "cuda/common/lengths.cuh"
#include "cuda/common/mma.cuh"
#include "cuda/sm90/wgmma.cuh"

namespace kvflash::cuda::sm90 {

template <class Elem_>
struct MlaTraits {
  using Elem = Elem_;  // __nv_bfloat16 or __half
  using E = typename CuteElem<Elem>::type;
  static constexpr int kBlockM = core::kSm90MlaBlockM;  // packed query rows per CTA
  static constexpr int kBlockN = core::kSm90MlaBlockN;  // keys per block
  static constexpr int kLatent = 512;                   // d_v: v_cache, qv, out
  static constexpr int kRope = 64;                      // d: k_cache, q
  static constexpr int kRow = kLatent + kRope;          // a tile row: latent channels, then rope
  static constexpr int kGroupThreads = 128;
  static constexpr int kThreads = 2 * kGroupThreads;

  using TileS = Shape<Int<kBlockM>, Int<kBlockN>, Int<kRow>>;
  using TileO = Shape<Int<kBlockM>, Int<kLatent / 2>, Int<kBlockN>>;  // one group's half of O
  using MmaS = decltype(make_tiled_mma(GMMA::ss_op_selector<E, E, float, TileS>()));
  using MmaO = decltype(make_tiled_mma(GMMA::rs_op_selector<E, E, float, TileO, GMMA::Major::K, GMMA::Major::MN>(),
                                       Layout<Shape<_1, _2, _1>>{}));
  // Q and each key stage: 64 rows x 576, 128-byte swizzled. Its first 512 columns have the
  // layout of a 64 x 512 tile (the swizzle atom is 8 x 64), so V is the same bytes, and V^T (the
  // P V GEMM's B operand) a transposed view of them.
  using SmemAtom = decltype(cutlass::gemm::collective::detail::ss_smem_selector<GMMA::Major::K, E, Int<kBlockN>,
                                                                                Int<kRow>>());
  static_assert(kBlockM == kBlockN, "Q and the key stages share one layout");
  using SmemLayoutRows = decltype(tile_to_shape(SmemAtom{}, Shape<Int<kBlockN>, Int<kRow>>{}));
  using SmemLayoutV = decltype(tile_to_shape(SmemAtom{}, Shape<Int<kBlockN>, Int<kLatent>>{}));
  using SmemLayoutVt = decltype(composition(
      SmemLayoutV{}, make_ordered_layout(Shape<Int<kLatent>, Int<kBlockN>>{}, Step<_2, _1>{})));
  static constexpr int kTileElems = kBlockN * kRow;
  // A stage's offset in units of a wgmma descriptor's address (16 bytes).
  static constexpr int kStageDescUnits = kTileElems * int(sizeof(E)) / 16;

  // Loading a tile: 8 threads per row (128 contiguous bytes each pass), 16 rows per pass.
  static constexpr int kChunks = kRow / 8;  // 16-byte chunks per row
  static constexpr int kLatentChunks = kLatent / 8;
  static constexpr int kThreadsPerRow = 8;
  static constexpr int kRowsPerPass = kGroupThreads / kThreadsPerRow;
  static constexpr int kPasses = kBlockN / kRowsPerPass;
  static_assert(kChunks % kThreadsPerRow == 0, "whole chunks per thread");
  // Element offset of row `row`'s 16-byte chunk `chunk` in a stage (SmemLayoutRows; checked
  // against CuTe by tests/cuda/sm90_mla_layouts.cu): 8-row x 64-column swizzle atoms stacked down
  // the rows first, and in an atom chunk c of row r at c ^ r (the 128-byte swizzle).
  static constexpr int chunk_offset(int row, int chunk) {
    return (row / 8 + kBlockN / 8 * (chunk / 8)) * 512 + (row % 8) * 64 + ((chunk % 8) ^ (row % 8)) * 8;
  }
  // A thread's rows step by whole atoms (16 rows) and its chunks by whole atom columns, so its
  // swizzle phase never changes: copy (i, j) is chunk_offset(i * kRowsPerPass, j * 8) past its first.
  static_assert(kThreadsPerRow == 8 && kRowsPerPass % 8 == 0, "a thread's chunks keep one swizzle phase");

  // What group 0 hands to group 1 per block: each thread's P (kPValues 16-bit values) and its
  // rows' rescale; thread t of group 1 holds the same rows as thread t of group 0.
  static constexpr int kPValues = kBlockM * kBlockN / kGroupThreads;
  static constexpr int kRowsPerThread = 2;
  struct SharedStorage {
    cute::array_aligned<E, kTileElems, 1024> q;
    cute::array_aligned<E, 2 * kTileElems, 1024> k;
    uint4 p[kPValues * int(sizeof(E)) / 16][kGroupThreads];
    float alpha[kRowsPerThread][kGroupThreads];
    float factor[kBlockM], lse[kBlockM];
  };
  // The epilogue's fp32 O tile (rows padded by 4 floats) reuses the Q and key tiles.
  static constexpr int kOStride = kLatent + 4;
  static_assert(kBlockM * kOStride * 4 <= 3 * kTileElems * int(sizeof(E)), "the O tile fits over Q and K");
  static constexpr int kSmemBytes = int(sizeof(SharedStorage));
  static_assert(kSmemBytes <= 227 * 1024, "an sm_90 CTA's shared memory");
};

// Named barriers (past CUTLASS's reserved ones), both groups' 256 threads each: a key block is in
// its stage (and the other stage and the P buffer are free), and group 0 has written a block's P
// and rescale.
enum MlaBarrier : uint32_t { kMlaBlockReady = 1, kMlaPReady = 2 };

// Both groups wait at each barrier, each from its own code: that takes the unaligned barrier.sync.
// The aligned bar.sync (NamedBarrier::sync) promises that all the threads waiting on one barrier
// run the same instruction; compute-sanitizer's synccheck reports the breach as divergent threads.
// kMlaPReady was once group 0's bar.arrive against group 1's wait: racecheck then reported RAW
// hazards across the epilogue's __syncthreads (group 1's sO writes, group 0's reads); with both
// groups waiting it reports none, and group 0 rarely waits there (group 1 only issues the next
// block's loads between the two barriers).
template <class T>
__device__ __forceinline__ void sync_groups(MlaBarrier barrier) {
  cutlass::arch::NamedBarrier(T::kThreads, barrier).arrive_and_wait_unaligned();
}

// A descriptor fragment of stage 0 moved to `stage`.
template <class T, class Frag>
__device__ __forceinline__ Frag at_stage(Frag frag, int stage) {
  frag.data() = frag.data() + stage * T::kStageDescUnits;
  return frag;
}

// Where this thread's rows of a tile come from: pass i's row, latent and rope channels (kZeroRow
// for rows not read and for the rope channels of only_qv).
template <class Elem, int kPasses>
struct RowSources {
  const Elem* latent[kPasses];
  const Elem* rope[kPasses];
};

template <class Elem>
__device__ __forceinline__ const Elem* zero_row() {
  static_assert(sizeof(kZeroRow) >= 512 * sizeof(Elem), "the zero row covers a latent row");
  return reinterpret_cast<const Elem*>(kZeroRow);
}

// Copies this thread's (t of the loading group) chunks of a 64 x 576 tile: rows t / 8 + 16 i,
// chunks t % 8 + 8 j. kWholeRows (latent_dim 512, rope_dim 64 or 0): every chunk is copied, from
// its row's pointer plus a constant to the thread's first destination plus a constant, one
// instruction per copy (ncu on the H100: CuTe's swizzle of each runtime coordinate cost ~27
// instructions per copy, and the loading group's issue bound the memory-bound rows). Otherwise
// chunks past latent_dim / rope_dim are zero-filled (their source: any_address).
template <class T, bool kWholeRows>
__device__ __forceinline__ void copy_tile(typename T::E* tile, int t,
                                          const RowSources<typename T::Elem, T::kPasses>& src, int latent_dim,
                                          int rope_dim, const void* any_address) {
  const int row = t / T::kThreadsPerRow, first_chunk = t % T::kThreadsPerRow;
  const uint32_t dst = smem_addr(tile + T::chunk_offset(row, first_chunk));
  CUTLASS_PRAGMA_UNROLL
  for (int i = 0; i < T::kPasses; ++i) {
    CUTLASS_PRAGMA_UNROLL
    for (int j = 0; j < T::kChunks / T::kThreadsPerRow; ++j) {
      constexpr int kElemBytes = int(sizeof(typename T::E));
      const uint32_t to = dst + T::chunk_offset(i * T::kRowsPerPass, j * T::kThreadsPerRow) * kElemBytes;
      const bool latent = j < T::kLatentChunks / T::kThreadsPerRow;
      const int ch = (latent ? j * T::kThreadsPerRow : j * T::kThreadsPerRow - T::kLatentChunks) * 8 + first_chunk * 8;
      const typename T::Elem* from = (latent ? src.latent[i] : src.rope[i]) + ch;
      if constexpr (kWholeRows) {
        cp_async_16(to, from, true);
      } else {
        const bool ok = ch < (latent ? latent_dim : rope_dim);
        cp_async_16(to, ok ? from : any_address, ok);
      }
    }
  }
}

// The packed query rows of the CTA: qv as latent, q as rope (absent with only_qv: headdim 0).
template <class T>
__device__ __forceinline__ RowSources<typename T::Elem, T::kPasses> query_sources(const AttentionParams& p,
                                                                                   const CtaStart& start, int hk,
                                                                                   int row0, int t) {
  using Elem = typename T::Elem;
  RowSources<Elem, T::kPasses> src;
  CUTLASS_PRAGMA_UNROLL
  for (int i = 0; i < T::kPasses; ++i) {
    const int idx = row0 + t / T::kThreadsPerRow + i * T::kRowsPerPass;
    const bool real = idx < start.packed_rows;
    src.latent[i] = real ? packed_row<Elem>(p.qv, p, start.col, hk, idx) : zero_row<Elem>();
    src.rope[i] = real && p.headdim > 0 ? packed_row<Elem>(p.q, p, start.col, hk, idx) : zero_row<Elem>();
  }
  return src;
}

// Key block n's rows: v_cache as latent, k_cache as rope; rows outside the CTA's keys or at a bad
// page id are not read.
template <class T>
__device__ __forceinline__ RowSources<typename T::Elem, T::kPasses> key_sources(const AttentionParams& p,
                                                                                 const CtaStart& start, int hk, int n,
                                                                                 int t) {
  using Elem = typename T::Elem;
  const CacheParams& c = p.cache;
  const SeqLens& seq = start.col.seq;
  RowSources<Elem, T::kPasses> src;
  CUTLASS_PRAGMA_UNROLL
  for (int i = 0; i < T::kPasses; ++i) {
    const int key = n * T::kBlockN + t / T::kThreadsPerRow + i * T::kRowsPerPass;
    int64_t unit = 0;
    int slot = 0;
    const bool ok = key >= start.keys.lo && key < start.keys.hi &&
                    cache_location(c, seq.cache_row, seq.leftpad + key, unit, slot);
    src.latent[i] = ok ? static_cast<const Elem*>(c.v) + unit * c.v_row_stride + int64_t(slot) * c.v_pos_stride +
                             hk * c.v_head_stride
                       : zero_row<Elem>();
    src.rope[i] = ok && p.headdim > 0 ? static_cast<const Elem*>(c.k) + unit * c.k_row_stride +
                                            int64_t(slot) * c.k_pos_stride + hk * c.k_head_stride
                                      : zero_row<Elem>();
  }
  return src;
}

// Group 0: per block, S, the softmax and its half of O; then each row's output factor and LSE.
template <class T, class TO>
__device__ __forceinline__ void score_group(const AttentionParams& p, typename T::SharedStorage& ss,
                                            const CtaStart& start, int hk, int row0, int n_first, int n_last,
                                            typename T::MmaO& mma_o, TO& tOrO) {
  using E = typename T::E;
  const int t = threadIdx.x;
  typename T::MmaS mma_s;
  auto thr_s = mma_s.get_thread_slice(t);
  Tensor tSrQ = thr_s.partition_fragment_A(make_tensor(make_smem_ptr(ss.q.data()), typename T::SmemLayoutRows{}));
  Tensor tSrK = thr_s.partition_fragment_B(make_tensor(make_smem_ptr(ss.k.data()), typename T::SmemLayoutRows{}));
  Tensor tOrV = mma_o.get_thread_slice(t).partition_fragment_B(
      make_tensor(make_smem_ptr(ss.k.data()), typename T::SmemLayoutVt{}));
  Tensor tScS = thr_s.partition_C(make_identity_tensor(select<0, 1>(typename T::TileS{})));
  Tensor rc = make_tensor(tScS.data(), rows_cols(tScS.layout()));
  constexpr int kRows = decltype(size<0>(rc))::value;
  static_assert(kRows == T::kRowsPerThread);
  RowSoftmax<kRows> sm(p, start, row0, T::kBlockM, rc);
  const ScoreScale scale(p);
  const bool with_rope = p.headdim > 0;  // only_qv: the rope channels (zeros) are not multiplied

  int stage = 0;
  for (int n = n_last; n >= n_first; --n, stage ^= 1) {
    sync_groups<T>(kMlaBlockReady);  // block n is in `stage`; P is free
    Tensor tSrS = partition_fragment_C(mma_s, select<0, 1>(typename T::TileS{}));
    if (with_rope) warpgroup_gemm<true, 0>(mma_s, tSrQ, at_stage<T>(tSrK, stage), tSrS);
    else warpgroup_gemm<true, 0, false, T::kLatent / 16>(mma_s, tSrQ, at_stage<T>(tSrK, stage), tSrS);
    float alpha[kRows];
    sm.template step<T::kBlockN>(tSrS, rc, n * T::kBlockN, scale, alpha);
    Tensor rP = scores_as_a<typename T::Elem, E>(tSrS);
    const uint4* p_chunks = reinterpret_cast<const uint4*>(raw_pointer_cast(rP.data()));
    CUTLASS_PRAGMA_UNROLL
    for (int j = 0; j < int(sizeof(ss.p) / sizeof(ss.p[0])); ++j) ss.p[j][t] = p_chunks[j];
    CUTLASS_PRAGMA_UNROLL
    for (int r = 0; r < kRows; ++r) ss.alpha[r][t] = alpha[r];
    sync_groups<T>(kMlaPReady);
    rescale_rows(tOrO, alpha);
    warpgroup_gemm<false, 0, true>(mma_o, rP, at_stage<T>(tOrV, stage), tOrO);
  }

  CUTLASS_PRAGMA_UNROLL
  for (int r = 0; r < kRows; ++r) {
    const int tile_row = get<0>(rc(r, 0));
    float lse;
    const float factor = sm.finish(p, start, hk, row0 + tile_row, r, lse);
    if (t % 4 == 0) ss.factor[tile_row] = factor, ss.lse[tile_row] = lse;
  }
}

// Group 1: Q and the key blocks into shared memory (block n - 1 loading while block n is
// computed), and per block its half of O from group 0's P.
template <class T, class TO>
__device__ __forceinline__ void load_group(const AttentionParams& p, typename T::SharedStorage& ss,
                                           const CtaStart& start, int hk, int row0, int n_first, int n_last,
                                           typename T::MmaO& mma_o, TO& tOrO) {
  using E = typename T::E;
  const int t = threadIdx.x - T::kGroupThreads;
  Tensor tOrV = mma_o.get_thread_slice(threadIdx.x)
                    .partition_fragment_B(make_tensor(make_smem_ptr(ss.k.data()), typename T::SmemLayoutVt{}));
  typename T::MmaS mma_s;  // P arrives in the layout of group 0's S accumulator
  const auto s_layout = partition_fragment_C(mma_s, select<0, 1>(typename T::TileS{})).layout();
  const int latent_dim = p.headdim_v, rope_dim = p.headdim;
  const void* any_address = p.qv.data;
  const bool whole_rows = latent_dim == T::kLatent && (rope_dim == T::kRope || rope_dim == 0);
  auto copy = [&](E* tile, const RowSources<typename T::Elem, T::kPasses>& src) {
    if (whole_rows) copy_tile<T, true>(tile, t, src, latent_dim, rope_dim, any_address);
    else copy_tile<T, false>(tile, t, src, latent_dim, rope_dim, any_address);
  };

  if (n_last >= n_first) {
    copy(ss.q.data(), query_sources<T>(p, start, hk, row0, t));
    copy(ss.k.data(), key_sources<T>(p, start, hk, n_last, t));
    cp_async_commit();
  }
  // The next block's row sources are looked up a block ahead: page-table reads off the critical path.
  auto next = key_sources<T>(p, start, hk, n_last - 1, t);
  int stage = 0;
  for (int n = n_last; n >= n_first; --n, stage ^= 1) {
    cp_async_wait_all();
    cutlass::arch::fence_view_async_shared();  // cp.async's writes, then wgmma's reads
    sync_groups<T>(kMlaBlockReady);  // block n is in `stage`; `stage ^ 1` is free
    if (n > n_first) {
      copy(ss.k.data() + (stage ^ 1) * T::kTileElems, next);
      cp_async_commit();
      next = key_sources<T>(p, start, hk, n - 2, t);
    }
    sync_groups<T>(kMlaPReady);
    Tensor rP = make_tensor<E>(acc_as_a(s_layout));
    uint4* p_chunks = reinterpret_cast<uint4*>(raw_pointer_cast(rP.data()));
    CUTLASS_PRAGMA_UNROLL
    for (int j = 0; j < int(sizeof(ss.p) / sizeof(ss.p[0])); ++j) p_chunks[j] = ss.p[j][t];
    float alpha[T::kRowsPerThread];
    CUTLASS_PRAGMA_UNROLL
    for (int r = 0; r < T::kRowsPerThread; ++r) alpha[r] = ss.alpha[r][t];
    rescale_rows(tOrO, alpha);
    warpgroup_gemm<false, 0, true>(mma_o, rP, at_stage<T>(tOrV, stage), tOrO);
  }
}

template <class T>
__global__ void __launch_bounds__(T::kThreads, 1) mla_kernel(const __grid_constant__ AttentionParams p) {
  extern __shared__ __align__(1024) char smem_raw[];
  auto& ss = *reinterpret_cast<typename T::SharedStorage*>(smem_raw);
  const int hk = blockIdx.y;
  const int row0 = blockIdx.x * T::kBlockM;
  CtaStart start;
  if (!start_cta<typename T::Elem>(p, row0, T::kBlockM, start)) return;
  const int n_first = start.keys.lo / T::kBlockN;
  const int n_last = start.keys.hi > start.keys.lo ? (start.keys.hi - 1) / T::kBlockN : n_first - 1;

  typename T::MmaO mma_o;
  Tensor tOrO = partition_fragment_C(mma_o, Shape<Int<T::kBlockM>, Int<T::kLatent>>{});
  clear(tOrO);
  if (threadIdx.x < T::kGroupThreads) score_group<T>(p, ss, start, hk, row0, n_first, n_last, mma_o, tOrO);
  else load_group<T>(p, ss, start, hk, row0, n_first, n_last, mma_o, tOrO);

  // Epilogue: every GEMM is done and each row's factor written; the normalised fp32 O tile goes
  // over the Q / K tiles, then the CTA stores it coalesced.
  __syncthreads();
  float* sO = reinterpret_cast<float*>(ss.q.data());
  Tensor tOcO = mma_o.get_thread_slice(threadIdx.x).partition_C(
      make_identity_tensor(Shape<Int<T::kBlockM>, Int<T::kLatent>>{}));
  write_scaled_rows(tOrO, tOcO, [&](int, int tile_row) { return ss.factor[tile_row]; },
                    [&](auto row, auto col, float v) { sO[row * T::kOStride + col] = v; });
  __syncthreads();
  store_rows<typename T::Elem>(
      p, start.dst_rows, hk, row0, T::kBlockM,
      [&](int r, int c) { return *reinterpret_cast<const float4*>(sO + r * T::kOStride + c); },
      [&](int r) { return ss.lse[r]; });
}

// One CTA per 64 packed query rows x KV head x (sequence, split) column (attention_grid).
// Requires: d <= 64 and d_v <= 512, multiples of 8, rows 16-byte aligned (the backend's checks).
template <class Elem>
void launch_mla(const AttentionParams& p, bool overlap_previous, cudaStream_t stream) {
  using T = MlaTraits<Elem>;
  const AttentionGrid g = attention_grid(p, T::kBlockM);
  if (g.x == 0 || g.z == 0) return;
  opt_in_dynamic_smem<mla_kernel<T>>(T::kSmemBytes);
  launch_kernel(mla_kernel<T>, dim3(unsigned(g.x), unsigned(g.y), unsigned(g.z)), dim3(T::kThreads), T::kSmemBytes,
                overlap_previous, stream, p);
}

}  // namespace kvflash::cuda::sm90
