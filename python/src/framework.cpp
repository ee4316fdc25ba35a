#include "framework.h"

#include "kvflash/errors.h"

namespace kvflash::python {
namespace {

// The Python hooks, set once at import and kept for the life of the process.
PyObject* allocate_hook = nullptr;
PyObject* current_stream_hook = nullptr;

nb::handle hook(PyObject* h, const char* name) {
  if (h == nullptr)
    throw Error(ErrorKind::device_failure, "", std::string("internal: kvflash's ") + name +
                                                   " hook is not registered");
  return h;
}

// `like` (seen as `view`) is an object of exactly `type` laid out row-major with `spec`'s shape
// and dtype, strides of size-1 dimensions included: its framework's empty_like(like) then makes
// what empty(spec) would, without parsing a shape (the decode step's `out` has q's shape and dtype).
bool empty_like_matches(nb::handle like, PyTypeObject* type, const TensorView& view, const TensorSpec& spec) {
  if (Py_TYPE(like.ptr()) != type || view.dtype != spec.dtype || view.rank != spec.rank)
    return false;
  int64_t expected = 1;
  for (int i = spec.rank - 1; i >= 0; --i) {
    if (view.shape[i] != spec.shape[i] || view.strides[i] != expected) return false;
    expected *= spec.shape[i];
  }
  return true;
}

// torch.empty(shape, dtype=..., device=like.device).
nb::object torch_empty(nb::handle like, const TorchTypes& torch, const TensorSpec& spec) {
  static PyObject* kwnames = Py_BuildValue("(ss)", "dtype", "device");  // never released
  PyObject* dtype = torch.dtypes[static_cast<int>(spec.dtype)];
  if (dtype == nullptr) {
    throw Error(ErrorKind::invalid_type, "", std::string("this torch has no ") +
                                                 dtype_name(spec.dtype) + " dtype");
  }
  nb::tuple shape = shape_tuple(spec);
  nb::object device = checked(PyObject_GetAttrString(like.ptr(), "device"));
  PyObject* args[] = {shape.ptr(), dtype, device.ptr()};
  return checked(PyObject_Vectorcall(torch.empty, args, 1, kwnames));
}

}  // namespace

nb::tuple shape_tuple(const TensorSpec& spec) {
  PyObject* dims = PyTuple_New(spec.rank);
  if (dims == nullptr) throw nb::python_error();
  for (int i = 0; i < spec.rank; ++i) {
    PyObject* d = PyLong_FromLongLong(spec.shape[i]);
    if (d == nullptr) {
      Py_DECREF(dims);
      throw nb::python_error();
    }
    PyTuple_SET_ITEM(dims, i, d);
  }
  return nb::steal<nb::tuple>(dims);
}

void set_framework_hooks(nb::handle allocate, nb::handle current_stream) {
  Py_XDECREF(allocate_hook);
  Py_XDECREF(current_stream_hook);
  allocate_hook = allocate.inc_ref().ptr();
  current_stream_hook = current_stream.inc_ref().ptr();
}

CallerFramework::CallerFramework(nb::handle like, const TensorView* like_view, Device device)
    : like_(like), like_view_(like_view), device_(device) {
  const TorchTypes* torch = torch_types();
  if (torch && PyObject_TypeCheck(like.ptr(), torch->tensor)) {
    torch_ = torch;
    exchange_ = exchange_api_of(like, torch->tensor);
  }
}

nb::object CallerFramework::output(const TensorSpec& spec) const {
  PyObject* args[] = {like_.ptr()};
  if (torch_ == nullptr) {
    if (like_view_ != nullptr && is_numpy_array(like_) &&
        empty_like_matches(like_, numpy_api().ndarray, *like_view_, spec))
      return checked(PyObject_Vectorcall(numpy_api().empty_like, args, 1, nullptr));
    nb::object shape = shape_tuple(spec);
    return hook(allocate_hook, "allocate")(like_, shape, static_cast<int>(spec.dtype));
  }
  if (like_view_ != nullptr && empty_like_matches(like_, torch_->tensor, *like_view_, spec))
    return checked(PyObject_Vectorcall(torch_->empty_like, args, 1, nullptr));
  return torch_empty(like_, *torch_, spec);
}

void* CallerFramework::stream() const {
  if (device_.type == DeviceType::cpu) return nullptr;  // every framework's answer on the CPU
  if (exchange_ != nullptr) {
    if (std::optional<void*> s = exchange_current_stream(*exchange_, device_)) return *s;
  }
  nb::object s = hook(current_stream_hook, "current_stream")(like_);
  void* stream = PyLong_AsVoidPtr(s.ptr());
  if (stream == nullptr && PyErr_Occurred()) throw nb::python_error();
  return stream;
}

Workspace CallerFramework::scratch(size_t bytes, TensorImporter& importer) {
  TensorSpec words;  // int32 words: every framework has that dtype
  words.dtype = DType::i32;
  words.rank = 1;
  words.shape[0] = static_cast<int64_t>((bytes + 3) / 4);
  if (exchange_ != nullptr) {
    exchange_scratch_.emplace(*exchange_, words, device_);
    if (!exchange_scratch_->empty()) return Workspace{exchange_scratch_->data(), bytes};
    exchange_scratch_.reset();  // Python's allocator raises the framework's own error, if any
  }
  scratch_tensor_ = output(words);
  return Workspace{importer.required(scratch_tensor_, "workspace", true).data, bytes};
}

}  // namespace kvflash::python
