// How one rank's part of a sequence's attention becomes ordinary flash_attn_with_kvcache calls.
//
// The public call can only express masks that are relative to its own keys: query row t of m rows
// against N keys has its diagonal at t + N - m, and a window keeps [diag - left, diag + right].
// A rank's keys are a subset of the global positions, so its per-row visible keys are computed
// here in global positions (core::visible_keys) and mapped to the rank's own positions. Because
// the rank stores its positions in global order, the mapped set is one interval per row,
// [lo(t), hi(t)). Rows are then grouped into runs where each bound either stays put or moves by
// exactly one per row; every such run is one call, with cache_leftpad = lo of its first row and a
// window chosen so the call's bottom-right diagonal reproduces the bounds:
//   lo fixed, hi fixed:     keys [A, A + N)                  window (-1, -1)
//   lo fixed, hi +1 a row:  hi(t) - A = diag + 1             window (-1,  0)
//   lo +1,    hi fixed:     lo(t) - A = t = diag - (N - m)   window (N - m, -1)
//   lo +1,    hi +1:        width w = hi - lo                window (w - 1, 0)
// (A = leftpad, N = keys of the call, m = rows.) Rows with no visible key on the rank are in no
// call. Decode (one query row) is always one call per sequence (and attend_shard batches the
// sequences into one call); a causal extend takes at most two calls per sequence on a contiguous
// shard and about one per page the queries span on a strided shard.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "kvflash/context_parallel.h"

namespace kvflash::cp {

// Visible keys of one query row, in the rank's own positions; lo >= hi: none.
struct LocalRange {
  int64_t lo = 0;
  int64_t hi = 0;
};

// One call: query rows [row0, row0 + rows) against the rank's keys [leftpad, seqlen).
struct ShardCall {
  int row0 = 0;
  int rows = 0;
  int64_t leftpad = 0;
  int64_t seqlen = 0;  // cache_seqlens of the call (includes leftpad, as in the contract)
  int window_left = -1;
  int window_right = -1;
};

// Per query row of a sequence with seqlen_q queries and seqlen_k keys in total (global), the keys
// `rank` owns and the row sees. window_right is 0 for causal; chunk 0 is off.
std::vector<LocalRange> local_visible_keys(const ShardLayout& layout, int rank, int seqlen_q,
                                           int64_t seqlen_k, int window_left, int window_right,
                                           int chunk);

// The calls that cover every non-empty row exactly as `ranges` says.
std::vector<ShardCall> calls_for_rows(const std::vector<LocalRange>& ranges);

// The keys the call's own mask gives its row t (0 <= t < call.rows), in the rank's positions.
LocalRange call_range(const ShardCall& call, int t);

// One call for all the rows of a sequence, empty rows included, when one reproduces `ranges`
// exactly (decode always; a causal extend on most contiguous shards). A sequence with no visible key
// on the rank gets a call with no keys (seqlen == leftpad == 0), whatever its window.
// Sequences whose calls agree on the window then share one batched call.
std::optional<ShardCall> whole_sequence_call(const std::vector<LocalRange>& ranges);

}  // namespace kvflash::cp
