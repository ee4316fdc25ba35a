// The CPU backend's instruction-set levels (src/cpu/isa.h): every level this machine runs gives
// the oracle's answers (ctest runs the CPU suites once per level through KVFLASH_CPU_ISA; the
// aarch64 build's baseline and neon run under qemu: scripts/cross_aarch64.sh), the avx2 and
// avx512 copies, whose arithmetic is the same lane for lane, give identical bits, and
// avx512_bf16's vdpbf16ps scores (decode with at most 2 query heads per KV head) stay within
// the tolerances.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "cpu/isa.h"
#include "kvflash/errors.h"
#include "kvflash/kvflash.h"
#include "oracle/random_case.h"

namespace kvflash::cpu {
namespace {

// Makes `isa` the active level for the test's lifetime.
class ActiveIsa {
 public:
  explicit ActiveIsa(Isa isa) : before_(active_isa()) { set_active_isa(isa); }
  ~ActiveIsa() { set_active_isa(before_); }

 private:
  Isa before_;
};

// Runs case c at the active level into `outputs`; false when the contract rejects it (it is
// rejected at every level: Differential tests that).
bool run_case(oracle::Case& c, oracle::CaseOutputs& outputs) {
  c.restore_cache();
  outputs = oracle::allocate_outputs(output_spec(c.args), true);
  try {
    flash_attn_with_kvcache(c.args, outputs.outputs);
  } catch (const Error&) {
    return false;
  }
  return true;
}

std::vector<unsigned char> bytes_of(const oracle::CaseOutputs& outputs) {
  std::vector<unsigned char> bytes;
  for (const auto& buffer : outputs.storage) bytes.insert(bytes.end(), buffer.begin(), buffer.end());
  return bytes;
}

// Output bytes (out, LSE, partials) of one random case at the active level (empty: rejected).
std::vector<unsigned char> run_case(uint64_t seed) {
  oracle::Case c = oracle::make_random_case(seed);
  oracle::CaseOutputs outputs;
  return run_case(c, outputs) ? bytes_of(outputs) : std::vector<unsigned char>{};
}

bool runs(Isa isa) {
  for (Isa s : supported_isas()) {
    if (s == isa) return true;
  }
  return false;
}

TEST(CpuIsa, Avx2AndAvx512GiveIdenticalBits) {
  if (!runs(Isa::avx2) || !runs(Isa::avx512)) GTEST_SKIP() << "this CPU or build lacks avx2 or avx512";
  int compared = 0;
  for (uint64_t seed = 1; seed <= 60; ++seed) {
    std::vector<unsigned char> avx2, avx512;
    {
      ActiveIsa level(Isa::avx2);
      avx2 = run_case(seed);
    }
    {
      ActiveIsa level(Isa::avx512);
      avx512 = run_case(seed);
    }
    EXPECT_TRUE(avx2 == avx512) << "seed " << seed << ": avx2 and avx512 outputs differ";
    compared += !avx2.empty();
  }
  EXPECT_GT(compared, 30);
}

// Query heads per KV head of a random case, from its summary (" h=8/2 ").
int group_of(const oracle::Case& c) {
  int heads = 0, heads_k = 1;
  const char* h = std::strstr(c.summary.c_str(), " h=");
  return h && std::sscanf(h, " h=%d/%d", &heads, &heads_k) == 2 ? heads / heads_k : 0;
}

// The decode cases where avx512_bf16 computes bf16 scores with vdpbf16ps: every one within the
// oracle's tolerances, and (so that the test sees the new path at all) most of them not
// bit-identical to avx512's FMA scores.
TEST(CpuIsa, Bf16ScoresMatchTheOracle) {
  if (!runs(Isa::avx512) || !runs(Isa::avx512_bf16)) GTEST_SKIP() << "this CPU or build lacks avx512_bf16";
  oracle::CaseLimits decode;
  decode.max_seqlen_q = 1;
  int checked = 0, differing = 0;
  for (uint64_t seed = 1; checked < 150; ++seed) {
    oracle::Case c = oracle::make_random_case(seed, decode);
    const bool bf16_inputs = c.args.q && c.args.q->dtype == DType::bf16 && c.args.k_cache &&
                             c.args.k_cache->dtype == DType::bf16;
    if (!bf16_inputs || group_of(c) < 1 || group_of(c) > 2) continue;
    const oracle::OracleResult ref = oracle::run_oracle(c.args);
    oracle::CaseOutputs fma, bf16;
    bool ran = false;
    {
      ActiveIsa level(Isa::avx512);
      ran = run_case(c, fma);
    }
    if (!ran) continue;
    {
      ActiveIsa level(Isa::avx512_bf16);
      ASSERT_TRUE(run_case(c, bf16)) << oracle::describe(c);
    }
    const oracle::Comparison cmp =
        oracle::compare(c, ref, bf16.outputs, nullptr, oracle::ToleranceProfile::fp32_probabilities);
    EXPECT_TRUE(cmp.ok) << oracle::describe(c) << "\n  " << cmp.failures << " bad elements; first: "
                        << cmp.first_failure;
    ++checked;
    differing += bytes_of(fma) != bytes_of(bf16);
  }
  EXPECT_GT(differing, checked / 2);
}

TEST(CpuIsa, BaselineIsAlwaysSupportedAndAutoPicksTheHighest) {
  const std::vector<Isa> supported = supported_isas();
  ASSERT_FALSE(supported.empty());
  EXPECT_EQ(supported.front(), Isa::baseline);
  const Isa highest = supported.back() == Isa::avx512_bf16 ? Isa::avx512 : supported.back();
  EXPECT_EQ(requested_isa("", supported), highest);
  EXPECT_EQ(requested_isa("auto", supported), highest);
  EXPECT_EQ(requested_isa("baseline", supported), Isa::baseline);
}

// avx512_bf16 is no faster end to end (BENCHMARKS.md): auto keeps avx512.
TEST(CpuIsa, AutoLeavesAvx512Bf16ToBeAskedFor) {
  const std::vector<Isa> all = {Isa::baseline, Isa::avx2, Isa::avx512, Isa::avx512_bf16};
  EXPECT_EQ(requested_isa("", all), Isa::avx512);
  EXPECT_EQ(requested_isa("auto", all), Isa::avx512);
  EXPECT_EQ(requested_isa("avx512_bf16", all), Isa::avx512_bf16);
}

// requested_isa(value, supported) must throw `kind` naming KVFLASH_CPU_ISA with `message`.
void expect_refused(const std::string& value, const std::vector<Isa>& supported, ErrorKind kind,
                    const std::string& message) {
  try {
    requested_isa(value, supported);
    FAIL() << value << ": no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), kind);
    EXPECT_EQ(e.argument(), "KVFLASH_CPU_ISA");
    EXPECT_EQ(std::string(e.what()), message);
  }
}

TEST(CpuIsa, UnknownOrUnsupportedLevelIsAnErrorNamingTheVariable) {
  expect_refused("sse9", {Isa::baseline}, ErrorKind::invalid_value,
                 "KVFLASH_CPU_ISA=sse9: expected auto, baseline, avx2, avx512, avx512_bf16, neon");
  expect_refused("avx512", {Isa::baseline, Isa::avx2}, ErrorKind::unsupported,
                 "KVFLASH_CPU_ISA=avx512: this CPU or build cannot run it (supported here: baseline, avx2)");
}

// Each architecture builds its own ladder: a build that silently lost its SIMD levels (a CMake
// architecture test gone wrong) fails here instead of running everything at the baseline.
TEST(CpuIsa, ThisArchitectureBuildsItsLevels) {
#if defined(__aarch64__)
  EXPECT_EQ(supported_isas(), (std::vector<Isa>{Isa::baseline, Isa::neon}));
#elif defined(__x86_64__)
  EXPECT_FALSE(runs(Isa::neon));
#endif
  expect_refused("neon", {Isa::baseline, Isa::avx2}, ErrorKind::unsupported,
                 "KVFLASH_CPU_ISA=neon: this CPU or build cannot run it (supported here: baseline, avx2)");
}

}  // namespace
}  // namespace kvflash::cpu
