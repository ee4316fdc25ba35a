// kvflash._kvflash: the nanobind module under python/kvflash. It is deliberately thin: it
// imports tensors (tensor_import.h), builds KvCacheArgs (call_args.h), asks the caller's
// framework for outputs, scratch and its current stream (framework.h) and calls the C++ library.
// FA3's Python conventions live in flash_attn_interface.py.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <chrono>
#include <string>

#include "call_args.h"
#include "framework.h"
#include "kvflash/kvflash.h"
#include "kvflash/version.h"
#include "tensor_import.h"

namespace nb = nanobind;

namespace kvflash::python {
namespace {

RunOptions run_options(uintptr_t stream) {
  RunOptions options;
  options.stream = reinterpret_cast<void*>(stream);
  return options;
}

// One call crossing into the library: its arguments imported, validated and planned once
// (PreparedCall), its outputs allocated by the caller's framework, its options (the framework's current stream; on a GPU, scratch from the
// framework's allocator). Python objects are touched here, with the GIL held; run() is not.
class ImportedCall {
 public:
  ImportedCall(nb::handle call, nb::handle out, bool return_lse)
      : args_(call_args(call, importer_)),
        framework_(PyTuple_GET_ITEM(call.ptr(), args_.q ? kQ : kVCache), like_view(args_), device_of(args_)),
        prepared_(args_) {  // validates first: no output is allocated for a bad call
    allocate(out, return_lse);
  }

  void run() const { prepared_.run(outputs_, options_); }
  // The whole library call, validation and planning included (what a C++ caller pays).
  void run_from_scratch() const { flash_attn_with_kvcache(args_, outputs_, options_); }

  // out, or FA3's four values (out, softmax_lse, out_accum, softmax_lse_accum) with return_lse.
  nb::object result(bool return_lse) const {
    if (!return_lse) return out_;
    return nb::make_tuple(out_, lse_, out_accum_, lse_accum_);
  }

 private:
  static const TensorView* like_view(const KvCacheArgs& a) {
    const OptTensor& like = a.q ? a.q : a.v_cache;
    return like ? &*like : nullptr;
  }
  static Device device_of(const KvCacheArgs& a) {
    if (a.q) return a.q->device;
    return a.v_cache ? a.v_cache->device : Device{};
  }

  void allocate(nb::handle out, bool return_lse) {
    const OutputSpec& spec = prepared_.output_spec();
    out_ = out.is_none() ? framework_.output(spec.out) : nb::borrow(out);
    outputs_.out = importer_.required(out_, "out", /*writable=*/true);
    if (return_lse) {
      lse_ = framework_.output(spec.softmax_lse);
      outputs_.softmax_lse = importer_.required(lse_, "softmax_lse", true);
      if (spec.num_splits > 1) {
        out_accum_ = framework_.output(spec.out_accum);
        lse_accum_ = framework_.output(spec.softmax_lse_accum);
        outputs_.out_accum = importer_.required(out_accum_, "out_accum", true);
        outputs_.softmax_lse_accum = importer_.required(lse_accum_, "softmax_lse_accum", true);
      } else {
        TensorSpec empty;  // FA3 returns empty partials when the call does not split
        empty.rank = 1;
        out_accum_ = framework_.output(empty);
        lse_accum_ = framework_.output(empty);
      }
    }
    options_.stream = framework_.stream();
    if (outputs_.out.device.type == DeviceType::cuda) {
      // On the GPU the scratch comes from the caller's allocator (torch's caching allocator),
      // so the call never allocates by itself and can be captured in a CUDA graph.
      if (const size_t bytes = prepared_.workspace_size(); bytes > 0) options_.workspace = framework_.scratch(bytes, importer_);
    }
  }

