// Per-device caches for what the host path would otherwise ask the CUDA runtime on every call: a
// device's attributes (backend.cu) and a kernel's dynamic shared-memory opt-in (launch.cuh).
// A slot per device id, filled by the first call on that device and never changed after. Safe
// under concurrent calls from several threads: racing first calls compute the same value and
// store it twice. Devices past the slots are not cached (asked every call, as before).
//
// The values belong to the device's primary context: a cudaDeviceReset() between calls would
// drop the runtime's side of them while these slots keep theirs, so calls after one are not
// supported (as for every library that caches per-device state).
#pragma once

#include <array>
#include <atomic>
#include <cstdint>

namespace kvflash::cuda {

inline constexpr int kCachedDevices = 64;

// One 64-bit value per device, 0 meaning "not known yet" (callers store non-zero values).
class PerDeviceValue {
 public:
  uint64_t get(int device) const {
    return in_range(device) ? slots_[device].load(std::memory_order_acquire) : 0;
  }
  void set(int device, uint64_t value) {
    if (in_range(device)) slots_[device].store(value, std::memory_order_release);
  }

 private:
  static bool in_range(int device) { return device >= 0 && device < kCachedDevices; }
  std::array<std::atomic<uint64_t>, kCachedDevices> slots_{};
};

}  // namespace kvflash::cuda
