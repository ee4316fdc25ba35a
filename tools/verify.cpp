#include "verify.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <sstream>

#include "oracle/oracle.h"
#include "oracle/random_case.h"
#include "oracle/scalar_types.h"

namespace kvflash::tools {

namespace {

// Bytes of one token row: the last two dims (heads x head dim).
size_t token_bytes(const HostTensor& t) {
  const auto& s = t.shape();
  return size_t(s[s.size() - 2] * s[s.size() - 1]) * dtype_size(t.dtype());
}

void copy_tokens(const HostTensor& src, int64_t src_token, HostTensor& dst, int64_t dst_token,
                 int64_t tokens) {
  const size_t row = token_bytes(src);
  std::memcpy(static_cast<unsigned char*>(dst.data()) + dst_token * row,
              static_cast<const unsigned char*>(src.data()) + src_token * row, tokens * row);
}

// The token row of a sequence's logical position in the paged cache (num_pages * page_size rows).
int64_t paged_token(const SequenceSlice& slice, int64_t page_size, int64_t position) {
  return int64_t(slice.pages[position / page_size]) * page_size + position % page_size;
}

// The sequence's tensors as a batch-1 call with a dense cache (the oracle reads host memory).
struct DenseSequenceCall {
  HostTensor q, k, v, k_cache, v_cache, cache_seqlens;
  KvCacheArgs args;

  DenseSequenceCall(const ServingCallHost& call, const SequenceSlice& slice) {
    const int64_t page_size = call.k_cache_before->shape()[1];
    const int64_t capacity = int64_t(slice.pages.size()) * page_size;
    q = tokens_of(*call.q, slice.q_first, slice.q_rows);
    k = tokens_of(*call.k, slice.new_first, slice.new_rows);
    v = tokens_of(*call.v, slice.new_first, slice.new_rows);
    k_cache = dense_cache(*call.k_cache_before, slice, page_size, capacity);
    v_cache = dense_cache(*call.v_cache_before, slice, page_size, capacity);
    cache_seqlens = int32_tensor({int32_t(slice.cached_rows)});
    args.q = q.view();
    args.k = k.view();
    args.v = v.view();
    args.k_cache = k_cache.view();
    args.v_cache = v_cache.view();
    args.cache_seqlens = cache_seqlens.view();
    args.causal = call.causal;
    if (call.rotary_cos) {
      args.rotary_cos = call.rotary_cos->view();
      args.rotary_sin = call.rotary_sin->view();
      args.rotary_interleaved = call.rotary_interleaved;
    }
  }

  // (1, rows, heads, dim) from token rows [first, first + rows) of a token-major tensor.
  static HostTensor tokens_of(const HostTensor& src, int64_t first, int64_t rows) {
    const auto& s = src.shape();
    HostTensor t(src.dtype(), {1, rows, s[s.size() - 2], s[s.size() - 1]});
    copy_tokens(src, first, t, 0, rows);
    return t;
  }

  static HostTensor dense_cache(const HostTensor& paged, const SequenceSlice& slice,
                                int64_t page_size, int64_t capacity) {
    HostTensor t(paged.dtype(), {1, capacity, paged.shape()[2], paged.shape()[3]});
    for (int64_t pos = 0; pos < slice.cached_rows; ++pos) {
      copy_tokens(paged, paged_token(slice, page_size, pos), t, pos, 1);
    }
    return t;
  }
};

class Checker {
 public:
  explicit Checker(Verification& result) : result_(result) {}

  void check(const char* what, int64_t token, int64_t index, double got, double ref, double tol) {
    const double err = std::fabs(got - ref);
    ++result_.checked_values;
    const double ratio = tol > 0 ? err / tol : (err == 0 ? 0.0 : INFINITY);
    if (std::isnan(got) || std::isnan(ratio)) {
      fail(what, token, index, got, ref, tol);
      return;
    }
    result_.worst_ratio = std::max(result_.worst_ratio, ratio);
    if (std::strcmp(what, "out") == 0) result_.max_abs_error = std::max(result_.max_abs_error, err);
    if (err > tol) fail(what, token, index, got, ref, tol);
  }

 private:
  void fail(const char* what, int64_t token, int64_t index, double got, double ref, double tol) {
    if (result_.failures++ == 0) {
      std::ostringstream s;
      s << what << " token " << token << " element " << index << ": got " << got
        << ", expected " << ref << " (tolerance " << tol << ")";
      result_.first_failure = s.str();
    }
  }
  Verification& result_;
};

}  // namespace

void Verification::merge(const Verification& other) {
  if (failures == 0 && other.failures > 0) first_failure = other.first_failure;
  checked_values += other.checked_values;
  failures += other.failures;
  max_abs_error = std::max(max_abs_error, other.max_abs_error);
  worst_ratio = std::max(worst_ratio, other.worst_ratio);
}

Verification verify_sequence(const ServingCallHost& call, const SequenceSlice& slice,
                             bool fp32_probabilities) {
  DenseSequenceCall dense(call, slice);
  const oracle::OracleResult ref = oracle::run_oracle(dense.args);
  const oracle::Tolerance tol = oracle::tolerance_for(
      call.q->dtype(), fp32_probabilities ? oracle::ToleranceProfile::fp32_probabilities
                                          : oracle::ToleranceProfile::any_backend);
  Verification result;
  Checker checker(result);

  const int64_t heads = call.out->shape()[call.out->shape().size() - 2];
  const int64_t dim_v = call.out->shape().back();
  for (int64_t t = 0; slice.check_out && t < slice.q_rows; ++t) {
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t row = ref.row_index(t, int(h));
      for (int64_t i = 0; i < dim_v; ++i) {
        const double expected = ref.out[row * dim_v + i];
        const double got = call.out->get(((slice.q_first + t) * heads + h) * dim_v + i);
        checker.check("out", slice.q_first + t, h * dim_v + i, got, expected,
                      oracle::out_tolerance(tol, ref, row, expected));
      }
    }
  }

  const int64_t page_size = call.k_cache_before->shape()[1];
  for (const oracle::AppendedElement& e : ref.appended) {
    const HostTensor& cache = e.in_v_cache ? *call.v_cache_after : *call.k_cache_after;
    const int64_t row_elements = cache.shape()[2] * cache.shape()[3];
    const int64_t position = e.offset / row_elements;
    const int64_t offset =
        paged_token(slice, page_size, position) * row_elements + e.offset % row_elements;
    const double got = cache.get(offset);
    const char* what = e.in_v_cache ? "v_cache" : "k_cache";
    if (e.rotated) {
      checker.check(what, position, e.offset % row_elements, got, e.exact,
                    oracle::appended_tolerance(cache.dtype(), e));
    } else {
      checker.check(what, position, e.offset % row_elements, got,
                    oracle::bits_value(cache.dtype(), e.bits), 0.0);
    }
  }
  return result;
}

}  // namespace kvflash::tools
