// Random flash_attn_with_kvcache calls for differential testing: a seed gives one owning Case
// (host buffers plus a KvCacheArgs pointing into them) drawn over every feature of the contract,
// and compare() checks a backend's outputs and cache against the oracle. Reused by the C++ test,
// the GPU runner and `kvflash check`.
#pragma once

#include <cstdint>
#include <list>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "kvflash/args.h"
#include "kvflash/plan.h"
#include "oracle.h"

namespace kvflash::oracle {

// Bounds on one case. Work = sum over the batch of h * S_q * S_k * (d [+ d_v with qv] + d_v), the
// multiply-adds of the oracle's loops; most cases are drawn small, a few medium and large.
struct CaseLimits {
  int max_batch = 17;
  int max_seqlen_q = 300;
  int max_context = 3000;
  int64_t max_work = int64_t{1} << 25;
  int64_t max_cache_elements = int64_t{1} << 22;  // k_cache + v_cache elements
  double large_fraction = 0.05;  // allowed 8 * max_work
  double medium_fraction = 0.2;
  // Awkward shapes on every case: batch = max_batch, 63/7 heads, pages of 1 or 3, varlen q with an
  // empty query sequence and a sequence with no keys.
  bool awkward = false;
  // Prefill-shaped draws (the GPU runner's sm90 mode): (d, d_v) from this list (empty: any), and
  // at least this many query rows per sequence (varlen: per non-empty sequence).
  std::vector<std::pair<int, int>> head_dims;
  int min_seqlen_q = 1;
  // MLA draws (the GPU runner's mla subset), SGLang's FA3 shape: fp16 / bf16, d 64 (q, k_cache:
  // the rotary part) and d_v 512 (v_cache: the latent cache), mostly with qv (the absorbed
  // query; only_qv, q absent and k_cache absent among them), one KV head and 16 or 128 query
  // heads, a paged cache of pages of 1, 16 or 64 in most cases; a fifth of them over an fp8
  // e4m3 cache with k / v descales (contract 5.8).
  bool mla = false;
  // FA3's all-fp8 call on every case (the GPU runner's sm90fp8 subset): q, caches and new k / v
  // e4m3, bf16 out, descales drawn as for any fp8 call.
  bool all_fp8 = false;
};

class Case {
 public:
  Case() = default;
  Case(Case&&) = default;
  Case& operator=(Case&&) = default;
  Case(const Case&) = delete;  // args point into this case's own buffers
  Case& operator=(const Case&) = delete;

  uint64_t seed = 0;
  KvCacheArgs args;
  std::vector<std::string> features;  // coverage tags ("paged", "page_size=3", "rotary", ...)
  std::string summary;                // the configuration in one line

  // A host buffer owned by the case (zeroed), viewed with `shape` and `strides`.
  TensorView allocate(DType dtype, std::vector<int64_t> shape, std::vector<int64_t> strides,
                      bool read_only);
  // Snapshots taken once the case is built: the caches (to check untouched slots bit for bit and
  // to restore them between runs) and hashes of every read-only input.
  void seal();
  void restore_cache();
  // Names of read-only inputs whose bytes changed since seal() (empty when none).
  std::vector<std::string> modified_inputs() const;
  const std::vector<unsigned char>& k_cache_before() const { return k_cache_before_; }
  const std::vector<unsigned char>& v_cache_before() const { return v_cache_before_; }

