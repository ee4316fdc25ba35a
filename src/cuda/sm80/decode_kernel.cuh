// The portable (sm80+) decode kernel: at most 16 packed query rows per KV head (decode, speculative
// decode, GQA groups) against many keys, usually split-KV.
//
// With so few rows, the prefill kernel's layout (query rows as the mma's M dimension) computes
// 12 padding rows of every 16 at GQA 4 and shares each key block's fixed costs (a CTA barrier,
// row reductions, the accumulator rescale) among few keys. Here keys are the M dimension:
// S^T = K Q^T (A: a 16-key x 16-dim K tile from ldmatrix; B: Q^T, 8 rows per tile, kept in
// registers) and O^T = V^T P^T (A: V^T from ldmatrix.trans; B: P^T, the score fragment transposed
// in registers by movmatrix). Each warp walks its own 16-key steps of the CTA's keys (steps w,
// w + kWarps, ...) through its own kStages shared-memory buffers, so no CTA barrier sits in the
// loop; the warps' softmax states merge once, in the epilogue.
//
// With qv (MLA: d_v 512 instantiations only) the scores add V QV^T: the same A-operand walk over
// the V buffer (non-transposed) as over K, QV^T's fragments from shared memory (8 rows x 512 dims
// would take 64 registers per 8-row tile next to the 128 of the accumulators). Without q.k
// (only_qv: headdim 0) K and q are neither read nor multiplied.
//
// Over an fp8 cache (E4m3Cache rows) the descales scale the scores and the output, and K / V reach
// the mma in the query's type. Up to head dim 128 the warp's ring holds the raw e4m3 bytes, copied
// by cp.async like a 16-bit cache (a load converted in registers would stall its thread until the
// bytes arrive: 0.76 TB/s at b64 x 8k on the H200, session 11), and the mma's A fragments come
// from it directly: ldmatrix over the bytes as 16-bit units, each 32-bit register converted into
// two. No 16-bit tile, so the ring is deep (a tile per warp next to a 3-stage ring ran two CTAs
// per SM, 64 KB in flight per SM, 1.96 TB/s). The fragments' element orders differ from the
// 16-bit ones, which the contractions and the epilogue absorb:
//  - K: a lane's register holds 4 consecutive dims of one key (dims 4t..4t+3 of a 16-dim chunk),
//    so a k-step's A pairs are dims (4t, 4t+1) and (4t+2, 4t+3) instead of (2t, 2t+1) and
//    (2t+8, 2t+9); Q's B fragments are loaded in that order (the sum over dims is unchanged).
//  - V (ldmatrix.trans): a register holds dims (2g, 2g+1) of keys 2t and 2t+1; one byte permute
//    pairs the keys per dim, so an M tile's rows g and g+8 are dims 2g and 2g+1 of its 16-dim
//    chunk, and the epilogue writes them there.
// Both of the ring's GEMMs run in fp16, whatever the query's type: e4m3 -> fp16 is one
// instruction per two values, e4m3 -> bf16 four (at b64 x 8k the bf16 conversions kept the SM
// issuing 64% of cycles, ncu, session 13). A bf16 query row is scaled by the power of two that puts
// its largest finite |q| in [2^14, 2^15) (query_rows_to_half), exact in fp16 for every element
// within 2^28 of that largest, and its scores are scaled back in fp32; P, in [0, 1], is fp16 too
// (3 more mantissa bits than bf16).
// Wider heads (the ring would not fit) convert on the way into the 16-bit tile (common/fp8.cuh
// load_chunk).
//
// Loads are cp.async: rows outside the CTA's keys or at a bad page id are copied from a row of
// zeros (kZeroRow), chunks past the real head dim zero-filled, none of them read from the cache,
// and masked scores are -inf before the exponent, so NaN in unused cache slots cannot reach the
// output.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <type_traits>

#include "core/mask.h"
#include "cuda/common/cta_work.cuh"
#include "cuda/common/fp8.cuh"
#include "cuda/common/lengths.cuh"
#include "cuda/common/mma.cuh"
#include "cuda/common/params.h"

