// Differential test: thousands of seeded random calls through the public API on CPU tensors,
// each compared with the oracle (src/oracle), plus a determinism check and a fixed set of
// awkward configurations. KVFLASH_DIFF_SEED=<n> runs that one case (the seed a failure prints;
// add KVFLASH_DIFF_AWKWARD=1 for a case of the awkward set); KVFLASH_DIFF_CASES=<n> changes how
// many random cases run.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>

#include "kvflash/kvflash.h"
#include "oracle/oracle.h"
#include "oracle/random_case.h"

namespace kvflash::oracle {
namespace {

constexpr uint64_t kFirstSeed = 1;
constexpr int kDefaultCases = 2000;

int case_count() {
  const char* env = std::getenv("KVFLASH_DIFF_CASES");
  return env ? std::atoi(env) : kDefaultCases;
}

struct RunResult {
  CaseOutputs outputs;
  std::string error;  // the Error the call threw, if any
};

// How a case hands scheduling to the call: let it plan, pass a Plan made beforehand, or pass
// that Plan as FA3's int32 scheduler_metadata. All three must give the same results.
enum class Scheduling { call_plans, given_plan, given_metadata };

// Runs the case through the public API. Partials are requested on every other case and the LSE
// on two cases of three, so that every combination of optional outputs is exercised.
RunResult run_backend(const Case& c, bool with_partials, bool with_lse,
                      Scheduling scheduling = Scheduling::call_plans) {
  RunResult run;
  try {
    KvCacheArgs args = c.args;
    Plan plan;
    std::vector<int32_t> metadata;
    if (scheduling != Scheduling::call_plans) plan = make_plan(args);
    if (scheduling == Scheduling::given_plan) args.plan = &plan;
    if (scheduling == Scheduling::given_metadata) {
      metadata = plan.to_fa3();
      args.scheduler_metadata = TensorView::contiguous(metadata.data(), DType::i32,
                                                       {static_cast<int64_t>(metadata.size())});
    }
    run.outputs = allocate_outputs(output_spec(args, scheduling == Scheduling::call_plans ? nullptr : &plan),
                                   with_partials, with_lse);
    flash_attn_with_kvcache(args, run.outputs.outputs);
  } catch (const Error& e) {
    run.error = std::string(error_kind_name(e.kind())) + " (" + e.argument() + "): " + e.what();
  }
  return run;
}

// The largest |error| / tolerance seen per check ("out", "softmax_lse", ...): how much margin
// the backend leaves, printed once.
using Margins = std::map<std::string, double>;

// Runs one case end to end; returns "" when it passes, else the message to print.
std::string check_case(const Case& c, Margins* margins = nullptr) {
  OracleResult ref = run_oracle(c.args);
  const bool with_partials = c.seed % 2 == 0;
  const Scheduling scheduling = c.seed % 5 == 1 ? Scheduling::given_plan
                                : c.seed % 5 == 3 ? Scheduling::given_metadata : Scheduling::call_plans;
  RunResult run = run_backend(c, with_partials, c.seed % 3 != 0, scheduling);
  if (!run.error.empty()) return describe(c) + "\n  the call threw " + run.error;
  Plan plan;
  const Plan* plan_ptr = nullptr;
  if (run.outputs.outputs.out_accum) {
    plan = make_plan(c.args);
    plan_ptr = &plan;
  }
  if (run.outputs.num_splits > 1 && with_partials && !run.outputs.outputs.out_accum) {
    return describe(c) + "\n  output_spec reports " + std::to_string(run.outputs.num_splits) +
           " splits but no out_accum shape";
  }
  // The CPU backend keeps P in fp32, so it is held to the tighter profile.
  const Comparison cmp = compare(c, ref, run.outputs.outputs, plan_ptr, ToleranceProfile::fp32_probabilities);
  if (margins) {
    for (const auto& [check, ratio] : cmp.worst_ratio_by_check) {
      (*margins)[check] = std::max((*margins)[check], ratio);
    }
  }
  if (cmp.ok) return "";
  return describe(c) + "\n  " + std::to_string(cmp.failures) + " bad elements; first: " +
         cmp.first_failure + "\n  worst: " + cmp.worst;
}

// The oracle itself against the spec's worked examples (section 5.4/5.5), so that the reference
// is checked by something other than the backend it judges. One head, d = 8, q = k = 0 so all
// scores are 0 and out is the mean of the visible values, v_j = j + 1 in every channel.
struct TinyCall {
  Case c;
  TinyCall(int seqlen_q, int seqlen_k) {
    KvCacheArgs& a = c.args;
    a.q = c.allocate(DType::f32, {1, seqlen_q, 1, 8}, {}, true);
    a.k_cache = c.allocate(DType::f32, {1, seqlen_k, 1, 8}, {}, false);
    a.v_cache = c.allocate(DType::f32, {1, seqlen_k, 1, 8}, {}, false);
    for (int j = 0; j < seqlen_k; ++j) {
      for (int ch = 0; ch < 8; ++ch) a.v_cache->ptr<float>()[j * 8 + ch] = static_cast<float>(j + 1);
    }
  }
  // Mean of the visible values of query row i (NaN-free check of which keys were visible).
  double out(const OracleResult& r, int i) const { return r.out[static_cast<size_t>(i) * 8]; }
};

TEST(Differential, OracleFollowsTheSpecExamples) {
  {  // causal, S_q = 2, S_k = 5: rows see 4 and 5 keys (bottom-right alignment)
    TinyCall t(2, 5);
    t.c.args.causal = true;
    const OracleResult r = run_oracle(t.c.args);
    EXPECT_DOUBLE_EQ(t.out(r, 0), 2.5);  // mean of 1..4
    EXPECT_DOUBLE_EQ(t.out(r, 1), 3.0);  // mean of 1..5
    EXPECT_NEAR(r.lse[0], std::log(4.0), 1e-12);
  }
  {  // causal, S_q = 5, S_k = 2: the first three rows are empty (out 0, LSE -inf)
    TinyCall t(5, 2);
    t.c.args.causal = true;
    const OracleResult r = run_oracle(t.c.args);
    for (int i = 0; i < 3; ++i) {
      EXPECT_TRUE(r.empty_row[i]);
      EXPECT_EQ(t.out(r, i), 0.0);
      EXPECT_EQ(r.lse[i], -INFINITY);
    }
    EXPECT_DOUBLE_EQ(t.out(r, 3), 1.0);
    EXPECT_DOUBLE_EQ(t.out(r, 4), 1.5);
  }
  {  // window (1, 0) over S_q = S_k = 4: row i sees keys i-1 and i
    TinyCall t(4, 4);
    t.c.args.window_left = 1;
    t.c.args.window_right = 0;
    const OracleResult r = run_oracle(t.c.args);
    EXPECT_DOUBLE_EQ(t.out(r, 0), 1.0);
    EXPECT_DOUBLE_EQ(t.out(r, 3), 3.5);
  }
  {  // chunk 3, not causal, S_q = 3, S_k = 7 (diagonals 4, 5, 6): rows 0 and 1 see the whole
     // chunk [3, 6), row 2 the chunk [6, 9) cut to the keys that exist
    TinyCall t(3, 7);
    t.c.args.attention_chunk = 3;
    const OracleResult r = run_oracle(t.c.args);
    EXPECT_DOUBLE_EQ(t.out(r, 0), 5.0);  // mean of 4, 5, 6
    EXPECT_DOUBLE_EQ(t.out(r, 1), 5.0);
    EXPECT_DOUBLE_EQ(t.out(r, 2), 7.0);
  }
  {  // chunk 2 with causal and a negative diagonal (S_q = 3 > S_k = 1): diag -2, -1, 0
    TinyCall t(3, 1);
    t.c.args.attention_chunk = 2;
    t.c.args.causal = true;
    const OracleResult r = run_oracle(t.c.args);
    EXPECT_TRUE(r.empty_row[0]);
    EXPECT_TRUE(r.empty_row[1]);
    EXPECT_DOUBLE_EQ(t.out(r, 2), 1.0);
  }
  {  // a sink of logit s: a virtual key with zero value; an empty row gets LSE = s
    TinyCall t(3, 1);
    t.c.args.causal = true;
    t.c.args.sinks = t.c.allocate(DType::f32, {1}, {}, true);
    t.c.args.sinks->ptr<float>()[0] = std::log(3.0f);
    const OracleResult r = run_oracle(t.c.args);
    EXPECT_EQ(t.out(r, 0), 0.0);
    EXPECT_NEAR(r.lse[0], std::log(3.0), 1e-7);
    EXPECT_NEAR(t.out(r, 2), 1.0 / (1.0 + 3.0), 1e-7);  // exp(0) / (exp(0) + exp(log 3))
    EXPECT_NEAR(r.lse[2], std::log(4.0), 1e-7);
  }
}

TEST(Differential, RandomCasesMatchOracle) {
  if (const char* env = std::getenv("KVFLASH_DIFF_SEED")) {
    CaseLimits limits;
    limits.awkward = std::getenv("KVFLASH_DIFF_AWKWARD") != nullptr;
    const Case c = make_random_case(std::strtoull(env, nullptr, 0), limits);
    std::printf("%s\n", describe(c).c_str());
    const std::string failure = check_case(c);
    EXPECT_TRUE(failure.empty()) << failure;
    return;
  }
  const auto start = std::chrono::steady_clock::now();
  Coverage coverage;
  Margins margins;
  int failed = 0;
  const int cases = case_count();
  for (int i = 0; i < cases; ++i) {
    const Case c = make_random_case(kFirstSeed + i);
    coverage.add(c.features);
    const std::string failure = check_case(c, &margins);
    if (!failure.empty()) {
      ++failed;
      if (failed <= 10) ADD_FAILURE() << failure;
    }
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("differential: %d cases, %d failed, %.1f s\n%s\nworst |error| / tolerance:", cases,
              failed, seconds, coverage.report().c_str());
  for (const auto& [check, ratio] : margins) std::printf("  %s %.3g;", check.c_str(), ratio);
  std::printf("\n");
  EXPECT_EQ(failed, 0) << failed << " of " << cases << " random cases differ from the oracle";
}

// Every feature must be drawn by the default limits: a generator that stopped producing a
// feature would silently stop testing it.
TEST(Differential, GeneratorCoversEveryFeature) {
  Coverage coverage;
  for (int i = 0; i < case_count(); ++i) coverage.add(random_case_features(kFirstSeed + i));
  for (uint64_t seed = kFirstSeed; seed < kFirstSeed + 20; ++seed) {
    EXPECT_EQ(random_case_features(seed), make_random_case(seed).features) << "seed " << seed;
  }
  const char* required[] = {
      "dtype=f32", "dtype=f16", "dtype=bf16", "dtype=e4m3", "paged", "dense_cache",
      "page_size=1", "page_size=3", "page_size=16", "page_size=64", "page_size=256",
      "varlen_q", "dense_q", "cache_seqlens=none", "cache_seqlens=int", "cache_seqlens=tensor",
      "cache_batch_idx", "cache_leftpad", "append_dense", "append_packed", "rotary_interleaved",
      "rotary_neox", "rotary_partial", "rotary_seqlens", "causal", "window", "window_normalised_away", "window_normalised_away_rotary", "attention_chunk",
      "softcap", "sinks_f32", "sinks_bf16", "heads=1/1", "heads=8/1", "heads=32/8", "heads=63/7",
      "headdim=64/512", "headdim=192/128", "qv", "only_qv", "q_absent", "k_cache_absent",
      "fp8_descales", "descales_ignored", "fp8_rotary", "fp8_kv_cache_q_bf16", "fp8_kv_cache_q_f16",
      "fp8_kv_descales", "fp8_kv_append", "fp8_kv_rotary", "fp8_kv_saturating", "fp8_kv_qv", "fp8_kv_q_absent", "fp8_kv_headdim_v=512", "num_splits=0", "num_splits=1", "num_splits=3", "num_splits=many",
      "batch>=16", "context>=1000", "seqlen_q>=100", "empty_q_sequence", "empty_k_sequence", "all_keys_empty", "size=large",
      "shared_pages", "cache_strided_padded", "cache_heads_outer", "inputs_strided", "checked_mode",
      "batch_invariant"};
  for (const char* tag : required) {
    EXPECT_GT(coverage.counts[tag], 0) << "no random case exercises " << tag;
  }
}

bool has_fp8_cache_under_16_bit_q(const std::vector<std::string>& features) {
  for (const std::string& tag : features) {
    if (tag.rfind("fp8_kv_cache_q_", 0) == 0) return true;
  }
  return false;
}

// The 16-bit query over an fp8 cache (contract 5.8) on its own, more of them than the mixed run
// above holds: the first `count` such seeds from `first_seed` under `limits`.
int failed_fp8_cache_cases(uint64_t first_seed, int count, const CaseLimits& limits) {
  int failed = 0, ran = 0;
  for (uint64_t seed = first_seed; ran < count; ++seed) {
    if (!has_fp8_cache_under_16_bit_q(random_case_features(seed, limits))) continue;
    ++ran;
    const std::string failure = check_case(make_random_case(seed, limits));
    if (!failure.empty() && ++failed <= 5) ADD_FAILURE() << failure;
  }
  return failed;
}

TEST(Differential, Fp8CacheUnder16BitQueryMatchesOracle) {
  EXPECT_EQ(failed_fp8_cache_cases(5000000, 200, CaseLimits{}), 0);
  CaseLimits awkward;  // batch 17, 63/7 heads, pages of 1 or 3, varlen with empty sequences
  awkward.awkward = true;
  awkward.large_fraction = 0.0;
  EXPECT_EQ(failed_fp8_cache_cases(6000000, 25, awkward), 0) << "[KVFLASH_DIFF_AWKWARD=1]";
}

// The MLA draws (CaseLimits::mla, the GPU runner's mla subset) are valid calls the CPU backend
// gets right, and reach every MLA form: qv, only_qv with q or k_cache absent, 16 and 128 query
// heads on one KV head, each page size, the latent cache in fp8 e4m3 too.
TEST(Differential, MlaCasesMatchOracle) {
  CaseLimits limits;
  limits.mla = true;
  Coverage coverage;
  int failed = 0;
  for (uint64_t seed = 7000000; seed < 7000000 + 60; ++seed) {
    const Case c = make_random_case(seed, limits);
    coverage.add(c.features);
    const std::string failure = check_case(c);
    if (!failure.empty() && ++failed <= 5) ADD_FAILURE() << failure;
  }
  EXPECT_EQ(failed, 0);
  for (const char* tag : {"qv", "only_qv", "q_absent", "k_cache_absent", "heads=16/1", "heads=128/1",
                          "page_size=1", "page_size=16", "page_size=64", "dtype=bf16", "dtype=f16",
                          "fp8_kv_qv", "fp8_kv_descales"}) {
    EXPECT_GT(coverage.counts[tag], 0) << "no MLA case exercises " << tag;
  }
  EXPECT_EQ(coverage.counts["dtype=e4m3"] + coverage.counts["dtype=f32"], 0);
}

std::vector<unsigned char> cache_bytes(const Case& c) {
  std::vector<unsigned char> bytes;
  auto append = [&](const OptTensor& view, size_t size) {
    if (!view) return;
    const auto* data = static_cast<const unsigned char*>(view->data);
    bytes.insert(bytes.end(), data, data + size);
  };
  append(c.args.k_cache, c.k_cache_before().size());
  append(c.args.v_cache, c.v_cache_before().size());
  return bytes;
}

// Two runs of the same call (same options) give bit-identical outputs and caches.
TEST(Differential, RunsAreDeterministic) {
  for (uint64_t seed = kFirstSeed; seed < kFirstSeed + 60; ++seed) {
    Case c = make_random_case(seed);
    RunResult first = run_backend(c, true, true);
    if (!first.error.empty()) continue;  // reported by RandomCasesMatchOracle
    const std::vector<unsigned char> cache_after_first = cache_bytes(c);
    c.restore_cache();
    RunResult second = run_backend(c, true, true);
    ASSERT_TRUE(second.error.empty()) << describe(c) << ": " << second.error;
    const auto& a = first.outputs.storage;
    const auto& b = second.outputs.storage;
    ASSERT_EQ(a.size(), b.size());
    auto ia = a.begin();
    for (auto ib = b.begin(); ib != b.end(); ++ia, ++ib) {
      EXPECT_TRUE(*ia == *ib) << describe(c) << ": outputs differ between two identical runs";
    }
    EXPECT_TRUE(cache_after_first == cache_bytes(c)) << describe(c) << ": the cache differs between two identical runs";
  }
}

// Fixed awkward configurations (fixed seeds): batch 17, 63/7 heads, pages of 1 and 3 in a
// random permutation with unused pages, an empty query sequence and a sequence with no keys,
// NaN in every unused slot.
TEST(Differential, AwkwardConfigurations) {
  CaseLimits limits;
  limits.awkward = true;
  limits.large_fraction = 0.0;
  int failed = 0;
  for (uint64_t seed = 1000000; seed < 1000000 + 40; ++seed) {
    const Case c = make_random_case(seed, limits);
    const std::string failure = check_case(c);
    if (!failure.empty() && ++failed <= 5) ADD_FAILURE() << failure << " [KVFLASH_DIFF_AWKWARD=1]";
  }
  EXPECT_EQ(failed, 0);
}

}  // namespace
}  // namespace kvflash::oracle
