// The public entry points of kvflash.h: each validates everything, resolves the Problem, checks
// the index values it can read, picks the Plan and the outputs, and only then lets a backend
// write. get_scheduler_metadata lives with the planner.
#include <algorithm>
#include <initializer_list>
#include <span>
#include <string>
#include <vector>

#include "core/backend.h"
#include "core/limits.h"
#include "core/planner.h"
#include "core/validate.h"
#include "kvflash/kvflash.h"

namespace kvflash {
namespace {

using core::Backend;
using core::Problem;
using std::to_string;

// Host copies of a device's index tensors, for checked mode.
class HostCopies {
 public:
  HostCopies(const Problem& p, const Backend& backend) : backend_(backend) {
    const KvCacheArgs& a = p.args;
    indices_.cache_seqlens = copy(a.cache_seqlens);
    indices_.cache_batch_idx = copy(a.cache_batch_idx);
    indices_.cache_leftpad = copy(a.cache_leftpad);
    indices_.cu_seqlens_q = copy(a.cu_seqlens_q);
    indices_.cu_seqlens_k_new = copy(a.cu_seqlens_k_new);
    indices_.rotary_seqlens = copy(a.rotary_seqlens);
    indices_.page_table = copy(a.page_table);
    indices_.page_table_row_stride = a.page_table ? a.page_table->stride(0) : 0;
  }
  const core::HostIndices& indices() const { return indices_; }

 private:
  // The elements a tensor spans: its 1-D length, or the strided rows of page_table.
  const int32_t* copy(const OptTensor& t) {
    if (!t || t->numel() == 0) return nullptr;
    int64_t span = 1;
    for (int i = 0; i < t->rank; ++i) span += (t->size(i) - 1) * t->stride(i);
    std::vector<int32_t>& host = buffers_.emplace_back(static_cast<size_t>(span));
    backend_.copy_to_host(host.data(), t->data, host.size() * sizeof(int32_t));
    return host.data();
  }