namespace kvflash::cuda {

// kRowTiles: 8-row mma N tiles of packed query rows (1: up to 8 rows, 2: up to 16). Row: the
// query's 16-bit type, or E4m3Cache<it> over an fp8 cache (common/fp8.cuh).
template <class Row, int kHeadDim_, int kHeadDimV_, int kRowTiles_>
struct DecodeTraits {
  using Elem = typename RowTypes<Row>::Query;   // q, shared-memory tiles, mma, out
  using Cache = typename RowTypes<Row>::Cache;  // k_cache / v_cache elements
  static constexpr bool kFp8Cache = !std::is_same_v<Elem, Cache>;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kHeadDimV = kHeadDimV_;
  static constexpr int kRowTiles = kRowTiles_;
  static constexpr int kRows = 8 * kRowTiles;
  static constexpr int kWarps = 4;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kStepKeys = 16;  // one mma M tile
  static constexpr int kWidest = kHeadDim > kHeadDimV ? kHeadDim : kHeadDimV;
  // Two buffers per warp up to head dim 128: one step computes while the next loads (H200, 32/8
  // heads, d 128: three CTAs, 12 warps, per SM keep ~100 KB of loads in flight per SM, more than
  // DRAM latency needs). Wider heads take one (69 KB at d 256, within every sm80+ GPU's limit;
  // the SM's other warps overlap their loads).
  // An fp8 ring (no 16-bit tile) holds half the bytes per step: four stages keep three steps
  // (12 KB at d 128) in flight per warp, 144 KB per SM at three CTAs.
  static constexpr bool kRawRing = kFp8Cache && kWidest <= 128;
  static constexpr int kStages = kRawRing ? 4 : kWidest <= 128 ? 2 : 1;
  static constexpr int kTileStages = kRawRing ? 0 : kStages;  // 16-bit K / V tiles
  static constexpr int kRawStageBytes = kRawRing ? kStepKeys * (kHeadDim + kHeadDimV) : 0;
  // Rows padded by 16 bytes so ldmatrix over 8 consecutive rows hits 8 different bank groups.
  static constexpr int kKStride = kHeadDim + 8;
  static constexpr int kVStride = kHeadDimV + 8;
  static constexpr int kKStageElems = kStepKeys * kKStride;
  static constexpr int kVStageElems = kStepKeys * kVStride;
  static constexpr int kWarpBytes = kTileStages * (kKStageElems + kVStageElems) * int(sizeof(Elem)) +
                                    kStages * (kRawStageBytes + kStepKeys * 16);  // + row offsets
  static constexpr int kOStride = kHeadDimV + 4;  // fp32 epilogue rows, conflict-free writes
  static constexpr int kLoopBytes = kWarps * kWarpBytes;
  static constexpr int kEpilogueBytes = kWarps * kRows * kOStride * 4;  // each warp's normalised O
  static constexpr int kBufferBytes = kLoopBytes > kEpilogueBytes ? kLoopBytes : kEpilogueBytes;
  static constexpr int kStatsBytes = (2 * kWarps + 1) * kRows * 4;  // per-warp max and sum, LSE
  // qv's rows, for the whole CTA (qv exists only with d_v >= 256: the d_v 512 kernels take it).
  static constexpr bool kTakesQv = kHeadDimV == 512;
  static constexpr int kQvStride = kHeadDimV + 8;
  static constexpr int kQvBytes = kTakesQv ? kRows * kQvStride * int(sizeof(Elem)) : 0;
  static constexpr int kSmemBytes = kBufferBytes + kStatsBytes + kQvBytes;
  // Three CTAs per SM at head dims up to 128 (72 KB of shared memory each, the fp8 ring's 70 KB;
  // the portable split rule, core/split_rule.h, counts that many CTA slots per SM).
  // d 64 / d_v 512: 83 KB, within the 99 KB a CTA may have on every sm80+ GPU.
  static_assert(kSmemBytes <= 99 * 1024, "fits every sm80+ GPU");
  static constexpr int kMinBlocks = kWidest <= 128 ? 3 : 1;
  // The fp8 ring's rows are whole 16-byte chunks, 4 or 8 of them (e4m3 head dims 64 and 128).
  static_assert(!kRawRing || ((kHeadDim == 64 || kHeadDim == 128) && (kHeadDimV == 64 || kHeadDimV == 128)),
                "the fp8 ring's swizzle takes rows of 64 or 128 bytes");
  static_assert(kHeadDim % 16 == 0 && kHeadDimV % 16 == 0, "head dims are multiples of 16");
};

// A key row's K and V bytes in global memory. Rows a step does not read point at kZeroRow, so
// their copies fill zeros with no per-row predicate.
struct alignas(16) RowSources {
  const unsigned char* k;
  const unsigned char* v;
};

// The fp8 ring's chunk c of row r sits at chunk c ^ raw_swizzle(r) of its row, so the 8 rows one
// ldmatrix phase reads at one chunk fall in 8 different 16-byte bank groups (rows of 4 chunks
// share 128 bytes in pairs, hence r / 2 for them).
template <int kChunks>
__device__ __forceinline__ int raw_swizzle(int r) {
  return kChunks == 8 ? r % 8 : (r / 2) % 4;
}

// Q fragments (kRT row tiles; row g of each in this lane, with lanes 4g..4g+3) from Elem pairs to
// fp16 pairs, each row times 2^shift so its largest finite |q| lands in [2^14, 2^15) (NaN and
// infinities stay what they are); unscale[nt][h] gets 2^-shift of row 2t + h, the row of the
// lane's score entries h.
template <class Elem, int kRT, int kKSteps>
__device__ __forceinline__ void query_rows_to_half(uint32_t (&q)[kRT][kKSteps][2], float (&unscale)[kRT][2], int t) {
  auto unpack = [](uint32_t bits) {
    const Elem* pair = reinterpret_cast<const Elem*>(&bits);
    return make_float2(to_float(pair[0]), to_float(pair[1]));
  };
  auto finite_abs = [](float x) { return fabsf(x) < INFINITY ? fabsf(x) : 0.0f; };
#pragma unroll
  for (int nt = 0; nt < kRT; ++nt) {
    float largest = 0.0f;
#pragma unroll
    for (int kk = 0; kk < kKSteps; ++kk) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const float2 f = unpack(q[nt][kk][half]);
        largest = fmaxf(largest, fmaxf(finite_abs(f.x), finite_abs(f.y)));
      }
    }
    largest = fmaxf(largest, __shfl_xor_sync(0xffffffffu, largest, 1));
    largest = fmaxf(largest, __shfl_xor_sync(0xffffffffu, largest, 2));
    // largest in [2^(e - 127), 2^(e - 126)) for its biased exponent e >= 1; 2^126 at most, so
    // both factors stay normal.
    const int e = __float_as_int(largest) >> 23;
    const int shift = largest > 0.0f ? min(141 - e, 126) : 0;
    const float up = __int_as_float((127 + shift) << 23), down = __int_as_float((127 - shift) << 23);
#pragma unroll
    for (int kk = 0; kk < kKSteps; ++kk) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const float2 f = unpack(q[nt][kk][half]);
        q[nt][kk][half] = pack2<__half>(f.x * up, f.y * up);
      }
    }
    unscale[nt][0] = __shfl_sync(0xffffffffu, down, 8 * t);
    unscale[nt][1] = __shfl_sync(0xffffffffu, down, 8 * t + 4);
  }
}

