// compare(): a backend's outputs and cache against the oracle, with the tolerances in one table.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <sstream>
#include <unordered_map>

#include "random_case.h"
#include "scalar_types.h"

namespace kvflash::oracle {

// Why these numbers. The backend reads exactly the rounded inputs the oracle reads, so the only
// differences are the backend's own arithmetic:
//  - scores accumulate in fp32: error <= score_rel * (Cauchy-Schwarz bound of the row's scores);
//    2e-6 is ~32 fp32 ulps, what a sum of <= 768 rounded products reaches in practice (the
//    rounding error of a sum grows like sqrt(n) ulps). A score error e changes P by a factor
//    exp(+-e), hence out by at most ~2e * max|v| and LSE by e.
//  - out is rounded to its dtype (half an ulp: fp32 6e-8, fp16 4.9e-4, bf16 3.9e-3), and GPU
//    kernels feed P to the P.V product in the input type (fp16 2^-11, bf16 2^-8 relative per
//    probability; e4m3 2^-4 per probability, which averages over the keys but can dominate
//    a row held by one or two keys). fp32 is CPU only: its budget covers fp32 accumulation of
//    up to a few thousand P*v terms.
//  - the exponentials and the logarithm of the LSE are fp32 (GPU: exp2 approximations, ~2 ulp).
// out: |got - ref| <= max|v| * (out_atol + 2 * score_rel * S) + out_rtol * |ref|
// LSE: |got - ref| <= lse_atol + score_rel * S   (S: the row's score bound)
// A backend that keeps P in fp32 (fp32_probabilities) is held to one ulp of the out type instead
// (fp16 2^-11, bf16 and fp8's bf16 out 2^-8), which is twice its final rounding.
// A 16-bit query over an fp8 e4m3 cache (contract 5.8) takes the query's row, not e4m3's: e4m3
// values (3 mantissa bits, magnitudes 2^-9 .. 448) are exact in fp16 and bf16 and the descales
// are fp32 factors, so the attention reads exact inputs and computes in the query's type; out is
// in the query's type too. fp8's own rounding happens where new K/V are quantised into the cache,
// and is checked there: bit-exact against the oracle's rounding, or within one e4m3 ulp (plus the
// rotation's fp32 error, divided by the descale) for rotated channels (appended_tolerance).
// With qv over such a cache a backend may scale q and qv by their descales into the query's type
// first (scaled_query_rounding): one rounding of each element moves a score by at most the type's
// unit roundoff times the row's Cauchy-Schwarz bound, so any_backend's score_rel grows by it. The
// CPU backend scales in fp32 and keeps the fp32_probabilities budget.
// fp8 tensor cores (fp8_tensor_cores: the sm90 fp8 kernel's QGMMA, e4m3 x e4m3 into an fp32
// accumulator) do not add in fp32. bench/fp8_accumulation.py measured them on an H100 (session 24,
// BENCHMARKS.md): the largest error of a dot product of depth 32 (one k-step) is 9.5e-5 of
// sum |a_k b_k| (2^-13.4), of depth 64 2.0e-4, 128 2.2e-4, 256..1024 <= 3.1e-4 (2^-11.7); cuBLASLt's
// promoted accumulation errs as much up to depth 128. So each k-step may add ~2^-13 of sum |q_i k_i|
// (<= the row's Cauchy-Schwarz bound), ceil(d / 32) steps: the bound is twice that per step, 2^-12
// (d 64: 4.9e-4, d 128: 9.8e-4, d 256: 2.0e-3). The sm90 fp8 kernel's LSEs (H100, 101 cases) were
// off by up to 1.8e-4 (d 64), 1.5e-4 (d 128) and 2.5e-4 (d 256) of the score bound: inside it.
constexpr double kFp8StepError = 0x1p-12;

double fp8_tensor_core_accumulation(int qk_headdim) { return (qk_headdim + 31) / 32 * kFp8StepError; }

ToleranceProfile gpu_tolerance_profile(const KvCacheArgs& a, const Plan& plan) {
  const bool fp8_gemms = plan.kernel.family == KernelFamily::sm90 && a.q && a.q->dtype == DType::e4m3;
  return fp8_gemms ? ToleranceProfile::fp8_tensor_cores : ToleranceProfile::any_backend;
}

Tolerance tolerance_for(DType input_dtype, ToleranceProfile profile, int qk_headdim) {
  if (profile == ToleranceProfile::fp8_tensor_cores) {
    Tolerance t = tolerance_for(input_dtype, ToleranceProfile::any_backend);
    t.score_rel += fp8_tensor_core_accumulation(qk_headdim);
    return t;
  }
  if (profile == ToleranceProfile::fp32_probabilities) {
    switch (input_dtype) {
      case DType::f16: return {4.9e-4, 4.9e-4, 1e-4, 2e-6};
      case DType::bf16:
      case DType::e4m3: return {3.9e-3, 3.9e-3, 1e-4, 2e-6};
      default: break;  // fp32: the same budget as any backend
    }
  }
  switch (input_dtype) {
    case DType::f32: return {1e-5, 1e-5, 2e-5, 2e-6};
    case DType::f16: return {2e-3, 2e-3, 1e-4, 2e-6};
    case DType::bf16: return {1.6e-2, 1.6e-2, 1e-4, 2e-6};
    case DType::e4m3: return {3e-2, 1.6e-2, 1e-4, 2e-6};  // out is bf16; P in e4m3 on GPUs
    default: return {0, 0, 0, 0};
  }
}

double scaled_query_rounding(const KvCacheArgs& a) {
  if (!a.qv || a.v_cache->dtype != DType::e4m3) return 0.0;
  return a.qv->dtype == DType::f16 ? 0x1p-11 : 0x1p-8;  // a 16-bit query, the only one over fp8
}

// Rotary rounding: fp32 products and sums (a few fp32 ulps of the products' magnitude, which
// matters under cancellation) and then one rounding to the storage type (within an ulp).
double appended_tolerance(DType cache_dtype, const AppendedElement& e) {
  return e.rotated ? ulp(cache_dtype, e.exact) + 4.0 * 0x1p-24 * e.cancellation : 0.0;
}

double out_tolerance(const Tolerance& tol, const OracleResult& r, int64_t row, double ref) {
  return r.value_scale[row] * (tol.out_atol + 2 * tol.score_rel * r.score_scale[row]) +
         tol.out_rtol * std::fabs(ref);
}

double lse_tolerance(const Tolerance& tol, const OracleResult& r, int64_t row) {
  return tol.lse_atol + tol.score_rel * r.score_scale[row];
}

void Comparison::fail(const std::string& what) {
  if (ok) first_failure = what;
  ok = false;
  ++failures;
}

namespace {

class Checker {
 public:
  Checker(const Case& c, const OracleResult& ref, Comparison& result, ToleranceProfile profile)
      : c_(c), ref_(ref), result_(result),
        tol_(tolerance_for(input_dtype(c), profile, c.args.q ? int(c.args.q->size(-1)) : 0)) {
    if (profile != ToleranceProfile::fp32_probabilities) tol_.score_rel += scaled_query_rounding(c.args);
  }

