// The tile of each head dim and rung; included by the instantiation files (prefill_inst_*.cu) only.
#pragma once

#include <type_traits>

#include "cuda/sm90/prefill.h"
#include "cuda/sm90/prefill_kernel.cuh"

namespace kvflash::cuda::sm90 {

// The planned kernels, with their K / V copies kPageKeys keys each (0: a block): rung 3 (128 x
// block_n, two overlapping groups), rung 6 (64 x 64, one overlapping group, small_tile_ctas CTAs
// per SM) or rung 8 (192 x 128, three overlapping groups, d <= 64).
template <class Elem, int kHeadDim, int kHeadDimV, int kRung, int kPageKeys>
using PlannedTraits = conditional_t<
    kRung == kSmallTileRung,
    PrefillTraits<Elem, kHeadDim, kHeadDimV, core::kSm90SmallTile, core::kSm90SmallTile, 2, 1, true, false, kPageKeys,
                  false, small_tile_ctas(kHeadDim, kHeadDimV)>,
    PrefillTraits<Elem, kHeadDim, kHeadDimV, kRung == kThreeGroupRung ? kThreeGroupRows : 128,
                  prefill_block_n(kHeadDim, kHeadDimV), 2, kRung == kThreeGroupRung ? 3 : 2, true, false, kPageKeys>>;
static_assert(kBestRung == 3, "the planned rungs (3, 6, 8) are compiled for every page size");

// A planned kernel over a dense cache or pages of whole blocks (one copy per block), else over
// pages of kPageKeys keys, for each page size the family rule sends here below a block
// (core::sm90_page_fits: 8, 16, ... block / 2; the last of them ends the search).
template <class Elem, int kHeadDim, int kHeadDimV, int kRung, int kPageKeys = core::kSm90MinPageKeys>
void launch_planned(const AttentionParams& p, int kv_group, cudaStream_t stream) {
  using Whole = PlannedTraits<Elem, kHeadDim, kHeadDimV, kRung, 0>;
  if (!p.cache.paged || p.cache.page_size.divisor % Whole::kBlockN == 0) {
    return launch_prefill<Whole>(p, kv_group, stream);
  }
  static_assert(Whole::kBlockN % kPageKeys == 0);
  if constexpr (2 * kPageKeys < Whole::kBlockN) {
    if (p.cache.page_size.divisor != kPageKeys) {
      return launch_planned<Elem, kHeadDim, kHeadDimV, kRung, 2 * kPageKeys>(p, kv_group, stream);
    }
  }
  launch_prefill<PlannedTraits<Elem, kHeadDim, kHeadDimV, kRung, kPageKeys>>(p, kv_group, stream);
}

// fp8 (FA3's all-fp8 call) has rung 3's kernel over every page size the family reads and rung 4's
// over a dense cache or pages of whole blocks; 16 bits every rung.
template <class Elem, int kHeadDim, int kHeadDimV>
void launch_prefill_rung(const AttentionParams& p, int kv_group, int rung, cudaStream_t stream) {
  constexpr bool kFp8 = std::is_same_v<Elem, __nv_fp8_e4m3>;
  // Rung 6: two or three CTAs of one overlapping group per SM over 64 x 64 tiles
  // (small_tile_ctas), over a dense cache or pages of 8 or more keys (core::sm90_small_tiles).
  if constexpr (!kFp8 && kHeadDim <= kSmallTileMaxHeadDim && kHeadDimV <= kSmallTileMaxHeadDim) {
    if (rung == kSmallTileRung) {
      return launch_planned<Elem, kHeadDim, kHeadDimV, kSmallTileRung>(p, kv_group, stream);
    }
  }
  // 128 keys per block up to head dim 128; 64 above (two stages of K and V then fit beside Q).
  constexpr int kBlockN = prefill_block_n(kHeadDim, kHeadDimV);
  const bool whole_blocks = !p.cache.paged || p.cache.page_size.divisor % kBlockN == 0;
  // The other rungs are compiled at the ladder's head dims only (sm90bench times them there), over
  // a dense cache or pages of whole blocks (rung 8 over small pages too: core::sm90_three_groups
  // plans it there with KVFLASH_SM90_THREE_GROUP_PAGES=1).
  if constexpr (ladder_dims(kHeadDim, kHeadDimV)) {
    constexpr int d = kHeadDim;
    if (whole_blocks && rung == kPingPongRung) {
      return launch_prefill<PrefillTraits<Elem, d, d, 128, kBlockN, 2, 2, true, true>>(p, kv_group, stream);
    }
    if constexpr (!kFp8 && d <= kThreeGroupMaxHeadDim) {
      if (rung == kThreeGroupRung) return launch_planned<Elem, d, d, kThreeGroupRung>(p, kv_group, stream);
    }
    if constexpr (!kFp8) {
      if (whole_blocks) {
        switch (rung) {
          case 1: return launch_prefill<PrefillTraits<Elem, d, d, 64, kBlockN, 2, 1, false>>(p, kv_group, stream);
          case 2: return launch_prefill<PrefillTraits<Elem, d, d, 128, kBlockN, 2, 2, false>>(p, kv_group, stream);
          case kPersistentRung:
            return launch_prefill<PrefillTraits<Elem, d, d, 128, kBlockN, 2, 2, true, false, 0, true>>(p, kv_group,
                                                                                                       stream);
          case kWideRung:  // dense caches only (a wide block spans pages); planned nowhere yet
            if (!p.cache.paged) {
              return launch_prefill<PrefillTraits<Elem, d, d, 128, wide_block_n(d), 2, 2, true>>(p, kv_group, stream);
            }
            break;
          default: break;
        }
      }
    }
  }
  // Rung 3: asked for, over pages smaller than a block, or rung 6 where two CTAs do not fit.
  launch_planned<Elem, kHeadDim, kHeadDimV, kBestRung>(p, kv_group, stream);
}

}  // namespace kvflash::cuda::sm90
