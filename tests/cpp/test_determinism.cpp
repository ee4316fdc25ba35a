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

// Batch invariance: one sequence (its query, keys, values and length) in batches with different
// neighbours, at different positions. In batch-invariant mode its out and LSE rows are bitwise
// the same in each, and so is its split count.
struct Sequence {
  int length;
  uint32_t seed;
};

constexpr int kHeads = 4, kHeadsK = 2, kDim = 64, kCapacity = 4096;

struct BatchRun {
  std::vector<float> out, lse;
  Plan plan;
};

BatchRun run_batch(const std::vector<Sequence>& seqs, bool batch_invariant, int num_splits) {
  const int64_t b = static_cast<int64_t>(seqs.size());
  std::vector<float> q(b * kHeads * kDim), k(b * kCapacity * kHeadsK * kDim), v(k.size());
  std::vector<int32_t> lengths;
  for (int64_t i = 0; i < b; ++i) {
    uint32_t x = seqs[i].seed * 747796405u + 1;
    const auto next = [&x] {
      x ^= x << 13, x ^= x >> 17, x ^= x << 5;
      return static_cast<float>(x % 2001) / 1000.0f - 1.0f;
    };
    for (int j = 0; j < kHeads * kDim; ++j) q[i * kHeads * kDim + j] = next();
    for (int64_t j = 0; j < int64_t{kCapacity} * kHeadsK * kDim; ++j) {
      k[i * kCapacity * kHeadsK * kDim + j] = next();
      v[i * kCapacity * kHeadsK * kDim + j] = next();
    }
    lengths.push_back(seqs[i].length);
  }
  KvCacheArgs args;
  args.q = TensorView::contiguous(q.data(), DType::f32, {b, 1, kHeads, kDim});
  args.k_cache = TensorView::contiguous(k.data(), DType::f32, {b, kCapacity, kHeadsK, kDim});
  args.v_cache = TensorView::contiguous(v.data(), DType::f32, {b, kCapacity, kHeadsK, kDim});
  args.cache_seqlens = TensorView::contiguous(lengths.data(), DType::i32, {b});
  args.batch_invariant = batch_invariant;
  args.num_splits = num_splits;
  BatchRun r;
  r.out.assign(q.size(), 0.0f);
  r.lse.assign(b * kHeads, 0.0f);
  Outputs outputs;
  outputs.out = TensorView::contiguous(r.out.data(), DType::f32, {b, 1, kHeads, kDim});
  outputs.softmax_lse = TensorView::contiguous(r.lse.data(), DType::f32, {b, kHeads, 1});
  r.plan = make_plan(args);
  flash_attn_with_kvcache(args, outputs);
  return r;
}

bool same_rows(const BatchRun& a, int ia, const BatchRun& b, int ib) {
  const size_t row = kHeads * kDim;
  return std::memcmp(&a.out[ia * row], &b.out[ib * row], row * sizeof(float)) == 0 &&
         std::memcmp(&a.lse[ia * kHeads], &b.lse[ib * kHeads], kHeads * sizeof(float)) == 0;
}

TEST(BatchInvariance, SequenceBitsDoNotDependOnTheBatch) {
  const Sequence mine{3001, 7};
  const std::vector<std::vector<Sequence>> batches = {
      {mine}, {mine, {4096, 1}, {5, 2}}, {{17, 3}, {2500, 4}, mine}, {{4000, 5}, mine, {4000, 6}, {1, 8}}};
  const int position[] = {0, 0, 2, 1};
  for (int num_splits : {0, 3}) {
    const BatchRun alone = run_batch(batches[0], true, num_splits);
    EXPECT_GT(alone.plan.num_splits_dynamic[0], 1) << "the sequence should be split";
    for (size_t i = 1; i < batches.size(); ++i) {
      const BatchRun r = run_batch(batches[i], true, num_splits);
      EXPECT_TRUE(same_rows(alone, 0, r, position[i])) << "batch " << i << ", num_splits " << num_splits;
      EXPECT_EQ(r.plan.num_splits_dynamic[position[i]], alone.plan.num_splits_dynamic[0]);
    }
  }
}

// The mode is part of the plan's problem: a plan made without it does not serve a call with it.
TEST(BatchInvariance, PlanRecordsTheMode) {
  std::vector<float> q(4 * kDim), cache(16 * kHeadsK * kDim), out(q.size());
  KvCacheArgs args;
  args.q = TensorView::contiguous(q.data(), DType::f32, {1, 1, kHeads, kDim});
  args.k_cache = TensorView::contiguous(cache.data(), DType::f32, {1, 16, kHeadsK, kDim});
  args.v_cache = args.k_cache;
  const Plan plan = make_plan(args);
  args.batch_invariant = true;
  args.plan = &plan;
  Outputs outputs;
  outputs.out = TensorView::contiguous(out.data(), DType::f32, {1, 1, kHeads, kDim});
  try {
    flash_attn_with_kvcache(args, outputs);
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("batch_invariant (plan made for false, call has true)"),
              std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace kvflash::testing
