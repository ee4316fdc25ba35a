// One attention instantiation (fp16, head dims 192 / 128); see attention_kernel.cuh.
#include "cuda/attention_kernel.cuh"

namespace kvflash::cuda {
template void launch_attention<__half, 192, 128>(const AttentionParams&, cudaStream_t);
}  // namespace kvflash::cuda
