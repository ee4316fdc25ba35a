/* kvflash's C ABI: flash_attn_with_kvcache for FFI callers (ctypes, Rust, ...). Tensors are
 * kvflash_tensor structs (a DLTensor-like view); an optional tensor is a pointer, NULL when
 * absent. Every call returns KVFLASH_OK or an error code and writes the error's text into the
 * caller's buffer. */
#ifndef KVFLASH_C_API_H_
#define KVFLASH_C_API_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Element types, in kvflash::DType's order. */
enum kvflash_dtype {
  KVFLASH_FLOAT32 = 0,
  KVFLASH_FLOAT16 = 1,
  KVFLASH_BFLOAT16 = 2,
  KVFLASH_FLOAT8_E4M3 = 3,
  KVFLASH_INT32 = 4,
  KVFLASH_FLOAT64 = 5
};

/* DLPack's device codes. */
enum kvflash_device_type { KVFLASH_CPU = 1, KVFLASH_CUDA = 2 };

/* Return codes: 0, or the kind of the error. */
enum kvflash_status {
  KVFLASH_OK = 0,
  KVFLASH_INVALID_VALUE = 1,
  KVFLASH_INVALID_TYPE = 2,
  KVFLASH_UNSUPPORTED = 3,
  KVFLASH_DEVICE_FAILURE = 4,
  KVFLASH_INTERNAL_ERROR = 5
};

#define KVFLASH_MAX_RANK 6

typedef struct kvflash_tensor {
  void* data;
  int32_t dtype;       /* enum kvflash_dtype */
  int32_t device_type; /* enum kvflash_device_type */
  int32_t device_id;
  int32_t rank;
  int64_t shape[KVFLASH_MAX_RANK];
  int64_t strides[KVFLASH_MAX_RANK]; /* in elements */
} kvflash_tensor;

/* flash_attn_with_kvcache's arguments (FA3 names). Start from kvflash_args_init(). */
typedef struct kvflash_args {
  const kvflash_tensor* q;
  const kvflash_tensor* k_cache;
  const kvflash_tensor* v_cache;
  const kvflash_tensor* k;
  const kvflash_tensor* v;
  const kvflash_tensor* qv;
  const kvflash_tensor* rotary_cos;
  const kvflash_tensor* rotary_sin;
  const kvflash_tensor* cache_seqlens;
  int32_t has_cache_seqlens_value; /* 1: cache_seqlens_value applies to every sequence */
  int32_t cache_seqlens_value;
  const kvflash_tensor* cache_batch_idx;
  const kvflash_tensor* cache_leftpad;
  const kvflash_tensor* page_table;
  const kvflash_tensor* cu_seqlens_q;
  const kvflash_tensor* cu_seqlens_k_new;
  int32_t max_seqlen_q; /* negative: not given */
  const kvflash_tensor* rotary_seqlens;
  const kvflash_tensor* q_descale;
  const kvflash_tensor* k_descale;
  const kvflash_tensor* v_descale;
  int32_t has_softmax_scale;
  float softmax_scale;
  int32_t causal;
  int32_t window_left;
  int32_t window_right;
  int32_t attention_chunk;
  float softcap;
  int32_t rotary_interleaved;
  const kvflash_tensor* scheduler_metadata;
  int32_t num_splits;
  int32_t pack_gqa; /* -1: heuristic, 0: false, 1: true */
  int32_t sm_margin;
  const kvflash_tensor* sinks;
  int32_t only_qv;
  int32_t checked;
  int32_t batch_invariant; /* 1: a sequence's bits do not depend on the rest of the batch */
} kvflash_args;

typedef struct kvflash_outputs {
  const kvflash_tensor* out; /* required */
  const kvflash_tensor* softmax_lse;
  const kvflash_tensor* out_accum;
  const kvflash_tensor* softmax_lse_accum;
} kvflash_outputs;

/* FA3's defaults: no optional tensors, window (-1, -1), rotary_interleaved 1, pack_gqa -1. */
void kvflash_args_init(kvflash_args* args);

/* Validates, appends k / v into the cache, attends. stream: a cudaStream_t for CUDA tensors.
 * On failure nothing was written; error_message (if not NULL) receives the message,
 * truncated to error_capacity - 1 characters and NUL-terminated. */
int kvflash_flash_attn_with_kvcache(const kvflash_args* args, const kvflash_outputs* outputs,
                                    void* stream, char* error_message, size_t error_capacity);

/* The library's version, "MAJOR.MINOR.PATCH" (kvflash/version.h's KVFLASH_VERSION_STRING). */
const char* kvflash_version(void);

/* The C ABI's own version: the value of KVFLASH_C_ABI_VERSION the library was built with. It
 * changes only when a struct's layout, an enum's values or a function's signature above changes
 * incompatibly (docs/abi.md); an FFI binding compares it with the version it was written for. */
#define KVFLASH_C_ABI_VERSION 1
int kvflash_abi_version(void);

#ifdef __cplusplus
}
#endif

#endif /* KVFLASH_C_API_H_ */
