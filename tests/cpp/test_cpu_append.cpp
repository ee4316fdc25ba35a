// CPU backend, step 1: new K/V rows land in the cache exactly (dense, batch-remapped, paged with a
// shuffled page table), rotary rotates keys the way contract 5.2 says, and nothing else is written.
#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <numeric>
#include <random>

#include "kvflash/kvflash.h"
#include "test_cpu_util.h"

namespace kvflash::cpu_test {
namespace {

TEST(CpuAppend, DenseWithBatchIndexWritesExactlyTheNewRows) {
  const int b = 2, s_k = 8, h_k = 2, d = 16, s_new = 2;
  HostTensor q(DType::f16, {b, 1, 4, d}), k_cache(DType::f16, {b, s_k, h_k, d}),
      v_cache(DType::f16, {b, s_k, h_k, d}), k(DType::f16, {b, s_new, h_k, d}),
      v(DType::f16, {b, s_new, h_k, d}), out(DType::f16, {b, 1, 4, d});
  q.fill_random(1);
  k_cache.fill_random(2);
  v_cache.fill_random(3);
  k.fill_random(4);
  v.fill_random(5);
  HostTensor k_expected(DType::f16, {b, s_k, h_k, d}), v_expected(DType::f16, {b, s_k, h_k, d});
  for (int64_t i = 0; i < k_cache.numel(); ++i) {
    k_expected.set(i, k_cache.get(i));
    v_expected.set(i, v_cache.get(i));
  }
  HostTensor seqlens = int_tensor({3, 5}), batch_idx = int_tensor({1, 0});
  const int start[2] = {3, 5}, row[2] = {1, 0};
  for (int bi = 0; bi < b; ++bi)
    for (int t = 0; t < s_new; ++t)
      for (int hk = 0; hk < h_k; ++hk)
        for (int c = 0; c < d; ++c) {
          k_expected.set({row[bi], start[bi] + t, hk, c}, k.get({bi, t, hk, c}));
          v_expected.set({row[bi], start[bi] + t, hk, c}, v.get({bi, t, hk, c}));
        }

  KvCacheArgs args = cache_call(q, k_cache, v_cache, seqlens);
  args.k = k;
  args.v = v;
  args.cache_batch_idx = batch_idx;
  flash_attn_with_kvcache(args, Outputs{out});
  EXPECT_EQ(k_cache.bytes(), k_expected.bytes());
  EXPECT_EQ(v_cache.bytes(), v_expected.bytes());
}

// Without rotary tables rotary_seqlens is ignored: entries as large as INT32_MAX (no position
// arithmetic may overflow on them; UBSan reports it in scripts/sanitize.sh) append the same rows.
TEST(CpuAppend, RotarySeqlensIgnoredWithoutRotary) {
  const int b = 2, s_k = 8, h_k = 2, d = 16, s_new = 2;
  HostTensor q(DType::bf16, {b, 1, 4, d}), k(DType::bf16, {b, s_new, h_k, d}), v(DType::bf16, {b, s_new, h_k, d});
  q.fill_random(1);
  k.fill_random(2);
  v.fill_random(3);
  HostTensor seqlens = int_tensor({3, 6}), rotary_seqlens(DType::i32, {b});
  std::fill_n(rotary_seqlens.view().ptr<int32_t>(), b, std::numeric_limits<int32_t>::max());
  std::vector<std::vector<unsigned char>> caches;
  for (bool with_rotary_seqlens : {false, true}) {
    HostTensor k_cache(DType::bf16, {b, s_k, h_k, d}), v_cache(DType::bf16, {b, s_k, h_k, d}), out(DType::bf16, {b, 1, 4, d});
    k_cache.fill_random(4);
    v_cache.fill_random(5);
    KvCacheArgs args = cache_call(q, k_cache, v_cache, seqlens);
    args.k = k;
    args.v = v;
    if (with_rotary_seqlens) args.rotary_seqlens = rotary_seqlens;
    flash_attn_with_kvcache(args, Outputs{out});
    caches.push_back(k_cache.bytes());
    caches.push_back(v_cache.bytes());
    caches.push_back(out.bytes());
  }
  EXPECT_EQ(caches[0], caches[3]);
  EXPECT_EQ(caches[1], caches[4]);
  EXPECT_EQ(caches[2], caches[5]);
}

// The same logical cache, paged (page size 3, shuffled pages) and dense: the appended rows land
// at page_table[r, pos / 3], slot pos % 3, and attention gives bit-identical outputs.
TEST(CpuAppend, PagedWithShuffledPagesMatchesDense) {
  const int b = 2, h = 4, h_k = 2, d = 32, page = 3, pages_per_seq = 4, num_pages = 10, s_new = 3;
  const int s_k = page * pages_per_seq;
  std::vector<int32_t> perm(num_pages);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), std::mt19937(7));
  HostTensor page_table(DType::i32, {b, pages_per_seq});
  for (int i = 0; i < b * pages_per_seq; ++i) page_table.set(i, float(perm[size_t(i)]));

