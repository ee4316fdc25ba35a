// The Hopper (sm_90a) prefill family's kernels (prefill_kernel.cuh) by rung, one explicit
// instantiation file per (dtype, head dims): prefill_inst_*.cu. The dispatcher reaches them through
// launch_sm90_attention (launch.h); the GPU runner times each rung (tests/gpu/sm90_bench.cpp).
#pragma once

#include <cuda_runtime.h>

#include "core/kernel_family.h"
#include "cuda/common/params.h"

namespace kvflash::cuda::sm90 {

// Keys per block of head dim d: the family rule's (core/kernel_family.h), which sends a paged cache
// here only with pages of whole blocks or of 8 or more keys dividing a block (sm90_page_fits).
constexpr int prefill_block_n(int headdim, int headdim_v) {
  return core::sm90_block_n(headdim > headdim_v ? headdim : headdim_v);
}

// The rungs of the ladder the family was built by (BENCHMARKS.md, session 4), kept for timing:
// 1: one consumer warp group (64 rows); 2: two consumer groups (128 rows) with the producer's
// registers given to them; 3: 2 + the softmax of one key block overlapping the next GEMMs inside
// a group; 4: 3 + the groups taking turns at the tensor cores (ping-pong); 5: 3 made persistent
// (one CTA per SM walks the tiles; session 11 on the H200: correct, slower than 3 on six of eight
// shapes, up to 20 % at d 256 causal); 6: two CTAs per SM (three at d <= 64: small_tile_ctas),
// each one overlapping group over 64 x 64 tiles (head dim <= 128; rung 3 above), for short
// sequences, where rung 3's one CTA per SM leaves its prologue and epilogue exposed (planned for
// short key loops: core::sm90_small_tiles).
// Rung 3 runs: rung 4 is 2 % faster at d 128 and slower at d 64 / 256 (BENCHMARKS.md, session 5),
// and compute-sanitizer's racecheck reports epilogue hazards in rung 4 only (a tool that counts
// the turn barriers' bar.arrive as no barrier would see the groups one barrier apart there).
constexpr int kRungs = 8;
constexpr int kBestRung = 3;
constexpr int kPingPongRung = 4;    // left out of the sanitizers' runs (racecheck, above)
constexpr int kPersistentRung = 5;
constexpr int kSmallTileRung = 6;  // core::sm90_small_tiles plans it
constexpr int kSmallTileMaxHeadDim = core::kSm90SmallTileMaxHeadDim;
// Rung 6's CTAs per SM: two up to head dim 128 (80 KB of tiles each at d 128), three at d <= 64
// (40 KB each; 136 registers per consumer thread, no spills). Session 26, H100, 32 heads d 64
// causal: b32 x 512 0.248 -> 0.211 ms, b16 x 1024 0.335 -> 0.283 (four CTAs: 0.209 / 0.282, with
// 84 bytes of spills at 104 registers).
constexpr int small_tile_ctas(int headdim, int headdim_v) { return headdim <= 64 && headdim_v <= 64 ? 3 : 2; }
// The head dims the whole ladder is compiled at (sm90bench times it there); the others (96, 192,
// 192 / 128) have the planned kernels only: rung 3, its small-page variants and rung 6.
constexpr bool ladder_dims(int headdim, int headdim_v) {
  return headdim == headdim_v && (headdim == 64 || headdim == 128 || headdim == 256);
}
// Rung 7: rung 3 with FA3's wider key blocks (176 keys at d <= 128, 80 at d 256: fewer softmax
// passes per key), over dense caches; timed by sm90bench, not planned.
constexpr int kWideRung = 7;
constexpr int wide_block_n(int headdim) { return headdim <= 64 ? 128 : headdim <= 128 ? 176 : 80; }
// Rung 8: FA3's tile at d 64, three overlapping consumer groups over 192 query rows (160
// registers each), over any cache layout the family reads (pages of 8-64 keys: one copy per page,
// as rung 3's); planned over dense caches and whole-block pages, over smaller pages only with
// KVFLASH_SM90_THREE_GROUP_PAGES=1 (core::sm90_three_groups; session 25, H100, 16k x 16k: 14 %
// faster than rung 3 full, 8 % causal).
constexpr int kThreeGroupRung = 8;
constexpr int kThreeGroupRows = core::kSm90ThreeGroupRows;
constexpr int kThreeGroupMaxHeadDim = core::kSm90ThreeGroupMaxHeadDim;

// Attention over `p` (one split; rows are query indices of one head, K / V head = query head /
// kv_group) by rung `rung`'s kernel; a paged cache of pages smaller than a key block (8, 16, ...
// keys: core::sm90_page_fits) by rung 6's kernel for that page size when asked for, else rung 3's.
template <class Elem, int kHeadDim, int kHeadDimV>
void launch_prefill_rung(const AttentionParams& p, int kv_group, int rung, cudaStream_t stream);

}  // namespace kvflash::cuda::sm90
