// Timings of the speed floors (bf16, random normal data, CUDA events around a CUDA graph of
// several calls, each call with a Plan and a workspace; median of the repeats):
//   paged decode, page 16, 32 / 8 heads, d 128: batch 64 x 8192 (TB/s of K+V read) and
//   batch 1 x 8192 (us per call; the graph cycles through 16 disjoint page sets, 128 MB, past L2);
//   the same two over an fp8 e4m3 cache (bf16 query, descales 1; TB/s of the fp8 bytes read);
//   prefill, one sequence of 16384 tokens, 16 heads, d 128, non-causal (TFLOP/s);
//   MLA decode (issue 16), page 64, one KV head, q / k_cache d 64, qv / v_cache d 512: 16 query
//   heads at batch 64 x 8192 (TB/s of cache read, memory bound; also with page 1, SGLang's
//   default) and 128 query heads at batch 128 x 8192 (TFLOP/s, compute bound); the family that
//   ran is printed with the plan (sm90_mla on the H200; the portable kernels with
//   KVFLASH_SM90_MLA=0); the same two over an fp8 e4m3 cache with k / v descales of 1 (the
//   portable kernels, after q's and qv's scaled copies; TB/s of the fp8 bytes read).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "core/numeric.h"
#include "gpu/gpu_util.h"
#include "kvflash/kvflash.h"

