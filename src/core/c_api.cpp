// The C ABI of c_api.h over the C++ API: converts the structs, catches every exception and
// turns it into a status code and a message.
#include "kvflash/c_api.h"

#include <algorithm>
#include <cstring>
#include <exception>
#include <string>

#include "kvflash/kvflash.h"
#include "kvflash/version.h"

namespace kvflash {
namespace {

static_assert(KVFLASH_MAX_RANK == kMaxRank);
// kvflash_dtype codes are DType's values, so the conversion is a cast.
static_assert(KVFLASH_FLOAT32 == static_cast<int>(DType::f32) &&
              KVFLASH_FLOAT16 == static_cast<int>(DType::f16) &&
              KVFLASH_BFLOAT16 == static_cast<int>(DType::bf16) &&
              KVFLASH_FLOAT8_E4M3 == static_cast<int>(DType::e4m3) &&
              KVFLASH_INT32 == static_cast<int>(DType::i32) &&
              KVFLASH_FLOAT64 == static_cast<int>(DType::f64));
static_assert(KVFLASH_CPU == static_cast<int>(DeviceType::cpu) &&
              KVFLASH_CUDA == static_cast<int>(DeviceType::cuda));

DType to_dtype(int32_t code) {
  if (code < KVFLASH_FLOAT32 || code > KVFLASH_FLOAT64) {
    throw Error(ErrorKind::invalid_type, "",
                "unknown kvflash_dtype " + std::to_string(code) + " (expected 0 to 5)");
  }
  return static_cast<DType>(code);
}

TensorView to_view(const kvflash_tensor& t) {
  if (t.rank < 0 || t.rank > kMaxRank) {
    throw Error(ErrorKind::invalid_value, "",
                "kvflash_tensor rank must be in [0, 6] (got " + std::to_string(t.rank) + ")");
  }
  TensorView v;
  v.data = t.data;
  v.dtype = to_dtype(t.dtype);
  v.device = Device{static_cast<DeviceType>(t.device_type), t.device_id};
  v.rank = t.rank;
  std::copy(t.shape, t.shape + t.rank, v.shape);
  std::copy(t.strides, t.strides + t.rank, v.strides);
  return v;
}

OptTensor to_opt(const kvflash_tensor* t) {
  if (t == nullptr) return std::nullopt;
  return to_view(*t);
}

KvCacheArgs to_args(const kvflash_args& c) {
  KvCacheArgs a;
  a.q = to_opt(c.q);
  a.k_cache = to_opt(c.k_cache);
  a.v_cache = to_opt(c.v_cache);
  a.k = to_opt(c.k);
  a.v = to_opt(c.v);
  a.qv = to_opt(c.qv);
  a.rotary_cos = to_opt(c.rotary_cos);
  a.rotary_sin = to_opt(c.rotary_sin);
  a.cache_seqlens = to_opt(c.cache_seqlens);
  if (c.has_cache_seqlens_value) a.cache_seqlens_value = c.cache_seqlens_value;
  a.cache_batch_idx = to_opt(c.cache_batch_idx);
  a.cache_leftpad = to_opt(c.cache_leftpad);
  a.page_table = to_opt(c.page_table);
  a.cu_seqlens_q = to_opt(c.cu_seqlens_q);
  a.cu_seqlens_k_new = to_opt(c.cu_seqlens_k_new);
  if (c.max_seqlen_q >= 0) a.max_seqlen_q = c.max_seqlen_q;
  a.rotary_seqlens = to_opt(c.rotary_seqlens);
  a.q_descale = to_opt(c.q_descale);
  a.k_descale = to_opt(c.k_descale);
  a.v_descale = to_opt(c.v_descale);
  if (c.has_softmax_scale) a.softmax_scale = c.softmax_scale;
  a.causal = c.causal != 0;
  a.window_left = c.window_left;
  a.window_right = c.window_right;
  a.attention_chunk = c.attention_chunk;
  a.softcap = c.softcap;
  a.rotary_interleaved = c.rotary_interleaved != 0;
  a.scheduler_metadata = to_opt(c.scheduler_metadata);
  a.num_splits = c.num_splits;
  if (c.pack_gqa >= 0) a.pack_gqa = c.pack_gqa != 0;
  a.sm_margin = c.sm_margin;
  a.sinks = to_opt(c.sinks);
  a.only_qv = c.only_qv != 0;
  a.checked = c.checked != 0;
  a.batch_invariant = c.batch_invariant != 0;
  return a;
}

int status_of(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::invalid_value: return KVFLASH_INVALID_VALUE;
    case ErrorKind::invalid_type: return KVFLASH_INVALID_TYPE;
    case ErrorKind::unsupported: return KVFLASH_UNSUPPORTED;
    case ErrorKind::device_failure: return KVFLASH_DEVICE_FAILURE;
  }
  return KVFLASH_INTERNAL_ERROR;
}

void write_message(const char* text, char* buffer, size_t capacity) {
  if (buffer == nullptr || capacity == 0) return;
  const size_t n = std::min(std::strlen(text), capacity - 1);
  std::memcpy(buffer, text, n);
  buffer[n] = '\0';
}

}  // namespace
}  // namespace kvflash

extern "C" {

void kvflash_args_init(kvflash_args* args) {
  std::memset(args, 0, sizeof(*args));
  args->max_seqlen_q = -1;
  args->window_left = -1;
  args->window_right = -1;
  args->rotary_interleaved = 1;
  args->pack_gqa = -1;
}

int kvflash_flash_attn_with_kvcache(const kvflash_args* args, const kvflash_outputs* outputs,
                                    void* stream, char* error_message, size_t error_capacity) {
  using namespace kvflash;
  write_message("", error_message, error_capacity);
  try {
    if (args == nullptr || outputs == nullptr || outputs->out == nullptr) {
      throw Error(ErrorKind::invalid_value, "", "args, outputs and outputs->out must not be NULL");
    }
    Outputs outs;
    outs.out = to_view(*outputs->out);
    outs.softmax_lse = to_opt(outputs->softmax_lse);
    outs.out_accum = to_opt(outputs->out_accum);
    outs.softmax_lse_accum = to_opt(outputs->softmax_lse_accum);
    RunOptions options;
    options.stream = stream;
    flash_attn_with_kvcache(to_args(*args), outs, options);
    return KVFLASH_OK;
  } catch (const Error& e) {
    write_message(e.what(), error_message, error_capacity);
    return status_of(e.kind());
  } catch (const std::exception& e) {
    write_message(e.what(), error_message, error_capacity);
    return KVFLASH_INTERNAL_ERROR;
  } catch (...) {
    write_message("unknown exception", error_message, error_capacity);
    return KVFLASH_INTERNAL_ERROR;
  }
}

const char* kvflash_version(void) { return KVFLASH_VERSION_STRING; }

int kvflash_abi_version(void) { return KVFLASH_C_ABI_VERSION; }

}  // extern "C"
