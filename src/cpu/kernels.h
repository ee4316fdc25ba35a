// The CPU backend's steps, one file each: append (append_kv.cpp), attention (attention.cpp),
// merging split partials (combine.cpp). backend.cpp sequences them.
#pragma once

#include <algorithm>
#include <cstddef>

#include "core/problem.h"
#include "kvflash/kvflash.h"

namespace kvflash::cpu {

// Step 1: every new K/V row into the cache at cache_seqlens[b] + t (K rotated when rotary is on).
void append_kv(const core::Problem& p, int num_threads);

// Where the split partials live: FA3-shaped fp32 views, caller's (out_accum) or workspace.
struct Partials {
  TensorView out;  // (splits, b, h, s_q, d_v) | (splits, h, total_q, d_v)
  TensorView lse;  // (splits, b, h, s_q) | (splits, h, total_q)
};

// Splits batch element b uses (plan.num_splits_dynamic[b], within [1, plan.num_splits]).
inline int splits_of(const Plan& plan, int b) {
  if (plan.num_splits <= 1) return 1;
  const int n = b < int(plan.num_splits_dynamic.size()) ? plan.num_splits_dynamic[size_t(b)] : plan.num_splits;
  return std::clamp(n, 1, plan.num_splits);
}

// Step 2/3: attention for every (batch, query row, head). With plan.num_splits == 1 writes
// outputs.out / softmax_lse; otherwise every split's partial into `partials` (all slices of every
// batch, empty ones as out 0 / LSE -inf). attend() runs the copy of attention.cpp compiled for
// the active instruction-set level (cpu/isa.h).
using AttendFn = void(const core::Problem& p, const Plan& plan, const Outputs& outputs, const Partials* partials,
                      int num_threads);
AttendFn attend;
namespace baseline { AttendFn attend; }
#if KVFLASH_CPU_X86_LEVELS
namespace avx2 { AttendFn attend; }
namespace avx512 { AttendFn attend; }
#elif KVFLASH_CPU_ARM_LEVELS
namespace neon { AttendFn attend; }
#endif
#if KVFLASH_CPU_AVX512_BF16_LEVEL
namespace avx512_bf16 { AttendFn attend; }
#endif

// Merges n partials of one row through their LSE: out_rows[s * out_stride + c], lse[s * lse_stride].
// Writes the merged fp32 row to `merged` (d values) and returns the merged LSE. Empty splits
// (LSE -inf) add nothing; all empty gives 0 and -inf.
float merge_partials(int n, const float* lse, int64_t lse_stride, const float* out_rows,
                     int64_t out_stride, int d, float* merged);

// Step 3 (combine): partials of every (batch, row, head) into outputs.out / softmax_lse.
void combine_split_partials(const core::Problem& p, const Plan& plan, const Outputs& outputs,
                            const Partials& partials, int num_threads);

// FA3's flash_attn_combine on host tensors (kvflash::combine).
void combine_tensors(const TensorView& out_partial, const TensorView& lse_partial,
                     const TensorView& out, const OptTensor& lse, int num_threads);

}  // namespace kvflash::cpu
