// One attention instantiation (bf16, head dims 96 / 96); see attention_kernel.cuh.
#include "cuda/attention_kernel.cuh"

namespace kvflash::cuda {
template void launch_attention<__nv_bfloat16, 96, 96>(const AttentionParams&, cudaStream_t);
}  // namespace kvflash::cuda
