// The interface every backend implements. A backend receives a validated, resolved Problem and a
// Plan that matches it; it appends new K/V, attends and combines split partials.
#pragma once

#include <cstddef>
#include <cstring>

#include "core/planner.h"
#include "core/problem.h"
#include "kvflash/kvflash.h"

namespace kvflash::core {

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;
  virtual void run(const Problem& problem, const Plan& plan, const Outputs& outputs,
                   const RunOptions& options) = 0;
  virtual void combine(const TensorView& out_partial, const TensorView& lse_partial,
                       const TensorView& out, const OptTensor& lse, const RunOptions& options) = 0;
  virtual size_t workspace_size(const Problem& problem, const Plan& plan) const = 0;
  // Checked mode: copies `bytes` of a tensor on this backend's device into host memory, so the
  // index tensors can be checked before run(). The default serves backends on host memory.
  virtual void copy_to_host(void* host, const void* device_data, size_t bytes) const {
    std::memcpy(host, device_data, bytes);
  }
};

Backend& cpu_backend();
Backend* cuda_backend();  // nullptr when the CUDA backend is not built
Backend& backend_for(Device device);  // throws Error(unsupported) when not available

// The CUDA device's SM count and arch; throws Error(unsupported) without the CUDA backend.
DeviceInfo cuda_device_info(int device_id);

}  // namespace kvflash::core
