// The CUDA side of the device seam. Compiled for real when the build defines
// KVFLASH_WITH_CUDA (cuBLAS is loaded at run time, cublas.h); otherwise asking for CUDA is an
// Error(unsupported) naming --device. Every copy, fill and kernel goes to one
// stream of the program's own (non-blocking), so a timed pass can be captured as a CUDA graph.
#include "device.h"
#include "kvflash/errors.h"

#if defined(KVFLASH_WITH_CUDA)
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>

#include "cublas.h"
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

// Milliseconds between two events around what `enqueue` queues on `stream`.
template <class Enqueue>
float timed_on(cudaStream_t stream, Enqueue enqueue) {
  cudaEvent_t start, stop;
  check(cudaEventCreate(&start), "cudaEventCreate");
  check(cudaEventCreate(&stop), "cudaEventCreate");
  check(cudaEventRecord(start, stream), "cudaEventRecord");
  enqueue();
  check(cudaEventRecord(stop, stream), "cudaEventRecord");
  check(cudaEventSynchronize(stop), "timed work");
  float ms = 0;
  check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return ms;
}

void check_cublas(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS) {
    throw Error(ErrorKind::device_failure, "--device",
                std::string(what) + " failed: cuBLAS status " + std::to_string(int(status)));
  }
}

