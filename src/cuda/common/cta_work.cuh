// What one attention CTA works on, shared by the prefill kernel (sm80/prefill_kernel.cuh) and the
// decode kernel (sm80/decode_kernel.cuh): its (sequence, split) column of the grid, the keys its
// query rows may need, and the coalesced store of its finished rows into out (or the split's
// partial).
#pragma once

#include <cuda_runtime.h>

#include "core/mask.h"
#include "cuda/common/fp8.cuh"
#include "cuda/common/lengths.cuh"
#include "cuda/common/mma.cuh"
#include "cuda/common/params.h"
#include "cuda/common/split_rule.cuh"

namespace kvflash::cuda {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

struct CtaColumn {
  int b = 0;         // batch element
  int split = 0;
  int splits_b = 1;  // the element's split count
  SeqLens seq;
};

// The column grid z names: the prepare kernel's list (only the splits the lengths need are
// launched), or z = b * num_splits + split. False: nothing to do (an unused column, or a split
// past the element's count when the combine reads only the used ones).
__device__ __forceinline__ bool cta_column(const AttentionParams& p, int z, CtaColumn& c) {
  c.b = z / p.num_splits;
  c.split = z - c.b * p.num_splits;
  c.splits_b = p.num_splits;
  if (p.split_work) {
    const SplitWork work = p.split_work[z];
    if (work.batch < 0 || work.batch >= p.len.batch) return false;
    c.b = work.batch, c.split = work.split, c.splits_b = work.num_splits;
  } else if (p.splits_per_batch) {
    c.splits_b = p.splits_per_batch[c.b];
  }
  c.seq = seq_lens(p.len, c.b);
  if (p.splits_alone) c.splits_b = splits_alone(p.rule, c.seq.seqlen_q, c.seq.seqlen_k, p.num_splits);
  c.splits_b = clamp_int(c.splits_b, 1, p.num_splits);
  return !(p.single_split_writes_out && c.split >= c.splits_b);
}

// Visible keys of packed row idx (query index idx / group).
__device__ __forceinline__ core::KeyRange row_keys(const AttentionParams& p, const SeqLens& seq, int idx) {
  return core::visible_keys(idx / p.group, seq.seqlen_q, seq.seqlen_k, p.window_left, p.window_right,
                            p.attention_chunk);
}

// Keys packed rows [row0, last_row] may need within the column's split: the union of their
// visible ranges (monotone in the row) cut to the split.
__device__ __forceinline__ core::KeyRange cta_keys(const AttentionParams& p, const CtaColumn& c, int row0, int last_row) {
  const core::KeyRange first = row_keys(p, c.seq, row0);
  const core::KeyRange last = row_keys(p, c.seq, last_row);
  const core::KeyRange split = core::split_keys(c.split, c.splits_b, c.seq.seqlen_k, p.split_block_n);
  return core::KeyRange{max(first.lo, split.lo), min(last.hi, split.hi)};
}

// Packed row idx (query index idx / group, head hk * group + idx % group) of the column's
// sequence in a (batch, token, head) tensor: q or qv.
template <class Elem>
__device__ __forceinline__ const Elem* packed_row(const RowLayout& t, const AttentionParams& p, const CtaColumn& c,
                                                  int hk, int idx) {
  const int i = idx / p.group;
  const int64_t batch = p.len.cu_seqlens_q.data ? 0 : int64_t(c.b) * t.batch_stride;
  return static_cast<const Elem*>(t.data) + batch + int64_t(c.seq.q_offset + i) * t.token_stride +
         (hk * p.group + (idx - i * p.group)) * t.head_stride;
}

// Does the split add the sinks' term? (split 0 only, so the combine counts it once.)
__device__ __forceinline__ bool adds_sink(const AttentionParams& p, const CtaColumn& c) {
  return (p.sinks_f32 || p.sinks_bf16) && c.split == 0;
}

// The sink logit of packed row idx of KV head hk, in log2 units.
__device__ __forceinline__ float sink_log2(const AttentionParams& p, int hk, int idx) {
  const int64_t head = hk * p.group + idx % p.group;
  return kLog2e * (p.sinks_f32 ? p.sinks_f32[head * p.sinks_stride]
                               : __bfloat162float(__ushort_as_bfloat16(p.sinks_bf16[head * p.sinks_stride])));
}

// Folds the sink's term (log2 units) into a finished row's state (max m in log2 units, sum l);
// returns the factor the keys' output takes (below 1 when the sink raises the maximum).
__device__ __forceinline__ float fold_sink(float sink, float& m, float& l) {
  const float with_sink = fmaxf(m, sink);
  const float keys_scale = m == -INFINITY ? 0.0f : fast_exp2(m - with_sink);
  l = l * keys_scale + fast_exp2(sink - with_sink);
  m = with_sink;
  return keys_scale;
}

// Where a CTA's finished rows go: out (or the split's partial, see single_split_writes_out).
struct RowDestination {
  int b = 0, split = 0, q_offset = 0, packed_rows = 0;
  bool partial = false;
  RowDestination() = default;
  __device__ __forceinline__ RowDestination(const AttentionParams& p, const CtaColumn& c)
      : b(c.b), split(c.split), q_offset(c.seq.q_offset), packed_rows(c.seq.seqlen_q * p.group),
        partial(p.num_splits > 1 && (c.splits_b > 1 || !p.single_split_writes_out)) {}
};

// Writes rows [row0, row0 + rows) of KV head hk from value(r, c) -> float4 of channels c..c+3,
// and their LSE from lse(r); rows past the sequence are skipped. Threads [0, threads) take part
// (every thread of the CTA unless the kernel says otherwise; `thread` is this one's index).
// Thread t takes the (row, 8-channel group) elements t, t + threads, ... in row-major order (head
// dims are multiples of 8: one 16-byte store each), walked by a fixed step: the divisions by the
// groups per row happen once per thread, not per element (per element they were a third of the
// sm90 prefill kernel's instructions at 32 x 512 tokens).
template <class Elem, class Value, class Lse>
__device__ __forceinline__ void store_rows(const AttentionParams& p, const RowDestination& dst_rows, int hk,
                                           int row0, int rows, Value value, Lse lse, int thread = threadIdx.x,
                                           int threads = blockDim.x) {
  const int groups = p.headdim_v / 8;
  const int row_step = threads / groups, group_step = threads - row_step * groups;
  const int64_t out_batch = p.len.cu_seqlens_q.data ? 0 : dst_rows.b;
  int r = thread / groups, group = thread - r * groups;
  for (; r < rows; r += row_step) {
    const int idx = row0 + r;
    if (idx >= dst_rows.packed_rows) break;  // rows only grow
    const int i = p.group == 1 ? idx : idx / p.group;
    const int head = hk * p.group + (idx - i * p.group);
    const int64_t token = dst_rows.q_offset + i;
    const int ch = group * 8;
    const float4 lo = value(r, ch), hi = value(r, ch + 4);
    if (dst_rows.partial) {
      float* dst = p.out_partial + dst_rows.split * p.op_split_stride + out_batch * p.op_batch_stride +
                   token * p.op_token_stride + head * p.op_head_stride + ch;
      // Scalar stores: a caller's out_accum need only be 4-byte aligned.
      dst[0] = lo.x, dst[1] = lo.y, dst[2] = lo.z, dst[3] = lo.w;
      dst[4] = hi.x, dst[5] = hi.y, dst[6] = hi.z, dst[7] = hi.w;
    } else {
      Elem* dst = static_cast<Elem*>(p.out.data) + out_batch * p.out.batch_stride +
                  token * p.out.token_stride + head * p.out.head_stride + ch;
      *reinterpret_cast<uint4*>(dst) = make_uint4(pack2<Elem>(lo.x, lo.y), pack2<Elem>(lo.z, lo.w),
                                                  pack2<Elem>(hi.x, hi.y), pack2<Elem>(hi.z, hi.w));
    }
    if (ch == 0) {
      if (dst_rows.partial) {
        p.lse_partial[dst_rows.split * p.lp_split_stride + out_batch * p.lp_batch_stride +
                      token * p.lp_token_stride + head * p.lp_head_stride] = lse(r);
      } else if (p.lse) {
        p.lse[out_batch * p.lse_batch_stride + token * p.lse_token_stride + head * p.lse_head_stride] = lse(r);
      }
    }
    group += group_step;
    if (group >= groups) group -= groups, ++r;
  }
}

// Rows with no visible key in the split and no sink: out 0, LSE -inf (by threads [0, threads), as
// store_rows).
template <class Elem>
__device__ __forceinline__ void store_empty_rows(const AttentionParams& p, const RowDestination& dst_rows, int hk,
                                                 int row0, int rows, int thread = threadIdx.x,
                                                 int threads = blockDim.x) {
  store_rows<Elem>(p, dst_rows, hk, row0, rows, [](int, int) { return make_float4(0.0f, 0.0f, 0.0f, 0.0f); },
                   [](int) { return -INFINITY; }, thread, threads);
}

// What an attention CTA over packed rows [row0, row0 + rows) of KV head blockIdx.y starts from.
struct CtaStart {
  CtaColumn col;
  int packed_rows = 0;   // of the sequence
  core::KeyRange keys;   // the keys its rows may need in its split
  bool add_sink = false;
  RowDestination dst_rows;
};

// The common start of both attention kernels. False: the CTA is done (nothing to do, or its rows
// see no key and no sink, and were written as such, in the output's type Out).
template <class Out>
__device__ __forceinline__ bool start_cta(const AttentionParams& p, int row0, int rows, CtaStart& s) {
  wait_for_prerequisites();  // the kernel may overlap the stream's previous one (launch.cuh)
  // The combine's CTAs may start their prologue now: what it reads before its own wait (lengths,
  // split counts) was complete before this kernel's wait returned.
  launch_dependents();
  if (!cta_column(p, blockIdx.z, s.col)) return false;
  s.packed_rows = s.col.seq.seqlen_q * p.group;
  if (row0 >= s.packed_rows) return false;
  s.keys = cta_keys(p, s.col, row0, min(row0 + rows, s.packed_rows) - 1);
  s.add_sink = adds_sink(p, s.col);
  s.dst_rows = RowDestination(p, s.col);
  if (s.keys.lo >= s.keys.hi && !s.add_sink) {  // most CTAs of an unused split: no shared memory touched
    store_empty_rows<Out>(p, s.dst_rows, blockIdx.y, row0, rows);
    return false;
  }
  return true;
}

// Softmax scores reach log2 units through exp_scale, folded into the exponent's FFMA (one
// instruction per score). Softcap, and a scale <= 0 (where max(s) * scale is not max(s * scale)),
// map the scores into log2 units first (map()) and use exp_scale 1. qk_descale: the fp8 descales
// of the q.k product (Fp8Descales::qk), a factor of softmax_scale.
struct ScoreScale {
  bool fold;
  float score_scale, softcap_log2, exp_scale;
  __device__ explicit ScoreScale(const AttentionParams& p, float qk_descale = 1.0f) {
    const bool has_softcap = p.softcap > 0.0f;
    const float scale = p.softmax_scale * qk_descale;
    fold = !has_softcap && scale > 0.0f;
    score_scale = has_softcap ? scale / p.softcap : scale * kLog2e;
    softcap_log2 = p.softcap * kLog2e;
    exp_scale = fold ? score_scale : 1.0f;
  }
  __device__ __forceinline__ float map(float s) const {
    const float x = s * score_scale;
    return softcap_log2 > 0.0f ? softcap_log2 * tanhf(x) : x;
  }
};

// The descales of a CTA over an fp8 cache (contract 5.8): its batch element's and KV head's, for
// the q.k scores (an fp8 q's times the K cache's) and the output (the V cache's).
struct Fp8Descales {
  float qk = 1.0f, v = 1.0f;
  __device__ Fp8Descales(const AttentionParams& p, int b, int hk)
      : qk(descale_at(p.q_descale, b, hk) * descale_at(p.k_descale, b, hk)), v(descale_at(p.v_descale, b, hk)) {}
  Fp8Descales() = default;
};

}  // namespace kvflash::cuda