  // The query's (q's, else qv's) dtype picks the row, also over an fp8 cache (see the table).
  static DType input_dtype(const Case& c) {
    return c.args.q ? c.args.q->dtype : c.args.qv->dtype;
  }

  // One value against its reference and bound; NaN never passes.
  void check(const char* what, const std::string& where, double got, double ref, double tol) {
    const double err = std::fabs(got - ref);
    const bool bad = std::isnan(got) || !(err <= tol);
    const double ratio = std::isnan(got) ? INFINITY : (tol > 0 ? err / tol : (err > 0 ? INFINITY : 0));
    double& worst_of_check = result_.worst_ratio_by_check[what];
    worst_of_check = std::max(worst_of_check, ratio);
    if (ratio > result_.worst_ratio || (bad && result_.worst.empty())) {
      result_.worst_ratio = ratio;
      result_.worst = describe_element(what, where, got, ref, tol);
    }
    if (bad) result_.fail(describe_element(what, where, got, ref, tol));
  }

  void exact(const char* what, const std::string& where, double got, double ref) {
    if (got != ref) result_.fail(describe_element(what, where, got, ref, 0.0) + " (must be exact)");
  }

  static std::string describe_element(const char* what, const std::string& where, double got,
                                      double ref, double tol) {
    std::ostringstream os;
    os.precision(9);
    os << what << where << ": got " << got << ", expected " << ref << " (tolerance " << tol << ")";
    return os.str();
  }

