// Host-side launchers of the kernels every family shares (one .cu file each); backend.cu
// sequences them around a family's attention launcher.
// Every launcher enqueues on `stream` and neither allocates nor synchronises.
#pragma once

#include <cuda_runtime.h>

#include "cuda/common/params.h"

namespace kvflash::cuda {

// append_kv.cu: new K/V rows of type Src (K rotated when rotary is on) into a cache of type Cache
// at cache_seqlens[b] + t: a 16-bit cache of Src's type, or an fp8 e4m3 cache (quantised, contract
// 5.8, or bit copies from fp8 rows).
template <class Src, class Cache>
void launch_append_kv(const AppendParams& p, int max_new_rows, cudaStream_t stream);
// append_kv.cu: q or qv of type Src (q rotated, contract 5.2; scaled with qv over an fp8 cache,
// 5.8) into a workspace copy of type Dst the attention kernel reads (Src itself, e4m3 included, or
// bf16 for an fp8 q the kernel reads in 16 bits).
template <class Src, class Dst>
void launch_query_copy(const QueryCopyParams& p, cudaStream_t stream);

// combine.cu: split partials into out (of out_type) and LSE.
// overlap_previous (sm_90+): launched to overlap the attention kernel before it (launch.cuh).
void launch_combine(const CombineParams& p, ElemType out_type, bool overlap_previous, cudaStream_t stream);

// prepare.cu: per-batch split counts and split columns (PrepareParams).
void launch_prepare(const PrepareParams& p, cudaStream_t stream);

}  // namespace kvflash::cuda
