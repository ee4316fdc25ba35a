// The Hopper (sm_90a) prefill family: FA3's structure written with CuTe. A CTA owns kBlockM query
// rows of one query head of one sequence (GQA heads are not packed: K/V head = head / kv_group).
//  - Warp group 0 is the producer: one thread moves the Q tile and every K / V block by TMA into
//    swizzled shared memory (128-byte; 64-byte rows at d 96), kStages deep, each completing on an mbarrier
//    (cutlass::PipelineTmaAsync: full barriers count bytes, empty barriers count consumers).
//    A paged cache whose pages are smaller than a block (kPageKeys) is read one page per copy,
//    a lane of the producer's first warp per page.
//  - kConsumerWGs consumer warp groups (64 rows each) run S = Q K^T as wgmma with both operands in
//    shared memory, the online softmax in registers, and O += P V as wgmma with P from registers
//    (the accumulator layout reused as the A fragment) and V^T read through a transposed view.
//  - With two consumer groups the producer gives its registers to them (setmaxnreg 24 / 240), with
//    three (192 rows, FA3's tile at d 64) 24 / 160; so does it with one group when two or three
//    CTAs share an SM (kCtasPerSm, 24 / 232 or 24 / 136).
//  - kOverlap: within a group, the S GEMM of block j+1 and the P V GEMM of block j are issued
//    together and the softmax of block j+1 runs while the tensor cores work (FA3's intra-warpgroup
//    overlap).
//  - kPingPong (two groups, with kOverlap): the groups take turns issuing their GEMMs (two named
//    barriers), so one group's softmax runs while the other's GEMMs use the tensor cores.
//  - kPersistent (kOverlap, no ping-pong): one CTA per SM walks the tiles (query block, head,
//    sequence; the longest causal blocks first), its barriers and pipelines set up once. The
//    producer loads the next tile's first K / V block while the consumers finish the tile before;
//    the epilogue writes O in the element type over the Q tile only (not over K / V), and the next
//    Q waits for the consumers' stores (a named barrier).
//  - fp8 (Elem __nv_fp8_e4m3: FA3's all-fp8 call, rung 3's and rung 4's kernels): Q, K and V tiles in
//    e4m3, a bf16 output, the descales in the score scale and the output factor. 8-bit wgmma reads
//    V^T K-major: the producer group's warps 1-3 transpose each V stage into a V^T stage
//    (fp8_v.cuh; a second pipeline hands it to the consumers), keys in P's register order.
// Key blocks run last to first, so the masked blocks (a causal diagonal, the sequence end) come
// first. What a CTA reads and where it writes reuse the portable family's helpers (cta_work.cuh):
// column, key range, visible keys per row (core/mask.h), sinks, and the coalesced row store.
//
// Never wrong on unused cache slots: TMA zero-fills rows past a tensor's end; rows past the
// sequence but inside the cache (any content, NaN too) are masked in S, and in the one block that
// crosses the sequence end the consumers zero those V rows before P V (0 * NaN would be NaN).
#pragma once

#include <cuda_runtime.h>

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>
#include <cutlass/cutlass.h>
#include <cutlass/gemm/collective/builders/sm90_common.inl>
#include <cutlass/numeric_types.h>
#include <cutlass/pipeline/pipeline.hpp>

#include "core/env_switch.h"
#include "core/kernel_family.h"
#include "cuda/common/cta_work.cuh"
#include "cuda/common/launch.cuh"
#include "cuda/common/params.h"
#include "cuda/sm90/fp8_v.cuh"
#include "cuda/sm90/wgmma.cuh"