template <class T>
__global__ void __launch_bounds__(T::kThreads, T::kMinBlocks) decode_kernel(const AttentionParams p) {
  using Elem = typename T::Elem;
  using Cache = typename T::Cache;
  // The type of the GEMMs' 16-bit operands: fp16 over the fp8 ring (see above), else the query's.
  using MmaElem = std::conditional_t<T::kRawRing, __half, Elem>;
  constexpr bool kScaledQuery = !std::is_same_v<MmaElem, Elem>;
  constexpr int kRT = T::kRowTiles;
  constexpr int kKSteps = T::kHeadDim / 16;   // mma K steps of S^T = K Q^T
  constexpr int kDvTiles = T::kHeadDimV / 16;  // mma M tiles of O^T = V^T P^T
  extern __shared__ __align__(16) unsigned char smem_raw[];

  const int hk = blockIdx.y;
  const int row0 = blockIdx.x * T::kRows;
  CtaStart start;
  if (!start_cta<Elem>(p, row0, T::kRows, start)) return;
  const SeqLens& seq = start.col.seq;
  const int packed_rows = start.packed_rows;
  const core::KeyRange range = start.keys;
  const bool add_sink = start.add_sink;

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  // CTA row of this thread's fragment entries: N index 2t + h of row tile nt.
  auto my_row = [&](int nt, int h) { return 8 * nt + 2 * t + h; };

  // This thread's rows' visible keys, and [full_lo, full_hi): keys every one of them that exists
  // sees (steps inside need no mask). Rows past the sequence see nothing.
  int2 row_keys_of[kRT][2];
  int full_lo = range.lo, full_hi = range.hi;
#pragma unroll
  for (int nt = 0; nt < kRT; ++nt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int idx = row0 + my_row(nt, h);
      row_keys_of[nt][h] = make_int2(range.lo, range.lo);
      if (idx < packed_rows) {
        const core::KeyRange vis = row_keys(p, seq, idx);
        const int lo = max(vis.lo, range.lo), hi = min(vis.hi, range.hi);
        row_keys_of[nt][h] = make_int2(lo, hi);
        full_lo = max(full_lo, lo);
        full_hi = min(full_hi, hi);
      }
    }
  }

  // Q^T as the B operand, in registers for the whole CTA: row g of tile nt, dims 16 kk + 2t (+1)
  // and 16 kk + 2t + 8 (+1), over the fp8 ring 16 kk + 4t (+1) and 16 kk + 4t + 2 (+1) (its K
  // fragments' order); zero past the sequence and past the real head dim.
  uint32_t q_frag[kRT][kKSteps][2];
