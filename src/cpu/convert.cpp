#include "cpu/convert.h"

#include <array>
#include <cstring>

#include "core/numeric.h"

namespace kvflash::cpu {
namespace {

// All 256 e4m3 values: a table lookup is faster than decoding bit fields per element.
const std::array<float, 256>& e4m3_table() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int i = 0; i < 256; ++i) t[i] = core::e4m3_to_float(uint8_t(i));
    return t;
  }();
  return table;
}

// Whole rows (queries, rotary tables, rows being rotated): the attention kernels convert K/V
// elements in registers themselves (microkernels.h), so these plain loops are off the hot path.
void load_f16(const uint16_t* src, int n, float* dst) {
  for (int i = 0; i < n; ++i) dst[i] = core::fp16_to_float(src[i]);
}

void load_bf16(const uint16_t* src, int n, float* dst) {
  for (int i = 0; i < n; ++i) dst[i] = core::bf16_to_float(src[i]);
}

void load_e4m3(const uint8_t* src, int n, float* dst) {
  const float* table = e4m3_values();
  for (int i = 0; i < n; ++i) dst[i] = table[src[i]];
}

}  // namespace

const float* e4m3_values() { return e4m3_table().data(); }

void load_row(DType dtype, const void* src, int n, float* dst) {
  switch (dtype) {
    case DType::f32: std::memcpy(dst, src, size_t(n) * sizeof(float)); return;
    case DType::f16: load_f16(static_cast<const uint16_t*>(src), n, dst); return;
    case DType::bf16: load_bf16(static_cast<const uint16_t*>(src), n, dst); return;
    case DType::e4m3: load_e4m3(static_cast<const uint8_t*>(src), n, dst); return;
    default: break;
  }
  for (int i = 0; i < n; ++i) dst[i] = load_scalar(dtype, static_cast<const char*>(src) + i * dtype_size(dtype));
}

void store_row(DType dtype, const float* src, int n, void* dst) {
  switch (dtype) {
    case DType::f32: std::memcpy(dst, src, size_t(n) * sizeof(float)); return;
    case DType::f16: {
      auto* d = static_cast<uint16_t*>(dst);
      for (int i = 0; i < n; ++i) d[i] = core::float_to_fp16(src[i]);
      return;
    }
    case DType::bf16: {
      auto* d = static_cast<uint16_t*>(dst);
      for (int i = 0; i < n; ++i) d[i] = core::float_to_bf16(src[i]);
      return;
    }
    case DType::e4m3: {
      auto* d = static_cast<uint8_t*>(dst);
      for (int i = 0; i < n; ++i) d[i] = core::float_to_e4m3(src[i]);
      return;
    }
    case DType::f64: {
      auto* d = static_cast<double*>(dst);
      for (int i = 0; i < n; ++i) d[i] = src[i];
      return;
    }
    case DType::i32: break;
  }
  auto* d = static_cast<int32_t*>(dst);
  for (int i = 0; i < n; ++i) d[i] = int32_t(src[i]);
}

void round_row(DType dtype, float* x, int n) {
  switch (dtype) {
    case DType::f16: for (int i = 0; i < n; ++i) x[i] = core::fp16_to_float(core::float_to_fp16(x[i])); return;
    case DType::bf16: for (int i = 0; i < n; ++i) x[i] = core::bf16_to_float(core::float_to_bf16(x[i])); return;
    case DType::e4m3: for (int i = 0; i < n; ++i) x[i] = core::e4m3_to_float(core::float_to_e4m3(x[i])); return;
    default: return;
  }
}

float load_scalar(DType dtype, const void* src) {
  switch (dtype) {
    case DType::f32: { float x; std::memcpy(&x, src, 4); return x; }
    case DType::f16: { uint16_t h; std::memcpy(&h, src, 2); return core::fp16_to_float(h); }
    case DType::bf16: { uint16_t h; std::memcpy(&h, src, 2); return core::bf16_to_float(h); }
    case DType::e4m3: return core::e4m3_to_float(*static_cast<const uint8_t*>(src));
    case DType::i32: { int32_t x; std::memcpy(&x, src, 4); return float(x); }
    case DType::f64: { double x; std::memcpy(&x, src, 8); return float(x); }
  }
  return 0.0f;
}

}  // namespace kvflash::cpu
