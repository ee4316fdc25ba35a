// kvflash: FA3's flash_attn_with_kvcache contract as a C++ library.
//
//   KvCacheArgs args;  args.q = ...; args.k_cache = ...; args.v_cache = ...; args.cache_seqlens = ...;
//   OutputSpec spec = kvflash::output_spec(args);     // shapes of out / softmax_lse
//   Outputs outs{out_view, lse_view};
//   kvflash::flash_attn_with_kvcache(args, outs);      // validates, plans, appends, attends
//
// Every entry point validates everything first and throws kvflash::Error; a rejected call
// writes nothing (the cache is untouched).
#pragma once

#include <cstddef>
#include <memory>
#include <optional>

#include "kvflash/args.h"
#include "kvflash/errors.h"
#include "kvflash/plan.h"
#include "kvflash/tensor.h"

namespace kvflash {

struct Workspace {
  void* data = nullptr;  // on the device of q; nullptr: the call allocates what it needs
  size_t bytes = 0;
};

struct RunOptions {
  void* stream = nullptr;  // cudaStream_t for CUDA tensors; ignored on the CPU
  Workspace workspace;
  int num_threads = 0;     // CPU backend: 0 = all hardware threads
};

// FA3's get_scheduler_metadata arguments (upstream names and defaults).
struct SchedulerArgs {
  int batch_size = 0;
  int max_seqlen_q = 0;
  int max_seqlen_k = 0;
  int num_heads_q = 0;
  int num_heads_kv = 0;
  int headdim = 0;
  OptTensor cache_seqlens;  // (b,) int32; host-readable for a host-made Plan
  DType qkv_dtype = DType::bf16;
  std::optional<int> headdim_v;
  OptTensor cu_seqlens_q;
  OptTensor cu_seqlens_k_new;
  OptTensor cache_leftpad;
  std::optional<int> page_size;
  int max_seqlen_k_new = 0;
  bool causal = false;
  int window_left = -1;
  int window_right = -1;
  int attention_chunk = 0;
  bool has_softcap = false;
  int num_splits = 0;
  std::optional<bool> pack_gqa;
  int sm_margin = 0;
  bool has_qv = false;
  bool batch_invariant = false;  // KvCacheArgs::batch_invariant of the calls the plan serves
  // The device the plan targets: {cpu} plans for the CPU backend; a CUDA device plans for it.
  Device device{};
};

// Everything the call would check, without running it. Throws Error.
void validate(const KvCacheArgs& args);

// Output shapes for this call (with `plan`, or the plan the call would make).
OutputSpec output_spec(const KvCacheArgs& args, const Plan* plan = nullptr);

// The Plan flash_attn_with_kvcache would make for these arguments (host-side).
Plan make_plan(const KvCacheArgs& args);

// FA3's get_scheduler_metadata: a Plan made before the call, reusable across layers.
Plan get_scheduler_metadata(const SchedulerArgs& args);

// Bytes of scratch the call needs (split-KV partials, ...) for this plan.
size_t workspace_size(const KvCacheArgs& args, const Plan& plan);

// The call: append k / v (with rotary) into the cache, attend, combine split partials.
void flash_attn_with_kvcache(const KvCacheArgs& args, const Outputs& outputs,
                             const RunOptions& options = {});

// A call validated, resolved and planned once, for callers that allocate its outputs after
// learning their shapes (the Python binding asks the caller's framework for them): the checks and
// the plan are not redone for each question. flash_attn_with_kvcache(args, outputs, options) is
// PreparedCall(args).run(outputs, options). Throws Error as the call would.
class PreparedCall {
 public:
  explicit PreparedCall(const KvCacheArgs& args);
  ~PreparedCall();
  PreparedCall(PreparedCall&&) noexcept;
  PreparedCall& operator=(PreparedCall&&) noexcept;

  const OutputSpec& output_spec() const;
  const Plan& plan() const;
  size_t workspace_size() const;
  // The call; the tensors and the Plan given to the constructor must still be alive.
  void run(const Outputs& outputs, const RunOptions& options = {}) const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// FA3's flash_attn_combine: out_partial (num_splits, b, s, h, d) float32 and lse_partial
// (num_splits, b, s, h) float32 into out (b, s, h, d) and lse (b, s, h) (rank-4/3 forms, or the
// varlen forms without b). Splits with LSE -inf contribute nothing.
void combine(const TensorView& out_partial, const TensorView& lse_partial, const TensorView& out,
             const OptTensor& lse = std::nullopt, const RunOptions& options = {});

// What was built in: "cpu", "cpu,cuda".
const char* build_backends();
// True when a CUDA backend is built and a device is visible.
bool cuda_available();

}  // namespace kvflash
