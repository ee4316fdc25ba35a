// Helpers of the planner tests (test_plan.cpp, test_plan_compat.cpp): error expectations, plan
// comparison and a dense CPU problem built field by field.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "core/planner.h"
#include "core/problem.h"
#include "kvflash/errors.h"
#include "kvflash/plan.h"

namespace kvflash::core {

// Runs `f`, expecting an Error whose message contains every one of `parts`.
template <class F>
inline void expect_error(F&& f, std::initializer_list<std::string> parts,
                  ErrorKind kind = ErrorKind::invalid_value) {
  try {
    f();
    ADD_FAILURE() << "no Error thrown; expected one mentioning " << *parts.begin();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), kind) << e.what();
    for (const std::string& part : parts) {
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos)
          << "message \"" << e.what() << "\" lacks \"" << part << "\"";
    }
  }
}

// Every field of two plans.
inline void expect_same_plan(const Plan& a, const Plan& b) {
  EXPECT_TRUE(a.key == b.key) << first_difference(a.key, b.key);
  EXPECT_EQ(a.block_m, b.block_m);
  EXPECT_EQ(a.block_n, b.block_n);
  EXPECT_EQ(a.num_splits, b.num_splits);
  EXPECT_EQ(a.pack_gqa, b.pack_gqa);
  EXPECT_EQ(a.is_causal, b.is_causal);
  EXPECT_EQ(a.is_local, b.is_local);
  EXPECT_EQ(a.num_splits_dynamic, b.num_splits_dynamic);
  EXPECT_EQ(a.num_m_blocks, b.num_m_blocks);
  EXPECT_EQ(a.batch_order, b.batch_order);
  EXPECT_EQ(a.num_nheads_in_l2, b.num_nheads_in_l2);
  EXPECT_EQ(a.has_semaphore, b.has_semaphore);
}

// A dense CPU problem without length tensors: every sequence has seqlen_q rows and max_seqlen_k
// keys. Built field by field (what resolve() produces for such a call).
inline Problem dense_problem(int batch, int seqlen_q, int seqlen_k, DeviceInfo info = {8, 0}) {
  Problem p;
  p.device = Device{};
  p.dtype = DType::bf16;
  p.out_dtype = DType::bf16;
  p.batch = batch;
  p.seqlen_q = seqlen_q;
  p.total_q = batch * seqlen_q;
  p.num_heads = 8;
  p.num_heads_k = 2;
  p.group = 4;
  p.headdim = 64;
  p.headdim_v = 64;
  p.num_cache_rows = batch;
  p.seqlen_k = seqlen_k;
  p.softmax_scale = 0.125f;
  p.key = plan_key(p, info);
  return p;
}

// The key again after a field of p changed, on the device the key was made for.
// A decode-shaped key: 32 query heads over 8 KV heads, d = 128, bf16, one query row.
inline PlanKey decode_key(int batch, int max_seqlen_k, int arch = 90, int num_sms = 132) {
  PlanKey key;
  key.batch = batch;
  key.max_seqlen_q = 1;
  key.max_seqlen_k = max_seqlen_k;
  key.num_heads = 32;
  key.num_heads_k = 8;
  key.headdim = 128;
  key.headdim_v = 128;
  key.dtype = DType::bf16;
  return canonical_key(key, DeviceInfo{num_sms, arch});
}

inline void rekey(Problem& p) { p.key = plan_key(p, DeviceInfo{p.key.num_sms, p.key.arch}); }

}  // namespace kvflash::core
