// Case ownership (buffers, snapshots), output allocation and coverage counting.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <sstream>

#include "random_case.h"
#include "scalar_types.h"

namespace kvflash::oracle {
namespace {

uint64_t fnv1a(const std::vector<unsigned char>& bytes) {
  uint64_t hash = 1469598103934665603ull;
  for (unsigned char byte : bytes) hash = (hash ^ byte) * 1099511628211ull;
  return hash;
}

// Bytes spanned by a view: one past its furthest element (strides are non-negative here).
size_t span_bytes(DType dtype, const std::vector<int64_t>& shape, const std::vector<int64_t>& strides) {
  int64_t last = 0;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == 0) return 0;
    last += (shape[i] - 1) * strides[i];
  }
  return static_cast<size_t>(last + 1) * storage_bytes(dtype);
}

TensorView make_view(void* data, DType dtype, const std::vector<int64_t>& shape,
                     const std::vector<int64_t>& strides) {
  TensorView v;
  v.data = data;
  v.dtype = dtype;
  v.rank = static_cast<int>(shape.size());
  for (int i = 0; i < v.rank; ++i) {
    v.shape[i] = shape[i];
    v.strides[i] = strides[i];
  }
  return v;
}

std::vector<int64_t> contiguous_strides(const std::vector<int64_t>& shape) {
  std::vector<int64_t> strides(shape.size());
  int64_t stride = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    strides[i] = stride;
    stride *= std::max<int64_t>(shape[i], 1);
  }
  return strides;
}

// Fills a whole buffer with the dtype's NaN (fp32 NaN for the fp32 accumulators).
void fill_nan(std::vector<unsigned char>& bytes, DType dtype) {
  const size_t size = storage_bytes(dtype);
  const uint32_t nan_bits = dtype == DType::f32 ? 0x7fc00000u
                            : dtype == DType::e4m3 ? 0x7fu : 0x7e00u;
  for (size_t i = 0; i + size <= bytes.size(); i += size) std::memcpy(&bytes[i], &nan_bits, size);
}

}  // namespace

TensorView Case::allocate(DType dtype, std::vector<int64_t> shape, std::vector<int64_t> strides,
                          bool read_only) {
  if (strides.empty()) strides = contiguous_strides(shape);
  Buffer& buffer = buffers_.emplace_back();
  // At least one element, so that empty tensors still have a distinct, valid pointer.
  buffer.bytes.assign(std::max(span_bytes(dtype, shape, strides), size_t{8}), 0);
  buffer.read_only = read_only;
  return make_view(buffer.bytes.data(), dtype, shape, strides);
}

const Case::Buffer* Case::buffer_of(const OptTensor& view) const {
  if (!view) return nullptr;
  for (const Buffer& b : buffers_) {
    if (b.bytes.data() == view->data) return &b;
  }
  return nullptr;
}

void Case::seal() {
  for (Buffer& b : buffers_) b.hash = fnv1a(b.bytes);
  if (const Buffer* k = buffer_of(args.k_cache)) k_cache_before_ = k->bytes;
  if (const Buffer* v = buffer_of(args.v_cache)) v_cache_before_ = v->bytes;
}

void Case::restore_cache() {
  if (args.k_cache) std::memcpy(args.k_cache->data, k_cache_before_.data(), k_cache_before_.size());
  if (args.v_cache) std::memcpy(args.v_cache->data, v_cache_before_.data(), v_cache_before_.size());
}

std::vector<std::string> Case::modified_inputs() const {
  static const char* const names[] = {"q", "k", "v", "qv", "rotary_cos", "rotary_sin",
                                      "cache_seqlens", "cache_batch_idx", "cache_leftpad",
                                      "page_table", "cu_seqlens_q", "cu_seqlens_k_new",
                                      "rotary_seqlens", "q_descale", "k_descale", "v_descale",
                                      "sinks"};
  const OptTensor* views[] = {&args.q, &args.k, &args.v, &args.qv, &args.rotary_cos,
                              &args.rotary_sin, &args.cache_seqlens, &args.cache_batch_idx,
                              &args.cache_leftpad, &args.page_table, &args.cu_seqlens_q,
                              &args.cu_seqlens_k_new, &args.rotary_seqlens, &args.q_descale,
                              &args.k_descale, &args.v_descale, &args.sinks};
  std::vector<std::string> modified;
  for (size_t i = 0; i < std::size(views); ++i) {
    const Buffer* b = buffer_of(*views[i]);
    if (b && b->read_only && fnv1a(b->bytes) != b->hash) modified.push_back(names[i]);
  }
  return modified;
}

CaseOutputs allocate_outputs(const OutputSpec& spec, bool with_partials, bool with_lse) {
  CaseOutputs result;
  result.num_splits = spec.num_splits;
  auto make = [&](const TensorSpec& t) {
    std::vector<int64_t> shape(t.shape, t.shape + t.rank);
    const std::vector<int64_t> strides = contiguous_strides(shape);
    auto& bytes = result.storage.emplace_back(std::max(span_bytes(t.dtype, shape, strides), size_t{8}));
    fill_nan(bytes, t.dtype);
    return make_view(bytes.data(), t.dtype, shape, strides);
  };
  result.outputs.out = make(spec.out);
  if (with_lse) result.outputs.softmax_lse = make(spec.softmax_lse);
  if (with_partials && spec.out_accum.rank > 0) {
    result.outputs.out_accum = make(spec.out_accum);
    result.outputs.softmax_lse_accum = make(spec.softmax_lse_accum);
  }
  return result;
}

void Coverage::add(const std::vector<std::string>& features) {
  ++cases;
  for (const std::string& tag : features) ++counts[tag];
}

std::string Coverage::report() const {
  std::ostringstream os;
  os << "coverage over " << cases << " cases:";
  int column = 0;
  for (const auto& [tag, count] : counts) {
    os << (column++ % 6 == 0 ? "\n  " : "  ") << tag << ": " << count;
  }
  return os.str();
}

}  // namespace kvflash::oracle