  const Backend& backend_;
  std::vector<std::vector<int32_t>> buffers_;
  core::HostIndices indices_;
};

// validate -> resolve -> the value checks this call can make (host tensors always, device
// tensors in checked mode). Every entry point starts here.
Problem prepare(const KvCacheArgs& args) {
  validate(args);
  Problem p = core::resolve(args);
  if (core::indices_on_host(p)) {
    core::check_values(p, core::host_indices(p));
  } else if (core::checked_mode(args)) {
    HostCopies copies(p, core::backend_for(p.device));
    core::check_values(p, copies.indices());
  }
  return p;
}

// The caller's Plan, or FA3's int32 metadata, or a fresh plan.
Plan plan_for(const Problem& p) {
  if (p.args.plan) return core::accept_plan(*p.args.plan, p);
  if (!p.args.scheduler_metadata) return core::make_plan(p);
  const TensorView& metadata = *p.args.scheduler_metadata;
  Plan plan = core::plan_from_metadata(metadata, p);  // dtype, device, length (+ entries on the host)
  if (metadata.device.type == DeviceType::cpu || !core::checked_mode(p.args)) return plan;
  // Checked mode reads device-resident metadata back and verifies every entry.
  std::vector<int32_t> values(size_t(metadata.shape[0]));
  core::backend_for(p.device).copy_to_host(values.data(), metadata.data, values.size() * sizeof(int32_t));
  return core::plan_from_metadata(metadata, p, values.data());
}

TensorSpec tensor_spec(DType dtype, std::initializer_list<int64_t> shape) {
  TensorSpec spec;
  spec.dtype = dtype;
  spec.rank = static_cast<int>(shape.size());
  std::copy(shape.begin(), shape.end(), spec.shape);
  return spec;
}

OutputSpec spec_for(const Problem& p, int num_splits) {
  const int64_t b = p.batch, h = p.num_heads, s = p.seqlen_q, t = p.total_q, dv = p.headdim_v;
  OutputSpec spec;
  spec.num_splits = num_splits;
  spec.out =
      p.varlen_q ? tensor_spec(p.out_dtype, {t, h, dv}) : tensor_spec(p.out_dtype, {b, s, h, dv});
  spec.softmax_lse =
      p.varlen_q ? tensor_spec(DType::f32, {h, t}) : tensor_spec(DType::f32, {b, h, s});
  if (num_splits > 1) {
    const int64_t n = num_splits;
    spec.out_accum = p.varlen_q ? tensor_spec(DType::f32, {n, h, t, dv})
                                : tensor_spec(DType::f32, {n, b, h, s, dv});
    spec.softmax_lse_accum =
        p.varlen_q ? tensor_spec(DType::f32, {n, h, t}) : tensor_spec(DType::f32, {n, b, h, s});
  }
  return spec;
}

std::span<const int64_t> dims(const TensorSpec& spec) { return {spec.shape, size_t(spec.rank)}; }

// The messages are made only when a check fails (this runs on every call that returns the LSE).
void check_output(const TensorView& t, const char* name, const TensorSpec& spec, const char* layout,
                  Device device) {
  core::require_well_formed(t, name);
  core::require_device(t, name, device);
  if (t.dtype != spec.dtype) {
    core::require_dtype(t, name, spec.dtype, std::string(name) + " must have dtype " + dtype_name(spec.dtype));
  }
  if (!core::has_shape(t, dims(spec))) {
    core::require_shape(t, name, dims(spec), std::string(name) + " must have shape " + layout);
  }
}

// The outputs the backend may write: every given tensor checked against `spec` (spec_for's, for
// the plan's splits); split partials kept only when the plan splits.
Outputs checked_outputs(const Problem& p, const Outputs& o, const OutputSpec& spec) {
  const int num_splits = spec.num_splits;
  const TensorView& out = o.out;
  core::require_well_formed(out, "out");
  core::require_device(out, "out", p.device);
  core::require_dtype(out, "out", p.out_dtype,
                      "For FP16/BF16 input, output must have the same dtype as inputs. For FP8 "
                      "input, output must have dtype BF16");
  core::require_shape(out, "out", dims(spec.out),
                      p.varlen_q
                          ? "out must have shape (total_q, num_heads, headdim_v)"
                          : "out must have shape (batch_size, seqlen_q, num_heads, headdim_v)");
  core::require_last_dim_contiguous(out, "out",
                                    "Output tensor must have contiguous last dimension");
  if (o.softmax_lse) {
    check_output(*o.softmax_lse, "softmax_lse", spec.softmax_lse,
                 p.varlen_q ? "(num_heads, total_q)" : "(batch_size, num_heads, seqlen_q)",
                 p.device);
  }
  if (o.out_accum.has_value() != o.softmax_lse_accum.has_value()) {
    core::fail(ErrorKind::invalid_value, o.out_accum ? "softmax_lse_accum" : "out_accum",
               std::string("out_accum and softmax_lse_accum must be given together (") +
                   (o.out_accum ? "softmax_lse_accum" : "out_accum") + " is missing)");
  }
  Outputs checked = o;
  if (num_splits <= 1) {
    // No partials to keep: FA3 returns empty tensors here; given ones are left alone.
    checked.out_accum.reset();
    checked.softmax_lse_accum.reset();
  } else if (o.out_accum) {
    check_output(*o.out_accum, "out_accum", spec.out_accum,
                 p.varlen_q ? "(num_splits, num_heads, total_q, headdim_v)"
                            : "(num_splits, batch_size, num_heads, seqlen_q, headdim_v)",
                 p.device);
    check_output(*o.softmax_lse_accum, "softmax_lse_accum", spec.softmax_lse_accum,
                 p.varlen_q ? "(num_splits, num_heads, total_q)"
                            : "(num_splits, batch_size, num_heads, seqlen_q)",
                 p.device);
  }
  core::check_no_aliasing(p.args, &checked);
  return checked;
}

void check_workspace(const Workspace& workspace, size_t needed) {
  if (workspace.data != nullptr && workspace.bytes < needed) {
    core::fail(ErrorKind::invalid_value, "workspace",
               "workspace is too small (needs " + to_string(needed) + " bytes, got " +
                   to_string(workspace.bytes) + "; see workspace_size())");
  }
}

// flash_attn_combine's shapes: out_partial (splits, [b,] s, h, d), lse_partial (splits, [b,] s, h).
void check_combine(const TensorView& out_partial, const TensorView& lse_partial,
                   const TensorView& out, const OptTensor& lse) {
  core::require_well_formed(out_partial, "out_partial");
  core::require_well_formed(lse_partial, "lse_partial");
  core::require_well_formed(out, "out");
  if (lse) core::require_well_formed(*lse, "lse");
  const Device device = out_partial.device;
  core::require_device(lse_partial, "lse_partial", device, "out_partial");
  core::require_device(out, "out", device, "out_partial");
  if (lse) core::require_device(*lse, "lse", device, "out_partial");
  core::require_dtype(out_partial, "out_partial", DType::f32,
                      "out_partial must have dtype float32");
  core::require_dtype(lse_partial, "lse_partial", DType::f32,
                      "lse_partial must have dtype float32");
  if (out_partial.rank != 4 && out_partial.rank != 5) {
    core::fail(ErrorKind::invalid_value, "out_partial",
               "out_partial must have rank 5 (num_splits, b, s, h, d) or 4 (num_splits, "
               "total, h, d) (got shape " +
                   out_partial.shape_string() + ")");
  }
  core::require_last_dim_contiguous(out_partial, "out_partial",
                                    "out_partial must have contiguous last dimension");
  const std::vector<int64_t> partial(out_partial.shape, out_partial.shape + out_partial.rank);
  core::require_shape(lse_partial, "lse_partial", {partial.begin(), partial.end() - 1},
                      "lse_partial must have out_partial's shape without the head dimension");
  const int64_t num_splits = partial[0];
  if (num_splits > core::kMaxSplits) {
    core::fail(ErrorKind::invalid_value, "out_partial",
               "FlashAttention combine only supports num_splits at most 256 (got " +
                   to_string(num_splits) + ")");
  }
  if (num_splits < 1) {
    core::fail(
        ErrorKind::invalid_value, "out_partial",
        "out_partial must hold at least one split (got shape " + out_partial.shape_string() + ")");
  }
  if (out.dtype != DType::f32 && out.dtype != DType::f16 && out.dtype != DType::bf16) {
    core::fail(
        ErrorKind::invalid_type, "out",
        std::string("Output type must be FP32, FP16 or BF16 (got ") + dtype_name(out.dtype) + ")");
  }
  core::require_shape(out, "out", {partial.begin() + 1, partial.end()},
                      "out must have out_partial's shape without the split dimension");
  core::require_last_dim_contiguous(out, "out",
                                    "Output tensor must have contiguous last dimension");
  if (lse) {
    core::require_dtype(*lse, "lse", DType::f32, "lse must have dtype float32");
    core::require_shape(*lse, "lse", {partial.begin() + 1, partial.end() - 1},
                        "lse must have lse_partial's shape without the split dimension");
  }
}

}  // namespace

OutputSpec output_spec(const KvCacheArgs& args, const Plan* plan) {
  const Problem p = prepare(args);
  return spec_for(p, plan ? core::accept_plan(*plan, p).num_splits : plan_for(p).num_splits);
}

Plan make_plan(const KvCacheArgs& args) { return core::make_plan(prepare(args)); }

size_t workspace_size(const KvCacheArgs& args, const Plan& plan) {
  const Problem p = prepare(args);
  return core::backend_for(p.device).workspace_size(p, core::accept_plan(plan, p));
}

struct PreparedCall::State {
  Problem problem;
  Backend& backend;
  Plan plan;
  OutputSpec spec;
};

PreparedCall::PreparedCall(const KvCacheArgs& args) {
  Problem p = prepare(args);
  Backend& backend = core::backend_for(p.device);
  Plan plan = plan_for(p);
  const OutputSpec spec = spec_for(p, plan.num_splits);
  state_.reset(new State{std::move(p), backend, std::move(plan), spec});
}

PreparedCall::~PreparedCall() = default;
PreparedCall::PreparedCall(PreparedCall&&) noexcept = default;
PreparedCall& PreparedCall::operator=(PreparedCall&&) noexcept = default;

const OutputSpec& PreparedCall::output_spec() const { return state_->spec; }
const Plan& PreparedCall::plan() const { return state_->plan; }

size_t PreparedCall::workspace_size() const {
  return state_->backend.workspace_size(state_->problem, state_->plan);
}

void PreparedCall::run(const Outputs& outputs, const RunOptions& options) const {
  const Problem& p = state_->problem;
  const Plan& plan = state_->plan;
  const Outputs checked = checked_outputs(p, outputs, state_->spec);  // made once, by the constructor
  // A given workspace, also with one split or the caller's partials: the CUDA backend keeps the
  // per-batch splits and the query copies (rotated, converted or scaled q / qv) there too. Without
  // one nothing is sized here (the backend takes its own scratch): no layout on that hot path.
  if (options.workspace.data != nullptr) check_workspace(options.workspace, workspace_size());
  state_->backend.run(p, plan, checked, options);
}

void flash_attn_with_kvcache(const KvCacheArgs& args, const Outputs& outputs,
                             const RunOptions& options) {
  PreparedCall(args).run(outputs, options);
}

void combine(const TensorView& out_partial, const TensorView& lse_partial, const TensorView& out,
             const OptTensor& lse, const RunOptions& options) {
  check_combine(out_partial, lse_partial, out, lse);
  core::backend_for(out_partial.device).combine(out_partial, lse_partial, out, lse, options);
}

const char* build_backends() { return core::cuda_backend() ? "cpu,cuda" : "cpu"; }

}  // namespace kvflash
