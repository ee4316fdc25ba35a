// Decode batches made of seeded sequences (query, keys, values, length), for batch-invariance
// checks: the same sequence placed in batches with different neighbours must give the same bits
// in batch-invariant mode. Host buffers, float32 or bfloat16; the GPU runner mirrors them.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "kvflash/kvflash.h"

namespace kvflash::testing {

struct Sequence {
  int length;
  uint32_t seed;
};

class SequenceBatch {
 public:
  static constexpr int kHeads = 4, kHeadsK = 2, kDim = 64, kCapacity = 4096;

  SequenceBatch(const std::vector<Sequence>& seqs, DType dtype) : dtype_(dtype) {
    const int64_t b = static_cast<int64_t>(seqs.size());
    const int64_t q_row = kHeads * kDim, cache_row = int64_t{kCapacity} * kHeadsK * kDim;
    q_.resize(b * q_row * 4), k_.resize(b * cache_row * 4), v_.resize(k_.size());
    for (int64_t i = 0; i < b; ++i) {
      uint32_t x = seqs[i].seed * 747796405u + 1;
      for (int64_t j = 0; j < q_row; ++j) put(q_, i * q_row + j, x);
      for (int64_t j = 0; j < cache_row; ++j) put(k_, i * cache_row + j, x), put(v_, i * cache_row + j, x);
      lengths_.push_back(seqs[i].length);
    }
    out_.assign(q_.size(), 0);
    lse_.assign(b * kHeads * 4, 0);
    args.q = TensorView::contiguous(q_.data(), dtype, {b, 1, kHeads, kDim});
    args.k_cache = TensorView::contiguous(k_.data(), dtype, {b, kCapacity, kHeadsK, kDim});
    args.v_cache = TensorView::contiguous(v_.data(), dtype, {b, kCapacity, kHeadsK, kDim});
    args.cache_seqlens = TensorView::contiguous(lengths_.data(), DType::i32, {b});
    outputs.out = TensorView::contiguous(out_.data(), dtype, {b, 1, kHeads, kDim});
    outputs.softmax_lse = TensorView::contiguous(lse_.data(), DType::f32, {b, kHeads, 1});
  }
  SequenceBatch(const SequenceBatch&) = delete;

  KvCacheArgs args;  // set batch_invariant / num_splits before running
  Outputs outputs;

  // out and LSE of batch element i, as bytes (after the call).
  std::vector<char> row_bytes(int i) const {
    const size_t out_row = kHeads * kDim * dtype_size(dtype_), lse_row = kHeads * 4;
    std::vector<char> bytes(out_.begin() + i * out_row, out_.begin() + (i + 1) * out_row);
    bytes.insert(bytes.end(), lse_.begin() + i * lse_row, lse_.begin() + (i + 1) * lse_row);
    return bytes;
  }

 private:
  // Element `index` of `buffer` from the next value in [-1, 1] of the xorshift state x.
  void put(std::vector<char>& buffer, int64_t index, uint32_t& x) const {
    x ^= x << 13, x ^= x >> 17, x ^= x << 5;
    const float value = static_cast<float>(x % 2001) / 1000.0f - 1.0f;
    if (dtype_ == DType::f32) {
      std::memcpy(&buffer[index * 4], &value, 4);
    } else {  // bfloat16: the top half of the float32 bits
      uint32_t bits;
      std::memcpy(&bits, &value, 4);
      const uint16_t top = static_cast<uint16_t>(bits >> 16);
      std::memcpy(&buffer[index * 2], &top, 2);
    }
  }

  DType dtype_;
  std::vector<char> q_, k_, v_, out_, lse_;
  std::vector<int32_t> lengths_;
};

// The batches the tests place one sequence in, and where it sits in each.
inline const Sequence kMine{3001, 7};
inline const std::vector<std::vector<Sequence>> kBatches = {
    {kMine}, {kMine, {4096, 1}, {5, 2}}, {{17, 3}, {2500, 4}, kMine}, {{4000, 5}, kMine, {4000, 6}, {1, 8}}};
inline const std::vector<int> kPositions = {0, 0, 2, 1};

}  // namespace kvflash::testing
