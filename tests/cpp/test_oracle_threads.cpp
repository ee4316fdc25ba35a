// The oracle's threads (src/oracle/parallel_for.h): any thread count gives the serial result bit
// for bit, and KVFLASH_ORACLE_THREADS is read as documented in oracle.h.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "oracle/oracle.h"
#include "oracle/parallel_for.h"
#include "oracle/random_case.h"
#include "cpp/scoped_env.h"

namespace kvflash::oracle {
namespace {

template <class T>
bool same_bits(const std::vector<T>& x, const std::vector<T>& y) {
  return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(T)) == 0;
}

bool same_appended(const std::vector<AppendedElement>& x, const std::vector<AppendedElement>& y) {
  if (x.size() != y.size()) return false;
  for (size_t i = 0; i < x.size(); ++i) {
    const AppendedElement &a = x[i], &b = y[i];
    if (a.in_v_cache != b.in_v_cache || a.offset != b.offset || a.bits != b.bits ||
        a.rotated != b.rotated || std::memcmp(&a.exact, &b.exact, sizeof(double)) != 0 ||
        std::memcmp(&a.cancellation, &b.cancellation, sizeof(double)) != 0) {
      return false;
    }
  }
  return true;
}

// Every field of the two results, compared as bits (NaN and -0 included).
void expect_same_bits(const OracleResult& serial, const OracleResult& parallel, const std::string& what) {
  EXPECT_TRUE(same_bits(serial.out, parallel.out)) << what << ": out";
  EXPECT_TRUE(same_bits(serial.lse, parallel.lse)) << what << ": lse";
  EXPECT_TRUE(same_bits(serial.empty_row, parallel.empty_row)) << what << ": empty_row";
  EXPECT_TRUE(same_bits(serial.value_scale, parallel.value_scale)) << what << ": value_scale";
  EXPECT_TRUE(same_bits(serial.score_scale, parallel.score_scale)) << what << ": score_scale";
  EXPECT_TRUE(same_bits(serial.token_batch, parallel.token_batch)) << what << ": token_batch";
  EXPECT_TRUE(same_appended(serial.appended, parallel.appended)) << what << ": appended";
}

// The first `count` seeds from `first` whose case has `feature`.
std::vector<uint64_t> seeds_with(const std::string& feature, int count, const CaseLimits& limits = {},
                                 uint64_t first = 1) {
  std::vector<uint64_t> seeds;
  for (uint64_t seed = first; static_cast<int>(seeds.size()) < count; ++seed) {
    const std::vector<std::string> f = random_case_features(seed, limits);
    if (std::find(f.begin(), f.end(), feature) != f.end()) seeds.push_back(seed);
  }
  return seeds;
}

void expect_thread_counts_agree(uint64_t seed, const CaseLimits& limits) {
  const Case c = make_random_case(seed, limits);
  const OracleResult serial = run_oracle(c.args, 1);
  for (int threads : {2, 7}) {
    const std::string what = describe(c) + ", " + std::to_string(threads) + " threads";
    expect_same_bits(serial, run_oracle(c.args, threads), what);
  }
  expect_same_bits(serial, run_oracle(c.args), describe(c) + ", default threads");
}

TEST(OracleThreads, AnyThreadCountGivesTheSerialBits) {
  const CaseLimits any;
  for (uint64_t seed = 1; seed <= 12; ++seed) expect_thread_counts_agree(seed, any);
  for (uint64_t seed : seeds_with("size=large", 2)) expect_thread_counts_agree(seed, any);
  for (uint64_t seed : seeds_with("append_packed", 2)) expect_thread_counts_agree(seed, any);
  CaseLimits awkward;  // batch 17, empty query and key sequences, pages of 1 or 3
  awkward.awkward = true;
  awkward.large_fraction = 0.0;
  for (uint64_t seed = 1000000; seed < 1000000 + 4; ++seed) expect_thread_counts_agree(seed, awkward);
  const CaseLimits prefill = sm90_prefill_limits();  // the GPU runner's sm90 draws
  for (uint64_t seed = 1; seed <= 3; ++seed) expect_thread_counts_agree(seed, prefill);
}

using testing::ScopedEnv;

TEST(OracleThreads, EnvironmentSetsTheDefault) {
  {
    ScopedEnv env("KVFLASH_ORACLE_THREADS", "3");
    EXPECT_EQ(default_oracle_threads(), 3);
  }
  for (const char* bad : {"0", "-2", "two", "4x", ""}) {
    ScopedEnv env("KVFLASH_ORACLE_THREADS", bad);
    EXPECT_THROW(default_oracle_threads(), std::invalid_argument) << "'" << bad << "'";
  }
  // A large case (threads by default) reads the variable; a tiny one never starts threads.
  ScopedEnv env("KVFLASH_ORACLE_THREADS", "0");
  const Case large = make_random_case(seeds_with("size=large", 1).front());
  EXPECT_THROW(run_oracle(large.args), std::invalid_argument);
  EXPECT_NO_THROW(run_oracle(large.args, 2));
}

TEST(OracleThreads, ParallelForVisitsEveryIndexOnceAndRethrows) {
  std::vector<int> visits(1000, 0);
  parallel_for(static_cast<int64_t>(visits.size()), 4, [&](int64_t i) { ++visits[i]; });
  EXPECT_EQ(std::count(visits.begin(), visits.end(), 1), static_cast<long>(visits.size()));
  EXPECT_THROW(parallel_for(100, 3, [](int64_t i) {
                 if (i == 42) throw std::runtime_error("unit 42");
               }),
               std::runtime_error);
}

}  // namespace
}  // namespace kvflash::oracle
