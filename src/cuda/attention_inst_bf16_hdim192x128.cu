// One attention instantiation (bf16, head dims 192 / 128); see attention_launch.cuh.
#include "cuda/attention_launch.cuh"

namespace kvflash::cuda {
template void launch_attention<__nv_bfloat16, 192, 128>(const AttentionParams&, bool, cudaStream_t);
}  // namespace kvflash::cuda