  TensorImporter importer_;  // first: the members below are made through it
  KvCacheArgs args_;
  CallerFramework framework_;
  PreparedCall prepared_;
  Outputs outputs_;
  RunOptions options_;
  nb::object out_, lse_, out_accum_, lse_accum_;
};

// The call. `out` may be None (allocated here).
nb::object fwd(nb::handle call, nb::handle out, bool return_lse) {
  const ImportedCall c(call, out, return_lse);
  {
    nb::gil_scoped_release release;
    c.run();
  }
  return c.result(return_lse);
}

// The C++ library's own time per call for this call (validation, planning, launches; the kernels
// are not waited for on a GPU): the call is imported and its outputs allocated once, then
// flash_attn_with_kvcache(args, outputs, options) runs `calls` times from C++, without the GIL.
// Microseconds per call.
double native_call_us(nb::handle call, nb::handle out, int calls) {
  const ImportedCall c(call, out, false);
  nb::gil_scoped_release release;
  c.run_from_scratch();  // warm-up
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < calls; ++i) c.run_from_scratch();
  const std::chrono::duration<double, std::micro> elapsed = std::chrono::steady_clock::now() - start;
  return elapsed.count() / std::max(calls, 1);
}

// Output shapes for a call: {"out": (shape, dtype_code), ..., "num_splits": n}.
nb::dict call_output_spec(nb::handle call) {
  TensorImporter importer;
  KvCacheArgs args = call_args(call, importer);
  const OutputSpec spec = output_spec(args, args.plan);
  nb::dict d;
  d["out"] = nb::make_tuple(shape_tuple(spec.out), static_cast<int>(spec.out.dtype));
  d["softmax_lse"] = nb::make_tuple(shape_tuple(spec.softmax_lse), static_cast<int>(spec.softmax_lse.dtype));
  d["out_accum"] = nb::make_tuple(shape_tuple(spec.out_accum), static_cast<int>(spec.out_accum.dtype));
  d["softmax_lse_accum"] = nb::make_tuple(shape_tuple(spec.softmax_lse_accum),
                                          static_cast<int>(spec.softmax_lse_accum.dtype));
  d["num_splits"] = spec.num_splits;
  return d;
}

Plan call_make_plan(nb::handle call) {
  TensorImporter importer;
  return make_plan(call_args(call, importer));
}

Plan scheduler_metadata(int batch_size, int max_seqlen_q, int max_seqlen_k, int num_heads_q,
                        int num_heads_kv, int headdim, nb::handle cache_seqlens, int qkv_dtype,
                        std::optional<int> headdim_v, nb::handle cu_seqlens_q,
                        nb::handle cu_seqlens_k_new, nb::handle cache_leftpad,
                        std::optional<int> page_size, int max_seqlen_k_new, bool causal,
                        int window_left, int window_right, int attention_chunk,
                        bool has_softcap, int num_splits, std::optional<bool> pack_gqa,
                        int sm_margin, bool has_qv, int device_type, int device_id) {
  TensorImporter importer;
  SchedulerArgs s;
  s.batch_size = batch_size;
  s.max_seqlen_q = max_seqlen_q;
  s.max_seqlen_k = max_seqlen_k;
  s.num_heads_q = num_heads_q;
  s.num_heads_kv = num_heads_kv;
  s.headdim = headdim;
  s.cache_seqlens = importer.optional(cache_seqlens, "cache_seqlens");
  s.qkv_dtype = static_cast<DType>(qkv_dtype);
  s.headdim_v = headdim_v;
  s.cu_seqlens_q = importer.optional(cu_seqlens_q, "cu_seqlens_q");
  s.cu_seqlens_k_new = importer.optional(cu_seqlens_k_new, "cu_seqlens_k_new");
  s.cache_leftpad = importer.optional(cache_leftpad, "cache_leftpad");
  s.page_size = page_size;
  s.max_seqlen_k_new = max_seqlen_k_new;
  s.causal = causal;
  s.window_left = window_left;
  s.window_right = window_right;
  s.attention_chunk = attention_chunk;
  s.has_softcap = has_softcap;
  s.num_splits = num_splits;
  s.pack_gqa = pack_gqa;
  s.sm_margin = sm_margin;
  s.has_qv = has_qv;
  s.device = Device{static_cast<DeviceType>(device_type), device_id};
  return get_scheduler_metadata(s);
}

void call_combine(nb::handle out_partial, nb::handle lse_partial, nb::handle out, nb::handle lse,
                  uintptr_t stream) {
  TensorImporter importer;
  const TensorView op = importer.required(out_partial, "out_partial");
  const TensorView lp = importer.required(lse_partial, "lse_partial");
  const TensorView o = importer.required(out, "out", true);
  const OptTensor l = importer.optional(lse, "lse", true);
  nb::gil_scoped_release release;
  combine(op, lp, o, l, run_options(stream));
}

// The exception a kvflash::Error becomes; the message passes through unchanged.
PyObject* exception_type(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::invalid_value: return PyExc_ValueError;
    case ErrorKind::invalid_type: return PyExc_TypeError;
    case ErrorKind::unsupported: return PyExc_NotImplementedError;
    case ErrorKind::device_failure: return PyExc_RuntimeError;
  }
  return PyExc_RuntimeError;
}

