// One sm_90a prefill instantiation (fp16, head dim 128); see prefill_launch.cuh.
#include "cuda/sm90/prefill_launch.cuh"

namespace kvflash::cuda::sm90 {
template void launch_prefill_rung<__half, 128>(const AttentionParams&, int, int, cudaStream_t);
}  // namespace kvflash::cuda::sm90
