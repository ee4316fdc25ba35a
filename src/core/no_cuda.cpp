// Built when the CUDA backend is not: no CUDA backend, no device.
#include "core/backend.h"

namespace kvflash {
namespace core {
Backend* cuda_backend() { return nullptr; }
DeviceInfo cuda_device_info(int) {
  throw Error(ErrorKind::unsupported, "", "kvflash was built without the CUDA backend");
}
}  // namespace core
bool cuda_available() { return false; }
}  // namespace kvflash
