// TensorView and dtype helpers, resolve() / seq_info(), and the C ABI.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>

#include "core/problem.h"
#include "cpp/validation_call.h"
#include "kvflash/c_api.h"
#include "kvflash/kvflash.h"

namespace kvflash::testing {
namespace {

TEST(Tensor, DtypeNamesAndSizes) {
  EXPECT_STREQ(dtype_name(DType::bf16), "bfloat16");
  EXPECT_STREQ(dtype_name(DType::e4m3), "float8_e4m3fn");
  EXPECT_EQ(dtype_size(DType::f64), 8u);
  EXPECT_EQ(dtype_size(DType::i32), 4u);
  EXPECT_EQ(dtype_size(DType::f16), 2u);
  EXPECT_EQ(dtype_size(DType::e4m3), 1u);
  EXPECT_EQ(device_name(Device{}), "cpu");
  EXPECT_EQ(device_name(Device{DeviceType::cuda, 3}), "cuda:3");
}

TEST(Tensor, DlpackCodesRoundTrip) {
  for (DType d : {DType::f32, DType::f16, DType::bf16, DType::e4m3, DType::i32, DType::f64}) {
    uint8_t code = 0, bits = 0;
    dtype_to_dlpack(d, code, bits);
    EXPECT_EQ(dtype_from_dlpack(code, bits, 1), d) << dtype_name(d);
  }
  EXPECT_EQ(dtype_from_dlpack(0, 32, 1), DType::i32);
  EXPECT_EQ(dtype_from_dlpack(2, 16, 1), DType::f16);
  EXPECT_EQ(dtype_from_dlpack(4, 16, 1), DType::bf16);
  EXPECT_EQ(dtype_from_dlpack(10, 8, 1), DType::e4m3);
  EXPECT_FALSE(dtype_from_dlpack(2, 32, 4));  // vector lanes
  EXPECT_FALSE(dtype_from_dlpack(0, 64, 1));  // int64
  EXPECT_FALSE(dtype_from_dlpack(1, 32, 1));  // uint32
  EXPECT_FALSE(dtype_from_dlpack(4, 32, 1));
}

struct FakeDLTensor {
  void* data;
  struct { int32_t device_type, device_id; } device;
  int32_t ndim;
  struct { uint8_t code, bits; uint16_t lanes; } dtype;
  int64_t* shape;
  int64_t* strides;
  uint64_t byte_offset;
};

TEST(Tensor, FromDlpack) {
  float storage[24] = {};
  int64_t shape[3] = {2, 3, 4};
  FakeDLTensor t{storage, {2, 1}, 3, {4, 16, 1}, shape, nullptr, 8};
  const auto v = from_dlpack(t);
  ASSERT_TRUE(v);
  EXPECT_EQ(v->dtype, DType::bf16);
  EXPECT_EQ(v->device, (Device{DeviceType::cuda, 1}));
  EXPECT_EQ(v->data, reinterpret_cast<char*>(storage) + 8);
  EXPECT_EQ(v->stride(0), 12);
  EXPECT_TRUE(v->is_contiguous());
  t.dtype.lanes = 2;
  EXPECT_FALSE(from_dlpack(t));
}

TEST(Tensor, ShapesAndStrides) {
  const TensorView t = TensorView::contiguous(nullptr, DType::f32, {2, 3, 4});
  EXPECT_EQ(t.numel(), 24);
  EXPECT_EQ(t.stride(0), 12);
  EXPECT_EQ(t.stride(-1), 1);
  EXPECT_EQ(t.size(-2), 3);
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_EQ(t.shape_string(), "(2, 3, 4)");
  EXPECT_EQ(TensorView::contiguous(nullptr, DType::i32, {5}).shape_string(), "(5,)");
  EXPECT_EQ(TensorView::contiguous(nullptr, DType::i32, {}).numel(), 1);

  const TensorView gaps = TensorView::strided(nullptr, DType::f16, {2, 3}, {8, 1});
  EXPECT_FALSE(gaps.is_contiguous());
  // A size-1 dimension may carry any stride.
  EXPECT_TRUE(TensorView::strided(nullptr, DType::f16, {1, 3}, {99, 1}).is_contiguous());
  EXPECT_FALSE(TensorView::strided(nullptr, DType::f16, {3, 2}, {1, 3}).is_contiguous());
}

TEST(Tensor, BadViewsThrow) {
  try {
    TensorView::contiguous(nullptr, DType::f32, {1, 1, 1, 1, 1, 1, 1});
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::invalid_value);
    EXPECT_NE(std::string(e.what()).find("tensor rank must be at most 6 (got 7)"),
              std::string::npos);
  }
  try {
    TensorView::strided(nullptr, DType::f32, {2, 3}, {1});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("a strided tensor needs one stride per dimension"),
              std::string::npos);
  }
}