#pragma unroll
  for (int nt = 0; nt < kRT; ++nt) {
    const int idx = row0 + 8 * nt + g;
    const bool row_ok = idx < packed_rows;
    const Elem* q_row = packed_row<Elem>(p.q, p, start.col, hk, idx);
#pragma unroll
    for (int kk = 0; kk < kKSteps; ++kk) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int d = 16 * kk + (T::kRawRing ? 4 * t + 2 * half : 2 * t + 8 * half);
        q_frag[nt][kk][half] = row_ok && d < p.headdim ? *reinterpret_cast<const uint32_t*>(q_row + d) : 0u;
      }
    }
  }
  float q_unscale[kRT][2] = {};  // with kScaledQuery: what undoes the query rows' scaling
  if constexpr (kScaledQuery) query_rows_to_half<Elem>(q_frag, q_unscale, t);

  // qv's rows (zero past the sequence and past the real d_v) for every warp, before the loop.
  const bool has_qv = T::kTakesQv && p.qv.data != nullptr;
  Elem* sQv = reinterpret_cast<Elem*>(smem_raw + T::kBufferBytes + T::kStatsBytes);  // [kRows][kQvStride]
  if (has_qv) {
    constexpr int kChunks = T::kHeadDimV / 8;
    for (int e = threadIdx.x; e < T::kRows * kChunks; e += T::kThreads) {
      const int r = e / kChunks, c = e - r * kChunks;
      const bool ok = row0 + r < packed_rows && c < p.headdim_v / 8;
      const Elem* src = ok ? packed_row<Elem>(p.qv, p, start.col, hk, row0 + r) + c * 8 : nullptr;
      cp_async_16(smem_addr(sQv + r * T::kQvStride + c * 8), ok ? src : p.qv.data, ok);
    }
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();
  }

  // This warp's buffers: [kTileStages][kStepKeys][kKStride] K, then the same for V, then (fp8
  // ring) [kStages][kStepKeys] raw K rows followed by raw V rows, then the K / V offsets of each
  // stage's key rows.
  Elem* sK = reinterpret_cast<Elem*>(smem_raw + warp * T::kWarpBytes);
  Elem* sV = sK + T::kTileStages * T::kKStageElems;
  auto* sRaw = reinterpret_cast<unsigned char*>(sV + T::kTileStages * T::kVStageElems);
  auto* sRows = reinterpret_cast<RowSources*>(sRaw + T::kStages * T::kRawStageBytes);  // [kStages][kStepKeys]
  static_assert(T::kWidest * sizeof(Cache) <= sizeof(kZeroRow), "the zero row covers every row");
  const auto* zero_row = reinterpret_cast<const unsigned char*>(kZeroRow);
  const auto* k_head = static_cast<const unsigned char*>(p.cache.k) + hk * p.cache.k_head_stride * sizeof(Cache);
  const auto* v_head = static_cast<const unsigned char*>(p.cache.v) + hk * p.cache.v_head_stride * sizeof(Cache);

  const int n_steps = (range.hi - range.lo + T::kStepKeys - 1) / T::kStepKeys;
  const int my_steps = warp < n_steps ? (n_steps - warp + T::kWarps - 1) / T::kWarps : 0;
  auto step_key0 = [&](int i) { return range.lo + (warp + i * T::kWarps) * T::kStepKeys; };
  // Key row l % 16 of the warp's step i: where its K and V bytes are (the zero row outside the
  // CTA's keys, past the warp's steps or at a bad page id).
  auto locate = [&](int i) {
    const int j = step_key0(i) + lane % 16;
    int64_t unit = 0;
    int slot = 0;
    const bool ok = i < my_steps && j < range.hi &&
                    cache_location(p.cache, seq.cache_row, seq.leftpad + j, unit, slot);
    if (!ok) return RowSources{zero_row, zero_row};
    return RowSources{k_head + (unit * p.cache.k_row_stride + slot * p.cache.k_pos_stride) * sizeof(Cache),
                      v_head + (unit * p.cache.v_row_stride + slot * p.cache.v_pos_stride) * sizeof(Cache)};
  };
  auto publish = [&](int stage, const RowSources& rows) {
    if (lane < T::kStepKeys) sRows[stage * T::kStepKeys + lane] = rows;
  };
  // The warp's copies of a step: lane `lane` fills the stage's chunk slots e = lane + 32 i, slot
  // e % kChunks of row e / kChunks, so every copy instruction fills (and reads) whole rows (full
  // 128-byte lines) and a lane's destinations step by a constant from one copy to the next. A
  // 16-bit tile's slot s holds chunk s of its row, the fp8 ring's chunk s ^ raw_swizzle(row)
  // (chunk_in).
  auto for_my_slots = [&](auto chunks_c, auto&& body) {
    constexpr int kChunks = decltype(chunks_c)::value;
#pragma unroll
    for (int i = 0; i < T::kStepKeys * kChunks / 32; ++i) {
      const int e = lane + 32 * i;
      body(i, e / kChunks, e % kChunks);
    }
  };
  // Chunk c of a row (bytes of the cache) into a slot, zero-filled past the real head dim (its
  // source then stays the row's first chunk, inside the tensor). The fp8 ring's chunks are 16 raw
  // bytes, a 16-bit tile's 8 elements (an fp8 cache wider than the ring: 8 bytes, converted on
  // the way).
  constexpr int kRawChunkBytes = 16, kTileChunkBytes = 8 * int(sizeof(Cache));
  const int k_valid = T::kRawRing ? p.headdim / 16 : p.headdim / 8;
  const int v_valid = T::kRawRing ? p.headdim_v / 16 : p.headdim_v / 8;
  auto copy_chunk = [&](unsigned char* dst, const unsigned char* row, int c, int valid) {
    const bool ok = c < valid;
    const unsigned char* src = row + (ok ? c * (T::kRawRing ? kRawChunkBytes : kTileChunkBytes) : 0);
    if constexpr (T::kRawRing) cp_async_16(smem_addr(dst), src, ok);
    else load_chunk(reinterpret_cast<Elem*>(dst), reinterpret_cast<const Cache*>(src), ok);
  };
  constexpr int kKRawBytes = T::kStepKeys * T::kHeadDim;  // the stage's K rows, then its V rows
  constexpr auto kKChunks = std::integral_constant<int, T::kRawRing ? T::kHeadDim / 16 : T::kHeadDim / 8>{};
  constexpr auto kVChunks = std::integral_constant<int, T::kRawRing ? T::kHeadDimV / 16 : T::kHeadDimV / 8>{};
  // Slot s of row r: its bytes from the stage's K (V) part, and the chunk it holds.
  auto slot_at = [](int r, int s, auto chunks_c, int stride) {
    if constexpr (T::kRawRing) return (r * decltype(chunks_c)::value + s) * kRawChunkBytes;
    else return (r * stride + s * 8) * int(sizeof(Elem));
  };
  auto chunk_in = [](int r, int s, auto chunks_c) {
    if constexpr (T::kRawRing) return s ^ raw_swizzle<decltype(chunks_c)::value>(r);
    else return s;
  };
  auto copy_step = [&](int stage) {
    const RowSources* rows = sRows + stage * T::kStepKeys;
    unsigned char* k_dst = T::kRawRing ? sRaw + stage * T::kRawStageBytes
                                       : reinterpret_cast<unsigned char*>(sK + stage * T::kKStageElems);
    unsigned char* v_dst = T::kRawRing ? k_dst + kKRawBytes
                                       : reinterpret_cast<unsigned char*>(sV + stage * T::kVStageElems);
    auto copy_k = [&](int r, int s, const unsigned char* row) {
      copy_chunk(k_dst + slot_at(r, s, kKChunks, T::kKStride), row, chunk_in(r, s, kKChunks), k_valid);
    };
    auto copy_v = [&](int r, int s, const unsigned char* row) {
      copy_chunk(v_dst + slot_at(r, s, kVChunks, T::kVStride), row, chunk_in(r, s, kVChunks), v_valid);
    };
    if constexpr (T::kRawRing && kKChunks == kVChunks) {
      // The lane's 4 (d 128) or 2 rows first, one 16-byte load each for K and V: no shared load
      // between the copies (each one there costs 3 issue slots of padding at sm_90).
      RowSources mine[T::kStepKeys * kKChunks / 32];
      for_my_slots(kKChunks, [&](int i, int r, int) { mine[i] = rows[r]; });
      for_my_slots(kKChunks, [&](int i, int r, int s) {
        copy_k(r, s, mine[i].k);
        copy_v(r, s, mine[i].v);
      });
    } else {  // a 16-bit tile's 8 rows per lane (d 128) would take 32 registers at once
      for_my_slots(kKChunks, [&](int, int r, int s) { copy_k(r, s, rows[r].k); });
      for_my_slots(kVChunks, [&](int, int r, int s) { copy_v(r, s, rows[r].v); });
    }
  };
  // ldmatrix lane address in the fp8 ring, K and V alike: the j-th x4 load's matrices are keys
  // 0-7 and 8-15 of chunk 2j, then of chunk 2j + 1 (lane l gives row (l % 8) + 8 ((l / 8) % 2)
  // of chunk 2j + l / 16).
  const int raw_row = (lane % 8) + 8 * ((lane / 8) % 2);
  auto raw_lane = [&](int stage, bool is_v, auto chunks_c, int j) {
    constexpr int kChunks = decltype(chunks_c)::value;
    const int chunk = (2 * j + lane / 16) ^ raw_swizzle<kChunks>(raw_row);
    return smem_addr(sRaw + stage * T::kRawStageBytes + (is_v ? kKRawBytes : 0) + (raw_row * kChunks + chunk) * 16);
  };
  // The ring's A fragments, K's (S^T = K Q^T) or, transposed, V's (O^T = V^T P^T): one per chunk,
  // two per x4 load, each converted from two of the load's registers; mma(a, i) takes chunk i's
  // (K step i, or M tile i). K: r[2c] holds dims 4t..4t+3 of key g of chunk 2j + c, r[2c + 1] of
  // key g + 8; the fragment's pairs are (g, 4t..), (g + 8, 4t..), (g, 4t + 2..), (g + 8, 4t + 2..).
  // V: r[2c] holds bytes (key 2t, dim 2g), (2t, 2g + 1), (2t + 1, 2g), (2t + 1, 2g + 1), r[2c + 1]
  // the same of keys 2t + 8, 2t + 9; the permute pairs the keys per dim, dim 2g in the low half
  // (the tile's row g), 2g + 1 in the high (row g + 8).
  auto raw_steps = [&](int stage, auto is_v_c, auto chunks_c, auto&& mma) {
    constexpr bool kV = decltype(is_v_c)::value;
#pragma unroll
    for (int j = 0; j < decltype(chunks_c)::value / 2; ++j) {
      uint32_t r[4];
      const uint32_t addr = raw_lane(stage, kV, chunks_c, j);
      if constexpr (kV) ldmatrix_x4_trans(addr, r);
      else ldmatrix_x4(addr, r);
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const uint32_t x = kV ? __byte_perm(r[2 * c], 0, 0x3120) : r[2 * c];
        const uint32_t y = kV ? __byte_perm(r[2 * c + 1], 0, 0x3120) : r[2 * c + 1];
        const uint2 xh = e4m3x4_to_half2x2(x), yh = e4m3x4_to_half2x2(y);
        const uint32_t a[4] = {xh.x, kV ? xh.y : yh.x, kV ? yh.x : xh.y, yh.y};
        mma(a, 2 * j + c);
      }
    }
  };

  const Fp8Descales descales = T::kFp8Cache ? Fp8Descales(p, start.col.b, hk) : Fp8Descales();
  const ScoreScale scale(p, descales.qk);
  const float exp_scale = scale.exp_scale;
  float o_acc[kRT][kDvTiles][4];  // O^T: dims 16 mt + g (entries 0, 1) and + 8 (2, 3); rows 2t, 2t + 1
  float row_max[kRT][2], row_sum[kRT][2];  // max in log2 units; sums over this lane's keys only
