#include "parallel_for.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace kvflash::oracle {

int default_oracle_threads() {
  if (const char* env = std::getenv("KVFLASH_ORACLE_THREADS")) {
    char* end = nullptr;
    const long value = std::strtol(env, &end, 10);
    if (end == env || *end != '\0' || value < 1 || value > 4096) {
      throw std::invalid_argument("KVFLASH_ORACLE_THREADS must be a positive integer, got '" +
                                  std::string(env) + "'");
    }
    return static_cast<int>(value);
  }
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

void parallel_for(int64_t count, int threads, const std::function<void(int64_t)>& body) {
  const int helpers = static_cast<int>(std::min<int64_t>(std::max(threads, 1), count)) - 1;
  if (helpers <= 0) {
    for (int64_t i = 0; i < count; ++i) body(i);
    return;
  }
  std::atomic<int64_t> next{0};
  std::exception_ptr first_error;
  std::mutex error_mutex;
  auto work = [&] {
    for (int64_t i = next++; i < count; i = next++) {
      try {
        body(i);
      } catch (...) {
        const std::lock_guard<std::mutex> lock(error_mutex);
        if (!first_error) first_error = std::current_exception();
        next = count;  // stop handing out indices
      }
    }
  };
  std::vector<std::thread> pool;
  pool.reserve(helpers);
  for (int t = 0; t < helpers; ++t) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
  if (first_error) std::rethrow_exception(first_error);
}

}  // namespace kvflash::oracle
