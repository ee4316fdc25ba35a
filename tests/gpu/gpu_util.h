// Helpers the GPU runner's files share: CUDA error checks and device copies of host views.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <vector>

#include "kvflash/tensor.h"

namespace kvflash::gpu_test {

inline void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    std::fprintf(stderr, "CUDA error in %s: %s\n", what, cudaGetErrorString(status));
    std::exit(2);
  }
}

inline size_t span_bytes(const TensorView& t) {
  if (t.numel() == 0) return 0;
  int64_t span = 1;
  for (int i = 0; i < t.rank; ++i) span += (t.shape[i] - 1) * t.strides[i];
  return size_t(span) * dtype_size(t.dtype);
}

// Device copies of host views, freed together.
class DeviceMirror {
 public:
  ~DeviceMirror() {
    for (void* p : allocations_) cudaFree(p);
  }
  TensorView upload(const TensorView& host) {
    TensorView dev = host;
    const size_t bytes = span_bytes(host);
    check(cudaMalloc(&dev.data, std::max<size_t>(bytes, 16)), "cudaMalloc");
    allocations_.push_back(dev.data);
    if (bytes) check(cudaMemcpy(dev.data, host.data, bytes, cudaMemcpyHostToDevice), "upload");
    dev.device = Device{DeviceType::cuda, 0};
    return dev;
  }
  OptTensor upload(const OptTensor& host) { return host ? OptTensor(upload(*host)) : std::nullopt; }
  static void reupload(const TensorView& host, const TensorView& dev) {
    const size_t bytes = span_bytes(host);
    if (bytes) check(cudaMemcpy(dev.data, host.data, bytes, cudaMemcpyHostToDevice), "reupload");
  }
  static void download(const TensorView& host, const TensorView& dev) {
    const size_t bytes = span_bytes(host);
    if (bytes) check(cudaMemcpy(host.data, dev.data, bytes, cudaMemcpyDeviceToHost), "download");
  }

 private:
  std::vector<void*> allocations_;
};

}  // namespace kvflash::gpu_test
