// Context parallelism on the CPU backend: one call's cache sharded over 1-4 ranks (threads of an
// InProcessGroup), each rank attending to its own positions with the mask in global positions,
// the partials merged through their LSE. Every result is compared with the unsharded call on the
// whole cache (and one case with the float64 oracle); appended K/V are checked on their owners.
//
// Tolerances: float32 inputs: the sharded and unsharded calls differ only by the order of float
// sums and one exp/log round trip in the merge, |out| <= 1 here: 3e-5 absolute on out and LSE.
// bfloat16: each rank's partial out is rounded to bf16 by the public call before the merge, so
// out may differ by a few bf16 ulps of |out| <= 1 (2^-8 each): 1.6e-2 absolute; LSE stays fp32.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "kvflash/context_parallel.h"
#include "oracle/oracle.h"
#include "parallel/shard_calls.h"
#include "cpp/test_cpu_util.h"

namespace kvflash {
namespace {

using cp::ShardLayout;
using cpu_test::HostTensor;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

struct Case {
  DType dtype = DType::f32;
  int batch = 3;
  int heads = 4;
  int heads_k = 2;
  int headdim = 16;
  int seqlen_q = 1;
  int seqlen_new = 0;
  std::vector<int32_t> cached{37, 64, 5};  // global tokens in the cache before the step
  bool causal = true;
  int window_left = -1;
  int window_right = -1;
  int chunk = 0;
  bool paged = true;
  int page_size = 8;     // of the unsharded cache
  int capacity = 96;     // positions per sequence of the unsharded cache
  bool sinks = false;
  bool with_oracle = false;
};

int64_t max_total(const Case& c) {
  return *std::max_element(c.cached.begin(), c.cached.end()) + c.seqlen_new;
}

// A cache for `batch` sequences of `capacity` positions, dense or paged through a shuffled page
// table, every slot NaN until written (so a read of a slot the call must not see shows up).
struct HostCache {
  bool paged;
  int page_size;
  int64_t capacity;
  int pages_per_seq;
  HostTensor k, v;
  HostTensor page_table;

  HostCache(const Case& c, int64_t cap, bool is_paged, int ps, std::mt19937& rng)
      : paged(is_paged),
        page_size(is_paged ? ps : 1),
        capacity(is_paged ? (cap + ps - 1) / ps * ps : cap),
        pages_per_seq(is_paged ? int((cap + ps - 1) / ps) : 0),
        k(cache_tensor(c, is_paged ? int64_t(c.batch) * pages_per_seq + 3 : c.batch, is_paged ? ps : capacity)),
        v(cache_tensor(c, is_paged ? int64_t(c.batch) * pages_per_seq + 3 : c.batch, is_paged ? ps : capacity)),
        page_table(DType::i32, {c.batch, std::max(pages_per_seq, 1)}) {
    k.fill(kNaN);
    v.fill(kNaN);
    std::vector<int32_t> pages(size_t(num_pages(c)));
    std::iota(pages.begin(), pages.end(), 0);
    std::shuffle(pages.begin(), pages.end(), rng);
    for (int64_t i = 0; i < page_table.numel(); ++i) page_table.set(i, float(pages[size_t(i)]));
  }
  static HostTensor cache_tensor(const Case& c, int64_t rows, int64_t positions) {
    return HostTensor(c.dtype, {rows, positions, c.heads_k, c.headdim});
  }
  int64_t num_pages(const Case& c) const { return int64_t(c.batch) * pages_per_seq + 3; }

