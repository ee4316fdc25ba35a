// `kvflash run`: a serving-shaped workload end to end. A batch of prompts is prefilled into a
// paged cache (one varlen causal call appending K/V with rotary), then every sequence decodes
// token by token (one call per step appending one K/V row with rotary). Sampled calls are checked
// against the float64 oracle; the summary gives per-phase time, tokens/s, K/V GB/s and TFLOP/s.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>

#include "about.h"
#include "commands.h"
#include "device.h"
#include "host_tensor.h"
#include "kvflash/kvflash.h"
#include "options.h"
#include "progress.h"
#include "verify.h"
#include "workload.h"

namespace kvflash::tools {

namespace {

using Clock = std::chrono::steady_clock;

struct RunConfig {
  int64_t batch = 8;
  std::pair<int64_t, int64_t> prompt_len{512, 2048};
  int64_t decode_steps = 128;
  AttentionShape shape;
  int64_t page_size = 16;
  int threads = 0;
  std::string device = "auto";
  uint64_t seed = 0;
  int64_t verify_every = 16;     // 0: no verification
  int64_t verify_sequences = 4;  // sequences checked per verified call
  int64_t verify_rows = 4;       // prefill query rows checked per sequence
  bool json = false;             // the summary as one JSON object on stdout instead of text
};

void add_run_flags(CLI::App& command, RunConfig& c, std::string& dtype) {
  command.add_option("--batch", c.batch, "sequences")->check(CLI::Range(1, 1 << 16))->capture_default_str();
  add_integer_range(command, "--prompt-len", c.prompt_len, 1, 1 << 20, "prompt lengths, drawn uniformly [512-2048]");
  command.add_option("--decode-steps", c.decode_steps, "tokens decoded per sequence")
      ->check(CLI::Range(0, 1 << 20))->capture_default_str();
  command.add_option("--heads", c.shape.heads, "query heads")->check(CLI::Range(1, 1024))->capture_default_str();
  command.add_option("--kv-heads", c.shape.kv_heads, "KV heads")->check(CLI::Range(1, 1024))->capture_default_str();
  command.add_option("--head-dim", c.shape.head_dim, "head dim")->check(CLI::Range(8, 512))->capture_default_str();
  command.add_option("--page-size", c.page_size, "cache page size")->check(CLI::Range(1, 1 << 16))
      ->capture_default_str();
  command.add_option("--dtype", dtype, "bf16, fp16 or fp32")->check(CLI::IsMember({"bf16", "fp16", "fp32"}))
      ->capture_default_str();
  command.add_option("--threads", c.threads, "CPU threads (0: all)")->check(CLI::Range(0, 4096))->capture_default_str();
  add_device(command, c.device);
  command.add_option("--seed", c.seed, "data seed")->capture_default_str();
  command.add_option("--verify-every", c.verify_every, "check every n-th decode step against the oracle (0: off)")
      ->check(CLI::Range(0, 1 << 20))->capture_default_str();
  command.add_option("--verify-sequences", c.verify_sequences, "sequences checked per verified call")
      ->check(CLI::Range(1, 1 << 16))->capture_default_str();
  command.add_option("--verify-rows", c.verify_rows, "prefill query rows checked per sequence")
      ->check(CLI::Range(1, 1 << 16))->capture_default_str();
  command.add_flag("--json", c.json, "the summary as one JSON object on stdout");
}

// Serving calls ask for the attention output only (no LSE), as a decoder layer does.
Outputs out_only(const DeviceTensor& out) {
  Outputs outputs;
  outputs.out = out.view();
  return outputs;
}

struct PhaseStats {
  double seconds = 0;
  int64_t tokens = 0;
  AttentionWork work;
};

class ServingRun {
 public:
  ServingRun(const RunConfig& config, DeviceMemory& memory)
      : config_(config), memory_(memory), rng_(config.seed), sample_rng_(config.seed + 1) {
    options_.num_threads = config.threads;
    options_.stream = memory.stream();
    std::uniform_int_distribution<int64_t> prompt(config.prompt_len.first, config.prompt_len.second);
    for (int64_t b = 0; b < config.batch; ++b) prompts_.push_back(prompt(rng_));
    const int64_t capacity = *std::max_element(prompts_.begin(), prompts_.end()) + config.decode_steps;
    layout_ = make_paged_layout(config.batch, capacity, config.page_size, rng_);
    const AttentionShape& s = config.shape;
    k_cache_ = DeviceTensor(memory, s.dtype, {layout_.num_pages, config.page_size, s.kv_heads, s.head_dim});
    v_cache_ = DeviceTensor(memory, s.dtype, {layout_.num_pages, config.page_size, s.kv_heads, s.head_dim_v});
    page_table_ = to_device(memory, layout_.page_table());
    // Rotary over the whole head dim, NeoX pairs (Llama-style); seqlen_ro covers the capacity.
    cos_host_ = HostTensor(s.dtype, {layout_.pages_per_seq * config.page_size, s.head_dim / 2});
    sin_host_ = HostTensor(s.dtype, cos_host_.shape());
    fill_rotary_tables(cos_host_, sin_host_);
    cos_ = to_device(memory, cos_host_);
    sin_ = to_device(memory, sin_host_);
    lengths_.assign(size_t(config.batch), 0);
  }

