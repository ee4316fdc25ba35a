// The CUDA backend's host half, in plain C++ (compiles without nvcc; unit-tested on CPU CI):
// what the CUDA backend supports, the workspace layout, the parameter blocks of every kernel a
// call launches, and the checks that refuse a call. backend.cu runs check_call() before its first
// kernel, so a refused call writes nothing (not even its appended K/V).
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/problem.h"
#include "cuda/common/params.h"
#include "kvflash/kvflash.h"

namespace kvflash::cuda {

// Workspace layout: [out partials | LSE partials | per-batch splits | split columns | q's copy |
// qv's copy] (QueryCopyParams: rotated, converted or scaled), 256-aligned; only the parts the
// call uses have bytes.
struct WorkspaceLayout {
  size_t out_partial = 0, lse_partial = 0, splits = 0, work = 0, q_copy = 0, qv_copy = 0, total = 0;
  int work_columns = 0;  // split columns the prepare kernel lists (core::portable_split_columns)
};
WorkspaceLayout workspace_layout(const core::Problem& p, const Plan& plan);

// Every kernel of one call, in launch order: append -> copy q -> copy qv -> prepare -> attention
// -> combine (each but the attention only when its flag is set).
struct CallParams {
  bool append = false;
  AppendParams append_params;
  int append_rows = 0;  // new rows of the longest sequence (the append grid's x bound)
  bool copy_q = false;
  QueryCopyParams q_copy;
  bool copy_qv = false;
  QueryCopyParams qv_copy;
  bool prepare = false;
  PrepareParams prepare_params;
  AttentionParams attention;
  bool combine = false;
  CombineParams combine_params;
  ElemType out_type = ElemType::bf16;
};
// `workspace`: the base of workspace_layout(p, plan).total bytes (nullptr when that is 0).
CallParams call_params(const core::Problem& p, const Plan& plan, const Outputs& outputs,
                       char* workspace);

// FA3's flash_attn_combine: (splits, b, s, h, d) | (splits, total, h, d) partials.
CombineParams combine_params(const TensorView& out_partial, const TensorView& lse_partial,
                             const TensorView& out, const OptTensor& lse);

// Whether the plan's attention kernel reads an fp8 q as e4m3 itself (FA3's all-fp8 call on the
// sm90 family's fp8 kernel): no bf16 copy then, only a rotated e4m3 one with rotary. Every other
// kernel reads a 16-bit q, an fp8 one converted to bf16 first.
bool reads_fp8_query(const core::Problem& p, const Plan& plan);

// Packed query rows one attention CTA of the plan's kernel takes.
int rows_per_cta(const Plan& plan);

// What the CUDA kernels support of a valid call (dtype, head dims, 16-byte rows).
// Throws Error(unsupported) naming the argument.
void check_supported(const core::Problem& p, const Outputs& outputs);
// Every check that can refuse a call whose parameters are built: the kernels' grid limits
// (core/limits.h). Runs before the first kernel of the call.
void check_launchable(const CallParams& call, const Plan& plan);
// The combine API's limits (head dim of the partials).
void check_combine(const CombineParams& p);

}  // namespace kvflash::cuda
