// The machine's ceilings that `kvflash bench` sets its figures against: how fast the cores can
// read memory (a multithreaded sum over a buffer far larger than the caches) and how fast they
// multiply fp32 matrices (a plain cache-blocked GEMM, no hand-written kernels).
#pragma once

#include <cstddef>

namespace kvflash::tools {

// Best of `repeats` passes, GB/s (1e9 bytes per second). Threads: 0 = all hardware threads.
double measure_read_bandwidth(size_t bytes, int threads, int repeats);

// Best of `repeats` n x n x n products, GFLOP/s (2 n^3 FLOPs each).
double measure_gemm_gflops(int n, int threads, int repeats);

}  // namespace kvflash::tools
