// The GPU test runner: the CUDA backend against the oracle on the same seeded random cases the CPU
// differential test draws (src/oracle/random_case.h), a CUDA-graph decode test, and timings.
//
//   kvflash_gpu_runner random <count> [first_seed] [only]
//                                                     differential cases (unsupported ones skipped);
//                                                     only = split | prefill keeps just the cases
//                                                     that split KV / use the prefill tile shape
//                                                     (for the sanitizers' subsets); sm90 draws
//                                                     prefill shapes and keeps the calls the
//                                                     Hopper prefill family takes; mla draws
//                                                     MLA shapes (d 64 / d_v 512, qv, only_qv,
//                                                     1 KV head, 16 or 128 query heads, a fifth
//                                                     over an fp8 e4m3 cache);
//                                                     sm90mla draws those and keeps the calls
//                                                     the sm90_mla kernel takes (on sm_90,
//                                                     unless KVFLASH_SM90_MLA=0; 16-bit caches);
//                                                     fp8 keeps the cases over an fp8 e4m3 cache
//                                                     (FA3's all-fp8 calls and 16-bit queries
//                                                     over fp8, qv / only_qv among them), which a
//                                                     plain draw also makes;
//                                                     sm90fp8 draws FA3's all-fp8 prefill calls
//                                                     (d = d_v 64 / 128 / 256, >= 64 query rows)
//                                                     and keeps those the sm90 family's fp8 kernel
//                                                     takes (it sets KVFLASH_SM90_FP8=1: opt-in);
//                                                     KVFLASH_RUNNER_SECONDS=N: no new case
//                                                     after N seconds (the tally still prints,
//                                                     where a caller's timeout would leave none)
//   kvflash_gpu_runner sm90bench [small|paged]        the sm90 family's rungs timed (sm90_bench.cpp;
//                                                     small: once each on small shapes, untimed;
//                                                     paged: the paged rows alone)
//   kvflash_gpu_runner graph                          capture a decode step, replay with new lengths
//   kvflash_gpu_runner combine                        kvflash::combine on the GPU vs the CPU
//   kvflash_gpu_runner bench [case]                   the speed floors (decode64, decode1,
//                                                     prefill, prefill_causal, mla16, mla16p1,
//                                                     mla128, mla16_fp8, mla128_fp8, or mla
//                                                     for the five; default all;
//                                                     KVFLASH_BENCH_NUM_SPLITS=N bounds the MLA
//                                                     rows' splits)
//   kvflash_gpu_runner badinput | bitwise [count] | streams [count]
//                                                     issue 18 (reliability_test.cpp)
//
// Every case copies its tensors to the device with their strides, runs the public API there,
// copies the outputs and caches back and lets oracle::compare judge them. Exit status 0 = pass.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "core/kernel_family.h"
#include "kvflash/kvflash.h"
#include "oracle/oracle.h"
#include "oracle/random_case.h"
#include "gpu/gpu_util.h"

