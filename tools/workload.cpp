#include "workload.h"

#include <algorithm>
#include <numeric>

namespace kvflash::tools {

HostTensor PagedLayout::page_table() const {
  HostTensor t(DType::i32, {int64_t(pages.size()), pages_per_seq});
  for (size_t b = 0; b < pages.size(); ++b) {
    std::copy(pages[b].begin(), pages[b].end(), t.i32() + b * pages_per_seq);
  }
  return t;
}

PagedLayout make_paged_layout(int64_t batch, int64_t capacity, int64_t page_size,
                              std::mt19937_64& rng) {
  PagedLayout layout;
  layout.page_size = page_size;
  layout.pages_per_seq = (capacity + page_size - 1) / page_size;
  layout.num_pages = batch * layout.pages_per_seq;
  std::vector<int32_t> pool(size_t(layout.num_pages));
  std::iota(pool.begin(), pool.end(), 0);
  std::shuffle(pool.begin(), pool.end(), rng);
  for (int64_t b = 0; b < batch; ++b) {
    auto first = pool.begin() + b * layout.pages_per_seq;
    layout.pages.emplace_back(first, first + layout.pages_per_seq);
  }
  return layout;
}

AttentionWork& AttentionWork::operator+=(const AttentionWork& other) {
  kv_bytes += other.kv_bytes;
  flops += other.flops;
  return *this;
}

AttentionWork attention_work(const AttentionShape& shape, int64_t queries, int64_t keys, bool causal) {
  const double element = double(dtype_size(shape.dtype));
  // Causal: query row i (of `queries`) sees keys - queries + i + 1 keys.
  const double visible_pairs =
      causal ? double(queries) * double(keys - queries) + double(queries) * double(queries + 1) / 2.0
             : double(queries) * double(keys);
  AttentionWork work;
  work.kv_bytes = double(keys) * double(shape.kv_heads) *
                  double(shape.head_dim + shape.head_dim_v) * element;
  work.flops = 2.0 * visible_pairs * double(shape.heads) * double(shape.head_dim + shape.head_dim_v);
  return work;
}

}  // namespace kvflash::tools
