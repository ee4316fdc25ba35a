// The seam between the kvflash program and the device its tensors live on. Commands allocate
// every tensor the library reads or writes through a DeviceMemory, build their inputs on the host
// (HostTensor) and upload them; results come back with download(). The CPU implementation is
// plain host memory; the CUDA one (device_cuda.cpp) is built when the CUDA backend is.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "host_tensor.h"
#include "kvflash/tensor.h"

namespace kvflash::tools {

// The ceilings a device's figures are set against, measured in the same run.
struct DeviceCeilings {
  double bandwidth_gbs = 0;  // streaming memory bandwidth, 1e9 bytes per second
  double matmul_gflops = 0;  // dense matrix product
  std::string bandwidth_what;  // how each was measured, for the table's footer
  std::string matmul_what;
};

class DeviceMemory {
 public:
  virtual ~DeviceMemory() = default;
  virtual Device device() const = 0;
  virtual std::string description() const = 0;  // "cpu, 2 threads", "cuda:0 NVIDIA H200"
  // Zero-filled memory on the device; give it back with release().
  virtual void* allocate(size_t bytes) = 0;
  virtual void release(void* data) = 0;
  virtual void upload(void* device_dst, const void* host_src, size_t bytes) = 0;
  virtual void download(void* host_dst, const void* device_src, size_t bytes) = 0;
  // Waits for all queued work (before reading a clock).
  virtual void synchronize() = 0;
  // What RunOptions::stream should be (nullptr: the default stream / the CPU).
  virtual void* stream() const { return nullptr; }
  // Measures the ceilings (a few seconds); bandwidth_bytes sizes the streamed buffer.
  virtual DeviceCeilings measure_ceilings(size_t bandwidth_bytes, int num_threads) = 0;
  // Milliseconds of each of `repeats` passes of `pass` (which queues its work on stream()), after
  // `warmup` untimed passes. Here: the host clock around each pass. CUDA overrides it with one
  // pass captured as a CUDA graph and replayed between events, so host launch costs are not
  // counted, as in a serving engine's captured decode step.
  virtual std::vector<double> time_passes(const std::function<void()>& pass, int warmup, int repeats);
  // The same, each pass enqueued eagerly (no graph): on CUDA the host's work per call counts
  // wherever it is slower than the GPU's, as for an engine's eager prefill. Here: time_passes.
  virtual std::vector<double> time_eager_passes(const std::function<void()>& pass, int warmup, int repeats) {
    return time_passes(pass, warmup, repeats);
  }
};

// "cpu", "cuda" or "auto" (cuda when kvflash::cuda_available(), else cpu).
std::unique_ptr<DeviceMemory> make_device_memory(const std::string& choice, int num_threads);
std::unique_ptr<DeviceMemory> make_cpu_memory(int num_threads);
// Throws kvflash::Error(unsupported) when this build has no CUDA support.
std::unique_ptr<DeviceMemory> make_cuda_memory(int device_id);

// A tensor in device memory, released when the last copy goes.
class DeviceTensor {
 public:
  DeviceTensor() = default;
  DeviceTensor(DeviceMemory& memory, DType dtype, std::vector<int64_t> shape);  // zero-filled

  TensorView view() const;
  DType dtype() const { return dtype_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  size_t bytes() const;
  void* data() const { return storage_.get(); }

  void upload(const HostTensor& host);  // same dtype and element count
  HostTensor download() const;          // the whole tensor, same shape

 private:
  DeviceMemory* memory_ = nullptr;
  DType dtype_ = DType::f32;
  std::vector<int64_t> shape_;
  std::shared_ptr<void> storage_;
};

DeviceTensor to_device(DeviceMemory& memory, const HostTensor& host);

}  // namespace kvflash::tools