 private:
  struct Buffer {
    std::vector<unsigned char> bytes;
    bool read_only = false;
    uint64_t hash = 0;
  };
  std::list<Buffer> buffers_;  // list: views stay valid when the case is moved or grows
  std::vector<unsigned char> k_cache_before_, v_cache_before_;
  const Buffer* buffer_of(const OptTensor& view) const;
};

// The GPU runner's sm90 draws: prompts of 64-512 query rows at the head dims the sm90 family is
// compiled at (core/kernel_family.h sm90_head_dims).
CaseLimits sm90_prefill_limits();
// The GPU runner's sm90fp8 draws: FA3's all-fp8 call, prompts of 64-512 query rows at the head dims
// the sm90 family's fp8 kernel is compiled at (core/kernel_family.h sm90_fp8_head_dims).
CaseLimits sm90_fp8_prefill_limits();

Case make_random_case(uint64_t seed, const CaseLimits& limits = {});
// The feature tags make_random_case(seed, limits) would have, without building its buffers.
std::vector<std::string> random_case_features(uint64_t seed, const CaseLimits& limits = {});

// One line that names the seed (reproduce with make_random_case(seed, the same limits)) and the
// configuration.
std::string describe(const Case& c);

// Output buffers shaped by `spec` (from kvflash::output_spec(case.args); the oracle library itself
// calls nothing of kvflash's, so it cannot share a misreading); out and LSE are pre-filled with NaN so an
// element the backend forgets to write is caught. Partials only when asked and the call splits.
struct CaseOutputs {
  Outputs outputs;
  int num_splits = 1;
  std::list<std::vector<unsigned char>> storage;
};
CaseOutputs allocate_outputs(const OutputSpec& spec, bool with_partials, bool with_lse = true);

// Per-dtype tolerances, one table (see compare.cpp for why each number is what it is).
struct Tolerance {
  double out_atol;    // times the row's max |v| (times v_descale)
  double out_rtol;    // times |ref|
  double lse_atol;    // LSE is fp32 whatever the inputs
  double score_rel;   // fp32 score rounding, times the row's Cauchy-Schwarz score bound
};
// any_backend: what every backend must meet (GPU kernels round P to the input type before P.V).
// fp32_probabilities: for backends that keep P in fp32 (the CPU backend), whose out then differs
// from the oracle by little more than its final rounding; a tighter net for logic bugs.
// fp8_tensor_cores: any_backend's, for a kernel whose e4m3 scores come from fp8 tensor-core GEMMs
// (the sm90 family's fp8 kernel), which add each k-step of 32 products with fewer bits than fp32:
// score_rel grows by fp8_tensor_core_accumulation(d) (compare.cpp says why the number).
enum class ToleranceProfile { any_backend, fp32_probabilities, fp8_tensor_cores };
Tolerance tolerance_for(DType input_dtype, ToleranceProfile profile = ToleranceProfile::any_backend,
                        int qk_headdim = 0);
// The relative score error of an fp8 tensor-core dot product of depth qk_headdim beyond fp32's.
double fp8_tensor_core_accumulation(int qk_headdim);
// The profile a GPU call planned as `plan` is held to: fp8_tensor_cores for an all-fp8 call on
// the sm90 family (its fp8 kernel), else any_backend.
ToleranceProfile gpu_tolerance_profile(const KvCacheArgs& a, const Plan& plan);
// The relative error a backend may add to a call's scores beyond fp32 accumulation: with qv over an
// fp8 cache (a 16-bit query), q times k_descale and qv times v_descale rounded once each to the
// query's type (contract 5.8; the CUDA backend's copies), at most its unit roundoff (fp16 2^-11,
// bf16 2^-8) per element; 0 for other calls. compare() adds it to score_rel under any_backend.
double scaled_query_rounding(const KvCacheArgs& a);

// The bounds compare() applies, for callers that check elements themselves (a GPU runner
// comparing device results, `kvflash verify`): out element of (token, head) row `row` with
// reference `ref`; LSE of that row; an appended cache element (0: a copy, bit-exact; rotated: an
// ulp of the storage type plus the fp32 rounding of the rotation's products).
double out_tolerance(const Tolerance& tol, const OracleResult& r, int64_t row, double ref);
double lse_tolerance(const Tolerance& tol, const OracleResult& r, int64_t row);
double appended_tolerance(DType cache_dtype, const AppendedElement& e);

struct Comparison {
  bool ok = true;
  int64_t failures = 0;
  std::string first_failure;  // the first bad element, with its indices and values
  std::string worst;          // the element closest to (or furthest past) its tolerance
  double worst_ratio = 0.0;   // |err| / tol of that element
  std::map<std::string, double> worst_ratio_by_check;  // "out", "softmax_lse", ...: max |err| / tol
  void fail(const std::string& what);
};

// Checks out, LSE, the split partials (when given; `plan` supplies the per-batch split counts),
// the appended cache rows, the untouched cache slots, the empty rows and the read-only inputs.
Comparison compare(const Case& c, const OracleResult& ref, const Outputs& outputs,
                   const Plan* plan = nullptr,
                   ToleranceProfile profile = ToleranceProfile::any_backend);

// Coverage of a set of cases: how many exercised each feature tag.
struct Coverage {
  std::map<std::string, int> counts;
  int cases = 0;
  void add(const std::vector<std::string>& features);
  void add(const Case& c) { add(c.features); }
  std::string report() const;
};

}  // namespace kvflash::oracle