#pragma unroll
  for (int nt = 0; nt < kRT; ++nt) {
#pragma unroll
    for (int mt = 0; mt < kDvTiles; ++mt) o_acc[nt][mt][0] = o_acc[nt][mt][1] = o_acc[nt][mt][2] = o_acc[nt][mt][3] = 0.0f;
    row_max[nt][0] = row_max[nt][1] = -INFINITY;
    row_sum[nt][0] = row_sum[nt][1] = 0.0f;
  }

  // ldmatrix lane addresses. K (A, non-transposed): matrix l / 8 covers keys ((l / 8) % 2) * 8..,
  // dims (l / 16) * 8... V (A = V^T, transposed): matrix l / 8 covers keys (l / 16) * 8.., dims
  // ((l / 8) % 2) * 8...
  const uint32_t k_lane = smem_addr(sK + ((lane % 8) + 8 * ((lane / 8) % 2)) * T::kKStride + 8 * (lane / 16));
  const uint32_t v_lane = smem_addr(sV + ((lane % 8) + 8 * (lane / 16)) * T::kVStride + 8 * ((lane / 8) % 2));
  // With qv: V as the A operand of S^T (non-transposed, as K), and QV^T's B fragments, matrix
  // l / 8 covering dims 8 (l / 8).. of rows l % 8: two K steps per ldmatrix.
  const uint32_t v_scores_lane = smem_addr(sV + ((lane % 8) + 8 * ((lane / 8) % 2)) * T::kVStride + 8 * (lane / 16));
  const uint32_t qv_lane = smem_addr(sQv + (lane % 8) * T::kQvStride + 8 * (lane / 8));
  const bool uses_qk = !T::kTakesQv || p.headdim > 0;  // only_qv runs the d_v 512 kernels

  // One 16-key step from buffer `stage`; key0 is its first key.
  auto compute_step = [&](int stage, int key0) {
    // S^T: entries (key g, row 2t), (key g, row 2t + 1), (key g + 8, row 2t), (key g + 8, row 2t + 1).
    float s[kRT][4];
#pragma unroll
    for (int nt = 0; nt < kRT; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
    if constexpr (T::kRawRing) {
      raw_steps(stage, std::false_type{}, kKChunks, [&](const uint32_t(&a)[4], int kk) {
#pragma unroll
        for (int nt = 0; nt < kRT; ++nt) mma_16816<MmaElem>(s[nt], a, q_frag[nt][kk][0], q_frag[nt][kk][1]);
      });
    } else if (uses_qk) {
      const uint32_t k_addr = k_lane + stage * T::kKStageElems * 2;
#pragma unroll
      for (int kk = 0; kk < kKSteps; ++kk) {
        uint32_t a[4];
        ldmatrix_x4(k_addr + kk * 32, a);
#pragma unroll
        for (int nt = 0; nt < kRT; ++nt) mma_16816<Elem>(s[nt], a, q_frag[nt][kk][0], q_frag[nt][kk][1]);
      }
    }
    if constexpr (T::kTakesQv) {
      if (has_qv) {
        const uint32_t v_addr = v_scores_lane + stage * T::kVStageElems * 2;
#pragma unroll
        for (int kk = 0; kk < kDvTiles; kk += 2) {
          uint32_t a0[4], a1[4];
          ldmatrix_x4(v_addr + kk * 32, a0);
          ldmatrix_x4(v_addr + (kk + 1) * 32, a1);
#pragma unroll
          for (int nt = 0; nt < kRT; ++nt) {
            uint32_t b[4];
            ldmatrix_x4(qv_lane + (nt * 8 * T::kQvStride + kk * 16) * 2, b);
            mma_16816<Elem>(s[nt], a0, b[0], b[1]);
            mma_16816<Elem>(s[nt], a1, b[2], b[3]);
          }
        }
      }
    }
#pragma unroll
    for (int nt = 0; nt < kRT; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        if constexpr (kScaledQuery) s[nt][e] *= q_unscale[nt][e % 2];
        if (!scale.fold) s[nt][e] = scale.map(s[nt][e]);
        // Mask only where the step crosses one of this thread's row ranges.
        if (key0 < full_lo || key0 + T::kStepKeys > full_hi) {
          const int j = key0 + g + 8 * (e / 2);
          const int2 keys = row_keys_of[nt][e % 2];
          if (j < keys.x || j >= keys.y) s[nt][e] = -INFINITY;
        }
      }
    }
    // Online softmax per row: the row's maximum over the step's 16 keys is reduced across the 8
    // lanes holding them (same t); sums stay per lane until the epilogue.
    float alpha[kRT][2];
#pragma unroll
    for (int nt = 0; nt < kRT; ++nt) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float step_max = fmaxf(s[nt][h], s[nt][h + 2]);
        step_max = fmaxf(step_max, __shfl_xor_sync(0xffffffffu, step_max, 4));
        step_max = fmaxf(step_max, __shfl_xor_sync(0xffffffffu, step_max, 8));
        step_max = fmaxf(step_max, __shfl_xor_sync(0xffffffffu, step_max, 16));
        const float new_max = fmaxf(row_max[nt][h], step_max * exp_scale);
        const float base = new_max == -INFINITY ? 0.0f : new_max;  // all masked: exp2(-inf) = 0
        alpha[nt][h] = fast_exp2(row_max[nt][h] - base);
        row_max[nt][h] = new_max;
        s[nt][h] = fast_exp2(fmaf(s[nt][h], exp_scale, -base));
        s[nt][h + 2] = fast_exp2(fmaf(s[nt][h + 2], exp_scale, -base));
        row_sum[nt][h] = row_sum[nt][h] * alpha[nt][h] + (s[nt][h] + s[nt][h + 2]);
      }
    }
    // The accumulators change only where a row maximum grew (rarely, once a row has seen some keys).
    bool grew = false;
