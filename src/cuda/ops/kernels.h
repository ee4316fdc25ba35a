// Host-side launchers of the kernels every family shares (one .cu file each); backend.cu
// sequences them around a family's attention launcher.
// Every launcher enqueues on `stream` and neither allocates nor synchronises.
#pragma once

#include <cuda_runtime.h>

#include "cuda/common/params.h"

namespace kvflash::cuda {

// append_kv.cu: new K/V rows (K rotated when rotary is on) into the cache at cache_seqlens[b] + t.
template <class Elem>
void launch_append_kv(const AppendParams& p, int max_new_rows, cudaStream_t stream);
// append_kv.cu: q rotated (contract 5.2) into a workspace copy the attention kernel reads.
template <class Elem>
void launch_rotate_q(const RotateQParams& p, cudaStream_t stream);

// combine.cu: split partials into out (of out_type) and LSE.
// overlap_previous (sm_90+): launched to overlap the attention kernel before it (launch.cuh).
void launch_combine(const CombineParams& p, ElemType out_type, bool overlap_previous, cudaStream_t stream);

// prepare.cu: per-batch split counts and split columns (PrepareParams).
void launch_prepare(const PrepareParams& p, cudaStream_t stream);

}  // namespace kvflash::cuda
