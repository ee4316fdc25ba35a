// check_no_aliasing(): a tensor kvflash writes (out, the LSEs and split partials, the caches when
// new K/V are appended) must share no memory with itself or with any other tensor of the call.
// Otherwise the result depends on the order the backend reads and writes in (k_cache passed as
// v_cache with an append gave caches off by 4.6 on the CPU). Overlap is decided on memory, not
// on object identity: two views of one buffer overlap when some element of one has the address
// of an element of the other. Tensors that are only read may share memory freely.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "core/validate.h"

namespace kvflash::core {
namespace {

using std::to_string;
using Wide = __int128;  // offsets: sizes < 2^31 times int64 strides, summed over 6 dimensions

struct Named {
  const char* name;
  const TensorView* view;
};

struct Dim {
  int64_t size;
  Wide stride;  // |stride| in elements
};

// The dimensions that address more than one element, by increasing |stride|.
std::vector<Dim> moving_dims(const TensorView& t) {
  std::vector<Dim> dims;
  for (int i = 0; i < t.rank; ++i) {
    if (t.shape[i] > 1) dims.push_back({t.shape[i], t.strides[i] < 0 ? -Wide{t.strides[i]} : t.strides[i]});
  }
  std::sort(dims.begin(), dims.end(), [](const Dim& a, const Dim& b) { return a.stride < b.stride; });
  return dims;
}

// The bytes [begin, end) the elements of t occupy (empty for no elements).
struct Extent {
  Wide begin = 0;
  Wide end = 0;
};

Extent extent(const TensorView& t) {
  Extent e;
  if (t.numel() == 0 || t.data == nullptr) return e;
  Wide low = 0, high = 0;
  for (int i = 0; i < t.rank; ++i) {
    const Wide reach = Wide{t.shape[i] - 1} * t.strides[i];
    (reach < 0 ? low : high) += reach;
  }
  const Wide bytes = static_cast<Wide>(dtype_size(t.dtype));
  const Wide base = static_cast<Wide>(reinterpret_cast<uintptr_t>(t.data));
  e.begin = base + low * bytes;
  e.end = base + (high + 1) * bytes;
  return e;
}

// Whether distinct indices of t can reach one element: sufficient test, each stride beyond the
// span of the smaller ones (stride 0 on a dimension of size > 1 fails it).
bool overlaps_itself(const TensorView& t) {
  Wide span = 0;  // largest offset reachable by the dimensions seen so far
  for (const Dim& d : moving_dims(t)) {
    if (d.stride <= span) return true;
    span += Wide{d.size - 1} * d.stride;
  }
  return false;
}

// Is `delta` (elements) a difference of two offsets of layout `dims`, i.e. the sum of c_i *
// stride_i with |c_i| < size_i? Exact when each dimension leaves at most two choices of c_i
// (nested strides, as views of one buffer have); otherwise it answers yes (overlap assumed).
bool reachable(Wide delta, const std::vector<Dim>& dims, int i, const std::vector<Wide>& inner) {
  if (i < 0) return delta == 0;
  const Dim& d = dims[i];
  const Wide lo_raw = delta - inner[i], hi_raw = delta + inner[i];
  // c in [ceil(lo_raw / s), floor(hi_raw / s)] within [-(size - 1), size - 1].
  const auto floor_div = [](Wide a, Wide b) { return a >= 0 ? a / b : -((-a + b - 1) / b); };
  const Wide lo = std::max(-floor_div(-lo_raw, d.stride), Wide{1 - d.size});
  const Wide hi = std::min(floor_div(hi_raw, d.stride), Wide{d.size - 1});
  if (hi - lo > 1) return true;
  for (Wide c = lo; c <= hi; ++c) {
    if (reachable(delta - c * d.stride, dims, i - 1, inner)) return true;
  }
  return false;
}

bool same_layout(const TensorView& a, const TensorView& b) {
  if (dtype_size(a.dtype) != dtype_size(b.dtype) || a.rank != b.rank) return false;
  for (int i = 0; i < a.rank; ++i) {
    if (a.shape[i] != b.shape[i] || a.strides[i] != b.strides[i]) return false;
  }
  return true;
}

bool share_memory(const TensorView& a, const TensorView& b) {
  if (!(a.device == b.device)) return false;
  const Extent ea = extent(a), eb = extent(b);
  if (ea.begin >= ea.end || eb.begin >= eb.end) return false;
  if (ea.end <= eb.begin || eb.end <= ea.begin) return false;
  // Interleaved views of one buffer (k_cache = kv[:, 0], v_cache = kv[:, 1]) have overlapping
  // extents but disjoint elements: decided exactly for equal layouts.
  const Wide bytes = static_cast<Wide>(dtype_size(a.dtype));
  const Wide delta = static_cast<Wide>(reinterpret_cast<uintptr_t>(b.data)) -
                     static_cast<Wide>(reinterpret_cast<uintptr_t>(a.data));
  if (!same_layout(a, b) || delta % bytes != 0) return true;
  const std::vector<Dim> dims = moving_dims(a);
  std::vector<Wide> inner(dims.size());
  Wide span = 0;
  for (size_t i = 0; i < dims.size(); ++i) {
    inner[i] = span;
    span += Wide{dims[i].size - 1} * dims[i].stride;
  }
  return reachable(delta / bytes, dims, static_cast<int>(dims.size()) - 1, inner);
}

std::string byte_range(const TensorView& t) {
  const Extent e = extent(t);
  const auto hex = [](Wide v) {
    char text[32];
    std::snprintf(text, sizeof text, "0x%llx", static_cast<unsigned long long>(v));
    return std::string(text);
  };
  return "[" + hex(e.begin) + ", " + hex(e.end) + ")";
}

std::vector<Named> present(std::initializer_list<std::pair<const char*, const OptTensor*>> list) {
  std::vector<Named> named;
  for (const auto& [name, t] : list) {
    if (*t) named.push_back({name, &**t});
  }
  return named;
}

}  // namespace

void check_no_aliasing(const KvCacheArgs& a, const Outputs* outputs) {
  std::vector<Named> all;
  for (const NamedTensor& n : all_tensors(a)) {
    if (*n.tensor) all.push_back({n.name, &**n.tensor});
  }
  std::vector<Named> written;
  if (a.k) written = present({{"k_cache", &a.k_cache}, {"v_cache", &a.v_cache}});
  if (outputs) {
    const Outputs& o = *outputs;
    std::vector<Named> outs = present({{"softmax_lse", &o.softmax_lse},
                                       {"out_accum", &o.out_accum},
                                       {"softmax_lse_accum", &o.softmax_lse_accum}});
    outs.insert(outs.begin(), {"out", &o.out});
    written.insert(written.end(), outs.begin(), outs.end());
    all.insert(all.end(), outs.begin(), outs.end());
  }
  for (const Named& w : written) {
    if (overlaps_itself(*w.view)) {
      std::vector<int64_t> strides(w.view->strides, w.view->strides + w.view->rank);
      fail(ErrorKind::invalid_value, w.name,
           std::string(w.name) + " has elements that share memory (shape " +
               w.view->shape_string() + ", strides " + dims_string(strides) +
               "): a tensor kvflash writes must not overlap itself");
    }
    for (const Named& other : all) {
      if (other.view == w.view || !share_memory(*w.view, *other.view)) continue;
      fail(ErrorKind::invalid_value, w.name,
           std::string(w.name) + " and " + other.name + " overlap in memory (" + w.name +
               " spans bytes " + byte_range(*w.view) + ", " + other.name + " " +
               byte_range(*other.view) + "): a tensor kvflash writes must not share memory " +
               "with another argument");
    }
  }
}

}  // namespace kvflash::core