#pragma unroll
    for (int nt = 0; nt < kRT; ++nt) grew = grew || alpha[nt][0] != 1.0f || alpha[nt][1] != 1.0f;
    if (__any_sync(0xffffffffu, grew)) {
#pragma unroll
      for (int nt = 0; nt < kRT; ++nt) {
#pragma unroll
        for (int mt = 0; mt < kDvTiles; ++mt) {
#pragma unroll
          for (int e = 0; e < 4; ++e) o_acc[nt][mt][e] *= alpha[nt][e % 2];
        }
      }
    }
    // P^T as the B operand: (keys 2t, 2t + 1 and + 8; row g), the transposes of the packed
    // (key g and g + 8; rows 2t, 2t + 1) score pairs.
    uint32_t p_frag[kRT][2];
#pragma unroll
    for (int nt = 0; nt < kRT; ++nt) {
      p_frag[nt][0] = movmatrix_trans(pack2<MmaElem>(s[nt][0], s[nt][1]));
      p_frag[nt][1] = movmatrix_trans(pack2<MmaElem>(s[nt][2], s[nt][3]));
    }
    if constexpr (T::kRawRing) {
      raw_steps(stage, std::true_type{}, kVChunks, [&](const uint32_t(&a)[4], int mt) {
#pragma unroll
        for (int nt = 0; nt < kRT; ++nt) mma_16816<MmaElem>(o_acc[nt][mt], a, p_frag[nt][0], p_frag[nt][1]);
      });
    } else {
      const uint32_t v_addr = v_lane + stage * T::kVStageElems * 2;
#pragma unroll
      for (int mt = 0; mt < kDvTiles; ++mt) {
        uint32_t a[4];
        ldmatrix_x4_trans(v_addr + mt * 32, a);
#pragma unroll
        for (int nt = 0; nt < kRT; ++nt) mma_16816<Elem>(o_acc[nt][mt], a, p_frag[nt][0], p_frag[nt][1]);
      }
    }
  };

  // The warp's pipeline: step i + kStages - 1 is issued before step i is waited for, and the row
  // offsets of the step after it are looked up before step i's math and published after it, so
  // the page-table read overlaps the math. A group is committed every round (empty past the warp's
  // steps) so the wait count stays fixed. Offsets and buffers of a stage are reused only after a
  // __syncwarp past their last reader.
  {
    RowSources first[T::kStages];  // looked up together: their page-table reads overlap
#pragma unroll
    for (int i = 0; i < T::kStages; ++i) first[i] = locate(i);
#pragma unroll
    for (int i = 0; i < T::kStages; ++i) publish(i, first[i]);
  }
  __syncwarp();
