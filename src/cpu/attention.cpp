// Step 2 of a call: attention, one task per (batch, group of KV heads, split, query block). A
// task holds the query rows of all g heads that share each of its KV heads (GQA packing), so each
// K/V element is read from memory once per task and serves every row of its group. Per block of
// keys: scores, softcap, mask (by restricting each row to its visible keys, so masked keys are
// never touched), online softmax, P.V. Compiled once per instruction-set level (cpu/isa.h);
// cpu::attend (attention_dispatch.cpp) runs the copy for this CPU.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/mask.h"
#include "cpu/convert.h"
#include "cpu/kernels.h"
#include "cpu/layout.h"
#include "cpu/rotary.h"
// Last: from here on the file is compiled for this copy's instruction set (cpu/isa_target.h).
#include "cpu/microkernels.h"

namespace kvflash::cpu::KVFLASH_CPU_ISA_NS {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr int kKeyBlock = 32;     // keys whose scores are computed at a time
constexpr int kRowsPerTask = 64;  // target query rows (positions x heads) per task
// What every task reads: the problem, resolved per-sequence lengths and derived sizes.
// A task covers `heads_k_per_task` consecutive KV heads (with their g query heads each) so that
// it reads each key's rows of those heads as one contiguous run: rows of a single head sit
// h_k * d apart, a pattern memory prefetchers follow poorly.
struct Context {
  const core::Problem& p;
  const Plan& plan;
  const Outputs& outputs;
  const Partials* partials;  // nullptr: write outputs directly (one split)
  std::vector<core::SeqInfo> seqs;
  Rotary rotary;
  bool use_k;           // scores include q.k
  bool bf16_keys;       // use_k, bf16 q and keys, and this level has dot_rows_bf16 (kBf16Scores)
  int dim, dim_v;       // padded to kLanes
  int dim_bf16;         // padded to kBf16Columns
  int heads_k_per_task = 1;
  int positions_per_task = 1;

  Context(const core::Problem& p_, const Plan& plan_, const Outputs& outputs_, const Partials* partials_,
          int num_threads)
      : p(p_), plan(plan_), outputs(outputs_), partials(partials_), rotary(p_) {
    seqs.resize(size_t(p.batch));
    for (int b = 0; b < p.batch; ++b) seqs[size_t(b)] = core::seq_info(p, b);
    use_k = p.has_q && p.has_k && !p.only_qv;
    bf16_keys = kBf16Scores && use_k && p.args.q->dtype == DType::bf16 && p.args.k_cache->dtype == DType::bf16;
    dim = round_up_lanes(std::max(p.headdim, 1));
    dim_v = round_up_lanes(p.headdim_v);
    dim_bf16 = (std::max(p.headdim, 1) + kBf16Columns - 1) / kBf16Columns * kBf16Columns;
    choose_task_shape(num_threads);
  }
  int splits_of(int b) const { return cpu::splits_of(plan, b); }
  // Whether batch element b's scores come from dot_rows_bf16: where at most kBf16ScoresMaxRows
  // query rows share each key. Decided per sequence, from the call's shape only, so that a row's
  // bits depend neither on the thread count nor on the other sequences of the batch.
  bool bf16_scores(int b) const {
    return bf16_keys && int64_t(p.group) * seqs[size_t(b)].seqlen_q <= kBf16ScoresMaxRows;
  }
  int heads_per_task() const { return heads_k_per_task * p.group; }
  int rows_per_task() const { return positions_per_task * heads_per_task(); }

