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
    const OutputSpec spec = output_spec(call.args);
    if (!call.has_memory) return 0;
    const Outputs outputs = call.outputs(spec);
    if (!call.has_memory) return 0;
    RunOptions options;
    options.num_threads = 1;
    flash_attn_with_kvcache(call.args, outputs, options);
  } catch (const Error&) {
    // A refused call: what the checks are for.
  }
  return 0;
}
