// The CPU backend's instruction-set levels (src/cpu/isa.h): every level this machine runs gives
// the oracle's answers (ctest runs the CPU suites once per level through KVFLASH_CPU_ISA), and
// the avx2 and avx512 copies, whose arithmetic is the same lane for lane, give identical bits.
#include <gtest/gtest.h>

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

// Output bytes (out, LSE, partials) of one random case at the active level.
std::vector<unsigned char> run_case(uint64_t seed) {
  oracle::Case c = oracle::make_random_case(seed);
  oracle::CaseOutputs outputs = oracle::allocate_outputs(output_spec(c.args), true);
  try {
    flash_attn_with_kvcache(c.args, outputs.outputs);
  } catch (const Error&) {
    return {};  // a case the contract rejects is rejected at every level (Differential tests it)
  }
  std::vector<unsigned char> bytes;
  for (const auto& buffer : outputs.storage) bytes.insert(bytes.end(), buffer.begin(), buffer.end());
  return bytes;
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

TEST(CpuIsa, BaselineIsAlwaysSupportedAndAutoPicksTheHighest) {
  const std::vector<Isa> supported = supported_isas();
  ASSERT_FALSE(supported.empty());
  EXPECT_EQ(supported.front(), Isa::baseline);
  EXPECT_EQ(requested_isa("", supported), supported.back());
  EXPECT_EQ(requested_isa("auto", supported), supported.back());
  EXPECT_EQ(requested_isa("baseline", supported), Isa::baseline);
}

TEST(CpuIsa, UnknownOrUnsupportedLevelIsAnErrorNamingTheVariable) {
  try {
    requested_isa("sse9", {Isa::baseline});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "KVFLASH_CPU_ISA");
    EXPECT_EQ(std::string(e.what()), "KVFLASH_CPU_ISA=sse9: expected auto, baseline, avx2, avx512 or avx512_bf16");
  }
  try {
    requested_isa("avx512", {Isa::baseline, Isa::avx2});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::unsupported);
    EXPECT_EQ(std::string(e.what()),
              "KVFLASH_CPU_ISA=avx512: this CPU or build cannot run it (supported here: baseline, avx2)");
  }
}

}  // namespace
}  // namespace kvflash::cpu
