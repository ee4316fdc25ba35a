// One sm_90a prefill instantiation (bf16, head dim 192); see prefill_rungs.cuh.
#include "cuda/sm90/prefill_rungs.cuh"

namespace kvflash::cuda::sm90 {
template void launch_prefill_rung<__nv_bfloat16, 192, 192>(const AttentionParams&, int, int, cudaStream_t);
}  // namespace kvflash::cuda::sm90