TEST(Tensor, SpecAndErrorKindNames) {
  TensorSpec spec;
  EXPECT_EQ(spec.numel(), 0);  // rank 0 means "not used"
  spec.rank = 2;
  spec.shape[0] = 3;
  spec.shape[1] = 5;
  EXPECT_EQ(spec.numel(), 15);
  EXPECT_STREQ(error_kind_name(ErrorKind::invalid_value), "invalid_value");
  EXPECT_STREQ(error_kind_name(ErrorKind::invalid_type), "invalid_type");
  EXPECT_STREQ(error_kind_name(ErrorKind::unsupported), "unsupported");
  EXPECT_STREQ(error_kind_name(ErrorKind::device_failure), "device_failure");
}

// --- resolve -----------------------------------------------------------------------------------

TEST(Resolve, SizesAndDefaults) {
  Call c({.seqlen_new = 2, .paged = true});
  const core::Problem p = core::resolve(c.args);
  EXPECT_EQ(p.batch, 2);
  EXPECT_EQ(p.group, 2);
  EXPECT_TRUE(p.paged);
  EXPECT_EQ(p.page_size, 4);
  EXPECT_EQ(p.max_pages_per_seq, 4);
  EXPECT_EQ(p.num_cache_rows, 8);
  EXPECT_EQ(p.seqlen_k, 16);
  EXPECT_EQ(p.seqlen_knew, 2);
  EXPECT_EQ(p.out_dtype, DType::f32);
  EXPECT_FLOAT_EQ(p.softmax_scale, 1.0f / 8.0f);
  EXPECT_EQ(p.key.batch, 2);
  EXPECT_EQ(p.key.page_size, 4);
  const core::SeqInfo s = core::seq_info(p, 1);
  EXPECT_EQ(s.cache_seqlen, 5);
  EXPECT_EQ(s.seqlen_k, 7);
  EXPECT_EQ(s.knew_offset, 2);
  EXPECT_EQ(s.rotary_start, 5);
  EXPECT_EQ(s.q_offset, 2);
}

TEST(Resolve, IntCacheSeqlensExpandsToTheBatch) {
  Call c({.batch = 3, .paged = true, .num_pages = 12});
  c.args.cache_seqlens.reset();
  c.args.cache_seqlens_value = 6;
  const core::Problem p = core::resolve(c.args);
  for (int b = 0; b < 3; ++b) EXPECT_EQ(core::seq_info(p, b).cache_seqlen, 6);
}

TEST(Resolve, SoftmaxScaleDefaults) {
  Call c({.headdim_v = 256, .qv = true});
  EXPECT_FLOAT_EQ(core::resolve(c.args).softmax_scale, 1.0f / std::sqrt(320.0f));
  c.args.only_qv = true;
  c.args.q.reset();
  c.args.k_cache.reset();
  EXPECT_FLOAT_EQ(core::resolve(c.args).softmax_scale, 1.0f / 16.0f);
  c.args.softmax_scale = 0.5f;
  EXPECT_FLOAT_EQ(core::resolve(c.args).softmax_scale, 0.5f);
}

TEST(Resolve, MaskFlags) {
  Call c({.seqlen_q = 4});
  c.args.causal = true;
  core::Problem p = core::resolve(c.args);
  EXPECT_EQ(p.window_right, 0);
  EXPECT_TRUE(p.is_causal);
  EXPECT_FALSE(p.is_local);
  EXPECT_TRUE(p.rotate_q_per_row);
  c.args.causal = false;
  c.args.window_left = 3;
  p = core::resolve(c.args);
  EXPECT_TRUE(p.is_local);
  EXPECT_TRUE(p.rotate_q_per_row);
  c.args.window_left = 15;  // covers the whole cache: no window
  p = core::resolve(c.args);
  EXPECT_FALSE(p.is_local);
  EXPECT_FALSE(p.rotate_q_per_row);
  Call one({.seqlen_q = 1});
  one.args.causal = true;  // one query row sees every key either way
  EXPECT_FALSE(core::resolve(one.args).is_causal);
}

