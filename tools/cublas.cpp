#if defined(KVFLASH_WITH_CUDA)
#include "cublas.h"

#include <cuda_runtime_api.h>
#include <dlfcn.h>

namespace kvflash::tools {

namespace {

template <class Fn>
bool resolve(void* library, const char* name, Fn& fn) {
  fn = reinterpret_cast<Fn>(dlsym(library, name));
  return fn != nullptr;
}

struct Loaded {
  CublasApi api{};
  bool ok = false;
  std::string why;

  Loaded() {
    const std::string versioned = "libcublas.so." + std::to_string(CUDART_VERSION / 1000);
    void* library = dlopen(versioned.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (library == nullptr) library = dlopen("libcublas.so", RTLD_NOW | RTLD_LOCAL);
    if (library == nullptr) {
      why = "cuBLAS not found (" + versioned + " or libcublas.so: " + dlerror() + ")";
      return;
    }
    ok = resolve(library, "cublasCreate_v2", api.create) && resolve(library, "cublasSetStream_v2", api.set_stream) &&
         resolve(library, "cublasGemmEx", api.gemm_ex) && resolve(library, "cublasDestroy_v2", api.destroy);
    if (!ok) why = "cuBLAS (" + versioned + ") lacks an expected symbol: " + dlerror();
  }
};

}  // namespace

const CublasApi* load_cublas(std::string& why) {
  static const Loaded loaded;
  why = loaded.why;
  return loaded.ok ? &loaded.api : nullptr;
}

}  // namespace kvflash::tools
#endif
