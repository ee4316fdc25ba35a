// Pieces shared by `kvflash run` and `kvflash bench`: a paged KV cache layout shaped like a
// serving engine's (each sequence's pages scattered over one pool) and the work an attention call
// does (K/V bytes read, FLOPs), from which GB/s and TFLOP/s are reported.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "host_tensor.h"

namespace kvflash::tools {

struct PagedLayout {
  int64_t page_size = 0;
  int64_t pages_per_seq = 0;
  int64_t num_pages = 0;
  std::vector<std::vector<int32_t>> pages;  // per sequence: its page-table row
  HostTensor page_table() const;            // (batch, pages_per_seq) int32
};

// Every sequence gets room for `capacity` tokens; the pool's pages are handed out in a random order.
PagedLayout make_paged_layout(int64_t batch, int64_t capacity, int64_t page_size,
                              std::mt19937_64& rng);

struct AttentionShape {
  int64_t heads = 32;
  int64_t kv_heads = 8;
  int64_t head_dim = 128;
  int64_t head_dim_v = 128;
  DType dtype = DType::bf16;
};

// Minimum traffic and arithmetic: every visible K/V row read once per call, 2 FLOPs per
// multiply-add of Q.K^T and P.V.
struct AttentionWork {
  double kv_bytes = 0;
  double flops = 0;
  AttentionWork& operator+=(const AttentionWork& other);
};

// `queries` consecutive query rows at the end of a sequence of `keys` keys, causal (bottom-right)
// or each row seeing every key.
AttentionWork attention_work(const AttentionShape& shape, int64_t queries, int64_t keys, bool causal);

}  // namespace kvflash::tools
