// What produced a result: kvflash's version and commit, the backends built in, the CPU (model and
// the instruction-set level its kernels run at), the device and the command line. Printed by
// `kvflash --version` and recorded in bench, run and check output.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace kvflash::tools {

// "kvflash 0.1.0 (commit 0123456789ab, backends cpu,cuda, CPU kernels avx512)"
std::string version_text();

// The CPU's model name (/proc/cpuinfo), or "unknown".
std::string cpu_model();

// {"version", "commit", "backends", "cpu", "cpu_isa", "device", "command"}.
nlohmann::json provenance(const std::string& device, const std::string& command_line);

}  // namespace kvflash::tools
