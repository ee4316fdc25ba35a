// Issue 18 on the GPU: the malformed-call table (tests/cpp/bad_calls.h) on CUDA copies, and
// bitwise determinism / batch invariance of the CUDA backend.
//
//   kvflash_gpu_runner badinput   every refused case of the table, bf16 on the device: in checked
//                                 mode refused naming the same argument with every device byte
//                                 unchanged; in the default mode (device indices unread) refused
//                                 the same way or run (run.sh runs this under memcheck)
//   kvflash_gpu_runner bitwise N  N random cases run twice, bitwise equal out / LSE / caches; one
//                                 sequence in four batches with batch_invariant: bitwise equal
//   kvflash_gpu_runner streams N  N random cases from 4 host threads at once, each on its own
//                                 non-blocking stream, every thread running every case (so a case's
//                                 Plan is shared between threads): bitwise equal to the serial run
#include <cuda_runtime.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "cpp/bad_calls.h"
#include "cpp/sequence_batch.h"
#include "gpu/gpu_util.h"
#include "oracle/random_case.h"

namespace kvflash::gpu_test {
namespace {

using testing::BadCall;
using testing::Call;

// Device copies of every buffer a Call owns; views are translated by address, so aliasing and
// stride-0 views keep their meaning. CPU views become CUDA views and CUDA views CPU ones (the
// table's "another device").
class CallOnDevice {
 public:
  explicit CallOnDevice(const Call& c) {
    for (const std::vector<uint64_t>& b : c.buffers()) {
      Buffer d{reinterpret_cast<const char*>(b.data()), b.size() * 8, nullptr};
      check(cudaMalloc(&d.device, d.bytes), "cudaMalloc");
      check(cudaMemcpy(d.device, b.data(), d.bytes, cudaMemcpyHostToDevice), "upload");
      buffers_.push_back(d);
    }
  }
  ~CallOnDevice() {
    for (const Buffer& b : buffers_) cudaFree(b.device);
  }
  OptTensor view(const OptTensor& t) const { return t ? OptTensor(view(*t)) : std::nullopt; }
  TensorView view(const TensorView& t) const {
    TensorView d = t;
    const char* p = static_cast<const char*>(t.data);
    for (const Buffer& b : buffers_) {
      if (p >= b.host && p < b.host + b.bytes) d.data = b.device + (p - b.host);
    }
    if (t.device.type == DeviceType::cpu) d.device = {DeviceType::cuda, 0};
    else if (t.device.type == DeviceType::cuda) d.device = {DeviceType::cpu, 0};
    return d;
  }
  std::vector<std::vector<char>> contents() const {
    std::vector<std::vector<char>> all;
    for (const Buffer& b : buffers_) {
      std::vector<char>& bytes = all.emplace_back(b.bytes);
      check(cudaMemcpy(bytes.data(), b.device, b.bytes, cudaMemcpyDeviceToHost), "download");
    }
    return all;
  }

