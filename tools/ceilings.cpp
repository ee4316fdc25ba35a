#include "ceilings.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

namespace kvflash::tools {

namespace {

using Clock = std::chrono::steady_clock;

int thread_count(int threads) {
  return threads > 0 ? threads : std::max(1, int(std::thread::hardware_concurrency()));
}

// Runs work(t) on threads t = 0..n-1 and returns the wall time.
template <class Work>
double timed_parallel(int n, Work work) {
  std::vector<std::thread> pool;
  const auto start = Clock::now();
  for (int t = 0; t < n; ++t) pool.emplace_back(work, t);
  for (std::thread& thread : pool) thread.join();
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Several independent accumulators so the adds pipeline and vectorise; the result is used, so the
// loads cannot be dropped.
uint64_t sum_words(const uint64_t* data, size_t n) {
  uint64_t a = 0, b = 0, c = 0, d = 0;
  size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    a += data[i];
    b += data[i + 1];
    c += data[i + 2];
    d += data[i + 3];
  }
  for (; i < n; ++i) a += data[i];
  return a + b + c + d;
}

struct AlignedFree {
  void operator()(void* p) const { std::free(p); }
};

}  // namespace

double measure_read_bandwidth(size_t bytes, int threads, int repeats) {
  const int n = thread_count(threads);
  const size_t words = bytes / sizeof(uint64_t) / size_t(n) * size_t(n);
  std::unique_ptr<uint64_t, AlignedFree> buffer(
      static_cast<uint64_t*>(std::aligned_alloc(64, (words * sizeof(uint64_t) + 63) / 64 * 64)));
  const size_t per_thread = words / size_t(n);
  std::vector<uint64_t> sums(size_t(n) * 8);  // one cache line per thread: no false sharing
  // First touch from the thread that will read the slice (pages land on its NUMA node).
  timed_parallel(n, [&](int t) {
    std::memset(buffer.get() + size_t(t) * per_thread, t + 1, per_thread * sizeof(uint64_t));
  });
  double best = 0;
  for (int r = 0; r < repeats; ++r) {
    const double seconds = timed_parallel(n, [&](int t) {
      sums[size_t(t) * 8] += sum_words(buffer.get() + size_t(t) * per_thread, per_thread);
    });
    best = std::max(best, double(words * sizeof(uint64_t)) / seconds * 1e-9);
  }
  volatile uint64_t sink = 0;
  for (uint64_t s : sums) sink = sink + s;
  return best;
}

double measure_gemm_gflops(int n, int threads, int repeats) {
  // A register-blocked kernel: a kRows x kCols tile of C stays in vector registers for the whole
  // k loop, so each loaded row of B feeds kRows FMAs; each thread owns whole column panels of C,
  // so its panel of B (kCols x n floats) stays in its L2.
  constexpr int kRows = 4, kCols = 32;
  n = std::max(kCols, n / kCols * kCols);
  const int workers = thread_count(threads);
  std::vector<float> a(size_t(n) * n), b(size_t(n) * n), c(size_t(n) * n);
  for (size_t i = 0; i < a.size(); ++i) {
    a[i] = float(i % 7) * 0.25f;
    b[i] = float(i % 5) * 0.5f;
  }
  const int panels = n / kCols;
  auto multiply_panels = [&](int t) {
    for (int panel = t; panel < panels; panel += workers) {
      const int j0 = panel * kCols;
      for (int i0 = 0; i0 < n; i0 += kRows) {
        float acc[kRows][kCols] = {};
        for (int k = 0; k < n; ++k) {
          const float* __restrict brow = &b[size_t(k) * n + j0];
          for (int r = 0; r < kRows; ++r) {
            const float aik = a[size_t(i0 + r) * n + k];
            for (int j = 0; j < kCols; ++j) acc[r][j] += aik * brow[j];
          }
        }
        for (int r = 0; r < kRows; ++r) std::copy_n(acc[r], kCols, &c[size_t(i0 + r) * n + j0]);
      }
    }
  };
  double best = 0;
  for (int r = 0; r < repeats; ++r) {
    const double seconds = timed_parallel(workers, multiply_panels);
    best = std::max(best, 2.0 * double(n) * n * n / seconds * 1e-9);
  }
  volatile float sink = c[size_t(n) * n / 2];
  (void)sink;
  return best;
}

}  // namespace kvflash::tools
