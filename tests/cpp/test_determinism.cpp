// Determinism and concurrency on the CPU backend (issue 18): the same call on the same inputs gives
// bitwise identical out, LSE and appended cache, run to run and with any thread count; calls from
// several host threads at once (each its own call, or one call's Plan / PreparedCall shared) give
// what serial calls give; in batch-invariant mode a sequence's bits do not depend on its batch. scripts/sanitize.sh runs these under ThreadSanitizer.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "kvflash/kvflash.h"
#include "cpp/sequence_batch.h"
#include "oracle/random_case.h"

namespace kvflash::testing {
namespace {

using oracle::Case;

oracle::CaseLimits small_cases() {
  oracle::CaseLimits limits;
  limits.max_batch = 6;
  limits.max_seqlen_q = 40;
  limits.max_context = 400;
  limits.max_work = int64_t{1} << 20;
  limits.large_fraction = 0.0;
  return limits;
}

std::vector<unsigned char> bytes_of(const OptTensor& t) {
  if (!t || t->numel() == 0) return {};
  int64_t last = 0;
  for (int i = 0; i < t->rank; ++i) last += (t->shape[i] - 1) * t->strides[i];
  const auto* p = static_cast<const unsigned char*>(t->data);
  return {p, p + (last + 1) * dtype_size(t->dtype)};
}

// Everything a call writes, as bytes.
struct Result {
  std::vector<unsigned char> out, lse, k_cache, v_cache;
  bool operator==(const Result&) const = default;
};

// Runs case c (caches restored first) with `threads` CPU threads, optionally through `plan`.
Result run(Case& c, int threads, const Plan* plan = nullptr) {
  c.restore_cache();
  KvCacheArgs args = c.args;
  if (plan) args.plan = plan;
  oracle::CaseOutputs o = oracle::allocate_outputs(output_spec(args), /*with_partials=*/false);
  RunOptions options;
  options.num_threads = threads;
  flash_attn_with_kvcache(args, o.outputs, options);
  return {bytes_of(o.outputs.out), bytes_of(o.outputs.softmax_lse), bytes_of(c.args.k_cache),
          bytes_of(c.args.v_cache)};
}

constexpr int kCases = 24;

TEST(Determinism, BitwiseRunToRunAndWithAnyThreadCount) {
  int checks = 0;
  for (uint64_t seed = 0; seed < kCases; ++seed) {
    Case c = oracle::make_random_case(1000 + seed, small_cases());
    const Result first = run(c, 1);
    for (int threads : {1, 2, 3, 4, 7}) {
      EXPECT_TRUE(run(c, threads) == first) << oracle::describe(c) << " with " << threads << " threads";
      ++checks;
    }
  }
  std::printf("determinism: %d bitwise comparisons of out, LSE and caches\n", checks);
}

// Each thread runs its own cases (appends included) again and again, all at once; every result
// must be the one the same case gave serially.
TEST(Concurrency, HostThreadsGiveSerialResults) {
  constexpr int kThreads = 4, kPerThread = 3, kRounds = 3;
  std::vector<Case> cases;
  std::vector<Result> serial;
  for (int i = 0; i < kThreads * kPerThread; ++i) {
    cases.push_back(oracle::make_random_case(2000 + i, small_cases()));
    serial.push_back(run(cases.back(), 2));
  }
  std::vector<int> mismatches(kThreads, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < kRounds; ++round) {
        for (int i = t * kPerThread; i < (t + 1) * kPerThread; ++i) {
          if (!(run(cases[i], 2) == serial[i])) ++mismatches[t];
        }
      }
    });
  }
  for (std::thread& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(mismatches[t], 0) << "thread " << t;
}

// One read-only call (no append) shared by every thread: through one Plan, and through one
// PreparedCall, each thread with its own outputs.
TEST(Concurrency, SharedPlanAndPreparedCall) {
  Case c;
  for (uint64_t seed = 3000;; ++seed) {  // the first random case that appends nothing
    c = oracle::make_random_case(seed, small_cases());
    if (!c.args.k) break;
  }
  const Plan plan = make_plan(c.args);
  const Result serial = run(c, 1, &plan);
  const PreparedCall prepared(c.args);
  constexpr int kThreads = 4;
  std::vector<int> mismatches(kThreads, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 4; ++round) {
        KvCacheArgs args = c.args;
        args.plan = &plan;
        oracle::CaseOutputs o = oracle::allocate_outputs(output_spec(args), false);
        RunOptions options;
        options.num_threads = 1 + t % 2;
        flash_attn_with_kvcache(args, o.outputs, options);
        if (bytes_of(o.outputs.out) != serial.out || bytes_of(o.outputs.softmax_lse) != serial.lse) {
          ++mismatches[t];
        }
        oracle::CaseOutputs p = oracle::allocate_outputs(prepared.output_spec(), false);
        prepared.run(p.outputs, options);
        if (bytes_of(p.outputs.out) != serial.out) ++mismatches[t];
      }
    });
  }
  for (std::thread& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(mismatches[t], 0) << "thread " << t;
}

// Batch invariance: one sequence in batches with different neighbours, at different positions
// (sequence_batch.h). In batch-invariant mode its out and LSE rows are bitwise the same in each,
// and so is its split count.
TEST(BatchInvariance, SequenceBitsDoNotDependOnTheBatch) {
  for (int num_splits : {0, 3}) {
    std::vector<char> alone;
    int alone_splits = 0;
    for (size_t i = 0; i < kBatches.size(); ++i) {
      SequenceBatch batch(kBatches[i], DType::f32);
      batch.args.batch_invariant = true;
      batch.args.num_splits = num_splits;
      const Plan plan = make_plan(batch.args);
      flash_attn_with_kvcache(batch.args, batch.outputs);
      const int at = kPositions[i];
      if (i == 0) {
        alone = batch.row_bytes(at), alone_splits = plan.num_splits_dynamic[at];
        EXPECT_GT(alone_splits, 1) << "the sequence should be split";
        continue;
      }
      EXPECT_TRUE(batch.row_bytes(at) == alone) << "batch " << i << ", num_splits " << num_splits;
      EXPECT_EQ(plan.num_splits_dynamic[at], alone_splits);
    }
  }
}

// The mode is part of the plan's problem: a plan made without it does not serve a call with it.
TEST(BatchInvariance, PlanRecordsTheMode) {
  SequenceBatch batch({{16, 1}}, DType::f32);
  const Plan plan = make_plan(batch.args);
  batch.args.batch_invariant = true;
  batch.args.plan = &plan;
  try {
    flash_attn_with_kvcache(batch.args, batch.outputs);
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("batch_invariant (plan made for false, call has true)"),
              std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace kvflash::testing
