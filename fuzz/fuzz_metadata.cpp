// libFuzzer target: FA3's int32 scheduler metadata given to a call (scheduler_metadata tensor,
// read and checked on the host): the plan the call would make, serialised, then some entries
// and perhaps the length damaged. The call must accept it only when it is that plan's layout.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "call_builder.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvflash;
  FuzzedDataProvider in(data, size);
  fuzz::CallBuilder call(in);
  call.build();
  call.args.scheduler_metadata.reset();
  if (!call.has_memory) return 0;
  try {
    std::vector<int32_t> metadata = make_plan(call.args).to_fa3();
    const int changes = in.ConsumeIntegralInRange(0, 4);
    for (int i = 0; i < changes && !metadata.empty(); ++i) {
      metadata[in.ConsumeIntegralInRange<size_t>(0, metadata.size() - 1)] = call.value();
    }
    if (in.ConsumeIntegralInRange(0, 7) == 0) metadata.resize(in.ConsumeIntegralInRange(0, 64));
    TensorView t = call.tensor(DType::i32, {static_cast<int64_t>(metadata.size())});
    std::copy(metadata.begin(), metadata.end(), t.ptr<int32_t>());
    call.args.scheduler_metadata = t;
    fuzz::check_and_run(call);
  } catch (const Error&) {
  }
  return 0;
}
