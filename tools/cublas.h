// cuBLAS for the bf16 GEMM ceiling of `kvflash bench --device cuda`, loaded with dlopen() when
// that ceiling is measured: the program links no cuBLAS, so a CUDA build starts (and runs on the
// CPU) on a host without it. CUDA builds only.
#pragma once

#include <cublas_v2.h>

#include <string>

namespace kvflash::tools {

struct CublasApi {
  decltype(&cublasCreate_v2) create;
  decltype(&cublasSetStream_v2) set_stream;
  // cublasGemmEx's C signature (C++ code also sees overloads of the name).
  cublasStatus_t (*gemm_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void*,
                            const void*, cudaDataType, int, const void*, cudaDataType, int, const void*, void*,
                            cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t);
  decltype(&cublasDestroy_v2) destroy;
};

// The entry points of libcublas.so.<CUDA major> (else libcublas.so), loaded once; nullptr when
// neither loads, with the reason in `why`.
const CublasApi* load_cublas(std::string& why);

}  // namespace kvflash::tools
