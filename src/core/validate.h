// Validation of a flash_attn_with_kvcache call (contract sections 4 and 7), split in two:
// validate() checks everything the tensors' metadata tells (dtypes, devices, shapes, strides,
// flags); check_values() checks the index and length tensors' contents, given host copies.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/problem.h"
#include "kvflash/args.h"
#include "kvflash/errors.h"

namespace kvflash::core {

// The sizes a call's tensors define (contract section 4). Read before the shape checks, so
// only the ranks are trusted; validate() checks everything against these.
struct CallShape {
  Device device{};
  DType dtype = DType::bf16;          // of q (qv's when q is absent)
  DType cache_dtype = DType::bf16;    // of v_cache (and k_cache): e4m3 under a 16-bit q too
  const TensorView* query = nullptr;  // q, or qv when only_qv drops q
  bool varlen_q = false;
  int64_t batch = 0;
  int64_t seqlen_q = 0;
  int64_t total_q = 0;
  int64_t num_heads = 0;
  int64_t num_heads_k = 0;
  int64_t headdim = 0;  // q's, else k_cache's, else 0
  int64_t headdim_v = 0;
  bool paged = false;
  int64_t page_size = 1;
  int64_t max_pages_per_seq = 0;
  int64_t num_cache_rows = 0;  // v_cache.shape[0]
  int64_t seqlen_k = 0;        // capacity of one sequence
  int64_t batch_k = 0;         // cache sequences: page_table rows (paged) or cache rows
};

// Sequences per call. A bound, so that a call made of stride-0 views (no memory behind its sizes)
// is refused before the planner or the caller's framework allocates anything per sequence.
constexpr int64_t kMaxBatch = int64_t{1} << 20;
constexpr int kMaxHeaddim = 256;
constexpr int kMaxHeaddimV = 512;  // MLA's absorbed value dimension (q / k head dim <= 64)

// Building blocks shared by the call, output and combine checks. Each throws Error with
// `message` (upstream's wording where it exists) followed by what was expected and what was given.
// Messages and expected shapes are views: a check that passes allocates nothing (these run on
// every call).
[[noreturn]] void fail(ErrorKind kind, const std::string& argument, const std::string& message);
void require_well_formed(const TensorView& t, const char* name);  // rank, sizes, data pointer
// `reference` names the tensor whose device the call runs on ("the query" for a call).
void require_device(const TensorView& t, const char* name, Device expected,
                    const char* reference = "the query");
void require_dtype(const TensorView& t, const char* name, DType expected, std::string_view message);
void require_rank(const TensorView& t, const char* name, int expected, std::string_view layout);
bool has_shape(const TensorView& t, std::span<const int64_t> expected);
void require_shape(const TensorView& t, const char* name, std::span<const int64_t> expected,
                   std::string_view message);
inline void require_shape(const TensorView& t, const char* name, std::initializer_list<int64_t> expected,
                          std::string_view message) {
  require_shape(t, name, std::span<const int64_t>(expected.begin(), expected.size()), message);
}
void require_last_dim_contiguous(const TensorView& t, const char* name, std::string_view message);
void require_contiguous(const TensorView& t, const char* name);
std::string dims_string(std::span<const int64_t> dims);  // "(2, 3)"

// Every tensor argument of a call by name (absent ones included), for the checks that apply to
// all of them.
struct NamedTensor {
  const char* name;
  const OptTensor* tensor;
};
std::array<NamedTensor, 20> all_tensors(const KvCacheArgs& args);

// Requires q or qv, and v_cache, with the ranks validate() accepts.
CallShape call_shape(const KvCacheArgs& args);

// Host pointers to the contents of the int32 index tensors (nullptr: absent). On the CPU they
// point at the tensors; a device backend's checked mode points them at host copies.
struct HostIndices {
  const int32_t* cache_seqlens = nullptr;
  const int32_t* cache_batch_idx = nullptr;
  const int32_t* cache_leftpad = nullptr;
  const int32_t* cu_seqlens_q = nullptr;
  const int32_t* cu_seqlens_k_new = nullptr;
  const int32_t* rotary_seqlens = nullptr;
  const int32_t* page_table = nullptr;
  int64_t page_table_row_stride = 0;  // in elements
};

// The tensors of p.args themselves; only valid when they live on the host.
HostIndices host_indices(const Problem& p);
bool indices_on_host(const Problem& p);

// seq_info over explicit host copies (seq_info(p, b) uses host_indices(p)).
SeqInfo seq_info(const Problem& p, const HostIndices& host, int b);

// Every value rule of the contract: lengths, offsets, page ids, batch indices, rotary table
// lengths. Throws Error(invalid_value) naming the first bad entry, e.g.
// "page_table[3, 7] = 912 is out of range [0, 512)".
void check_values(const Problem& p, const HostIndices& host);

// Refuses a call in which a tensor it writes (out and the other outputs when given, k_cache and
// v_cache when k / v are appended) overlaps itself or shares memory with any other tensor.
void check_no_aliasing(const KvCacheArgs& args, const Outputs* outputs);

// Whether the caller asked for value checks of device-resident indices (args.checked or
// KVFLASH_CHECK=1 in the environment).
bool checked_mode(const KvCacheArgs& args);

}  // namespace kvflash::core
