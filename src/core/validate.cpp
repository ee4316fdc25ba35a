// validate(): every metadata rule of flash_attn_with_kvcache (contract sections 4 and 7), in the
// order FA3's mha_fwd checks them, so a call FA3 rejects fails here with the same message first.
// Nothing here reads tensor contents; check_values.cpp does that.
#include "core/validate.h"

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cmath>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "core/limits.h"
#include "kvflash/kvflash.h"

namespace kvflash::core {

namespace {

using std::to_string;

bool is_16bit(DType d) { return d == DType::f16 || d == DType::bf16; }

std::string stride_detail(const TensorView& t, const char* name) {
  return std::string(name) + ".stride(-1) is " + to_string(t.stride(-1)) + ", expected 1";
}

}  // namespace

// --- building blocks ----------------------------------------------------------------------

void fail(ErrorKind kind, const std::string& argument, const std::string& message) {
  throw Error(kind, argument, message);
}

std::string dims_string(std::span<const int64_t> dims) {
  std::string s = "(";
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + to_string(dims[i]);
  return s + (dims.size() == 1 ? ",)" : ")");
}

void require_well_formed(const TensorView& t, const char* name) {
  if (t.rank < 0 || t.rank > kMaxRank) {
    fail(ErrorKind::invalid_value, name,
         std::string(name) + " must have rank 0 to " + to_string(kMaxRank) + " (got rank " +
             to_string(t.rank) + ")");
  }
  for (int i = 0; i < t.rank; ++i) {
    if (t.shape[i] < 0 || t.shape[i] > INT_MAX) {
      fail(ErrorKind::invalid_value, name,
           std::string(name) + " has a size out of range [0, 2^31) in dimension " + to_string(i) +
               " (shape " + t.shape_string() + ")");
    }
  }
  // Stride-0 views can have sizes with no memory behind them: their product must still fit.
  __int128 elements = 1;
  for (int i = 0; i < t.rank; ++i) elements = std::min<__int128>(elements * t.shape[i], __int128{1} << 100);
  if (elements > INT64_MAX) {
    fail(ErrorKind::invalid_value, name,
         std::string(name) + " has more than 2^63 elements (shape " + t.shape_string() + ")");
  }
  // Backends form byte offsets as stride * element size (and sum them over the dimensions):
  // every product and the sum must fit in 63 bits, whatever the sizes.
  const __int128 bytes = static_cast<__int128>(dtype_size(t.dtype));
  __int128 reach = bytes;
  for (int i = 0; i < t.rank; ++i) {
    const __int128 stride = t.strides[i] < 0 ? -__int128{t.strides[i]} : __int128{t.strides[i]};
    reach += stride * bytes * std::max<int64_t>(t.shape[i], 1);
  }
  if (reach > (__int128{1} << 62)) {
    std::vector<int64_t> strides(t.strides, t.strides + t.rank);
    fail(ErrorKind::invalid_value, name,
         std::string(name) + " has strides out of range (shape " + t.shape_string() +
             ", strides " + dims_string(strides) + "): byte offsets must stay below 2^62");
  }
  if (t.data == nullptr && t.numel() > 0) {
    fail(ErrorKind::invalid_value, name,
         std::string(name) + " has no data pointer but " + to_string(t.numel()) + " elements");
  }
}

void require_device(const TensorView& t, const char* name, Device expected, const char* reference) {
  if (t.device != expected) {
    fail(ErrorKind::invalid_type, name,
         std::string(name) + " must be on the same device as " + reference + " (expected " +
             device_name(expected) + ", got " + device_name(t.device) + ")");
  }
}

void require_dtype(const TensorView& t, const char* name, DType expected, std::string_view message) {
  if (t.dtype != expected) {
    fail(ErrorKind::invalid_type, name,
         std::string(message) + " (expected " + dtype_name(expected) + ", got " + dtype_name(t.dtype) + ")");
  }
}

void require_rank(const TensorView& t, const char* name, int expected, std::string_view layout) {
  if (t.rank != expected) {
    fail(ErrorKind::invalid_value, name,
         std::string(name) + " must have rank " + to_string(expected) + " " + std::string(layout) +
             " (got rank " + to_string(t.rank) + ", shape " + t.shape_string() + ")");
  }
}

bool has_shape(const TensorView& t, std::span<const int64_t> expected) {
  return std::ranges::equal(std::span<const int64_t>(t.shape, size_t(t.rank)), expected);
}

void require_shape(const TensorView& t, const char* name, std::span<const int64_t> expected,
                   std::string_view message) {
  if (!has_shape(t, expected)) {
    fail(ErrorKind::invalid_value, name,
         std::string(message) + " (expected " + dims_string(expected) + ", got " + t.shape_string() + ")");
  }
}

void require_last_dim_contiguous(const TensorView& t, const char* name, std::string_view message) {
  // With one element per row the stride of the last dimension is never used.
  if (t.rank >= 1 && t.stride(-1) != 1 && t.size(-1) > 1) {
    fail(ErrorKind::invalid_value, name, std::string(message) + " (" + stride_detail(t, name) + ")");
  }
}

void require_contiguous(const TensorView& t, const char* name) {
  if (!t.is_contiguous()) {
    std::vector<int64_t> strides(t.strides, t.strides + t.rank);
    fail(ErrorKind::invalid_value, name,
         std::string(name) + " must be contiguous (shape " + t.shape_string() + ", strides " +
             dims_string(strides) + ")");
  }
}

// --- the call's sizes -------------------------------------------------------------------------

CallShape call_shape(const KvCacheArgs& args) {
  CallShape s;
  const TensorView& v_cache = *args.v_cache;
  s.query = args.q ? &*args.q : &*args.qv;
  const TensorView& query = *s.query;
  s.device = query.device;
  s.dtype = query.dtype;  // qv's without q: the caches' too, except under a 16-bit qv over fp8
  s.cache_dtype = v_cache.dtype;
  s.varlen_q = args.cu_seqlens_q.has_value();
  if (s.varlen_q) {
    s.batch = args.cu_seqlens_q->size(0) - 1;
    s.seqlen_q = args.max_seqlen_q.value_or(0);
    s.total_q = query.size(0);
  } else {
    s.batch = query.size(0);
    s.seqlen_q = query.size(1);
    s.total_q = s.batch * s.seqlen_q;
  }
  s.num_heads = query.size(-2);
  s.num_heads_k = v_cache.size(-2);
  s.headdim = args.q ? args.q->size(-1) : args.k_cache ? args.k_cache->size(-1) : 0;
  s.headdim_v = v_cache.size(-1);
  s.paged = args.page_table.has_value();
  s.num_cache_rows = v_cache.size(0);
  if (s.paged) {
    s.page_size = v_cache.size(1);
    s.max_pages_per_seq = args.page_table->size(1);
    s.seqlen_k = s.max_pages_per_seq * s.page_size;
    s.batch_k = args.page_table->size(0);
  } else {
    s.seqlen_k = v_cache.size(1);
    s.batch_k = s.num_cache_rows;
  }
  return s;
}

std::array<NamedTensor, 20> all_tensors(const KvCacheArgs& a) {
  return {{{"q", &a.q},
          {"k_cache", &a.k_cache},
          {"v_cache", &a.v_cache},
          {"k", &a.k},
          {"v", &a.v},
          {"qv", &a.qv},
          {"rotary_cos", &a.rotary_cos},
          {"rotary_sin", &a.rotary_sin},
          {"cache_seqlens", &a.cache_seqlens},
          {"cache_batch_idx", &a.cache_batch_idx},
          {"cache_leftpad", &a.cache_leftpad},
          {"page_table", &a.page_table},
          {"cu_seqlens_q", &a.cu_seqlens_q},
          {"cu_seqlens_k_new", &a.cu_seqlens_k_new},
          {"rotary_seqlens", &a.rotary_seqlens},
          {"q_descale", &a.q_descale},
          {"k_descale", &a.k_descale},
          {"v_descale", &a.v_descale},
          {"scheduler_metadata", &a.scheduler_metadata},
          {"sinks", &a.sinks}}};
}

namespace {

// q, k_cache and v_cache presence, including kvflash's only_qv form (MATE's wording).
void check_presence(const KvCacheArgs& a) {
  if (a.only_qv && !a.qv) fail(ErrorKind::invalid_value, "qv", "only_qv=True requires qv");
  if (!a.q) {
    if (!a.qv) {
      fail(ErrorKind::invalid_value, "q",
           "q must be provided unless qv is provided with only_qv=True");
    }
    if (!a.only_qv) {
      fail(ErrorKind::invalid_value, "q",
           "q can only be None when only_qv=True (q is None, only_qv is False)");
    }
  }
  if (!a.k_cache) {
    if (!a.only_qv) {
      fail(ErrorKind::invalid_value, "k_cache",
           "k_cache can only be None when only_qv=True (k_cache is None, only_qv is False)");
    }
    if (a.k) {
      fail(ErrorKind::invalid_value, "k",
           "new keys k need a k_cache to be appended to (k is given, k_cache is None)");
    }
  }
  if (!a.v_cache) fail(ErrorKind::invalid_value, "v_cache", "v_cache must be provided");
}

// FA3 takes q, k_cache and v_cache of one dtype. kvflash also takes the form serving engines use
// for fp8 KV caches: a 16-bit query (qv, new k / v in its dtype) over a cache whose k_cache and
// v_cache are both float8_e4m3fn (contract 5.8). Every other mix is refused with FA3's wording.
void check_cache_dtypes(const KvCacheArgs& a, const char* query_name, DType dtype) {
  const bool fp8_cache =
      (a.k_cache && a.k_cache->dtype == DType::e4m3) || a.v_cache->dtype == DType::e4m3;
  if (!fp8_cache || !is_16bit(dtype)) {
    if (a.k_cache) {
      require_dtype(*a.k_cache, "k_cache", dtype, "query and key must have the same dtype");
    }
    require_dtype(*a.v_cache, "v_cache", dtype, "query and value must have the same dtype");
    return;
  }
  const std::string mixed = std::string("a ") + dtype_name(dtype) + " " + query_name +
                            " over an fp8 KV cache needs k_cache and v_cache both float8_e4m3fn";
  if (a.k_cache) require_dtype(*a.k_cache, "k_cache", DType::e4m3, mixed);
  require_dtype(*a.v_cache, "v_cache", DType::e4m3, mixed);
}

// Steps 2-3: dtypes of q / k_cache / v_cache, one device, contiguous last dimensions, ranks.
void check_inputs(const KvCacheArgs& a) {
  const bool has_q = a.q.has_value();
  const TensorView& query = has_q ? *a.q : *a.qv;
  const char* query_name = has_q ? "q" : "qv";
  for (const NamedTensor& n : all_tensors(a)) {
    if (*n.tensor) require_well_formed(**n.tensor, n.name);
  }
  const DType dtype = query.dtype;
  if (dtype != DType::f16 && dtype != DType::bf16 && dtype != DType::e4m3 && dtype != DType::f32) {
    fail(ErrorKind::invalid_type, query_name,
         std::string("FlashAttention only supports fp16, bf16, and fp8_e4m3 data type; kvflash's "
                     "CPU backend also takes float32 (") +
             query_name + " is " + dtype_name(dtype) + ")");
  }
  check_cache_dtypes(a, query_name, dtype);

  const Device device = query.device;
  if (device.type != DeviceType::cpu && device.type != DeviceType::cuda) {
    fail(ErrorKind::invalid_type, query_name,
         std::string(query_name) + " must be on a CPU or CUDA device (got " + device_name(device) +
             ")");
  }
  for (const NamedTensor& n : all_tensors(a)) {
    if (*n.tensor) require_device(**n.tensor, n.name, device);
  }
  if (dtype == DType::f32 && device.type != DeviceType::cpu) {
    fail(ErrorKind::unsupported, query_name,
         std::string("float32 inputs are supported by the CPU backend only (") + query_name +
             " is float32 on " + device_name(device) + ")");
  }

  const bool varlen = a.cu_seqlens_q.has_value();
  const char* q_layout = varlen ? "(total_q, h, d) when cu_seqlens_q is given" : "(b, s_q, h, d)";
  require_rank(query, query_name, varlen ? 3 : 4, q_layout);
  const char* cache_layout = a.page_table ? "(num_pages, page_size, h_k, d)" : "(b_k, s_k, h_k, d)";
  if (a.k_cache) require_rank(*a.k_cache, "k_cache", 4, cache_layout);
  require_rank(*a.v_cache, "v_cache", 4, cache_layout);
  if (has_q) {
    require_last_dim_contiguous(*a.q, "q", "q must have contiguous last dimension");
  }
  if (a.k_cache) {
    require_last_dim_contiguous(*a.k_cache, "k_cache",
                                "k_cache must have contiguous last dimension");
  }
  require_last_dim_contiguous(*a.v_cache, "v_cache", "v_cache must have contiguous last dimension");
}

// A 1-D int32 index tensor of `length` entries, `what` naming the length ("batch_size" or
// "batch_size + 1") in the messages (FA3: dtype, contiguity, CHECK_SHAPE). The texts are made only
// when a check fails.
void check_index_tensor(const OptTensor& t, const char* name, int64_t length, const char* what) {
  if (!t) return;
  const auto text = [&] { return std::string("(") + what + ",) = (" + to_string(length) + ",)"; };
  if (t->dtype != DType::i32) require_dtype(*t, name, DType::i32, std::string(name) + " must have dtype int32");
  if (t->rank != 1) require_rank(*t, name, 1, text());
  require_contiguous(*t, name);
  if (t->shape[0] != length) require_shape(*t, name, {length}, std::string(name) + " must have shape " + text());
}

// Steps 4-5: page_table and cu_seqlens_q before the sizes are derived from them.
void check_layout_tensors(const KvCacheArgs& a) {
  if (a.page_table) {
    require_dtype(*a.page_table, "page_table", DType::i32,
                  "page_table must have dtype torch.int32");
    require_rank(*a.page_table, "page_table", 2, "(b_k, max_num_pages_per_seq)");
    require_last_dim_contiguous(*a.page_table, "page_table",
                                "page_table must have contiguous last dimension");
  }
  if (a.cu_seqlens_q) {
    const TensorView& cu = *a.cu_seqlens_q;
    require_dtype(cu, "cu_seqlens_q", DType::i32, "cu_seqlens_q must have dtype torch.int32");
    require_rank(cu, "cu_seqlens_q", 1, "(b + 1,)");
    require_contiguous(cu, "cu_seqlens_q");
    if (cu.size(0) < 1) {
      fail(ErrorKind::invalid_value, "cu_seqlens_q",
           "cu_seqlens_q must have at least one entry (got shape " + cu.shape_string() + ")");
    }
    if (!a.max_seqlen_q) {
      fail(ErrorKind::invalid_value, "max_seqlen_q",
           "max_seqlen_q must be provided if cu_seqlens_q is provided");
    }
    if (*a.max_seqlen_q < 0) {
      fail(ErrorKind::invalid_value, "max_seqlen_q",
           "max_seqlen_q must be >= 0 (got " + to_string(*a.max_seqlen_q) + ")");
    }
  }
}

// The sizes the later stages keep in 32 bits, and kvflash's batch limit, before anything is
// derived from them.
void check_sizes(const KvCacheArgs& a, const CallShape& s) {
  const char* batch_name = a.cu_seqlens_q ? "cu_seqlens_q" : a.q ? "q" : "qv";
  if (s.batch > kMaxBatch) {
    fail(ErrorKind::invalid_value, batch_name,
         "batch_size " + to_string(s.batch) + " exceeds kvflash's limit of " +
             to_string(kMaxBatch) + " sequences per call");
  }
  if (s.total_q > INT_MAX) {
    fail(ErrorKind::invalid_value, batch_name,
         "batch_size * seqlen_q = " + to_string(s.batch) + " * " + to_string(s.seqlen_q) +
             " query rows exceed 2^31 - 1");
  }
  if (s.seqlen_k > INT_MAX) {
    fail(ErrorKind::invalid_value, "page_table",
         "the cache capacity max_num_pages_per_seq * page_size = " +
             to_string(s.max_pages_per_seq) + " * " + to_string(s.page_size) +
             " exceeds 2^31 - 1 keys");
  }
  if (a.k && !a.cu_seqlens_k_new && a.k->rank == 4 && s.batch * a.k->size(1) > INT_MAX) {
    fail(ErrorKind::invalid_value, "k",
         "batch_size * seqlen_new = " + to_string(s.batch) + " * " + to_string(a.k->size(1)) +
             " new rows exceed 2^31 - 1");
  }
}

// Steps 7-8: batch sizes and head dimensions.
void check_heads(const KvCacheArgs& a, const CallShape& s) {
  if (!a.cache_batch_idx && s.batch != s.batch_k) {
    fail(ErrorKind::invalid_value, a.page_table ? "page_table" : "k_cache",
         "batch_size must be equal to batch_size_k (batch_size is " + to_string(s.batch) +
             ", batch_size_k is " + to_string(s.batch_k) +
             "; pass cache_batch_idx to map batch elements to cache rows)");
  }
  const char* q_name = a.q ? "q" : "k_cache";
  if (s.headdim > kMaxHeadDim) {
    fail(ErrorKind::invalid_value, q_name,
         "FlashAttention forward only supports head dimension at most 256 (headdim is " +
             to_string(s.headdim) + ")");
  }
  if (s.headdim_v <= 0 || (a.q && s.headdim <= 0)) {
    fail(ErrorKind::invalid_value, s.headdim_v <= 0 ? "v_cache" : "q",
         "head dimensions must be positive (headdim is " + to_string(s.headdim) +
             ", headdim_v is " + to_string(s.headdim_v) + ")");
  }
  if (s.num_heads_k <= 0 || s.num_heads % s.num_heads_k != 0) {
    fail(ErrorKind::invalid_value, "v_cache",
         "Number of heads in key/value must divide number of heads in query (num_heads is " +
             to_string(s.num_heads) + ", num_heads_k is " + to_string(s.num_heads_k) + ")");
  }
  const int64_t d = s.headdim;
  const int64_t dv = s.headdim_v;
  if (dv != d && (a.q || a.k_cache)) {
    const bool mla_like = d <= 64 && dv <= 512;
    const bool narrow_v = d > 128 && d <= 192 && dv > 96 && dv <= 128;
    if (!mla_like && !narrow_v) {
      fail(ErrorKind::invalid_value, "v_cache",
           "If V headdim is different from Q/K dim, we only support Q/K headdim in (128, 192] "
           "and V headdim in (96, 128], or (Q/K <= 64 and V <= 512). (headdim is " +
               to_string(d) + ", headdim_v is " + to_string(dv) + ")");
    }
  }
  // FA3's all-fp8 call; kvflash's 16-bit query over an fp8 cache takes MLA's latent width too
  // (contract 5.8).
  if (dv > kMaxHeadDim && s.dtype == DType::e4m3) {
    fail(ErrorKind::invalid_type, "q",
         "HeaddimV > 256 requires fp16 and bf16 data type (headdim_v is " + to_string(dv) +
             ", q is float8_e4m3fn)");
  }
}

// Step 9's inputs: the scalar flags.
void check_scalars(const KvCacheArgs& a) {
  if (a.window_left < -1 || a.window_right < -1) {
    const bool left = a.window_left < -1;
    fail(ErrorKind::invalid_value, "window_size",
         std::string("window_size[") + (left ? "0" : "1") + "] must be >= -1 (-1 means " +
             "unbounded; got " + to_string(left ? a.window_left : a.window_right) + ")");
  }
  if (a.attention_chunk < 0) {
    fail(ErrorKind::invalid_value, "attention_chunk",
         "attention_chunk must be >= 0 (0 means off; got " + to_string(a.attention_chunk) + ")");
  }
  if (!(a.softcap >= 0.0f)) {
    fail(ErrorKind::invalid_value, "softcap",
         "softcap must be >= 0 (0 means off; got " + std::to_string(a.softcap) + ")");
  }
  if (a.softmax_scale && !std::isfinite(*a.softmax_scale)) {
    fail(ErrorKind::invalid_value, "softmax_scale",
         "softmax_scale must be finite (got " + std::to_string(*a.softmax_scale) + ")");
  }
  if (a.num_splits > kMaxSplits) {
    fail(ErrorKind::invalid_value, "num_splits",
         "num_splits > 256 not supported (got " + to_string(a.num_splits) + ")");
  }
  if (a.sm_margin < 0) {
    fail(ErrorKind::invalid_value, "sm_margin",
         "sm_margin must be >= 0 (got " + to_string(a.sm_margin) + ")");
  }
}

// Steps 10-13: shapes against the derived sizes, lengths, alignment.
void check_shapes(const KvCacheArgs& a, const CallShape& s) {
  if (a.k_cache) {
    require_shape(*a.k_cache, "k_cache", {s.num_cache_rows, a.v_cache->size(1), s.num_heads_k, s.headdim},
                  s.paged ? "k_cache must have shape (num_pages, page_size, num_heads_k, headdim)"
                          : "k_cache must have shape (batch_size_k, seqlen_k, num_heads_k, headdim)");
  }
  if (a.page_table && s.num_cache_rows == 0 && s.batch > 0) {
    fail(ErrorKind::invalid_value, "k_cache",
         "a paged cache needs at least one page (k_cache.shape[0] is 0)");
  }
  check_index_tensor(a.cache_seqlens, "cache_seqlens", s.batch, "batch_size");
  check_index_tensor(a.cache_leftpad, "cache_leftpad", s.batch, "batch_size");
  if (a.cache_seqlens && a.cache_seqlens_value) {
    fail(ErrorKind::invalid_value, "cache_seqlens",
         "cache_seqlens must be either a tensor or an int, not both (got tensor " +
             a.cache_seqlens->shape_string() + " and int " + to_string(*a.cache_seqlens_value) +
             ")");
  }
  if (a.cache_seqlens_value &&
      (*a.cache_seqlens_value < 0 || *a.cache_seqlens_value > s.seqlen_k)) {
    fail(ErrorKind::invalid_value, "cache_seqlens",
         "cache_seqlens = " + to_string(*a.cache_seqlens_value) + " is out of range [0, " +
             to_string(s.seqlen_k) + "] (the cache capacity)");
  }
  // 16-byte rows: 16 elements of an fp8 cache (a 16-bit query over it included), 8 otherwise.
  const int64_t multiple = s.cache_dtype == DType::e4m3 ? 16 : 8;
  if (s.headdim % multiple != 0) {
    fail(ErrorKind::invalid_value, a.q ? "q" : "k_cache",
         "head_size should be a multiple of " + to_string(multiple) + " (got " +
             to_string(s.headdim) + ")");
  }
  if (s.headdim_v % multiple != 0) {
    fail(ErrorKind::invalid_value, "v_cache",
         "head_size_v should be a multiple of " + to_string(multiple) + " (got " +
             to_string(s.headdim_v) + ")");
  }
}

// Step 15: new keys and values appended to the cache.
void check_new_kv(const KvCacheArgs& a, const CallShape& s) {
  if (a.k && !a.v) {
    fail(ErrorKind::invalid_value, "v",
         "If k_new is supplied, v_new must also be passed in (k is given, v is None)");
  }
  if (a.v && !a.k) {
    fail(ErrorKind::invalid_value, "k",
         "If v_new is supplied, k_new must also be passed in (v is given, k is None)");
  }
  check_index_tensor(a.cu_seqlens_k_new, "cu_seqlens_k_new", s.batch + 1, "batch_size + 1");
  if (!a.k) return;
  if (!a.cache_seqlens && !a.cache_seqlens_value) {
    fail(ErrorKind::invalid_value, "cache_seqlens",
         "If k_new is supplied, seqlens_k must also be passed in (k is given, cache_seqlens "
         "is None)");
  }
  const bool packed = a.cu_seqlens_k_new.has_value();
  const std::string layout =
      packed ? "(total_k_new, h_k, d) when cu_seqlens_k_new is given" : "(b, s_new, h_k, d)";
  // Upstream calls them k_new / v_new.
  for (const auto& [t, name, upstream] :
       {std::tuple{&*a.k, "k", "k_new"}, std::tuple{&*a.v, "v", "v_new"}}) {
    require_dtype(*t, name, s.dtype, std::string(upstream) + " must have the same dtype as query");
    require_rank(*t, name, packed ? 3 : 4, layout);
    require_last_dim_contiguous(*t, name,
                                std::string(name) + " must have contiguous last dimension");
  }
  const int64_t rows = a.k->size(0);
  std::vector<int64_t> k_shape = {rows, s.num_heads_k, s.headdim};
  if (!packed) k_shape = {s.batch, a.k->size(1), s.num_heads_k, s.headdim};
  std::vector<int64_t> v_shape = k_shape;
  v_shape.back() = s.headdim_v;
  const std::string shape_text =
      packed ? "(total_k_new, num_heads_k, " : "(batch_size, seqlen_new, num_heads_k, ";
  require_shape(*a.k, "k", k_shape, "k must have shape " + shape_text + "headdim)");
  require_shape(*a.v, "v", v_shape, "v must have shape " + shape_text + "headdim_v)");
  if (!packed && a.k->size(1) > s.seqlen_k) {
    fail(ErrorKind::invalid_value, "k",
         "If k_new is supplied, it must have seqlen <= the seqlen of the KV cache (k has " +
             to_string(a.k->size(1)) + " new tokens per sequence, the cache holds " +
             to_string(s.seqlen_k) + ")");
  }
}

void check_scheduler_metadata(const KvCacheArgs& a) {
  if (!a.scheduler_metadata) return;
  if (a.plan) {
    fail(ErrorKind::invalid_value, "scheduler_metadata",
         "give either a Plan or scheduler_metadata, not both (both are given)");
  }
  const TensorView& m = *a.scheduler_metadata;
  require_dtype(m, "scheduler_metadata", DType::i32, "scheduler_metadata must have dtype int32");
  require_rank(m, "scheduler_metadata", 1, "(metadata_size,)");
  require_contiguous(m, "scheduler_metadata");
}

// Step 17, first part: the absorbed query qv (MLA).
void check_qv(const KvCacheArgs& a, const CallShape& s) {
  if (!a.qv) return;
  const TensorView& qv = *a.qv;
  if ((a.q || a.k_cache) && s.headdim > 64) {
    fail(ErrorKind::invalid_value, "qv",
         "q_v is only supported for head_size <= 64 (headdim is " + to_string(s.headdim) + ")");
  }
  if (s.headdim_v < 256) {
    fail(ErrorKind::invalid_value, "qv",
         "q_v is only supported for hdim_v >= 256. (headdim_v is " + to_string(s.headdim_v) + ")");
  }
  if (!is_16bit(qv.dtype) && qv.dtype != DType::f32) {
    fail(ErrorKind::invalid_type, "qv",
         std::string("q_v is only supported for fp16 and bf16 data type (and float32 on the "
                     "CPU; got ") +
             dtype_name(qv.dtype) + ")");
  }
  if (a.q) require_dtype(qv, "qv", a.q->dtype, "q_v must have the same dtype as query");
  require_last_dim_contiguous(qv, "qv", "q_v tensor must have contiguous last dimension");
  std::vector<int64_t> shape = {s.total_q, s.num_heads, s.headdim_v};
  if (!s.varlen_q) shape = {s.batch, s.seqlen_q, s.num_heads, s.headdim_v};
  require_shape(qv, "qv", shape,
                s.varlen_q ? "q_v must have shape (total_q, num_heads, headdim_v)"
                           : "q_v must have shape (batch_size, seqlen_q, num_heads, headdim_v)");
}

// Step 17, second part: rotary tables.
void check_rotary(const KvCacheArgs& a, const CallShape& s) {
  check_index_tensor(a.rotary_seqlens, "rotary_seqlens", s.batch, "batch_size");
  if (!a.rotary_cos && !a.rotary_sin) return;
  if (!a.rotary_sin) {
    fail(ErrorKind::invalid_value, "rotary_sin",
         "If rotary cos is provided, rotary sin must also be provided");
  }
  if (!a.rotary_cos) {
    fail(ErrorKind::invalid_value, "rotary_cos",
         "If rotary sin is provided, rotary cos must also be provided");
  }
  if (!a.k) {
    fail(ErrorKind::invalid_value, "rotary_cos",
         "If rotary cos/sin are provided, new key / value to be appended to KV cache must also "
         "be provided (k and v are None)");
  }
  const TensorView& cos = *a.rotary_cos;
  require_rank(cos, "rotary_cos", 2, "(seqlen_ro, rotary_dim / 2)");
  const int64_t rotary_dim = 2 * cos.size(1);
  if (rotary_dim > s.headdim) {
    fail(ErrorKind::invalid_value, "rotary_cos",
         "rotary_dim must be <= headdim (rotary_dim = 2 * rotary_cos.shape[1] is " +
             to_string(rotary_dim) + ", headdim is " + to_string(s.headdim) + ")");
  }
  if (rotary_dim % 16 != 0) {
    fail(ErrorKind::invalid_value, "rotary_cos",
         "Only rotary dimensions divisible by 16 are currently supported (rotary_dim is " +
             to_string(rotary_dim) + ")");
  }
  for (const auto& [t, name] :
       {std::pair{&cos, "rotary_cos"}, std::pair{&*a.rotary_sin, "rotary_sin"}}) {
    require_shape(*t, name, {cos.size(0), cos.size(1)},
                  std::string(name) + " must have shape (seqlen_ro, rotary_dim / 2)");
    require_contiguous(*t, name);
    require_dtype(*t, name, s.dtype, std::string(name) + " must have the same dtype as query");
  }
  if (s.paged && cos.size(0) < s.seqlen_k) {
    fail(ErrorKind::invalid_value, "rotary_cos",
         "cos/sin seqlen must be at least the seqlen of KV cache (rotary_cos has " +
             to_string(cos.size(0)) + " rows, the paged cache holds " + to_string(s.seqlen_k) +
             " tokens per sequence)");
  }
}

// The descales of the fp8 tensors: q_descale with an fp8 query, k_descale / v_descale with an fp8
// cache. Without fp8 they are ignored (spec 12.8); a q_descale with a 16-bit query over an fp8
// cache is refused, since that query has no scale to undo and the caller likely meant another call.
void check_descales(const KvCacheArgs& a, const CallShape& s) {
  if (s.cache_dtype != DType::e4m3) return;
  if (a.q_descale && s.dtype != DType::e4m3) {
    fail(ErrorKind::invalid_value, "q_descale",
         std::string("q_descale is only for a float8_e4m3fn query (q is ") + dtype_name(s.dtype) +
             "; k_descale / v_descale dequantise the fp8 KV cache)");
  }
  for (const auto& [t, name] :
       {std::pair{&a.q_descale, "q_descale"}, std::pair{&a.k_descale, "k_descale"},
        std::pair{&a.v_descale, "v_descale"}}) {
    if (!*t) continue;
    require_dtype(**t, name, DType::f32, std::string(name) + " must have dtype float32");
    require_shape(**t, name, {s.batch, s.num_heads_k},
                  std::string(name) + " must have shape (batch_size, num_heads_k)");
  }
}

// Step 17, last part: cache_batch_idx, fp8 descales, sinks.
void check_extras(const KvCacheArgs& a, const CallShape& s) {
  check_index_tensor(a.cache_batch_idx, "cache_batch_idx", s.batch, "batch_size");
  check_descales(a, s);
  if (a.sinks) {
    const TensorView& sinks = *a.sinks;
    if (sinks.dtype != DType::f32 && sinks.dtype != DType::bf16) {
      fail(ErrorKind::invalid_type, "sinks",
           std::string("sinks must have dtype float32 or bfloat16 (got ") +
               dtype_name(sinks.dtype) + ")");
    }
    require_shape(sinks, "sinks", {s.num_heads}, "sinks must have shape (num_heads)");
    require_contiguous(sinks, "sinks");
  }
}

}  // namespace

}  // namespace kvflash::core

namespace kvflash {

void validate(const KvCacheArgs& args) {
  using namespace core;
  check_presence(args);
  check_inputs(args);
  check_layout_tensors(args);
  const CallShape shape = call_shape(args);
  check_sizes(args, shape);
  check_heads(args, shape);
  check_scalars(args);
  check_shapes(args, shape);
  check_new_kv(args, shape);
  check_scheduler_metadata(args);
  check_qv(args, shape);
  check_rotary(args, shape);
  check_extras(args, shape);
  check_no_aliasing(args, nullptr);
}

}  // namespace kvflash
