// The planner over a resolved Problem: the call's PlanKey, the Plan a call makes, and the checks
// that make a caller's Plan (typed, or FA3's int32 tensor) safe to use for this call.
//
// Per-batch lengths: a CPU problem's length tensors are host memory, so its vectors are computed
// from the real lengths (spec 5.1). A CUDA problem's lengths live on the device; its vectors are
// filled from the static bounds (max_seqlen_q query rows, the cache capacity in keys for every
// sequence) and the CUDA backend refreshes them on the device before the kernels run.
#include <algorithm>
#include <string>
#include <vector>

#include "core/heuristics.h"
#include "core/planner.h"
#include "kvflash/errors.h"

namespace kvflash::core {
namespace {

bool lengths_on_host(const Problem& p) { return p.device.type == DeviceType::cpu; }

std::vector<SeqLengths> sequence_lengths(const Problem& p) {
  std::vector<SeqLengths> lengths(static_cast<size_t>(std::max(p.batch, 0)));
  for (int b = 0; b < p.batch; ++b) {
    if (lengths_on_host(p)) {
      const SeqInfo s = seq_info(p, b);
      lengths[b] = {s.seqlen_q, s.seqlen_k};
    } else {
      lengths[b] = {p.seqlen_q, p.seqlen_k};
    }
  }
  return lengths;
}

[[noreturn]] void reject(const std::string& message) {
  throw Error(ErrorKind::invalid_value, "scheduler_metadata", message);
}

// A typed Plan's fields are public: a caller may have edited its static decisions. They must be
// the ones this call's key gives, since out_accum and the kernels are sized by them.
void check_static_decisions(const Plan& plan, const Plan& expected) {
  const auto same = [](const char* name, int got, int want) {
    if (got != want) {
      reject("scheduler_metadata: " + std::string(name) + " is " + std::to_string(got) +
             ", but this call's plan has " + std::to_string(want));
    }
  };
  same("block_m", plan.block_m, expected.block_m);
  same("block_n", plan.block_n, expected.block_n);
  same("num_splits", plan.num_splits, expected.num_splits);
  same("pack_gqa", plan.pack_gqa, expected.pack_gqa);
  same("is_causal", plan.is_causal, expected.is_causal);
  same("is_local", plan.is_local, expected.is_local);
  same("has_semaphore", plan.has_semaphore, expected.has_semaphore);
}

// num_m_blocks tells the kernels how many query tiles each sequence has: it must match this
// call's query lengths, or rows would be skipped or read past.
void check_m_blocks(const Plan& plan, const Problem& p) {
  const std::vector<SeqLengths> lengths = sequence_lengths(p);
  for (size_t b = 0; b < lengths.size(); ++b) {
    const int want = num_m_blocks(plan, lengths[b].seqlen_q);
    if (plan.num_m_blocks[b] != want) {
      reject("scheduler_metadata: num_m_blocks[" + std::to_string(b) + "] is " +
             std::to_string(plan.num_m_blocks[b]) + ", but sequence " + std::to_string(b) +
             " of this call has " + std::to_string(lengths[b].seqlen_q) + " query rows (" +
             std::to_string(want) + " blocks); the plan was made for other lengths");
    }
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
  raw.dtype = p.dtype;
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

void check_plan(const Plan& plan, const Problem& p) {
  if (!(plan.key == p.key)) {
    std::string field = first_difference(plan.key, p.key);
    if (field.empty()) field = "a PlanKey field";
    reject("scheduler_metadata was made for a different problem: " + field);
  }
  check_static_decisions(plan, static_plan(p.key));
  check_plan_vectors(plan);
  if (lengths_on_host(p)) check_m_blocks(plan, p);
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
  // The length this call's layout needs (spec 6.4) depends only on the key.
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
  Plan plan = Plan::from_fa3(values, expected, p.key);
  check_plan(plan, p);
  return plan;
}

}  // namespace kvflash::core
