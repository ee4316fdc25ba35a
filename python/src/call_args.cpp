#include "call_args.h"

#include <string>

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

void read_window(nb::handle obj, KvCacheArgs& args) {
  if (!PySequence_Check(obj.ptr()) || PySequence_Size(obj.ptr()) != 2)
    wrong_type("window_size", "a pair (left, right)", obj);
  nb::object left = nb::steal(PySequence_GetItem(obj.ptr(), 0));
  nb::object right = nb::steal(PySequence_GetItem(obj.ptr(), 1));
  // FA4-style callers write None for an unbounded side.
  args.window_left = left.is_none() ? -1 : to_int(left, "window_size");
  args.window_right = right.is_none() ? -1 : to_int(right, "window_size");
}

// A Plan (typed metadata: the call checks the whole problem it was made for) or an int32
// tensor in FA3's layout (checked for length and against this call's lengths).
void read_metadata(nb::handle metadata, TensorImporter& importer, KvCacheArgs& args) {
  if (nb::isinstance<Plan>(metadata))
    args.plan = nb::inst_ptr<Plan>(metadata);
  else
    args.scheduler_metadata = importer.optional(metadata, "scheduler_metadata");
}

}  // namespace

KvCacheArgs call_args(nb::handle call, TensorImporter& importer) {
  if (!PyTuple_Check(call.ptr()) || PyTuple_GET_SIZE(call.ptr()) != kCallFieldCount)
    throw Error(ErrorKind::invalid_type, "", "internal: malformed call tuple");
  auto at = [&](CallField f) { return nb::handle(PyTuple_GET_ITEM(call.ptr(), f)); };
  KvCacheArgs a;
  a.q = importer.optional(at(kQ), "q");
  a.k_cache = importer.optional(at(kKCache), "k_cache", /*writable=*/!at(kK).is_none());
  a.v_cache = importer.optional(at(kVCache), "v_cache", /*writable=*/!at(kV).is_none());
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
  read_window(at(kWindowSize), a);
  a.attention_chunk = at(kAttentionChunk).is_none() ? 0 : to_int(at(kAttentionChunk), "attention_chunk");
  a.softcap = static_cast<float>(to_double(at(kSoftcap), "softcap"));
  a.rotary_interleaved = to_bool(at(kRotaryInterleaved));
  read_metadata(at(kSchedulerMetadata), importer, a);
  a.num_splits = at(kNumSplits).is_none() ? 0 : to_int(at(kNumSplits), "num_splits");
  if (!at(kPackGqa).is_none()) a.pack_gqa = to_bool(at(kPackGqa));
  a.sm_margin = to_int(at(kSmMargin), "sm_margin");
  a.sinks = importer.optional(at(kSinks), "sinks");
  a.only_qv = to_bool(at(kOnlyQv));
  a.checked = to_bool(at(kChecked));
  return a;
}

}  // namespace kvflash::python
