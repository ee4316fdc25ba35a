// Small owning host tensors for the CPU backend tests (test_cpu_*.cpp).
#pragma once

#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <vector>

#include "core/numeric.h"
#include "kvflash/args.h"
#include "kvflash/tensor.h"

namespace kvflash::cpu_test {

inline constexpr float kInf = std::numeric_limits<float>::infinity();

// A contiguous host tensor of any dtype, readable and writable as float.
class HostTensor {
 public:
  HostTensor(DType dtype, std::initializer_list<int64_t> shape) : dtype_(dtype) {
    int64_t n = 1;
    for (int64_t s : shape) n *= s;
    bytes_.assign(size_t(n) * dtype_size(dtype), 0);
    view_ = TensorView::contiguous(bytes_.data(), dtype, shape);
  }
  HostTensor(const HostTensor&) = delete;  // view_ points into bytes_
  HostTensor(HostTensor&&) = default;      // a moved vector keeps its buffer
  const TensorView& view() const { return view_; }
  operator TensorView() const { return view_; }
  int64_t numel() const { return view_.numel(); }

  float get(int64_t i) const {
    const unsigned char* p = bytes_.data() + size_t(i) * dtype_size(dtype_);
    uint16_t h;
    switch (dtype_) {
      case DType::f32: { float f; std::memcpy(&f, p, 4); return f; }
      case DType::f16: std::memcpy(&h, p, 2); return core::fp16_to_float(h);
      case DType::bf16: std::memcpy(&h, p, 2); return core::bf16_to_float(h);
      case DType::e4m3: return core::e4m3_to_float(*p);
      case DType::i32: { int32_t x; std::memcpy(&x, p, 4); return float(x); }
      default: return 0.0f;
    }
  }
  void set(int64_t i, float x) {
    unsigned char* p = bytes_.data() + size_t(i) * dtype_size(dtype_);
    uint16_t h;
    switch (dtype_) {
      case DType::f32: std::memcpy(p, &x, 4); return;
      case DType::f16: h = core::float_to_fp16(x); std::memcpy(p, &h, 2); return;
      case DType::bf16: h = core::float_to_bf16(x); std::memcpy(p, &h, 2); return;
      case DType::e4m3: *p = core::float_to_e4m3(x); return;
      case DType::i32: { int32_t v = int32_t(x); std::memcpy(p, &v, 4); return; }
      default: return;
    }
  }
  // Element offset of a multi-index (contiguous layout).
  int64_t at(std::initializer_list<int64_t> index) const {
    int64_t o = 0;
    int d = 0;
    for (int64_t i : index) o += i * view_.strides[d++];
    return o;
  }
  float get(std::initializer_list<int64_t> index) const { return get(at(index)); }
  void set(std::initializer_list<int64_t> index, float x) { set(at(index), x); }
  void fill(float x) { for (int64_t i = 0; i < numel(); ++i) set(i, x); }
  // Deterministic values in [-1, 1), rounded to the dtype.
  void fill_random(uint64_t seed) {
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
    for (int64_t i = 0; i < numel(); ++i) {
      s = s * 6364136223846793005ull + 1442695040888963407ull;
      set(i, float(double(s >> 40) / double(1ull << 24) * 2.0 - 1.0));
    }
  }
  const std::vector<unsigned char>& bytes() const { return bytes_; }

 private:
  DType dtype_;
  std::vector<unsigned char> bytes_;
  TensorView view_;
};

inline HostTensor int_tensor(std::initializer_list<int32_t> values) {
  HostTensor t(DType::i32, {int64_t(values.size())});
  int64_t i = 0;
  for (int32_t v : values) t.set(i++, float(v));
  return t;
}

// The arguments most tests start from: q against k_cache / v_cache with per-sequence lengths
// (and, when given, new k / v to append). Each test then sets what it is about.
inline KvCacheArgs cache_call(const HostTensor& q, const HostTensor& k_cache, const HostTensor& v_cache,
                              const HostTensor& seqlens) {
  KvCacheArgs args;
  args.q = q;
  args.k_cache = k_cache;
  args.v_cache = v_cache;
  args.cache_seqlens = seqlens;
  return args;
}

}  // namespace kvflash::cpu_test
