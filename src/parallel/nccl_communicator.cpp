// Communicator over NCCL (built with the CUDA backend when nccl.h is found; see
// context_parallel.h). libnccl is not a link dependency of kvflash: the process that made the
// ncclComm_t already has NCCL loaded, so its entry points are looked up there first, then in
// libnccl.so.2. This keeps a CPU-and-CUDA build of kvflash usable on machines without NCCL.
#include "kvflash/context_parallel.h"

#if defined(KVFLASH_WITH_NCCL)

#include <dlfcn.h>

#include <string>

namespace kvflash::cp {
namespace {

template <class Fn>
Fn nccl_entry(const char* name) {
  void* symbol = dlsym(RTLD_DEFAULT, name);
  if (!symbol) {
    static void* library = dlopen("libnccl.so.2", RTLD_NOW | RTLD_GLOBAL);
    if (library) symbol = dlsym(library, name);
  }
  if (!symbol) {
    throw Error(ErrorKind::unsupported, "comm",
                std::string("NCCL's ") + name + " was found neither in the process nor in libnccl.so.2");
  }
  return reinterpret_cast<Fn>(symbol);
}

using AllGatherFn = ncclResult_t (*)(const void*, void*, size_t, ncclDataType_t, ncclComm_t, cudaStream_t);
using CommQueryFn = ncclResult_t (*)(const ncclComm_t, int*);
using ErrorStringFn = const char* (*)(ncclResult_t);

void check_nccl(ncclResult_t result, const char* what) {
  if (result == ncclSuccess) return;
  const auto error_string = nccl_entry<ErrorStringFn>("ncclGetErrorString");
  throw Error(ErrorKind::device_failure, "comm", std::string(what) + " failed: " + error_string(result));
}

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(ncclComm_t comm, cudaStream_t stream)
      : comm_(comm), stream_(stream), all_gather_(nccl_entry<AllGatherFn>("ncclAllGather")) {
    check_nccl(nccl_entry<CommQueryFn>("ncclCommUserRank")(comm, &rank_), "ncclCommUserRank");
    check_nccl(nccl_entry<CommQueryFn>("ncclCommCount")(comm, &world_size_), "ncclCommCount");
  }
  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }
  // Bytes as ncclUint8: the partials are float32 but the gather only moves them.
  void all_gather(const void* send, void* recv, size_t bytes) override {
    check_nccl(all_gather_(send, recv, bytes, ncclUint8, comm_, stream_), "ncclAllGather");
  }

 private:
  ncclComm_t comm_;
  cudaStream_t stream_;
  AllGatherFn all_gather_;
  int rank_ = 0;
  int world_size_ = 1;
};

}  // namespace

std::unique_ptr<Communicator> make_nccl_communicator(ncclComm_t comm, cudaStream_t stream) {
  return std::make_unique<NcclCommunicator>(comm, stream);
}

}  // namespace kvflash::cp

#endif  // KVFLASH_WITH_NCCL