  std::string at(int64_t token, int head, int channel = -1) const {
    std::ostringstream os;
    os << "[token " << token << " (batch " << ref_.token_batch[token] << "), head " << head;
    if (channel >= 0) os << ", channel " << channel;
    os << "]";
    return os.str();
  }

  double out_tol(int64_t row, double ref) const { return out_tolerance(tol_, ref_, row, ref); }
  double lse_tol(int64_t row) const { return lse_tolerance(tol_, ref_, row); }

  void outputs(const Outputs& o) {
    const TensorView& out = o.out;
    const int dv = ref_.headdim_v;
    for (int64_t token = 0; token < ref_.total_q; ++token) {
      for (int h = 0; h < ref_.num_heads; ++h) {
        const int64_t row = ref_.row_index(token, h);
        for (int ch = 0; ch < dv; ++ch) {
          const int64_t offset = ref_.varlen_q
              ? offset_of(out, {token, h, ch})
              : offset_of(out, {token / ref_.seqlen_q, token % ref_.seqlen_q, h, ch});
          const double got = element_value(out, offset);
          const double expected = ref_.out[row * dv + ch];
          if (ref_.empty_row[row]) exact("out", at(token, h, ch), got, 0.0);
          else check("out", at(token, h, ch), got, expected, out_tol(row, expected));
        }
        if (o.softmax_lse) lse(*o.softmax_lse, token, h, row);
      }
    }
  }

  void lse(const TensorView& view, int64_t token, int h, int64_t row) {
    const int64_t index = ref_.lse_index(token, h);
    const double got = view.ptr<float>()[index];  // allocate_outputs: contiguous
    const double expected = ref_.lse[index];
    if (std::isinf(expected)) exact("softmax_lse", at(token, h), got, expected);
    else check("softmax_lse", at(token, h), got, expected, lse_tol(row));
  }

  // The split partials must combine, through their LSEs, into the reference.
  void partials(const Outputs& o, const Plan* plan) {
    const int splits = static_cast<int>(o.out_accum->shape[0]);
    const int dv = ref_.headdim_v;
    const int64_t lse_elements = static_cast<int64_t>(ref_.total_q) * ref_.num_heads;
    const float* lse_accum = o.softmax_lse_accum->ptr<float>();
    const float* out_accum = o.out_accum->ptr<float>();
    std::vector<double> combined(dv);
    for (int64_t token = 0; token < ref_.total_q && result_.ok; ++token) {
      const int b = ref_.token_batch[token];
      const int used = plan && !plan->num_splits_dynamic.empty() ? plan->num_splits_dynamic[b] : splits;
      if (used <= 1) continue;  // a single split writes out directly: nothing to combine
      for (int h = 0; h < ref_.num_heads; ++h) {
        const int64_t index = ref_.lse_index(token, h);
        const int64_t row = ref_.row_index(token, h);
        double max_lse = -INFINITY;
        for (int s = 0; s < used; ++s) {
          const double l = lse_accum[s * lse_elements + index];
          if (std::isnan(l)) {
            result_.fail("softmax_lse_accum" + at(token, h) + ": split " + std::to_string(s) +
                         " of " + std::to_string(used) + " not written (NaN)");
            return;
          }
          max_lse = std::max(max_lse, l);
        }
        if (std::isinf(max_lse)) {
          exact("combined split LSE", at(token, h), max_lse, ref_.lse[index]);
          continue;
        }
        double sum = 0.0;
        std::fill(combined.begin(), combined.end(), 0.0);
        for (int s = 0; s < used; ++s) {
          const double weight = std::exp(lse_accum[s * lse_elements + index] - max_lse);
          sum += weight;
          if (weight == 0.0) continue;
          for (int ch = 0; ch < dv; ++ch) combined[ch] += weight * out_accum[(s * lse_elements + index) * dv + ch];
        }
        check("combined split LSE", at(token, h), max_lse + std::log(sum), ref_.lse[index], lse_tol(row));
        for (int ch = 0; ch < dv; ++ch) {
          const double expected = ref_.out[row * dv + ch];
          check("combined split out", at(token, h, ch), combined[ch] / sum, expected, out_tol(row, expected));
        }
      }
    }
  }

