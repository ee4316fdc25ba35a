// The DLPack C exchange API (DLPack 1.3, `type(tensor).__dlpack_c_exchange_api__`, a PyCapsule
// named "dlpack_exchange_api"; torch >= 2.10 provides it): C function pointers through which a
// framework views its tensors, reports its current stream and allocates from its own allocator,
// with no Python call. kvflash uses it on the per-call path of a decode step, where reading a
// torch tensor's attributes one by one costs about half a microsecond per tensor.
//
// Only the ABI is declared here (DLTensor is nanobind's dlpack::dltensor, the same layout), so the
// build needs neither torch nor a dlpack.h. Frameworks without the capsule take the slower paths.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstdint>
#include <optional>

#include "kvflash/args.h"
#include "kvflash/tensor.h"

namespace kvflash::python {

namespace nb = nanobind;

// The function table and the owned tensors it allocates (dlpack_exchange.cpp declares their layout).
struct DLPackExchangeApi;
struct DLManagedTensorVersionedAbi;

// The table of obj's type when that type is exactly `tensor_type` (subclasses may override
// what the table would read, so they take the attribute path); nullptr otherwise.
const DLPackExchangeApi* exchange_api_of(nb::handle obj, PyTypeObject* tensor_type);

// A view of obj through the table, or nullopt when the table cannot describe it in kvflash's
// terms (a dtype, rank or device kvflash does not take, or a tensor the framework refuses to
// export): the caller then takes the path that reports the error in the framework's words.
OptTensor exchange_view(const DLPackExchangeApi& api, nb::handle obj);

// The framework's current stream on `device` (nullptr on the CPU), or nullopt when it cannot say.
std::optional<void*> exchange_current_stream(const DLPackExchangeApi& api, Device device);

// Scratch memory from the framework's allocator (torch's caching allocator on CUDA), released
// when this object dies: stream-ordered like any tensor the framework frees, so the kernels
// queued on the current stream before the release may still use it.
class ExchangeScratch {
 public:
  // Allocates `spec` on `device`; empty() when the framework could not (the caller then asks
  // the framework through Python, which raises the framework's own exception).
  ExchangeScratch(const DLPackExchangeApi& api, const TensorSpec& spec, Device device);
  ~ExchangeScratch();
  ExchangeScratch(const ExchangeScratch&) = delete;
  ExchangeScratch& operator=(const ExchangeScratch&) = delete;

  bool empty() const { return managed_ == nullptr; }
  void* data() const { return data_; }

 private:
  DLManagedTensorVersionedAbi* managed_ = nullptr;
  void* data_ = nullptr;
};

}  // namespace kvflash::python
