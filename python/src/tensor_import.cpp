#include "tensor_import.h"

#include <bit>
#include <cstring>
#include <optional>
#include <string>

#include "dlpack_exchange.h"
#include "kvflash/errors.h"

namespace kvflash::python {
namespace {

// Interned attribute names, created once and deliberately never released: they must outlive
// every call, including calls made while the interpreter shuts down.
struct Names {
  PyObject* data_ptr = PyUnicode_InternFromString("data_ptr");
  PyObject* shape = PyUnicode_InternFromString("shape");
  PyObject* stride = PyUnicode_InternFromString("stride");
  PyObject* dtype = PyUnicode_InternFromString("dtype");
  PyObject* is_cuda = PyUnicode_InternFromString("is_cuda");
  PyObject* is_cpu = PyUnicode_InternFromString("is_cpu");
  PyObject* get_device = PyUnicode_InternFromString("get_device");
  PyObject* device = PyUnicode_InternFromString("device");
  PyObject* name = PyUnicode_InternFromString("name");
  PyObject* kind = PyUnicode_InternFromString("kind");
  PyObject* view = PyUnicode_InternFromString("view");
};

const Names& names() {
  static const Names* n = new Names();
  return *n;
}


std::string type_name_of(nb::handle obj) { return nb::type_name(obj.type()).c_str(); }

[[noreturn]] void not_a_tensor(nb::handle obj, const char* name) {
  throw Error(ErrorKind::invalid_type, name,
              std::string(name) + " must be a tensor (torch.Tensor, numpy.ndarray or any DLPack "
                                  "producer), got " + type_name_of(obj));
}

[[noreturn]] void bad_dtype(const char* name, const std::string& dtype) {
  throw Error(ErrorKind::invalid_type, name,
              std::string(name) + " has dtype " + dtype +
                  ", which kvflash does not take (it takes float16, bfloat16, float8_e4m3fn, "
                  "float32, float64 and int32)");
}

[[noreturn]] void bad_rank(const char* name, size_t rank) {
  throw Error(ErrorKind::invalid_value, name,
              std::string(name) + " has " + std::to_string(rank) + " dimensions, at most " +
                  std::to_string(kMaxRank) + " are taken");
}

// An empty tensor's strides mean nothing and exporters disagree on them (numpy's DLPack gives
// 0): give it row-major strides so stride checks judge its layout, not its exporter.
void normalize_empty(TensorView& v) {
  if (v.numel() != 0) return;
  int64_t expected = 1;
  for (int i = v.rank - 1; i >= 0; --i) {
    v.strides[i] = expected;
    expected *= v.shape[i] > 0 ? v.shape[i] : 1;
  }
}

}  // namespace

nb::object checked(PyObject* result) {
  if (!result) throw nb::python_error();
  return nb::steal(result);
}

const TorchTypes* torch_types() {
  static TorchTypes* types = nullptr;
  if (types) return types;
  PyObject* modules = PyImport_GetModuleDict();
  PyObject* torch = PyDict_GetItemString(modules, "torch");  // borrowed; only if already loaded
  if (!torch) return nullptr;
  auto* t = new TorchTypes();  // kept for the life of the process, like torch itself
  nb::handle mod(torch);
  t->tensor = reinterpret_cast<PyTypeObject*>(mod.attr("Tensor").inc_ref().ptr());
  const char* dtype_names[6] = {"float32", "float16", "bfloat16", "float8_e4m3fn", "int32",
                                "float64"};
  for (int i = 0; i < 6; ++i) {
    if (PyObject_HasAttrString(torch, dtype_names[i]))
      t->dtypes[i] = mod.attr(dtype_names[i]).inc_ref().ptr();
  }
  t->empty = mod.attr("empty").inc_ref().ptr();
  t->empty_like = mod.attr("empty_like").inc_ref().ptr();
  types = t;
  return types;
}

namespace {

int64_t to_int64(PyObject* o) {
  const long long v = PyLong_AsLongLong(o);
  if (v == -1 && PyErr_Occurred()) throw nb::python_error();
  return v;
}

TensorView torch_view(nb::handle obj, const char* name, const TorchTypes& torch) {
  const Names& n = names();
  TensorView v;
  nb::object dtype = checked(PyObject_GetAttr(obj.ptr(), n.dtype));
  int found = -1;
  for (int i = 0; i < 6; ++i)
    if (dtype.ptr() == torch.dtypes[i]) found = i;
  if (found < 0) bad_dtype(name, nb::str(dtype).c_str());
  v.dtype = static_cast<DType>(found);

  nb::object shape = checked(PyObject_GetAttr(obj.ptr(), n.shape));
  nb::object strides = checked(PyObject_CallMethodNoArgs(obj.ptr(), n.stride));
  const Py_ssize_t rank = PyTuple_GET_SIZE(shape.ptr());
  if (rank > kMaxRank) bad_rank(name, static_cast<size_t>(rank));
  v.rank = static_cast<int>(rank);
  for (Py_ssize_t i = 0; i < rank; ++i) {
    v.shape[i] = to_int64(PyTuple_GET_ITEM(shape.ptr(), i));
    v.strides[i] = to_int64(PyTuple_GET_ITEM(strides.ptr(), i));
  }

  nb::object is_cuda = checked(PyObject_GetAttr(obj.ptr(), n.is_cuda));
  if (is_cuda.ptr() == Py_True) {
    nb::object index = checked(PyObject_CallMethodNoArgs(obj.ptr(), n.get_device));
    v.device = Device{DeviceType::cuda, static_cast<int32_t>(to_int64(index.ptr()))};
  } else {
    nb::object is_cpu = checked(PyObject_GetAttr(obj.ptr(), n.is_cpu));
    if (is_cpu.ptr() != Py_True) {
      nb::object device = checked(PyObject_GetAttr(obj.ptr(), n.device));
      throw Error(ErrorKind::invalid_type, name,
                  std::string(name) + " is on device " + nb::str(device).c_str() +
                      "; kvflash takes CPU and CUDA tensors");
    }
  }
  nb::object ptr = checked(PyObject_CallMethodNoArgs(obj.ptr(), n.data_ptr));
  v.data = PyLong_AsVoidPtr(ptr.ptr());
  if (!v.data && PyErr_Occurred()) throw nb::python_error();
  normalize_empty(v);
  return v;
}

// The dtype of a buffer-protocol format (struct module characters, native or little-endian on a
// little-endian host) of `itemsize` bytes; nullopt for anything else.
std::optional<DType> buffer_dtype(const char* format, Py_ssize_t itemsize) {
  if (format == nullptr) return std::nullopt;
  if (*format == '@' || *format == '=' || (*format == '<' && std::endian::native == std::endian::little)) ++format;
  if (format[0] == '\0' || format[1] != '\0') return std::nullopt;
  switch (format[0]) {
    case 'e': return itemsize == 2 ? std::optional(DType::f16) : std::nullopt;
    case 'f': return itemsize == 4 ? std::optional(DType::f32) : std::nullopt;
    case 'd': return itemsize == 8 ? std::optional(DType::f64) : std::nullopt;
    case 'i': return itemsize == 4 ? std::optional(DType::i32) : std::nullopt;
  }
  return std::nullopt;
}

// A numpy array through the buffer protocol: numpy describes itself in place, where nanobind's
// import would have it make a DLPack capsule (about a third of a microsecond per array, on every
// call). Nullopt, with nothing raised, for what this does not read (dtypes kvflash does not take,
// byte-swapped or read-only arrays asked for writing, more than kMaxRank dimensions, strides not
// in whole elements): the general import then reads the array or reports it in its own words.
OptTensor numpy_buffer_view(nb::handle obj, bool writable) {
  Py_buffer buffer;
  if (PyObject_GetBuffer(obj.ptr(), &buffer, PyBUF_RECORDS_RO | (writable ? PyBUF_WRITABLE : 0)) != 0) {
    PyErr_Clear();
    return std::nullopt;
  }
  OptTensor view;
  const std::optional<DType> dtype = buffer_dtype(buffer.format, buffer.itemsize);
  bool whole = dtype && buffer.ndim <= kMaxRank;
  for (int i = 0; whole && i < buffer.ndim; ++i) whole = buffer.strides[i] % buffer.itemsize == 0;
  if (whole) {
    TensorView& v = view.emplace();
    v.data = buffer.buf;
    v.dtype = *dtype;
    v.rank = buffer.ndim;
    for (int i = 0; i < v.rank; ++i) {
      v.shape[i] = buffer.shape[i];
      v.strides[i] = buffer.strides[i] / buffer.itemsize;
    }
    v.device = Device{DeviceType::cpu, 0};
    normalize_empty(v);
  }
  PyBuffer_Release(&buffer);  // the caller's array keeps the memory alive for the call
  return view;
}

// numpy arrays of ml_dtypes' bfloat16 / float8_e4m3fn: numpy can export neither through DLPack
// nor through the buffer protocol, so the binding reads them as same-width unsigned integers.
std::optional<DType> ml_dtype_of(nb::handle obj) {
  if (!PyObject_TypeCheck(obj.ptr(), numpy_api().ndarray)) return std::nullopt;
  const Names& n = names();
  nb::object dtype = checked(PyObject_GetAttr(obj.ptr(), n.dtype));
  nb::object kind = checked(PyObject_GetAttr(dtype.ptr(), n.kind));
  if (std::strcmp(nb::str(kind).c_str(), "V") != 0) return std::nullopt;
  const std::string dtype_name = nb::str(checked(PyObject_GetAttr(dtype.ptr(), n.name))).c_str();
  if (dtype_name == "bfloat16") return DType::bf16;
  if (dtype_name == "float8_e4m3fn") return DType::e4m3;
  return std::nullopt;
}

template <class Array>
TensorView view_of(const Array& a, const char* name, std::optional<DType> retype) {
  std::optional<DType> dtype = retype;
  if (!dtype) dtype = dtype_from_dlpack(a.dtype().code, a.dtype().bits, a.dtype().lanes);
  if (!dtype) {
    static const char* kinds[] = {"int", "uint", "float", "opaque", "bfloat", "complex", "bool"};
    const uint8_t code = a.dtype().code;
    bad_dtype(name, std::string(code < 7 ? kinds[code] : "dlpack-code-" + std::to_string(code)) +
                        std::to_string(a.dtype().bits));
  }
  if (a.ndim() > static_cast<size_t>(kMaxRank)) bad_rank(name, a.ndim());
  TensorView v;
  v.data = const_cast<void*>(static_cast<const void*>(a.data()));
  v.dtype = *dtype;
  v.rank = static_cast<int>(a.ndim());
  for (int i = 0; i < v.rank; ++i) {
    v.shape[i] = static_cast<int64_t>(a.shape(i));
    v.strides[i] = a.stride(i);
  }
  v.device = Device{static_cast<DeviceType>(a.device_type()), a.device_id()};
  if (v.device.type != DeviceType::cpu && v.device.type != DeviceType::cuda) {
    throw Error(ErrorKind::invalid_type, name,
                std::string(name) + " is on DLPack device type " +
                    std::to_string(a.device_type()) + "; kvflash takes CPU and CUDA tensors");
  }
  normalize_empty(v);
  return v;
}

}  // namespace

bool is_torch_tensor(nb::handle obj) {
  const TorchTypes* torch = torch_types();
  return torch && PyObject_TypeCheck(obj.ptr(), torch->tensor);
}

const NumpyApi& numpy_api() {
  static const NumpyApi* api = nullptr;  // kept for the life of the process, like numpy itself
  if (!api) {
    nb::module_ numpy = nb::module_::import_("numpy");
    auto* a = new NumpyApi();
    a->ndarray = reinterpret_cast<PyTypeObject*>(numpy.attr("ndarray").inc_ref().ptr());
    a->empty_like = numpy.attr("empty_like").inc_ref().ptr();
    api = a;
  }
  return *api;
}

bool is_numpy_array(nb::handle obj) { return PyObject_TypeCheck(obj.ptr(), numpy_api().ndarray); }

OptTensor torch_exchange_view(nb::handle tensor) {
  const TorchTypes* torch = torch_types();
  const DLPackExchangeApi* api = torch ? exchange_api_of(tensor, torch->tensor) : nullptr;
  if (!api) return std::nullopt;
  OptTensor v = exchange_view(*api, tensor);
  if (v) normalize_empty(*v);
  return v;
}

TensorView torch_attribute_view(nb::handle tensor, const char* name) {
  const TorchTypes* torch = torch_types();
  if (!torch || !PyObject_TypeCheck(tensor.ptr(), torch->tensor)) not_a_tensor(tensor, name);
  return torch_view(tensor, name, *torch);
}

OptTensor TensorImporter::optional(nb::handle obj, const char* name, bool writable) {
  if (obj.is_none()) return std::nullopt;
  if (const TorchTypes* torch = torch_types(); torch && PyObject_TypeCheck(obj.ptr(), torch->tensor)) {
    // The caller's reference keeps the tensor alive for the call.
    if (OptTensor v = torch_exchange_view(obj)) return v;
    return torch_view(obj, name, *torch);
  }

  if (is_numpy_array(obj)) {
    if (OptTensor v = numpy_buffer_view(obj, writable)) return v;
  }
  nb::object source = nb::borrow(obj);
  const std::optional<DType> retype = ml_dtype_of(obj);
  if (retype) {
    const char* as_uint = *retype == DType::bf16 ? "uint16" : "uint8";
    source = checked(PyObject_CallMethodOneArg(obj.ptr(), names().view,
                                               nb::str(as_uint).ptr()));
  }
  if (writable) {
    nb::ndarray<> array;
    if (!nb::try_cast(source, array, false)) {
      nb::ndarray<nb::ro> readable;
      if (nb::try_cast(source, readable, false)) {
        throw Error(ErrorKind::invalid_value, name,
                    std::string(name) + " must be writable: the call writes into it");
      }
      not_a_tensor(obj, name);
    }
    TensorView v = view_of(array, name, retype);
    if (retype) keep_alive_.push_back(std::move(source));
    return v;
  }
  nb::ndarray<nb::ro> array;
  if (!nb::try_cast(source, array, false)) not_a_tensor(obj, name);
  TensorView v = view_of(array, name, retype);
  if (retype) keep_alive_.push_back(std::move(source));  // the retyped view is ours to keep
  return v;
}

TensorView TensorImporter::required(nb::handle obj, const char* name, bool writable) {
  OptTensor v = optional(obj, name, writable);
  if (!v) {
    throw Error(ErrorKind::invalid_value, name, std::string(name) + " must be provided");
  }
  return *v;
}

}  // namespace kvflash::python
