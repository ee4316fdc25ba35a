// Helpers of the CUDA host tests (test_cuda_host.cpp, test_cuda_fp8.cpp, test_cuda_mla_fp8.cpp):
// the instantiation table as the dispatcher reads it, what the CUDA backend supports of a call, and
// the calls the tests build (a decode call and an MLA call with their own buffers, a prefill key).
#pragma once

#include <cstdint>
#include <vector>

#include "core/planner.h"
#include "core/problem.h"
#include "cuda/host/call_params.h"
#include "kvflash/errors.h"
#include "kvflash/kvflash.h"

namespace kvflash::testing {

// The instantiation table (src/cuda/instantiations.def), read as the dispatcher's table is: a row
// reads a query of its 16-bit type over a cache of that type, or (<query>_e4m3) over an fp8 cache,
// or (e4m3, the sm90 family's all-fp8 rows) an e4m3 query over an fp8 cache.
struct RowType {
  DType query;
  bool fp8_cache = false;
};
struct TableRow {
  KernelFamily family;
  RowType type;
  int headdim, headdim_v;
};
inline constexpr DType bf16 = DType::bf16;
inline constexpr DType f16 = DType::f16;
inline constexpr RowType row_bf16{bf16}, row_f16{f16}, row_bf16_e4m3{bf16, true}, row_f16_e4m3{f16, true},
    row_e4m3{DType::e4m3, true};
#define KVFLASH_INSTANTIATION(family, dtype, d, dv) TableRow{KernelFamily::family, row_##dtype, d, dv},
inline constexpr TableRow kTable[] = {
#include "cuda/instantiations.def"
};
#undef KVFLASH_INSTANTIATION

// query: the attention kernel's (bf16 for an fp8 q converted first, e4m3 where the kernel reads it).
inline bool in_table(const KernelChoice& k, DType query, bool fp8_cache = false) {
  for (const TableRow& row : kTable) {
    if (row.family == k.family && row.type.query == query && row.type.fp8_cache == fp8_cache &&
        row.headdim == k.headdim && row.headdim_v == k.headdim_v) {
      return true;
    }
  }
  return false;
}

inline bool cuda_supports(const core::Problem& p, const Outputs& outputs) {
  try {
    cuda::check_supported(p, outputs);
    return true;
  } catch (const Error&) {
    return false;
  }
}

// A call validated and resolved, with its plan key for a GPU of 132 SMs of the given arch (an
// H100 / H200 by default).
inline core::Problem planned_problem(const KvCacheArgs& args, int arch = 90) {
  validate(args);
  core::Problem p = core::resolve(args);
  p.key = core::plan_key(p, core::DeviceInfo{132, arch});
  return p;
}

// A prefill call's key before canonical_key: 4096 query rows and keys, 16 heads, d 128, bf16.
inline PlanKey prefill_key() {
  PlanKey raw;
  raw.batch = 1, raw.max_seqlen_q = 4096, raw.max_seqlen_k = 4096;
  raw.num_heads = raw.num_heads_k = 16, raw.headdim = raw.headdim_v = 128, raw.dtype = DType::bf16;
  return raw;
}

// A decode call with its own (dense) buffers: batch x 1 query row, 4/2 heads, d 64, s_k 256.
struct DecodeCall {
  int batch;
  std::vector<uint16_t> q, k_cache, v_cache, k, v, cos, sin, out;
  std::vector<float> lse;
  KvCacheArgs args;
  Outputs outputs;

  explicit DecodeCall(int b, bool rotary = false) : batch(b) {
    const int h = 4, hk = 2, d = 64, s_k = 256;
    q.resize(size_t(b) * h * d), out.resize(q.size()), lse.resize(size_t(b) * h);
    k_cache.resize(size_t(b) * s_k * hk * d), v_cache.resize(k_cache.size());
    k.resize(size_t(b) * hk * d), v.resize(k.size());
    args.q = TensorView::contiguous(q.data(), DType::bf16, {b, 1, h, d});
    args.k_cache = TensorView::contiguous(k_cache.data(), DType::bf16, {b, s_k, hk, d});
    args.v_cache = TensorView::contiguous(v_cache.data(), DType::bf16, {b, s_k, hk, d});
    args.k = TensorView::contiguous(k.data(), DType::bf16, {b, 1, hk, d});
    args.v = TensorView::contiguous(v.data(), DType::bf16, {b, 1, hk, d});
    args.cache_seqlens_value = 100;
    if (rotary) {
      cos.resize(size_t(s_k) * d / 2), sin.resize(cos.size());
      args.rotary_cos = TensorView::contiguous(cos.data(), DType::bf16, {s_k, d / 2});
      args.rotary_sin = TensorView::contiguous(sin.data(), DType::bf16, {s_k, d / 2});
    }
    outputs.out = TensorView::contiguous(out.data(), DType::bf16, {b, 1, h, d});
    outputs.softmax_lse = TensorView::contiguous(lse.data(), DType::f32, {b, h, 1});
  }

  core::Problem problem() const { return planned_problem(args); }
};

// An MLA call (SGLang's FA3 backend): q and k_cache the rotary part (d 64), v_cache the latent
// cache and qv the absorbed query (d_v, 512 by default), `heads` query heads on one KV head, pages
// of 16.
struct MlaCall {
  std::vector<uint16_t> q, qv, k_cache, v_cache, out;
  std::vector<int32_t> page_table;
  std::vector<float> lse;
  KvCacheArgs args;
  Outputs outputs;

  MlaCall(int b, int s_q, int h, int dv = 512) {
    const int d = 64, pages = 4 * b, page = 16;
    q.resize(size_t(b) * s_q * h * d), qv.resize(size_t(b) * s_q * h * dv), out.resize(qv.size());
    k_cache.resize(size_t(pages) * page * d), v_cache.resize(size_t(pages) * page * dv);
    page_table.resize(size_t(pages)), lse.resize(size_t(b) * h * s_q);
    for (size_t i = 0; i < page_table.size(); ++i) page_table[i] = int32_t(i);
    args.q = TensorView::contiguous(q.data(), DType::bf16, {b, s_q, h, d});
    args.qv = TensorView::contiguous(qv.data(), DType::bf16, {b, s_q, h, dv});
    args.k_cache = TensorView::contiguous(k_cache.data(), DType::bf16, {pages, page, 1, d});
    args.v_cache = TensorView::contiguous(v_cache.data(), DType::bf16, {pages, page, 1, dv});
    args.page_table = TensorView::contiguous(page_table.data(), DType::i32, {b, 4});
    args.cache_seqlens_value = 60;
    outputs.out = TensorView::contiguous(out.data(), DType::bf16, {b, s_q, h, dv});
    outputs.softmax_lse = TensorView::contiguous(lse.data(), DType::f32, {b, h, s_q});
  }

  core::Problem problem(int arch = 90) const { return planned_problem(args, arch); }
};

}  // namespace kvflash::testing