  HostTensor dense_k(DType::bf16, {b, s_k, h_k, d}), dense_v(DType::bf16, {b, s_k, h_k, d});
  HostTensor paged_k(DType::bf16, {num_pages, page, h_k, d}), paged_v(DType::bf16, {num_pages, page, h_k, d});
  dense_k.fill_random(11);
  dense_v.fill_random(12);
  paged_k.fill(std::numeric_limits<float>::quiet_NaN());  // unused slots must never be read
  paged_v.fill(std::numeric_limits<float>::quiet_NaN());
  for (int bi = 0; bi < b; ++bi)
    for (int pos = 0; pos < s_k; ++pos)
      for (int hk = 0; hk < h_k; ++hk)
        for (int c = 0; c < d; ++c) {
          const int pg = perm[size_t(bi * pages_per_seq + pos / page)];
          paged_k.set({pg, pos % page, hk, c}, dense_k.get({bi, pos, hk, c}));
          paged_v.set({pg, pos % page, hk, c}, dense_v.get({bi, pos, hk, c}));
        }
  HostTensor q(DType::bf16, {b, 2, h, d}), k(DType::bf16, {b, s_new, h_k, d}), v(DType::bf16, {b, s_new, h_k, d});
  q.fill_random(13);
  k.fill_random(14);
  v.fill_random(15);
  HostTensor seqlens = int_tensor({4, 9});
  HostTensor out_dense(DType::bf16, {b, 2, h, d}), out_paged(DType::bf16, {b, 2, h, d});
  HostTensor lse_dense(DType::f32, {b, h, 2}), lse_paged(DType::f32, {b, h, 2});

  KvCacheArgs args;
  args.q = q;
  args.k = k;
  args.v = v;
  args.cache_seqlens = seqlens;
  args.causal = true;
  args.k_cache = dense_k;
  args.v_cache = dense_v;
  flash_attn_with_kvcache(args, Outputs{out_dense, lse_dense.view()});
  args.k_cache = paged_k;
  args.v_cache = paged_v;
  args.page_table = page_table;
  flash_attn_with_kvcache(args, Outputs{out_paged, lse_paged.view()});

  const int start[2] = {4, 9};
  for (int bi = 0; bi < b; ++bi)
    for (int t = 0; t < s_new; ++t)
      for (int hk = 0; hk < h_k; ++hk)
        for (int c = 0; c < d; ++c) {
          const int pos = start[bi] + t;
          const int pg = perm[size_t(bi * pages_per_seq + pos / page)];
          ASSERT_EQ(paged_k.get({pg, pos % page, hk, c}), k.get({bi, t, hk, c}));
          ASSERT_EQ(paged_v.get({pg, pos % page, hk, c}), v.get({bi, t, hk, c}));
          ASSERT_EQ(dense_k.get({bi, pos, hk, c}), k.get({bi, t, hk, c}));
        }
  EXPECT_EQ(out_dense.bytes(), out_paged.bytes());
  EXPECT_EQ(lse_dense.bytes(), lse_paged.bytes());
}

// One new key x = (1, 2, ..., 32), rotary_dim 16, at position cache_seqlens = 2 with
// cos = 0.5 and sin = 0.25 * (p + 1) for pair p (other rows hold a value that would show).
void check_rotary(bool interleaved) {
  const int d = 32, rotary_dim = 16, half = rotary_dim / 2, s_k = 6;
  HostTensor q(DType::f32, {1, 1, 1, d}), k_cache(DType::f32, {1, s_k, 1, d}), v_cache(DType::f32, {1, s_k, 1, d});
  HostTensor k(DType::f32, {1, 1, 1, d}), v(DType::f32, {1, 1, 1, d}), out(DType::f32, {1, 1, 1, d});
  HostTensor cos(DType::f32, {s_k, half}), sin(DType::f32, {s_k, half});
  cos.fill(7.0f);
  sin.fill(7.0f);
  for (int p = 0; p < half; ++p) {
    cos.set({2, p}, 0.5f);
    sin.set({2, p}, 0.25f * float(p + 1));
  }
  for (int c = 0; c < d; ++c) k.set(c, float(c + 1));
  HostTensor seqlens = int_tensor({2});
  KvCacheArgs args = cache_call(q, k_cache, v_cache, seqlens);
  args.k = k;
  args.v = v;
  args.rotary_cos = cos;
  args.rotary_sin = sin;
  args.rotary_interleaved = interleaved;
  flash_attn_with_kvcache(args, Outputs{out});

  std::vector<float> expected(d);
  for (int c = 0; c < d; ++c) expected[size_t(c)] = float(c + 1);
  for (int p = 0; p < half; ++p) {
    const int i1 = interleaved ? 2 * p : p, i2 = interleaved ? 2 * p + 1 : p + half;
    const float x1 = float(i1 + 1), x2 = float(i2 + 1), c = 0.5f, s = 0.25f * float(p + 1);
    expected[size_t(i1)] = x1 * c - x2 * s;
    expected[size_t(i2)] = x1 * s + x2 * c;
  }
  for (int c = 0; c < d; ++c) EXPECT_EQ(k_cache.get({0, 2, 0, c}), expected[size_t(c)]) << "channel " << c;
}

TEST(CpuAppend, RotaryInterleavedRotatesAdjacentPairs) { check_rotary(true); }
TEST(CpuAppend, RotaryNeoxRotatesHalves) { check_rotary(false); }

}  // namespace
}  // namespace kvflash::cpu_test
