// CUDA graphs: one paged decode step (append of the new token, split-KV forced, prepare and
// combine on the device) is captured once with a Plan and a workspace, then replayed for several
// steps with new cache_seqlens, page tables, q, k, v and cache contents written into the same
// device buffers. Every replay must match the oracle, and the same call run eagerly on the step's
// inputs must give the replay's bytes (out, LSE, both caches). Two shapes: GQA (8 / 2 heads,
// d 128) and MLA (16 heads on one KV head, d 64, d_v 512, qv).
#include <cuda_runtime.h>

#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "gpu/gpu_util.h"
#include "kvflash/kvflash.h"
#include "oracle/oracle.h"
#include "oracle/random_case.h"

namespace kvflash::gpu_test {
namespace {

constexpr int kBatch = 5, kPageSize = 16, kPagesPerSeq = 24;
constexpr int kNumPages = kBatch * kPagesPerSeq + 7;
constexpr int kSteps = 6;

struct GraphShape {
  const char* name;
  int heads, heads_k, dim, dim_v;
  bool qv;
};
constexpr GraphShape kShapes[] = {{"gqa d 128", 8, 2, 128, 128, false}, {"mla d 64 / 512 qv", 16, 1, 64, 512, true}};

// The tensors a step refreshes and the graph reads.
constexpr OptTensor KvCacheArgs::*kInputs[] = {&KvCacheArgs::q,       &KvCacheArgs::k,       &KvCacheArgs::v,
                                               &KvCacheArgs::qv,      &KvCacheArgs::k_cache, &KvCacheArgs::v_cache,
                                               &KvCacheArgs::page_table, &KvCacheArgs::cache_seqlens};

uint16_t bf16_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

void fill_bf16(const TensorView& t, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  auto* p = t.ptr<uint16_t>();
  const size_t n = span_bytes(t) / 2;
  for (size_t i = 0; i < n; ++i) p[i] = bf16_bits(normal(rng));
}

// New lengths, a fresh page permutation and fresh contents for every input of one step.
void next_step(oracle::Case& c, std::mt19937& rng) {
  const KvCacheArgs& a = c.args;
  for (const OptTensor* t : {&a.q, &a.k, &a.v, &a.qv, &a.k_cache, &a.v_cache}) {
    if (*t) fill_bf16(**t, rng);
  }
  std::vector<int32_t> pages(kNumPages);
  std::iota(pages.begin(), pages.end(), 0);
  std::shuffle(pages.begin(), pages.end(), rng);
  auto* table = a.page_table->ptr<int32_t>();
  for (int i = 0; i < kBatch * kPagesPerSeq; ++i) table[i] = pages[size_t(i)];
  std::uniform_int_distribution<int> len(0, kPagesPerSeq * kPageSize - 1);  // room for the new token
  for (int b = 0; b < kBatch; ++b) a.cache_seqlens->ptr<int32_t>()[b] = len(rng);
  c.seal();
}

// The bytes the host views hold.
std::vector<std::vector<char>> host_bytes(std::initializer_list<const TensorView*> views) {
  std::vector<std::vector<char>> all;
  for (const TensorView* t : views) {
    const char* p = static_cast<const char*>(t->data);
    all.emplace_back(p, p + span_bytes(*t));
  }
  return all;
}

// Failed replays of one shape, or eager runs differing from them (-1: the capture failed).
int run_graph_shape(const GraphShape& s) {
  oracle::Case c;
  KvCacheArgs& a = c.args;
  a.q = c.allocate(DType::bf16, {kBatch, 1, s.heads, s.dim}, {}, true);
  if (s.qv) a.qv = c.allocate(DType::bf16, {kBatch, 1, s.heads, s.dim_v}, {}, true);
  a.k = c.allocate(DType::bf16, {kBatch, 1, s.heads_k, s.dim}, {}, true);
  a.v = c.allocate(DType::bf16, {kBatch, 1, s.heads_k, s.dim_v}, {}, true);
  a.k_cache = c.allocate(DType::bf16, {kNumPages, kPageSize, s.heads_k, s.dim}, {}, false);
  a.v_cache = c.allocate(DType::bf16, {kNumPages, kPageSize, s.heads_k, s.dim_v}, {}, false);
  a.page_table = c.allocate(DType::i32, {kBatch, kPagesPerSeq}, {}, true);
  a.cache_seqlens = c.allocate(DType::i32, {kBatch}, {}, true);
  a.causal = true;
  a.num_splits = 4;
  std::mt19937 rng(1234);
  next_step(c, rng);

  DeviceMirror mirror;
  KvCacheArgs dev = a;
  for (OptTensor KvCacheArgs::*f : kInputs) dev.*f = mirror.upload(a.*f);
  const Plan plan = make_plan(dev);
  dev.plan = &plan;
  const OutputSpec spec = output_spec(dev, &plan);
  oracle::CaseOutputs host_out = oracle::allocate_outputs(spec, false);
  Outputs dev_out;
  dev_out.out = mirror.upload(host_out.outputs.out);
  dev_out.softmax_lse = mirror.upload(host_out.outputs.softmax_lse);
  const size_t ws_bytes = workspace_size(dev, plan);
  void* ws = nullptr;
  check(cudaMalloc(&ws, std::max<size_t>(ws_bytes, 16)), "cudaMalloc workspace");
  cudaStream_t stream;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  RunOptions options;
  options.stream = stream;
  options.workspace = Workspace{ws, ws_bytes};

  cudaGraph_t graph;
  cudaGraphExec_t exec;
  check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "begin capture");
  try {
    flash_attn_with_kvcache(dev, dev_out, options);
  } catch (const Error& e) {
    std::printf("graph %s: the call threw during capture: %s\n", s.name, e.what());
    cudaStreamEndCapture(stream, &graph);
    return -1;
  }
  check(cudaStreamEndCapture(stream, &graph), "end capture");
  check(cudaGraphInstantiate(&exec, graph, 0), "instantiate");

