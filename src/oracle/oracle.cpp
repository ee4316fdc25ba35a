// The reference is written as a reader of the spec would compute it by hand: every length resolved
// per sequence, every key found by walking the page table, every score of the (S_q x S_k) matrix
// materialised in float64 and every mask rule tested literally. Speed is not a goal, except that
// independent blocks of rows run on several threads (the GPU runner waits on the oracle).
#include "oracle.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <stdexcept>

#include "parallel_for.h"
#include "scalar_types.h"

namespace kvflash::oracle {
namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// Static sizes of the call (spec 3.1 and 4 step 6).
struct Shapes {
  int batch = 0, seqlen_q = 0, num_heads = 0, num_heads_k = 0, headdim = 0, headdim_v = 0;
  int64_t total_q = 0;
  bool varlen_q = false, paged = false, has_new = false, new_packed = false;
  int page_size = 1, capacity = 0;  // capacity: s_k, the static number of positions of a sequence
  int rotary_dim = 0;
  bool fp8 = false;        // q is float8_e4m3fn (and so is the cache)
  bool fp8_cache = false;  // k_cache / v_cache are float8_e4m3fn, q fp8 or 16-bit (contract 5.8)
  DType dtype = DType::bf16;
};

// Lengths of one batch element (spec 5.1).
struct Sequence {
  int64_t q_offset = 0;
  int seqlen_q = 0, leftpad = 0, cache_len = 0, seqlen_new = 0, seqlen_k = 0;
  int64_t new_offset = 0;
  int rotary_start = 0, cache_row = 0;
};

Shapes read_shapes(const KvCacheArgs& a) {
  Shapes s;
  const TensorView& v_cache = *a.v_cache;
  const TensorView& query = a.q ? *a.q : *a.qv;  // q may be absent with only_qv
  s.varlen_q = a.cu_seqlens_q.has_value();
  s.batch = s.varlen_q ? static_cast<int>(a.cu_seqlens_q->shape[0] - 1)
                       : static_cast<int>(query.shape[0]);
  s.seqlen_q = s.varlen_q ? *a.max_seqlen_q : static_cast<int>(query.shape[1]);
  s.total_q = s.varlen_q ? query.shape[0] : int64_t{s.batch} * s.seqlen_q;
  s.num_heads = static_cast<int>(query.size(-2));
  s.num_heads_k = static_cast<int>(v_cache.size(-2));
  s.headdim = a.q ? static_cast<int>(a.q->size(-1)) : 0;
  s.headdim_v = static_cast<int>(v_cache.size(-1));
  s.paged = a.page_table.has_value();
  s.page_size = s.paged ? static_cast<int>(v_cache.shape[1]) : 1;
  s.capacity = s.paged ? static_cast<int>(a.page_table->shape[1]) * s.page_size
                       : static_cast<int>(v_cache.shape[1]);
  s.has_new = a.k.has_value();
  s.new_packed = s.has_new && a.cu_seqlens_k_new.has_value();
  s.rotary_dim = a.rotary_cos ? static_cast<int>(2 * a.rotary_cos->shape[1]) : 0;
  s.dtype = query.dtype;
  s.fp8 = s.dtype == DType::e4m3;
  s.fp8_cache = v_cache.dtype == DType::e4m3;
  return s;
}

Sequence read_sequence(const KvCacheArgs& a, const Shapes& s, int b) {
  Sequence q;
  if (s.varlen_q) {
    q.q_offset = int_at(*a.cu_seqlens_q, b);
    q.seqlen_q = int_at(*a.cu_seqlens_q, b + 1) - int_at(*a.cu_seqlens_q, b);
  } else {
    q.q_offset = int64_t{b} * s.seqlen_q;
    q.seqlen_q = s.seqlen_q;
  }
  q.leftpad = a.cache_leftpad ? int_at(*a.cache_leftpad, b) : 0;
  if (a.cache_seqlens) {
    q.cache_len = int_at(*a.cache_seqlens, b);
  } else if (a.cache_seqlens_value) {
    q.cache_len = *a.cache_seqlens_value;  // one int for every sequence of the batch
  } else {
    q.cache_len = s.capacity;
  }
  if (s.new_packed) {
    q.new_offset = int_at(*a.cu_seqlens_k_new, b);
    q.seqlen_new = int_at(*a.cu_seqlens_k_new, b + 1) - int_at(*a.cu_seqlens_k_new, b);
  } else if (s.has_new) {
    q.seqlen_new = static_cast<int>(a.k->shape[1]);
  }
  q.seqlen_k = q.cache_len - q.leftpad + q.seqlen_new;
  q.rotary_start = a.rotary_seqlens ? int_at(*a.rotary_seqlens, b) : q.cache_len;
  q.cache_row = a.cache_batch_idx ? int_at(*a.cache_batch_idx, b) : b;
  return q;
}

// Element offset of channel 0 of (absolute position, kv head) of a sequence's cache row:
// dense caches index (row, position); paged ones look the page up in the row's page table.
int64_t cache_offset(const KvCacheArgs& a, const Shapes& s, const TensorView& cache, int row,
                     int position, int head_k) {
  if (!s.paged) return offset_of(cache, {row, position, head_k, 0});
  const int64_t page = a.page_table->ptr<int32_t>()[offset_of(*a.page_table,
                                                              {row, position / s.page_size})];
  return offset_of(cache, {page, position % s.page_size, head_k, 0});
}

// Rotary (spec 5.2): pairs (2p, 2p+1) interleaved or (p, p + dim/2), rotated by the cos/sin row
// of `position`, in fp32. Writes the fp32 results and, per channel, the exact value and the
// magnitude of the products (for the comparison's rounding bound).
void rotate(const KvCacheArgs& a, int rotary_dim, int position, std::vector<float>& x,
            std::vector<double>* exact, std::vector<double>* cancellation) {
  const int half = rotary_dim / 2;
  for (int p = 0; p < half; ++p) {
    const int first = a.rotary_interleaved ? 2 * p : p;
    const int second = a.rotary_interleaved ? 2 * p + 1 : p + half;
    const auto c = static_cast<float>(element_value(*a.rotary_cos, offset_of(*a.rotary_cos, {position, p})));
    const auto sn = static_cast<float>(element_value(*a.rotary_sin, offset_of(*a.rotary_sin, {position, p})));
    const float x1 = x[first], x2 = x[second];
    const float r1 = x1 * c - x2 * sn;
    const float r2 = x1 * sn + x2 * c;
    if (exact) {
      (*exact)[first] = double{x1} * c - double{x2} * sn;
      (*exact)[second] = double{x1} * sn + double{x2} * c;
      (*cancellation)[first] = std::fabs(double{x1} * c) + std::fabs(double{x2} * sn);
      (*cancellation)[second] = std::fabs(double{x1} * sn) + std::fabs(double{x2} * c);
    }
    x[first] = r1;
    x[second] = r2;
  }
}

// Whether queries are rotated per row (position R + i) or all at R: the spec's is_causal ||
// is_local, which uses the window *after* normalisation with the static sizes (spec 5.4 1-4).
bool rotate_queries_per_row(const KvCacheArgs& a, const Shapes& s) {
  int left = a.window_left, right = a.window_right;
  if (left >= s.capacity - 1) left = -1;
  if (right >= s.seqlen_q - 1) right = -1;
  if (a.causal) right = 0;
  return left >= 0 || right >= 0 || a.attention_chunk > 0;
}

// A descale of batch element b (contract 5.8): 1 when absent.
double descale(const OptTensor& t, int b, int head_k) {
  if (!t) return 1.0;
  return element_value(*t, offset_of(*t, {b, head_k}));
}

// A new element in the query's 16-bit type, as it goes into an fp8 cache (contract 5.8):
// x / descale in fp32, then e4m3 rounded to nearest even, saturating at +-448; NaN stays NaN.
// Returns the bits and, for a rotated element, turns `exact` and `cancellation` into the stored
// value's.
uint32_t quantise(float x, double descale_value, AppendedElement& e) {
  const auto d = static_cast<float>(descale_value);
  if (e.rotated) {
    e.exact = std::clamp(e.exact / d, -448.0, 448.0);
    e.cancellation /= std::fabs(d);
  }
  return float_to_e4m3_saturating(x / d);
}

// Appends the sequence's new rows (spec 5.2) and returns them as values, (t, h_k, d|d_v).
void append_new_rows(const KvCacheArgs& a, const Shapes& s, const Sequence& q, int b,
                     bool value_side, std::vector<double>& rows, OracleResult& result) {
  const TensorView& source = value_side ? *a.v : *a.k;
  const TensorView& cache = value_side ? *a.v_cache : *a.k_cache;
  const int dim = static_cast<int>(source.size(-1));
  const int rotary_dim = value_side ? 0 : s.rotary_dim;  // V is never rotated
  const bool quantised = source.dtype != cache.dtype;   // 16-bit rows into an fp8 cache
  rows.assign(static_cast<size_t>(q.seqlen_new) * s.num_heads_k * dim, 0.0);
  std::vector<float> x(dim);
  std::vector<double> exact(dim), cancellation(dim);
  for (int t = 0; t < q.seqlen_new; ++t) {
    for (int hk = 0; hk < s.num_heads_k; ++hk) {
      const int64_t row = s.new_packed ? offset_of(source, {q.new_offset + t, hk, 0})
                                       : offset_of(source, {b, t, hk, 0});
      for (int c = 0; c < dim; ++c) {
        x[c] = static_cast<float>(element_value(source, row + c * source.stride(-1)));
      }
      if (rotary_dim > 0) rotate(a, rotary_dim, q.rotary_start + t, x, &exact, &cancellation);
      const int64_t target = cache_offset(a, s, cache, q.cache_row, q.cache_len + t, hk);
      for (int c = 0; c < dim; ++c) {
        AppendedElement e;
        e.in_v_cache = value_side;
        e.offset = target + c * cache.stride(-1);
        e.rotated = c < rotary_dim;
        e.exact = e.rotated ? exact[c] : 0.0;
        e.cancellation = e.rotated ? cancellation[c] : 0.0;
        if (quantised) {
          e.bits = quantise(x[c], descale(value_side ? a.v_descale : a.k_descale, b, hk), e);
        } else {
          e.bits = e.rotated ? round_to_storage(cache.dtype, x[c])
                             : element_bits(source, row + c * source.stride(-1));
        }
        if (!e.rotated) e.exact = bits_value(cache.dtype, e.bits);
        rows[(static_cast<size_t>(t) * s.num_heads_k + hk) * dim + c] = bits_value(cache.dtype, e.bits);
        result.appended.push_back(e);
      }
    }
  }
}

// Keys or values j = first .. end-1 of a sequence into `rows` (S_k, h_k, dim): cache position
// leftpad + j, read from the cache below cache_seqlens and from the appended rows above it.
void gather(const KvCacheArgs& a, const Shapes& s, const Sequence& q, const TensorView& cache,
            const std::vector<double>& new_rows, int first, int end, double* rows) {
  const int dim = static_cast<int>(cache.size(-1));
  for (int j = first; j < end; ++j) {
    const int position = q.leftpad + j;
    for (int hk = 0; hk < s.num_heads_k; ++hk) {
      double* dst = &rows[(static_cast<size_t>(j) * s.num_heads_k + hk) * dim];
      if (position < q.cache_len) {
        const int64_t src = cache_offset(a, s, cache, q.cache_row, position, hk);
        for (int c = 0; c < dim; ++c) dst[c] = element_value(cache, src + c * cache.stride(-1));
      } else {
        const size_t t = position - q.cache_len;
        for (int c = 0; c < dim; ++c) dst[c] = new_rows[(t * s.num_heads_k + hk) * dim + c];
      }
    }
  }
}

// Query rows i = first .. end-1 of a sequence into `rows` (S_q, h, dim), rotated (when rotary is
// given) and rounded back to the storage type, as the kernel rotates q on the fly and keeps it in
// q's type.
void read_queries(const KvCacheArgs& a, const Shapes& s, const Sequence& q, int b,
                  const TensorView& view, bool apply_rotary, int first, int end,
                  double* rows) {
  const int dim = static_cast<int>(view.size(-1));
  const bool per_row = rotate_queries_per_row(a, s);
  std::vector<float> x(dim);
  for (int i = first; i < end; ++i) {
    for (int h = 0; h < s.num_heads; ++h) {
      const int64_t src = s.varlen_q ? offset_of(view, {q.q_offset + i, h, 0})
                                     : offset_of(view, {b, i, h, 0});
      for (int c = 0; c < dim; ++c) x[c] = static_cast<float>(element_value(view, src + c * view.stride(-1)));
      double* dst = &rows[(static_cast<size_t>(i) * s.num_heads + h) * dim];
      if (apply_rotary) {
        rotate(a, s.rotary_dim, q.rotary_start + (per_row ? i : 0), x, nullptr, nullptr);
        for (int c = 0; c < dim; ++c) dst[c] = bits_value(view.dtype, round_to_storage(view.dtype, x[c]));
      } else {
        for (int c = 0; c < dim; ++c) dst[c] = x[c];
      }
    }
  }
}

// Spec 5.4, each rule as written: j < S_k; causal j <= diag; window diag-left <= j <= diag+right
// (a negative side is unbounded); chunk: j in [c0, c0 + C) with c0 = floor(diag / C) * C.
bool key_visible(const KvCacheArgs& a, const Sequence& q, int i, int j) {
  if (j < 0 || j >= q.seqlen_k) return false;
  const int64_t diag = int64_t{i} + q.seqlen_k - q.seqlen_q;
  if (a.causal && j > diag) return false;
  if (a.window_left >= 0 && j < diag - a.window_left) return false;
  if (a.window_right >= 0 && j > diag + a.window_right) return false;
  if (a.attention_chunk > 0) {
    const int64_t chunk = a.attention_chunk;
    const int64_t floor_div = diag >= 0 ? diag / chunk : -((-diag + chunk - 1) / chunk);
    const int64_t chunk_start = floor_div * chunk;
    if (j < chunk_start || j >= chunk_start + chunk) return false;
  }
  return true;
}

double dot(const double* x, const double* y, int n) {
  double sum = 0.0;
  for (int c = 0; c < n; ++c) sum += x[c] * y[c];
  return sum;
}

double norm(const double* x, int n) { return std::sqrt(dot(x, x, n)); }

// Whether scores have the q.k term (q may be absent, or ignored with only_qv).
bool uses_q(const KvCacheArgs& a) { return a.q && a.k_cache && !a.only_qv; }

double softmax_scale(const KvCacheArgs& a, const Shapes& s) {
  if (a.softmax_scale) return *a.softmax_scale;
  return 1.0 / std::sqrt(static_cast<double>(s.headdim + (a.qv ? s.headdim_v : 0)));
}

// What a sequence's attention reads: its lengths, and its keys, values and query rows resolved
// (gathered from the cache and the appended rows, queries rotated).
struct SequenceInputs {
  Sequence q;
  int b = 0;
  std::vector<double> new_keys, new_values;  // appended rows, (t, h_k, d|d_v)
  // Left uninitialised until the parallel reads fill them, so that their pages are first touched
  // there rather than zeroed serially.
  std::unique_ptr<double[]> keys, values, queries, query_values;
  // Per (j, h_k), computed once rather than for every query row that sees the key: |k_j|, |v_j|
  // (qv only) and max_c |v_j[c]|, for the rows' error scales.
  std::unique_ptr<double[]> key_norms, value_norms, value_max;
};

std::unique_ptr<double[]> uninitialised(size_t size) {
  return std::unique_ptr<double[]>(new double[size]);
}

void size_inputs(const KvCacheArgs& a, const Shapes& s, SequenceInputs& in) {
  const bool use_q = uses_q(a);
  const size_t keys = static_cast<size_t>(in.q.seqlen_k) * s.num_heads_k;
  const size_t rows = static_cast<size_t>(in.q.seqlen_q) * s.num_heads;
  if (use_q) in.keys = uninitialised(keys * s.headdim);
  in.values = uninitialised(keys * s.headdim_v);
  if (use_q) in.queries = uninitialised(rows * s.headdim);
  if (a.qv) in.query_values = uninitialised(rows * s.headdim_v);
  if (use_q) in.key_norms = uninitialised(keys);
  if (a.qv) in.value_norms = uninitialised(keys);
  in.value_max = uninitialised(keys);
}

double max_abs(const double* x, int n) {
  double m = 0.0;
  for (int c = 0; c < n; ++c) m = std::max(m, std::fabs(x[c]));
  return m;
}

// result[n] = fn(row n of `rows`, dim) for the rows (j, h_k) of keys j = first .. end-1.
template <class Fn>
void per_key(const Shapes& s, const double* rows, int dim, int first, int end, Fn fn, double* result) {
  const size_t heads_k = static_cast<size_t>(s.num_heads_k);
  for (size_t n = first * heads_k; n < end * heads_k; ++n) {
    result[n] = fn(&rows[n * dim], dim);
  }
}

// A unit of parallel work of the gathers: keys [first, end) and query rows [first, end) of one
// sequence (each range cut at S_k or S_q).
struct InputBlock {
  int sequence = 0, first = 0, end = 0;
};

void read_inputs(const KvCacheArgs& a, const Shapes& s, const InputBlock& block, SequenceInputs& in) {
  const bool use_q = uses_q(a);
  const int key_end = std::min(block.end, in.q.seqlen_k), row_end = std::min(block.end, in.q.seqlen_q);
  if (block.first < key_end) {
    if (use_q) gather(a, s, in.q, *a.k_cache, in.new_keys, block.first, key_end, in.keys.get());
    gather(a, s, in.q, *a.v_cache, in.new_values, block.first, key_end, in.values.get());
    if (use_q) per_key(s, in.keys.get(), s.headdim, block.first, key_end, norm, in.key_norms.get());
    if (a.qv) per_key(s, in.values.get(), s.headdim_v, block.first, key_end, norm, in.value_norms.get());
    per_key(s, in.values.get(), s.headdim_v, block.first, key_end, max_abs, in.value_max.get());
  }
  if (block.first < row_end) {
    if (use_q) read_queries(a, s, in.q, in.b, *a.q, s.rotary_dim > 0, block.first, row_end, in.queries.get());
    if (a.qv) read_queries(a, s, in.q, in.b, *a.qv, false, block.first, row_end, in.query_values.get());
  }
}

// What a query head's rows share: its kv head, its descales and its sink.
struct Head {
  int h = 0, hk = 0;
  double score_descale = 1.0, value_descale = 1.0;
  bool has_sink = false;
  double sink = 0.0;
};

Head head_of(const KvCacheArgs& a, const Shapes& s, int b, int h) {
  Head head;
  head.h = h;
  head.hk = h / (s.num_heads / s.num_heads_k);
  // Each descale undoes the scale of the fp8 tensor it is named for (contract 5.8), no other.
  head.score_descale = (s.fp8 ? descale(a.q_descale, b, head.hk) : 1.0) *
                       (s.fp8_cache ? descale(a.k_descale, b, head.hk) : 1.0);
  head.value_descale = s.fp8_cache ? descale(a.v_descale, b, head.hk) : 1.0;
  head.has_sink = a.sinks.has_value();
  head.sink = head.has_sink ? element_value(*a.sinks, h * a.sinks->stride(0)) : 0.0;
  return head;
}

// Scores, masks, softmax with sink, out and LSE of query row i of one head (spec 5.3-5.6). Writes
// that (token, head)'s outputs only. `scores` and `visible` are scratch of S_k entries.
void attend_row(const KvCacheArgs& a, const Shapes& s, const SequenceInputs& in, const Head& head,
                int i, std::vector<double>& scores, std::vector<uint8_t>& visible,
                OracleResult& result) {
  const Sequence& q = in.q;
  const int h = head.h, hk = head.hk;
  const int d = s.headdim, dv = s.headdim_v;
  const bool use_q = uses_q(a);
  const bool use_qv = a.qv.has_value();
  const double scale = softmax_scale(a, s);
  const double* qi = use_q ? &in.queries[(static_cast<size_t>(i) * s.num_heads + h) * d] : nullptr;
  const double* qvi = use_qv ? &in.query_values[(static_cast<size_t>(i) * s.num_heads + h) * dv] : nullptr;
  double row_max = kNegInf, key_norm = 0.0, value_norm = 0.0, value_max = 0.0;
  bool any = false;
  for (int j = 0; j < q.seqlen_k; ++j) {
    visible[j] = key_visible(a, q, i, j);
    if (!visible[j]) continue;
    any = true;
    const size_t key = static_cast<size_t>(j) * s.num_heads_k + hk;
    const double* kj = use_q ? &in.keys[key * d] : nullptr;
    const double* vj = &in.values[key * dv];
    double raw = 0.0;
    if (use_q) raw += dot(qi, kj, d) * head.score_descale;
    if (use_qv) raw += dot(qvi, vj, dv) * head.value_descale;
    double score = raw * scale;
    if (a.softcap > 0.0f) score = a.softcap * std::tanh(score / a.softcap);
    scores[j] = score;
    row_max = std::max(row_max, score);
    if (use_q) key_norm = std::max(key_norm, in.key_norms[key]);
    if (use_qv) value_norm = std::max(value_norm, in.value_norms[key]);
    value_max = std::max(value_max, in.value_max[key]);
  }
  const int64_t token = q.q_offset + i;
  const int64_t row = result.row_index(token, h);
  double* out = &result.out[row * dv];
  result.empty_row[row] = !any;
  result.value_scale[row] = value_max * std::fabs(head.value_descale);
  result.score_scale[row] = std::fabs(scale) *
      ((use_q ? norm(qi, d) * key_norm * std::fabs(head.score_descale) : 0.0) +
       (use_qv ? norm(qvi, dv) * value_norm * std::fabs(head.value_descale) : 0.0));
  // The sink is one more logit with a zero value: it enlarges the denominator only.
  if (head.has_sink) row_max = std::max(row_max, head.sink);
  if (!any && !head.has_sink) {
    result.lse[result.lse_index(token, h)] = kNegInf;
    return;  // out stays 0
  }
  double denominator = head.has_sink ? std::exp(head.sink - row_max) : 0.0;
  for (int j = 0; j < q.seqlen_k; ++j) {
    if (!visible[j]) continue;
    const double p = std::exp(scores[j] - row_max);
    denominator += p;
    const double* vj = &in.values[(static_cast<size_t>(j) * s.num_heads_k + hk) * dv];
    for (int c = 0; c < dv; ++c) out[c] += p * vj[c];
  }
  for (int c = 0; c < dv; ++c) out[c] *= head.value_descale / denominator;
  result.lse[result.lse_index(token, h)] = row_max + std::log(denominator);
}

// Work estimates, in elements read or multiply-adds: one position of a sequence's inputs (a key
// and a value of every kv head, a query row of every head), one query row of one head against
// every key.
int64_t input_work(const Shapes& s) {
  return int64_t{s.num_heads_k + s.num_heads} * (s.headdim + s.headdim_v);
}

int64_t row_work(const Shapes& s, const Sequence& q) {
  return int64_t{q.seqlen_k} * (s.headdim + 2 * s.headdim_v);
}

// Positions per unit of parallel work, so that a unit is worth handing to a thread even when the
// sizes are small.
int positions_per_block(int64_t work_per_position) {
  constexpr int64_t kBlockWork = int64_t{1} << 16;
  return static_cast<int>(std::clamp<int64_t>(kBlockWork / std::max<int64_t>(work_per_position, 1), 1,
                                              std::numeric_limits<int>::max()));
}

std::vector<InputBlock> input_blocks(const Shapes& s, const std::vector<SequenceInputs>& sequences) {
  const int step = positions_per_block(input_work(s));
  std::vector<InputBlock> blocks;
  for (int n = 0; n < static_cast<int>(sequences.size()); ++n) {
    const int count = std::max(sequences[n].q.seqlen_k, sequences[n].q.seqlen_q);
    for (int first = 0; first < count; first += step) {
      const int end = static_cast<int>(std::min<int64_t>(int64_t{first} + step, count));
      blocks.push_back({n, first, end});
    }
  }
  return blocks;
}

// A unit of parallel work of the attention: rows [first, end) of one query head of one sequence.
struct RowBlock {
  int sequence = 0, h = 0, first = 0, end = 0;
};

std::vector<RowBlock> row_blocks(const Shapes& s, const std::vector<SequenceInputs>& sequences) {
  std::vector<RowBlock> blocks;
  for (int n = 0; n < static_cast<int>(sequences.size()); ++n) {
    const Sequence& q = sequences[n].q;
    const int step = positions_per_block(row_work(s, q));
    for (int h = 0; h < s.num_heads; ++h) {
      for (int first = 0; first < q.seqlen_q; first += step) {
        const int end = static_cast<int>(std::min<int64_t>(int64_t{first} + step, q.seqlen_q));
        blocks.push_back({n, h, first, end});
      }
    }
  }
  return blocks;
}

void attend_block(const KvCacheArgs& a, const Shapes& s, const SequenceInputs& in,
                  const RowBlock& block, OracleResult& result) {
  const Head head = head_of(a, s, in.b, block.h);
  std::vector<double> scores(static_cast<size_t>(in.q.seqlen_k));
  std::vector<uint8_t> visible(static_cast<size_t>(in.q.seqlen_k));
  for (int i = block.first; i < block.end; ++i) attend_row(a, s, in, head, i, scores, visible, result);
}

// Threads for a call: below kMinParallelWork, starting threads costs more than it saves.
int threads_for(const Shapes& s, const std::vector<SequenceInputs>& sequences, int requested) {
  if (requested > 0) return requested;
  constexpr int64_t kMinParallelWork = int64_t{1} << 20;
  int64_t work = 0;
  for (const SequenceInputs& in : sequences) {
    work += input_work(s) * std::max(in.q.seqlen_k, in.q.seqlen_q);
    work += row_work(s, in.q) * in.q.seqlen_q * s.num_heads;
  }
  return work < kMinParallelWork ? 1 : default_oracle_threads();
}

}  // namespace