void translate_error(const std::exception_ptr& p, void*) {
  try {
    std::rethrow_exception(p);
  } catch (const Error& e) {
    PyErr_SetString(exception_type(e.kind()), e.what());
  }
}

void bind_plan(nb::module_& m) {
  nb::class_<PlanKey>(m, "PlanKey", "What the plan depends on: every field that changes it.")
      .def_ro("batch", &PlanKey::batch)
      .def_ro("max_seqlen_q", &PlanKey::max_seqlen_q)
      .def_ro("max_seqlen_k", &PlanKey::max_seqlen_k)
      .def_ro("num_heads", &PlanKey::num_heads)
      .def_ro("num_heads_k", &PlanKey::num_heads_k)
      .def_ro("headdim", &PlanKey::headdim)
      .def_ro("headdim_v", &PlanKey::headdim_v)
      .def_prop_ro("dtype", [](const PlanKey& k) { return static_cast<int>(k.dtype); })
      .def_ro("fp8_query", &PlanKey::fp8_query)
      .def_ro("page_size", &PlanKey::page_size)
      .def_ro("max_seqlen_k_new", &PlanKey::max_seqlen_k_new)
      .def_ro("varlen_q", &PlanKey::varlen_q)
      .def_ro("has_leftpad", &PlanKey::has_leftpad)
      .def_ro("causal", &PlanKey::causal)
      .def_ro("window_left", &PlanKey::window_left)
      .def_ro("window_right", &PlanKey::window_right)
      .def_ro("attention_chunk", &PlanKey::attention_chunk)
      .def_ro("has_softcap", &PlanKey::has_softcap)
      .def_ro("has_qv", &PlanKey::has_qv)
      .def_ro("num_splits", &PlanKey::num_splits)
      .def_ro("pack_gqa", &PlanKey::pack_gqa)
      .def_ro("sm_margin", &PlanKey::sm_margin)
      .def_ro("num_sms", &PlanKey::num_sms)
      .def_ro("arch", &PlanKey::arch)
      .def("__eq__", [](const PlanKey& a, const PlanKey& b) { return a == b; })
      .def("first_difference",
           [](const PlanKey& a, const PlanKey& b) { return first_difference(a, b); },
           "The first field in which this key and `other` differ, '' when equal.");

  nb::class_<KernelChoice>(m, "KernelChoice", "Which kernels run a call (kvflash/kernel_family.h).")
      .def_prop_ro("family", [](const KernelChoice& k) { return family_name(k.family); })
      .def_prop_ro("shape", [](const KernelChoice& k) { return shape_name(k.shape); })
      .def_ro("headdim", &KernelChoice::headdim)
      .def_ro("headdim_v", &KernelChoice::headdim_v)
      .def("__repr__", [](const KernelChoice& k) {
        return std::string("KernelChoice(") + family_name(k.family) + ", " + shape_name(k.shape) + ", d " +
               std::to_string(k.headdim) + " / " + std::to_string(k.headdim_v) + ")";
      });

  nb::class_<Plan>(m, "Plan", "Typed scheduler metadata: the problem it was made for and its decisions.")
      .def_ro("key", &Plan::key)
      .def_ro("kernel", &Plan::kernel, "The kernel family, shape and instantiation the call runs.")
      .def_ro("block_m", &Plan::block_m)
      .def_ro("block_n", &Plan::block_n)
      .def_ro("num_splits", &Plan::num_splits)
      .def_ro("pack_gqa", &Plan::pack_gqa)
      .def_ro("is_causal", &Plan::is_causal)
      .def_ro("is_local", &Plan::is_local)
      .def_ro("num_splits_dynamic", &Plan::num_splits_dynamic)
      .def_ro("num_m_blocks", &Plan::num_m_blocks)
      .def_ro("batch_order", &Plan::batch_order)
      .def_ro("num_nheads_in_l2", &Plan::num_nheads_in_l2)
      .def_ro("has_semaphore", &Plan::has_semaphore)
      .def_prop_ro("fa3_size", &Plan::fa3_size)
      .def("to_fa3", &Plan::to_fa3, "FA3's int32 scheduler_metadata layout, as a list.");
}

}  // namespace
}  // namespace kvflash::python