namespace kvflash::cuda::sm90 {

using namespace cute;

template <class Elem_, int kHeadDim_, int kHeadDimV_, int kBlockM_, int kBlockN_, int kStages_, int kConsumerWGs_, bool kOverlap_,
          bool kPingPong_ = false, int kPageKeys_ = 0, bool kPersistent_ = false, int kCtasPerSm_ = 1>
struct PrefillTraits {
  using Elem = Elem_;  // __nv_bfloat16, __half or (FA3's all-fp8 call) __nv_fp8_e4m3
  using E = typename CuteElem<Elem>::type;
  // fp8: q, K and V e4m3, a bf16 output; V^T made by the producer group (fp8_v.cuh). Rungs 3, 4.
  static constexpr bool kFp8 = std::is_same_v<Elem, __nv_fp8_e4m3>;
  using Out = conditional_t<kFp8, __nv_bfloat16, Elem>;
  // Q and K rows have kHeadDim channels, V and O rows kHeadDimV (equal, or 192 / 128).
  static constexpr int kHeadDim = kHeadDim_, kHeadDimV = kHeadDimV_;
  static constexpr int kBlockM = kBlockM_, kBlockN = kBlockN_, kStages = kStages_;
  static constexpr int kConsumerWGs = kConsumerWGs_;
  static constexpr bool kOverlap = kOverlap_;
  static constexpr bool kPingPong = kPingPong_;
  static_assert(!kPingPong || (kOverlap && kConsumerWGs_ == 2), "ping-pong: two overlapping groups");
  static constexpr bool kPersistent = kPersistent_;
  static_assert(!kPersistent || (kOverlap && !kPingPong && kConsumerWGs_ == 2), "persistent: rung 3's groups");
  static_assert(!kPersistent || kHeadDimV % 64 == 0, "the persistent O tile swizzles 8 16-byte chunks per row");
  static constexpr int kConsumerThreads = 128 * kConsumerWGs;
  static constexpr int kThreads = 128 + kConsumerThreads;
  // CTAs resident per SM (launch bounds): two or more with one consumer group, so that one CTA's
  // prologue and epilogue overlap the others' GEMMs (short sequences: many small tiles).
  static constexpr int kCtasPerSm = kCtasPerSm_;
  static_assert(kCtasPerSm == 1 || (kConsumerWGs_ == 1 && !kPersistent_), "several CTAs: one group");
  // Producer / consumer registers per thread after setmaxnreg: the producer keeps 24, the
  // consumers take the rest of the CTA's share of the register file (whole multiples of 8). One
  // CTA of one consumer group does not reallocate: 256 threads already get 255 each.
  static_assert(!kFp8 || (kConsumerWGs_ == 2 && kOverlap_ && !kPersistent_ && kHeadDim_ == kHeadDimV_),
                "fp8: rung 3's or rung 4's kernel at d == d_v");
  static constexpr bool kReallocate = kConsumerWGs >= 2 || kCtasPerSm >= 2;
  // The transposers (fp8) keep more than the TMA lane needs: their lane's address constants, a
  // unit's words and addresses, two pipelines' states (40 spilled them); fp8's consumers need
  // fewer than 16 bits' (P in half the registers).
  static constexpr int kProducerRegs = kFp8 ? 56 : 24;
  static constexpr int kLaunchRegs = 65536 / (kThreads * kCtasPerSm) / 8 * 8;
  static constexpr int kConsumerRegs = (kLaunchRegs * kThreads - 128 * kProducerRegs) / kConsumerThreads / 8 * 8;
  // Three groups (FA3's 192-row tile at d 64) share the file at 160 each, as FA3's do; three
  // small-tile CTAs per SM leave their one group 136 (64 x 64 tiles at d 64).
  static_assert(!kReallocate || kConsumerRegs >= (kCtasPerSm > 2     ? 136
                                                  : kConsumerWGs == 3 ? 160
                                                  : kFp8              ? 224
                                                                      : 232),
                "the consumers' registers");
  static_assert(kBlockM == 64 * kConsumerWGs || (kConsumerWGs == 1 && kBlockM == 128), "64 rows per atom");
  // Keys of one TMA copy of K or V (a unit): a whole block (dense caches, pages of whole blocks),
  // or one page of kPageKeys < kBlockN keys, kUnits of them per block.
  static constexpr int kPageKeys = kPageKeys_;
  static constexpr int kUnitRows = kPageKeys > 0 ? kPageKeys : kBlockN;
  static constexpr int kUnits = kBlockN / kUnitRows;
  static_assert(kBlockN % kUnitRows == 0 && kUnits <= 32, "whole pages per block, one producer lane each");
  // The persistent producer is a whole warp: it waits at a named barrier (counted in warps).
  static constexpr int kProducerLanes = kUnits > 1 || kPersistent ? 32 : 1;
  // Pages smaller than a block: all four producer warps issue the page copies (see produce()),
  // except persistent (its producer warp waits at a named barrier) and fp8 (warps 1-3 transpose V).
  static constexpr bool kSpreadUnits = kUnits > 1 && !kPersistent && !kFp8;
  static constexpr int kProducerThreads = kSpreadUnits ? 128 : kProducerLanes;

  using TileQK = Shape<Int<kBlockM>, Int<kBlockN>, Int<kHeadDim>>;
  using TilePV = Shape<Int<kBlockM>, Int<kHeadDimV>, Int<kBlockN>>;
  using AtomLayout = Layout<Shape<Int<kConsumerWGs>, _1, _1>>;
  using MmaQK = decltype(make_tiled_mma(GMMA::ss_op_selector<E, E, float, TileQK>(), AtomLayout{}));
  // V^T is K-major for 8 bits (wgmma reads 8-bit operands K-major only), else V read transposed.
  static constexpr GMMA::Major kMajorVt = kFp8 ? GMMA::Major::K : GMMA::Major::MN;
  using MmaPV = decltype(make_tiled_mma(GMMA::rs_op_selector<E, E, float, TilePV, GMMA::Major::K, kMajorVt>(),
                                        AtomLayout{}));

  using SmemAtomQ = decltype(cutlass::gemm::collective::detail::ss_smem_selector<GMMA::Major::K, E, Int<kBlockM>,
                                                                                 Int<kHeadDim>>());
  using SmemLayoutQ = decltype(tile_to_shape(SmemAtomQ{}, Shape<Int<kBlockM>, Int<kHeadDim>>{}));
  using SmemAtomK = decltype(cutlass::gemm::collective::detail::ss_smem_selector<GMMA::Major::K, E, Int<kBlockN>,
                                                                                 Int<kHeadDim>>());
  using SmemLayoutK = decltype(tile_to_shape(SmemAtomK{}, Shape<Int<kBlockN>, Int<kHeadDim>, Int<kStages>>{}));
  using SmemAtomV = decltype(cutlass::gemm::collective::detail::ss_smem_selector<GMMA::Major::K, E, Int<kBlockN>,
                                                                                 Int<kHeadDimV>>());
  using SmemLayoutV = decltype(tile_to_shape(SmemAtomV{}, Shape<Int<kBlockN>, Int<kHeadDimV>, Int<kStages>>{}));
  // One unit's rows of a stage's tile: the tile's own layout restricted to kUnitRows rows, so each
  // 128-byte column chunk of a page is one TMA box landing at its rows of that chunk (a whole
  // block: the stage's layout, whose chunks are contiguous: one box). A unit must start where the
  // swizzle pattern does (an atom's rows: 8 rows x 128 B = 1024 B).
  template <class SmemLayout, int kDim>
  using UnitLayout = conditional_t<
      kUnits == 1, decltype(take<0, 2>(SmemLayout{})),
      decltype(composition(take<0, 2>(SmemLayout{}),
                           make_layout(Shape<Int<kUnitRows>, Int<kDim>>{}, Stride<_1, Int<kBlockN>>{})))>;
  using SmemLayoutKUnit = UnitLayout<SmemLayoutK, kHeadDim>;
  using SmemLayoutVUnit = UnitLayout<SmemLayoutV, kHeadDimV>;
  static_assert(kUnitRows % size<0>(SmemAtomK{}) == 0 && kUnitRows % size<0>(SmemAtomV{}) == 0,
                "a unit starts at a swizzle atom's first row");
  // V^T as the P V GEMM's B operand (head dim x keys): the same bytes, a transposed view; fp8:
  // its own K-major tiles, written by the transposers.
  using SmemLayoutVt = conditional_t<
      kFp8,
      decltype(tile_to_shape(
          cutlass::gemm::collective::detail::ss_smem_selector<GMMA::Major::K, E, Int<kHeadDimV>, Int<kBlockN>>(),
          Shape<Int<kHeadDimV>, Int<kBlockN>, Int<kStages>>{})),
      decltype(composition(SmemLayoutV{}, make_ordered_layout(Shape<Int<kHeadDimV>, Int<kBlockN>, Int<kStages>>{},
                                                              Step<_2, _1, _3>{})))>;