int64_t OracleResult::lse_index(int64_t token, int head) const {
  if (varlen_q) return int64_t{head} * total_q + token;
  const int64_t b = token / seqlen_q, i = token % seqlen_q;
  return (b * num_heads + head) * seqlen_q + i;
}

OracleResult run_oracle(const KvCacheArgs& a, int threads) {
  if (!a.v_cache || (!a.q && !a.qv)) throw std::invalid_argument("oracle: v_cache and q or qv are required");
  const Shapes s = read_shapes(a);
  OracleResult result;
  result.batch = s.batch;
  result.seqlen_q = s.seqlen_q;
  result.total_q = s.total_q;
  result.num_heads = s.num_heads;
  result.headdim_v = s.headdim_v;
  result.varlen_q = s.varlen_q;
  result.out_dtype = s.fp8 ? DType::bf16 : s.dtype;
  const size_t rows = static_cast<size_t>(s.total_q) * s.num_heads;
  result.out.assign(rows * s.headdim_v, 0.0);
  result.lse.assign(rows, kNegInf);
  result.empty_row.assign(rows, 1);
  result.value_scale.assign(rows, 0.0);
  result.score_scale.assign(rows, 0.0);
  result.token_batch.assign(static_cast<size_t>(s.total_q), -1);

  // The appends run serially, in sequence order (`appended` lists them in that order); every
  // later step reads shared inputs and writes only its own sequence's or row's data.
  std::vector<SequenceInputs> sequences(static_cast<size_t>(s.batch));
  for (int b = 0; b < s.batch; ++b) {
    SequenceInputs& in = sequences[b];
    in.b = b;
    in.q = read_sequence(a, s, b);
    for (int i = 0; i < in.q.seqlen_q; ++i) result.token_batch[in.q.q_offset + i] = b;
    if (s.has_new) {
      if (a.k_cache) append_new_rows(a, s, in.q, b, false, in.new_keys, result);
      append_new_rows(a, s, in.q, b, true, in.new_values, result);
    }
    size_inputs(a, s, in);
  }
  const int workers = threads_for(s, sequences, threads);
  const std::vector<InputBlock> inputs = input_blocks(s, sequences);
  parallel_for(static_cast<int64_t>(inputs.size()), workers, [&](int64_t n) {
    read_inputs(a, s, inputs[n], sequences[inputs[n].sequence]);
  });
  const std::vector<RowBlock> blocks = row_blocks(s, sequences);
  parallel_for(static_cast<int64_t>(blocks.size()), workers, [&](int64_t n) {
    attend_block(a, s, sequences[blocks[n].sequence], blocks[n], result);
  });
  return result;
}

}  // namespace kvflash::oracle
