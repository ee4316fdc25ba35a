// What one call needs from the caller's array framework: its outputs (allocated by that
// framework), scratch memory and the current stream. torch tensors are served from C++ (torch's
// DLPack exchange table, torch.empty called directly); other frameworks through the Python hooks
// of kvflash/_frameworks.py (allocate, current_stream), registered once at import.
#pragma once

#include <nanobind/nanobind.h>

#include <optional>

#include "dlpack_exchange.h"
#include "kvflash/args.h"
#include "kvflash/kvflash.h"
#include "tensor_import.h"

namespace kvflash::python {

// A shape as the tuple of ints every framework takes.
nb::tuple shape_tuple(const TensorSpec& spec);

// Registers _frameworks.allocate(like, shape, dtype_code) and _frameworks.current_stream(like).
void set_framework_hooks(nb::handle allocate, nb::handle current_stream);

class CallerFramework {
 public:
  // `like`: the call's q (v_cache without q), whose framework and device the outputs share;
  // `like_view` as the call imported it (nullptr when absent), so that it is not read again.
  CallerFramework(nb::handle like, const TensorView* like_view, Device device);

  // An uninitialised output of `spec` on the call's device.
  nb::object output(const TensorSpec& spec) const;

  // The framework's current stream (nullptr on the CPU).
  void* stream() const;

  // `bytes` of scratch on the call's device, alive as long as this object.
  Workspace scratch(size_t bytes, TensorImporter& importer);

 private:
  nb::handle like_;
  const TensorView* like_view_;
  Device device_;
  const TorchTypes* torch_ = nullptr;          // set when like is a torch tensor
  const DLPackExchangeApi* exchange_ = nullptr;  // like's exchange table, if any
  std::optional<ExchangeScratch> exchange_scratch_;
  nb::object scratch_tensor_;
};

}  // namespace kvflash::python
