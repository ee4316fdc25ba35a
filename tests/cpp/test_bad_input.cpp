// Issue 18's table of malformed and unusual calls on the CPU backend (cases in bad_calls.h): a
// refused call names its argument and leaves every byte of every tensor of the call as it was;
// a valid one writes every element of its outputs and has its documented semantics.
#include <gtest/gtest.h>

#include <climits>
#include <cstring>
#include <string>
#include <vector>

#include "core/heuristics.h"
#include "cpp/bad_calls.h"

namespace kvflash::testing {
namespace {

constexpr unsigned char kSentinel = 0xab;  // fills the outputs before the call

void fill_outputs(Call& c) {
  std::memset(c.outputs.out.data, kSentinel, c.outputs.out.numel() * dtype_size(c.outputs.out.dtype));
  if (c.outputs.softmax_lse) {
    std::memset(c.outputs.softmax_lse->data, kSentinel, c.outputs.softmax_lse->numel() * 4);
  }
}

bool sentinel_left(const TensorView& t) {
  const auto* p = static_cast<const uint32_t*>(t.data);
  uint32_t word;
  std::memset(&word, kSentinel, sizeof word);
  for (int64_t i = 0; i < t.numel(); ++i) {
    if (p[i] == word) return true;
  }
  return false;
}

void expect_bitwise_equal(const TensorView& a, const TensorView& b, const char* name) {
  EXPECT_EQ(0, std::memcmp(a.data, b.data, a.numel() * dtype_size(a.dtype))) << name << " differs";
}

class BadInput : public ::testing::TestWithParam<BadCall> {};

TEST_P(BadInput, IsRefusedWithoutWritingOrRunsAsDocumented) {
  const BadCall& bad = GetParam();
  Call c(bad.dims);
  fill_call(c);
  fill_outputs(c);
  bad.edit(c);
  if (bad.argument != nullptr) {
    const auto before = c.buffers();
    try {
      flash_attn_with_kvcache(c.args, c.outputs);
      ADD_FAILURE() << "accepted; expected an error about " << bad.argument << ": " << bad.message;
    } catch (const Error& e) {
      EXPECT_EQ(e.argument(), bad.argument) << e.what();
      EXPECT_NE(std::string(e.what()).find(bad.message), std::string::npos)
          << "\"" << e.what() << "\" lacks \"" << bad.message << "\"";
    }
    EXPECT_TRUE(c.buffers() == before) << "a refused call wrote into the call's tensors";
    return;
  }
  ASSERT_NO_THROW(flash_attn_with_kvcache(c.args, c.outputs)) << bad.message;
  EXPECT_FALSE(sentinel_left(c.outputs.out)) << "rows of out left unwritten";
  EXPECT_FALSE(sentinel_left(*c.outputs.softmax_lse)) << "LSE entries left unwritten";
  Call clean(bad.dims);
  fill_call(clean);
  fill_outputs(clean);
  if (bad.clean_edit) bad.clean_edit(clean);
  ASSERT_NO_THROW(flash_attn_with_kvcache(clean.args, clean.outputs));
  if (bad.holds) {
    EXPECT_TRUE(bad.holds(c, clean)) << bad.message;
  } else {
    expect_bitwise_equal(c.outputs.out, clean.outputs.out, "out");
    expect_bitwise_equal(*c.outputs.softmax_lse, *clean.outputs.softmax_lse, "softmax_lse");
  }
}

INSTANTIATE_TEST_SUITE_P(Table, BadInput, ::testing::ValuesIn(bad_calls()),
                         [](const auto& info) { return std::string(info.param.name); });

// get_scheduler_metadata takes plain ints: sizes the call would refuse are refused here too,
// before anything is allocated per sequence (batch 2^30 was killed for memory).
TEST(BadInput, SchedulerMetadataRefusesSizesTheCallWould) {
  const auto refused = [](void (*edit)(SchedulerArgs&), const std::string& argument,
                          const std::string& message) {
    SchedulerArgs a;
    a.batch_size = 2, a.max_seqlen_q = 1, a.max_seqlen_k = 64, a.num_heads_q = 4,
    a.num_heads_kv = 2, a.headdim = 64;
    EXPECT_NO_THROW(get_scheduler_metadata(a));
    edit(a);
    try {
      get_scheduler_metadata(a);
      ADD_FAILURE() << "accepted; expected " << message;
    } catch (const Error& e) {
      EXPECT_EQ(e.argument(), argument);
      EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
    }
  };
  refused([](SchedulerArgs& a) { a.headdim = 100000; }, "headdim",
          "headdim must be <= 256 (FlashAttention's largest head dimension), got 100000");
  refused([](SchedulerArgs& a) { a.headdim_v = 100000; }, "headdim_v",
          "headdim_v must be <= 512 (FlashAttention's largest value head dimension), got 100000");
  refused([](SchedulerArgs& a) { a.batch_size = 1 << 30; }, "batch_size",
          "batch_size must be <= 1048576 (kvflash's sequences per call), got 1073741824");
}

// The C++ API has no int64 dtype: DLPack int64 tensors (torch's default integer) do not convert,
// and the C ABI refuses a dtype code it does not know; the Python tests check the message users see.
TEST(BadInput, Int64IndicesHaveNoDtype) {
  EXPECT_FALSE(dtype_from_dlpack(/*kDLInt*/ 0, 64, 1).has_value());
  EXPECT_TRUE(dtype_from_dlpack(0, 32, 1).has_value());
}

// Findings of the fuzz targets (fuzz/), each reduced to the call that reached it.
TEST(FuzzFindings, PlanFromFa3RefusesAKeyNoCallHas) {
  PlanKey key;
  key.batch = 1, key.num_heads = 1, key.num_heads_k = 1, key.headdim = 64, key.headdim_v = 64;
  const std::vector<int32_t> words(8, 1);
  key.max_seqlen_k = INT_MIN;  // normalise_mask computed max_seqlen_k - 1 (signed overflow)
  try {
    Plan::from_fa3(words.data(), words.size(), key);
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "scheduler_metadata");
    EXPECT_STREQ(e.what(), "scheduler_metadata's problem has max_seqlen_k = -2147483648, "
                           "expected a value in [0, 2147483647]");
  }
  key.max_seqlen_k = 64;
  key.num_heads_k = 0;
  EXPECT_THROW(Plan::from_fa3(words.data(), words.size(), key), Error);
  key.num_heads_k = 1;
  key.num_sms = 2147483642;  // num_splits_heuristic computed 2 * num_sms
  EXPECT_THROW(Plan::from_fa3(words.data(), words.size(), key), Error);
}

// A plan key of the largest sizes check_key_ranges admits: the portable rule's partial-buffer cap
// multiplied batch x max_seqlen_q x heads x d_v in int64 (signed overflow, fuzz_plan).
TEST(FuzzFindings, PortableSplitCapOfHugeKeys) {
  PlanKey key;
  key.batch = 2, key.max_seqlen_q = INT32_MAX, key.max_seqlen_k = 8192;
  key.num_heads = INT32_MAX, key.num_heads_k = 1, key.headdim = key.headdim_v = 128;
  key.dtype = DType::bf16, key.num_sms = 132, key.arch = 80;
  EXPECT_EQ(core::static_plan(key).num_splits, 1);
}

TEST(FuzzFindings, SchedulerMetadataLengthsPastTheCapacity) {
  std::vector<int32_t> lengths = {INT32_MAX};  // + 4 new keys overflowed int
  SchedulerArgs a;
  a.batch_size = 1, a.max_seqlen_q = 1, a.max_seqlen_k = 64, a.num_heads_q = 1, a.num_heads_kv = 1;
  a.headdim = 64, a.max_seqlen_k_new = 4;
  a.cache_seqlens = TensorView::contiguous(lengths.data(), DType::i32, {1});
  try {
    get_scheduler_metadata(a);
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "cache_seqlens");
    EXPECT_STREQ(e.what(), "cache_seqlens[0] + new keys = 2147483651 exceeds max_seqlen_k = 64 "
                           "(the cache capacity)");
  }
}

TEST(BadInput, TableCoversAtLeastSixtyCalls) { EXPECT_GE(bad_calls().size(), 60u); }

}  // namespace
}  // namespace kvflash::testing
