// kvflash's portable split rule (core/split_rule.h) on one sequence's device-side lengths.
#pragma once

#include <cstdint>

#include "core/split_rule.h"
#include "cuda/common/params.h"

namespace kvflash::cuda {

// Query tiles and key blocks of a sequence under the plan's tiles.
struct SplitTiles {
  int m_blocks = 0;
  int64_t n_blocks = 0;
};

__device__ __forceinline__ SplitTiles split_tiles(const SplitRule& r, int seqlen_q, int seqlen_k) {
  SplitTiles t;
  t.m_blocks = int(core::ceil_div(int64_t(seqlen_q > 0 ? seqlen_q : 0) * r.group, r.block_m));
  t.n_blocks = core::ceil_div(seqlen_k > 0 ? seqlen_k : 0, r.block_n);
  return t;
}

// Splits of a batch's only sequence (what the prepare kernel would give it).
__device__ __forceinline__ int splits_alone(const SplitRule& r, int seqlen_q, int seqlen_k, int max_splits) {
  const SplitTiles t = split_tiles(r, seqlen_q, seqlen_k);
  if (r.batch_invariant) return core::batch_invariant_splits(t.m_blocks, t.n_blocks, max_splits);
  return core::portable_splits_alone(t.m_blocks, t.n_blocks, r.heads, core::portable_slots(r.num_sms, r.ctas_per_sm),
                                     max_splits, r.ctas_per_sm);
}

}  // namespace kvflash::cuda
