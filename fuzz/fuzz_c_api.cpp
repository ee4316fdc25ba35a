// libFuzzer target: the C ABI entry points (kvflash_args_init, kvflash_flash_attn_with_kvcache,
// kvflash_version) over calls built by call_builder.h, with C-level damage on top: unknown dtype
// and device codes, ranks out of range, NULL args / outputs / out, and error buffers of 0 to 8
// bytes. Every outcome must be a status code; nothing may throw across the ABI.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "call_builder.h"
#include "kvflash/c_api.h"

namespace {

using namespace kvflash;

kvflash_tensor to_c(const TensorView& t) {
  kvflash_tensor c{};
  c.data = t.data;
  c.dtype = static_cast<int32_t>(t.dtype);
  c.device_type = static_cast<int32_t>(t.device.type);
  c.device_id = t.device.id;
  c.rank = t.rank;
  std::memcpy(c.shape, t.shape, sizeof c.shape);
  std::memcpy(c.strides, t.strides, sizeof c.strides);
  return c;
}

// Damage that the C layer must refuse before any memory is read.
void damage(kvflash_tensor& t, FuzzedDataProvider& in) {
  switch (in.ConsumeIntegralInRange(0, 2)) {
    case 0: t.dtype = in.ConsumeBool() ? -1 - in.ConsumeIntegralInRange(0, 5) : 6 + in.ConsumeIntegral<uint8_t>(); break;
    case 1: t.rank = in.ConsumeBool() ? -1 : KVFLASH_MAX_RANK + 1 + in.ConsumeIntegral<uint8_t>(); break;
    default: t.device_type = in.ConsumeIntegral<int32_t>() | 4; break;  // never CPU (1) or CUDA (2)
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  fuzz::CallBuilder call(in);
  call.build();
  if (!call.has_memory) return 0;
  const KvCacheArgs& a = call.args;
  std::vector<kvflash_tensor> tensors;
  tensors.reserve(32);
  const auto c = [&](const OptTensor& t) -> const kvflash_tensor* {
    if (!t) return nullptr;
    tensors.push_back(to_c(*t));
    return &tensors.back();
  };
  kvflash_args args;
  kvflash_args_init(&args);
  args.q = c(a.q), args.k_cache = c(a.k_cache), args.v_cache = c(a.v_cache), args.k = c(a.k);
  args.v = c(a.v), args.rotary_cos = c(a.rotary_cos), args.rotary_sin = c(a.rotary_sin);
  args.cache_seqlens = c(a.cache_seqlens), args.cache_batch_idx = c(a.cache_batch_idx);
  args.cache_leftpad = c(a.cache_leftpad), args.page_table = c(a.page_table);
  args.cu_seqlens_q = c(a.cu_seqlens_q), args.cu_seqlens_k_new = c(a.cu_seqlens_k_new);
  args.rotary_seqlens = c(a.rotary_seqlens), args.sinks = c(a.sinks);
  args.scheduler_metadata = c(a.scheduler_metadata);
  args.has_cache_seqlens_value = a.cache_seqlens_value.has_value();
  args.cache_seqlens_value = a.cache_seqlens_value.value_or(0);
  args.max_seqlen_q = a.max_seqlen_q.value_or(-1);
  args.has_softmax_scale = a.softmax_scale.has_value();
  args.softmax_scale = a.softmax_scale.value_or(0.0f);
  args.causal = a.causal, args.window_left = a.window_left, args.window_right = a.window_right;
  args.attention_chunk = a.attention_chunk, args.softcap = a.softcap;
  args.rotary_interleaved = a.rotary_interleaved, args.num_splits = a.num_splits;
  args.pack_gqa = a.pack_gqa ? *a.pack_gqa : -1;
  args.sm_margin = a.sm_margin, args.only_qv = a.only_qv, args.checked = a.checked;

  OutputSpec spec;
  try {
    spec = output_spec(a);
  } catch (const Error&) {
    spec.out.rank = 1, spec.out.shape[0] = 1;  // outputs the call will refuse anyway
  }
  const Outputs o = call.outputs(spec);
  if (!call.has_memory) return 0;
  kvflash_tensor out = to_c(o.out);
  kvflash_outputs outputs{&out, c(o.softmax_lse), c(o.out_accum), c(o.softmax_lse_accum)};
  if (!tensors.empty() && in.ConsumeIntegralInRange(0, 3) == 0) {
    damage(tensors[in.ConsumeIntegralInRange<size_t>(0, tensors.size() - 1)], in);
  }
  if (in.ConsumeIntegralInRange(0, 7) == 0) damage(out, in);
  const bool null_args = in.ConsumeIntegralInRange(0, 15) == 0;
  const bool null_outputs = in.ConsumeIntegralInRange(0, 15) == 0;
  if (in.ConsumeIntegralInRange(0, 15) == 0) outputs.out = nullptr;
  char message[8];
  const size_t capacity = in.ConsumeIntegralInRange<size_t>(0, sizeof message);
  const int status = kvflash_flash_attn_with_kvcache(null_args ? nullptr : &args,
                                                     null_outputs ? nullptr : &outputs, nullptr,
                                                     capacity ? message : nullptr, capacity);
  if (status < KVFLASH_OK || status > KVFLASH_INTERNAL_ERROR) __builtin_trap();
  if (status == KVFLASH_INTERNAL_ERROR) __builtin_trap();  // an exception that is not an Error
  if (capacity > 0 && std::memchr(message, '\0', capacity) == nullptr) __builtin_trap();
  if (kvflash_version()[0] == '\0') __builtin_trap();
  return 0;
}
