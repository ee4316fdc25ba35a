// The CUDA side of the device seam. Compiled for real when the build defines
// KVFLASH_WITH_CUDA (and links CUDA::cudart to kvflash_cli); otherwise asking for CUDA is an
// Error(unsupported) naming --device.
#include "device.h"
#include "kvflash/errors.h"

#if defined(KVFLASH_WITH_CUDA)
#include <cuda_runtime.h>
#endif

namespace kvflash::tools {

#if defined(KVFLASH_WITH_CUDA)

namespace {

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    throw Error(ErrorKind::device_failure, "--device",
                std::string(what) + " failed: " + cudaGetErrorString(status));
  }
}

class CudaMemory final : public DeviceMemory {
 public:
  explicit CudaMemory(int device_id) : device_id_(device_id) {
    check(cudaSetDevice(device_id), "cudaSetDevice");
    check(cudaGetDeviceProperties(&properties_, device_id), "cudaGetDeviceProperties");
  }
  Device device() const override { return Device{DeviceType::cuda, device_id_}; }
  std::string description() const override {
    return "cuda:" + std::to_string(device_id_) + " " + properties_.name;
  }
  void* allocate(size_t bytes) override {
    void* data = nullptr;
    check(cudaMalloc(&data, bytes == 0 ? 1 : bytes), "cudaMalloc");
    check(cudaMemset(data, 0, bytes), "cudaMemset");
    return data;
  }
  void release(void* data) override { cudaFree(data); }
  void upload(void* dst, const void* src, size_t bytes) override {
    check(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), "cudaMemcpy (upload)");
  }
  void download(void* dst, const void* src, size_t bytes) override {
    check(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy (download)");
  }
  void synchronize() override { check(cudaDeviceSynchronize(), "cudaDeviceSynchronize"); }

 private:
  int device_id_;
  cudaDeviceProp properties_{};
};

}  // namespace

std::unique_ptr<DeviceMemory> make_cuda_memory(int device_id) {
  return std::make_unique<CudaMemory>(device_id);
}

#else

std::unique_ptr<DeviceMemory> make_cuda_memory(int) {
  throw Error(ErrorKind::unsupported, "--device",
              "this kvflash program was built without CUDA support (--device cuda)");
}

#endif

}  // namespace kvflash::tools
