#include "host_tensor.h"

#include <cmath>
#include <cstring>
#include <string>

#include "core/numeric.h"
#include "kvflash/errors.h"
#include "options.h"

namespace kvflash::tools {

namespace {

int64_t product(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

template <class T>
T load(const unsigned char* p) {
  T value;
  std::memcpy(&value, p, sizeof(T));
  return value;
}

template <class T>
void store(unsigned char* p, T value) {
  std::memcpy(p, &value, sizeof(T));
}

}  // namespace

HostTensor::HostTensor(DType dtype, std::vector<int64_t> shape)
    : dtype_(dtype), shape_(std::move(shape)),
      storage_(size_t(product(shape_)) * dtype_size(dtype)) {}

int64_t HostTensor::numel() const { return product(shape_); }

TensorView contiguous_view(void* data, DType dtype, const std::vector<int64_t>& shape,
                           Device device) {
  TensorView v;
  v.data = data;
  v.dtype = dtype;
  v.device = device;
  v.rank = int(shape.size());
  int64_t stride = 1;
  for (int i = v.rank - 1; i >= 0; --i) {
    v.shape[i] = shape[i];
    v.strides[i] = stride;
    stride *= shape[i];
  }
  return v;
}

TensorView HostTensor::view() { return contiguous_view(storage_.data(), dtype_, shape_); }

double HostTensor::get(int64_t i) const {
  const unsigned char* p = storage_.data() + size_t(i) * dtype_size(dtype_);
  switch (dtype_) {
    case DType::f32: return load<float>(p);
    case DType::f64: return load<double>(p);
    case DType::f16: return core::fp16_to_float(load<uint16_t>(p));
    case DType::bf16: return core::bf16_to_float(load<uint16_t>(p));
    case DType::e4m3: return core::e4m3_to_float(*p);
    case DType::i32: return load<int32_t>(p);
  }
  return 0.0;
}

void HostTensor::set(int64_t i, double value) {
  unsigned char* p = storage_.data() + size_t(i) * dtype_size(dtype_);
  const float f = float(value);
  switch (dtype_) {
    case DType::f32: store(p, f); break;
    case DType::f64: store(p, value); break;
    case DType::f16: store(p, core::float_to_fp16(f)); break;
    case DType::bf16: store(p, core::float_to_bf16(f)); break;
    case DType::e4m3: *p = core::float_to_e4m3(f); break;
    case DType::i32: store(p, int32_t(std::lround(value))); break;
  }
}

void HostTensor::fill_uniform(std::mt19937_64& rng, double scale) {
  std::uniform_real_distribution<double> uniform(-scale, scale);
  const int64_t n = numel();
  for (int64_t i = 0; i < n; ++i) set(i, uniform(rng));
}

HostTensor int32_tensor(const std::vector<int32_t>& values) {
  HostTensor t(DType::i32, {int64_t(values.size())});
  if (!values.empty()) std::memcpy(t.data(), values.data(), values.size() * sizeof(int32_t));
  return t;
}

void fill_rotary_tables(HostTensor& cos, HostTensor& sin) {
  const int64_t positions = cos.shape()[0];
  const int64_t half = cos.shape()[1];
  for (int64_t pos = 0; pos < positions; ++pos) {
    for (int64_t i = 0; i < half; ++i) {
      const double inverse_frequency = std::pow(10000.0, -double(i) / double(half));
      const double angle = double(pos) * inverse_frequency;
      cos.set(pos * half + i, std::cos(angle));
      sin.set(pos * half + i, std::sin(angle));
    }
  }
}

const char* short_dtype_name(DType dtype) {
  switch (dtype) {
    case DType::bf16: return "bf16";
    case DType::f16: return "fp16";
    case DType::f32: return "fp32";
    case DType::e4m3: return "fp8";
    case DType::i32: return "i32";
    case DType::f64: return "f64";
  }
  return "?";
}

DType parse_dtype(const std::string& name) {
  if (name == "bf16" || name == "bfloat16") return DType::bf16;
  if (name == "fp16" || name == "f16" || name == "float16") return DType::f16;
  if (name == "fp32" || name == "f32" || name == "float32") return DType::f32;
  if (name == "fp8" || name == "e4m3") return DType::e4m3;
  throw UsageError{"unknown dtype '" + name + "' (expected bf16, fp16, fp32 or fp8)"};
}

}  // namespace kvflash::tools
