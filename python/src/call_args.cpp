#include "call_args.h"

#include <climits>
#include <cstring>
#include <optional>
#include <string>
#include <tuple>
#include <utility>

#include "kvflash/errors.h"

namespace kvflash::python {
namespace {

[[noreturn]] void wrong_type(const char* name, const char* expected, nb::handle given) {
  throw Error(ErrorKind::invalid_type, name,
              std::string(name) + " must be " + expected + ", got " +
                  nb::type_name(given.type()).c_str());
}

int to_int(nb::handle obj, const char* name) {
  // bool is an int in Python; numpy / torch integer scalars provide __index__.
  if (!PyIndex_Check(obj.ptr())) wrong_type(name, "an int", obj);
  const long long v = PyLong_AsLongLong(nb::steal(PyNumber_Index(obj.ptr())).ptr());
  if (v == -1 && PyErr_Occurred()) throw nb::python_error();
  if (v < INT32_MIN || v > INT32_MAX) {
    throw Error(ErrorKind::invalid_value, name,
                std::string(name) + " must fit in int32, got " + std::to_string(v));
  }
  return static_cast<int>(v);
}

std::optional<int> to_optional_int(nb::handle obj, const char* name) {
  if (obj.is_none()) return std::nullopt;
  return to_int(obj, name);
}

double to_double(nb::handle obj, const char* name) {
  const double v = PyFloat_AsDouble(obj.ptr());
  if (v == -1.0 && PyErr_Occurred()) {
    PyErr_Clear();
    wrong_type(name, "a float", obj);
  }
  return v;
}

bool to_bool(nb::handle obj) {
  const int v = PyObject_IsTrue(obj.ptr());
  if (v < 0) throw nb::python_error();
  return v != 0;
}

}  // namespace

std::pair<int, int> window_pair(nb::handle obj) {
  if (obj.is_none()) return {-1, -1};
  const char* expected = "a pair (left, right) of ints";
  const Py_ssize_t size = PyUnicode_Check(obj.ptr()) ? -1 : PyObject_Length(obj.ptr());
  if (size < 0) PyErr_Clear();  // no length (an int, a 0-d tensor): not a pair
  if (size != 2) wrong_type("window_size", expected, obj);
  const auto side = [&](long i) {
    // PyObject_GetItem reaches sequences and the tensors / arrays that index by mapping alike.
    nb::object item = nb::steal(PyObject_GetItem(obj.ptr(), nb::int_(i).ptr()));
    if (!item.is_valid()) throw nb::python_error();
    if (item.is_none()) return -1;  // FA4-style callers write None for an unbounded side
    // An integer scalar of any framework (a one-element integer tensor too) has __index__.
    nb::object index = nb::steal(PyIndex_Check(item.ptr()) ? PyNumber_Index(item.ptr()) : nullptr);
    if (!index.is_valid()) {
      PyErr_Clear();
      wrong_type("window_size", expected, obj);
    }
    return to_int(index, "window_size");
  };
  return {side(0), side(1)};
}

namespace {

// A Plan (typed metadata: core::accept_plan checks the problem it was made for) or an int32
// tensor in FA3's layout (checked for length and the range of each entry).
void read_metadata(nb::handle metadata, TensorImporter& importer, KvCacheArgs& args) {
  if (nb::isinstance<Plan>(metadata))
    args.plan = nb::inst_ptr<Plan>(metadata);
  else
    args.scheduler_metadata = importer.optional(metadata, "scheduler_metadata");
}

// FA3's Python-level `assert k_cache.stride(-1) == 1, "..."`, made before anything else is
// read, for the caches of the frameworks FA3's callers use (torch, numpy); others are left to
// the C++ checks. Returns the cache's view for the call to keep (one import per cache), nullopt
// when it was not read here: a cache that cannot be read at all is then reported by the full
// import, in the order of the arguments.
OptTensor assert_last_dim_contiguous(nb::handle cache, const char* name, bool writable, const char* message,
                                     TensorImporter& importer) {
  if (cache.is_none() || !(is_torch_tensor(cache) || is_numpy_array(cache))) return std::nullopt;
  OptTensor view;
  try {
    view = importer.optional(cache, name, writable);
  } catch (const Error&) {
    return std::nullopt;
  } catch (const nb::python_error&) {
    return std::nullopt;
  }
  if (view && view->rank > 0 && view->size(-1) > 1 && view->stride(-1) != 1) {
    PyErr_SetString(PyExc_AssertionError, message);
    throw nb::python_error();
  }
  return view;
}

// window_size's usual form, a tuple of two Python ints, read without the general path's calls.
std::optional<std::pair<int, int>> plain_window_pair(nb::handle obj) {
  if (!PyTuple_CheckExact(obj.ptr()) || PyTuple_GET_SIZE(obj.ptr()) != 2) return std::nullopt;
  PyObject* left = PyTuple_GET_ITEM(obj.ptr(), 0);
  PyObject* right = PyTuple_GET_ITEM(obj.ptr(), 1);
  if (!PyLong_CheckExact(left) || !PyLong_CheckExact(right)) return std::nullopt;
  int overflow_left = 0, overflow_right = 0;
  const long l = PyLong_AsLongAndOverflow(left, &overflow_left);
  const long r = PyLong_AsLongAndOverflow(right, &overflow_right);
  if (overflow_left || overflow_right || l < INT32_MIN || l > INT32_MAX || r < INT32_MIN || r > INT32_MAX)
    return std::nullopt;  // the general path reports the range in its words
  return std::pair<int, int>{int(l), int(r)};
}

}  // namespace

KvCacheArgs call_args(nb::handle call, TensorImporter& importer) {
  if (!PyTuple_Check(call.ptr()) || PyTuple_GET_SIZE(call.ptr()) != kCallFieldCount)
    throw Error(ErrorKind::invalid_type, "", "internal: malformed call tuple");
  auto at = [&](CallField f) { return nb::handle(PyTuple_GET_ITEM(call.ptr(), f)); };
  const bool k_written = !at(kK).is_none(), v_written = !at(kV).is_none();
  const OptTensor k_cache = assert_last_dim_contiguous(
      at(kKCache), "k_cache", k_written, "k_cache must have contiguous last dimension", importer);
  const OptTensor v_cache = assert_last_dim_contiguous(
      at(kVCache), "v_cache", v_written, "v_cache must have contiguous last dimension", importer);
  KvCacheArgs a;
  a.q = importer.optional(at(kQ), "q");
  a.k_cache = k_cache ? k_cache : importer.optional(at(kKCache), "k_cache", k_written);
  a.v_cache = v_cache ? v_cache : importer.optional(at(kVCache), "v_cache", v_written);
  a.k = importer.optional(at(kK), "k");
  a.v = importer.optional(at(kV), "v");
  a.qv = importer.optional(at(kQv), "qv");
  a.rotary_cos = importer.optional(at(kRotaryCos), "rotary_cos");
  a.rotary_sin = importer.optional(at(kRotarySin), "rotary_sin");
  nb::handle seqlens = at(kCacheSeqlens);
  if (PyLong_Check(seqlens.ptr()))
    a.cache_seqlens_value = to_int(seqlens, "cache_seqlens");
  else
    a.cache_seqlens = importer.optional(seqlens, "cache_seqlens");
  a.cache_batch_idx = importer.optional(at(kCacheBatchIdx), "cache_batch_idx");
  a.cache_leftpad = importer.optional(at(kCacheLeftpad), "cache_leftpad");
  a.page_table = importer.optional(at(kPageTable), "page_table");
  a.cu_seqlens_q = importer.optional(at(kCuSeqlensQ), "cu_seqlens_q");
  a.cu_seqlens_k_new = importer.optional(at(kCuSeqlensKNew), "cu_seqlens_k_new");
  a.max_seqlen_q = to_optional_int(at(kMaxSeqlenQ), "max_seqlen_q");
  a.rotary_seqlens = importer.optional(at(kRotarySeqlens), "rotary_seqlens");
  a.q_descale = importer.optional(at(kQDescale), "q_descale");
  a.k_descale = importer.optional(at(kKDescale), "k_descale");
  a.v_descale = importer.optional(at(kVDescale), "v_descale");
  if (!at(kSoftmaxScale).is_none())
    a.softmax_scale = static_cast<float>(to_double(at(kSoftmaxScale), "softmax_scale"));
  a.causal = to_bool(at(kCausal));
  const std::optional<std::pair<int, int>> window = plain_window_pair(at(kWindowSize));
  std::tie(a.window_left, a.window_right) = window ? *window : window_pair(at(kWindowSize));
  a.attention_chunk = at(kAttentionChunk).is_none() ? 0 : to_int(at(kAttentionChunk), "attention_chunk");
  // None reads as FA3's default for these scalars (0: no softcap, no margin), as engines pass it.
  if (!at(kSoftcap).is_none()) a.softcap = static_cast<float>(to_double(at(kSoftcap), "softcap"));
  a.rotary_interleaved = to_bool(at(kRotaryInterleaved));
  read_metadata(at(kSchedulerMetadata), importer, a);
  a.num_splits = at(kNumSplits).is_none() ? 0 : to_int(at(kNumSplits), "num_splits");
  if (!at(kPackGqa).is_none()) a.pack_gqa = to_bool(at(kPackGqa));
  a.sm_margin = at(kSmMargin).is_none() ? 0 : to_int(at(kSmMargin), "sm_margin");
  a.sinks = importer.optional(at(kSinks), "sinks");
  a.only_qv = to_bool(at(kOnlyQv));
  a.checked = to_bool(at(kChecked));
  a.batch_invariant = to_bool(at(kBatchInvariant));
  return a;
}

}  // namespace kvflash::python