 private:
  struct Buffer {
    const char* host;
    size_t bytes;
    char* device;
  };
  std::vector<Buffer> buffers_;
};

// "" when the call ran, else the argument its error names.
std::string outcome(const BadCall& bad, bool checked, bool& untouched) {
  testing::CallDims dims = bad.dims;
  dims.dtype = DType::bf16;
  Call c(dims);
  c.fill_caches();
  bad.edit(c);
  const CallOnDevice d(c);
  KvCacheArgs args = with_tensors(c.args, [&](const OptTensor& t) { return d.view(t); });
  args.checked = checked;
  Outputs outputs;
  outputs.out = d.view(c.outputs.out);
  outputs.softmax_lse = d.view(c.outputs.softmax_lse);
  const auto before = d.contents();
  std::string named;
  try {
    flash_attn_with_kvcache(args, outputs);
  } catch (const Error& e) {
    named = e.argument().empty() ? "(none)" : e.argument();
  }
  check(cudaDeviceSynchronize(), bad.name);
  untouched = d.contents() == before;
  return named;
}

std::vector<char> bytes(const TensorView& t) {
  std::vector<char> host(span_bytes(t));
  if (!host.empty()) check(cudaMemcpy(host.data(), t.data, host.size(), cudaMemcpyDeviceToHost), "download");
  return host;
}

// Case c on the device, on `stream` (null: the legacy default stream): out, LSE and both caches
// afterwards, as bytes. The host case is only read (the call appends into the device copies), so
// several threads may run one case at once.
std::vector<std::vector<char>> run_case(const oracle::Case& c, cudaStream_t stream = nullptr) {
  DeviceMirror mirror;
  const KvCacheArgs dev = device_args(c.args, mirror);
  oracle::CaseOutputs host = oracle::allocate_outputs(output_spec(dev), false);
  Outputs out;
  out.out = mirror.upload(host.outputs.out);
  out.softmax_lse = mirror.upload(host.outputs.softmax_lse);
  // A pageable upload may still be in flight when cudaMemcpy returns, and a non-blocking stream
  // is not ordered after the legacy stream that carried it.
  check(cudaStreamSynchronize(cudaStreamLegacy), "uploads");
  RunOptions options;
  options.stream = stream;
  flash_attn_with_kvcache(dev, out, options);
  check(cudaStreamSynchronize(stream), "case");
  return {bytes(out.out), out.softmax_lse ? bytes(*out.softmax_lse) : std::vector<char>{},
          dev.k_cache ? bytes(*dev.k_cache) : std::vector<char>{}, bytes(*dev.v_cache)};
}

// The first `count` random cases this build runs on CUDA.
std::vector<oracle::Case> cuda_cases(int count) {
  std::vector<oracle::Case> cases;
  for (uint64_t seed = 1; int(cases.size()) < count && seed < uint64_t(20 * count); ++seed) {
    oracle::Case c = oracle::make_random_case(seed);
    if (cuda_supports(c.args)) cases.push_back(std::move(c));
  }
  return cases;
}

// The batch on the device; returns the bytes of element `at`'s out and LSE rows.
std::vector<char> run_batch(testing::SequenceBatch& batch, int at) {
  DeviceMirror mirror;
  const KvCacheArgs dev = device_args(batch.args, mirror);
  Outputs out;
  out.out = mirror.upload(batch.outputs.out);
  out.softmax_lse = mirror.upload(batch.outputs.softmax_lse);
  flash_attn_with_kvcache(dev, out);
  check(cudaDeviceSynchronize(), "batch");
  DeviceMirror::download(batch.outputs.out, out.out);
  DeviceMirror::download(*batch.outputs.softmax_lse, *out.softmax_lse);
  return batch.row_bytes(at);
}

// One sequence in testing::kBatches: 1 when its rows differ between batches, else 0.
int differs_across_batches(bool batch_invariant) {
  std::vector<char> alone;
  for (size_t i = 0; i < testing::kBatches.size(); ++i) {
    testing::SequenceBatch batch(testing::kBatches[i], DType::bf16);
    batch.args.batch_invariant = batch_invariant;
    const std::vector<char> rows = run_batch(batch, testing::kPositions[i]);
    if (i == 0) alone = rows;
    else if (rows != alone) return 1;
  }
  return 0;
}

}  // namespace

// Random cases twice (bitwise equal), then batch invariance.
int run_bitwise(int count) {
  int compared = 0, failed = 0;
  for (oracle::Case& c : cuda_cases(count)) {
    try {
      if (run_case(c) != run_case(c)) {
        ++failed;
        std::printf("FAIL bitwise: %s differs between two runs\n", oracle::describe(c).c_str());
      }
      ++compared;
    } catch (const Error& e) {
      std::printf("skip %s: %s\n", oracle::describe(c).c_str(), e.what());
    }
  }
  const int invariant_differs = differs_across_batches(true);
  const int default_differs = differs_across_batches(false);
  std::printf("bitwise: %d random cases run twice, %d differ; batch_invariant: one sequence in %zu "
              "batches %s; default mode: %s\n", compared, failed, testing::kBatches.size(),
              invariant_differs ? "DIFFERS" : "bitwise equal",
              default_differs ? "differs (as expected: splits follow the batch)" : "equal here");
  return failed == 0 && invariant_differs == 0 && compared > 0 ? 0 : 1;
}

// The cases serially, then from kThreads threads at once on their own streams, each thread
// running every case from its own starting point: the results must not change.
int run_streams(int count) {
  constexpr int kThreads = 4;
  std::vector<oracle::Case> cases = cuda_cases(count);
  std::vector<std::vector<std::vector<char>>> serial;
  std::vector<bool> runs;  // refused cases (a clear error) are left out of both runs
  for (oracle::Case& c : cases) {
    try {
      serial.push_back(run_case(c));
      runs.push_back(true);
    } catch (const Error&) {
      serial.emplace_back();
      runs.push_back(false);
    }
  }
  std::atomic<int> compared{0}, failed{0};
  const auto worker = [&](int t) {
    cudaStream_t stream = nullptr;
    check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    for (size_t k = 0; k < cases.size(); ++k) {
      const size_t i = (k + size_t(t) * cases.size() / kThreads) % cases.size();
      if (!runs[i]) continue;
      if (run_case(cases[i], stream) != serial[i]) {
        ++failed;
        std::printf("FAIL streams: thread %d, %s differs from the serial run\n", t,
                    oracle::describe(cases[i]).c_str());
      }
      ++compared;
    }
    check(cudaStreamDestroy(stream), "cudaStreamDestroy");
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) threads.emplace_back(worker, t);
  for (std::thread& thread : threads) thread.join();
  std::printf("streams: %zu random cases x %d threads on their own streams (%d runs), %d differ from "
              "the serial run\n", cases.size(), kThreads, compared.load(), failed.load());
  return failed == 0 && compared > 0 ? 0 : 1;
}

int run_bad_input() {
  int refused = 0, ran_unchecked = 0, failed = 0;
  for (const BadCall& bad : testing::bad_calls()) {
    if (bad.argument == nullptr) continue;  // valid cases compare float32 results: the CPU suite
    for (bool checked : {true, false}) {
      bool untouched = false;
      const std::string named = outcome(bad, checked, untouched);
      const bool same_refusal = named == bad.argument && untouched;
      if (same_refusal) {
        ++refused;
      } else if (!checked && named.empty()) {
        ++ran_unchecked;  // device indices are only read in checked mode; memcheck judges the run
      } else {
        ++failed;
        std::printf("FAIL %s (%s mode): %s, device bytes %s\n", bad.name, checked ? "checked" : "default",
                    named.empty() ? "ran" : ("refused naming " + named).c_str(),
                    untouched ? "unchanged" : "CHANGED");
      }
    }
  }
  std::printf("badinput: %d refusals with every device byte unchanged, %d default-mode runs of "
              "calls with bad device indices, %d failed\n", refused, ran_unchecked, failed);
  return failed == 0 ? 0 : 1;
}

}  // namespace kvflash::gpu_test