 private:
  int64_t count_tasks() const {
    int64_t n = 0;
    for (int b = 0; b < p.batch; ++b) {
      const int64_t blocks = (seqs[size_t(b)].seqlen_q + positions_per_task - 1) / positions_per_task;
      n += int64_t(splits_of(b)) * std::max<int64_t>(blocks, 1) * (p.num_heads_k / heads_k_per_task);
    }
    return n;
  }
  // The most KV heads per task that still leaves two tasks per thread and keeps enough query
  // positions per task (prefill) for each key block read to serve many rows.
  void choose_task_shape(int num_threads) {
    int max_seqlen_q = 1;
    for (const core::SeqInfo& s : seqs) max_seqlen_q = std::max(max_seqlen_q, s.seqlen_q);
    const int min_positions = std::min(max_seqlen_q, 16);
    for (int heads = p.num_heads_k; heads >= 1; --heads) {
      if (p.num_heads_k % heads != 0) continue;
      heads_k_per_task = heads;
      positions_per_task = std::max(1, kRowsPerTask / heads_per_task());
      if (heads == 1) return;
      if (heads_per_task() * min_positions > kRowsPerTask) continue;
      if (count_tasks() >= 2 * int64_t(num_threads)) return;  // 2x: slack for dynamic balance
    }
  }
};

struct Task {
  int b, first_head_k, split, first_position;
};

// Per-thread buffers, sized once per call. k / v: the cache rows of the current key block and
// k_next / v_next those of the next one (to prefetch), [head][key], null past the block's end.
// q_bf16 / q_scale: the unscaled query rows and their scales, when the current task's
// bf16_scores is set.
struct Scratch {
  std::vector<float> q, qv, s, acc, m, l, q_scale;
  std::vector<uint16_t> q_bf16;
  bool bf16_scores = false;
  std::vector<const void*> k, v, k_next, v_next;
  std::vector<core::KeyRange> range;
  explicit Scratch(const Context& c) {
    const size_t rows = size_t(c.rows_per_task());
    const size_t keys = size_t(kKeyBlock) * size_t(c.heads_k_per_task);
    q.assign(rows * size_t(c.dim), 0.0f);
    if (c.bf16_keys) {
      q_bf16.assign(rows * size_t(c.dim_bf16), 0);
      q_scale.assign(rows, 0.0f);
    }
    if (c.p.has_qv) qv.assign(rows * size_t(c.dim_v), 0.0f);
    for (auto* rows_of : {&k, &v, &k_next, &v_next}) rows_of->assign(keys, nullptr);
    s.assign(rows * kKeyBlock, 0.0f);
    acc.assign(rows * size_t(c.dim_v), 0.0f);
    m.assign(rows, kNegInf);
    l.assign(rows, 0.0f);
    range.assign(rows, {});
  }
};

// The factors folded into q and qv: softmax_scale, the descales of the fp8 tensors each product
// meets (q.k: an fp8 q's and an fp8 K cache's; qv.v: an fp8 V cache's), and 1/softcap so that
// the dot product is already the argument of tanh.
struct QueryScales {
  float q, qv;
};

QueryScales query_scales(const core::Problem& p, int b, int hk) {
  QueryScales s{p.softmax_scale, p.softmax_scale};
  if (p.fp8) s.q *= descale_at(p.args.q_descale, b, hk);
  if (p.fp8_cache) {
    s.q *= descale_at(p.args.k_descale, b, hk);
    s.qv *= descale_at(p.args.v_descale, b, hk);
  }
  if (p.softcap > 0.0f) {
    s.q /= p.softcap;
    s.qv /= p.softcap;
  }
  return s;
}

void load_scaled_row(DType dtype, const void* src, int n, float scale, float* dst) {
  load_row(dtype, src, n, dst);
  for (int c = 0; c < n; ++c) dst[c] *= scale;
}

// fn(i, h, row) for each row of the task's first `positions` query positions: query index i in the
// sequence, query head h, and row = position * heads_per_task + head within the task.
template <class Fn>
void for_each_task_row(const Context& c, const Task& t, int positions, Fn fn) {
  const int heads = c.heads_per_task();
  for (int ip = 0; ip < positions; ++ip) {
    for (int hl = 0; hl < heads; ++hl) fn(t.first_position + ip, t.first_head_k * c.p.group + hl, ip * heads + hl);
  }
}

// Query rows of the task, rotated when rotary is on, scaled by query_scales.
void load_queries(const Context& c, const Task& t, int positions, Scratch& w) {
  const core::Problem& p = c.p;
  const core::SeqInfo& seq = c.seqs[size_t(t.b)];
  for_each_task_row(c, t, positions, [&](int i, int h, int row) {
    const QueryScales scale = query_scales(p, t.b, h / p.group);
    if (c.use_k) {
      float* q = &w.q[size_t(row) * size_t(c.dim)];
      load_row(p.args.q->dtype, SeqRows(*p.args.q, t.b, seq.q_offset).row(i, h), p.headdim, q);
      if (c.rotary.enabled()) {
        // Rotated in fp32 and rounded to q's type, as if q had been rotated in memory.
        c.rotary.rotate(q, seq.rotary_start + (p.rotate_q_per_row ? i : 0));
        round_row(p.args.q->dtype, q, p.rotary_dim);
      }
      if (w.bf16_scores) {
        store_row(DType::bf16, q, p.headdim, &w.q_bf16[size_t(row) * size_t(c.dim_bf16)]);  // exact
        w.q_scale[size_t(row)] = scale.q;
      }
      for (int x = 0; x < p.headdim; ++x) q[x] *= scale.q;
    }
    if (p.has_qv) {
      load_scaled_row(p.args.qv->dtype, SeqRows(*p.args.qv, t.b, seq.q_offset).row(i, h),
                      p.headdim_v, scale.qv, &w.qv[size_t(row) * size_t(c.dim_v)]);
    }
  });
}

// The cache rows of keys [first, n1) of the block starting at n0, for the task's KV heads, into
// `rows_out` ([head][key - n0]); the other entries of the block become null.
void gather_cache_rows(const Context& c, const TensorView& cache, const Task& t, int n0, int first, int n1,
                       const void** rows_out) {
  const core::SeqInfo& seq = c.seqs[size_t(t.b)];
  const CacheRows rows(cache, c.p);
  std::fill(rows_out, rows_out + size_t(c.heads_k_per_task) * kKeyBlock, nullptr);
  for (int n = first; n < n1; ++n) {
    const char* head0 = rows.row(seq.cache_row, seq.leftpad + n, t.first_head_k);  // one page lookup per key
    for (int hl = 0; hl < c.heads_k_per_task; ++hl) {
      rows_out[size_t(hl) * kKeyBlock + size_t(n - n0)] = head0 + hl * rows.head_stride;
    }
  }
}

// K (when scores use it) and V rows of keys [first, n1) of the block starting at n0.
void gather_block(const Context& c, const Task& t, int n0, int first, int n1, std::vector<const void*>& k,
                  std::vector<const void*>& v) {
  if (c.use_k) gather_cache_rows(c, *c.p.args.k_cache, t, n0, first, n1, k.data());
  gather_cache_rows(c, *c.p.args.v_cache, t, n0, first, n1, v.data());
}

// Online softmax over one row's scores s[0..n): updates max m and sum l, rescales acc, and
// leaves the probabilities in s.
void softmax_update(float* s, int n, float& m, float& l, float* acc, int dim_v) {
  float block_max = kNegInf;
  for (int j = 0; j < n; ++j) block_max = std::max(block_max, s[j]);
  const float m_new = std::max(m, block_max);
  if (m_new == kNegInf) {  // every score -inf: no weight
    for (int j = 0; j < n; ++j) s[j] = 0.0f;
    return;
  }
  if (m_new != m) {
    const float alpha = std::exp(m - m_new);
    l *= alpha;
    const Vec8 a = splat8(alpha);
    for (int x = 0; x < dim_v; x += kLanes) store8(acc + x, mul8(load8(acc + x), a));
    m = m_new;
  }
  const Vec8 mv = splat8(m_new);
  Vec8 sum = zero8();
  int j = 0;
  for (; j + kLanes <= n; j += kLanes) {
    const Vec8 e = exp8(sub8(load8(s + j), mv));
    store8(s + j, e);
    sum = add8(sum, e);
  }
  float total = hsum8(sum);
  for (; j < n; ++j) {
    s[j] = std::exp(s[j] - m_new);
    total += s[j];
  }
  l += total;
}

// Rows [r0, r1) all belong to KV head `head_k` (of the task) and see keys [a, b) of the block
// starting at n0: scores, softcap, softmax, P.V.
void process_rows(const Context& c, int r0, int r1, int head_k, int a, int b, int n0, Scratch& w) {
  const core::Problem& p = c.p;
  const int n = b - a;
  const size_t first_key = size_t(head_k) * kKeyBlock + size_t(a - n0);
  const void* const* keys = &w.k[first_key];
  const void* const* values = &w.v[first_key];
  const DType k_dtype = c.use_k ? p.args.k_cache->dtype : p.dtype;
  const DType v_dtype = p.args.v_cache->dtype;
  // The first tile prefetches the rows the next KV head (or the next block's first) will read;
  // later tiles of this head find them there. Its V rows during the scores and its K rows during
  // P.V: measured faster than the other way round.
  const bool last_head = head_k + 1 == c.heads_k_per_task;
  const size_t next_key = last_head ? size_t(a - n0) : first_key + kKeyBlock;
  const Ahead next_k{&(last_head ? w.k_next : w.k)[next_key], p.headdim * int(dtype_size(k_dtype))};
  const Ahead next_v{&(last_head ? w.v_next : w.v)[next_key], p.headdim_v * int(dtype_size(v_dtype))};
  const Ahead during_scores = c.use_k ? next_v : Ahead{}, during_pv = c.use_k ? next_k : next_v;
  for (int r = r0; r < r1; r += kMaxRowsPerTile) {
    const int rows = std::min(kMaxRowsPerTile, r1 - r);
    const float* q[kMaxRowsPerTile];
    const float* qv[kMaxRowsPerTile];
    float* s[kMaxRowsPerTile];
    float* acc[kMaxRowsPerTile];
    for (int x = 0; x < rows; ++x) {
      q[x] = &w.q[size_t(r + x) * size_t(c.dim)];
      if (p.has_qv) qv[x] = &w.qv[size_t(r + x) * size_t(c.dim_v)];
      s[x] = &w.s[size_t(r + x) * kKeyBlock];
      acc[x] = &w.acc[size_t(r + x) * size_t(c.dim_v)];
    }
    const bool first_tile = r == r0;
    const Ahead scores_ahead = first_tile ? during_scores : Ahead{};
#if KVFLASH_CPU_AVX512_BF16
    if (w.bf16_scores) {
      const uint16_t* q_bf16[kMaxRowsPerTile];
      for (int x = 0; x < rows; ++x) q_bf16[x] = &w.q_bf16[size_t(r + x) * size_t(c.dim_bf16)];
      dispatch_rows<DotBf16Tile>(rows, q_bf16, keys, scores_ahead, n, p.headdim, w.q_scale[size_t(r)], s);
    }
#endif
    if (c.use_k && !w.bf16_scores) dispatch_tile<DotTile>(rows, k_dtype, q, keys, scores_ahead, n, p.headdim, s);
    if (p.has_qv) {
      if (c.use_k) dispatch_tile<DotAddTile>(rows, v_dtype, qv, values, Ahead{}, n, p.headdim_v, s);
      else dispatch_tile<DotTile>(rows, v_dtype, qv, values, Ahead{}, n, p.headdim_v, s);
    }
    for (int x = 0; x < rows; ++x) {
      if (p.softcap > 0.0f) {
        for (int j = 0; j < n; ++j) s[x][j] = p.softcap * std::tanh(s[x][j]);
      }
      softmax_update(s[x], n, w.m[size_t(r + x)], w.l[size_t(r + x)], acc[x], c.dim_v);
    }
    dispatch_tile<AccumulateTile>(rows, v_dtype, s, values, first_tile ? during_pv : Ahead{}, n, p.headdim_v, acc);
  }
}

// Sink logit of head h, added by split 0 only (contract 5.5).
float sink_of(const core::Problem& p, int h, int split) {
  if (!p.has_sinks || split != 0) return kNegInf;
  const TensorView& t = *p.args.sinks;
  return load_scalar(t.dtype, element_at(t, int64_t(h) * t.strides[0]));
}

// Final out (normalised, in place in acc) and LSE of one row.
float finalize_row(float m, float l, float sink, float out_scale, float* acc, int dim_v) {
  float lse = kNegInf, norm = 0.0f;
  const bool has_keys = l > 0.0f && m != kNegInf;  // l NaN also counts as none (contract 5.5)
  if (has_keys) {
    const float top = std::max(m, sink);
    const float denom = l * std::exp(m - top) + (sink == kNegInf ? 0.0f : std::exp(sink - top));
    lse = top + std::log(denom);
    norm = std::exp(m - top) / denom * out_scale;
  } else if (sink != kNegInf) {
    lse = sink;
  }
  for (int x = 0; x < dim_v; ++x) acc[x] = has_keys ? acc[x] * norm : 0.0f;
  return lse;
}

void write_rows(const Context& c, const Task& t, int positions, Scratch& w) {
  const core::Problem& p = c.p;
  const core::SeqInfo& seq = c.seqs[size_t(t.b)];
  const SeqRows out(c.outputs.out, t.b, seq.q_offset);
  for_each_task_row(c, t, positions, [&](int i, int h, int row) {
    const float out_scale = p.fp8_cache ? descale_at(p.args.v_descale, t.b, h / p.group) : 1.0f;
    float* acc = &w.acc[size_t(row) * size_t(c.dim_v)];
    const float lse = finalize_row(w.m[size_t(row)], w.l[size_t(row)], sink_of(p, h, t.split),
                                   out_scale, acc, p.headdim_v);
    if (c.partials) {
      const HeadRowIndex lse_at(c.partials->lse, p.varlen_q, true);
      const HeadRowIndex out_at(c.partials->out, p.varlen_q, true);
      *lse_at.ptr(t.split, t.b, h, i, seq.q_offset) = lse;
      std::copy(acc, acc + p.headdim_v, out_at.ptr(t.split, t.b, h, i, seq.q_offset));
      return;
    }
    store_row(c.outputs.out.dtype, acc, p.headdim_v, out.row(i, h));
    if (c.outputs.softmax_lse) {
      *HeadRowIndex(*c.outputs.softmax_lse, p.varlen_q, false).ptr(0, t.b, h, i, seq.q_offset) = lse;
    }
  });
}

void run_task(const Context& c, const Task& t, Scratch& w) {
  const core::Problem& p = c.p;
  const core::SeqInfo& seq = c.seqs[size_t(t.b)];
  const int positions = std::min(c.positions_per_task, seq.seqlen_q - t.first_position);
  const int heads = c.heads_per_task();
  const int rows = positions * heads;
  const core::KeyRange split = core::split_keys(t.split, c.splits_of(t.b), seq.seqlen_k,
                                                std::max(1, c.plan.block_n));
  // Each row's visible keys within this split; the task reads the union.
  int lo = split.hi, hi = split.lo;
  for (int ip = 0; ip < positions; ++ip) {
    core::KeyRange r = core::visible_keys(t.first_position + ip, seq.seqlen_q, seq.seqlen_k,
                                          p.window_left, p.window_right, p.attention_chunk);
    r.lo = std::max(r.lo, split.lo);
    r.hi = std::min(r.hi, split.hi);
    if (r.lo < r.hi) {
      lo = std::min(lo, r.lo);
      hi = std::max(hi, r.hi);
    }
    std::fill_n(w.range.begin() + ip * heads, heads, r);
  }
  std::fill(w.m.begin(), w.m.begin() + rows, kNegInf);
  std::fill(w.l.begin(), w.l.begin() + rows, 0.0f);
  std::fill(w.acc.begin(), w.acc.begin() + size_t(rows) * size_t(c.dim_v), 0.0f);
  if (lo < hi) {
    w.bf16_scores = c.bf16_scores(t.b);
    load_queries(c, t, positions, w);
    // Blocks start at fixed offsets from the split's first key, so a row meets the same blocks
    // (and gets the same bits) whatever task shape the thread count led to.
    const int start = split.lo + (lo - split.lo) / kKeyBlock * kKeyBlock;
    gather_block(c, t, start, std::max(start, lo), std::min(start + kKeyBlock, hi), w.k, w.v);
    for (int n0 = start; n0 < hi; n0 += kKeyBlock) {
      const int n1 = std::min(n0 + kKeyBlock, hi);
      const int next = n0 + kKeyBlock;
      gather_block(c, t, next, next, std::min(next + kKeyBlock, hi), w.k_next, w.v_next);
      // Runs of consecutive rows of one KV head with the same keys in this block (the g query
      // heads of a position always form one) share the micro-kernels.
      for (int r = 0; r < rows;) {
        const int head_k = (r % heads) / p.group;
        const int a = std::max(w.range[size_t(r)].lo, n0), b = std::min(w.range[size_t(r)].hi, n1);
        int end = r + 1;
        while (end < rows && (end % heads) / p.group == head_k &&
               std::max(w.range[size_t(end)].lo, n0) == a && std::min(w.range[size_t(end)].hi, n1) == b) {
          ++end;
        }
        if (a < b) process_rows(c, r, end, head_k, a, b, n0, w);
        r = end;
      }
      std::swap(w.k, w.k_next);
      std::swap(w.v, w.v_next);
    }
  }
  write_rows(c, t, positions, w);
}

// Split slices a batch element does not use: out 0, LSE -inf, so readers of out_accum are safe.
void write_empty_slices(const Context& c, int b) {
  const core::Problem& p = c.p;
  const core::SeqInfo& seq = c.seqs[size_t(b)];
  const HeadRowIndex lse_at(c.partials->lse, p.varlen_q, true);
  const HeadRowIndex out_at(c.partials->out, p.varlen_q, true);
  for (int split = c.splits_of(b); split < c.plan.num_splits; ++split) {
    for (int h = 0; h < p.num_heads; ++h) {
      for (int i = 0; i < seq.seqlen_q; ++i) {
        *lse_at.ptr(split, b, h, i, seq.q_offset) = kNegInf;
        std::fill_n(out_at.ptr(split, b, h, i, seq.q_offset), p.headdim_v, 0.0f);
      }
    }
  }
}

}  // namespace

void attend(const core::Problem& p, const Plan& plan, const Outputs& outputs,
            const Partials* partials, int num_threads) {
  const Context c(p, plan, outputs, partials, num_threads);
  std::vector<Task> tasks;
  for (int b = 0; b < p.batch; ++b) {
    const int seqlen_q = c.seqs[size_t(b)].seqlen_q;
    for (int hk = 0; hk < p.num_heads_k; hk += c.heads_k_per_task) {
      for (int split = 0; split < c.splits_of(b); ++split) {
        for (int i = 0; i < seqlen_q; i += c.positions_per_task) tasks.push_back({b, hk, split, i});
      }
    }
  }
  const int num_tasks = int(tasks.size());
#pragma omp parallel num_threads(num_threads)
  {
    Scratch scratch(c);
#pragma omp for schedule(dynamic, 1) nowait
    for (int x = 0; x < num_tasks; ++x) run_task(c, tasks[size_t(x)], scratch);
    if (partials) {
#pragma omp for schedule(static)
      for (int b = 0; b < p.batch; ++b) write_empty_slices(c, b);
    }
  }
}

}  // namespace kvflash::cpu::KVFLASH_CPU_ISA_NS

#include "cpu/isa_target_end.h"
