// The sm90 prefill family's ladder (src/cuda/sm90/prefill.h), each rung timed on the same inputs
// and checked against the portable kernels (the public API with num_splits = 2, which the sm90
// family never takes): dense bf16 caches, 16k x 16k at head dims 64 / 128 / 256 (non-causal and
// causal) and batched shorter prompts (32 x 512 to 4 x 4096: where rung 6's small tiles stop
// paying against rung 3 / rung 8); rungs 1-8 (src/cuda/sm90/prefill.h). Paged rows (pages
// of 8-64 keys, smaller than a key block, in a random order) run the best rung, the kernel the
// family rule picks for them. TFLOP/s = 4 d x visible (query, key) pairs x heads / median time of
// 10 launches after 2 warm-ups.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cuda/common/params.h"
#include "cuda/sm90/prefill.h"
#include "gpu/gpu_util.h"
#include "kvflash/kvflash.h"

namespace kvflash::gpu_test {
#if !defined(KVFLASH_WITH_SM90)
int run_sm90_bench(const std::string&) {
  std::printf("sm90bench: this build has no sm90 prefill family (a KVFLASH_CUDA_MINIMAL build)\n");
  return 1;
}
#else
namespace {

// printf into a std::string (one table cell).
template <class... Args>
std::string format(const char* fmt, Args... args) {
  char cell[64];
  std::snprintf(cell, sizeof cell, fmt, args...);
  return cell;
}

struct Shape {
  int batch, seqlen, heads, heads_k, headdim;
  bool causal;
  int page = 0;  // keys per page of a paged cache; 0: dense
};

// A paged cache's page table: each sequence's pages_per_seq pages, drawn in a random order from
// all of them (page_table (b, pages_per_seq) int32 on the device).
struct PageTable {
  int pages_per_seq = 0, num_pages = 0;
  int32_t* table = nullptr;
};

PageTable make_page_table(const Shape& s, std::mt19937& rng) {
  PageTable t;
  if (s.page == 0) return t;
  t.pages_per_seq = (s.seqlen + s.page - 1) / s.page;
  t.num_pages = s.batch * t.pages_per_seq;
  std::vector<int32_t> ids(size_t(t.num_pages));
  for (int i = 0; i < t.num_pages; ++i) ids[size_t(i)] = i;
  std::shuffle(ids.begin(), ids.end(), rng);
  check(cudaMalloc(&t.table, ids.size() * 4), "cudaMalloc");
  check(cudaMemcpy(t.table, ids.data(), ids.size() * 4, cudaMemcpyHostToDevice), "upload");
  return t;
}

uint16_t to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
float from_bf16(uint16_t h) {
  const uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

void* device_random(size_t count, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<uint16_t> host(count);
  for (auto& x : host) x = to_bf16(normal(rng));
  void* d = nullptr;
  check(cudaMalloc(&d, count * 2), "cudaMalloc");
  check(cudaMemcpy(d, host.data(), count * 2, cudaMemcpyHostToDevice), "upload");
  return d;
}

cuda::AttentionParams cache_params(const Shape& s, const PageTable& pages, void* q, void* k, void* v, void* out) {
  cuda::AttentionParams p;
  const int64_t hd = int64_t(s.heads) * s.headdim, hkd = int64_t(s.heads_k) * s.headdim;
  p.len.batch = s.batch;
  p.len.seqlen_q = s.seqlen;
  p.len.total_q = s.batch * s.seqlen;
  p.len.cache_seqlens_value = s.seqlen;
  p.len.num_cache_seqs = s.batch;
  p.len.capacity = s.seqlen;
  p.cache.k = k, p.cache.v = v;
  p.cache.k_row_stride = p.cache.v_row_stride = s.seqlen * hkd;
  p.cache.k_pos_stride = p.cache.v_pos_stride = hkd;
  p.cache.k_head_stride = p.cache.v_head_stride = s.headdim;
  if (s.page) {
    p.len.capacity = pages.pages_per_seq * s.page;
    p.cache.k_row_stride = p.cache.v_row_stride = s.page * hkd;
    p.cache.paged = true;
    p.cache.page_size = core::FastDivisor(s.page), p.cache.num_pages = pages.num_pages, p.cache.pages_per_seq = pages.pages_per_seq;
    p.cache.page_table = pages.table;
    p.cache.page_table_row_stride = pages.pages_per_seq;
  }
  p.q = cuda::RowLayout{q, s.seqlen * hd, hd, s.headdim};
  p.out = cuda::RowLayout{out, s.seqlen * hd, hd, s.headdim};
  p.num_heads = s.heads, p.num_heads_k = s.heads_k, p.group = s.heads / s.heads_k;
  p.headdim = p.headdim_v = s.headdim;
  p.softmax_scale = 1.0f / std::sqrt(float(s.headdim));
  p.window_right = s.causal ? 0 : -1;
  return p;
}

void launch_rung(const cuda::AttentionParams& p, int headdim, int group, int rung) {
  switch (headdim) {
    case 64: return cuda::sm90::launch_prefill_rung<__nv_bfloat16, 64, 64>(p, group, rung, nullptr);
    case 128: return cuda::sm90::launch_prefill_rung<__nv_bfloat16, 128, 128>(p, group, rung, nullptr);
    default: return cuda::sm90::launch_prefill_rung<__nv_bfloat16, 256, 256>(p, group, rung, nullptr);
  }
}

template <class F>
double median_ms(F launch) {
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  for (int i = 0; i < 2; ++i) launch();
  std::vector<float> ms;
  for (int i = 0; i < 10; ++i) {
    cudaEventRecord(start);
    launch();
    cudaEventRecord(stop);
    check(cudaEventSynchronize(stop), "timed launch");
    float t = 0;
    cudaEventElapsedTime(&t, start, stop);
    ms.push_back(t);
  }
  check(cudaGetLastError(), "launch");
  std::sort(ms.begin(), ms.end());
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return ms[ms.size() / 2];
}

double max_abs_diff(const void* a, const void* b, size_t count) {
  std::vector<uint16_t> x(count), y(count);
  check(cudaMemcpy(x.data(), a, count * 2, cudaMemcpyDeviceToHost), "download");
  check(cudaMemcpy(y.data(), b, count * 2, cudaMemcpyDeviceToHost), "download");
  double worst = 0.0;
  for (size_t i = 0; i < count; ++i) {
    const double d = std::fabs(double(from_bf16(x[i])) - double(from_bf16(y[i])));
    worst = std::isnan(d) ? INFINITY : std::max(worst, d);
  }
  return worst;
}

// Which rungs a row runs: paged rows the planned rungs only (3, and 8 at d <= 64: they alone have
// kernels for pages smaller than a block); small (the sanitizers' run: one report per kernel)
// every rung but ping-pong
// (racecheck reports rung 4, see prefill.h); timed rows every rung.
bool runs_rung(const Shape& s, bool small, int rung) {
  if (s.page) {
    return rung == cuda::sm90::kBestRung ||
           (rung == cuda::sm90::kThreeGroupRung && s.headdim <= cuda::sm90::kThreeGroupMaxHeadDim);
  }
  if (rung == cuda::sm90::kSmallTileRung && s.headdim > cuda::sm90::kSmallTileMaxHeadDim) return false;
  if (rung == cuda::sm90::kThreeGroupRung && s.headdim > cuda::sm90::kThreeGroupMaxHeadDim) return false;
  return !small || rung != cuda::sm90::kPingPongRung;
}

}  // namespace

// variant "small": the rungs once on small shapes, untimed; "paged": the timed paged rows alone (a
// quick measure of a change to the small-page copies); "": every row timed.
int run_sm90_bench(const std::string& variant) {
  const bool small = variant == "small";
  std::vector<Shape> shapes =
      small ? std::vector<Shape>{{2, 200, 2, 1, 64, true},   {2, 200, 2, 2, 128, false}, {2, 200, 2, 1, 128, true},
                                 {2, 200, 2, 2, 256, false},  {2, 200, 2, 1, 256, true},
                                 {16, 300, 16, 16, 128, true}}  // 768 tiles: several per persistent CTA
            : std::vector<Shape>{{1, 16384, 16, 16, 128, false}, {1, 16384, 16, 16, 128, true},
                                 {1, 16384, 32, 32, 64, false},   {1, 16384, 32, 32, 64, true},
                                 {1, 16384, 8, 8, 256, false},    {1, 16384, 8, 8, 256, true},
                                 {32, 512, 16, 16, 128, true},    {32, 512, 16, 16, 128, false},
                                 {32, 512, 32, 32, 64, true},     {16, 1024, 16, 16, 128, true},
                                 {16, 1024, 32, 32, 64, false},   {8, 2048, 32, 32, 64, true},
                                 {4, 4096, 32, 32, 64, false},
                                 {1, 8192, 32, 8, 128, true}};
  // Paged: the engines' pages (16: vLLM; 64: SGLang with FA3) at the dense rows' shapes, and 8 / 32.
  const std::vector<Shape> paged =
      small ? std::vector<Shape>{{2, 200, 2, 1, 64, true, 8},   {2, 200, 2, 2, 128, false, 16},
                                 {2, 200, 2, 1, 128, true, 64}, {2, 200, 2, 1, 256, true, 32},
                                 {2, 200, 2, 2, 256, false, 16}}
            : std::vector<Shape>{{1, 16384, 16, 16, 128, false, 16}, {1, 16384, 16, 16, 128, true, 16},
                                 {1, 16384, 16, 16, 128, true, 64},  {1, 16384, 16, 16, 128, true, 8},
                                 {1, 16384, 16, 16, 128, true, 32},  {1, 16384, 32, 32, 64, true, 16},
                                 {1, 16384, 32, 32, 64, true, 64},   {1, 16384, 32, 32, 64, false, 16},
                                 {1, 16384, 8, 8, 256, true, 16},    {1, 16384, 8, 8, 256, true, 32},
                                 {32, 512, 16, 16, 128, true, 16},   {32, 512, 16, 16, 128, true, 64},
                                 {1, 8192, 32, 8, 128, true, 16}};
  if (variant == "paged") shapes.clear();
  shapes.insert(shapes.end(), paged.begin(), paged.end());
  std::mt19937 rng(11);
  int failures = 0;
  std::string header = format("%-34s %8s", "shape (bf16, p: page size)", "sm80"), rung_list;
  for (int rung = 1; rung <= cuda::sm90::kRungs; ++rung) {
    header += format(" %8s", format("rung%d", rung).c_str());
    rung_list += (rung > 1 ? " / " : "") + std::to_string(rung);
  }
  std::printf("%s %9s max|rung - sm80| (%s)\n", header.c_str(), "TFLOP/s", rung_list.c_str());
  for (const Shape& s : shapes) {
    const size_t q_count = size_t(s.batch) * s.seqlen * s.heads * s.headdim;
    const PageTable pages = make_page_table(s, rng);
    const int64_t kv_rows = s.page ? int64_t(pages.num_pages) * s.page : int64_t(s.batch) * s.seqlen;
    const size_t kv_count = size_t(kv_rows) * s.heads_k * s.headdim;
    void* q = device_random(q_count, rng);
    void* k = device_random(kv_count, rng);
    void* v = device_random(kv_count, rng);
    void *ref = nullptr, *out = nullptr;
    check(cudaMalloc(&ref, q_count * 2), "cudaMalloc");
    check(cudaMalloc(&out, q_count * 2), "cudaMalloc");

    // The portable kernels through the public API (two splits: never the sm90 family).
    const Device dev{DeviceType::cuda, 0};
    KvCacheArgs args;
    args.q = TensorView::contiguous(q, DType::bf16, {s.batch, s.seqlen, s.heads, s.headdim}, dev);
    const int64_t units = s.page ? pages.num_pages : s.batch, unit_rows = s.page ? s.page : s.seqlen;
    args.k_cache = TensorView::contiguous(k, DType::bf16, {units, unit_rows, s.heads_k, s.headdim}, dev);
    args.v_cache = TensorView::contiguous(v, DType::bf16, {units, unit_rows, s.heads_k, s.headdim}, dev);
    if (s.page) {
      args.page_table = TensorView::contiguous(pages.table, DType::i32, {s.batch, pages.pages_per_seq}, dev);
      args.cache_seqlens_value = s.seqlen;  // the last page's tail is not the sequence's
    }
    args.causal = s.causal;
    args.num_splits = 2;
    Outputs outputs;
    outputs.out = TensorView::contiguous(ref, DType::bf16, {s.batch, s.seqlen, s.heads, s.headdim}, dev);
    const auto timed = [&](auto launch) { return small ? (launch(), 0.0) : median_ms(launch); };
    const double sm80_ms = timed([&] { flash_attn_with_kvcache(args, outputs); });

    const cuda::AttentionParams p = cache_params(s, pages, q, k, v, out);
    double ms[cuda::sm90::kRungs + 1] = {}, diff[cuda::sm90::kRungs + 1] = {};
    for (int rung = 1; rung <= cuda::sm90::kRungs; ++rung) {
      if (!runs_rung(s, small, rung)) continue;
      check(cudaMemset(out, 0xff, q_count * 2), "poison");  // NaN: an unwritten element fails
      launch_rung(p, s.headdim, s.heads / s.heads_k, rung);
      check(cudaDeviceSynchronize(), "rung");
      diff[rung] = max_abs_diff(out, ref, q_count);
      ms[rung] = timed([&] { launch_rung(p, s.headdim, s.heads / s.heads_k, rung); });
      if (!(diff[rung] <= 0.02)) ++failures;
    }
    const double pairs = s.causal ? double(s.seqlen) * (s.seqlen + 1) / 2 : double(s.seqlen) * s.seqlen;
    const double flops = 4.0 * s.batch * s.heads * s.headdim * pairs;
    char name[64];
    char cache[16] = "";
    if (s.page) std::snprintf(cache, sizeof cache, " p%d", s.page);
    std::snprintf(name, sizeof name, "b%d x %d h%d/%d d%d %s%s", s.batch, s.seqlen, s.heads, s.heads_k, s.headdim,
                  s.causal ? "causal" : "full", cache);
    const auto tflops = [&](double t) { return flops / (t * 1e-3) * 1e-12; };
    // A rung this row did not run prints "-" (paged rows run the best rung only).
    std::string times, rates = "  TFLOP/s: sm80 (2 splits) " + format("%.1f", tflops(sm80_ms)), diffs;
    for (int rung = 1; rung <= cuda::sm90::kRungs; ++rung) {
      const bool ran = runs_rung(s, small, rung);
      times += ran ? format(" %8.3f", ms[rung]) : format(" %8s", "-");
      rates += format(", rung%d ", rung) + (ran ? format("%.1f", tflops(ms[rung])) : "-");
      diffs += (rung > 1 ? " / " : "") + (ran ? format("%.4f", diff[rung]) : "-");
    }
    std::printf("%-34s %8.3f%s %9.1f %s\n%s\n", name, sm80_ms, times.c_str(), tflops(ms[cuda::sm90::kBestRung]),
                diffs.c_str(), rates.c_str());
    std::fflush(stdout);
    for (void* ptr : {q, k, v, ref, out, static_cast<void*>(pages.table)}) cudaFree(ptr);
  }
  std::printf("sm90bench: %s (%d rung outputs off the sm80 result by more than 0.02)\n",
              failures ? "FAIL" : "PASS", failures);
  return failures ? 1 : 0;
}
#endif

}  // namespace kvflash::gpu_test
