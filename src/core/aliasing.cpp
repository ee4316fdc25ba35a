// check_no_aliasing(): a tensor kvflash writes (out, the LSEs and split partials, the caches when
// new K/V are appended) must share no memory with itself or with any other tensor of the call.
// Otherwise the result depends on the order the backend reads and writes in (k_cache passed as
// v_cache with an append gave caches off by 4.6 on the CPU). Overlap is decided on memory, not
// on object identity: two views of one buffer overlap when some element of one has the address
// of an element of the other. Tensors that are only read may share memory freely.
#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <initializer_list>
#include <string>
#include <tuple>
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

// A list of fixed capacity: the check allocates nothing for a call that passes (it runs on every
// call).
template <class T, size_t N>
struct SmallList {
  std::array<T, N> items{};
  size_t count = 0;
  void push_back(const T& v) { items[count++] = v; }
  size_t size() const { return count; }
  const T* begin() const { return items.data(); }
  const T* end() const { return items.data() + count; }
  T* begin() { return items.data(); }
  T* end() { return items.data() + count; }
  const T& operator[](size_t i) const { return items[i]; }
};

struct Dim {
  int64_t size;
  Wide stride;  // |stride| in elements
};
using Dims = SmallList<Dim, kMaxRank>;

// The dimensions that address more than one element, by increasing |stride|.
Dims moving_dims(const TensorView& t) {
  Dims dims;
  for (int i = 0; i < t.rank; ++i) {
    if (t.shape[i] > 1) dims.push_back({t.shape[i], t.strides[i] < 0 ? -Wide{t.strides[i]} : t.strides[i]});
  }
  // Insertion sort: at most kMaxRank entries.
  for (size_t i = 1; i < dims.size(); ++i) {
    for (size_t j = i; j > 0 && dims.items[j].stride < dims.items[j - 1].stride; --j)
      std::swap(dims.items[j], dims.items[j - 1]);
  }
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
bool reachable(Wide delta, const Dims& dims, int i, const std::array<Wide, kMaxRank>& inner) {
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
  const Dims dims = moving_dims(a);
  std::array<Wide, kMaxRank> inner{};
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

// Every tensor argument of a call (all_tensors) and its four outputs.
using NamedList = SmallList<Named, std::tuple_size_v<decltype(all_tensors(KvCacheArgs{}))> + 4>;

void add_present(NamedList& list, std::initializer_list<std::pair<const char*, const OptTensor*>> tensors) {
  for (const auto& [name, t] : tensors) {
    if (*t) list.push_back({name, &**t});
  }
}

}  // namespace

void check_no_aliasing(const KvCacheArgs& a, const Outputs* outputs) {
  NamedList all;
  for (const NamedTensor& n : all_tensors(a)) add_present(all, {{n.name, n.tensor}});
  NamedList written;
  if (a.k) add_present(written, {{"k_cache", &a.k_cache}, {"v_cache", &a.v_cache}});
  if (outputs) {
    const Outputs& o = *outputs;
    NamedList outs;
    outs.push_back({"out", &o.out});
    add_present(outs, {{"softmax_lse", &o.softmax_lse},
                       {"out_accum", &o.out_accum},
                       {"softmax_lse_accum", &o.softmax_lse_accum}});
    for (const Named& n : outs) {
      written.push_back(n);
      all.push_back(n);
    }
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
