// A minimal parallel loop for the oracle. It is the oracle's own (std::thread only), so the
// reference shares no threading code with the backends it checks.
#pragma once

#include <cstdint>
#include <functional>

namespace kvflash::oracle {

// Threads the oracle uses by default: KVFLASH_ORACLE_THREADS when set (1 = serial), else every
// hardware thread. Throws std::invalid_argument when the variable is not a positive integer.
int default_oracle_threads();

// Calls body(i) once for every i in [0, count), on `threads` threads (the calling one included;
// never more threads than indices). Indices are handed out one at a time from a shared counter,
// so units of uneven cost balance. The first exception a body throws is rethrown here once every
// thread has stopped; the remaining indices are then skipped.
void parallel_for(int64_t count, int threads, const std::function<void(int64_t)>& body);

}  // namespace kvflash::oracle
