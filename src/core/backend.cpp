// Which backend serves a device, and what the planner needs to know about the device.
#include "core/backend.h"

#include <thread>

#include "core/planner.h"

namespace kvflash::core {

Backend& backend_for(Device device) {
  switch (device.type) {
    case DeviceType::cpu: return cpu_backend();
    case DeviceType::cuda: {
      Backend* cuda = cuda_backend();
      if (cuda == nullptr) {
        throw Error(ErrorKind::unsupported, "",
                    "kvflash was built without the CUDA backend (tensors are on " +
                        device_name(device) + ")");
      }
      if (!cuda_available()) {
        throw Error(ErrorKind::unsupported, "",
                    "no CUDA device is available (tensors are on " + device_name(device) + ")");
      }
      return *cuda;
    }
  }
  throw Error(ErrorKind::invalid_type, "",
              "unknown device type " + std::to_string(static_cast<int32_t>(device.type)) +
                  " (expected cpu or cuda)");
}

DeviceInfo device_info(Device device) {
  if (device.type == DeviceType::cuda) {
    backend_for(device);  // the same message as a call when the backend or device is missing
    return cuda_device_info(device.id);
  }
  DeviceInfo info;
  // Read once: glibc answers hardware_concurrency() by reading sysfs (~2 us a call on Linux).
  static const unsigned threads = std::thread::hardware_concurrency();
  info.num_sms = threads > 0 ? static_cast<int>(threads) : 1;
  info.arch = 0;
  return info;
}

}  // namespace kvflash::core
