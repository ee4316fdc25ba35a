// The kvflash program's commands; each returns the process exit status.
#pragma once

#include "options.h"

namespace kvflash::tools {

int run_command(Options& options);
int check_command(Options& options);
int bench_command(Options& options);

}  // namespace kvflash::tools