namespace kvflash::gpu_test {
namespace {

Outputs device_outputs(const Outputs& host, DeviceMirror& mirror) {
  Outputs o;
  o.out = mirror.upload(host.out);
  o.softmax_lse = mirror.upload(host.softmax_lse);
  o.out_accum = mirror.upload(host.out_accum);
  o.softmax_lse_accum = mirror.upload(host.softmax_lse_accum);
  return o;
}

void download_outputs(const Outputs& host, const Outputs& dev) {
  DeviceMirror::download(host.out, dev.out);
  if (host.softmax_lse) DeviceMirror::download(*host.softmax_lse, *dev.softmax_lse);
  if (host.out_accum) DeviceMirror::download(*host.out_accum, *dev.out_accum);
  if (host.softmax_lse_accum) DeviceMirror::download(*host.softmax_lse_accum, *dev.softmax_lse_accum);
}

struct Tally {
  int passed = 0, failed = 0, skipped = 0, split_cases = 0, paged = 0, appended = 0, checked = 0;
  int caller_partials = 0, device_metadata = 0;
  std::map<std::pair<int64_t, int64_t>, int> head_dims;  // (d, d_v) of the cases run
  bool out_of_time = false;
};

// "; d 64/64 x3, d 96/96 x5, ...": which head dims the run's cases had ("" for none).
std::string head_dims_text(const Tally& tally) {
  std::string text;
  for (const auto& [dims, n] : tally.head_dims) {
    text += (text.empty() ? "; d " : ", d ") + std::to_string(dims.first) + "/" + std::to_string(dims.second) +
            " x" + std::to_string(n);
  }
  return text;
}

// Whether a case belongs to the subset `only` names ("" = every case); `dev` is its device call.
bool in_subset(const std::string& only, const KvCacheArgs& a, const KvCacheArgs& dev, int splits) {
  if (only.empty()) return true;
  if (only == "split") return splits > 1;
  if (only == "mla") return true;  // drawn as such (run_random)
  if (only == "fp8") return a.v_cache->dtype == DType::e4m3;
  if (only == "sm90" || only == "sm90fp8") return make_plan(dev).kernel.family == KernelFamily::sm90;
  if (only == "sm90mla") return make_plan(dev).kernel.family == KernelFamily::sm90_mla;
  if (only == "prefill") {  // more than 16 packed query rows: the prefill tile shape
    const TensorView& query = a.q ? *a.q : *a.qv;
    const int64_t rows_per_seq = a.cu_seqlens_q ? a.max_seqlen_q.value_or(0) : query.size(1);
    return rows_per_seq * (query.size(-2) / a.v_cache->size(-2)) > 16;
  }
  return false;
}

int run_random(int count, uint64_t first_seed, const std::string& only) {
  Tally tally;
  const auto start = std::chrono::steady_clock::now();
  // The sm90 subset draws prefill shapes: head dims the family compiles, >= 64 query rows; sm90fp8
  // the all-fp8 ones its fp8 kernel compiles, which runs only opted in (set before the first plan).
  // KVFLASH_RUNNER_TRACE=1: each case is named on stderr before its call (to find a hang).
  const bool trace = std::getenv("KVFLASH_RUNNER_TRACE") != nullptr;
  const char* seconds_env = std::getenv("KVFLASH_RUNNER_SECONDS");
  const double max_seconds = seconds_env ? std::atof(seconds_env) : 0.0;
  auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); };
  oracle::CaseLimits limits;
  if (only == "sm90") limits = oracle::sm90_prefill_limits();
  if (only == "sm90fp8") {
    limits = oracle::sm90_fp8_prefill_limits();
    setenv("KVFLASH_SM90_FP8", "1", 1);
  }
  if (only == "mla" || only == "sm90mla") limits.mla = true, limits.max_work *= 4;  // 128 heads x 1088 MACs per key
  if (only == "sm90mla") limits.max_seqlen_q = core::kSm90MlaMaxSeqlenQ;
  for (uint64_t seed = first_seed; tally.passed + tally.failed < count && seed < first_seed + 20 * count; ++seed) {
    if (max_seconds > 0 && elapsed() > max_seconds) {
      tally.out_of_time = true;
      break;
    }
    oracle::Case c = oracle::make_random_case(seed, limits);
    if (!cuda_supports(c.args)) {
      ++tally.skipped;
      continue;
    }
    std::optional<oracle::OracleResult> ref;  // after the subset check: most draws of a subset are not in it
    std::string error;
    oracle::CaseOutputs host_out;
    int splits = 1;
    oracle::ToleranceProfile profile = oracle::ToleranceProfile::any_backend;
    {
      DeviceMirror mirror;
      KvCacheArgs dev = device_args(c.args, mirror);
      try {
        const OutputSpec spec = output_spec(dev);
        splits = spec.num_splits;
        if (!in_subset(only, c.args, dev, splits)) {
          ++tally.skipped;
          continue;
        }
        ref = oracle::run_oracle(c.args);
        profile = oracle::gpu_tolerance_profile(c.args, make_plan(dev));
        if (trace) std::fprintf(stderr, "case %s\n", oracle::describe(c).c_str());
        // Every fifth case passes its plan back as FA3's int32 metadata in device memory (read
        // back and verified in checked mode, recomputed on the device otherwise).
        std::vector<int32_t> metadata;
        if (seed % 5 == 3) {
          metadata = make_plan(dev).to_fa3();
          dev.scheduler_metadata = mirror.upload(TensorView::contiguous(
              metadata.data(), DType::i32, {static_cast<int64_t>(metadata.size())}));
          ++tally.device_metadata;
        }
        // Odd seeds hand the call their own NaN-filled split buffers (out_accum, lse_accum).
        host_out = oracle::allocate_outputs(spec, /*with_partials=*/seed % 2 == 1);
        tally.caller_partials += host_out.outputs.out_accum.has_value();
        Outputs dev_out = device_outputs(host_out.outputs, mirror);
        flash_attn_with_kvcache(dev, dev_out);
        check(cudaDeviceSynchronize(), "flash_attn_with_kvcache");
        download_outputs(host_out.outputs, dev_out);
        if (c.args.k_cache) DeviceMirror::download(*c.args.k_cache, *dev.k_cache);
        DeviceMirror::download(*c.args.v_cache, *dev.v_cache);
      } catch (const Error& e) {
        error = std::string(error_kind_name(e.kind())) + " (" + e.argument() + "): " + e.what();
      }
    }
    if (!error.empty()) {
      ++tally.failed;
      std::printf("FAIL %s\n  the call threw %s\n", oracle::describe(c).c_str(), error.c_str());
      continue;
    }
    const oracle::Comparison cmp = oracle::compare(c, *ref, host_out.outputs, nullptr, profile);
    tally.split_cases += splits > 1;
    tally.paged += c.args.page_table.has_value();
    tally.appended += c.args.k.has_value();
    tally.checked += c.args.checked;
    ++tally.head_dims[{c.args.k_cache ? c.args.k_cache->size(-1) : 0, c.args.v_cache->size(-1)}];
    if (cmp.ok) {
      ++tally.passed;
    } else {
      ++tally.failed;
      std::printf("FAIL %s\n  %s\n  worst: %s\n", oracle::describe(c).c_str(),
                  cmp.first_failure.c_str(), cmp.worst.c_str());
    }
  }
  std::printf("random%s%s: %d passed, %d failed, %d skipped (unsupported on CUDA or outside the subset); "
              "of the run: %d split-KV (%d with caller-provided partial buffers), %d paged, %d appending, "
              "%d checked mode, %d given FA3 metadata in device memory%s; %.1f s%s\n",
              only.empty() ? "" : " ", only.c_str(), tally.passed, tally.failed, tally.skipped,
              tally.split_cases, tally.caller_partials, tally.paged, tally.appended, tally.checked,
              tally.device_metadata, head_dims_text(tally).c_str(), elapsed(),
              tally.out_of_time ? " (stopped at KVFLASH_RUNNER_SECONDS)" : "");
  return tally.failed == 0 && tally.passed > 0 ? 0 : 1;
}

}  // namespace

