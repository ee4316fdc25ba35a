// TensorView helpers, dtype / device names and the DLPack dtype mapping.
#include "kvflash/tensor.h"

#include <string>

#include "kvflash/args.h"
#include "kvflash/errors.h"

namespace kvflash {

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::f32: return "float32";
    case DType::f16: return "float16";
    case DType::bf16: return "bfloat16";
    case DType::e4m3: return "float8_e4m3fn";
    case DType::i32: return "int32";
    case DType::f64: return "float64";
  }
  return "unknown";
}

size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::f64: return 8;
    case DType::f32:
    case DType::i32: return 4;
    case DType::f16:
    case DType::bf16: return 2;
    case DType::e4m3: return 1;
  }
  return 0;
}

std::string device_name(Device device) {
  switch (device.type) {
    case DeviceType::cpu: return "cpu";
    case DeviceType::cuda: return "cuda:" + std::to_string(device.id);
  }
  return "device_type_" + std::to_string(static_cast<int32_t>(device.type));
}

namespace {
// DLPack v1.1 type codes.
constexpr uint8_t kDLInt = 0;
constexpr uint8_t kDLFloat = 2;
constexpr uint8_t kDLBfloat = 4;
constexpr uint8_t kDLFloat8_e4m3fn = 10;
}  // namespace

std::optional<DType> dtype_from_dlpack(uint8_t code, uint8_t bits, uint16_t lanes) {
  if (lanes != 1) return std::nullopt;
  switch (code) {
    case kDLInt:
      if (bits == 32) return DType::i32;
      break;
    case kDLFloat:
      if (bits == 16) return DType::f16;
      if (bits == 32) return DType::f32;
      if (bits == 64) return DType::f64;
      break;
    case kDLBfloat:
      if (bits == 16) return DType::bf16;
      break;
    case kDLFloat8_e4m3fn:
      if (bits == 8) return DType::e4m3;
      break;
  }
  return std::nullopt;
}

void dtype_to_dlpack(DType dtype, uint8_t& code, uint8_t& bits) {
  bits = static_cast<uint8_t>(dtype_size(dtype) * 8);
  switch (dtype) {
    case DType::i32: code = kDLInt; return;
    case DType::f16:
    case DType::f32:
    case DType::f64: code = kDLFloat; return;
    case DType::bf16: code = kDLBfloat; return;
    case DType::e4m3: code = kDLFloat8_e4m3fn; return;
  }
}

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int i = 0; i < rank; ++i) n *= shape[i];
  return n;
}

bool TensorView::is_contiguous() const {
  if (numel() == 0) return true;  // no element to lay out (as in torch)
  int64_t expected = 1;
  for (int i = rank - 1; i >= 0; --i) {
    // A dimension of size 1 may carry any stride without changing the layout (as in torch).
    if (shape[i] != 1 && strides[i] != expected) return false;
    expected *= shape[i];
  }
  return true;
}

namespace {
std::string tuple_string(const int64_t* values, int count) {
  std::string s = "(";
  for (int i = 0; i < count; ++i) {
    if (i) s += ", ";
    s += std::to_string(values[i]);
  }
  if (count == 1) s += ",";
  return s + ")";
}

// Copies up to kMaxRank values; the caller has checked the count.
void copy_dims(std::initializer_list<int64_t> from, int64_t* to) {
  int i = 0;
  for (int64_t v : from) to[i++] = v;
}
}  // namespace

std::string TensorView::shape_string() const { return tuple_string(shape, rank); }

TensorView TensorView::contiguous(void* data, DType dtype, std::initializer_list<int64_t> shape,
                                  Device device) {
  if (shape.size() > static_cast<size_t>(kMaxRank)) {
    throw Error(ErrorKind::invalid_value, "",
                "tensor rank must be at most " + std::to_string(kMaxRank) + " (got " +
                    std::to_string(shape.size()) + ")");
  }
  TensorView v;
  v.data = data;
  v.dtype = dtype;
  v.device = device;
  v.rank = static_cast<int>(shape.size());
  copy_dims(shape, v.shape);
  int64_t stride = 1;
  for (int i = v.rank - 1; i >= 0; --i) {
    v.strides[i] = stride;
    stride *= v.shape[i];
  }
  return v;
}

TensorView TensorView::strided(void* data, DType dtype, std::initializer_list<int64_t> shape,
                               std::initializer_list<int64_t> strides, Device device) {
  if (strides.size() != shape.size()) {
    throw Error(ErrorKind::invalid_value, "",
                "a strided tensor needs one stride per dimension (got " +
                    std::to_string(shape.size()) + " dimensions and " +
                    std::to_string(strides.size()) + " strides)");
  }
  TensorView v = contiguous(data, dtype, shape, device);
  copy_dims(strides, v.strides);
  return v;
}

int64_t TensorSpec::numel() const {
  int64_t n = 1;
  for (int i = 0; i < rank; ++i) n *= shape[i];
  return rank == 0 ? 0 : n;
}

}  // namespace kvflash
