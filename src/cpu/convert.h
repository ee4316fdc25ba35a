// Rows of a storage type (fp32, fp16, bf16, fp8 e4m3) to and from fp32 buffers, with the exact
// scalar conversions of core/numeric.h (stores round to nearest even). The attention kernels
// read K/V rows through microkernels.h instead, converting in registers.
#pragma once

#include <cstdint>

#include "kvflash/tensor.h"

namespace kvflash::cpu {

// dst[0..n) = src[0..n) as float. src has `dtype`.
void load_row(DType dtype, const void* src, int n, float* dst);

// dst[0..n) = round(src[0..n)) in `dtype`.
void store_row(DType dtype, const float* src, int n, void* dst);

// x[0..n) = float(round(x[0..n) in `dtype`)): the value a row has once stored as `dtype`.
void round_row(DType dtype, float* x, int n);

// All 256 e4m3 values, indexed by bits: a lookup is cheaper than decoding the bit fields.
const float* e4m3_values();

// One element, for the places that read a scalar (descales, sinks, lengths).
float load_scalar(DType dtype, const void* src);

}  // namespace kvflash::cpu
