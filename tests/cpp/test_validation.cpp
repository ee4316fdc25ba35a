// Every message of validate(), the value checks, the output and combine checks: each case breaks
// one thing of a valid call and expects its error (kind and text). Rejected calls write nothing.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "core/backend.h"
#include "core/validate.h"
#include "cpp/validation_call.h"
#include "kvflash/kvflash.h"

namespace kvflash::testing {
namespace {

constexpr Device kCuda{DeviceType::cuda, 0};

::testing::AssertionResult fails_with(const std::function<void()>& call, ErrorKind kind,
                                      const std::string& text) {
  try {
    call();
  } catch (const Error& e) {
    if (e.kind() != kind) {
      return ::testing::AssertionFailure()
             << "kind " << error_kind_name(e.kind()) << ", expected " << error_kind_name(kind)
             << ": " << e.what();
    }
    if (std::string(e.what()).find(text) == std::string::npos) {
      return ::testing::AssertionFailure() << "message \"" << e.what() << "\" lacks \"" << text
                                           << "\"";
    }
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure() << "no error; expected \"" << text << "\"";
}

// A 16-bit call's caches turned fp8 e4m3 (the views' strides stay valid: fewer bytes per element).
void to_fp8_cache(Call& c) { c.args.k_cache->dtype = c.args.v_cache->dtype = DType::e4m3; }

TEST(Validate, BaseCallsAreValid) {
  for (CallDims dims : {CallDims{}, CallDims{.seqlen_new = 2, .paged = true},
                        CallDims{.seqlen_new = 2, .knew_packed = true, .varlen_q = true},
                        CallDims{.headdim_v = 256, .qv = true},
                        CallDims{.seqlen_new = 2, .rotary = true}}) {
    Call c(dims);
    EXPECT_NO_THROW(validate(c.args));
  }
  Call only_qv({.headdim_v = 256, .qv = true});
  only_qv.args.only_qv = true;
  only_qv.args.q.reset();
  only_qv.args.k_cache.reset();
  EXPECT_NO_THROW(validate(only_qv.args));
  // MLA's latent width over an fp8 cache under a 16-bit query (contract 5.8), with or without qv
  // (FA3's all-fp8 call keeps d_v <= 256: headdim_v_512_fp8).
  for (bool qv : {false, true}) {
    Call latent({.headdim_v = 512, .dtype = DType::bf16, .qv = qv});
    to_fp8_cache(latent);
    EXPECT_NO_THROW(validate(latent.args)) << qv;
  }
}

// --- metadata checks: validate() ---------------------------------------------------------------

struct Breakage {
  const char* name;
  CallDims dims;
  std::function<void(Call&)> edit;
  ErrorKind kind;
  const char* message;
};

std::ostream& operator<<(std::ostream& os, const Breakage& b) { return os << b.name; }

const CallDims kNewKv{.seqlen_new = 2};
const CallDims kPaged{.seqlen_new = 2, .paged = true};
const CallDims kVarlen{.varlen_q = true};
const CallDims kQv{.headdim_v = 256, .qv = true};
const CallDims kRotary{.seqlen_new = 2, .rotary = true};
const CallDims kFp8{.dtype = DType::e4m3};
const CallDims kBf16{.dtype = DType::bf16};
const ErrorKind kValue = ErrorKind::invalid_value;
const ErrorKind kType = ErrorKind::invalid_type;

const std::vector<Breakage> kMetadataBreakages = {
    // presence
    {"only_qv_without_qv", {}, [](Call& c) { c.args.only_qv = true; }, kValue,
     "only_qv=True requires qv"},
    {"no_q_no_qv", {}, [](Call& c) { c.args.q.reset(); }, kValue,
     "q must be provided unless qv is provided with only_qv=True"},
    {"no_q_without_only_qv", kQv, [](Call& c) { c.args.q.reset(); }, kValue,
     "q can only be None when only_qv=True"},
    {"no_k_cache", {}, [](Call& c) { c.args.k_cache.reset(); }, kValue,
     "k_cache can only be None when only_qv=True"},
    {"k_without_k_cache", {.headdim_v = 256, .seqlen_new = 2, .qv = true},
     [](Call& c) { c.args.only_qv = true; c.args.k_cache.reset(); }, kValue,
     "new keys k need a k_cache to be appended to"},
    {"no_v_cache", {}, [](Call& c) { c.args.v_cache.reset(); }, kValue,
     "v_cache must be provided"},
    // well-formed tensors
    {"rank_too_large", {}, [](Call& c) { c.args.q->rank = 7; }, kValue,
     "q must have rank 0 to 6 (got rank 7)"},
    {"negative_size", {}, [](Call& c) { c.args.k_cache->shape[1] = -1; }, kValue,
     "k_cache has a size out of range [0, 2^31) in dimension 1"},
    {"null_data", {}, [](Call& c) { c.args.v_cache->data = nullptr; }, kValue,
     "v_cache has no data pointer"},
    // dtypes and devices
    {"q_float64", {}, [](Call& c) { c.args.q->dtype = DType::f64; }, kType,
     "FlashAttention only supports fp16, bf16, and fp8_e4m3 data type"},
    {"k_cache_dtype", {}, [](Call& c) { c.args.k_cache->dtype = DType::f16; }, kType,
     "query and key must have the same dtype (expected float32, got float16)"},
    {"v_cache_dtype", {}, [](Call& c) { c.args.v_cache->dtype = DType::bf16; }, kType,
     "query and value must have the same dtype"},
    // a 16-bit query over an fp8 cache (contract 5.8): the one mix accepted; the rest refused
    {"fp8_k_cache_bf16_v_cache", kBf16, [](Call& c) { c.args.k_cache->dtype = DType::e4m3; }, kType,
     "a bfloat16 q over an fp8 KV cache needs k_cache and v_cache both float8_e4m3fn (expected "
     "float8_e4m3fn, got bfloat16)"},
    {"fp8_cache_float32_q", {}, to_fp8_cache, kType,
     "query and key must have the same dtype (expected float32, got float8_e4m3fn)"},
    {"fp8_q_bf16_cache", kFp8,
     [](Call& c) { c.args.k_cache->dtype = c.args.v_cache->dtype = DType::bf16; }, kType,
     "query and key must have the same dtype (expected float8_e4m3fn, got bfloat16)"},
    {"qv_fp8_over_fp8_cache", {.headdim_v = 256, .dtype = DType::bf16, .qv = true},
     [](Call& c) {
       to_fp8_cache(c);
       c.args.qv->dtype = DType::e4m3;
     },
     kType, "q_v is only supported for fp16 and bf16 data type (and float32 on the CPU; got "
     "float8_e4m3fn)"},
    {"q_descale_over_fp8_cache", kBf16,
     [](Call& c) {
       to_fp8_cache(c);
       c.args.q_descale = c.tensor(DType::f32, {2, 2});
     },
     kValue,
     "q_descale is only for a float8_e4m3fn query (q is bfloat16; k_descale / v_descale "
     "dequantise the fp8 KV cache)"},
    {"v_descale_shape_fp8_cache", {.dtype = DType::f16},
     [](Call& c) {
       to_fp8_cache(c);
       c.args.v_descale = c.tensor(DType::f32, {2});
     },
     kValue, "v_descale must have shape (batch_size, num_heads_k) (expected (2, 2), got (2,))"},
    {"k_descale_dtype_fp8_cache", kBf16,
     [](Call& c) {
       to_fp8_cache(c);
       c.args.k_descale = c.tensor(DType::bf16, {2, 2});
     },
     kType, "k_descale must have dtype float32"},
    {"headdim_multiple_fp8_cache", {.headdim = 72, .headdim_v = 72, .dtype = DType::bf16},
     to_fp8_cache, kValue, "head_size should be a multiple of 16 (got 72)"},
    {"new_k_fp8_into_fp8_cache", {.dtype = DType::bf16, .seqlen_new = 2},
     [](Call& c) {
       to_fp8_cache(c);
       c.args.k->dtype = DType::e4m3;
     },
     kType, "k_new must have the same dtype as query (expected bfloat16, got float8_e4m3fn)"},
    {"unknown_device", {}, [](Call& c) { c.args.q->device = Device{DeviceType(7), 0}; }, kType,
     "q must be on a CPU or CUDA device"},
    {"mixed_devices", {}, [](Call& c) { c.args.cache_seqlens->device = kCuda; }, kType,
     "cache_seqlens must be on the same device as the query (expected cpu, got cuda:0)"},
    {"float32_on_cuda", {}, [](Call& c) { c.move_to(kCuda); }, ErrorKind::unsupported,
     "float32 inputs are supported by the CPU backend only"},
    // ranks and last-dimension strides
    {"q_rank", {}, [](Call& c) { c.args.q->rank = 3; }, kValue, "q must have rank 4"},
    {"k_cache_rank", {}, [](Call& c) { c.args.k_cache->rank = 3; }, kValue,
     "k_cache must have rank 4"},
    {"q_stride", {}, [](Call& c) { c.args.q->strides[3] = 2; }, kValue,
     "q must have contiguous last dimension (q.stride(-1) is 2, expected 1)"},
    {"k_cache_stride", {}, [](Call& c) { c.args.k_cache->strides[3] = 2; }, kValue,
     "k_cache must have contiguous last dimension (k_cache.stride(-1) is 2, expected 1)"},
    {"v_cache_stride", {}, [](Call& c) { c.args.v_cache->strides[3] = 3; }, kValue,
     "v_cache must have contiguous last dimension (v_cache.stride(-1) is 3, expected 1)"},
    // page_table and cu_seqlens_q
    {"page_table_dtype", kPaged, [](Call& c) { c.args.page_table->dtype = DType::f32; }, kType,
     "page_table must have dtype torch.int32 (expected int32, got float32)"},
    {"page_table_rank", kPaged, [](Call& c) { c.args.page_table->rank = 1; }, kValue,
     "page_table must have rank 2"},
    {"page_table_stride", kPaged, [](Call& c) { c.args.page_table->strides[1] = 2; }, kValue,
     "page_table must have contiguous last dimension"},
    {"cu_seqlens_q_dtype", kVarlen, [](Call& c) { c.args.cu_seqlens_q->dtype = DType::f32; },
     kType, "cu_seqlens_q must have dtype torch.int32"},
    {"cu_seqlens_q_stride", kVarlen, [](Call& c) { c.args.cu_seqlens_q->strides[0] = 2; },
     kValue, "cu_seqlens_q must be contiguous"},
    {"cu_seqlens_q_empty", kVarlen, [](Call& c) { c.args.cu_seqlens_q->shape[0] = 0; }, kValue,
     "cu_seqlens_q must have at least one entry"},
    {"max_seqlen_q_missing", kVarlen, [](Call& c) { c.args.max_seqlen_q.reset(); }, kValue,
     "max_seqlen_q must be provided if cu_seqlens_q is provided"},
    {"max_seqlen_q_negative", kVarlen, [](Call& c) { c.args.max_seqlen_q = -1; }, kValue,
     "max_seqlen_q must be >= 0"},
    // batch and heads
    {"batch_k", {}, [](Call& c) { c.args.k_cache->shape[0] = c.args.v_cache->shape[0] = 1; },
     kValue, "batch_size must be equal to batch_size_k (batch_size is 2, batch_size_k is 1"},
    {"headdim_too_large", {.headdim = 320, .headdim_v = 320}, nullptr, kValue,
     "FlashAttention forward only supports head dimension at most 256 (headdim is 320)"},
    {"headdim_v_zero", {.headdim_v = 0}, nullptr, kValue, "head dimensions must be positive"},
    {"heads_do_not_divide", {.heads = 3}, nullptr, kValue,
     "Number of heads in key/value must divide number of heads in query (num_heads is 3, "
     "num_heads_k is 2)"},
    {"headdim_v_differs", {.headdim = 128, .headdim_v = 64}, nullptr, kValue,
     "If V headdim is different from Q/K dim, we only support Q/K headdim in (128, 192]"},
    {"headdim_v_512_fp8", {.headdim_v = 512, .dtype = DType::e4m3}, nullptr, kType,
     "HeaddimV > 256 requires fp16 and bf16 data type (headdim_v is 512, q is float8_e4m3fn)"},
    // scalars
    {"window_left", {}, [](Call& c) { c.args.window_left = -2; }, kValue,
     "window_size[0] must be >= -1"},
    {"window_right", {}, [](Call& c) { c.args.window_right = -3; }, kValue,
     "window_size[1] must be >= -1"},
    {"attention_chunk", {}, [](Call& c) { c.args.attention_chunk = -1; }, kValue,
     "attention_chunk must be >= 0"},
    {"softcap", {}, [](Call& c) { c.args.softcap = -1.0f; }, kValue, "softcap must be >= 0"},
    {"softmax_scale", {}, [](Call& c) { c.args.softmax_scale = NAN; }, kValue,
     "softmax_scale must be finite"},
    {"num_splits", {}, [](Call& c) { c.args.num_splits = 257; }, kValue,
     "num_splits > 256 not supported (got 257)"},
    {"sm_margin", {}, [](Call& c) { c.args.sm_margin = -1; }, kValue, "sm_margin must be >= 0"},
    // shapes, lengths, alignment
    {"k_cache_shape", {}, [](Call& c) { c.args.k_cache->shape[2] = 3; }, kValue,
     "k_cache must have shape (batch_size_k, seqlen_k, num_heads_k, headdim) (expected (2, 16, "
     "2, 64), got (2, 16, 3, 64))"},
    {"no_pages", kPaged, [](Call& c) { c.args.k_cache->shape[0] = c.args.v_cache->shape[0] = 0; },
     kValue, "a paged cache needs at least one page"},
    {"cache_seqlens_dtype", {}, [](Call& c) { c.args.cache_seqlens->dtype = DType::f32; }, kType,
     "cache_seqlens must have dtype int32"},
    {"cache_seqlens_shape", {}, [](Call& c) { c.args.cache_seqlens->shape[0] = 3; }, kValue,
     "cache_seqlens must have shape (batch_size,) = (2,) (expected (2,), got (3,))"},
    {"cache_leftpad_dtype", {},
     [](Call& c) { c.args.cache_leftpad = c.tensor(DType::f32, {2}); }, kType,
     "cache_leftpad must have dtype int32"},
    {"cache_seqlens_twice", {}, [](Call& c) { c.args.cache_seqlens_value = 1; }, kValue,
     "cache_seqlens must be either a tensor or an int, not both"},
    {"cache_seqlens_int_range", {},
     [](Call& c) { c.args.cache_seqlens.reset(); c.args.cache_seqlens_value = 40; }, kValue,
     "cache_seqlens = 40 is out of range [0, 16]"},
    {"headdim_multiple", {.headdim = 60, .headdim_v = 60}, nullptr, kValue,
     "head_size should be a multiple of 8 (got 60)"},
    {"headdim_v_multiple", {.headdim_v = 68}, nullptr, kValue,
     "head_size_v should be a multiple of 8 (got 68)"},
    {"headdim_multiple_fp8", {.headdim = 72, .headdim_v = 72, .dtype = DType::e4m3}, nullptr,
     kValue, "head_size should be a multiple of 16 (got 72)"},
    // new keys and values
    {"k_without_v", kNewKv, [](Call& c) { c.args.v.reset(); }, kValue,
     "If k_new is supplied, v_new must also be passed in"},
    {"v_without_k", kNewKv, [](Call& c) { c.args.k.reset(); }, kValue,
     "If v_new is supplied, k_new must also be passed in"},
    {"cu_seqlens_k_new_dtype", kNewKv,
     [](Call& c) { c.args.cu_seqlens_k_new = c.tensor(DType::f32, {3}); }, kType,
     "cu_seqlens_k_new must have dtype int32"},
    {"k_without_cache_seqlens", kNewKv, [](Call& c) { c.args.cache_seqlens.reset(); }, kValue,
     "If k_new is supplied, seqlens_k must also be passed in"},
    {"k_dtype", kNewKv, [](Call& c) { c.args.k->dtype = DType::f16; }, kType,
     "k_new must have the same dtype as query"},
    {"v_dtype", kNewKv, [](Call& c) { c.args.v->dtype = DType::f16; }, kType,
     "v_new must have the same dtype as query"},
    {"k_rank", kNewKv, [](Call& c) { c.args.k->rank = 3; }, kValue, "k must have rank 4"},
    {"k_stride", kNewKv, [](Call& c) { c.args.k->strides[3] = 2; }, kValue,
     "k must have contiguous last dimension (k.stride(-1) is 2, expected 1)"},
    {"v_stride", kNewKv, [](Call& c) { c.args.v->strides[3] = 2; }, kValue,
     "v must have contiguous last dimension"},
    {"k_shape", kNewKv, [](Call& c) { c.args.k->shape[2] = 3; }, kValue,
     "k must have shape (batch_size, seqlen_new, num_heads_k, headdim)"},
    {"v_shape", kNewKv, [](Call& c) { c.args.v->shape[1] = 3; }, kValue,
     "v must have shape (batch_size, seqlen_new, num_heads_k, headdim_v)"},
    {"k_longer_than_cache", kNewKv,
     [](Call& c) { c.args.k->shape[1] = c.args.v->shape[1] = 17; }, kValue,
     "If k_new is supplied, it must have seqlen <= the seqlen of the KV cache"},
    // scheduler metadata
    {"plan_and_metadata", {},
     [](Call& c) {
       static const Plan plan;
       c.args.plan = &plan;
       c.args.scheduler_metadata = c.tensor(DType::i32, {12});
     },
     kValue, "give either a Plan or scheduler_metadata, not both"},
    {"metadata_dtype", {}, [](Call& c) { c.args.scheduler_metadata = c.tensor(DType::f32, {12}); },
     kType, "scheduler_metadata must have dtype int32"},
    {"metadata_rank", {},
     [](Call& c) { c.args.scheduler_metadata = c.tensor(DType::i32, {3, 4}); }, kValue,
     "scheduler_metadata must have rank 1"},
    {"metadata_stride", {},
     [](Call& c) {
       c.args.scheduler_metadata = c.tensor(DType::i32, {12});
       c.args.scheduler_metadata->strides[0] = 2;
     },
     kValue, "scheduler_metadata must be contiguous"},
    // qv
    {"qv_headdim", {.headdim = 192, .headdim_v = 128, .qv = true}, nullptr, kValue,
     "q_v is only supported for head_size <= 64"},
    {"qv_headdim_v", {.headdim_v = 128, .qv = true}, nullptr, kValue,
     "q_v is only supported for hdim_v >= 256."},
    {"qv_fp8", kQv, [](Call& c) { c.args.qv->dtype = DType::e4m3; }, kType,
     "q_v is only supported for fp16 and bf16 data type"},
    // FA3's all-fp8 call takes no qv (an e4m3 qv would need a descale of its own): refused as FA3
    // does, whatever qv's dtype.
    {"qv_all_fp8", {.headdim_v = 256, .dtype = DType::e4m3, .qv = true}, nullptr, kType,
     "q_v is only supported for fp16 and bf16 data type (and float32 on the CPU; got float8_e4m3fn)"},
    {"qv_bf16_under_fp8_q", {.headdim_v = 256, .dtype = DType::e4m3, .qv = true},
     [](Call& c) { c.args.qv->dtype = DType::bf16; }, kType,
     "q_v must have the same dtype as query"},
    {"qv_dtype", kQv, [](Call& c) { c.args.qv->dtype = DType::f16; }, kType,
     "q_v must have the same dtype as query"},
    {"qv_stride", kQv, [](Call& c) { c.args.qv->strides[3] = 2; }, kValue,
     "q_v tensor must have contiguous last dimension"},
    {"qv_shape", kQv, [](Call& c) { c.args.qv->shape[2] = 3; }, kValue, "q_v must have shape"},
    // rotary
    {"rotary_seqlens_dtype", kRotary,
     [](Call& c) { c.args.rotary_seqlens = c.tensor(DType::f32, {2}); }, kType,
     "rotary_seqlens must have dtype int32"},
    {"cos_without_sin", kRotary, [](Call& c) { c.args.rotary_sin.reset(); }, kValue,
     "If rotary cos is provided, rotary sin must also be provided"},
    {"sin_without_cos", kRotary, [](Call& c) { c.args.rotary_cos.reset(); }, kValue,
     "If rotary sin is provided, rotary cos must also be provided"},
    {"rotary_without_new_kv", {.rotary = true}, nullptr, kValue,
     "If rotary cos/sin are provided, new key / value to be appended to KV cache must also be "
     "provided"},
    {"rotary_rank", kRotary, [](Call& c) { c.args.rotary_cos->rank = 1; }, kValue,
     "rotary_cos must have rank 2"},
    {"rotary_dim_too_large", {.seqlen_new = 2, .rotary = true, .rotary_dim = 80}, nullptr, kValue,
     "rotary_dim must be <= headdim"},
    {"rotary_dim_multiple", {.seqlen_new = 2, .rotary = true, .rotary_dim = 24}, nullptr, kValue,
     "Only rotary dimensions divisible by 16 are currently supported"},
    {"rotary_sin_shape", kRotary, [](Call& c) { c.args.rotary_sin->shape[1] = 8; }, kValue,
     "rotary_sin must have shape (seqlen_ro, rotary_dim / 2)"},
    {"rotary_cos_contiguous", kRotary, [](Call& c) { c.args.rotary_cos->strides[0] = 32; },
     kValue, "rotary_cos must be contiguous"},
    {"rotary_cos_dtype", kRotary, [](Call& c) { c.args.rotary_cos->dtype = DType::f16; }, kType,
     "rotary_cos must have the same dtype as query"},
    {"rotary_sin_dtype", kRotary, [](Call& c) { c.args.rotary_sin->dtype = DType::f16; }, kType,
     "rotary_sin must have the same dtype as query"},
    {"rotary_paged_rows", {.seqlen_new = 2, .paged = true, .rotary = true, .rotary_rows = 8},
     nullptr, kValue, "cos/sin seqlen must be at least the seqlen of KV cache"},
    // cache_batch_idx, descales, sinks
    {"cache_batch_idx_dtype", {},
     [](Call& c) { c.args.cache_batch_idx = c.tensor(DType::f32, {2}); }, kType,
     "cache_batch_idx must have dtype int32"},
    {"q_descale_dtype", kFp8, [](Call& c) { c.args.q_descale = c.tensor(DType::f16, {2, 2}); },
     kType, "q_descale must have dtype float32"},
    {"k_descale_shape", kFp8, [](Call& c) { c.args.k_descale = c.tensor(DType::f32, {2, 4}); },
     kValue, "k_descale must have shape (batch_size, num_heads_k) (expected (2, 2), got (2, 4))"},
    {"sinks_dtype", {}, [](Call& c) { c.args.sinks = c.tensor(DType::f16, {4}); }, kType,
     "sinks must have dtype float32 or bfloat16"},
    {"sinks_shape", {}, [](Call& c) { c.args.sinks = c.tensor(DType::f32, {3}); }, kValue,
     "sinks must have shape (num_heads)"},
    {"sinks_contiguous", {},
     [](Call& c) {
       c.args.sinks = c.tensor(DType::f32, {8});
       c.args.sinks->shape[0] = 4;
       c.args.sinks->strides[0] = 2;
     },
     kValue, "sinks must be contiguous"},
};

class MetadataBreakage : public ::testing::TestWithParam<Breakage> {};

TEST_P(MetadataBreakage, IsRejectedByValidate) {
  const Breakage& b = GetParam();
  Call c(b.dims);
  if (b.edit) b.edit(c);
  EXPECT_TRUE(fails_with([&] { validate(c.args); }, b.kind, b.message));
}

INSTANTIATE_TEST_SUITE_P(Validate, MetadataBreakage, ::testing::ValuesIn(kMetadataBreakages),
                         [](const auto& info) { return std::string(info.param.name); });

// --- value checks and outputs: the full call, which must leave the cache untouched -------------

const std::vector<Breakage> kCallBreakages = {
    // index and length values
    {"cu_seqlens_q_start", kVarlen, [](Call& c) { Call::i32(c.args.cu_seqlens_q)[0] = 1; },
     kValue, "cu_seqlens_q[0] = 1, expected 0"},
    {"cu_seqlens_q_decreasing", kVarlen, [](Call& c) { Call::i32(c.args.cu_seqlens_q)[1] = 5; },
     kValue, "cu_seqlens_q[2] = 4 is less than cu_seqlens_q[1] = 5"},
    {"cu_seqlens_q_total", kVarlen, [](Call& c) { Call::i32(c.args.cu_seqlens_q)[2] = 3; },
     kValue, "cu_seqlens_q[2] = 3, expected the total 4 (q.shape[0])"},
    {"cu_seqlens_q_max", kVarlen, [](Call& c) { Call::i32(c.args.cu_seqlens_q)[1] = 1; },
     kValue, "cu_seqlens_q[2] - cu_seqlens_q[1] = 3 exceeds max_seqlen_q = 2"},
    {"cu_seqlens_k_new_total", {.seqlen_new = 2, .knew_packed = true},
     [](Call& c) { Call::i32(c.args.cu_seqlens_k_new)[2] = 3; }, kValue,
     "cu_seqlens_k_new[2] = 3, expected the total 4 (k.shape[0])"},
    {"cache_seqlens_negative", {}, [](Call& c) { Call::i32(c.args.cache_seqlens)[1] = -1; },
     kValue, "cache_seqlens[1] = -1 must be >= 0"},
    {"cache_leftpad_range", {}, [](Call& c) { c.args.cache_leftpad = c.ints({9, 0}); }, kValue,
     "cache_leftpad[0] = 9 is out of range [0, 3]"},
    {"capacity", kNewKv, [](Call& c) { Call::i32(c.args.cache_seqlens)[1] = 15; }, kValue,
     "cache_seqlens[1] + new tokens = 15 + 2 = 17 exceeds the cache capacity 16"},
    {"cache_batch_idx_range", {}, [](Call& c) { c.args.cache_batch_idx = c.ints({0, 7}); },
     kValue, "cache_batch_idx[1] = 7 is out of range [0, 2)"},
    // Sequence 0 holds 3 tokens on page 0; its append writes page 1.
    {"page_written_by_append", kPaged, [](Call& c) { Call::i32(c.args.page_table)[1] = 99; },
     kValue, "page_table[0, 1] = 99 is out of range [0, 8)"},
    {"page_read", kPaged, [](Call& c) { Call::i32(c.args.page_table)[4] = -1; }, kValue,
     "page_table[1, 0] = -1 is out of range [0, 8)"},
    {"rotary_seqlens_negative", kRotary, [](Call& c) { c.args.rotary_seqlens = c.ints({-1, 0}); },
     kValue, "rotary_seqlens[0] = -1 must be >= 0"},
    {"rotary_table_short", {.seqlen_new = 2, .rotary = true, .rotary_rows = 6}, nullptr, kValue,
     "rotary_cos / rotary_sin have 6 rows, but batch 1 rotates position 6"},
    {"rotary_table_short_causal_q", {.seqlen_q = 4, .seqlen_new = 2, .rotary = true,
                                     .rotary_rows = 8},
     [](Call& c) { c.args.causal = true; }, kValue,
     "rotary_cos / rotary_sin have 8 rows, but batch 1 rotates position 8"},
    // outputs
    {"out_dtype", {}, [](Call& c) { c.outputs.out.dtype = DType::f16; }, kType,
     "For FP16/BF16 input, output must have the same dtype as inputs. For FP8 input, output must "
     "have dtype BF16 (expected float32, got float16)"},
    {"out_dtype_fp8", kFp8, [](Call& c) { c.outputs.out.dtype = DType::e4m3; }, kType,
     "For FP8 input, output must have dtype BF16 (expected bfloat16, got float8_e4m3fn)"},
    {"out_shape", {}, [](Call& c) { c.outputs.out.shape[1] = 3; }, kValue,
     "out must have shape (batch_size, seqlen_q, num_heads, headdim_v)"},
    {"out_shape_varlen", kVarlen, [](Call& c) { c.outputs.out.shape[0] = 3; }, kValue,
     "out must have shape (total_q, num_heads, headdim_v)"},
    {"out_stride", {}, [](Call& c) { c.outputs.out.strides[3] = 2; }, kValue,
     "Output tensor must have contiguous last dimension"},
    {"out_device", {}, [](Call& c) { c.outputs.out.device = kCuda; }, kType,
     "out must be on the same device as the query"},
    {"out_no_data", {}, [](Call& c) { c.outputs.out.data = nullptr; }, kValue,
     "out has no data pointer"},
    {"lse_dtype", {}, [](Call& c) { c.outputs.softmax_lse->dtype = DType::f16; }, kType,
     "softmax_lse must have dtype float32"},
    {"lse_shape", {}, [](Call& c) { c.outputs.softmax_lse->shape[2] = 5; }, kValue,
     "softmax_lse must have shape (batch_size, num_heads, seqlen_q)"},
    {"accum_alone", {}, [](Call& c) { c.outputs.out_accum = c.tensor(DType::f32, {1}); }, kValue,
     "out_accum and softmax_lse_accum must be given together"},
    {"out_accum_shape", kNewKv,
     [](Call& c) {
       c.args.num_splits = 2;
       c.outputs.out_accum = c.tensor(DType::f32, {2, 2, 4, 2, 32});
       c.outputs.softmax_lse_accum = c.tensor(DType::f32, {2, 2, 4, 2});
     },
     kValue, "out_accum must have shape (num_splits, batch_size, num_heads, seqlen_q, headdim_v)"},
    {"lse_accum_shape", kNewKv,
     [](Call& c) {
       c.args.num_splits = 2;
       c.outputs.out_accum = c.tensor(DType::f32, {2, 2, 4, 2, 64});
       c.outputs.softmax_lse_accum = c.tensor(DType::f32, {2, 4, 2});
     },
     kValue, "softmax_lse_accum must have shape (num_splits, batch_size, num_heads, seqlen_q)"},
};

class CallBreakage : public ::testing::TestWithParam<Breakage> {};

TEST_P(CallBreakage, IsRejectedBeforeAnythingIsWritten) {
  const Breakage& b = GetParam();
  Call c(b.dims);
  c.fill_caches();
  if (b.edit) b.edit(c);
  const auto bytes = [](const OptTensor& t) {
    const auto* p = static_cast<const unsigned char*>(t->data);
    return std::vector<unsigned char>(p, p + t->numel() * dtype_size(t->dtype));
  };
  const auto k_before = bytes(c.args.k_cache);
  const auto v_before = bytes(c.args.v_cache);
  EXPECT_TRUE(fails_with([&] { flash_attn_with_kvcache(c.args, c.outputs); }, b.kind, b.message));
  EXPECT_EQ(bytes(c.args.k_cache), k_before);
  EXPECT_EQ(bytes(c.args.v_cache), v_before);
}

INSTANTIATE_TEST_SUITE_P(Call, CallBreakage, ::testing::ValuesIn(kCallBreakages),
                         [](const auto& info) { return std::string(info.param.name); });

// The control of the test above: the same call, valid, does write the cache.
TEST(Call, ValidAppendWritesTheCache) {
  Call c(kPaged);
  c.fill_caches();
  auto* k = c.args.k->ptr<float>();
  for (int64_t i = 0; i < c.args.k->numel(); ++i) k[i] = 2.0f;
  const std::vector<float> before(c.args.k_cache->ptr<float>(),
                                  c.args.k_cache->ptr<float>() + c.args.k_cache->numel());
  flash_attn_with_kvcache(c.args, c.outputs);
  const float* after = c.args.k_cache->ptr<float>();
  EXPECT_NE(std::vector<float>(after, after + c.args.k_cache->numel()), before);
}

// A device backend's checked mode hands check_values() host copies, not the tensors.
TEST(Call, ValueChecksReadTheGivenHostCopies) {
  Call c(kPaged);
  const core::Problem p = core::resolve(c.args);
  EXPECT_NO_THROW(core::check_values(p, core::host_indices(p)));
  std::vector<int32_t> table(Call::i32(c.args.page_table), Call::i32(c.args.page_table) + 8);
  table[5] = 8;  // page 1 of sequence 1
  core::HostIndices copies = core::host_indices(p);
  copies.page_table = table.data();
  EXPECT_TRUE(fails_with([&] { core::check_values(p, copies); }, kValue,
                         "page_table[1, 1] = 8 is out of range [0, 8) (batch 1)"));
  c.args.checked = true;
  EXPECT_TRUE(core::checked_mode(c.args));
}

TEST(Call, WorkspaceTooSmall) {
  Call c(kNewKv);
  c.args.num_splits = 2;
  char byte = 0;
  RunOptions options;
  options.workspace = Workspace{&byte, 1};
  EXPECT_TRUE(fails_with([&] { flash_attn_with_kvcache(c.args, c.outputs, options); }, kValue,
                         "workspace is too small"));
  // Checked whatever the outputs: with the caller's own partial buffers too.
  const OutputSpec spec = output_spec(c.args);
  ASSERT_GT(spec.num_splits, 1);
  const auto shape = [](const TensorSpec& t) { return std::vector<int64_t>(t.shape, t.shape + t.rank); };
  c.outputs.out_accum = c.tensor(DType::f32, shape(spec.out_accum));
  c.outputs.softmax_lse_accum = c.tensor(DType::f32, shape(spec.softmax_lse_accum));
  EXPECT_TRUE(fails_with([&] { flash_attn_with_kvcache(c.args, c.outputs, options); }, kValue,
                         "workspace is too small"));
  EXPECT_NO_THROW(flash_attn_with_kvcache(c.args, c.outputs));  // the call's own workspace
}

TEST(Call, CudaTensorsNeedTheCudaBackend) {
  Call c({.dtype = DType::bf16});
  c.move_to(kCuda);
  const bool built = core::cuda_backend() != nullptr;
  if (built && cuda_available()) GTEST_SKIP() << "a CUDA device is present";
  EXPECT_TRUE(fails_with([&] { flash_attn_with_kvcache(c.args, c.outputs); },
                         ErrorKind::unsupported,
                         built ? "no CUDA device is available"
                               : "kvflash was built without the CUDA backend"));
}

TEST(Call, UnknownDeviceTypeHasNoBackend) {
  EXPECT_TRUE(fails_with([] { core::backend_for(Device{DeviceType(9), 0}); }, kType,
                         "unknown device type 9"));
}

TEST(Call, OutputSpecMatchesTheCall) {
  Call c(kVarlen);
  const OutputSpec spec = output_spec(c.args);
  EXPECT_EQ(spec.out.rank, 3);
  EXPECT_EQ(spec.out.shape[0], 4);
  EXPECT_EQ(spec.softmax_lse.shape[0], 4);
  EXPECT_EQ(spec.softmax_lse.shape[1], 4);
  c.args.num_splits = 3;
  const OutputSpec split = output_spec(c.args);
  EXPECT_EQ(split.num_splits, 3);
  EXPECT_EQ(split.out_accum.rank, 4);
  EXPECT_EQ(split.out_accum.shape[0], 3);
}

// --- combine -----------------------------------------------------------------------------------

struct CombineCall {
  Call owner;
  TensorView out_partial = owner.tensor(DType::f32, {3, 2, 5, 4, 16});
  TensorView lse_partial = owner.tensor(DType::f32, {3, 2, 5, 4});
  TensorView out = owner.tensor(DType::bf16, {2, 5, 4, 16});
  OptTensor lse = owner.tensor(DType::f32, {2, 5, 4});
  void run() { combine(out_partial, lse_partial, out, lse); }
};

TEST(Combine, ValidCallRuns) {
  CombineCall c;
  EXPECT_NO_THROW(c.run());
}

struct CombineBreakage {
  const char* name;
  std::function<void(CombineCall&)> edit;
  ErrorKind kind;
  const char* message;
};
std::ostream& operator<<(std::ostream& os, const CombineBreakage& b) { return os << b.name; }

const std::vector<CombineBreakage> kCombineBreakages = {
    {"partial_dtype", [](CombineCall& c) { c.out_partial.dtype = DType::f16; }, kType,
     "out_partial must have dtype float32"},
    {"lse_partial_dtype", [](CombineCall& c) { c.lse_partial.dtype = DType::bf16; }, kType,
     "lse_partial must have dtype float32"},
    {"partial_rank", [](CombineCall& c) { c.out_partial.rank = 3; }, kValue,
     "out_partial must have rank 5 (num_splits, b, s, h, d) or 4"},
    {"partial_stride", [](CombineCall& c) { c.out_partial.strides[4] = 2; }, kValue,
     "out_partial must have contiguous last dimension"},
    {"lse_partial_shape", [](CombineCall& c) { c.lse_partial.shape[3] = 2; }, kValue,
     "lse_partial must have out_partial's shape without the head dimension"},
    {"too_many_splits",
     [](CombineCall& c) { c.out_partial.shape[0] = c.lse_partial.shape[0] = 257; }, kValue,
     "FlashAttention combine only supports num_splits at most 256"},
    {"no_splits", [](CombineCall& c) { c.out_partial.shape[0] = c.lse_partial.shape[0] = 0; },
     kValue, "out_partial must hold at least one split"},
    {"out_dtype", [](CombineCall& c) { c.out.dtype = DType::e4m3; }, kType,
     "Output type must be FP32, FP16 or BF16"},
    {"out_shape", [](CombineCall& c) { c.out.shape[2] = 3; }, kValue,
     "out must have out_partial's shape without the split dimension"},
    {"out_stride", [](CombineCall& c) { c.out.strides[3] = 2; }, kValue,
     "Output tensor must have contiguous last dimension"},
    {"lse_dtype", [](CombineCall& c) { c.lse->dtype = DType::f16; }, kType,
     "lse must have dtype float32"},
    {"lse_shape", [](CombineCall& c) { c.lse->shape[0] = 1; }, kValue,
     "lse must have lse_partial's shape without the split dimension"},
    {"device", [](CombineCall& c) { c.out.device = kCuda; }, kType,
     "out must be on the same device as out_partial (expected cpu, got cuda:0)"},
};

class CombineCheck : public ::testing::TestWithParam<CombineBreakage> {};

TEST_P(CombineCheck, IsRejected) {
  CombineCall c;
  GetParam().edit(c);
  EXPECT_TRUE(fails_with([&] { c.run(); }, GetParam().kind, GetParam().message));
}

INSTANTIATE_TEST_SUITE_P(Combine, CombineCheck, ::testing::ValuesIn(kCombineBreakages),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace kvflash::testing
