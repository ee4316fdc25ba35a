// libFuzzer target: the argument validator, resolver, value checks and planner through the C++
// API (output_spec), then the call itself on the CPU backend when the checks accept it, over
// calls built by call_builder.h. Any crash, sanitizer report or non-Error exception is a finding.
#include <cstddef>
#include <cstdint>

#include "call_builder.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvflash;
  FuzzedDataProvider in(data, size);
  fuzz::CallBuilder call(in);
  call.build();
  try {
    fuzz::check_and_run(call);
  } catch (const Error&) {
    // A refused call: what the checks are for.
  }
  return 0;
}