#pragma unroll
  for (int i = 0; i < T::kStages - 1; ++i) {
    if (i < my_steps) copy_step(i);
    cp_async_commit();
  }
  for (int i = 0; i < my_steps; ++i) {
    const int ahead = i + T::kStages - 1;
    if (ahead < my_steps) copy_step(ahead % T::kStages);
    cp_async_commit();
    const RowSources after = locate(ahead + 1);
    cp_async_wait<T::kStages - 1>();
    __syncwarp();  // step i landed for every lane
    compute_step(i % T::kStages, step_key0(i));
    publish((ahead + 1) % T::kStages, after);
    __syncwarp();  // every lane is done with the buffer the next round refills; offsets are in
  }
  cp_async_wait<0>();

  // Epilogue: merge the warps' states (and the sink's term, split 0 only), each warp writes its
  // normalised share of O into its own rows of sO (reusing the buffers), the CTA sums and stores.
  float* sMax = reinterpret_cast<float*>(smem_raw + T::kBufferBytes);  // [kWarps][kRows]
  float* sSum = sMax + T::kWarps * T::kRows;                            // [kWarps][kRows]
  float* sLse = sSum + T::kWarps * T::kRows;                            // [kRows]
  float* sO = reinterpret_cast<float*>(smem_raw);                       // [kWarps][kRows][kOStride]
