// The oracle: a deliberately naive float64 flash_attn_with_kvcache, written again from the spec
// (shared/spec/kvcache-api.md sections 1, 3, 5, 13) and sharing no code with the backends. It reads
// host tensors and never writes them: the cache contents the call should produce are returned.
#pragma once

#include <cstdint>
#include <vector>

#include "kvflash/args.h"

namespace kvflash::oracle {

// One element of a new K or V row appended into the cache.
struct AppendedElement {
  bool in_v_cache = false;  // false: k_cache, true: v_cache
  int64_t offset = 0;       // element offset from the cache view's data pointer
  uint32_t bits = 0;        // storage bits the oracle computes (fp32 math, rounded)
  bool rotated = false;     // rotary applied: the storage value may differ within the bound
  double exact = 0.0;       // rotated: the float64 value before any rounding
  double cancellation = 0.0;  // rotated: |x1*c| + |x2*s|, the scale of the fp32 rounding error
};

struct OracleResult {
  int batch = 0;
  int seqlen_q = 0;  // static s_q (max_seqlen_q when varlen)
  int64_t total_q = 0;
  int num_heads = 0;
  int headdim_v = 0;
  bool varlen_q = false;
  DType out_dtype = DType::bf16;

  std::vector<double> out;   // (total_q, h, d_v), token-major like the packed output
  std::vector<double> lse;   // FA3 layout: (b, h, s_q) dense, (h, total_q) varlen
  // Per (token, head): no visible key at all (out must be exactly 0, LSE -inf or the sink).
  std::vector<uint8_t> empty_row;
  // Per (token, head): max |v_j| * v_descale over the visible keys, the scale of |out|.
  std::vector<double> value_scale;
  // Per (token, head): a bound on |scaled score| from Cauchy-Schwarz (|q|·max|k| [+ |qv|·max|v|]),
  // the scale of the fp32 rounding error in the scores.
  std::vector<double> score_scale;
  std::vector<int> token_batch;  // batch element of each token
  std::vector<AppendedElement> appended;

  int64_t lse_index(int64_t token, int head) const;
  int64_t row_index(int64_t token, int head) const { return token * num_heads + head; }
};

// Reads every tensor of `args` (host memory) and computes the call's expected result.
// `args` must be a call the contract accepts; the oracle checks only what it needs to read safely.
//
// Threads: the appends run serially; the reads of keys, values and queries (per block of
// positions of a sequence) and the attention (per block of query rows of one head) run on
// `threads` threads, each unit writing only its own data with the serial arithmetic, so the
// result is bitwise the same for any thread count. threads = 0:
// KVFLASH_ORACLE_THREADS when set (1 = serial; not a positive integer: std::invalid_argument),
// else every hardware thread, and calls of under ~1M multiply-adds serially (threads would cost
// more than they save). threads > 0: that many, whatever the size.
OracleResult run_oracle(const KvCacheArgs& args, int threads = 0);

}  // namespace kvflash::oracle
