// Every limit of kvflash in one place, and KVFLASH_HD (host + device inline), so the planner,
// the validation, the CUDA host code and the kernels read the same numbers. Plain C++: includable
// from host code compiled without nvcc and from device code.
#pragma once

#if !defined(KVFLASH_HD)
#if defined(__CUDACC__)
#define KVFLASH_HD __host__ __device__ __forceinline__
#else
#define KVFLASH_HD inline
#endif
#endif

namespace kvflash::core {

// Splits (docs/contract.md section 6): a caller may ask for up to kMaxSplits (out_accum has that
// many rows at most; the combine kernel keeps one scale per split in shared memory); FA3's
// heuristic never picks more than kMaxHeuristicSplits.
constexpr int kMaxSplits = 256;
constexpr int kMaxHeuristicSplits = 128;
// Per-sequence (dynamic) splits are computed for batches up to this size (one prepare CTA, one
// sequence per thread); beyond it every sequence gets one split.
constexpr int kMaxDynamicSplitBatch = 992;

// Head dims: the contract allows up to kMaxHeadDim (V up to kMaxHeadDimV for 16-bit inputs).
constexpr int kMaxHeadDim = 256;
constexpr int kMaxHeadDimV = 512;
// The CUDA kernels: head dims that are a multiple of kCudaHeadDimMultiple (16-byte rows of 16-bit
// elements), at most kCudaMaxHeadDim, rounded up to one of the instantiated sizes
// (core/tile_size.h round_up_headdim); the combine takes V rows up to kCudaMaxHeadDim too.
constexpr int kCudaMaxHeadDim = 256;
constexpr int kCudaHeadDimMultiple = 8;
// Rows the CUDA kernels copy 16 bytes at a time: tensors' rows must start on this boundary.
constexpr int kCudaRowAlignBytes = 16;

// CUDA grid: y and z extents are at most 65535 (x: 2^31 - 1).
constexpr long long kCudaMaxGridX = 2147483647ll;
constexpr int kCudaMaxGridYZ = 65535;

}  // namespace kvflash::core
