// Verification of `kvflash run` against the float64 oracle on a sampled subset: one sequence of
// the batch is re-posed as a batch-1 dense call over host copies (the rows the backend's cache
// already holds, the new K/V rows, some query rows), the oracle computes it, and the backend's
// output rows and appended cache rows are compared within the oracle's tolerances.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "host_tensor.h"
#include "kvflash/args.h"

namespace kvflash::tools {

// Where one sequence's tokens live in the serving run's host copies.
struct SequenceSlice {
  int64_t q_first = 0;      // first query token row (in q and out)
  int64_t q_rows = 0;
  int64_t new_first = 0;    // first new K/V token row (in k and v)
  int64_t new_rows = 0;
  int64_t cached_rows = 0;  // rows of this sequence already in the cache before the call
  std::vector<int32_t> pages;  // the sequence's page-table row
  // false: only the appended rows are checked (the query rows are a stand-in whose positions
  // differ from the serving call's).
  bool check_out = true;
};

// The serving call's tensors, host copies. The caches are (num_pages, page_size, h_k, d).
struct ServingCallHost {
  const HostTensor* q = nullptr;
  const HostTensor* k = nullptr;
  const HostTensor* v = nullptr;
  const HostTensor* k_cache_before = nullptr;  // may be the cache after the call when
  const HostTensor* v_cache_before = nullptr;  // the first cached_rows rows did not change
  const HostTensor* k_cache_after = nullptr;
  const HostTensor* v_cache_after = nullptr;
  const HostTensor* out = nullptr;
  HostTensor* rotary_cos = nullptr;  // nullptr: no rotary
  HostTensor* rotary_sin = nullptr;
  bool rotary_interleaved = false;
  bool causal = true;
};

struct Verification {
  int64_t checked_values = 0;
  int64_t failures = 0;
  double max_abs_error = 0.0;  // of out
  double worst_ratio = 0.0;    // max |err| / tolerance over out and the appended rows
  std::string first_failure;
  void merge(const Verification& other);
  bool ok() const { return failures == 0; }
};

// fp32_probabilities: the tighter tolerances for a backend that keeps P in fp32 (the CPU's).
Verification verify_sequence(const ServingCallHost& call, const SequenceSlice& slice,
                             bool fp32_probabilities);

}  // namespace kvflash::tools
