// The kvflash program's commands. Each adds its subcommand (flags, help) to the program's CLI11
// app; the subcommand's callback runs the command and leaves its exit status in the context.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

namespace kvflash::tools {

struct CommandContext {
  std::string command_line;  // argv joined by spaces, recorded in machine-readable output
  int status = 0;
};

void add_run_command(CLI::App& app, CommandContext& context);
void add_check_command(CLI::App& app, CommandContext& context);
void add_bench_command(CLI::App& app, CommandContext& context);

}  // namespace kvflash::tools