int run_graph();    // graph_test.cpp
int run_combine();  // combine_test.cpp
int run_bench(const std::string& only);  // bench.cpp: "" for every case
int run_sm90_bench(const std::string& variant);  // sm90_bench.cpp
int run_bad_input();                     // reliability_test.cpp
int run_bitwise(int count);              // reliability_test.cpp
int run_streams(int count);              // reliability_test.cpp

}  // namespace kvflash::gpu_test

int main(int argc, char** argv) {
  using namespace kvflash::gpu_test;
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // a step killed by its timeout still leaves its lines
  const std::string mode = argc > 1 ? argv[1] : "random";
  if (mode == "random") {
    const int count = argc > 2 ? std::atoi(argv[2]) : 1000;
    const uint64_t seed = argc > 3 ? std::strtoull(argv[3], nullptr, 10) : 1;
    return run_random(count, seed, argc > 4 ? argv[4] : "");
  }
  if (mode == "graph") return run_graph();
  if (mode == "combine") return run_combine();
  if (mode == "bench") return run_bench(argc > 2 ? argv[2] : "");
  if (mode == "sm90bench") return run_sm90_bench(argc > 2 ? argv[2] : "");
  if (mode == "badinput") return run_bad_input();
  if (mode == "bitwise") return run_bitwise(argc > 2 ? std::atoi(argv[2]) : 200);
  if (mode == "streams") return run_streams(argc > 2 ? std::atoi(argv[2]) : 100);
  std::fprintf(stderr, "usage: %s random <count> [first_seed] [split|prefill|sm90|sm90fp8|mla|sm90mla|fp8] | graph | combine | bench [case] | sm90bench [small|paged] | badinput | bitwise [count] | streams [count]\n", argv[0]);
  return 2;
}
