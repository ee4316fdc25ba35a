// plan_batches' per-thread memo (heuristics.cpp): a repeated input is served its last result, and
// anything that changes the plan (the key: shapes, heads, dtype, device; a static decision; one
// length) is planned again. Every expectation is the plan made in a fresh thread, whose memo is
// empty.
#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "core/heuristics.h"
#include "core/planner.h"
#include "test_plan_util.h"

namespace kvflash::core {
namespace {

// A decode key (32 / 8 heads, d 128, bf16, one query row, causal, pages of 16) on an sm_80 GPU of
// 132 SMs: the portable split rule, whose per-sequence splits depend on every length of the batch.
PlanKey gpu_decode_key(int batch, int max_seqlen_k) {
  PlanKey key = decode_key(batch, max_seqlen_k, 80);
  key.page_size = 16;
  key.causal = true;
  return canonical_key(key, DeviceInfo{132, 80});
}

std::vector<SeqLengths> ragged_lengths(int batch) {
  std::vector<SeqLengths> lengths;
  for (int b = 0; b < batch; ++b) lengths.push_back({1, 100 + 700 * (b % 5)});
  return lengths;
}

Plan planned(const Plan& static_part, const std::vector<SeqLengths>& lengths) {
  Plan plan = static_part;
  plan_batches(plan, lengths);
  return plan;
}

// The same plan made where no memo exists yet.
Plan planned_fresh(const Plan& static_part, const std::vector<SeqLengths>& lengths) {
  Plan plan;
  std::thread([&] { plan = planned(static_part, lengths); }).join();
  return plan;
}

void expect_planned_as_fresh(const Plan& static_part, const std::vector<SeqLengths>& lengths) {
  expect_same_plan(planned(static_part, lengths), planned_fresh(static_part, lengths));
}

TEST(PlanMemo, RepeatedInputGetsTheSamePlan) {
  const Plan a = static_plan(gpu_decode_key(8, 4096));
  const std::vector<SeqLengths> lengths = ragged_lengths(8);
  const Plan first = planned(a, lengths);
  expect_same_plan(planned(a, lengths), first);
  expect_same_plan(first, planned_fresh(a, lengths));
}

TEST(PlanMemo, EveryChangedInputIsPlannedAgain) {
  const PlanKey key = gpu_decode_key(8, 4096);
  const std::vector<SeqLengths> lengths = ragged_lengths(8);
  const Plan a = static_plan(key);
  planned(a, lengths);  // the memo now holds a's plan

  PlanKey fp16 = key;
  fp16.dtype = DType::f16;
  expect_planned_as_fresh(static_plan(fp16), lengths);
  PlanKey fewer_kv_heads = key;
  fewer_kv_heads.num_heads_k = 4;
  expect_planned_as_fresh(static_plan(fewer_kv_heads), lengths);
  PlanKey cpu = key;
  cpu = canonical_key(cpu, DeviceInfo{8, 0});
  expect_planned_as_fresh(static_plan(cpu), lengths);

  planned(a, lengths);
  std::vector<SeqLengths> one_longer = lengths;
  one_longer[5].seqlen_k += 1000;
  expect_planned_as_fresh(a, one_longer);

  planned(a, lengths);
  Plan one_split = a;  // a static decision edited, the key kept
  one_split.num_splits = 1;
  expect_planned_as_fresh(one_split, lengths);

  const std::vector<SeqLengths> larger_batch = ragged_lengths(9);
  expect_planned_as_fresh(static_plan(gpu_decode_key(9, 4096)), larger_batch);

  expect_planned_as_fresh(a, lengths);  // and back
}

TEST(PlanMemo, CallersEditsOfAServedPlanDoNotReachTheNext) {
  const Plan a = static_plan(gpu_decode_key(8, 4096));
  const std::vector<SeqLengths> lengths = ragged_lengths(8);
  Plan served = planned(a, lengths);
  served = planned(a, lengths);
  served.num_splits_dynamic.assign(served.num_splits_dynamic.size(), 99);
  served.batch_order.clear();
  expect_same_plan(planned(a, lengths), planned_fresh(a, lengths));
}

TEST(PlanMemo, WrongLengthCountIsRefusedEvenAfterAHit) {
  const Plan a = static_plan(gpu_decode_key(8, 4096));
  planned(a, ragged_lengths(8));
  Plan plan = a;
  expect_error([&] { plan_batches(plan, ragged_lengths(7)); }, {"7 sequence lengths for batch 8"});
}

}  // namespace
}  // namespace kvflash::core
