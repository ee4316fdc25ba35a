// The CPU backend: append, attend (split partials when planned), combine. Partials go to the
// caller's out_accum / softmax_lse_accum when given, else to the workspace.
#include <omp.h>

#include <vector>

#include "core/backend.h"
#include "cpu/kernels.h"
#include "kvflash/errors.h"

namespace kvflash::cpu {
namespace {

constexpr size_t kAlign = 64;

size_t align_up(size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

int thread_count(const RunOptions& options) {
  return options.num_threads > 0 ? options.num_threads : omp_get_max_threads();
}

// FA3's partial shapes for this problem: (splits, b, h, s_q[, d_v]) or (splits, h, total_q[, d_v]).
TensorView contiguous_partials(float* data, const core::Problem& p, int splits, bool with_dim) {
  const int64_t dv = p.headdim_v;
  if (p.varlen_q) {
    return with_dim ? TensorView::contiguous(data, DType::f32, {splits, p.num_heads, p.total_q, dv})
                    : TensorView::contiguous(data, DType::f32, {splits, p.num_heads, p.total_q});
  }
  return with_dim ? TensorView::contiguous(data, DType::f32, {splits, p.batch, p.num_heads, p.seqlen_q, dv})
                  : TensorView::contiguous(data, DType::f32, {splits, p.batch, p.num_heads, p.seqlen_q});
}

size_t partial_out_bytes(const core::Problem& p, int splits) {
  return align_up(size_t(splits) * size_t(p.num_heads) * size_t(p.total_q) * size_t(p.headdim_v) * sizeof(float));
}
size_t partial_lse_bytes(const core::Problem& p, int splits) {
  return align_up(size_t(splits) * size_t(p.num_heads) * size_t(p.total_q) * sizeof(float));
}

class CpuBackend final : public core::Backend {
 public:
  const char* name() const override { return "cpu"; }

  size_t workspace_size(const core::Problem& p, const Plan& plan) const override {
    if (plan.num_splits <= 1) return 0;
    // Dense q: total_q == b * s_q, so the varlen count covers both layouts.
    return partial_out_bytes(p, plan.num_splits) + partial_lse_bytes(p, plan.num_splits);
  }

  void run(const core::Problem& p, const Plan& plan, const Outputs& outputs,
           const RunOptions& options) override {
    const int threads = thread_count(options);
    append_kv(p, threads);
    if (p.total_q == 0 || p.num_heads == 0) return;
    if (plan.num_splits <= 1) {
      attend(p, plan, outputs, nullptr, threads);
      return;
    }
    std::vector<unsigned char> owned;
    const Partials partials = partials_for(p, plan, outputs, options, owned);
    attend(p, plan, outputs, &partials, threads);
    combine_split_partials(p, plan, outputs, partials, threads);
  }

  void combine(const TensorView& out_partial, const TensorView& lse_partial, const TensorView& out,
               const OptTensor& lse, const RunOptions& options) override {
    combine_tensors(out_partial, lse_partial, out, lse, thread_count(options));
  }

 private:
  // The caller's out_accum / softmax_lse_accum when both are given, else views of the
  // workspace (the caller's, or `owned` allocated here).
  Partials partials_for(const core::Problem& p, const Plan& plan, const Outputs& outputs,
                        const RunOptions& options, std::vector<unsigned char>& owned) const {
    if (outputs.out_accum && outputs.softmax_lse_accum) return {*outputs.out_accum, *outputs.softmax_lse_accum};
    const size_t needed = workspace_size(p, plan);
    auto* base = static_cast<unsigned char*>(options.workspace.data);
    if (base && options.workspace.bytes < needed) {
      throw Error(ErrorKind::invalid_value, "workspace",
                  "workspace must hold at least " + std::to_string(needed) + " bytes, got " +
                      std::to_string(options.workspace.bytes));
    }
    if (!base) {
      owned.resize(needed + kAlign);
      base = owned.data();
      base += (kAlign - reinterpret_cast<uintptr_t>(base) % kAlign) % kAlign;
    }
    float* out = reinterpret_cast<float*>(base);
    float* lse = reinterpret_cast<float*>(base + partial_out_bytes(p, plan.num_splits));
    return {contiguous_partials(out, p, plan.num_splits, true), contiguous_partials(lse, p, plan.num_splits, false)};
  }
};

}  // namespace
}  // namespace kvflash::cpu

namespace kvflash::core {

Backend& cpu_backend() {
  static cpu::CpuBackend backend;
  return backend;
}

}  // namespace kvflash::core