TEST(Resolve, PackedNewKeysBoundIsTheLongestRun) {
  Call c({.seqlen_new = 3, .knew_packed = true});
  int32_t* cu = Call::i32(c.args.cu_seqlens_k_new);
  cu[1] = 1;  // lengths 1 and 5
  const core::Problem p = core::resolve(c.args);
  EXPECT_EQ(p.seqlen_knew, 5);
  EXPECT_EQ(core::seq_info(p, 1).knew_offset, 1);
  EXPECT_EQ(core::seq_info(p, 1).seqlen_knew, 5);
}

// --- the C ABI ---------------------------------------------------------------------------------

kvflash_tensor to_c(const TensorView& v) {
  kvflash_tensor t{};
  t.data = v.data;
  t.dtype = static_cast<int32_t>(v.dtype);
  t.device_type = static_cast<int32_t>(v.device.type);
  t.device_id = v.device.id;
  t.rank = v.rank;
  for (int i = 0; i < v.rank; ++i) {
    t.shape[i] = v.shape[i];
    t.strides[i] = v.strides[i];
  }
  return t;
}

struct CCall {
  Call call;
  kvflash_tensor q = to_c(*call.args.q), k_cache = to_c(*call.args.k_cache),
                 v_cache = to_c(*call.args.v_cache), cache_seqlens = to_c(*call.args.cache_seqlens),
                 out = to_c(call.outputs.out), lse = to_c(*call.outputs.softmax_lse);
  kvflash_args args = make_args();
  kvflash_outputs outputs{&out, &lse, nullptr, nullptr};
  char message[512] = "not written";

  kvflash_args make_args() {
    kvflash_args a;
    kvflash_args_init(&a);
    a.q = &q;
    a.k_cache = &k_cache;
    a.v_cache = &v_cache;
    a.cache_seqlens = &cache_seqlens;
    return a;
  }
  int run(size_t capacity = sizeof(message)) {
    return kvflash_flash_attn_with_kvcache(&args, &outputs, nullptr, message, capacity);
  }
};

TEST(CApi, Defaults) {
  kvflash_args a;
  kvflash_args_init(&a);
  EXPECT_EQ(a.q, nullptr);
  EXPECT_EQ(a.window_left, -1);
  EXPECT_EQ(a.window_right, -1);
  EXPECT_EQ(a.pack_gqa, -1);
  EXPECT_EQ(a.max_seqlen_q, -1);
  EXPECT_EQ(a.rotary_interleaved, 1);
  EXPECT_STREQ(kvflash_version(), "0.1.0");
}

TEST(CApi, ValidCallReturnsOk) {
  CCall c;
  EXPECT_EQ(c.run(), KVFLASH_OK) << c.message;
  EXPECT_STREQ(c.message, "");
}

TEST(CApi, RejectedCallReturnsKindAndText) {
  CCall c;
  c.k_cache.strides[3] = 2;
  EXPECT_EQ(c.run(), KVFLASH_INVALID_VALUE);
  EXPECT_STREQ(c.message,
               "k_cache must have contiguous last dimension (k_cache.stride(-1) is 2, expected 1)");
  c.k_cache.strides[3] = 1;
  c.cache_seqlens.dtype = KVFLASH_FLOAT32;
  EXPECT_EQ(c.run(8), KVFLASH_INVALID_TYPE);
  EXPECT_STREQ(c.message, "cache_s");  // truncated to the buffer
}

TEST(CApi, MalformedStructsAreErrors) {
  CCall c;
  c.q.dtype = 17;
  EXPECT_EQ(c.run(), KVFLASH_INVALID_TYPE);
  EXPECT_NE(std::string(c.message).find("unknown kvflash_dtype 17"), std::string::npos);
  c.q.dtype = KVFLASH_FLOAT32;
  c.v_cache.rank = 9;
  EXPECT_EQ(c.run(), KVFLASH_INVALID_VALUE);
  EXPECT_NE(std::string(c.message).find("kvflash_tensor rank must be in [0, 6]"),
            std::string::npos);
  c.outputs.out = nullptr;
  EXPECT_EQ(c.run(), KVFLASH_INVALID_VALUE);
  EXPECT_NE(std::string(c.message).find("args, outputs and outputs->out must not be NULL"),
            std::string::npos);
}

}  // namespace
}  // namespace kvflash::testing