  // Element offset of (sequence row, position, kv head 0, channel 0).
  int64_t offset(int row, int64_t pos) const {
    const TensorView& t = k.view();
    if (!paged) return row * t.strides[0] + pos * t.strides[1];
    const int64_t page = int64_t(page_table.get({row, pos / page_size}));
    return page * t.strides[0] + (pos % page_size) * t.strides[1];
  }
  void set_args(KvCacheArgs& a) const {
    a.k_cache = k.view();
    a.v_cache = v.view();
    if (paged) a.page_table = page_table.view();
  }
};

void copy_token(const HostCache& from, int from_row, int64_t from_pos, HostCache& to, int to_row,
                int64_t to_pos, int64_t elements) {
  for (HostTensor* dst : {&to.k, &to.v}) {
    const HostTensor& src = dst == &to.k ? from.k : from.v;
    const int64_t s = from.offset(from_row, from_pos), d = to.offset(to_row, to_pos);
    for (int64_t e = 0; e < elements; ++e) dst->set(d + e, src.get(s + e));
  }
}

bool same_bits(const HostTensor& a, int64_t a_at, const HostTensor& b, int64_t b_at, int64_t n, size_t elem) {
  return std::memcmp(a.bytes().data() + size_t(a_at) * elem, b.bytes().data() + size_t(b_at) * elem,
                     size_t(n) * elem) == 0;
}

struct Outcome {
  std::vector<float> out;  // (b, s_q, h, d)
  std::vector<float> lse;  // (b, h, s_q)
};

Outcome read(const HostTensor& out, const HostTensor& lse) {
  Outcome o;
  for (int64_t i = 0; i < out.numel(); ++i) o.out.push_back(out.get(i));
  for (int64_t i = 0; i < lse.numel(); ++i) o.lse.push_back(lse.get(i));
  return o;
}

void expect_close(const Outcome& want, const Outcome& got, float out_tol, float lse_tol,
                  const std::string& what) {
  ASSERT_EQ(want.out.size(), got.out.size());
  int bad = 0;
  for (size_t i = 0; i < want.out.size() && bad < 5; ++i) {
    if (std::isnan(got.out[i]) || !(std::fabs(want.out[i] - got.out[i]) <= out_tol)) {
      ADD_FAILURE() << what << ": out[" << i << "] " << got.out[i] << ", unsharded " << want.out[i];
      ++bad;
    }
  }
  for (size_t i = 0; i < want.lse.size() && bad < 5; ++i) {
    const bool both_empty = std::isinf(want.lse[i]) && want.lse[i] < 0 && got.lse[i] == want.lse[i];
    if (!both_empty && !(std::fabs(want.lse[i] - got.lse[i]) <= lse_tol)) {
      ADD_FAILURE() << what << ": lse[" << i << "] " << got.lse[i] << ", unsharded " << want.lse[i];
      ++bad;
    }
  }
}

std::string describe(const ShardLayout& layout) {
  return std::string(layout.kind == ShardLayout::Kind::contiguous ? "contiguous" : "strided") +
         " world_size " + std::to_string(layout.world_size);
}

// Runs the call unsharded and sharded by `layout`; compares outputs and the appended K/V.
void check_sharded(const Case& c, const ShardLayout& layout) {
  SCOPED_TRACE(describe(layout));
  std::mt19937 rng(1234);
  const int64_t kv_row = int64_t(c.heads_k) * c.headdim;
  HostCache global(c, c.capacity, c.paged, c.page_size, rng);
  HostTensor fill(c.dtype, {kv_row});
  for (int b = 0; b < c.batch; ++b) {
    for (int64_t pos = 0; pos < c.cached[size_t(b)]; ++pos) {
      fill.fill_random(uint64_t(b * 1000 + pos + 1));
      for (HostTensor* t : {&global.k, &global.v}) {
        for (int64_t e = 0; e < kv_row; ++e) t->set(global.offset(b, pos) + e, fill.get(e) * (t == &global.k ? 1.0f : 0.5f));
      }
    }
  }
  const int w = layout.world_size;
  std::vector<std::unique_ptr<HostCache>> ranks;
  for (int r = 0; r < w; ++r) {
    const int64_t owned = std::max<int64_t>(layout.owned_before(r, c.capacity), 1);
    ranks.push_back(std::make_unique<HostCache>(c, owned, c.paged, 4, rng));  // its own page size
    for (int b = 0; b < c.batch; ++b) {
      for (int64_t pos = 0; pos < c.cached[size_t(b)]; ++pos) {
        if (layout.owner(pos) == r) copy_token(global, b, pos, *ranks[size_t(r)], b, layout.owned_before(r, pos), kv_row);
      }
    }
  }

  HostTensor q(c.dtype, {c.batch, c.seqlen_q, c.heads, c.headdim});
  q.fill_random(7);
  const int64_t s_new = std::max(c.seqlen_new, 1);
  HostTensor k(c.dtype, {c.batch, s_new, c.heads_k, c.headdim}), v(c.dtype, {c.batch, s_new, c.heads_k, c.headdim});
  k.fill_random(8);
  v.fill_random(9);
  HostTensor sinks(DType::f32, {c.heads});
  for (int h = 0; h < c.heads; ++h) sinks.set(h, 0.3f * float(h) - 0.5f);
  HostTensor seqlens(DType::i32, {c.batch});
  for (int b = 0; b < c.batch; ++b) seqlens.set(b, float(c.cached[size_t(b)]));

  KvCacheArgs base;
  base.q = q.view();
  if (c.seqlen_new > 0) {
    base.k = k.view();
    base.v = v.view();
  }
  base.causal = c.causal;
  base.window_left = c.window_left;
  base.window_right = c.window_right;
  base.attention_chunk = c.chunk;
  if (c.sinks) base.sinks = sinks.view();
  RunOptions options;
  options.num_threads = 1;

  KvCacheArgs whole = base;
  global.set_args(whole);
  whole.cache_seqlens = seqlens.view();
  std::optional<oracle::OracleResult> expected;
  if (c.with_oracle) expected = oracle::run_oracle(whole);
  HostTensor out_ref(c.dtype, {c.batch, c.seqlen_q, c.heads, c.headdim});
  HostTensor lse_ref(DType::f32, {c.batch, c.heads, c.seqlen_q});
  Outputs ref_outputs;
  ref_outputs.out = out_ref.view();
  ref_outputs.softmax_lse = lse_ref.view();
  flash_attn_with_kvcache(whole, ref_outputs, options);
  const Outcome want = read(out_ref, lse_ref);

  cp::InProcessGroup group(w);
  std::vector<std::unique_ptr<HostTensor>> outs, lses;
  std::vector<std::string> errors(static_cast<size_t>(w));
  std::vector<std::thread> threads;
  for (int r = 0; r < w; ++r) {
    outs.push_back(std::make_unique<HostTensor>(c.dtype, std::initializer_list<int64_t>{c.batch, c.seqlen_q, c.heads, c.headdim}));
    lses.push_back(std::make_unique<HostTensor>(DType::f32, std::initializer_list<int64_t>{c.batch, c.heads, c.seqlen_q}));
  }
  for (int r = 0; r < w; ++r) {
    threads.emplace_back([&, r] {
      cp::ShardArgs shard;
      shard.call = base;
      ranks[size_t(r)]->set_args(shard.call);
      shard.global_cache_seqlens = c.cached;
      shard.layout = layout;
      shard.rank = r;
      Outputs outputs;
      outputs.out = outs[size_t(r)]->view();
      outputs.softmax_lse = lses[size_t(r)]->view();
      try {
        cp::flash_attn_with_kvcache_cp(group.communicator(r), shard, outputs, options);
      } catch (const std::exception& e) {
        errors[size_t(r)] = e.what();
      }
    });
  }
  for (std::thread& t : threads) t.join();

  const bool f32 = c.dtype == DType::f32;
  for (int r = 0; r < w; ++r) {
    ASSERT_EQ(errors[size_t(r)], "") << "rank " << r;
    expect_close(want, read(*outs[size_t(r)], *lses[size_t(r)]), f32 ? 3e-5f : 1.6e-2f, 3e-5f,
                 "rank " + std::to_string(r));
  }
  if (expected) {  // the float64 oracle, for the sharded result itself
    const Outcome got = read(*outs[0], *lses[0]);
    for (int64_t token = 0; token < int64_t(c.batch) * c.seqlen_q; ++token) {
      for (int h = 0; h < c.heads; ++h) {
        for (int x = 0; x < c.headdim; ++x) {
          const size_t at = size_t((token * c.heads + h) * c.headdim + x);
          EXPECT_NEAR(got.out[at], expected->out[at], 3e-5) << "token " << token << " head " << h;
        }
        const double lse = expected->lse[size_t(expected->lse_index(token, h))];
        const float got_lse = got.lse[size_t(expected->lse_index(token, h))];
        if (std::isinf(lse)) {
          EXPECT_EQ(got_lse, float(lse));
        } else {
          EXPECT_NEAR(got_lse, lse, 3e-5);
        }
      }
    }
  }
  // Each new token is on its owner, bit for bit as the unsharded call stored it.
  const size_t elem = dtype_size(c.dtype);
  for (int b = 0; b < c.batch; ++b) {
    for (int64_t pos = c.cached[size_t(b)]; pos < c.cached[size_t(b)] + c.seqlen_new; ++pos) {
      const HostCache& owner = *ranks[size_t(layout.owner(pos))];
      const int64_t local = layout.owned_before(layout.owner(pos), pos);
      EXPECT_TRUE(same_bits(owner.k, owner.offset(b, local), global.k, global.offset(b, pos), kv_row, elem))
          << "k of batch " << b << " position " << pos;
      EXPECT_TRUE(same_bits(owner.v, owner.offset(b, local), global.v, global.offset(b, pos), kv_row, elem))
          << "v of batch " << b << " position " << pos;
    }
    for (int r = 0; r < w; ++r) {  // nothing was stored past a rank's owned positions
      const HostCache& cache = *ranks[size_t(r)];
      const int64_t next = layout.owned_before(r, c.cached[size_t(b)] + c.seqlen_new);
      if (next < cache.capacity) {
        EXPECT_TRUE(std::isnan(cache.k.get(cache.offset(b, next)))) << "rank " << r;
      }
    }
  }
}

// Both layouts on 1-4 ranks; the contiguous one splits the longest sequence evenly, the strided
// one deals pages of `unit` positions (the cache's page size unless a test says otherwise).
void check_all_layouts(const Case& c, int unit = 0) {
  for (int w = 1; w <= 4; ++w) {
    const int64_t per_rank = (max_total(c) + w - 1) / w;
    check_sharded(c, ShardLayout::contiguous(w, std::max<int64_t>(per_rank, 1)));
    check_sharded(c, ShardLayout::strided_pages(w, unit > 0 ? unit : c.page_size));
  }
}

TEST(ContextParallel, OwnedBeforeCountsOwnedPositions) {
  for (const ShardLayout& layout : {ShardLayout::contiguous(3, 7), ShardLayout::strided_pages(3, 4),
                                    ShardLayout::strided_pages(4, 1)}) {
    for (int r = 0; r < layout.world_size; ++r) {
      int64_t count = 0;
      for (int64_t pos = 0; pos < 21; ++pos) {
        EXPECT_EQ(layout.owned_before(r, pos), count) << describe(layout) << " rank " << r << " pos " << pos;
        if (layout.owner(pos) == r) ++count;
      }
    }
  }
}

TEST(ContextParallel, CallsReproduceEveryRowsRange) {
  // Ranges of the four expressible kinds, an empty row and a jump, in one sequence of rows.
  const std::vector<cp::LocalRange> ranges{{0, 3}, {0, 4}, {0, 5}, {2, 5}, {3, 5}, {4, 5},
                                           {5, 5}, {6, 9}, {7, 10}, {8, 11}, {20, 30}, {20, 30}};
  const auto calls = cp::calls_for_rows(ranges);
  std::vector<int> covered(ranges.size(), 0);
  for (const cp::ShardCall& call : calls) {
    const int64_t keys = call.seqlen - call.leftpad;
    for (int t = 0; t < call.rows; ++t) {
      const int i = call.row0 + t;
      ++covered[size_t(i)];
      // The call's own mask, bottom-right aligned, as docs/contract.md defines it (5.4).
      const int64_t diag = t + keys - call.rows;
      int64_t lo = 0, hi = keys;
      if (call.window_left >= 0) lo = std::max<int64_t>(lo, diag - call.window_left);
      if (call.window_right >= 0) hi = std::min<int64_t>(hi, diag + call.window_right + 1);
      EXPECT_EQ(call.leftpad + lo, ranges[size_t(i)].lo) << "row " << i;
      EXPECT_EQ(call.leftpad + hi, ranges[size_t(i)].hi) << "row " << i;
    }
  }
  for (size_t i = 0; i < ranges.size(); ++i) EXPECT_EQ(covered[i], i == 6 ? 0 : 1) << "row " << i;
  EXPECT_EQ(calls.size(), 4u);  // [0,3) causal, [3,6) left-sliding, [7,10) band, [10,12) fixed
}

TEST(ContextParallel, WholeSequenceCallWhenOneCallFits) {
  // Causal extend of 4 queries, 10 keys in all: row i sees global keys [0, 7 + i). Rank 1 of
  // three owning [4, 8) sees its keys [0, min(3 + i, 4)): hi grows, then stops - two calls.
  const auto clipped = cp::local_visible_keys(ShardLayout::contiguous(3, 4), 1, 4, 10, -1, 0, 0);
  EXPECT_FALSE(cp::whole_sequence_call(clipped));
  const ShardLayout layout = ShardLayout::contiguous(2, 6);
  const auto tail = cp::local_visible_keys(layout, 1, 4, 12, -1, 0, 0);  // rank 1 owns [6, 12)
  const auto call = cp::whole_sequence_call(tail);
  ASSERT_TRUE(call);
  EXPECT_EQ(call->rows, 4);
  for (int t = 0; t < 4; ++t) EXPECT_EQ(cp::call_range(*call, t).hi, tail[size_t(t)].hi);
  // Rows before the first visible key stay empty under the whole call's diagonal.
  const auto late = cp::local_visible_keys(ShardLayout::contiguous(2, 8), 1, 6, 10, -1, 0, 0);
  const auto late_call = cp::whole_sequence_call(late);
  ASSERT_TRUE(late_call);
  for (int t = 0; t < 6; ++t) {
    const cp::LocalRange r = cp::call_range(*late_call, t);
    EXPECT_EQ(r.hi > r.lo, late[size_t(t)].hi > late[size_t(t)].lo) << "row " << t;
  }
  // Decode: always one call; a rank without keys gets a call without keys.
  EXPECT_TRUE(cp::whole_sequence_call(cp::local_visible_keys(layout, 0, 1, 10, 3, 0, 0)));
  const auto none = cp::whole_sequence_call(cp::local_visible_keys(layout, 1, 1, 5, -1, 0, 0));
  ASSERT_TRUE(none);
  EXPECT_EQ(none->seqlen, none->leftpad);
}

TEST(ContextParallel, InProcessAllGatherOrdersByRank) {
  cp::InProcessGroup group(3);
  std::vector<std::vector<int>> received(3, std::vector<int>(6));
  std::vector<std::string> errors(3);
  std::vector<std::thread> threads;
  for (int r = 0; r < 3; ++r) {
    threads.emplace_back([&, r] {
      const int send[2] = {10 * r, 10 * r + 1};
      cp::Communicator& comm = group.communicator(r);
      comm.all_gather(send, received[size_t(r)].data(), sizeof(send));
      try {  // a byte count that differs between ranks is an error on every rank
        comm.all_gather(send, received[size_t(r)].data(), r == 1 ? 4 : 8);
      } catch (const Error& e) {
        errors[size_t(r)] = e.argument();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(received[size_t(r)], (std::vector<int>{0, 1, 10, 11, 20, 21})) << "rank " << r;
    EXPECT_EQ(errors[size_t(r)], "bytes") << "rank " << r;
  }
}

TEST(ContextParallel, DecodeGqaWithAppend) {
  Case c;
  c.seqlen_new = 1;
  check_all_layouts(c);
}

TEST(ContextParallel, DecodeDenseCacheWithoutAppend) {
  Case c;
  c.paged = false;
  check_all_layouts(c);
}

TEST(ContextParallel, ExtendCausalAcrossShardBoundaries) {
  Case c;
  c.seqlen_q = 13;
  c.seqlen_new = 13;
  c.cached = {40, 0, 17};
  c.with_oracle = true;
  check_all_layouts(c);
  check_all_layouts(c, 3);  // a dealing unit that is not the page size
}

TEST(ContextParallel, ExtendWithMoreQueriesThanKeysHasEmptyRows) {
  Case c;
  c.seqlen_q = 6;
  c.seqlen_new = 2;
  c.cached = {0, 1, 9};
  check_all_layouts(c);
}

TEST(ContextParallel, SlidingWindowCausal) {
  Case c;
  c.seqlen_q = 6;
  c.seqlen_new = 6;
  c.window_left = 9;
  check_all_layouts(c);
}

TEST(ContextParallel, SlidingWindowBothSides) {
  Case c;
  c.causal = false;
  c.seqlen_q = 4;
  c.window_left = 5;
  c.window_right = 3;
  check_all_layouts(c);
}

TEST(ContextParallel, ChunkedLocalAttention) {
  Case c;
  c.seqlen_q = 7;
  c.seqlen_new = 7;
  c.chunk = 12;
  check_all_layouts(c);
}

TEST(ContextParallel, RanksWithoutKeysContributeNothing) {
  Case c;
  c.cached = {10, 3, 0};
  c.seqlen_new = 1;
  for (int w = 2; w <= 4; ++w) check_sharded(c, ShardLayout::contiguous(w, 64));  // ranks >= 1 own nothing
  c.window_left = 2;  // and a window that leaves early ranks with keys outside it
  c.cached = {60, 33, 20};
  check_all_layouts(c);
}

TEST(ContextParallel, SinksCountedOnce) {
  Case c;
  c.sinks = true;
  c.seqlen_q = 3;
  c.seqlen_new = 3;
  check_all_layouts(c);
}

TEST(ContextParallel, Bf16GqaExtend) {
  Case c;
  c.dtype = DType::bf16;
  c.heads = 8;
  c.heads_k = 2;
  c.seqlen_q = 5;
  c.seqlen_new = 5;
  check_all_layouts(c);
}

void expect_rejected(const cp::ShardArgs& shard, const TensorView& out, const TensorView& lse,
                     const std::string& argument) {
  try {
    cp::attend_shard(shard, out, lse);
    ADD_FAILURE() << "accepted; expected an error about " << argument;
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), argument) << e.what();
  }
}

TEST(ContextParallel, RejectsWhatItCannotShard) {
  HostTensor q(DType::f32, {1, 1, 4, 16}), cache(DType::f32, {1, 8, 2, 16});
  HostTensor out(DType::f32, {1, 1, 4, 16}), lse(DType::f32, {1, 1, 4});
  cp::ShardArgs shard;
  shard.call.q = q.view();
  shard.call.k_cache = cache.view();
  shard.call.v_cache = cache.view();
  shard.global_cache_seqlens = {4};
  shard.layout = ShardLayout::contiguous(2, 4);
  shard.call.cache_seqlens_value = 4;
  expect_rejected(shard, out, lse, "cache_seqlens");  // lengths come from the layout
  shard.call.cache_seqlens_value.reset();
  shard.rank = 2;
  expect_rejected(shard, out, lse, "rank");
  shard.rank = 0;
  shard.global_cache_seqlens = {4, 4};
  expect_rejected(shard, out, lse, "global_cache_seqlens");  // one per batch element
  shard.global_cache_seqlens = {9};
  expect_rejected(shard, out, lse, "global_cache_seqlens");  // 8 is beyond 2 ranks of 4
  HostTensor knew(DType::f32, {1, 1, 2, 8});  // head_size 8, the cache has 16
  shard.call.k = knew.view();
  shard.call.v = knew.view();
  expect_rejected(shard, out, lse, "k");  // checked as the contract checks the whole call
  shard.call.k = shard.call.v = std::nullopt;
  shard.layout = ShardLayout::strided_pages(2, 0);
  shard.global_cache_seqlens = {4};
  expect_rejected(shard, out, lse, "page_size");
}

}  // namespace
}  // namespace kvflash