#pragma unroll
  for (int nt = 0; nt < kRT; ++nt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float l = row_sum[nt][h];
      l += __shfl_xor_sync(0xffffffffu, l, 4);
      l += __shfl_xor_sync(0xffffffffu, l, 8);
      l += __shfl_xor_sync(0xffffffffu, l, 16);
      if (g == 0) {
        sMax[warp * T::kRows + my_row(nt, h)] = row_max[nt][h];
        sSum[warp * T::kRows + my_row(nt, h)] = l;
      }
    }
  }
  __syncthreads();  // every warp's state is in, and every warp is done with its buffers
#pragma unroll
  for (int nt = 0; nt < kRT; ++nt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = my_row(nt, h);
      const float sink = add_sink ? sink_log2(p, hk, min(row0 + r, packed_rows - 1)) : -INFINITY;
      float m = sink;
#pragma unroll
      for (int w = 0; w < T::kWarps; ++w) m = fmaxf(m, sMax[w * T::kRows + r]);
      float l = sink == -INFINITY ? 0.0f : fast_exp2(sink - m);
      float my_scale = 0.0f;
#pragma unroll
      for (int w = 0; w < T::kWarps; ++w) {
        const float mw = sMax[w * T::kRows + r];
        const float sc = mw == -INFINITY ? 0.0f : fast_exp2(mw - m);
        l += sSum[w * T::kRows + r] * sc;
        if (w == warp) my_scale = sc;
      }
      const bool nonempty = l > 0.0f && m != -INFINITY;
      const float factor = nonempty ? my_scale / l * descales.v : 0.0f;
      if (warp == 0 && g == 0) sLse[r] = nonempty ? (m + log2f(l)) * kLn2 : -INFINITY;
      // An M tile's rows g and g + 8 are its dims g and g + 8, over the fp8 ring 2g and 2g + 1.
      float* o_row = sO + (warp * T::kRows + r) * T::kOStride + (T::kRawRing ? 2 * g : g);
      constexpr int kSecond = T::kRawRing ? 1 : 8;
#pragma unroll
      for (int mt = 0; mt < kDvTiles; ++mt) {
        o_row[16 * mt] = o_acc[nt][mt][h] * factor;
        o_row[16 * mt + kSecond] = o_acc[nt][mt][h + 2] * factor;
      }
    }
  }
  __syncthreads();
  store_rows<Elem>(
      p, start.dst_rows, hk, row0, T::kRows,
      [&](int r, int c) {
        float4 sum = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
        for (int w = 0; w < T::kWarps; ++w) {
          const float4 v = *reinterpret_cast<const float4*>(sO + (w * T::kRows + r) * T::kOStride + c);
          sum.x += v.x, sum.y += v.y, sum.z += v.z, sum.w += v.w;
        }
        return sum;
      },
      [&](int r) { return sLse[r]; });
}

}  // namespace kvflash::cuda