  // The step's inputs (caches as before the append) on the device, out NaN again so an unwritten
  // element shows; then the outputs and caches back on the host.
  const std::vector<char> nan_out = host_bytes({&host_out.outputs.out})[0];
  const auto upload_step = [&] {
    std::memcpy(host_out.outputs.out.data, nan_out.data(), nan_out.size());
    for (OptTensor KvCacheArgs::*f : kInputs) {
      if (a.*f) DeviceMirror::reupload(*(a.*f), *(dev.*f));
    }
    DeviceMirror::reupload(host_out.outputs.out, dev_out.out);
  };
  const auto download_step = [&] {
    check(cudaStreamSynchronize(stream), "graph step");
    DeviceMirror::download(host_out.outputs.out, dev_out.out);
    DeviceMirror::download(*host_out.outputs.softmax_lse, *dev_out.softmax_lse);
    DeviceMirror::download(*a.k_cache, *dev.k_cache);
    DeviceMirror::download(*a.v_cache, *dev.v_cache);
    return host_bytes({&host_out.outputs.out, &*host_out.outputs.softmax_lse, &*a.k_cache, &*a.v_cache});
  };
  int failures = 0, eager_differs = 0;
  for (int step = 0; step < kSteps; ++step) {
    if (step > 0) next_step(c, rng);
    upload_step();
    const oracle::OracleResult ref = oracle::run_oracle(a);
    check(cudaGraphLaunch(exec, stream), "graph launch");
    const auto replayed = download_step();
    const oracle::Comparison cmp = oracle::compare(c, ref, host_out.outputs);
    if (!cmp.ok) {
      ++failures;
      std::printf("graph %s step %d FAIL: %s\n", s.name, step, cmp.first_failure.c_str());
    }
    // The same step eagerly, from the caches as they were before it.
    c.restore_cache();
    upload_step();
    flash_attn_with_kvcache(dev, dev_out, options);
    if (download_step() != replayed) {
      ++eager_differs;
      std::printf("graph %s step %d FAIL: the eager call's bytes differ from the replay's\n", s.name, step);
    }
  }
  std::printf("graph %s: %d of %d replays match the oracle (batch %d, page %d, %d splits, append + causal); "
              "eager runs of the same steps bitwise equal to the replays: %d of %d\n",
              s.name, kSteps - failures, kSteps, kBatch, kPageSize, plan.num_splits, kSteps - eager_differs, kSteps);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaFree(ws);
  cudaStreamDestroy(stream);
  return failures + eager_differs;
}

}  // namespace

int run_graph() {
  bool ok = true;
  for (const GraphShape& s : kShapes) ok = run_graph_shape(s) == 0 && ok;
  return ok ? 0 : 1;
}

}  // namespace kvflash::gpu_test
