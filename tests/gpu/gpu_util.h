// Helpers the GPU runner's files share: CUDA error checks and device copies of host views.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <vector>

#include "kvflash/args.h"
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

// The arguments with every tensor replaced by to_device(tensor) (an OptTensor).
template <class ToDevice>
KvCacheArgs with_tensors(const KvCacheArgs& host, ToDevice to_device) {
  KvCacheArgs a = host;
  for (OptTensor KvCacheArgs::*field :
       {&KvCacheArgs::q, &KvCacheArgs::k_cache, &KvCacheArgs::v_cache, &KvCacheArgs::k,
        &KvCacheArgs::v, &KvCacheArgs::qv, &KvCacheArgs::rotary_cos, &KvCacheArgs::rotary_sin,
        &KvCacheArgs::cache_seqlens, &KvCacheArgs::cache_batch_idx, &KvCacheArgs::cache_leftpad,
        &KvCacheArgs::page_table, &KvCacheArgs::cu_seqlens_q, &KvCacheArgs::cu_seqlens_k_new,
        &KvCacheArgs::rotary_seqlens, &KvCacheArgs::q_descale, &KvCacheArgs::k_descale,
        &KvCacheArgs::v_descale, &KvCacheArgs::scheduler_metadata, &KvCacheArgs::sinks}) {
    a.*field = to_device(host.*field);
  }
  return a;
}

inline KvCacheArgs device_args(const KvCacheArgs& host, DeviceMirror& mirror) {
  return with_tensors(host, [&](const OptTensor& t) { return mirror.upload(t); });
}

// What this build of the CUDA backend takes (the rest answers Error(unsupported)): fp16 / bf16
// (q, or qv without q, and both caches), fp8 e4m3 (FA3's all-fp8 call, and a 16-bit query over an
// fp8 cache), every head dim the contract allows (d_v 512 prefill needs a GPU with 151 KB of
// shared memory per CTA: cuda/host/call_params.cpp), qv, only_qv (over fp8 caches too): every
// call but float32's, the CPU backend's alone.
inline bool cuda_supports(const KvCacheArgs& a) { return a.v_cache->dtype != DType::f32; }

}  // namespace kvflash::gpu_test
