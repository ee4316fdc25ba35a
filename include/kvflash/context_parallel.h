// Context parallelism: one sequence's KV cache spread over `world_size` ranks (GPUs), each rank
// attending to the positions it owns, the partials merged exactly through their LSE.
//
//   ShardLayout layout = ShardLayout::strided_pages(world_size, page_size);
//   ShardArgs shard{call, global_cache_seqlens, layout, rank};   // call: this rank's cache
//   flash_attn_with_kvcache_cp(communicator, shard, outputs);     // same out / lse on every rank
//
// Every rank holds all the queries (q is replicated) and only its own slice of each sequence's
// cache positions, in a cache of its own (dense or paged, its own page table). Masks (causal,
// sliding window, attention_chunk) are evaluated in GLOBAL positions: query row i of a sequence
// with S_q queries and S_k keys in total sits at global position i + S_k - S_q, whatever rank
// holds the keys. New K/V of the step (k / v, replicated) are stored by the rank that owns their
// global positions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "kvflash/kvflash.h"

namespace kvflash::cp {

// Which rank owns which global cache position of a sequence.
struct ShardLayout {
  enum class Kind {
    contiguous,     // rank r owns positions [r * positions_per_rank, (r + 1) * positions_per_rank)
    strided_pages,  // rank r owns the pages p (of page_size positions) with p % world_size == r
  };
  Kind kind = Kind::contiguous;
  int world_size = 1;
  int64_t positions_per_rank = 0;  // contiguous only
  int page_size = 0;               // strided_pages only

  static ShardLayout contiguous(int world_size, int64_t positions_per_rank);
  static ShardLayout strided_pages(int world_size, int page_size);

  // Throws Error(invalid_value) naming the field that is out of range.
  void check() const;
  // The rank that owns global position `pos` (pos >= 0).
  int owner(int64_t pos) const;
  // How many of the global positions [0, pos) `rank` owns. For an owned position this is its
  // index in the rank's own cache, so the rank's cache holds its positions in global order.
  int64_t owned_before(int rank, int64_t pos) const;
};

// One rank's share of a flash_attn_with_kvcache call.
struct ShardArgs {
  // The call as this rank makes it, with the contract's meaning (kvflash.h), except:
  //  - q (b, s_q, h, d) dense, the same on every rank (cu_seqlens_q is not taken);
  //  - k_cache / v_cache / page_table / cache_batch_idx address THIS rank's cache, whose position
  //    p holds the rank's p-th owned global position (ShardLayout::owned_before);
  //  - cache_seqlens and cache_leftpad are absent: the rank's lengths follow from
  //    global_cache_seqlens and the layout;
  //  - k / v (b, s_new, h_k, d|d_v), when given, are all of the step's new tokens (the same on every
  //    rank); each is stored only by the rank that owns its global position. Rotary embedding is
  //    not applied here (rotate k before the call; rotary_cos / rotary_sin are not taken);
  //  - sinks are counted once, by rank 0;
  //  - plan / scheduler_metadata are not taken: each rank plans its own calls.
  KvCacheArgs call;
  // Per batch element: the global number of cached tokens before this step's append (host memory).
  std::vector<int32_t> global_cache_seqlens;
  ShardLayout layout;
  int rank = 0;
};

// This rank's partial for every query: out_partial (b, s_q, h, d_v) and lse_partial (b, s_q, h),
// float32, contiguous, on q's device. Rows with no visible key on this rank get out 0 and LSE
// -inf (rank 0 with sinks: LSE = the sink), so they drop out of the merge and never make a NaN.
// Appends this rank's new K/V first; every argument is checked before anything is written.
// Runs on host (CPU) tensors; CUDA tensors throw Error(unsupported) for now (see
// src/parallel/attend_shard.cpp for what a CUDA version needs).
void attend_shard(const ShardArgs& shard, const TensorView& out_partial,
                  const TensorView& lse_partial, const RunOptions& options = {});

// The collective the combine needs. all_gather: every rank passes `bytes` of `send`; afterwards
// every rank's `recv` (world_size * bytes) holds rank r's bytes at offset r * bytes. Buffers are
// on the communicator's device. Every rank must call it, in the same order; a rank that fails
// before its call leaves the others waiting, as with any collective.
class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  virtual void all_gather(const void* send, void* recv, size_t bytes) = 0;
};

// world_size ranks inside one process (threads, one Communicator each): for tests and for N
// shards on one device. Each rank's all_gather blocks until every rank has called it.
class InProcessGroup {
 public:
  explicit InProcessGroup(int world_size);
  ~InProcessGroup();
  Communicator& communicator(int rank);
  int world_size() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// Gathers every rank's partial into gathered_out (world_size, b, s_q, h, d_v) and gathered_lse
// (world_size, b, s_q, h) (float32, contiguous, scratch) and merges them with kvflash::combine
// into out (b, s_q, h, d_v) and, when given, lse in the call's layout (b, h, s_q).
// The same result on every rank. With NCCL the gather is queued on the communicator's stream:
// pass that stream in options.stream so the merge runs after it.
void combine_across_ranks(Communicator& comm, const TensorView& out_partial,
                          const TensorView& lse_partial, const TensorView& gathered_out,
                          const TensorView& gathered_lse, const TensorView& out,
                          const OptTensor& lse = std::nullopt, const RunOptions& options = {});

// attend_shard then combine_across_ranks, with scratch it allocates (host tensors).
// outputs.out (b, s_q, h, d_v) in q's dtype (bf16 for fp8), outputs.softmax_lse (b, h, s_q).
void flash_attn_with_kvcache_cp(Communicator& comm, const ShardArgs& shard, const Outputs& outputs,
                                const RunOptions& options = {});

}  // namespace kvflash::cp

// NCCL: compiled only with the CUDA backend and when nccl.h is found. libnccl is not linked into
// kvflash: its entry points are looked up at run time in the process (which made the ncclComm_t,
// so has NCCL loaded) or in libnccl.so.2.
#if defined(KVFLASH_WITH_CUDA) && defined(__has_include)
#if __has_include(<nccl.h>)
#include <cuda_runtime_api.h>
#include <nccl.h>
#define KVFLASH_WITH_NCCL 1
namespace kvflash::cp {
// all_gather as ncclAllGather of bytes on `stream` (asynchronous, stream-ordered like the kernels).
std::unique_ptr<Communicator> make_nccl_communicator(ncclComm_t comm, cudaStream_t stream);
}  // namespace kvflash::cp
#endif
#endif
