// Which keys a query row sees: the one definition of causal / sliding window / chunked masks
// (contract 5.4), shared by every backend. Host and device.
#pragma once

#include "core/limits.h"

namespace kvflash::core {

struct KeyRange {
  int lo = 0;  // first visible key index (0-based, relative to leftpad)
  int hi = 0;  // one past the last; lo >= hi means no visible key
};

KVFLASH_HD int floor_div(int a, int b) { return (a >= 0 ? a : a - b + 1) / b; }

// Query row i (0-based within its sequence) of a sequence with seqlen_q queries and seqlen_k keys.
// window_left / window_right: -1 unbounded (causal is window_right == 0); chunk: 0 off.
KVFLASH_HD KeyRange visible_keys(int i, int seqlen_q, int seqlen_k, int window_left,
                                 int window_right, int chunk) {
  const int diag = i + seqlen_k - seqlen_q;  // bottom-right alignment
  KeyRange r{0, seqlen_k};
  if (window_right >= 0 && diag + window_right + 1 < r.hi) r.hi = diag + window_right + 1;
  if (window_left >= 0 && diag - window_left > r.lo) r.lo = diag - window_left;
  if (chunk > 0) {
    const int c0 = floor_div(diag, chunk) * chunk;
    if (c0 > r.lo) r.lo = c0;
    if (c0 + chunk < r.hi) r.hi = c0 + chunk;
  }
  if (r.hi < r.lo) r.hi = r.lo;
  return r;
}

// Split-KV: split `split` of `num_splits` covers whole key blocks of `block_n` keys; the
// ceil(n_blocks / num_splits) blocks per split are taken in order, so trailing splits may be
// empty. Every backend partitions the keys this way, so partials are comparable.
KVFLASH_HD KeyRange split_keys(int split, int num_splits, int seqlen_k, int block_n) {
  const int n_blocks = (seqlen_k + block_n - 1) / block_n;
  const int per_split = (n_blocks + num_splits - 1) / num_splits;
  int lo = split * per_split * block_n;
  int hi = lo + per_split * block_n;
  if (lo > seqlen_k) lo = seqlen_k;
  if (hi > seqlen_k) hi = seqlen_k;
  return KeyRange{lo, hi};
}

}  // namespace kvflash::core
