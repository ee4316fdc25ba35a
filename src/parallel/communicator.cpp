// The in-process communicator, the cross-rank combine and the whole context-parallel call.
//
// Why all-gather (each rank receives every rank's whole partial) rather than a reduce-scatter by
// heads: NCCL has no reduction for the LSE-weighted merge, so a "reduce-scatter" would be an
// all-to-all of partials by head, a local merge, then an all-gather of the merged heads to give
// every rank the full output the next layer needs: two collectives instead of one. At decode the
// partials are small (b * h * s_q * d_v floats plus b * h * s_q LSEs, e.g. 64 * 32 * 128 * 4 B =
// 1 MiB), so the collective is latency-bound and one launch wins; all-gather moves
// (world_size - 1) times the partial per rank against about twice (world_size - 1) / world_size
// of it for the two-step scheme, which would matter only for long extends on many ranks.
// (Measured comparison on NCCL pending: no multi-GPU machine was lent when this was written.)
#include <barrier>
#include <cstring>
#include <string>
#include <vector>

#include "core/validate.h"
#include "kvflash/context_parallel.h"

namespace kvflash::cp {

namespace {

// Where the ranks of one InProcessGroup meet.
struct GatherRoom {
  explicit GatherRoom(int world_size)
      : barrier(world_size), sends(size_t(world_size)), sizes(size_t(world_size)) {}
  std::barrier<> barrier;
  std::vector<const void*> sends;
  std::vector<size_t> sizes;
};

// all_gather: publish the send pointer, wait for every rank, copy every rank's bytes, wait again
// so no rank reuses its send buffer while another is still reading it.
class InProcessCommunicator final : public Communicator {
 public:
  InProcessCommunicator(GatherRoom& state, int rank) : state_(state), rank_(rank) {}
  int rank() const override { return rank_; }
  int world_size() const override { return int(state_.sends.size()); }
  void all_gather(const void* send, void* recv, size_t bytes) override {
    state_.sends[size_t(rank_)] = send;
    state_.sizes[size_t(rank_)] = bytes;
    state_.barrier.arrive_and_wait();
    for (size_t r = 0; r < state_.sizes.size(); ++r) {
      if (state_.sizes[r] != bytes) {  // every rank sees the same sizes, so all ranks throw
        core::fail(ErrorKind::invalid_value, "bytes",
                   "all_gather needs the same byte count on every rank (rank " + std::to_string(rank_) +
                       " sent " + std::to_string(bytes) + ", rank " + std::to_string(r) + " sent " +
                       std::to_string(state_.sizes[r]) + ")");
      }
    }
    for (size_t r = 0; r < state_.sends.size(); ++r) {
      std::memcpy(static_cast<char*>(recv) + r * bytes, state_.sends[r], bytes);
    }
    state_.barrier.arrive_and_wait();
  }

 private:
  GatherRoom& state_;
  int rank_;
};

size_t bytes_of(const TensorView& t) { return size_t(t.numel()) * dtype_size(t.dtype); }

// gathered must be (world_size, <partial's shape>), float32, contiguous.
void check_gathered(const TensorView& gathered, const char* name, const TensorView& partial, int world_size) {
  std::vector<int64_t> shape{world_size};
  shape.insert(shape.end(), partial.shape, partial.shape + partial.rank);
  core::require_dtype(gathered, name, DType::f32, std::string(name) + " must have dtype float32");
  core::require_shape(gathered, name, shape, std::string(name) + " must be (world_size, <partial's shape>)");
  core::require_contiguous(gathered, name);
}

}  // namespace

struct InProcessGroup::State {
  explicit State(int world_size) : room(world_size) {}
  GatherRoom room;
  std::vector<std::unique_ptr<Communicator>> ranks;
};

InProcessGroup::InProcessGroup(int world_size) {
  if (world_size < 1) {
    core::fail(ErrorKind::invalid_value, "world_size",
               "world_size must be at least 1 (got " + std::to_string(world_size) + ")");
  }
  state_ = std::make_unique<State>(world_size);
  for (int r = 0; r < world_size; ++r) {
    state_->ranks.push_back(std::make_unique<InProcessCommunicator>(state_->room, r));
  }
}

InProcessGroup::~InProcessGroup() = default;

Communicator& InProcessGroup::communicator(int rank) { return *state_->ranks.at(size_t(rank)); }

int InProcessGroup::world_size() const { return int(state_->ranks.size()); }

void combine_across_ranks(Communicator& comm, const TensorView& out_partial,
                          const TensorView& lse_partial, const TensorView& gathered_out,
                          const TensorView& gathered_lse, const TensorView& out,
                          const OptTensor& lse, const RunOptions& options) {
  core::require_contiguous(out_partial, "out_partial");
  core::require_contiguous(lse_partial, "lse_partial");
  check_gathered(gathered_out, "gathered_out", out_partial, comm.world_size());
  check_gathered(gathered_lse, "gathered_lse", lse_partial, comm.world_size());
  OptTensor lse_rows;  // the call's (b, h, s_q) seen as combine's (b, s_q, h)
  if (lse) {
    core::require_rank(*lse, "lse", 3, "(batch_size, num_heads, seqlen_q)");
    lse_rows = TensorView::strided(lse->data, lse->dtype, {lse->shape[0], lse->shape[2], lse->shape[1]},
                                   {lse->strides[0], lse->strides[2], lse->strides[1]}, lse->device);
  }
  comm.all_gather(out_partial.data, gathered_out.data, bytes_of(out_partial));
  comm.all_gather(lse_partial.data, gathered_lse.data, bytes_of(lse_partial));
  combine(gathered_out, gathered_lse, out, lse_rows, options);
}

void flash_attn_with_kvcache_cp(Communicator& comm, const ShardArgs& shard, const Outputs& outputs,
                                const RunOptions& options) {
  if (comm.world_size() != shard.layout.world_size || comm.rank() != shard.rank) {
    core::fail(ErrorKind::invalid_value, "comm",
               "the communicator is rank " + std::to_string(comm.rank()) + " of " +
                   std::to_string(comm.world_size()) + ", the shard is rank " + std::to_string(shard.rank) +
                   " of " + std::to_string(shard.layout.world_size));
  }
  if (!shard.call.q || !shard.call.v_cache) {
    core::fail(ErrorKind::unsupported, "q", "context parallelism needs q and v_cache");
  }
  const TensorView& q = *shard.call.q;
  const int64_t b = q.shape[0], s = q.shape[1], h = q.shape[2];
  const int64_t dv = shard.call.v_cache->shape[shard.call.v_cache->rank - 1];
  const int64_t w = comm.world_size();
  std::vector<float> out_partial(size_t(b * s * h * dv)), lse_partial(size_t(b * s * h));
  std::vector<float> gathered_out(size_t(w) * out_partial.size()), gathered_lse(size_t(w) * lse_partial.size());
  const TensorView out_view = TensorView::contiguous(out_partial.data(), DType::f32, {b, s, h, dv});
  const TensorView lse_view = TensorView::contiguous(lse_partial.data(), DType::f32, {b, s, h});
  attend_shard(shard, out_view, lse_view, options);
  combine_across_ranks(comm, out_view, lse_view,
                       TensorView::contiguous(gathered_out.data(), DType::f32, {w, b, s, h, dv}),
                       TensorView::contiguous(gathered_lse.data(), DType::f32, {w, b, s, h}),
                       outputs.out, outputs.softmax_lse, options);
}

}  // namespace kvflash::cp
