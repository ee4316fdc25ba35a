// Built when the CUDA backend is not: no CUDA backend, no device.
#include "core/backend.h"

namespace kvflash {
namespace core {
Backend* cuda_backend() { return nullptr; }
}  // namespace core
bool cuda_available() { return false; }
}  // namespace kvflash
