// The oracle's own reading of the storage types (fp32, fp16, bf16, float8 e4m3fn, int32), written
// from the IEEE / OCP formats and deliberately not shared with src/core/numeric.h, so that a wrong
// conversion in the backends cannot hide behind the same wrong conversion here.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>

#include "kvflash/tensor.h"

namespace kvflash::oracle {

double f16_to_double(uint16_t bits);
double bf16_to_double(uint16_t bits);
double e4m3_to_double(uint8_t bits);

// Round-to-nearest-even from fp32 (the precision the spec computes rotary in).
uint16_t float_to_f16(float x);
uint16_t float_to_bf16(float x);
uint8_t float_to_e4m3(float x);  // OCP e4m3fn; beyond 464 (no infinity) gives NaN
// The contract's quantisation into an fp8 cache (contract 5.8): as float_to_e4m3, but magnitudes
// beyond 448 (infinities included) give +-448; NaN stays NaN.
uint8_t float_to_e4m3_saturating(float x);

// Bytes per element (the oracle's own table; it links nothing from the library).
size_t storage_bytes(DType dtype);

// The raw bits of one element (zero-extended) and its value, `offset` in elements from data.
uint32_t element_bits(const TensorView& t, int64_t offset);
double element_value(const TensorView& t, int64_t offset);
void store_bits(const TensorView& t, int64_t offset, uint32_t bits);
// The value of `bits` interpreted as `dtype`.
double bits_value(DType dtype, uint32_t bits);
// fp32 `x` rounded to `dtype` (f32, f16, bf16, e4m3), as bits.
uint32_t round_to_storage(DType dtype, float x);
// The distance between adjacent values of `dtype` at magnitude |x| (normal or subnormal range).
double ulp(DType dtype, double x);

// Element offset of a multi-index, from the view's strides.
int64_t offset_of(const TensorView& t, std::initializer_list<int64_t> index);
int32_t int_at(const TensorView& t, int64_t i);  // (n,) int32, any stride

}  // namespace kvflash::oracle
