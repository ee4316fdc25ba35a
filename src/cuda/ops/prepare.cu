// Per-batch split counts on the device (kvflash's portable rule, core/split_rule.h, the same
// arithmetic core/heuristics.cpp runs on the host) and the attention grid's split columns: a
// Plan's static decisions stay, its per-batch vector is recomputed from the lengths in device
// memory, so a plan refreshes for a new decode step without a host sync and inside a CUDA graph,
// and the attention kernel launches only the (sequence, split) columns the lengths need.
// One CTA, one sequence per thread (as many threads as sequences, rounded to warps): splits are
// computed per sequence only for batches up to 992.
#include "core/split_rule.h"
#include "cuda/ops/kernels.h"
#include "cuda/common/lengths.cuh"
#include "cuda/common/split_rule.cuh"

namespace kvflash::cuda {
namespace {

using core::kMaxDynamicSplitBatch;
constexpr int kMaxThreads = 1024;
constexpr int kMaxWarps = kMaxThreads / 32;
static_assert(kMaxDynamicSplitBatch <= kMaxThreads, "one sequence per thread");

// The CTA-wide sum of v (every thread calls it and gets the sum).
__device__ int64_t block_sum(int64_t v, int64_t* scratch) {
  for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();  // the previous sum's readers are done with scratch
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = v;
  __syncthreads();
  int64_t sum = 0;
  for (int w = 0; w < int(blockDim.x / 32); ++w) sum += scratch[w];
  return sum;
}

// Exclusive prefix sum of v over the threads in order; `total` gets the sum of all.
__device__ int block_exclusive_scan(int v, int* scratch, int& total) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  int x = v;
  for (int o = 1; o < 32; o *= 2) {
    const int y = __shfl_up_sync(0xffffffffu, x, o);
    if (lane >= o) x += y;
  }
  if (lane == 31) scratch[warp] = x;
  __syncthreads();
  int before = 0;
  total = 0;
  for (int w = 0; w < int(blockDim.x / 32); ++w) {
    if (w < warp) before += scratch[w];
    total += scratch[w];
  }
  return before + x - v;
}

__global__ void __launch_bounds__(kMaxThreads) prepare_kernel(const PrepareParams p) {
  __shared__ int64_t sums[kMaxWarps];
  __shared__ int counts[kMaxWarps];
  const int batch = p.len.batch;
  if (batch > kMaxDynamicSplitBatch || p.num_splits <= 1) {  // one split each
    for (int b = threadIdx.x; b < batch; b += blockDim.x) {
      p.splits_out[b] = 1;
      if (b < p.num_work) p.work_out[b] = SplitWork{b, 0, 1};
    }
    for (int z = batch + threadIdx.x; z < p.num_work; z += blockDim.x) p.work_out[z] = SplitWork{};
    return;
  }
  const int b = threadIdx.x;
  SplitTiles tiles;
  if (b < batch) {
    const SeqLens s = seq_lens(p.len, b);
    tiles = split_tiles(p.rule, s.seqlen_q, s.seqlen_k);
  }
  const int64_t heads_tiles = int64_t(p.rule.heads) * tiles.m_blocks;
  const int64_t total = block_sum(heads_tiles * tiles.n_blocks, sums);
  const int64_t slots = core::portable_slots(p.rule.num_sms, p.rule.ctas_per_sm);
  const int64_t best_blocks = core::portable_choose_blocks(
      total, slots,
      [&](int64_t blocks) {
        const int splits = core::portable_splits(tiles.m_blocks, tiles.n_blocks, blocks, p.num_splits);
        return block_sum(b < batch ? heads_tiles * splits : 0, sums);
      },
      p.rule.ctas_per_sm);
  const int splits =
      b < batch ? core::portable_splits(tiles.m_blocks, tiles.n_blocks, best_blocks, p.num_splits) : 0;
  int used = 0;
  const int first = block_exclusive_scan(splits, counts, used);
  if (b < batch) {
    p.splits_out[b] = splits;
    // first + splits <= num_work always (core::portable_split_columns); the check only guards.
    for (int s = 0; s < splits && first + s < p.num_work; ++s) {
      p.work_out[first + s] = SplitWork{b, int16_t(s), int16_t(splits)};
    }
  }
  for (int z = used + threadIdx.x; z < p.num_work; z += blockDim.x) p.work_out[z] = SplitWork{};
}

}  // namespace

void launch_prepare(const PrepareParams& p, cudaStream_t stream) {
  if (p.len.batch == 0) return;
  const int threads = p.len.batch > kMaxDynamicSplitBatch ? kMaxThreads : (p.len.batch + 31) / 32 * 32;
  prepare_kernel<<<1, threads, 0, stream>>>(p);
}

}  // namespace kvflash::cuda
