// One attention instantiation (fp16, head dims 192 / 192); see attention_launch.cuh.
#include "cuda/attention_launch.cuh"

namespace kvflash::cuda {
template void launch_attention<__half, 192, 192>(const AttentionParams&, bool, cudaStream_t);
}  // namespace kvflash::cuda
