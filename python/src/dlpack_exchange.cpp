#include "dlpack_exchange.h"

#include <string>

namespace kvflash::python {

// The ABI of DLPack 1.2 / 1.3's exchange table (dlpack.h, "DLPackExchangeAPI"), field for field.
struct DLPackVersionAbi {
  uint32_t major;
  uint32_t minor;
};

struct DLManagedTensorVersionedAbi {
  DLPackVersionAbi version;
  void* manager_ctx;
  void (*deleter)(DLManagedTensorVersionedAbi* self);
  uint64_t flags;
  nb::dlpack::dltensor dl_tensor;
};

// DLPack's sizes on every 64-bit platform (a layout slip would read garbage, not fail).
static_assert(sizeof(nb::dlpack::dltensor) == 48, "DLTensor layout");
static_assert(sizeof(DLManagedTensorVersionedAbi) == 80, "DLManagedTensorVersioned layout");

struct DLPackExchangeApiHeader {
  DLPackVersionAbi version;
  DLPackExchangeApiHeader* prev_api;
};

struct DLPackExchangeApi {
  DLPackExchangeApiHeader header;
  int (*managed_tensor_allocator)(nb::dlpack::dltensor* prototype,
                                  DLManagedTensorVersionedAbi** out, void* error_ctx,
                                  void (*set_error)(void* error_ctx, const char* kind,
                                                    const char* message));
  int (*managed_tensor_from_py_object_no_sync)(void* py_object, DLManagedTensorVersionedAbi** out);
  int (*managed_tensor_to_py_object_no_sync)(DLManagedTensorVersionedAbi* tensor,
                                             void** out_py_object);
  int (*dltensor_from_py_object_no_sync)(void* py_object, nb::dlpack::dltensor* out);
  int (*current_work_stream)(int32_t device_type, int32_t device_id, void** out_current_stream);
};

namespace {

// The first table in the chain whose layout this file declares (major 1, minor >= 2).
const DLPackExchangeApi* usable(const DLPackExchangeApiHeader* header) {
  for (; header != nullptr; header = header->prev_api) {
    if (header->version.major == 1 && header->version.minor >= 2)
      return reinterpret_cast<const DLPackExchangeApi*>(header);
  }
  return nullptr;
}

const DLPackExchangeApi* lookup(PyTypeObject* type) {
  PyObject* capsule =
      PyObject_GetAttrString(reinterpret_cast<PyObject*>(type), "__dlpack_c_exchange_api__");
  if (capsule == nullptr) {
    PyErr_Clear();
    return nullptr;
  }
  // The capsule is a class attribute and the table a static of the framework: both outlive us.
  auto* header = static_cast<const DLPackExchangeApiHeader*>(
      PyCapsule_GetPointer(capsule, "dlpack_exchange_api"));
  Py_DECREF(capsule);
  if (header == nullptr) {
    PyErr_Clear();
    return nullptr;
  }
  return usable(header);
}

}  // namespace

const DLPackExchangeApi* exchange_api_of(nb::handle obj, PyTypeObject* tensor_type) {
  if (Py_TYPE(obj.ptr()) != tensor_type) return nullptr;
  // One framework (torch) asks today: one cached entry, looked up again if the type changes.
  static PyTypeObject* cached_type = nullptr;
  static const DLPackExchangeApi* cached_api = nullptr;
  if (cached_type != tensor_type) {
    cached_api = lookup(tensor_type);
    cached_type = tensor_type;
  }
  return cached_api;
}

OptTensor exchange_view(const DLPackExchangeApi& api, nb::handle obj) {
  if (api.dltensor_from_py_object_no_sync == nullptr) return std::nullopt;
  nb::dlpack::dltensor t;
  if (api.dltensor_from_py_object_no_sync(obj.ptr(), &t) != 0) {
    PyErr_Clear();  // e.g. a tensor torch will not export: the attribute path decides
    return std::nullopt;
  }
  if (t.device.device_type != static_cast<int32_t>(DeviceType::cpu) &&
      t.device.device_type != static_cast<int32_t>(DeviceType::cuda))
    return std::nullopt;
  return from_dlpack(t);  // nullopt for a dtype or rank kvflash does not take
}

std::optional<void*> exchange_current_stream(const DLPackExchangeApi& api, Device device) {
  if (device.type == DeviceType::cpu) return nullptr;
  void* stream = nullptr;
  if (api.current_work_stream == nullptr ||
      api.current_work_stream(static_cast<int32_t>(device.type), device.id, &stream) != 0) {
    PyErr_Clear();
    return std::nullopt;
  }
  return stream;
}

ExchangeScratch::ExchangeScratch(const DLPackExchangeApi& api, const TensorSpec& spec,
                                 Device device) {
  if (api.managed_tensor_allocator == nullptr) return;
  int64_t shape[kMaxRank];
  for (int i = 0; i < spec.rank; ++i) shape[i] = spec.shape[i];
  nb::dlpack::dltensor prototype;
  prototype.device = {static_cast<int32_t>(device.type), device.id};
  prototype.ndim = spec.rank;
  dtype_to_dlpack(spec.dtype, prototype.dtype.code, prototype.dtype.bits);
  prototype.dtype.lanes = 1;
  prototype.shape = shape;
  DLManagedTensorVersionedAbi* managed = nullptr;
  // The reason is not kept: on failure the caller allocates through Python, which raises the
  // framework's own exception (torch.OutOfMemoryError, ...).
  auto ignore_error = [](void*, const char*, const char*) {};
  if (api.managed_tensor_allocator(&prototype, &managed, nullptr, ignore_error) != 0 ||
      managed == nullptr) {
    PyErr_Clear();
    return;
  }
  managed_ = managed;
  data_ = static_cast<char*>(managed->dl_tensor.data) + managed->dl_tensor.byte_offset;
}

ExchangeScratch::~ExchangeScratch() {
  if (managed_ != nullptr && managed_->deleter != nullptr) managed_->deleter(managed_);
}

}  // namespace kvflash::python
