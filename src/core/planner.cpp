// The planner over a resolved Problem: the call's PlanKey, the Plan a call makes, and the checks
// that make a caller's Plan (typed, or FA3's int32 tensor) safe to use for this call.
//
// Per-batch lengths: a CPU problem's length tensors are host memory, so its vectors are computed
// from the real lengths (contract 5.1). A CUDA problem's lengths live on the device; its vectors are
// filled from the static bounds (max_seqlen_q query rows, the cache capacity in keys for every
// sequence) and the CUDA backend refreshes them on the device before the kernels run.
#include <algorithm>
#include <array>
#include <string>
#include <vector>

#include "core/heuristics.h"
#include "core/planner.h"
#include "core/validate.h"
#include "kvflash/errors.h"

namespace kvflash::core {
namespace {

bool lengths_on_host(const Problem& p) { return p.device.type == DeviceType::cpu; }

std::vector<SeqLengths> sequence_lengths(const Problem& p) {
  std::vector<SeqLengths> lengths(static_cast<size_t>(std::max(p.batch, 0)), SeqLengths{p.seqlen_q, p.seqlen_k});
  if (!lengths_on_host(p)) return lengths;
  const HostIndices host = host_indices(p);  // once, not per sequence
  for (int b = 0; b < p.batch; ++b) {
    const SeqInfo s = seq_info(p, host, b);
    lengths[b] = {s.seqlen_q, s.seqlen_k};
  }
  return lengths;
}

[[noreturn]] void reject(const std::string& message) {
  throw Error(ErrorKind::invalid_value, "scheduler_metadata", message);
}

// The static decisions of a Plan, named, in the order a refusal reports them.
struct Decision {
  const char* name;
  int plan_value, call_value;
};
std::array<Decision, 7> decisions(const Plan& given, const Plan& own) {
  return {{{"block_m", given.block_m, own.block_m},
          {"block_n", given.block_n, own.block_n},
          {"num_splits", given.num_splits, own.num_splits},
          {"pack_gqa", given.pack_gqa, own.pack_gqa},
          {"is_causal", given.is_causal, own.is_causal},
          {"is_local", given.is_local, own.is_local},
          {"has_semaphore", given.has_semaphore, own.has_semaphore}}};
}

// The given plan's static decisions must be the ones this call makes itself: out_accum, the
// tiles and FA3's layout are sized by them. A difference is reported through the first PlanKey
// field that differs (the cause), or, when the keys agree, as an edited decision.
void check_static_decisions(const Plan& given, const Plan& own) {
  for (const Decision& d : decisions(given, own)) {
    if (d.plan_value == d.call_value) continue;
    const std::string field = first_difference(given.key, own.key);
    const std::string values = " (the plan's " + std::to_string(d.plan_value) +
                               ", this call's " + std::to_string(d.call_value) + ")";
    if (field.empty()) {
      reject("scheduler_metadata: " + std::string(d.name) + " is " +
             std::to_string(d.plan_value) + ", but this call's plan has " +
             std::to_string(d.call_value));
    }
    reject("scheduler_metadata was made for a different problem: " + field + ", which changes " +
           d.name + values);
  }
}

}  // namespace

PlanKey plan_key(const Problem& p, const DeviceInfo& info) {
  PlanKey raw;
  raw.batch = p.batch;
  raw.max_seqlen_q = p.seqlen_q;
  raw.max_seqlen_k = p.seqlen_k;
  raw.num_heads = p.num_heads;
  raw.num_heads_k = p.num_heads_k;
  raw.headdim = p.headdim;
  raw.headdim_v = p.headdim_v;
  // The KV cache's dtype decides the kernels: a 16-bit query over an fp8 cache plans as fp8 (the
  // sm80 family on every GPU, core/kernel_family.h; 1-byte K/V in the split heuristics).
  raw.dtype = p.fp8_cache ? DType::e4m3 : p.dtype;
  raw.fp8_query = p.fp8;  // FA3's all-fp8 call, which the sm90 family takes when opted in
  raw.page_size = p.paged ? p.page_size : 0;
  raw.max_seqlen_k_new = p.has_knew ? 1 : 0;
  raw.varlen_q = p.varlen_q;
  raw.has_leftpad = p.args.cache_leftpad.has_value();
  // The caller's mask arguments, before normalisation (see PlanKey).
  raw.causal = p.args.causal;
  raw.window_left = p.args.window_left;
  raw.window_right = p.args.window_right;
  raw.attention_chunk = p.args.attention_chunk;
  raw.has_softcap = p.softcap > 0.0f;
  raw.has_qv = p.has_qv;
  raw.num_splits = p.args.num_splits;
  raw.pack_gqa = p.args.pack_gqa ? (*p.args.pack_gqa ? 1 : 0) : -1;
  raw.sm_margin = p.args.sm_margin;
  raw.batch_invariant = p.args.batch_invariant;
  return canonical_key(raw, info);
}

Plan make_plan(const Problem& p) {
  Plan plan = static_plan(p.key);
  plan_batches(plan, sequence_lengths(p));
  return plan;
}

// The compatibility rule (python/README.md, "Scheduler metadata"): per PlanKey field,
//
//   batch                        equal: the per-sequence vectors and FA3's layout are per sequence
//   every other field            compatible: any value whose static decisions (block_m, block_n,
//     (max_seqlen_q/_k, heads,     num_splits, pack_gqa, is_causal, is_local, has_semaphore) are
//     head dims, dtype, paging,    the ones this call makes itself. These fields only feed those
//     max_seqlen_k_new, varlen,    decisions (spec 6); equal decisions mean equal kernels, tiles,
//     leftpad, mask, softcap, qv,  out_accum and layout.
//     requests, sm_margin, device)
//   per-sequence vectors         bounded: each entry in range for the plan (splits in
//                                [1, num_splits], m blocks within max_seqlen_q's, a permutation,
//                                heads in L2 within the heads), so that nothing is out of bounds;
//                                the values run are this call's own (recomputed from its lengths
//                                here, or on the device by the CUDA backend).
//
// Hence an accepted plan gives exactly the result of planning the call itself (same splits per
// sequence, same output), and a refusal names the field that would change it.
Plan accept_plan(const Plan& plan, const Problem& p) {
  if (plan.key.batch != p.key.batch) {
    // batch is PlanKey's first field: the difference names it.
    reject("scheduler_metadata was made for a different problem: " +
           first_difference(plan.key, p.key));
  }
  Plan own = make_plan(p);
  check_static_decisions(plan, own);
  check_plan_vectors(plan);
  return own;
}

Plan plan_from_metadata(const TensorView& metadata, const Problem& p, const int32_t* values) {
  const char* name = "scheduler_metadata";
  if (metadata.dtype != DType::i32) {
    throw Error(ErrorKind::invalid_type, name,
                std::string("scheduler_metadata must have dtype int32, got ") +
                    dtype_name(metadata.dtype));
  }
  if (!(metadata.device == p.device)) {
    throw Error(ErrorKind::invalid_type, name,
                "scheduler_metadata must be on " + device_name(p.device) + " (q's device), got " +
                    device_name(metadata.device));
  }
  // The length this call's layout needs (contract 6.4) depends only on the key.
  const size_t expected = static_plan(p.key).fa3_size();
  if (metadata.rank != 1 || metadata.shape[0] != static_cast<int64_t>(expected)) {
    throw Error(ErrorKind::invalid_value, name,
                "scheduler_metadata must have shape (" + std::to_string(expected) + "), got " +
                    (metadata.rank == 1 ? "(" + std::to_string(metadata.shape[0]) + ")"
                                        : metadata.shape_string()));
  }
  if (!metadata.is_contiguous()) {
    throw Error(ErrorKind::invalid_value, name, "scheduler_metadata must be contiguous");
  }
  if (!values) return make_plan(p);
  // The entries are checked (a malformed tensor is refused); the call then runs with its own
  // per-sequence vectors, as with a typed plan (accept_plan).
  Plan::from_fa3(values, expected, p.key);
  return make_plan(p);
}

}  // namespace kvflash::core
