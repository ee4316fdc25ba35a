#include "device.h"

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <thread>

#include "ceilings.h"
#include "kvflash/errors.h"
#include "kvflash/kvflash.h"
#include "options.h"

namespace kvflash::tools {

namespace {

class CpuMemory final : public DeviceMemory {
 public:
  explicit CpuMemory(int num_threads) : num_threads_(num_threads) {}
  Device device() const override { return Device{DeviceType::cpu, 0}; }
  std::string description() const override {
    const int threads = num_threads_ > 0 ? num_threads_ : int(std::thread::hardware_concurrency());
    return "cpu, " + std::to_string(threads) + " thread" + (threads == 1 ? "" : "s");
  }
  void* allocate(size_t bytes) override {
    // 64-byte aligned so the backend's vector loads never straddle a cache line at row starts.
    const size_t rounded = (bytes + 63) / 64 * 64;
    void* data = std::aligned_alloc(64, rounded == 0 ? 64 : rounded);
    if (!data) throw std::bad_alloc();
    std::memset(data, 0, rounded);
    return data;
  }
  void release(void* data) override { std::free(data); }
  void upload(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }
  void download(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }
  void synchronize() override {}
  DeviceCeilings measure_ceilings(size_t bandwidth_bytes, int num_threads) override {
    DeviceCeilings c;
    c.bandwidth_gbs = measure_read_bandwidth(bandwidth_bytes, num_threads, 5);
    c.matmul_gflops = measure_gemm_gflops(1024, num_threads, 3);
    c.bandwidth_what = "memory read, " + std::to_string(bandwidth_bytes >> 20) + " MiB buffer, best of 5";
    c.matmul_what = "fp32 GEMM 1024^3, best of 3";
    return c;
  }

 private:
  int num_threads_;
};

}  // namespace

std::vector<double> DeviceMemory::time_passes(const std::function<void()>& pass, int warmup,
                                              int repeats) {
  using Clock = std::chrono::steady_clock;
  for (int w = 0; w < warmup; ++w) pass();
  std::vector<double> ms;
  for (int r = 0; r < repeats; ++r) {
    synchronize();
    const auto start = Clock::now();
    pass();
    synchronize();
    ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - start).count());
  }
  return ms;
}

std::unique_ptr<DeviceMemory> make_cpu_memory(int num_threads) {
  return std::make_unique<CpuMemory>(num_threads);
}

std::unique_ptr<DeviceMemory> make_device_memory(const std::string& choice, int num_threads) {
  if (choice == "cpu") return make_cpu_memory(num_threads);
  if (choice == "cuda") return make_cuda_memory(0);
  if (choice == "auto") {
    return cuda_available() ? make_cuda_memory(0) : make_cpu_memory(num_threads);
  }
  throw UsageError{"--device must be cpu, cuda or auto, got '" + choice + "'"};
}

DeviceTensor::DeviceTensor(DeviceMemory& memory, DType dtype, std::vector<int64_t> shape)
    : memory_(&memory), dtype_(dtype), shape_(std::move(shape)) {
  DeviceMemory* owner = memory_;
  storage_ = std::shared_ptr<void>(memory.allocate(bytes()),
                                   [owner](void* data) { owner->release(data); });
}

size_t DeviceTensor::bytes() const {
  size_t n = dtype_size(dtype_);
  for (int64_t s : shape_) n *= size_t(s);
  return n;
}

TensorView DeviceTensor::view() const {
  return contiguous_view(storage_.get(), dtype_, shape_, memory_ ? memory_->device() : Device{});
}

void DeviceTensor::upload(const HostTensor& host) {
  if (host.dtype() != dtype_ || host.bytes() != bytes()) {
    throw std::logic_error("DeviceTensor::upload: dtype or size differs");
  }
  memory_->upload(storage_.get(), host.data(), bytes());
}

HostTensor DeviceTensor::download() const {
  HostTensor host(dtype_, shape_);
  memory_->download(host.data(), storage_.get(), bytes());
  return host;
}

DeviceTensor to_device(DeviceMemory& memory, const HostTensor& host) {
  DeviceTensor t(memory, host.dtype(), host.shape());
  t.upload(host);
  return t;
}

}  // namespace kvflash::tools
