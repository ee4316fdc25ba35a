// TensorView: a non-owning view of a strided tensor, laid out like DLPack's DLTensor
// (pointer, dtype, device, rank, shape, strides in elements). No torch, no CUDA here.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>

namespace kvflash {

enum class DType : uint8_t { f32, f16, bf16, e4m3, i32, f64 };

// DLPack's device codes, so a DLTensor's device maps one to one.
enum class DeviceType : int32_t { cpu = 1, cuda = 2 };

struct Device {
  DeviceType type = DeviceType::cpu;
  int32_t id = 0;
  bool operator==(const Device&) const = default;
};

const char* dtype_name(DType dtype);
size_t dtype_size(DType dtype);
std::string device_name(Device device);

// DLPack (v1.1) dtype codes: kDLInt=0, kDLUInt=1, kDLFloat=2, kDLBfloat=4, kDLFloat8_e4m3fn=10.
std::optional<DType> dtype_from_dlpack(uint8_t code, uint8_t bits, uint16_t lanes);
void dtype_to_dlpack(DType dtype, uint8_t& code, uint8_t& bits);

constexpr int kMaxRank = 6;

struct TensorView {
  void* data = nullptr;
  DType dtype = DType::f32;
  Device device{};
  int rank = 0;
  int64_t shape[kMaxRank] = {};
  int64_t strides[kMaxRank] = {};  // in elements, like DLPack

  // Negative indices count from the back, as in Python.
  int64_t size(int dim) const { return shape[dim < 0 ? dim + rank : dim]; }
  int64_t stride(int dim) const { return strides[dim < 0 ? dim + rank : dim]; }
  int64_t numel() const;
  bool is_contiguous() const;  // row-major with no gaps
  std::string shape_string() const;  // "(2, 3, 4)"

  template <class T>
  T* ptr() const { return static_cast<T*>(data); }

  // A contiguous (row-major) view of `data`.
  static TensorView contiguous(void* data, DType dtype, std::initializer_list<int64_t> shape,
                               Device device = {});
  static TensorView strided(void* data, DType dtype, std::initializer_list<int64_t> shape,
                            std::initializer_list<int64_t> strides, Device device = {});
};

using OptTensor = std::optional<TensorView>;

// Builds a TensorView from any struct shaped like DLPack's DLTensor (data, device{device_type,
// device_id}, ndim, dtype{code, bits, lanes}, shape, strides, byte_offset), so callers need not
// share a dlpack.h with us. Returns nullopt for a dtype or rank kvflash does not take.
template <class DLTensorLike>
std::optional<TensorView> from_dlpack(const DLTensorLike& t) {
  auto dtype = dtype_from_dlpack(t.dtype.code, t.dtype.bits, t.dtype.lanes);
  if (!dtype || t.ndim < 0 || t.ndim > kMaxRank) return std::nullopt;
  TensorView v;
  v.data = static_cast<char*>(t.data) + t.byte_offset;
  v.dtype = *dtype;
  v.device = Device{static_cast<DeviceType>(t.device.device_type), t.device.device_id};
  v.rank = t.ndim;
  int64_t expected = 1;
  for (int i = t.ndim - 1; i >= 0; --i) {
    v.shape[i] = t.shape[i];
    v.strides[i] = t.strides ? t.strides[i] : expected;
    expected *= t.shape[i];
  }
  return v;
}

}  // namespace kvflash
