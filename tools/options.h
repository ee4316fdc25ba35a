// Command-line flags of the kvflash program, declared with CLI11 (per-command --help, a flag given
// twice is an error): the value types CLI11 lacks - lists "1,8,16" (or "none"), ranges "512-2048",
// dtypes - as option helpers, and UsageError for checks that span several flags.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "kvflash/tensor.h"

namespace kvflash::tools {

// A bad combination of flags found after parsing; main() prints it and exits with status 2.
struct UsageError {
  std::string message;
};

// --name "1,8,32": positive integers, or "none" for an empty list.
CLI::Option* add_integer_list(CLI::App& app, const std::string& name, std::vector<int64_t>& target,
                              const std::string& help);
// --name "512-2048" (or one value), within [min, max].
CLI::Option* add_integer_range(CLI::App& app, const std::string& name, std::pair<int64_t, int64_t>& target,
                               int64_t min, int64_t max, const std::string& help);
// --name "bf16,fp16": dtypes by short name.
CLI::Option* add_dtype_list(CLI::App& app, const std::string& name, std::vector<DType>& target,
                            const std::string& help);
// --device auto|cpu|cuda.
CLI::Option* add_device(CLI::App& app, std::string& target);

}  // namespace kvflash::tools