namespace kvflash::gpu_test {
namespace {

// A 16M-element block of N(0, 1) values in Storage, rounded by `round`.
template <class Storage, class Round>
std::vector<Storage> normal_block(Round round) {
  std::vector<Storage> b(size_t{1} << 24);
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (auto& x : b) x = round(normal(rng));
  return b;
}

// Device buffer of `count` values of `block` (repeated).
template <class Storage>
void* repeated(const std::vector<Storage>& block, size_t count) {
  void* d = nullptr;
  check(cudaMalloc(&d, count * sizeof(Storage)), "cudaMalloc");
  for (size_t at = 0; at < count; at += block.size()) {
    const size_t n = std::min(block.size(), count - at);
    check(cudaMemcpy(static_cast<Storage*>(d) + at, block.data(), n * sizeof(Storage), cudaMemcpyHostToDevice),
          "fill");
  }
  return d;
}

// Device buffer of `count` bf16 values N(0, 1).
void* random_bf16(size_t count) {
  static const std::vector<uint16_t> block = normal_block<uint16_t>([](float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
  });
  return repeated(block, count);
}

// Device buffer of `count` e4m3 values N(0, 1) (an fp8 cache with descale 1).
void* random_e4m3(size_t count) {
  static const std::vector<uint8_t> block = normal_block<uint8_t>(core::float_to_e4m3);
  return repeated(block, count);
}

void* device_ints(const std::vector<int32_t>& v) {
  void* d = nullptr;
  check(cudaMalloc(&d, v.size() * 4), "cudaMalloc");
  check(cudaMemcpy(d, v.data(), v.size() * 4, cudaMemcpyHostToDevice), "upload ints");
  return d;
}

TensorView cuda_view(void* data, DType dtype, std::initializer_list<int64_t> shape) {
  return TensorView::contiguous(data, dtype, shape, Device{DeviceType::cuda, 0});
}

// Median milliseconds of one call, timing graphs of `calls.size()` calls (one per argument set).
double time_calls(std::vector<KvCacheArgs>& calls, const Outputs& out, int repeats) {
  Plan plan = make_plan(calls[0]);
  const size_t ws_bytes = workspace_size(calls[0], plan);
  void* ws = nullptr;
  check(cudaMalloc(&ws, std::max<size_t>(ws_bytes, 16)), "workspace");
  cudaStream_t stream;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
  RunOptions options{stream, Workspace{ws, ws_bytes}, 0};
  for (KvCacheArgs& a : calls) a.plan = &plan;
  flash_attn_with_kvcache(calls[0], out, options);  // warm-up outside the graph
  check(cudaStreamSynchronize(stream), "warm-up");
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "capture");
  for (const KvCacheArgs& a : calls) flash_attn_with_kvcache(a, out, options);
  check(cudaStreamEndCapture(stream, &graph), "end capture");
  check(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  std::vector<float> ms;
  for (int r = 0; r < repeats + 2; ++r) {
    cudaEventRecord(start, stream);
    cudaGraphLaunch(exec, stream);
    cudaEventRecord(stop, stream);
    check(cudaEventSynchronize(stop), "timed replay");
    float t = 0;
    cudaEventElapsedTime(&t, start, stop);
    if (r >= 2) ms.push_back(t / float(calls.size()));
  }
  std::sort(ms.begin(), ms.end());
  std::printf("    (plan: %s, block %dx%d, num_splits %d)\n", family_name(plan.kernel.family), plan.block_m,
              plan.block_n, plan.num_splits);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaFree(ws);
  cudaStreamDestroy(stream);
  return ms[ms.size() / 2];
}

struct Result {
  const char* name;
  double ms;
  double rate;
  const char* unit;
};

// cache: bf16, or e4m3 (a bf16 query over an fp8 cache, issue 15).
Result bench_decode(int batch, int context, int page_sets, DType cache = DType::bf16) {
  constexpr int kHeads = 32, kHeadsK = 8, kDim = 128, kPage = 16;
  const int pages_per_seq = context / kPage;
  const int num_pages = batch * pages_per_seq * page_sets;
  const size_t cache_elems = size_t(num_pages) * kPage * kHeadsK * kDim;
  const bool fp8 = cache == DType::e4m3;
  void* k_cache = fp8 ? random_e4m3(cache_elems) : random_bf16(cache_elems);
  void* v_cache = fp8 ? random_e4m3(cache_elems) : random_bf16(cache_elems);
  void* q = random_bf16(size_t(batch) * kHeads * kDim);
  void* out = random_bf16(size_t(batch) * kHeads * kDim);
  float* lse = nullptr;
  check(cudaMalloc(&lse, size_t(batch) * kHeads * 4), "lse");
  void* seqlens = device_ints(std::vector<int32_t>(size_t(batch), context));
  std::vector<int32_t> pages(static_cast<size_t>(num_pages));
  std::iota(pages.begin(), pages.end(), 0);
  std::shuffle(pages.begin(), pages.end(), std::mt19937(3));
  std::vector<KvCacheArgs> calls;
  for (int s = 0; s < page_sets; ++s) {
    std::vector<int32_t> table(pages.begin() + size_t(s) * batch * pages_per_seq,
                               pages.begin() + size_t(s + 1) * batch * pages_per_seq);
    KvCacheArgs a;
    a.q = cuda_view(q, DType::bf16, {batch, 1, kHeads, kDim});
    a.k_cache = cuda_view(k_cache, cache, {num_pages, kPage, kHeadsK, kDim});
    a.v_cache = cuda_view(v_cache, cache, {num_pages, kPage, kHeadsK, kDim});
    a.page_table = cuda_view(device_ints(table), DType::i32, {batch, pages_per_seq});
    a.cache_seqlens = cuda_view(seqlens, DType::i32, {batch});
    a.causal = true;
    calls.push_back(a);
  }
  Outputs o;
  o.out = cuda_view(out, DType::bf16, {batch, 1, kHeads, kDim});
  o.softmax_lse = cuda_view(lse, DType::f32, {batch, kHeads, 1});
  const double ms = time_calls(calls, o, 20);
  const double bytes = 2.0 * batch * context * kHeadsK * kDim * (fp8 ? 1 : 2);
  const char* name = fp8 ? (batch == 1 ? "decode fp8 b1 x 8192 (us)" : "decode fp8 b64 x 8192 (TB/s)")
                         : (batch == 1 ? "decode b1 x 8192 (us)" : "decode b64 x 8192 (TB/s)");
  return {name, ms, bytes / (ms * 1e-3) / 1e12, "TB/s"};
}

Result bench_prefill(int seqlen, bool causal) {
  constexpr int kHeads = 16, kDim = 128;
  const size_t elems = size_t(seqlen) * kHeads * kDim;
  void* q = random_bf16(elems);
  void* k = random_bf16(elems);
  void* v = random_bf16(elems);
  void* out = random_bf16(elems);
  float* lse = nullptr;
  check(cudaMalloc(&lse, size_t(seqlen) * kHeads * 4), "lse");
  KvCacheArgs a;
  a.q = cuda_view(q, DType::bf16, {1, seqlen, kHeads, kDim});
  a.k_cache = cuda_view(k, DType::bf16, {1, seqlen, kHeads, kDim});
  a.v_cache = cuda_view(v, DType::bf16, {1, seqlen, kHeads, kDim});
  a.causal = causal;
  std::vector<KvCacheArgs> calls{a};
  Outputs o;
  o.out = cuda_view(out, DType::bf16, {1, seqlen, kHeads, kDim});
  o.softmax_lse = cuda_view(lse, DType::f32, {1, kHeads, seqlen});
  const double ms = time_calls(calls, o, 5);
  const double flops = 4.0 * kHeads * double(seqlen) * seqlen * kDim / (causal ? 2 : 1);
  return {causal ? "prefill 16k causal" : "prefill 16k non-causal", ms, flops / (ms * 1e-3) / 1e12, "TFLOP/s"};
}

// MLA decode: one query token per sequence against `context` keys of 576 channels each; cache:
// bf16, or e4m3 with k / v descales (issue 16's fp8 latent cache).
Result bench_mla(int batch, int heads, int context, int page_size = 64, DType cache = DType::bf16) {
  constexpr int kRope = 64, kLatent = 512;
  const int pages_per_seq = context / page_size;
  const int num_pages = batch * pages_per_seq;
  const bool fp8 = cache == DType::e4m3;
  const size_t k_elems = size_t(num_pages) * page_size * kRope, v_elems = size_t(num_pages) * page_size * kLatent;
  void* k_cache = fp8 ? random_e4m3(k_elems) : random_bf16(k_elems);
  void* v_cache = fp8 ? random_e4m3(v_elems) : random_bf16(v_elems);
  void* q = random_bf16(size_t(batch) * heads * kRope);
  void* qv = random_bf16(size_t(batch) * heads * kLatent);
  void* out = random_bf16(size_t(batch) * heads * kLatent);
  float* lse = nullptr;
  check(cudaMalloc(&lse, size_t(batch) * heads * 4), "lse");
  std::vector<int32_t> pages(static_cast<size_t>(num_pages));
  std::iota(pages.begin(), pages.end(), 0);
  std::shuffle(pages.begin(), pages.end(), std::mt19937(3));
  KvCacheArgs a;
  a.q = cuda_view(q, DType::bf16, {batch, 1, heads, kRope});
  a.qv = cuda_view(qv, DType::bf16, {batch, 1, heads, kLatent});
  a.k_cache = cuda_view(k_cache, cache, {num_pages, page_size, 1, kRope});
  a.v_cache = cuda_view(v_cache, cache, {num_pages, page_size, 1, kLatent});
  if (fp8) {
    void* ones = repeated(std::vector<float>(size_t(batch), 1.0f), size_t(batch));
    a.k_descale = a.v_descale = cuda_view(ones, DType::f32, {batch, 1});
  }
  a.page_table = cuda_view(device_ints(pages), DType::i32, {batch, pages_per_seq});
  a.cache_seqlens = cuda_view(device_ints(std::vector<int32_t>(size_t(batch), context)), DType::i32, {batch});
  a.causal = true;
  // KVFLASH_BENCH_NUM_SPLITS=N: the call's num_splits (an upper bound; default the planner's).
  if (const char* splits = std::getenv("KVFLASH_BENCH_NUM_SPLITS")) a.num_splits = std::atoi(splits);
  std::vector<KvCacheArgs> calls{a};
  Outputs o;
  o.out = cuda_view(out, DType::bf16, {batch, 1, heads, kLatent});
  o.softmax_lse = cuda_view(lse, DType::f32, {batch, heads, 1});
  const double ms = time_calls(calls, o, 20);
  if (heads <= 16) {
    const double bytes = double(batch) * context * (kRope + kLatent) * (fp8 ? 1 : 2);
    const char* name = fp8 ? "mla fp8 h16 b64 x 8192 (TB/s)"
                       : page_size == 1 ? "mla h16 b64 x 8192 p1" : "mla h16 b64 x 8192 (TB/s)";
    return {name, ms, bytes / (ms * 1e-3) / 1e12, "TB/s"};
  }
  const double flops = 2.0 * batch * heads * double(context) * (kRope + 2 * kLatent);  // q.k + qv.v, P V
  return {fp8 ? "mla fp8 h128 b128 x 8192" : "mla h128 b128 x 8192", ms, flops / (ms * 1e-3) / 1e12, "TFLOP/s"};
}

}  // namespace

int run_bench(const std::string& only) {
  std::vector<Result> results;
  // A case by name, or "mla" for the MLA rows.
  auto wanted = [&](const char* name) {
    return only.empty() || only == name || (only == "mla" && std::string(name).rfind("mla", 0) == 0);
  };
  try {
    if (wanted("decode64")) results.push_back(bench_decode(64, 8192, 1));
    if (wanted("decode1")) results.push_back(bench_decode(1, 8192, 16));
    if (wanted("decode64_fp8")) results.push_back(bench_decode(64, 8192, 1, DType::e4m3));
    if (wanted("decode1_fp8")) results.push_back(bench_decode(1, 8192, 16, DType::e4m3));
    if (wanted("prefill")) results.push_back(bench_prefill(16384, false));
    if (wanted("prefill_causal")) results.push_back(bench_prefill(16384, true));
    if (wanted("mla16")) results.push_back(bench_mla(64, 16, 8192));
    if (wanted("mla16p1")) results.push_back(bench_mla(64, 16, 8192, 1));
    if (wanted("mla128")) results.push_back(bench_mla(128, 128, 8192));
    if (wanted("mla16_fp8")) results.push_back(bench_mla(64, 16, 8192, 64, DType::e4m3));
    if (wanted("mla128_fp8")) results.push_back(bench_mla(128, 128, 8192, 64, DType::e4m3));
  } catch (const Error& e) {
    std::printf("bench: the call threw: %s\n", e.what());
    return 1;
  }
  std::printf("%-28s %12s %12s\n", "case", "time (us)", "rate");
  for (const Result& r : results) {
    std::printf("%-28s %12.1f %9.2f %s\n", r.name, r.ms * 1e3, r.rate, r.unit);
  }
  return 0;
}

}  // namespace kvflash::gpu_test