  // Global tensors as TMA sees them: (row, channel, head, batch row or page).
  using GStride = Stride<int64_t, _1, int64_t, int64_t>;
  using GShape = Shape<int32_t, int32_t, int32_t, int32_t>;
  using TmaQ = decltype(make_tma_copy(
      SM90_TMA_LOAD{}, make_tensor(make_gmem_ptr(static_cast<const E*>(nullptr)), GShape{}, GStride{}),
      SmemLayoutQ{}, Shape<Int<kBlockM>, Int<kHeadDim>>{}, _1{}));
  template <class UnitLayout, int kDim>
  using TmaUnit = decltype(make_tma_copy(
      SM90_TMA_LOAD{}, make_tensor(make_gmem_ptr(static_cast<const E*>(nullptr)), GShape{}, GStride{}),
      UnitLayout{}, Shape<Int<kUnitRows>, Int<kDim>>{}, _1{}));
  using TmaK = TmaUnit<SmemLayoutKUnit, kHeadDim>;
  using TmaV = TmaUnit<SmemLayoutVUnit, kHeadDimV>;
  static constexpr uint32_t kQBytes = kBlockM * kHeadDim * sizeof(E);
  static constexpr uint32_t kKBytes = kBlockN * kHeadDim * sizeof(E);
  static constexpr uint32_t kVBytes = kBlockN * kHeadDimV * sizeof(E);

