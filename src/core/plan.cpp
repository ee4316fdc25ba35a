// Plan <-> FA3's int32 scheduler_metadata layout (contract 6.4), the checks on a Plan's vectors, and
// first_difference.
//
// Indexing: a typed Plan's per-batch vectors are indexed by batch element. FA3's layout, when it
// carries the sorted order (not local), stores every vector by *sorted position*: entry i
// describes batch element batch_order[i] (that is how FA3's prepare step writes them and how its
// scheduler reads them). to_fa3 / from_fa3 convert between the two.
#include <algorithm>
#include <functional>
#include <string>
#include <vector>

#include "core/heuristics.h"
#include "kvflash/errors.h"
#include "kvflash/plan.h"

namespace kvflash {
namespace {

size_t round_up_to_4(int batch) { return (static_cast<size_t>(std::max(batch, 0)) + 3) / 4 * 4; }

bool has_order(const Plan& plan) { return !plan.is_local; }
bool has_heads_in_l2(const Plan& plan) { return plan.is_causal || plan.is_local; }

// Where each vector starts in FA3's layout.
struct Fa3Offsets {
  size_t splits = 0, m_blocks = 0, order = 0, heads_in_l2 = 0, semaphore = 0, size = 0;
};

Fa3Offsets fa3_offsets(const Plan& plan) {
  const size_t b_r = round_up_to_4(plan.key.batch);
  Fa3Offsets at;
  at.splits = 0;
  at.m_blocks = b_r;
  size_t next = 2 * b_r;
  if (has_order(plan)) {
    at.order = next;
    next += b_r;
  }
  if (has_heads_in_l2(plan)) {
    at.heads_in_l2 = next;
    next += b_r;
  }
  at.semaphore = next;
  at.size = next + (plan.has_semaphore ? 1 : 0);
  return at;
}

[[noreturn]] void bad_metadata(const std::string& message) {
  throw Error(ErrorKind::invalid_value, "scheduler_metadata", "scheduler_metadata: " + message);
}

// `where` is only evaluated on failure.
void check_range(int64_t value, int64_t lo, int64_t hi, const std::function<std::string()>& where) {
  if (value < lo || value > hi) {
    bad_metadata(where() + " is " + std::to_string(value) + ", expected a value in [" +
                 std::to_string(lo) + ", " + std::to_string(hi) + "]");
  }
}

// order[0..n) must be a permutation of [0, n).
void check_permutation(const int32_t* order, size_t n,
                       const std::function<std::string(size_t)>& where) {
  std::vector<bool> seen(n, false);
  for (size_t i = 0; i < n; ++i) {
    const int32_t b = order[i];
    if (b < 0 || static_cast<size_t>(b) >= n || seen[b]) {
      bad_metadata(where(i) + " is " + std::to_string(b) + ", expected each batch index in [0, " +
                   std::to_string(n) + ") exactly once");
    }
    seen[b] = true;
  }
}

void check_length(const std::vector<int32_t>& v, size_t expected, const char* name) {
  if (v.size() != expected) {
    bad_metadata(std::string(name) + " has " + std::to_string(v.size()) +
                 " entries, expected " + std::to_string(expected));
  }
}

// Inclusive upper bounds of the per-batch values.
struct VectorBounds {
  int max_splits, max_m_blocks, max_heads;
};
VectorBounds vector_bounds(const Plan& plan) {
  return {plan.num_splits, core::num_m_blocks(plan, plan.key.max_seqlen_q),
          std::max(core::scheduled_heads(plan), 1)};
}

}  // namespace

size_t Plan::fa3_size() const { return fa3_offsets(*this).size; }

std::vector<int32_t> Plan::to_fa3() const {
  core::check_plan_vectors(*this);
  const Fa3Offsets at = fa3_offsets(*this);
  std::vector<int32_t> out(at.size, 0);  // padding and the semaphore word are 0
  for (size_t i = 0; i < num_splits_dynamic.size(); ++i) {
    const size_t b = has_order(*this) ? static_cast<size_t>(batch_order[i]) : i;
    out[at.splits + i] = num_splits_dynamic[b];
    out[at.m_blocks + i] = num_m_blocks[b];
    if (has_order(*this)) out[at.order + i] = batch_order[i];
    if (has_heads_in_l2(*this)) out[at.heads_in_l2 + i] = num_nheads_in_l2[b];
  }
  return out;
}

Plan Plan::from_fa3(const int32_t* data, size_t size, const PlanKey& key) {
  Plan plan = core::static_plan(key);
  const Fa3Offsets at = fa3_offsets(plan);
  if (size != at.size) {
    throw Error(ErrorKind::invalid_value, "scheduler_metadata",
                "scheduler_metadata must have shape (" + std::to_string(at.size) + "), got (" +
                    std::to_string(size) + ")");
  }
  const size_t batch = static_cast<size_t>(std::max(key.batch, 0));
  const auto entry = [](size_t offset, const char* what) {
    return "scheduler_metadata[" + std::to_string(offset) + "] (" + what + ")";
  };
  if (has_order(plan)) {
    check_permutation(data + at.order, batch,
                      [&](size_t i) { return entry(at.order + i, "batch_order"); });
  }
  const VectorBounds bounds = vector_bounds(plan);
  plan.num_splits_dynamic.resize(batch);
  plan.num_m_blocks.resize(batch);
  if (has_order(plan)) plan.batch_order.assign(data + at.order, data + at.order + batch);
  if (has_heads_in_l2(plan)) plan.num_nheads_in_l2.resize(batch);
  for (size_t i = 0; i < batch; ++i) {
    check_range(data[at.splits + i], 1, bounds.max_splits,
                [&] { return entry(at.splits + i, "num_splits_dynamic"); });
    check_range(data[at.m_blocks + i], 0, bounds.max_m_blocks,
                [&] { return entry(at.m_blocks + i, "num_m_blocks"); });
    const size_t b = has_order(plan) ? static_cast<size_t>(plan.batch_order[i]) : i;
    plan.num_splits_dynamic[b] = data[at.splits + i];
    plan.num_m_blocks[b] = data[at.m_blocks + i];
    if (has_heads_in_l2(plan)) {
      check_range(data[at.heads_in_l2 + i], 1, bounds.max_heads,
                  [&] { return entry(at.heads_in_l2 + i, "num_nheads_in_l2"); });
      plan.num_nheads_in_l2[b] = data[at.heads_in_l2 + i];
    }
  }
  // The semaphore word is scratch the scheduler zeroes; any value is accepted.
  return plan;
}

namespace core {

void check_plan_vectors(const Plan& plan) {
  const size_t batch = static_cast<size_t>(std::max(plan.key.batch, 0));
  check_length(plan.num_splits_dynamic, batch, "num_splits_dynamic");
  check_length(plan.num_m_blocks, batch, "num_m_blocks");
  check_length(plan.batch_order, has_order(plan) ? batch : 0, "batch_order");
  check_length(plan.num_nheads_in_l2, has_heads_in_l2(plan) ? batch : 0, "num_nheads_in_l2");
  const auto entry = [](const char* name, size_t b) {
    return std::string(name) + "[" + std::to_string(b) + "]";
  };
  const VectorBounds bounds = vector_bounds(plan);
  for (size_t b = 0; b < batch; ++b) {
    check_range(plan.num_splits_dynamic[b], 1, bounds.max_splits,
                [&] { return entry("num_splits_dynamic", b); });
    check_range(plan.num_m_blocks[b], 0, bounds.max_m_blocks,
                [&] { return entry("num_m_blocks", b); });
    if (has_heads_in_l2(plan)) {
      check_range(plan.num_nheads_in_l2[b], 1, bounds.max_heads,
                  [&] { return entry("num_nheads_in_l2", b); });
    }
  }
  if (has_order(plan)) {
    check_permutation(plan.batch_order.data(), batch,
                      [&](size_t i) { return entry("batch_order", i); });
  }
}

}  // namespace core

namespace {

std::string show(int v) { return std::to_string(v); }
std::string show(bool v) { return v ? "true" : "false"; }
std::string show(DType v) { return dtype_name(v); }
std::string show_page_size(int v) { return v > 0 ? std::to_string(v) : "None (not paged)"; }
std::string show_knew(int v) { return v > 0 ? "> 0" : "0"; }  // the key keeps presence only
std::string show_pack_gqa(int v) { return v < 0 ? "None" : show(v > 0); }
std::string show_arch(int v) { return v == 0 ? "CPU" : "sm" + std::to_string(v); }

}  // namespace

const char* family_name(KernelFamily family) {
  switch (family) {
    case KernelFamily::cpu: return "cpu";
    case KernelFamily::sm80: return "sm80";
    case KernelFamily::sm90: return "sm90";
    case KernelFamily::sm90_mla: return "sm90_mla";
  }
  return "?";
}

const char* shape_name(KernelShape shape) {
  switch (shape) {
    case KernelShape::none: return "none";
    case KernelShape::decode_8: return "decode_8";
    case KernelShape::decode_16: return "decode_16";
    case KernelShape::prefill: return "prefill";
    case KernelShape::mla_decode: return "mla_decode";
    case KernelShape::prefill_small_tiles: return "prefill_small_tiles";
    case KernelShape::prefill_three_groups: return "prefill_three_groups";
  }
  return "?";
}

std::string first_difference(const PlanKey& plan_key, const PlanKey& call_key) {
  std::string found;
  // Records the first field (in declaration order) whose values differ.
  const auto field = [&](const char* name, const auto& a, const auto& b, auto format) {
    if (found.empty() && !(a == b)) {
      found = std::string(name) + " (plan made for " + format(a) + ", call has " + format(b) + ")";
    }
  };
  const auto plain = [](const auto& v) { return show(v); };
  const PlanKey& p = plan_key;
  const PlanKey& c = call_key;
  field("batch", p.batch, c.batch, plain);
  field("max_seqlen_q", p.max_seqlen_q, c.max_seqlen_q, plain);
  field("max_seqlen_k", p.max_seqlen_k, c.max_seqlen_k, plain);
  field("num_heads", p.num_heads, c.num_heads, plain);
  field("num_heads_k", p.num_heads_k, c.num_heads_k, plain);
  field("headdim", p.headdim, c.headdim, plain);
  field("headdim_v", p.headdim_v, c.headdim_v, plain);
  field("dtype", p.dtype, c.dtype, plain);
  field("fp8_query (q float8_e4m3fn)", p.fp8_query, c.fp8_query, plain);
  field("page_size", p.page_size, c.page_size, show_page_size);
  field("max_seqlen_k_new", p.max_seqlen_k_new, c.max_seqlen_k_new, show_knew);
  field("varlen_q (cu_seqlens_q given)", p.varlen_q, c.varlen_q, plain);
  field("has_leftpad (cache_leftpad given)", p.has_leftpad, c.has_leftpad, plain);
  field("causal", p.causal, c.causal, plain);
  field("window_left", p.window_left, c.window_left, plain);
  field("window_right", p.window_right, c.window_right, plain);
  field("attention_chunk", p.attention_chunk, c.attention_chunk, plain);
  field("has_softcap", p.has_softcap, c.has_softcap, plain);
  field("has_qv", p.has_qv, c.has_qv, plain);
  field("num_splits", p.num_splits, c.num_splits, plain);
  field("pack_gqa", p.pack_gqa, c.pack_gqa, show_pack_gqa);
  field("sm_margin", p.sm_margin, c.sm_margin, plain);
  field("num_sms", p.num_sms, c.num_sms, plain);
  field("arch", p.arch, c.arch, show_arch);
  field("batch_invariant", p.batch_invariant, c.batch_invariant, plain);
  return found;
}

}  // namespace kvflash
