// Turning Python tensors into kvflash::TensorView without linking any framework.
//
// torch tensors are read through torch's DLPack C exchange table (dlpack_exchange.h: a C call,
// no Python) when torch provides it, else through their attributes (data_ptr, shape, stride,
// dtype, device), which also report the errors in torch's words: either costs far less than
// torch's Python-level __dlpack__, and this is the per-call path of a decode step. numpy arrays holding ml_dtypes' bfloat16 / float8_e4m3fn
// (which neither numpy's DLPack nor its buffer protocol can describe) are viewed as unsigned
// integers of the same width and retyped. Other numpy arrays are read through the buffer protocol
// (numpy describes itself in place); everything else (CuPy, JAX, ...) and what the buffer protocol
// does not describe go through nanobind's DLPack / buffer-protocol import.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <vector>

#include "kvflash/tensor.h"

namespace kvflash::python {

namespace nb = nanobind;

// Imports the tensors of one call. The caller's arguments keep their memory alive; the importer
// keeps the objects it makes itself (the retyped views of ml_dtypes arrays) until the call is done.
class TensorImporter {
 public:
  // A view of `obj`, or nullopt when obj is None. `writable`: the call writes through it (the
  // caches, the outputs). Throws kvflash::Error(invalid_type) naming `name` when `obj` is not a
  // tensor kvflash can read.
  OptTensor optional(nb::handle obj, const char* name, bool writable = false);
  TensorView required(nb::handle obj, const char* name, bool writable = false);

 private:
  std::vector<nb::object> keep_alive_;
};

// What kvflash uses of torch, found once torch is loaded (never imported by kvflash).
struct TorchTypes {
  PyTypeObject* tensor = nullptr;
  PyObject* dtypes[6] = {};  // indexed like kvflash::DType; dtype objects are singletons
  PyObject* empty = nullptr;       // torch.empty
  PyObject* empty_like = nullptr;  // torch.empty_like
};

// torch's types when torch is loaded, else nullptr.
const TorchTypes* torch_types();

// True when `obj` is a torch.Tensor (without importing torch if it is not loaded yet).
bool is_torch_tensor(nb::handle obj);

// The two ways a torch tensor is read, for the tests that compare them: through torch's DLPack
// exchange table (nullopt where it cannot say) and through the tensor's attributes.
OptTensor torch_exchange_view(nb::handle tensor);
TensorView torch_attribute_view(nb::handle tensor, const char* name);

// The new reference a Python C-API call returned, or its exception thrown.
nb::object checked(PyObject* result);

// True when `obj` is a numpy.ndarray.
bool is_numpy_array(nb::handle obj);

// What kvflash uses of numpy (imported on first use; numpy is a dependency).
struct NumpyApi {
  PyTypeObject* ndarray = nullptr;
  PyObject* empty_like = nullptr;  // numpy.empty_like
};
const NumpyApi& numpy_api();

}  // namespace kvflash::python