  void prefill();
  void decode();
  void print_summary() const;
  bool verification_ok() const { return verification_.ok(); }
  void print_verification() const;
  nlohmann::json summary_json() const;  // the phases and the verification, as --json prints them

 private:
  KvCacheArgs base_args() const;
  double timed_call(const KvCacheArgs& args, const Outputs& outputs);
  HostTensor random_tensor(std::vector<int64_t> shape);
  std::vector<int64_t> sampled_sequences();
  void verify(const ServingCallHost& call, const std::vector<SequenceSlice>& slices);

  RunConfig config_;
  DeviceMemory& memory_;
  std::mt19937_64 rng_;
  std::mt19937_64 sample_rng_;  // which sequences are verified: the data does not depend on it
  RunOptions options_;
  std::vector<int64_t> prompts_;
  std::vector<int64_t> lengths_;  // tokens in the cache per sequence
  PagedLayout layout_;
  DeviceTensor k_cache_, v_cache_, page_table_, cos_, sin_;
  HostTensor cos_host_, sin_host_;
  PhaseStats prefill_, decode_;
  Verification verification_;
  int64_t verified_calls_ = 0;
};

KvCacheArgs ServingRun::base_args() const {
  KvCacheArgs args;
  args.k_cache = k_cache_.view();
  args.v_cache = v_cache_.view();
  args.page_table = page_table_.view();
  args.rotary_cos = cos_.view();
  args.rotary_sin = sin_.view();
  args.rotary_interleaved = false;
  args.causal = true;
  return args;
}

double ServingRun::timed_call(const KvCacheArgs& args, const Outputs& outputs) {
  memory_.synchronize();
  const auto start = Clock::now();
  flash_attn_with_kvcache(args, outputs, options_);
  memory_.synchronize();
  return std::chrono::duration<double>(Clock::now() - start).count();
}

HostTensor ServingRun::random_tensor(std::vector<int64_t> shape) {
  HostTensor t(config_.shape.dtype, std::move(shape));
  t.fill_uniform(rng_, 1.0);
  return t;
}

std::vector<int64_t> ServingRun::sampled_sequences() {
  std::vector<int64_t> all(size_t(config_.batch));
  std::iota(all.begin(), all.end(), 0);
  std::shuffle(all.begin(), all.end(), sample_rng_);
  all.resize(size_t(std::min<int64_t>(config_.verify_sequences, config_.batch)));
  return all;
}

void ServingRun::verify(const ServingCallHost& call, const std::vector<SequenceSlice>& slices) {
  const bool cpu = memory_.device().type == DeviceType::cpu;
  for (const SequenceSlice& slice : slices) verification_.merge(verify_sequence(call, slice, cpu));
  ++verified_calls_;
}

void ServingRun::prefill() {
  const AttentionShape& s = config_.shape;
  std::vector<int32_t> cu_seqlens{0};
  for (int64_t p : prompts_) cu_seqlens.push_back(cu_seqlens.back() + int32_t(p));
  const int64_t total = cu_seqlens.back();
  std::fprintf(stderr, "prefill: %lld prompts, %lld tokens...\n", (long long)config_.batch,
               (long long)total);
  const HostTensor q = random_tensor({total, s.heads, s.head_dim});
  const HostTensor k = random_tensor({total, s.kv_heads, s.head_dim});
  const HostTensor v = random_tensor({total, s.kv_heads, s.head_dim_v});
  DeviceTensor q_dev = to_device(memory_, q), k_dev = to_device(memory_, k), v_dev = to_device(memory_, v);
  DeviceTensor cu_dev = to_device(memory_, int32_tensor(cu_seqlens));
  DeviceTensor seqlens_dev = to_device(memory_, int32_tensor(std::vector<int32_t>(size_t(config_.batch), 0)));
  DeviceTensor out(memory_, s.dtype, {total, s.heads, s.head_dim_v});

  KvCacheArgs args = base_args();
  args.q = q_dev.view();
  args.k = k_dev.view();
  args.v = v_dev.view();
  args.cu_seqlens_q = cu_dev.view();
  args.cu_seqlens_k_new = cu_dev.view();
  args.max_seqlen_q = int(*std::max_element(prompts_.begin(), prompts_.end()));
  args.cache_seqlens = seqlens_dev.view();
  prefill_.seconds = timed_call(args, out_only(out));
  prefill_.tokens = total;
  for (int64_t b = 0; b < config_.batch; ++b) {
    prefill_.work += attention_work(s, prompts_[b], prompts_[b], true);
    lengths_[size_t(b)] = prompts_[b];
  }
  if (config_.verify_every == 0) return;

  const HostTensor k_cache = k_cache_.download(), v_cache = v_cache_.download();
  const HostTensor out_host = out.download();
  ServingCallHost call{&q, &k, &v, &k_cache, &v_cache, &k_cache, &v_cache, &out_host,
                       &cos_host_, &sin_host_, false, true};
  std::vector<SequenceSlice> slices;
  for (int64_t b : sampled_sequences()) {
    const int64_t first = cu_seqlens[size_t(b)], length = prompts_[b];
    const std::vector<int32_t>& pages = layout_.pages[size_t(b)];
    // Every appended row of the prompt (the query row is a stand-in, its output unchecked).
    slices.push_back({first, 1, first, length, 0, pages, false});
    // The last query rows, attending over the rows the backend wrote before them.
    const int64_t rows = std::min(config_.verify_rows, length);
    slices.push_back({first + length - rows, rows, first + length - rows, rows, length - rows, pages, true});
  }
  verify(call, slices);
}

void ServingRun::decode() {
  const AttentionShape& s = config_.shape;
  const int64_t batch = config_.batch;
  DeviceTensor q_dev(memory_, s.dtype, {batch, 1, s.heads, s.head_dim});
  DeviceTensor k_dev(memory_, s.dtype, {batch, 1, s.kv_heads, s.head_dim});
  DeviceTensor v_dev(memory_, s.dtype, {batch, 1, s.kv_heads, s.head_dim_v});
  DeviceTensor seqlens_dev(memory_, DType::i32, {batch});
  DeviceTensor out(memory_, s.dtype, {batch, 1, s.heads, s.head_dim_v});
  KvCacheArgs args = base_args();
  args.q = q_dev.view();
  args.k = k_dev.view();
  args.v = v_dev.view();
  args.cache_seqlens = seqlens_dev.view();

  Progress progress("decode", config_.decode_steps);
  for (int64_t step = 0; step < config_.decode_steps; ++step) {
    // (batch, 1, heads, dim): token b of the step is row b, as verify_sequence() indexes it.
    const HostTensor q = random_tensor({batch, 1, s.heads, s.head_dim});
    const HostTensor k = random_tensor({batch, 1, s.kv_heads, s.head_dim});
    const HostTensor v = random_tensor({batch, 1, s.kv_heads, s.head_dim_v});
    std::vector<int32_t> seqlens(lengths_.begin(), lengths_.end());
    q_dev.upload(q);
    k_dev.upload(k);
    v_dev.upload(v);
    seqlens_dev.upload(int32_tensor(seqlens));

    const bool verify_step = config_.verify_every > 0 &&
                             (step % config_.verify_every == 0 || step + 1 == config_.decode_steps);
    HostTensor k_before, v_before;
    if (verify_step) k_before = k_cache_.download(), v_before = v_cache_.download();

    decode_.seconds += timed_call(args, out_only(out));
    decode_.tokens += batch;
    for (int64_t b = 0; b < batch; ++b) decode_.work += attention_work(s, 1, lengths_[size_t(b)] + 1, true);

    if (verify_step) {
      const HostTensor k_after = k_cache_.download(), v_after = v_cache_.download();
      const HostTensor out_host = out.download();
      ServingCallHost call{&q, &k, &v, &k_before, &v_before, &k_after, &v_after, &out_host,
                           &cos_host_, &sin_host_, false, true};
      std::vector<SequenceSlice> slices;
      for (int64_t b : sampled_sequences()) {
        slices.push_back({b, 1, b, 1, lengths_[size_t(b)], layout_.pages[size_t(b)], true});
      }
      verify(call, slices);
    }
    for (int64_t& length : lengths_) ++length;
    progress.update(step + 1);
  }
}

struct PhaseRates {
  double tokens_per_s, kv_gbs, tflops;
};
PhaseRates rates(const PhaseStats& p) {
  const double seconds = std::max(p.seconds, 1e-12);
  return {double(p.tokens) / seconds, p.work.kv_bytes / seconds * 1e-9, p.work.flops / seconds * 1e-12};
}

void print_phase(const char* name, const PhaseStats& p) {
  const PhaseRates r = rates(p);
  std::printf("%-8s %10lld %10.3f %12.1f %10.2f %10.4f\n", name, (long long)p.tokens, p.seconds, r.tokens_per_s,
              r.kv_gbs, r.tflops);
}

nlohmann::json phase_json(const PhaseStats& p) {
  const PhaseRates r = rates(p);
  return {{"tokens", p.tokens}, {"time_s", p.seconds}, {"tokens_per_s", r.tokens_per_s},
          {"kv_gbs", r.kv_gbs}, {"tflops", r.tflops}};
}

void ServingRun::print_summary() const {
  std::printf("%-8s %10s %10s %12s %10s %10s\n", "phase", "tokens", "time_s", "tokens/s",
              "KV_GB/s", "TFLOP/s");
  print_phase("prefill", prefill_);
  if (config_.decode_steps > 0) print_phase("decode", decode_);
}

void ServingRun::print_verification() const {
  if (config_.verify_every == 0) {
    std::printf("verify: off (--verify-every 0)\n");
    return;
  }
  std::printf("verify: %lld calls, %lld values against the float64 oracle: max |out err| %.3g, "
              "worst %.2f of tolerance: %s\n",
              (long long)verified_calls_, (long long)verification_.checked_values,
              verification_.max_abs_error, verification_.worst_ratio,
              verification_.ok() ? "PASS" : "FAIL");
  if (!verification_.ok()) {
    std::printf("verify: %lld values out of tolerance; first: %s\n",
                (long long)verification_.failures, verification_.first_failure.c_str());
  }
}

nlohmann::json ServingRun::summary_json() const {
  nlohmann::json summary = {{"prefill", phase_json(prefill_)}};
  if (config_.decode_steps > 0) summary["decode"] = phase_json(decode_);
  if (config_.verify_every > 0) {
    summary["verify"] = {{"calls", verified_calls_},
                         {"values", verification_.checked_values},
                         {"max_abs_error", verification_.max_abs_error},
                         {"worst_of_tolerance", verification_.worst_ratio},
                         {"failures", verification_.failures},
                         {"first_failure", verification_.first_failure},
                         {"ok", verification_.ok()}};
  }
  return summary;
}

int run(const RunConfig& config, const std::string& command_line) {
  std::unique_ptr<DeviceMemory> memory = make_device_memory(config.device, config.threads);
  const AttentionShape& s = config.shape;
  // With --json the description goes to stderr (beside the progress bars): stdout is the JSON.
  std::fprintf(config.json ? stderr : stdout,
               "kvflash run: %s | batch %lld, prompts %lld-%lld, %lld decode steps | %lld/%lld "
               "heads, head dim %lld, page %lld, %s, causal, rotary | seed %llu\n",
               memory->description().c_str(), (long long)config.batch, (long long)config.prompt_len.first,
               (long long)config.prompt_len.second, (long long)config.decode_steps, (long long)s.heads,
               (long long)s.kv_heads, (long long)s.head_dim, (long long)config.page_size,
               short_dtype_name(s.dtype), (unsigned long long)config.seed);
  std::fflush(stdout);
  ServingRun serving(config, *memory);
  serving.prefill();
  serving.decode();
  if (config.json) {
    nlohmann::json summary = serving.summary_json();
    summary["provenance"] = provenance(memory->description(), command_line);
    std::printf("%s\n", summary.dump(2).c_str());
  } else {
    serving.print_summary();
    serving.print_verification();
  }
  return serving.verification_ok() ? 0 : 1;
}

}  // namespace

void add_run_command(CLI::App& app, CommandContext& context) {
  auto config = std::make_shared<RunConfig>();
  auto dtype = std::make_shared<std::string>("bf16");
  CLI::App* command = app.add_subcommand(
      "run", "a serving-shaped workload: prefill a batch of prompts into a paged KV cache, then decode token "
             "by token; sampled calls are verified against the float64 oracle");
  add_run_flags(*command, *config, *dtype);
  command->callback([config, dtype, &context] {
    config->shape.dtype = parse_dtype(*dtype);
    config->shape.head_dim_v = config->shape.head_dim;
    if (config->shape.heads % config->shape.kv_heads != 0) throw UsageError{"--heads must be a multiple of --kv-heads"};
    context.status = run(*config, context.command_line);
  });
}

}  // namespace kvflash::tools
