// HostTensor: an owning, contiguous host buffer with a dtype and a shape, the form in which the
// kvflash program builds inputs and reads results (element access through float / int32).
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "kvflash/tensor.h"

namespace kvflash::tools {

class HostTensor {
 public:
  HostTensor() = default;
  HostTensor(DType dtype, std::vector<int64_t> shape);  // zero-filled

  DType dtype() const { return dtype_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  int64_t numel() const;
  size_t bytes() const { return storage_.size(); }
  void* data() { return storage_.data(); }
  const void* data() const { return storage_.data(); }
  TensorView view();

  // Float dtypes (f32, f16, bf16, f64): element i in row-major order.
  double get(int64_t i) const;
  void set(int64_t i, double value);  // rounded to nearest even
  int32_t* i32() { return reinterpret_cast<int32_t*>(storage_.data()); }
  const int32_t* i32() const { return reinterpret_cast<const int32_t*>(storage_.data()); }

  // Independent uniform values in [-scale, scale] (float dtypes).
  void fill_uniform(std::mt19937_64& rng, double scale);

 private:
  DType dtype_ = DType::f32;
  std::vector<int64_t> shape_;
  std::vector<unsigned char> storage_;
};

// A row-major view of `data` with this dtype and shape.
TensorView contiguous_view(void* data, DType dtype, const std::vector<int64_t>& shape,
                           Device device = {});

// An int32 (n,) tensor holding `values`.
HostTensor int32_tensor(const std::vector<int32_t>& values);

// Rotary tables (seqlen_ro, rotary_dim / 2) of the usual RoPE frequencies, base 10000.
void fill_rotary_tables(HostTensor& cos, HostTensor& sin);

// "bf16", "fp16", "fp32", "fp8", "i32", "f64": the names the flags take.
const char* short_dtype_name(DType dtype);

// DType from a name: "bf16", "fp16"/"f16", "fp32"/"f32", "fp8"/"e4m3". Throws UsageError.
DType parse_dtype(const std::string& name);

}  // namespace kvflash::tools