  // Appended elements match the oracle; every other element of the allocation is unchanged.
  void cache(bool value_side) {
    const OptTensor& view = value_side ? c_.args.v_cache : c_.args.k_cache;
    if (!view) return;
    const std::vector<unsigned char>& before = value_side ? c_.v_cache_before() : c_.k_cache_before();
    const size_t size = storage_bytes(view->dtype);
    const int64_t elements = static_cast<int64_t>(before.size() / size);
    const char* name = value_side ? "v_cache" : "k_cache";
    std::vector<uint8_t> written(static_cast<size_t>(elements), 0);
    for (const AppendedElement& e : ref_.appended) {
      if (e.in_v_cache != value_side) continue;
      written[e.offset] = 1;
      const uint32_t got = element_bits(*view, e.offset);
      const std::string where = std::string("[element offset ") + std::to_string(e.offset) + "]";
      if (!e.rotated) {
        if (got != e.bits) {
          result_.fail(std::string(name) + " appended" + where + ": got bits 0x" + hex(got) +
                       ", expected 0x" + hex(e.bits) + " (a copy must be bit-exact)");
        }
      } else {
        check((std::string(name) + " appended rotary").c_str(), where,
              bits_value(view->dtype, got), e.exact, appended_tolerance(view->dtype, e));
      }
    }
    const auto* now = static_cast<const unsigned char*>(view->data);
    for (int64_t e = 0; e < elements; ++e) {
      if (written[e] || std::memcmp(now + e * size, before.data() + e * size, size) == 0) continue;
      uint32_t was = 0, is = 0;
      std::memcpy(&was, before.data() + e * size, size);
      std::memcpy(&is, now + e * size, size);
      result_.fail(std::string(name) + "[element offset " + std::to_string(e) +
                   "]: a slot the call must not touch changed from 0x" + hex(was) + " to 0x" + hex(is));
      return;
    }
  }

  static std::string hex(uint32_t bits) {
    std::ostringstream os;
    os << std::hex << bits;
    return os.str();
  }

 private:
  const Case& c_;
  const OracleResult& ref_;
  Comparison& result_;
  Tolerance tol_;
};

bool shape_is(const TensorView& t, std::initializer_list<int64_t> shape) {
  if (t.rank != static_cast<int>(shape.size())) return false;
  int i = 0;
  for (int64_t s : shape) {
    if (t.shape[i++] != s) return false;
  }
  return true;
}

}  // namespace

Comparison compare(const Case& c, const OracleResult& ref, const Outputs& outputs, const Plan* plan,
                   ToleranceProfile profile) {
  Comparison result;
  const bool out_shape_ok = ref.varlen_q
      ? shape_is(outputs.out, {ref.total_q, ref.num_heads, ref.headdim_v})
      : shape_is(outputs.out, {ref.batch, ref.seqlen_q, ref.num_heads, ref.headdim_v});
  if (!out_shape_ok || outputs.out.dtype != ref.out_dtype) {
    std::string shape;
    for (int i = 0; i < outputs.out.rank; ++i) shape += (i ? ", " : "") + std::to_string(outputs.out.shape[i]);
    result.fail("out has shape (" + shape + ") or the wrong dtype");
    return result;
  }
  Checker checker(c, ref, result, profile);
  checker.outputs(outputs);
  if (outputs.out_accum && outputs.softmax_lse_accum) checker.partials(outputs, plan);
  checker.cache(false);
  checker.cache(true);
  for (const std::string& name : c.modified_inputs()) result.fail("input " + name + " was modified");
  return result;
}

}  // namespace kvflash::oracle
