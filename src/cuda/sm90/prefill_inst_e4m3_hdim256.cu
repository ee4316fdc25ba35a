// One sm_90a prefill instantiation (fp8 e4m3: FA3's all-fp8 call, head dim 256); see prefill_rungs.cuh.
#include "cuda/sm90/prefill_rungs.cuh"

namespace kvflash::cuda::sm90 {
template void launch_prefill_rung<__nv_fp8_e4m3, 256, 256>(const AttentionParams&, int, int, cudaStream_t);
}  // namespace kvflash::cuda::sm90
