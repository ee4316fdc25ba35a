// The interface every backend implements. A backend receives a validated, resolved Problem and a
// Plan that matches it; it appends new K/V, attends and combines split partials.
#pragma once

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
};

Backend& cpu_backend();
Backend* cuda_backend();  // nullptr when the CUDA backend is not built
Backend& backend_for(Device device);  // throws Error(unsupported) when not available

}  // namespace kvflash::core