NB_MODULE(_kvflash, m) {
  using namespace kvflash::python;
  m.doc() = "kvflash's C++ library; use kvflash.flash_attn_interface.";
  nb::register_exception_translator(translate_error);
  bind_plan(m);
  m.def("fwd", &fwd, nb::arg("call"), nb::arg("out").none(), nb::arg("return_lse"));
  m.def("native_call_us", &native_call_us, nb::arg("call"), nb::arg("out").none(),
        nb::arg("calls"));
  m.def("set_framework_hooks", &set_framework_hooks, nb::arg("allocate"),
        nb::arg("current_stream"));
  m.def("output_spec", &call_output_spec, nb::arg("call"));
  m.def("configuration_key",
        [](nb::handle call) {
          const std::string key = configuration_key(call);
          return nb::bytes(key.data(), key.size());
        },
        nb::arg("call"));
  m.def("make_plan", &call_make_plan, nb::arg("call"));
  m.def("window_pair", &window_pair, nb::arg("window_size").none());
  m.def("get_scheduler_metadata", &scheduler_metadata, nb::arg("batch_size"),
        nb::arg("max_seqlen_q"), nb::arg("max_seqlen_k"), nb::arg("num_heads_q"),
        nb::arg("num_heads_kv"), nb::arg("headdim"), nb::arg("cache_seqlens").none(),
        nb::arg("qkv_dtype"), nb::arg("headdim_v").none(), nb::arg("cu_seqlens_q").none(),
        nb::arg("cu_seqlens_k_new").none(), nb::arg("cache_leftpad").none(),
        nb::arg("page_size").none(), nb::arg("max_seqlen_k_new"), nb::arg("causal"),
        nb::arg("window_left"), nb::arg("window_right"), nb::arg("attention_chunk"),
        nb::arg("has_softcap"), nb::arg("num_splits"), nb::arg("pack_gqa").none(),
        nb::arg("sm_margin"), nb::arg("has_qv"), nb::arg("device_type"), nb::arg("device_id"));
  m.def("combine", &call_combine, nb::arg("out_partial"), nb::arg("lse_partial"), nb::arg("out"),
        nb::arg("lse").none(), nb::arg("stream"));
  m.attr("__version__") = KVFLASH_VERSION_STRING;  // project()'s version in CMakeLists.txt
  m.def("build_backends", &kvflash::build_backends);
  m.def("cuda_available", &kvflash::cuda_available);
  // A torch tensor as the binding reads it, through "exchange" (None where torch's DLPack
  // exchange table cannot describe it) or "attributes": (data, dtype, device type, device id,
  // shape, strides). The tests check that both ways agree.
  m.def("_torch_view", [](nb::handle tensor, const std::string& via) -> nb::object {
    const kvflash::OptTensor v = via == "exchange" ? kvflash::python::torch_exchange_view(tensor)
                                          : kvflash::python::torch_attribute_view(tensor, "tensor");
    if (!v) return nb::none();
    return nb::make_tuple(reinterpret_cast<uintptr_t>(v->data), static_cast<int>(v->dtype),
                          static_cast<int>(v->device.type), v->device.id,
                          std::vector<int64_t>(v->shape, v->shape + v->rank),
                          std::vector<int64_t>(v->strides, v->strides + v->rank));
  });
  m.def("call_field_count", [] { return static_cast<int>(kCallFieldCount); });
  // Raises kvflash::Error(kind, argument, message): lets the tests reach every error kind,
  // including device failures that a CPU-only machine cannot provoke.
  m.def("_raise_error", [](int kind, const std::string& argument, const std::string& message) {
    throw kvflash::Error(static_cast<kvflash::ErrorKind>(kind), argument, message);
  });
}
