// Host-side launchers of the CUDA kernels (one .cu file each); backend.cu sequences them.
// Every launcher enqueues on `stream` and neither allocates nor synchronises.
#pragma once

#include <cuda_runtime.h>

#include "cuda/params.h"

namespace kvflash::cuda {

// append_kv.cu: new K/V rows (K rotated when rotary is on) into the cache at cache_seqlens[b] + t.
template <class Elem>
void launch_append_kv(const AppendParams& p, int max_new_rows, cudaStream_t stream);
// append_kv.cu: q rotated (spec 5.2) into a workspace copy the attention kernel reads.
template <class Elem>
void launch_rotate_q(const RotateQParams& p, cudaStream_t stream);

// attention_inst_*.cu: attention for one (dtype, head dims) instantiation. overlap_previous
// (sm_90+): launched to overlap the stream's previous kernel (launch.cuh).
template <class Elem, int kHeadDim, int kHeadDimV>
void launch_attention(const AttentionParams& p, bool overlap_previous, cudaStream_t stream);

// combine.cu: split partials into out (of out_type) and LSE.
// overlap_previous (sm_90+): launched to overlap the attention kernel before it (launch.cuh).
void launch_combine(const CombineParams& p, ElemType out_type, bool overlap_previous, cudaStream_t stream);

// prepare.cu: per-batch split counts on the device (kvflash's portable rule, core/split_rule.h)
// and the split columns of the attention grid.
struct PrepareParams {
  LengthParams len;
  int num_splits = 1;     // static upper bound
  SplitRule rule;
  int32_t* splits_out = nullptr;  // (batch,)
  SplitWork* work_out = nullptr;  // (num_work,): every split of every element, then unused;
  int num_work = 0;               // core::portable_split_columns (nullptr / 0: none wanted)
};
void launch_prepare(const PrepareParams& p, cudaStream_t stream);

}  // namespace kvflash::cuda
