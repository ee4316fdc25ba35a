// One attention instantiation (bf16, head dims 128 / 128); see attention_kernel.cuh.
#include "cuda/attention_kernel.cuh"

namespace kvflash::cuda {
template void launch_attention<__nv_bfloat16, 128, 128>(const AttentionParams&, cudaStream_t);
}  // namespace kvflash::cuda
