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

// Head dims: the contract allows up to kMaxHeadDim (V up to kMaxHeadDimV for 16-bit queries).
constexpr int kMaxHeadDim = 256;
constexpr int kMaxHeadDimV = 512;
// The CUDA kernels: head dims that are a multiple of kCudaHeadDimMultiple (16-byte rows of 16-bit
// elements), d at most kCudaMaxHeadDim and d_v at most kCudaMaxHeadDimV, rounded up to one of the
// instantiated sizes (core/kernel_family.h instance_dims); the combine takes V rows up to
// kCudaMaxHeadDimV too.
constexpr int kCudaMaxHeadDim = 256;
constexpr int kCudaMaxHeadDimV = 512;
// The sm80 family's prefill kernel at d_v 512 (MLA with more than 16 packed query rows per KV
// head) takes kCudaMla512PrefillSmemKB of shared memory per CTA (cuda/sm80/prefill_kernel.cuh
// checks its own figure against it): GPUs whose CTAs may opt in to that much run it (sm_80,
// sm_87: 163 KB; sm_90, sm_100, sm_103: 227 KB); sm_86, sm_89 and sm_120 (99 KB) do not.
constexpr int kCudaMla512PrefillSmemKB = 151;
KVFLASH_HD constexpr int cuda_max_smem_per_cta_kb(int arch) {
  return arch == 80 || arch == 87 ? 163 : arch == 90 || arch == 100 || arch == 103 ? 227 : 99;
}
constexpr int kCudaHeadDimMultiple = 8;
// Rows the CUDA kernels copy 16 bytes at a time: tensors' rows must start on this boundary.
constexpr int kCudaRowAlignBytes = 16;

// CUDA grid: y and z extents are at most 65535 (x: 2^31 - 1).
constexpr long long kCudaMaxGridX = 2147483647ll;
constexpr int kCudaMaxGridYZ = 65535;

}  // namespace kvflash::core
