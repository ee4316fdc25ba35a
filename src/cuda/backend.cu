// The CUDA backend: turns a resolved Problem and its Plan into kernel parameters and enqueues
// append -> (copy q / qv) -> (prepare splits) -> attention -> (combine) on the caller's stream. With a
// workspace given it allocates nothing and never synchronises, so a call can be captured in a
// CUDA graph; without one it takes stream-ordered scratch (cudaMallocAsync / cudaFreeAsync).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <type_traits>

#include "core/backend.h"
#include "core/planner.h"
#include "cuda/common/fp8.cuh"
#include "cuda/common/per_device.h"
#include "cuda/host/call_params.h"
#include "cuda/ops/kernels.h"
#include "cuda/sm80/launch.h"
#include "cuda/sm90/launch.h"
#include "cuda/sm90_mla/launch.h"

namespace kvflash {
namespace cuda {
namespace {

void check_cuda(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    throw Error(ErrorKind::device_failure, "",
                std::string("CUDA error in ") + what + ": " + cudaGetErrorString(status));
  }
}

// The current device made `device`; cudaSetDevice only when it is another (it costs host time on
// every call, and engines call from the thread whose device is already the tensors').
void use_device(int device) {
  int current = -1;
  if (cudaGetDevice(&current) == cudaSuccess && current == device) return;
  check_cuda(cudaSetDevice(device), "cudaSetDevice");
}

// Programmatic dependent launch (launch.cuh) needs sm_90+: from Hopper on, the attention and
// combine kernels overlap their launch with the kernel before them.
bool has_programmatic_launch(int device) { return core::cuda_device_info(device).arch >= 90; }

// The attention launchers the build holds: the rows of the instantiation table CMake generated
// units for (kvflash_inst/built_instantiations.inc; a KVFLASH_CUDA_MINIMAL build holds one).
using AttentionLauncher = void (*)(const AttentionParams&, KernelShape, bool, cudaStream_t);
// What a row's kernels read: the query's type (16 bits, bf16 for an fp8 q converted first; e4m3
// on the sm90 fp8 rows, which read an fp8 q itself) and whether the cache is fp8 e4m3.
struct RowType {
  DType query;
  bool fp8_cache;
  bool operator==(const RowType&) const = default;
};
template <class Row>
constexpr RowType row_type = {std::is_same_v<Row, __half> ? DType::f16 : DType::bf16, false};
template <class Q>
constexpr RowType row_type<E4m3Cache<Q>> = {row_type<Q>.query, true};
template <>
constexpr RowType row_type<__nv_fp8_e4m3> = {DType::e4m3, true};  // FA3's all-fp8 call (sm90 rows)
struct BuiltInstantiation {
  KernelFamily family;
  RowType row;
  int headdim, headdim_v;
  AttentionLauncher launch;
};
using bf16 = __nv_bfloat16;
using f16 = __half;
using bf16_e4m3 = E4m3Cache<bf16>;
using f16_e4m3 = E4m3Cache<f16>;
#define KVFLASH_INSTANTIATION(family, dtype, d, dv) \
  {KernelFamily::family, row_type<dtype>, d, dv, &launch_##family##_attention<dtype, d, dv>},
constexpr BuiltInstantiation kBuilt[] = {
#include "built_instantiations.inc"
};
#undef KVFLASH_INSTANTIATION

RowType call_row_type(const core::Problem& p, const Plan& plan) {
  if (reads_fp8_query(p, plan)) return {DType::e4m3, true};
  return {p.fp8 ? DType::bf16 : p.dtype, p.fp8_cache};
}

// The launcher of the Plan's kernel: exactly what the planner chose, never a substitute.
AttentionLauncher attention_launcher(const Plan& plan, RowType type) {
  for (const BuiltInstantiation& row : kBuilt) {
    if (row.family == plan.kernel.family && row.row == type && row.headdim == plan.kernel.headdim &&
        row.headdim_v == plan.kernel.headdim_v) {
      return row.launch;
    }
  }
  throw Error(ErrorKind::unsupported, "q",
              std::string("the ") + family_name(plan.kernel.family) + " kernel for " + dtype_name(type.query) +
                  (type.fp8_cache ? " over an fp8 cache" : "") + ", head dims " +
                  std::to_string(plan.kernel.headdim) + " / " +
                  std::to_string(plan.kernel.headdim_v) + " is not in this build (KVFLASH_CUDA_MINIMAL?)");
}

// q or qv (of type Src) into the workspace copy the attention reads: rotated or scaled in its own
// type, or an fp8 q the plan's kernel reads in 16 bits converted to bf16 (rotated first when
// rotary is on).
template <class Src>
void launch_q_copy(const core::Problem& p, const Plan& plan, const QueryCopyParams& params, cudaStream_t stream) {
  if constexpr (std::is_same_v<Src, e4m3>) {
    if (!reads_fp8_query(p, plan)) return launch_query_copy<e4m3, __nv_bfloat16>(params, stream);
  }
  launch_query_copy<Src, Src>(params, stream);
}

// Every check that can refuse the call first, then the kernels: a refused call writes nothing.
// Src: q's and new K/V's element, Cache: the caches'. The attention reads q as Src (from the
// workspace when rotated or scaled), or an fp8 q as bf16 converted there (launch_q_copy); qv from
// its scaled copy over an fp8 cache.
template <class Src, class Cache>
void run_typed(const core::Problem& p, const Plan& plan, const CallParams& call, cudaStream_t stream) {
  const AttentionLauncher launch_attention = attention_launcher(plan, call_row_type(p, plan));
  check_launchable(call, plan);
  if (call.append) launch_append_kv<Src, Cache>(call.append_params, call.append_rows, stream);
  if (call.copy_q) launch_q_copy<Src>(p, plan, call.q_copy, stream);
  if (call.copy_qv) launch_q_copy<Src>(p, plan, call.qv_copy, stream);
  if (call.prepare) launch_prepare(call.prepare_params, stream);
  const bool overlap = has_programmatic_launch(p.device.id);  // common/launch.cuh
  launch_attention(call.attention, plan.kernel.shape, overlap, stream);
  if (call.combine) launch_combine(call.combine_params, call.out_type, overlap, stream);
  check_cuda(cudaGetLastError(), "kernel launch");
}

class CudaBackend final : public core::Backend {
 public:
  const char* name() const override { return "cuda"; }

  size_t workspace_size(const core::Problem& p, const Plan& plan) const override {
    return workspace_layout(p, plan).total;
  }

  void copy_to_host(void* host, const void* device_data, size_t bytes) const override {
    check_cuda(cudaMemcpy(host, device_data, bytes, cudaMemcpyDeviceToHost), "checked-mode copy");
  }

  void run(const core::Problem& p, const Plan& plan, const Outputs& outputs,
           const RunOptions& options) override {
    check_supported(p, outputs);
    use_device(p.device.id);
    auto stream = static_cast<cudaStream_t>(options.stream);
    const WorkspaceLayout layout = workspace_layout(p, plan);
    char* ws = static_cast<char*>(options.workspace.data);
    const bool own = ws == nullptr && layout.total > 0;
    if (own) check_cuda(cudaMallocAsync(reinterpret_cast<void**>(&ws), layout.total, stream), "cudaMallocAsync");
    try {
      const CallParams call = call_params(p, plan, outputs, ws);
      if (p.fp8) run_typed<e4m3, e4m3>(p, plan, call, stream);
      else if (p.dtype == DType::f16) p.fp8_cache ? run_typed<__half, e4m3>(p, plan, call, stream)
                                                  : run_typed<__half, __half>(p, plan, call, stream);
      else p.fp8_cache ? run_typed<__nv_bfloat16, e4m3>(p, plan, call, stream)
                       : run_typed<__nv_bfloat16, __nv_bfloat16>(p, plan, call, stream);
    } catch (...) {
      if (own) cudaFreeAsync(ws, stream);
      throw;
    }
    if (own) check_cuda(cudaFreeAsync(ws, stream), "cudaFreeAsync");
  }

  // FA3's flash_attn_combine: (splits, b, s, h, d) | (splits, total, h, d) partials.
  void combine(const TensorView& out_partial, const TensorView& lse_partial, const TensorView& out,
               const OptTensor& lse, const RunOptions& options) override {
    const CombineParams cp = combine_params(out_partial, lse_partial, out, lse);
    check_combine(cp);
    const ElemType type = out.dtype == DType::f16 ? ElemType::f16 : out.dtype == DType::bf16 ? ElemType::bf16 : ElemType::f32;
    use_device(out.device.id);
    launch_combine(cp, type, false, static_cast<cudaStream_t>(options.stream));
    check_cuda(cudaGetLastError(), "combine launch");
  }
};

}  // namespace
}  // namespace cuda

namespace core {

Backend* cuda_backend() {
  static cuda::CudaBackend backend;
  return &backend;
}

// The device's real arch: the family rule (core/kernel_family.h) picks the kernels for it. Asked
// once per device (three attribute queries were a share of every call's planning), kept as
// (sms << 32 | arch), non-zero once known.
DeviceInfo cuda_device_info(int device_id) {
  static cuda::PerDeviceValue known;
  uint64_t packed = known.get(device_id);
  if (packed == 0) {
    int sms = 0, major = 0, minor = 0;
    cuda::check_cuda(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device_id), "cudaDeviceGetAttribute");
    cuda::check_cuda(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device_id), "cudaDeviceGetAttribute");
    cuda::check_cuda(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device_id), "cudaDeviceGetAttribute");
    packed = uint64_t(uint32_t(sms)) << 32 | uint32_t(major * 10 + minor);
    known.set(device_id, packed);
  }
  DeviceInfo info;
  info.num_sms = int(packed >> 32);
  info.arch = int(packed & 0xffffffffu);
  return info;
}

}  // namespace core

// Asked once per process: the device count is fixed when the runtime starts (CUDA_VISIBLE_DEVICES
// is read then), and every CUDA call asks through backend_for().
bool cuda_available() {
  static const bool available = [] {
    int count = 0;
    return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
  }();
  return available;
}

}  // namespace kvflash
