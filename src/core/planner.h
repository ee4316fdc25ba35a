// The planner: FA3's heuristics (contract section 6) over a resolved Problem, and the checks that
// make a Plan safe to reuse. Host side; the CUDA backend refreshes per-batch vectors on device.
#pragma once

#include "core/problem.h"
#include "kvflash/plan.h"

namespace kvflash::core {

struct DeviceInfo {
  int num_sms = 1;  // CUDA: multiprocessor count; CPU: hardware threads
  int arch = 0;     // 0 CPU, else the device's compute capability * 10 (80, 90, ...)
};
DeviceInfo device_info(Device device);

// The plan key of a call (caller-given values, see PlanKey).
PlanKey plan_key(const Problem& p, const DeviceInfo& info);

// The plan the call makes when none is given. Reads lengths from host-visible tensors
// (per-batch vectors need cache_seqlens / cu_seqlens on the host; device-resident lengths give
// the static decisions and per-batch vectors filled from the static bounds).
Plan make_plan(const Problem& p);

// A caller's Plan serves this call when it was made for the same batch size and its static
// decisions are the ones the call makes itself; its per-sequence vectors must be in range.
// Returns the plan the call runs with: the call's own (make_plan), so the result is exactly that
// of planning the call itself. Otherwise throws Error(invalid_value, "scheduler_metadata") naming
// the PlanKey field (or edited decision, or vector entry) at fault. The rule per field is in
// planner.cpp beside accept_plan.
Plan accept_plan(const Plan& plan, const Problem& p);

// FA3's int32 scheduler_metadata tensor, passed back: dtype, device and length must match the
// layout this call needs. `values` are its entries in host memory (the tensor's own data when it
// lives on the host, a copy in checked mode), each checked (a malformed tensor is refused); the
// call's own plan is returned, as accept_plan does for a typed Plan. With values == nullptr
// (device memory, unchecked) the entries are not read here: the static decisions come from this
// problem's key, and the CUDA kernels read the per-sequence split counts at the tensor's start
// clamped to [1, num_splits] (attention and combine alike, so any value partitions the keys
// consistently), so whatever it holds cannot steer a kernel outside its tensors.
Plan plan_from_metadata(const TensorView& metadata, const Problem& p, const int32_t* values);
// The entries read in place when the tensor is in host memory, not read when on a device.
inline Plan plan_from_metadata(const TensorView& metadata, const Problem& p) {
  const bool on_host = metadata.device.type == DeviceType::cpu;
  return plan_from_metadata(metadata, p, on_host ? metadata.ptr<const int32_t>() : nullptr);
}

}  // namespace kvflash::core
