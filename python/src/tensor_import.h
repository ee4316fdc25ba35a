// Turning Python tensors into kvflash::TensorView without linking any framework.
//
// torch tensors are read through their attributes (data_ptr, shape, stride, dtype, device): a
// few attribute lookups cost far less than torch's Python-level __dlpack__, and this is the
// per-call path of a decode step. numpy arrays holding ml_dtypes' bfloat16 / float8_e4m3fn
// (which neither numpy's DLPack nor its buffer protocol can describe) are viewed as unsigned
// integers of the same width and retyped. Everything else (numpy, CuPy, JAX, ...) goes through
// nanobind's DLPack / buffer-protocol import.
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

// True when `obj` is a torch.Tensor (without importing torch if it is not loaded yet).
bool is_torch_tensor(nb::handle obj);

}  // namespace kvflash::python
