// The tile of each head dim and rung; included by the instantiation files (prefill_inst_*.cu) only.
#pragma once

#include "cuda/sm90/prefill.h"
#include "cuda/sm90/prefill_kernel.cuh"

namespace kvflash::cuda::sm90 {

// Rung 3 at head dims (kHeadDim, kHeadDimV), its K / V copies kPageKeys keys each (0: a block).
template <class Elem, int kHeadDim, int kHeadDimV, int kPageKeys = 0>
using RungTraits3 = PrefillTraits<Elem, kHeadDim, kHeadDimV, 128, prefill_block_n(kHeadDim, kHeadDimV), 2, 2, true,
                                  false, kPageKeys>;
static_assert(kBestRung == 3, "pages smaller than a key block are compiled for the best rung");

// The best rung with one TMA copy per page of kPageKeys keys, for each page size the family rule
// sends here below a block (core::sm90_page_fits: 8, 16, ... kBlockN / 2; the last of them ends
// the search).
template <class Elem, int kHeadDim, int kHeadDimV, int kPageKeys = core::kSm90MinPageKeys>
void launch_small_pages(const AttentionParams& p, int kv_group, cudaStream_t stream) {
  constexpr int kBlockN = prefill_block_n(kHeadDim, kHeadDimV);
  static_assert(kBlockN % kPageKeys == 0 && kPageKeys >= core::kSm90MinPageKeys);
  if constexpr (2 * kPageKeys < kBlockN) {
    if (p.cache.page_size.divisor != kPageKeys) {
      return launch_small_pages<Elem, kHeadDim, kHeadDimV, 2 * kPageKeys>(p, kv_group, stream);
    }
  }
  launch_prefill<RungTraits3<Elem, kHeadDim, kHeadDimV, kPageKeys>>(p, kv_group, stream);
}

template <class Elem, int kHeadDim, int kHeadDimV>
void launch_prefill_rung(const AttentionParams& p, int kv_group, int rung, cudaStream_t stream) {
  // 128 keys per block up to head dim 128; 64 above (two stages of K and V then fit beside Q).
  constexpr int kBlockN = prefill_block_n(kHeadDim, kHeadDimV);
  // Rung 6: two CTAs of one overlapping group per SM over 64 x 64 tiles (head dims <= 128: two
  // fit), over a dense cache or pages of whole tiles (core::sm90_small_tiles).
  constexpr int kSmall = core::kSm90SmallTile;
  if constexpr (kHeadDim <= kSmallTileMaxHeadDim && kHeadDimV <= kSmallTileMaxHeadDim) {
    if (rung == kSmallTileRung && (!p.cache.paged || p.cache.page_size.divisor % kSmall == 0)) {
      return launch_prefill<
          PrefillTraits<Elem, kHeadDim, kHeadDimV, kSmall, kSmall, 2, 1, true, false, 0, false, 2>>(p, kv_group,
                                                                                                     stream);
    }
  }
  if (p.cache.paged && p.cache.page_size.divisor % kBlockN != 0) {
    return launch_small_pages<Elem, kHeadDim, kHeadDimV>(p, kv_group, stream);
  }
  // The other rungs are compiled at the ladder's head dims only (sm90bench times them there).
  if constexpr (ladder_dims(kHeadDim, kHeadDimV)) {
    constexpr int d = kHeadDim;
    switch (rung) {
      case 1: return launch_prefill<PrefillTraits<Elem, d, d, 64, kBlockN, 2, 1, false>>(p, kv_group, stream);
      case 2: return launch_prefill<PrefillTraits<Elem, d, d, 128, kBlockN, 2, 2, false>>(p, kv_group, stream);
      case 4: return launch_prefill<PrefillTraits<Elem, d, d, 128, kBlockN, 2, 2, true, true>>(p, kv_group, stream);
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
  // Rung 3, and rung 6 where two CTAs do not fit.
  launch_prefill<RungTraits3<Elem, kHeadDim, kHeadDimV>>(p, kv_group, stream);
}

}  // namespace kvflash::cuda::sm90