namespace kvflash::python {
namespace {

template <class T>
void append(std::string& key, const T& value) {
  key.append(reinterpret_cast<const char*>(&value), sizeof(T));
}

void append_shape(std::string& key, const OptTensor& t) {
  append(key, t.has_value());
  if (!t) return;
  append(key, t->dtype);
  append(key, t->device);
  append(key, t->rank);
  key.append(reinterpret_cast<const char*>(t->shape), sizeof(int64_t) * t->rank);
}

// A length tensor by identity; an int (cache_seqlens) by value.
void append_identity(std::string& key, nb::handle lengths) {
  const bool is_int = PyLong_Check(lengths.ptr());
  append(key, is_int);
  if (is_int)
    append(key, PyLong_AsLongLong(lengths.ptr()));
  else
    append(key, reinterpret_cast<uintptr_t>(lengths.ptr()));  // None is one object too
}

}  // namespace

std::string configuration_key(nb::handle call) {
  TensorImporter importer;
  const KvCacheArgs a = call_args(call, importer);
  std::string key;
  key.reserve(512);
  for (const OptTensor* t : {&a.q, &a.k_cache, &a.v_cache, &a.k, &a.qv, &a.page_table,
                             &a.cu_seqlens_q, &a.cu_seqlens_k_new, &a.cache_leftpad})
    append_shape(key, *t);
  for (CallField f : {kCacheSeqlens, kCuSeqlensQ, kCuSeqlensKNew, kCacheLeftpad})
    append_identity(key, PyTuple_GET_ITEM(call.ptr(), f));
  append(key, a.max_seqlen_q.has_value());
  append(key, a.max_seqlen_q.value_or(0));
  append(key, a.causal);
  append(key, a.window_left);
  append(key, a.window_right);
  append(key, a.attention_chunk);
  append(key, a.softcap > 0.0f);
  append(key, a.num_splits);
  append(key, a.pack_gqa.has_value());
  append(key, a.pack_gqa.value_or(false));
  append(key, a.sm_margin);
  append(key, a.only_qv);
  append(key, a.batch_invariant);
  return key;
}

}  // namespace kvflash::python