class CudaMemory final : public DeviceMemory {
 public:
  explicit CudaMemory(int device_id) : device_id_(device_id) {
    check(cudaSetDevice(device_id), "cudaSetDevice");
    check(cudaGetDeviceProperties(&properties_, device_id), "cudaGetDeviceProperties");
    check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
  }
  ~CudaMemory() override { cudaStreamDestroy(stream_); }
  Device device() const override { return Device{DeviceType::cuda, device_id_}; }
  std::string description() const override {
    return "cuda:" + std::to_string(device_id_) + " " + properties_.name;
  }
  void* allocate(size_t bytes) override {
    void* data = nullptr;
    check(cudaMalloc(&data, bytes == 0 ? 1 : bytes), "cudaMalloc");
    check(cudaMemsetAsync(data, 0, bytes, stream_), "cudaMemsetAsync");
    synchronize();
    return data;
  }
  void release(void* data) override { cudaFree(data); }
  void upload(void* dst, const void* src, size_t bytes) override {
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_), "cudaMemcpy (upload)");
    synchronize();
  }
  void download(void* dst, const void* src, size_t bytes) override {
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_), "cudaMemcpy (download)");
    synchronize();
  }
  void synchronize() override { check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize"); }
  void* stream() const override { return stream_; }

  DeviceCeilings measure_ceilings(size_t bandwidth_bytes, int) override {
    DeviceCeilings c;
    c.bandwidth_gbs = copy_bandwidth_gbs(bandwidth_bytes);
    c.bandwidth_what = "device-to-device copy, " + std::to_string(bandwidth_bytes >> 20) +
                       " MiB, bytes read + written, best of 5";
    std::string why;
    if (const CublasApi* cublas = load_cublas(why)) {
      c.matmul_gflops = bf16_matmul_gflops(*cublas, 8192);
      c.matmul_what = "bf16 cuBLAS GEMM 8192^3 (fp32 accumulate), best of 5";
    } else {
      c.matmul_gflops = std::nan("");  // CSV nan, JSON null, the table "nan"
      c.matmul_what = why + ": no GEMM ceiling";
    }
    return c;
  }

  std::vector<double> time_passes(const std::function<void()>& pass, int warmup, int repeats) override {
    pass();  // outside the capture: first-call setup (kernel attributes) happens here
    synchronize();
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    check(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
    pass();
    check(cudaStreamEndCapture(stream_, &graph), "cudaStreamEndCapture");
    check(cudaGraphInstantiate(&exec, graph, 0), "cudaGraphInstantiate");
    for (int w = 0; w < warmup; ++w) check(cudaGraphLaunch(exec, stream_), "cudaGraphLaunch");
    std::vector<double> ms;
    for (int r = 0; r < repeats; ++r) {
      ms.push_back(timed_on(stream_, [&] { check(cudaGraphLaunch(exec, stream_), "cudaGraphLaunch"); }));
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    return ms;
  }

  std::vector<double> time_eager_passes(const std::function<void()>& pass, int warmup, int repeats) override {
    for (int w = 0; w < warmup; ++w) pass();
    synchronize();
    std::vector<double> ms;
    for (int r = 0; r < repeats; ++r) ms.push_back(timed_on(stream_, pass));
    return ms;
  }

 private:
  double copy_bandwidth_gbs(size_t bytes) {
    void* src = allocate(bytes);
    void* dst = allocate(bytes);
    float best = 1e30f;
    for (int r = 0; r < 6; ++r) {  // the first pass warms up
      const float ms = timed_on(stream_, [&] {
        check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_), "cudaMemcpy (copy)");
      });
      if (r > 0) best = std::min(best, ms);
    }
    release(src);
    release(dst);
    return 2.0 * double(bytes) / (double(best) * 1e-3) * 1e-9;
  }

  double bf16_matmul_gflops(const CublasApi& cublas, int n) {
    const size_t bytes = size_t(n) * size_t(n) * sizeof(__nv_bfloat16);
    void* a = allocate(bytes);  // zeros: the tensor cores' speed does not depend on the values
    void* b = allocate(bytes);
    void* d = allocate(bytes);
    cublasHandle_t handle;
    check_cublas(cublas.create(&handle), "cublasCreate");
    check_cublas(cublas.set_stream(handle, stream_), "cublasSetStream");
    const float alpha = 1.0f, beta = 0.0f;
    float best = 1e30f;
    for (int r = 0; r < 7; ++r) {  // two warm-up passes
      const float ms = timed_on(stream_, [&] {
        check_cublas(cublas.gemm_ex(handle, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &alpha, a, CUDA_R_16BF, n,
                                  b, CUDA_R_16BF, n, &beta, d, CUDA_R_16BF, n, CUBLAS_COMPUTE_32F,
                                  CUBLAS_GEMM_DEFAULT),
                     "cublasGemmEx");
      });
      if (r > 1) best = std::min(best, ms);
    }
    cublas.destroy(handle);
    release(a);
    release(b);
    release(d);
    return 2.0 * double(n) * double(n) * double(n) / (double(best) * 1e-3) * 1e-9;
  }

  int device_id_;
  cudaDeviceProp properties_{};
  cudaStream_t stream_ = nullptr;
};

}  // namespace

// Why no GPU can be used, in words a user acts on ("" when one can).
std::string cuda_unavailable_reason() {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status == cudaErrorInsufficientDriver) {
    return "no CUDA driver, or one older than this build's CUDA " + std::to_string(CUDART_VERSION / 1000) + "." +
           std::to_string(CUDART_VERSION % 1000 / 10) + " runtime needs (is this a GPU host?)";
  }
  if (status == cudaErrorNoDevice || (status == cudaSuccess && count == 0)) return "no CUDA GPU found";
  if (status != cudaSuccess) return std::string("CUDA is unusable here: ") + cudaGetErrorString(status);
  return "";
}

std::unique_ptr<DeviceMemory> make_cuda_memory(int device_id) {
  const std::string why = cuda_unavailable_reason();
  if (!why.empty()) throw Error(ErrorKind::unsupported, "--device", "--device cuda: " + why + "; use --device cpu");
  return std::make_unique<CudaMemory>(device_id);
}

#else

std::unique_ptr<DeviceMemory> make_cuda_memory(int) {
  throw Error(ErrorKind::unsupported, "--device",
              "this kvflash program was built without CUDA support (--device cuda)");
}

#endif

}  // namespace kvflash::tools