  using Pipeline = cutlass::PipelineTmaAsync<kStages>;
  using VtPipeline = cutlass::PipelineAsync<kStages>;  // fp8: transposers -> consumers
  // The epilogue's fp32 O tile reuses the Q, K and V (and V^T) tiles, which lie back to back. Rows
  // are padded by 8 floats: half a warp's 64-bit accumulator stores (4 rows x 4 column pairs, one
  // phase) then cover 32 distinct banks.
  static constexpr int kOStride = kHeadDimV + 8;
  static constexpr int kOBytes = kBlockM * kOStride * 4;
  static constexpr int kTileBytes =
      (cosize_v<SmemLayoutQ> + cosize_v<SmemLayoutK> + (kFp8 ? 2 : 1) * cosize_v<SmemLayoutV>) * int(sizeof(E));
  struct SharedStorage16 {
    cute::array_aligned<E, cosize_v<SmemLayoutQ>, 1024> q;
    cute::array_aligned<E, cosize_v<SmemLayoutK>, 1024> k;
    cute::array_aligned<E, cosize_v<SmemLayoutV>, 1024> v;
    float lse[kBlockM];
    alignas(16) cutlass::arch::ClusterTransactionBarrier q_full;
    typename Pipeline::SharedStorage pipe_k, pipe_v;
  };
  // fp8: 1-byte tiles hold fewer bytes than the fp32 O tile at d 256, hence the padding after V^T.
  struct SharedStorageFp8 {
    cute::array_aligned<E, cosize_v<SmemLayoutQ>, 1024> q;
    cute::array_aligned<E, cosize_v<SmemLayoutK>, 1024> k;
    cute::array_aligned<E, cosize_v<SmemLayoutV>, 1024> v;
    cute::array_aligned<E, cosize_v<SmemLayoutVt>, 1024> vt;
    char o_pad[kOBytes > kTileBytes ? kOBytes - kTileBytes : 16];
    float lse[kBlockM];
    alignas(16) cutlass::arch::ClusterTransactionBarrier q_full;
    typename Pipeline::SharedStorage pipe_k, pipe_v;
    typename VtPipeline::SharedStorage pipe_vt;
  };
  using SharedStorage = conditional_t<kFp8, SharedStorageFp8, SharedStorage16>;
  static_assert(kOBytes <= kTileBytes || kFp8, "the O tile fits over the Q / K / V tiles");
  static_assert(!kFp8 || (cosize_v<SmemLayoutQ> % 1024 == 0 && cosize_v<SmemLayoutK> % 1024 == 0 &&
                          cosize_v<SmemLayoutV> % 1024 == 0 && cosize_v<SmemLayoutVt> % 1024 == 0),
                "fp8: the tiles and the padding lie back to back");
  static constexpr int kSmemBytes = int(sizeof(SharedStorage));
  static_assert(kCtasPerSm == 1 || kCtasPerSm * (kSmemBytes + 1024) <= 228 * 1024, "the CTAs' shared memory");
};

// Kernel parameters: the portable family's (group 1: one query head per CTA row space) and the TMA
// descriptors, which must live in parameter space (__grid_constant__).
template <class T>
struct PrefillParams {
  AttentionParams p;
  int kv_group = 1;           // query heads per K / V head
  int m_blocks = 0;           // query blocks per (head, sequence)
  int num_tiles = 0;          // persistent: m_blocks x heads x sequences
  typename T::GShape q_shape, k_shape, v_shape;
  typename T::TmaQ tma_q;
  typename T::TmaK tma_k;
  typename T::TmaV tma_v;
};

// Where the keys from key0 on (a block or one page of it) of this CTA's sequence start in the K / V
// tensors: (row, unit). Dense: the cache row, keys from leftpad on; paged (no leftpad): the page
// holding key0. A page past pages_per_seq (the last block of a sequence may reach there) or an
// out-of-range page id becomes an out-of-bounds unit: TMA fills zeros.
__device__ __forceinline__ int2 kv_unit_origin(const AttentionParams& p, const SeqLens& seq, int key0) {
  const CacheParams& c = p.cache;
  if (!c.paged) return make_int2(seq.leftpad + key0, seq.cache_row);
  const int page_idx = c.page_size.div(key0);
  int page = c.num_pages;  // out of bounds
  if (page_idx < c.pages_per_seq) {
    const int id = __ldg(c.page_table + int64_t(seq.cache_row) * c.page_table_row_stride +
                         int64_t(page_idx) * c.page_table_col_stride);
    if (id >= 0 && id < c.num_pages) page = id;
  }
  return make_int2(key0 - page_idx * c.page_size.divisor, page);
}

// Named barriers (ids past CUTLASS's reserved ones): the consumers' epilogue, each group's V
// tail (up to three groups), the two groups' GEMM turns (ping-pong), and (persistent) the Q tile
// free again: the consumers arrive once their stores of a tile's O have read it, the producer
// waits before the next Q.
enum Barrier : uint32_t { kEpilogue = 1, kVTail0 = 2, kTurn0 = 5, kQFree = 7 };

template <class T>
__device__ __forceinline__ void wait_q_free() {
  cutlass::arch::NamedBarrier::sync(32 + T::kConsumerThreads, kQFree);
}

// Element (row, column) of the persistent kernel's O tile over Q: rows of kHeadDimV elements, their
// 16-byte chunks swizzled by the row (chunk ^ row % 8), so that the 8 rows a warp writes at once
// fall on different banks. Four channels from a multiple of 4 stay contiguous.
template <class T>
__device__ __forceinline__ int o_tile_index(int row, int col) {
  return row * T::kHeadDimV + ((col / 8) ^ (row % 8)) * 8 + col % 8;
}

// Ping-pong turns: a group waits for its turn before issuing GEMMs and hands the turn over after.
template <class T>
__device__ __forceinline__ void wait_turn(int group) {
  if constexpr (T::kPingPong) cutlass::arch::NamedBarrier::sync(256, kTurn0 + group);
}
template <class T>
__device__ __forceinline__ void pass_turn(int group) {
  if constexpr (T::kPingPong) cutlass::arch::NamedBarrier::arrive(256, kTurn0 + (group ^ 1));
}

// Run by kProducerLanes of the producer group's first warp: lane 0 issues Q and arms the barriers;
// lane u < kUnits looks up and issues unit u of each K / V block (one page each: a block's
// page-table reads run in parallel), every copy completing on the stage's one full barrier, which
// expects the block's bytes (kKBytes / kVBytes: zero-filled boxes count too). `state` carries on from tile
// to tile (persistent); so does Q's barrier. Persistent, Q follows the tile's first K / V block,
// after the consumers have read the tile before out of it (wait_q: not the CTA's first tile).
// kSpreadUnits (pages smaller than a block, not persistent, not fp8): all four producer warps run
// this, lane l of warp w issuing unit 4 l + w. A TMA copy takes uniform operands, so a warp issues
// its lanes' copies one after another (SASS: ~11 instructions each, 32 copies per 128-key block at
// page 16 and d 128, all on the first warp's scheduler beside two consumer warps); spread, each
// scheduler issues a quarter (H100, b1 x 16k d 128 causal: page 8 2.63 -> 1.70 ms, page 16
// 1.90 -> 1.71, dense 1.66; BENCHMARKS.md, session 27). Another warp's copies may complete
// bytes on a full barrier before the leader's expect_tx: its tx-count then goes below zero, which
// the mbarrier allows, and the phase still waits for the leader's arrival.
template <class T>
__device__ __forceinline__ void produce(const PrefillParams<T>& params, typename T::SharedStorage& ss,
                                        typename T::Pipeline& pipe_k, typename T::Pipeline& pipe_v,
                                        cutlass::PipelineState<T::kStages>& state, const CtaStart& start, int head,
                                        int row0, int n_first, int n_last, bool wait_q) {
  using E = typename T::E;
  const AttentionParams& p = params.p;
  const int hk = head / params.kv_group;
  const SeqLens& seq = start.col.seq;
  const int lane = T::kProducerLanes > 1 ? int(threadIdx.x % 32) : 0;
  const int unit = T::kSpreadUnits ? lane * 4 + int(threadIdx.x / 32) : lane;
  const bool issues = unit < T::kUnits;
  // The leader's expect_tx precedes the other lanes' copies (its own warp's).
  auto sync_lanes = [] {
    if constexpr (T::kProducerLanes > 1) __syncwarp();
  };
  auto load_q = [&] {
    if (wait_q) wait_q_free<T>();
    if (threadIdx.x != 0) return;
    // Q: rows [q_offset + row0, + kBlockM) of this head (varlen: one batch row of all tokens).
    const int q_batch = p.len.cu_seqlens_q.data ? 0 : start.col.b;
    Tensor mQ = params.tma_q.get_tma_tensor(params.q_shape)(_, _, head, q_batch);
    Tensor gQ = local_tile(domain_offset(make_coord(seq.q_offset + row0, _0{}), mQ),
                           Shape<Int<T::kBlockM>, Int<T::kHeadDim>>{}, make_coord(_0{}, _0{}));
    Tensor sQ = make_tensor(make_smem_ptr(ss.q.data()), typename T::SmemLayoutQ{});
    auto q_slice = params.tma_q.get_slice(_0{});
    ss.q_full.arrive_and_expect_tx(T::kQBytes);
    copy(params.tma_q.with(reinterpret_cast<uint64_t&>(ss.q_full), 0), q_slice.partition_S(gQ),
         q_slice.partition_D(sQ));
  };
  if constexpr (!T::kPersistent) load_q();

  Tensor mK = params.tma_k.get_tma_tensor(params.k_shape);
  Tensor mV = params.tma_v.get_tma_tensor(params.v_shape);
  Tensor sK = make_tensor(make_smem_ptr(ss.k.data()), typename T::SmemLayoutK{});
  Tensor sV = make_tensor(make_smem_ptr(ss.v.data()), typename T::SmemLayoutV{});
  auto k_slice = params.tma_k.get_slice(_0{});
  auto v_slice = params.tma_v.get_slice(_0{});
  const auto k_unit = Shape<Int<T::kUnitRows>, Int<T::kHeadDim>>{};
  const auto v_unit = Shape<Int<T::kUnitRows>, Int<T::kHeadDimV>>{};
  for (int n = n_last; n >= n_first; --n) {
    const int2 at = kv_unit_origin(p, seq, n * T::kBlockN + (issues ? unit : 0) * T::kUnitRows);
    Tensor gK = local_tile(domain_offset(make_coord(at.x, _0{}), mK(_, _, hk, at.y)), k_unit, make_coord(_0{}, _0{}));
    Tensor gV = local_tile(domain_offset(make_coord(at.x, _0{}), mV(_, _, hk, at.y)), v_unit, make_coord(_0{}, _0{}));
    pipe_k.producer_acquire(state);
    sync_lanes();
    if (issues) {
      copy(params.tma_k.with(*pipe_k.producer_get_barrier(state), 0), k_slice.partition_S(gK),
           k_slice.partition_D(local_tile(sK(_, _, state.index()), k_unit, make_coord(unit, _0{}))));
    }
    pipe_v.producer_acquire(state);
    sync_lanes();
    if (issues) {
      copy(params.tma_v.with(*pipe_v.producer_get_barrier(state), 0), v_slice.partition_S(gV),
           v_slice.partition_D(local_tile(sV(_, _, state.index()), v_unit, make_coord(unit, _0{}))));
    }
    ++state;
    if constexpr (T::kPersistent) {
      if (n == n_last) load_q();
    }
  }
  if constexpr (T::kPersistent) {
    if (n_last < n_first) load_q();  // no key block (a sink alone): Q all the same
  }
}

// The consumers' tile: `state` carries on from tile to tile (persistent), Q's barrier completes
// phase q_phase for this tile. pipe_v: V's pipeline (fp8: V^T's, from the transposers).
template <class T, class PipeV>
__device__ __forceinline__ void consume(const PrefillParams<T>& params, typename T::SharedStorage& ss,
                                        typename T::Pipeline& pipe_k, PipeV& pipe_v,
                                        cutlass::PipelineState<T::kStages>& state, const CtaStart& start, int head,
                                        int row0, int n_first, int n_last, int q_phase) {
  using E = typename T::E;
  const AttentionParams& p = params.p;
  const int thread = threadIdx.x - 128;  // among the consumers
  typename T::MmaQK mma_qk;
  typename T::MmaPV mma_pv;
  auto thr_qk = mma_qk.get_thread_slice(thread);
  auto thr_pv = mma_pv.get_thread_slice(thread);
  Tensor sQ = make_tensor(make_smem_ptr(ss.q.data()), typename T::SmemLayoutQ{});
  Tensor sK = make_tensor(make_smem_ptr(ss.k.data()), typename T::SmemLayoutK{});
  Tensor sV = make_tensor(make_smem_ptr(ss.v.data()), typename T::SmemLayoutV{});
  E* vt_data;
  if constexpr (T::kFp8) vt_data = ss.vt.data();
  else vt_data = ss.v.data();
  Tensor sVt = make_tensor(make_smem_ptr(vt_data), typename T::SmemLayoutVt{});
  Tensor tSrQ = thr_qk.partition_fragment_A(sQ);
  Tensor tSrK = thr_qk.partition_fragment_B(sK);
  Tensor tOrV = thr_pv.partition_fragment_B(sVt);
  Tensor tOrO = partition_fragment_C(mma_pv, select<0, 1>(typename T::TilePV{}));
  clear(tOrO);

  // This thread's rows: their tile index, visible keys and softmax state.
  Tensor cS = make_identity_tensor(select<0, 1>(typename T::TileQK{}));
  Tensor tScS = thr_qk.partition_C(cS);
  Tensor rc = make_tensor(tScS.data(), rows_cols(tScS.layout()));
  constexpr int kRows = decltype(size<0>(rc))::value;
  const SeqLens& seq = start.col.seq;
  RowSoftmax<kRows, T::kFp8 ? kFp8MaxOffset : 0> sm(p, start, row0, T::kBlockM, rc);
  const Fp8Descales descales = T::kFp8 ? Fp8Descales(p, start.col.b, head / params.kv_group) : Fp8Descales();
  const ScoreScale scale(p, descales.qk);
  auto softmax = [&](auto& tSrS, int n, auto& alpha) { sm.template step<T::kBlockN>(tSrS, rc, n * T::kBlockN, scale, alpha); };
  auto rescale_o = [&](const auto& alpha) { rescale_rows(tOrO, alpha); };
  auto to_p = [](auto const& tSrS) {
    if constexpr (T::kFp8) return scores_as_a_fp8<E>(tSrS);
    else return scores_as_a<typename T::Elem, E>(tSrS);
  };
  // Rows of V past the sequence's keys (any content, NaN too) become zeros before P V reads them
  // (fp8: the transposers write them as zeros).
  const int seqlen_k = seq.seqlen_k;
  auto zero_tail_of_v = [&](int n, int stage) {
    const int valid = seqlen_k - n * T::kBlockN;
    if (T::kFp8 || valid >= T::kBlockN) return;
    const int wg_thread = thread % 128;
    for (int e = wg_thread; e < T::kBlockN * T::kHeadDimV; e += 128) {
      const int r = e / T::kHeadDimV, c = e % T::kHeadDimV;
      if (r >= valid) sV(r, c, stage) = E(0.0f);
    }
    cutlass::arch::fence_view_async_shared();
    cutlass::arch::NamedBarrier::sync(128, kVTail0 + thread / 128);
  };

  const int group = thread / 128;
  // The first turn is group 0's: its barrier gets group 1's share of the arrivals up front.
  if (group == 1) pass_turn<T>(group);
  ss.q_full.wait(q_phase);
  const int n_blocks = n_last - n_first + 1;
  if (n_blocks > 0) {
    Tensor tSrS = partition_fragment_C(mma_qk, select<0, 1>(typename T::TileQK{}));
    float alpha[kRows];
    int n = n_last;
    pipe_k.consumer_wait(state);
    wait_turn<T>(group);
    warpgroup_gemm<true, -1>(mma_qk, tSrQ, tSrK(_, _, _, state.index()), tSrS);
    pass_turn<T>(group);
    warpgroup_wait<0>();
    pipe_k.consumer_release(state);
    softmax(tSrS, n, alpha);
    if constexpr (T::kOverlap) {
      Tensor tOrP = to_p(tSrS);
      auto prev = state;
      for (--n, ++state; n >= n_first; --n, ++state) {
        pipe_k.consumer_wait(state);
        pipe_v.consumer_wait(prev);
        zero_tail_of_v(n + 1, prev.index());
        wait_turn<T>(group);
        warpgroup_gemm<true, -1>(mma_qk, tSrQ, tSrK(_, _, _, state.index()), tSrS);
        warpgroup_gemm<false, -1, true>(mma_pv, tOrP, tOrV(_, _, _, prev.index()), tOrO);
        pass_turn<T>(group);
        warpgroup_wait<1>();
        pipe_k.consumer_release(state);
        softmax(tSrS, n, alpha);
        warpgroup_wait<0>();
        pipe_v.consumer_release(prev);
        rescale_o(alpha);
        tOrP = to_p(tSrS);
        prev = state;
      }
      pipe_v.consumer_wait(prev);
      zero_tail_of_v(n_first, prev.index());
      wait_turn<T>(group);
      warpgroup_gemm<false, -1, true>(mma_pv, tOrP, tOrV(_, _, _, prev.index()), tOrO);
      pass_turn<T>(group);
      warpgroup_wait<0>();
      pipe_v.consumer_release(prev);
    } else {
      for (;;) {
        Tensor tOrP = to_p(tSrS);
        pipe_v.consumer_wait(state);
        zero_tail_of_v(n, state.index());
        warpgroup_gemm<false, 0, true>(mma_pv, tOrP, tOrV(_, _, _, state.index()), tOrO);
        pipe_v.consumer_release(state);
        ++state;
        if (--n < n_first) break;
        pipe_k.consumer_wait(state);
        warpgroup_gemm<true, 0>(mma_qk, tSrQ, tSrK(_, _, _, state.index()), tSrS);
        pipe_k.consumer_release(state);
        softmax(tSrS, n, alpha);
        rescale_o(alpha);
      }
    }
  }

  // Group 1's last hand-over (or its first, without key blocks) is taken, so both barriers end
  // balanced.
  if (group == 0) wait_turn<T>(group);

  // Epilogue: finish each row (sums across the 4 threads of a row, the sink on split 0), write
  // the normalised O tile (fp32 over the Q / K / V tiles; persistent: the element type over Q),
  // then the consumers store it coalesced.
  cutlass::arch::NamedBarrier::sync(T::kConsumerThreads, kEpilogue);  // every group is done with the tiles
  Tensor tOcO = thr_pv.partition_C(make_identity_tensor(select<0, 1>(typename T::TilePV{})));
  auto factor = [&](int r, int tile_row) {
    float lse;
    const float f = sm.finish(p, start, head, row0 + tile_row, r, lse);
    if (thread % 4 == 0) ss.lse[tile_row] = lse;
    if constexpr (T::kFp8) return f * descales.v;
    return f;
  };
  auto lse = [&](int r) { return ss.lse[r]; };
  if constexpr (T::kPersistent) {
    E* sO = ss.q.data();
    write_scaled_rows(tOrO, tOcO, factor, [&](int row, int col, float v) { sO[o_tile_index<T>(row, col)] = E(v); });
    cutlass::arch::NamedBarrier::sync(T::kConsumerThreads, kEpilogue);
    store_rows<typename T::Out>(
        p, start.dst_rows, head, row0, T::kBlockM,
        [&](int r, int c) {
          const E* o = sO + o_tile_index<T>(r, c);
          return make_float4(float(o[0]), float(o[1]), float(o[2]), float(o[3]));
        },
        lse, thread, T::kConsumerThreads);
    cutlass::arch::fence_view_async_shared();  // these reads, then the next Q's TMA write
    cutlass::arch::NamedBarrier::arrive(32 + T::kConsumerThreads, kQFree);
  } else {
    float* sO = reinterpret_cast<float*>(ss.q.data());
    write_scaled_rows(tOrO, tOcO, factor, [&](int row, int col, float v) { sO[row * T::kOStride + col] = v; });
    cutlass::arch::NamedBarrier::sync(T::kConsumerThreads, kEpilogue);
    store_rows<typename T::Out>(
        p, start.dst_rows, head, row0, T::kBlockM,
        [&](int r, int c) { return *reinterpret_cast<const float4*>(sO + r * T::kOStride + c); }, lse, thread,
        T::kConsumerThreads);
  }
}

// The K / V pipelines (fp8: and V^T's).
struct NoPipeline {};
template <class T>
struct Pipelines {
  typename T::Pipeline k, v;
  conditional_t<T::kFp8, typename T::VtPipeline, NoPipeline> vt;
};

// fp8's V^T pipeline: the transposers (producer warps 1-3) fill its stages, every consumer
// thread releases them.
template <class T>
__device__ __forceinline__ auto vt_pipeline(typename T::SharedStorage& ss) {
  if constexpr (T::kFp8) {
    using VtPipeline = typename T::VtPipeline;
    typename VtPipeline::Params pp;
    pp.role = threadIdx.x < 32    ? VtPipeline::ThreadCategory::NonParticipant
              : threadIdx.x < 128 ? VtPipeline::ThreadCategory::Producer
                                  : VtPipeline::ThreadCategory::Consumer;
    pp.producer_arv_count = kTransposeThreads;
    pp.consumer_arv_count = T::kConsumerThreads;
    return VtPipeline(ss.pipe_vt, pp);
  } else {
    return NoPipeline{};
  }
}

// Q's barrier and the K / V pipelines, set up by the whole CTA (visible to all when it returns);
// the TMA descriptors prefetched.
template <class T>
__device__ __forceinline__ Pipelines<T> setup_pipelines(const PrefillParams<T>& params, typename T::SharedStorage& ss) {
  using Pipeline = typename T::Pipeline;
  typename Pipeline::Params pp;
  pp.role = threadIdx.x < 128 ? Pipeline::ThreadCategory::Producer : Pipeline::ThreadCategory::Consumer;
  pp.is_leader = threadIdx.x == 0;
  pp.num_consumers = T::kConsumerThreads;
  if (threadIdx.x == 0) {
    ss.q_full.init(1);
    cute::prefetch_tma_descriptor(params.tma_q.get_tma_descriptor());
    cute::prefetch_tma_descriptor(params.tma_k.get_tma_descriptor());
    cute::prefetch_tma_descriptor(params.tma_v.get_tma_descriptor());
  }
  typename Pipeline::Params pp_v = pp;
  pp.transaction_bytes = T::kKBytes;
  pp_v.transaction_bytes = T::kVBytes;
  if constexpr (T::kFp8) {  // V's consumers are the transposers
    pp_v.role = threadIdx.x < 32    ? Pipeline::ThreadCategory::Producer
                : threadIdx.x < 128 ? Pipeline::ThreadCategory::Consumer
                                    : Pipeline::ThreadCategory::NonParticipant;
    pp_v.num_consumers = kTransposeThreads;
  }
  Pipelines<T> pipes{Pipeline(ss.pipe_k, pp, Shape<_1, _1, _1>{}), Pipeline(ss.pipe_v, pp_v, Shape<_1, _1, _1>{}),
                     vt_pipeline<T>(ss)};
  cutlass::arch::fence_barrier_init();
  __syncthreads();
  return pipes;
}

// Key blocks [n_first, n_last] of a tile's keys (none: n_last < n_first).
template <class T>
__device__ __forceinline__ int2 key_blocks(const CtaStart& start) {
  const int n_first = start.keys.lo / T::kBlockN;
  return make_int2(n_first, start.keys.hi > start.keys.lo ? (start.keys.hi - 1) / T::kBlockN : n_first - 1);
}

// One CTA per tile.
template <class T>
__global__ void __launch_bounds__(T::kThreads, T::kCtasPerSm)
    prefill_kernel(const __grid_constant__ PrefillParams<T> params) {
  extern __shared__ __align__(1024) char smem_raw[];
  auto& ss = *reinterpret_cast<typename T::SharedStorage*>(smem_raw);
  // Query blocks in reverse launch order: under a causal mask the longest CTAs start first.
  const int head = blockIdx.y;
  const int row0 = (gridDim.x - 1 - blockIdx.x) * T::kBlockM;
  CtaStart start;
  if (!start_cta<typename T::Out>(params.p, row0, T::kBlockM, start)) return;
  const int2 n = key_blocks<T>(start);
  auto pipes = setup_pipelines<T>(params, ss);

  // Each role's registers are set in its own branch (ptxas allocates each branch to its limit).
  if (threadIdx.x < 128) {
    if constexpr (T::kReallocate) cutlass::arch::warpgroup_reg_dealloc<T::kProducerRegs>();
    auto state = cutlass::make_producer_start_state<typename T::Pipeline>();  // phase 1: buffers empty
    if (threadIdx.x < T::kProducerThreads) {
      produce<T>(params, ss, pipes.k, pipes.v, state, start, head, row0, n.x, n.y, false);
    } else if constexpr (T::kFp8) {
      if (threadIdx.x >= 32) {
        transpose_v<T>(ss, pipes.v, pipes.vt, start.col.seq.seqlen_k, n.x, n.y);
      }
    }
  } else {
    if constexpr (T::kReallocate) cutlass::arch::warpgroup_reg_alloc<T::kConsumerRegs>();
    cutlass::PipelineState<T::kStages> state;
    if constexpr (T::kFp8) consume<T>(params, ss, pipes.k, pipes.vt, state, start, head, row0, n.x, n.y, 0);
    else consume<T>(params, ss, pipes.k, pipes.v, state, start, head, row0, n.x, n.y, 0);
  }
}

// What a persistent CTA finds for a tile (grid column z, query rows row0..): nothing to do, rows
// that see no key and no sink (to be written as such), or rows to compute. start_cta's steps
// (cta_work.cuh) for a tile that is not the CTA's grid position; start_cta itself is left as it is:
// a version shared with this one moved the portable attention kernel (255 registers) and sm90_mla
// into spills (78 and 52 bytes).
enum class TileWork { none, empty, rows };

__device__ __forceinline__ TileWork find_tile_work(const AttentionParams& p, int z, int row0, int rows,
                                                   CtaStart& s) {
  wait_for_prerequisites();
  launch_dependents();
  if (!cta_column(p, z, s.col)) return TileWork::none;
  s.packed_rows = s.col.seq.seqlen_q * p.group;
  if (row0 >= s.packed_rows) return TileWork::none;
  s.keys = cta_keys(p, s.col, row0, min(row0 + rows, s.packed_rows) - 1);
  s.add_sink = adds_sink(p, s.col);
  s.dst_rows = RowDestination(p, s.col);
  return s.keys.lo >= s.keys.hi && !s.add_sink ? TileWork::empty : TileWork::rows;
}

// The persistent CTA's tiles t = blockIdx.x, + gridDim.x, ... (core::sm90_persistent_tile: the
// longest causal blocks first). Each role walks them all: work(start, head, row0, tiles before it)
// for the tiles with rows to compute; threads [0, store_threads) write the rows that see no key as
// such (the consumers; store_threads 0: the producer, within its few registers, does not).
template <class T, class Work>
__device__ __forceinline__ int for_each_tile(const PrefillParams<T>& params, int store_thread, int store_threads,
                                             Work work) {
  int tiles = 0;
  for (int t = blockIdx.x; t < params.num_tiles; t += gridDim.x) {
    const core::Sm90Tile tile =
        core::sm90_persistent_tile(t, params.m_blocks, params.p.num_heads, params.p.len.batch);
    const int head = tile.head, row0 = tile.m_block * T::kBlockM;
    CtaStart start;
    const TileWork found = find_tile_work(params.p, tile.column, row0, T::kBlockM, start);
    if (found == TileWork::empty && store_threads > 0) {
      store_empty_rows<typename T::Out>(params.p, start.dst_rows, head, row0, T::kBlockM, store_thread, store_threads);
    }
    if (found == TileWork::rows) work(start, head, row0, tiles++);
  }
  return tiles;
}

template <class T>
__global__ void __launch_bounds__(T::kThreads, 1)
    prefill_kernel_persistent(const __grid_constant__ PrefillParams<T> params) {
  extern __shared__ __align__(1024) char smem_raw[];
  auto& ss = *reinterpret_cast<typename T::SharedStorage*>(smem_raw);
  auto pipes = setup_pipelines<T>(params, ss);

  if (threadIdx.x < 128) {
    cutlass::arch::warpgroup_reg_dealloc<40>();  // its tile loop spills less than at 24
    auto state = cutlass::make_producer_start_state<typename T::Pipeline>();
    const int tiles = for_each_tile(params, 0, 0, [&](const CtaStart& start, int head, int row0, int before) {
      const int2 n = key_blocks<T>(start);
      if (threadIdx.x < T::kProducerLanes) {
        produce<T>(params, ss, pipes.k, pipes.v, state, start, head, row0, n.x, n.y, before > 0);
      }
    });
    // The consumers' last arrival at kQFree is taken, so the barrier ends balanced.
    if (tiles > 0 && threadIdx.x < T::kProducerLanes) wait_q_free<T>();
  } else {
    cutlass::arch::warpgroup_reg_alloc<232>();
    cutlass::PipelineState<T::kStages> state;
    const int thread = int(threadIdx.x) - 128;
    for_each_tile(params, thread, T::kConsumerThreads, [&](const CtaStart& start, int head, int row0, int before) {
      const int2 n = key_blocks<T>(start);
      consume<T>(params, ss, pipes.k, pipes.v, state, start, head, row0, n.x, n.y, before & 1);
    });
  }
}

// Host side: TMA descriptors over q and the cache, then one CTA per (query block, head, sequence).
// Requires: head dims (kHeadDim, kHeadDimV), one split, rows 16-byte aligned (the backend's checks), and a
// paged cache only without leftpad, with page_size == kPageKeys (pages smaller than a block) or
// page_size % kBlockN == 0 (kPageKeys 0): core::sm90_takes.
template <class T>
void launch_prefill(const AttentionParams& ap, int kv_group, cudaStream_t stream) {
  using E = typename T::E;
  PrefillParams<T> params;
  params.p = ap;
  params.p.group = 1;  // one query head per CTA: rows are query indices
  params.kv_group = kv_group;
  const bool varlen = ap.len.cu_seqlens_q.data != nullptr;
  const int q_rows = varlen ? ap.len.total_q : ap.len.seqlen_q;
  const int q_batches = varlen ? 1 : ap.len.batch;
  const int64_t q_batch_stride = varlen ? int64_t(q_rows) * ap.q.token_stride : ap.q.batch_stride;
  params.q_shape = make_shape(int32_t(q_rows), int32_t(T::kHeadDim), int32_t(ap.num_heads), int32_t(q_batches));
  Tensor mQ = make_tensor(make_gmem_ptr(static_cast<const E*>(ap.q.data)), params.q_shape,
                          make_stride(ap.q.token_stride, _1{}, ap.q.head_stride, q_batch_stride));
  params.tma_q = make_tma_copy(SM90_TMA_LOAD{}, mQ, typename T::SmemLayoutQ{}, Shape<Int<T::kBlockM>, Int<T::kHeadDim>>{}, _1{});
  const CacheParams& c = ap.cache;
  const int rows = c.paged ? c.page_size.divisor : ap.len.capacity;
  const int units = c.paged ? c.num_pages : ap.len.num_cache_seqs;
  params.k_shape = make_shape(int32_t(rows), int32_t(T::kHeadDim), int32_t(ap.num_heads_k), int32_t(units));
  params.v_shape = make_shape(int32_t(rows), int32_t(T::kHeadDimV), int32_t(ap.num_heads_k), int32_t(units));
  Tensor mK = make_tensor(make_gmem_ptr(static_cast<const E*>(c.k)), params.k_shape,
                          make_stride(c.k_pos_stride, _1{}, c.k_head_stride, c.k_row_stride));
  Tensor mV = make_tensor(make_gmem_ptr(static_cast<const E*>(c.v)), params.v_shape,
                          make_stride(c.v_pos_stride, _1{}, c.v_head_stride, c.v_row_stride));
  params.tma_k = make_tma_copy(SM90_TMA_LOAD{}, mK, typename T::SmemLayoutKUnit{},
                               Shape<Int<T::kUnitRows>, Int<T::kHeadDim>>{}, _1{});
  params.tma_v = make_tma_copy(SM90_TMA_LOAD{}, mV, typename T::SmemLayoutVUnit{},
                               Shape<Int<T::kUnitRows>, Int<T::kHeadDimV>>{}, _1{});

  const dim3 grid((ap.len.seqlen_q + T::kBlockM - 1) / T::kBlockM, ap.num_heads, ap.len.batch);
  if (grid.x == 0 || grid.z == 0) return;
  params.m_blocks = int(grid.x);
  if constexpr (T::kPersistent) {
    params.num_tiles = int(grid.x * grid.y * grid.z);
    int device = 0, sms = 0;
    cudaGetDevice(&device);
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
    opt_in_dynamic_smem<prefill_kernel_persistent<T>>(T::kSmemBytes);
    prefill_kernel_persistent<T><<<std::min(params.num_tiles, std::max(sms, 1)), T::kThreads, T::kSmemBytes, stream>>>(
        params);
  } else {
    opt_in_dynamic_smem<prefill_kernel<T>>(T::kSmemBytes);
    prefill_kernel<T><<<grid, T::kThreads, T::kSmemBytes, stream>>>(params);
  }
}

}  // namespace kvflash::cuda::sm90
