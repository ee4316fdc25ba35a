// `kvflash bench`: decode (batch x context) and prefill (prompts x length) sweeps, timed as the
// median of repeats after warm-up, beside the device's ceilings measured in the same run: decode
// rows report K/V GB/s and % of the memory bandwidth ceiling, prefill rows GFLOP/s and % of the
// matrix-product ceiling. Each call has its Plan and workspace made beforehand (as an engine's
// per-batch scheduler metadata); on CUDA a pass over the layers is one replayed CUDA graph.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <thread>

#include "about.h"
#include "commands.h"
#include "device.h"
#include "kvflash/kvflash.h"
#include "options.h"
#include "workload.h"

namespace kvflash::tools {

namespace {

using Clock = std::chrono::steady_clock;

struct BenchConfig {
  std::vector<int64_t> batches{1, 8, 16};
  std::vector<int64_t> contexts{1024, 4096, 16384};
  std::vector<int64_t> prefill_lengths{512, 2048, 4096};
  int64_t prefill_batch = 1;  // prompts per prefill call (batch x length)
  std::vector<DType> dtypes{DType::bf16, DType::f16};
  AttentionShape shape;
  int64_t page_size = 16;
  int num_splits = 0;  // the call's num_splits: 0 = the planner's heuristic
  bool causal = true;  // prefill rows: causal (bottom-right) or every key visible
  int threads = 0;
  std::string device = "auto";
  int repeats = 7;
  int warmup = 2;
  int64_t min_working_set_mib = 1024;  // decode rows cycle through this many MiB
  int64_t bandwidth_mib = 3072;
  bool quick = false;
  bool eager = false;  // also time each row's calls eagerly: host work = eager - graph replay
  std::string format = "csv";
  std::string out_path;
};

// Flags bound to `c`; --quick's smaller grid applies after parsing, to the flags not given.
void add_bench_flags(CLI::App& command, BenchConfig& c, std::string& format) {
  add_integer_list(command, "--batch", c.batches, "decode batch sizes [1,8,16]");
  add_integer_list(command, "--context", c.contexts, "decode context lengths [1024,4096,16384]");
  add_integer_list(command, "--prefill", c.prefill_lengths, "prefill lengths [512,2048,4096] (none: no prefill rows)");
  command.add_option("--prefill-batch", c.prefill_batch, "prompts per prefill row")
      ->check(CLI::Range(1, 4096))->capture_default_str();
  add_dtype_list(command, "--dtype", c.dtypes, "dtypes [bf16,fp16]");
  command.add_option("--heads", c.shape.heads, "query heads")->check(CLI::Range(1, 1024))->capture_default_str();
  command.add_option("--kv-heads", c.shape.kv_heads, "KV heads")->check(CLI::Range(1, 1024))->capture_default_str();
  command.add_option("--head-dim", c.shape.head_dim, "head dim")->check(CLI::Range(8, 512))->capture_default_str();
  command.add_option("--page-size", c.page_size, "cache page size (0: a dense cache)")
      ->check(CLI::Range(0, 1 << 16))->capture_default_str();
  command.add_option("--threads", c.threads, "CPU threads (0: all)")->check(CLI::Range(0, 4096))->capture_default_str();
  command.add_option("--num-splits", c.num_splits, "the calls' num_splits (0: the planner's heuristic)")
      ->check(CLI::Range(0, 256))->capture_default_str();
  command.add_flag("--non-causal{false}", c.causal, "prefill rows see every key (default: causal)");
  add_device(command, c.device);
  command.add_option("--repeats", c.repeats, "timed passes per row (the median is reported)")
      ->check(CLI::Range(1, 1000))->capture_default_str();
  command.add_option("--warmup", c.warmup, "untimed passes first")->check(CLI::Range(0, 1000))->capture_default_str();
  command.add_option("--min-working-set-mib", c.min_working_set_mib, "decode rows cycle through this much K/V")
      ->check(CLI::Range(0, 1 << 20))->capture_default_str();
  command.add_option("--bandwidth-mib", c.bandwidth_mib, "buffer of the memory ceiling")
      ->check(CLI::Range(16, 1 << 20))->capture_default_str();
  command.add_option("--format", format, "csv or json (default: json when --out ends in .json)")
      ->check(CLI::IsMember({"csv", "json"}));
  command.add_option("--out", c.out_path, "write the rows to this file");
  command.add_flag("--quick", c.quick, "a small grid, for a smoke test (flags given still apply)");
  command.add_flag("--eager", c.eager,
                   "also time the calls enqueued eagerly; host_us = eager - graph-replay time per call (CUDA)");
}

void finish_bench_config(const CLI::App& command, BenchConfig& c, const std::string& format) {
  const auto given = [&](const char* name) { return command.count(name) > 0; };
  if (c.quick) {
    if (!given("--batch")) c.batches = {1, 8};
    if (!given("--context")) c.contexts = {512, 4096};
    if (!given("--prefill")) c.prefill_lengths = {256, 1024};
    if (!given("--dtype")) c.dtypes = {DType::bf16};
    if (!given("--repeats")) c.repeats = 3;
    if (!given("--warmup")) c.warmup = 1;
    if (!given("--min-working-set-mib")) c.min_working_set_mib = 256;
    if (!given("--bandwidth-mib")) c.bandwidth_mib = 1024;
  }
  c.shape.head_dim_v = c.shape.head_dim;
  const bool json_path = c.out_path.size() > 5 && c.out_path.substr(c.out_path.size() - 5) == ".json";
  c.format = !format.empty() ? format : json_path ? "json" : "csv";
  if (c.shape.heads % c.shape.kv_heads != 0) throw UsageError{"--heads must be a multiple of --kv-heads"};
}

struct BenchRow {
  std::string kind;  // "decode" or "prefill"
  DType dtype = DType::bf16;
  int64_t batch = 0, seqlen_q = 0, context = 0, layers = 1;
  double median_ms = 0, min_ms = 0;
  double gbs = 0, pct_bandwidth = 0, gflops = 0, pct_matmul = 0;
  double eager_ms = std::nan(""), host_us = std::nan("");  // --eager only
};

// The 1-minute load average: figures taken on a busy machine say so.
double load_average() {
  double load = -1;
  if (std::FILE* f = std::fopen("/proc/loadavg", "r")) {
    if (std::fscanf(f, "%lf", &load) != 1) load = -1;
    std::fclose(f);
  }
  return load;
}

struct Ceilings : DeviceCeilings {
  double load_before = -1;  // 1-minute load average when the run began
};

// One cache's worth of tensors for a call that only attends (no new K/V), paged or (no page
// table) dense with one "page" of `context` rows per sequence: the cache pages are
// filled with a repeating random block (what they hold does not change the speed; filling
// gigabytes element by element would).
class AttendOnlyCall {
 public:
  AttendOnlyCall(DeviceMemory& memory, const AttentionShape& s, int64_t batch, int64_t seqlen_q,
                 int64_t context, const PagedLayout& layout, const HostTensor* page_table,
                 int num_splits, bool causal, std::mt19937_64& rng) {
    k_cache_ = DeviceTensor(memory, s.dtype, {layout.num_pages, layout.page_size, s.kv_heads, s.head_dim});
    v_cache_ = DeviceTensor(memory, s.dtype, {layout.num_pages, layout.page_size, s.kv_heads, s.head_dim_v});
    fill_repeating(memory, k_cache_, rng);
    fill_repeating(memory, v_cache_, rng);
    HostTensor q(s.dtype, {batch, seqlen_q, s.heads, s.head_dim});
    q.fill_uniform(rng, 1.0);
    q_ = to_device(memory, q);
    if (page_table) page_table_ = to_device(memory, *page_table);
    seqlens_ = to_device(memory, int32_tensor(std::vector<int32_t>(size_t(batch), int32_t(context))));
    // FA3's all-fp8 call writes bf16 (contract 5.8).
    out_ = DeviceTensor(memory, s.dtype == DType::e4m3 ? DType::bf16 : s.dtype, {batch, seqlen_q, s.heads, s.head_dim_v});
    args_.q = q_.view();
    args_.k_cache = k_cache_.view();
    args_.v_cache = v_cache_.view();
    if (page_table) args_.page_table = page_table_.view();
    args_.cache_seqlens = seqlens_.view();
    args_.causal = causal;
    args_.num_splits = num_splits;
    outputs_.out = out_.view();
    plan_ = make_plan(args_);
    args_.plan = &plan_;
    // Workspace in 4-byte words (the fp32 split partials need no more alignment than cudaMalloc gives).
    const int64_t words = int64_t((workspace_size(args_, plan_) + 3) / 4);
    workspace_ = DeviceTensor(memory, DType::i32, {std::max<int64_t>(words, 1)});
  }
  AttendOnlyCall(const AttendOnlyCall&) = delete;  // args_ points at plan_
  AttendOnlyCall& operator=(const AttendOnlyCall&) = delete;

  void run(RunOptions options) const {
    options.workspace = Workspace{workspace_.data(), workspace_.bytes()};
    flash_attn_with_kvcache(args_, outputs_, options);
  }

 private:
  static void fill_repeating(DeviceMemory& memory, DeviceTensor& t, std::mt19937_64& rng) {
    HostTensor block(t.dtype(), {int64_t(1) << 18});
    block.fill_uniform(rng, 1.0);
    auto* base = static_cast<unsigned char*>(t.data());
    for (size_t offset = 0; offset < t.bytes(); offset += block.bytes()) {
      memory.upload(base + offset, block.data(), std::min(block.bytes(), t.bytes() - offset));
    }
  }
  DeviceTensor k_cache_, v_cache_, q_, page_table_, seqlens_, out_, workspace_;
  KvCacheArgs args_;
  Outputs outputs_;
  Plan plan_;
};

// Median and minimum of per-call milliseconds over `repeats` passes (after `warmup` passes) of
// every call in `calls`, one after the other as the layers of a model would run; replayed as a
// graph on CUDA, or enqueued eagerly.
std::pair<double, double> time_calls(DeviceMemory& memory, const std::vector<std::unique_ptr<AttendOnlyCall>>& calls,
                                     const RunOptions& options, int warmup, int repeats, bool eager = false) {
  const auto pass = [&] { for (const auto& call : calls) call->run(options); };
  std::vector<double> per_call_ms =
      eager ? memory.time_eager_passes(pass, warmup, repeats) : memory.time_passes(pass, warmup, repeats);
  for (double& ms : per_call_ms) ms /= double(calls.size());
  std::sort(per_call_ms.begin(), per_call_ms.end());
  return {per_call_ms[per_call_ms.size() / 2], per_call_ms.front()};
}

BenchRow bench_shape(DeviceMemory& memory, const BenchConfig& config, DType dtype, int64_t batch,
                     int64_t seqlen_q, int64_t context, int64_t min_working_set,
                     const Ceilings& ceilings, std::mt19937_64& rng) {
  AttentionShape shape = config.shape;
  shape.dtype = dtype;
  const bool dense = config.page_size == 0;
  const PagedLayout layout = dense ? PagedLayout{context, 1, batch, {}}
                                   : make_paged_layout(batch, context, config.page_size, rng);
  std::optional<HostTensor> page_table;
  if (!dense) page_table = layout.page_table();
  AttentionWork work;
  for (int64_t b = 0; b < batch; ++b) work += attention_work(shape, seqlen_q, context, config.causal);
  // Enough independent caches ("layers") that one pass reads min_working_set bytes: a model's
  // layers each have their own cache, so decode streams from memory, not from the last level cache.
  const int64_t layers = std::max<int64_t>(1, int64_t(std::ceil(double(min_working_set) / work.kv_bytes)));
  std::vector<std::unique_ptr<AttendOnlyCall>> calls;
  for (int64_t l = 0; l < layers; ++l) {
    calls.push_back(std::make_unique<AttendOnlyCall>(memory, shape, batch, seqlen_q, context, layout,
                                                     page_table ? &*page_table : nullptr, config.num_splits, config.causal, rng));
  }
  RunOptions options;
  options.num_threads = config.threads;
  options.stream = memory.stream();
  // Long rows (prefill at long lengths) get fewer repeats: one untimed pass tells how long.
  const auto probe_start = Clock::now();
  calls.front()->run(options);
  memory.synchronize();
  const double probe_s = std::chrono::duration<double>(Clock::now() - probe_start).count();
  const int repeats = probe_s * double(layers) > 2.0 ? std::min(config.repeats, 3) : config.repeats;
  const int warmup = probe_s * double(layers) > 2.0 ? 0 : config.warmup;
  const auto [median_ms, min_ms] = time_calls(memory, calls, options, warmup, repeats);
  double eager_ms = std::nan("");
  // On the CPU every pass is already eager: nothing to compare.
  if (config.eager && memory.device().type == DeviceType::cuda) {
    eager_ms = time_calls(memory, calls, options, warmup, repeats, /*eager=*/true).first;
  }

  BenchRow row;
  row.kind = seqlen_q == 1 ? "decode" : "prefill";
  row.dtype = dtype;
  row.batch = batch;
  row.seqlen_q = seqlen_q;
  row.context = context;
  row.layers = layers;
  row.median_ms = median_ms;
  row.min_ms = min_ms;
  row.gbs = work.kv_bytes / (median_ms * 1e-3) * 1e-9;
  row.gflops = work.flops / (median_ms * 1e-3) * 1e-9;
  row.pct_bandwidth = 100.0 * row.gbs / ceilings.bandwidth_gbs;
  row.pct_matmul = 100.0 * row.gflops / ceilings.matmul_gflops;
  row.eager_ms = eager_ms;
  row.host_us = (eager_ms - median_ms) * 1e3;
  return row;
}

std::string percent(double value, bool applies) {
  if (!applies) return "-";
  char text[32];
  std::snprintf(text, sizeof text, "%.1f", value);
  return text;
}

void print_table(const std::vector<BenchRow>& rows, const Ceilings& ceilings, bool eager) {
  std::printf("%-8s %-5s %6s %7s %8s %7s %10s %10s %9s %7s %9s %7s%s\n", "kind", "dtype", "batch",
              "seq_q", "context", "layers", "median_ms", "min_ms", "KV_GB/s", "%bw", "GFLOP/s",
              "%matmul", eager ? "   eager_ms  host_us" : "");
  for (const BenchRow& r : rows) {
    const bool decode = r.kind == "decode";
    std::printf("%-8s %-5s %6lld %7lld %8lld %7lld %10.3f %10.3f %9.2f %7s %9.1f %7s",
                r.kind.c_str(), short_dtype_name(r.dtype), (long long)r.batch,
                (long long)r.seqlen_q, (long long)r.context, (long long)r.layers, r.median_ms,
                r.min_ms, r.gbs, percent(r.pct_bandwidth, decode).c_str(), r.gflops,
                percent(r.pct_matmul, !decode).c_str());
    if (eager) std::printf(" %10.3f %8.1f", r.eager_ms, r.host_us);
    std::printf("\n");
  }
  std::printf("ceilings: %.2f GB/s (%s), %.1f GFLOP/s (%s)\n", ceilings.bandwidth_gbs,
              ceilings.bandwidth_what.c_str(), ceilings.matmul_gflops, ceilings.matmul_what.c_str());
}

// A CSV field: quoted, inner quotes doubled.
std::string csv_quoted(const std::string& text) {
  std::string quoted = "\"";
  for (char ch : text) quoted += ch == '"' ? std::string("\"\"") : std::string(1, ch);
  return quoted + "\"";
}

// One line per row; what produced them (version, commit, CPU, device, command) in every line's
// last columns so that a row copied elsewhere keeps them.
void write_csv(std::ostream& out, const std::vector<BenchRow>& rows, const BenchConfig& c,
               const Ceilings& ceilings, const nlohmann::json& about) {
  out << "kind,dtype,batch,seqlen_q,context,heads,kv_heads,head_dim,page_size,layers,median_ms,"
         "min_ms,kv_gbs,pct_bandwidth,gflops,pct_matmul,eager_ms,host_us,ceiling_bandwidth_gbs,ceiling_matmul_gflops,device,"
         "version,commit,cpu,cpu_isa,command\n";
  const std::string tail = csv_quoted(about["device"]) + "," + csv_quoted(about["version"]) + "," +
                           csv_quoted(about["commit"]) + "," + csv_quoted(about["cpu"]) + "," +
                           csv_quoted(about["cpu_isa"]) + "," + csv_quoted(about["command"]);
  for (const BenchRow& r : rows) {
    out << r.kind << ',' << short_dtype_name(r.dtype) << ',' << r.batch << ',' << r.seqlen_q << ','
        << r.context << ',' << c.shape.heads << ',' << c.shape.kv_heads << ',' << c.shape.head_dim
        << ',' << c.page_size << ',' << r.layers << ',' << r.median_ms << ',' << r.min_ms << ','
        << r.gbs << ',' << r.pct_bandwidth << ',' << r.gflops << ',' << r.pct_matmul << ','
        << r.eager_ms << ',' << r.host_us << ',' << ceilings.bandwidth_gbs << ',' << ceilings.matmul_gflops << ',' << tail << '\n';
  }
}

// nlohmann::json writes a non-finite number (a ceiling that could not be measured) as null.
void write_json(std::ostream& out, const std::vector<BenchRow>& rows, const BenchConfig& c,
                const Ceilings& ceilings, const nlohmann::json& about) {
  nlohmann::json doc = about;
  doc.update({{"heads", c.shape.heads},
              {"kv_heads", c.shape.kv_heads},
              {"head_dim", c.shape.head_dim},
              {"page_size", c.page_size},
              {"ceiling_bandwidth_gbs", ceilings.bandwidth_gbs},
              {"ceiling_matmul_gflops", ceilings.matmul_gflops},
              {"load_average_at_start", ceilings.load_before},
              {"load_average_at_end", load_average()},
              {"rows", nlohmann::json::array()}});
  for (const BenchRow& r : rows) {
    doc["rows"].push_back({{"kind", r.kind}, {"dtype", short_dtype_name(r.dtype)}, {"batch", r.batch},
                           {"seqlen_q", r.seqlen_q}, {"context", r.context}, {"layers", r.layers},
                           {"median_ms", r.median_ms}, {"min_ms", r.min_ms}, {"kv_gbs", r.gbs},
                           {"pct_bandwidth", r.pct_bandwidth}, {"gflops", r.gflops}, {"pct_matmul", r.pct_matmul},
                           {"eager_ms", r.eager_ms}, {"host_us", r.host_us}});
  }
  out << doc.dump(2) << '\n';
}

int bench(const BenchConfig& config, const std::string& command_line) {
  std::unique_ptr<DeviceMemory> memory = make_device_memory(config.device, config.threads);
  const nlohmann::json about = provenance(memory->description(), command_line);
  std::printf("kvflash bench: %s | %lld/%lld heads, head dim %lld, page %lld, %s\n",
              memory->description().c_str(), (long long)config.shape.heads, (long long)config.shape.kv_heads,
              (long long)config.shape.head_dim, (long long)config.page_size, config.causal ? "causal" : "non-causal");
  std::printf("%s | CPU %s\n", version_text().c_str(), cpu_model().c_str());
  std::fflush(stdout);

  Ceilings ceilings;
  ceilings.load_before = load_average();
  std::printf("load average (1 min) at start: %.2f on %u hardware threads\n", ceilings.load_before,
              std::thread::hardware_concurrency());
  static_cast<DeviceCeilings&>(ceilings) =
      memory->measure_ceilings(size_t(config.bandwidth_mib) << 20, config.threads);
  std::printf("ceilings: %.2f GB/s (%s), %.1f GFLOP/s (%s)\n", ceilings.bandwidth_gbs,
              ceilings.bandwidth_what.c_str(), ceilings.matmul_gflops, ceilings.matmul_what.c_str());
  std::fflush(stdout);

  std::mt19937_64 rng(1);
  std::vector<BenchRow> rows;
  for (DType dtype : config.dtypes) {
    for (int64_t batch : config.batches) {
      for (int64_t context : config.contexts) {
        rows.push_back(bench_shape(*memory, config, dtype, batch, 1, context, config.min_working_set_mib << 20,
                                   ceilings, rng));
        std::fprintf(stderr, "decode %s batch %lld context %lld: %.3f ms\n", short_dtype_name(dtype),
                     (long long)batch, (long long)context, rows.back().median_ms);
      }
    }
    for (int64_t length : config.prefill_lengths) {
      // Prefill is compute-bound: --prefill-batch prompts, one cache (no layer cycling).
      rows.push_back(bench_shape(*memory, config, dtype, config.prefill_batch, length, length, 0, ceilings, rng));
      std::fprintf(stderr, "prefill %s batch %lld length %lld: %.3f ms\n", short_dtype_name(dtype),
                   (long long)config.prefill_batch, (long long)length, rows.back().median_ms);
    }
  }
  print_table(rows, ceilings, config.eager);
  std::printf("load average (1 min) at end: %.2f\n", load_average());
  if (!config.out_path.empty()) {
    std::ofstream out(config.out_path);
    if (!out) throw UsageError{"--out: cannot write '" + config.out_path + "'"};
    if (config.format == "json") {
      write_json(out, rows, config, ceilings, about);
    } else {
      write_csv(out, rows, config, ceilings, about);
    }
    std::printf("wrote %s (%s)\n", config.out_path.c_str(), config.format.c_str());
  }
  return 0;
}

}  // namespace

void add_bench_command(CLI::App& app, CommandContext& context) {
  auto config = std::make_shared<BenchConfig>();
  auto format = std::make_shared<std::string>();
  CLI::App* command = app.add_subcommand(
      "bench", "decode and prefill sweeps beside the device's ceilings measured in the same run (CPU: memory "
               "read, fp32 GEMM; CUDA: device copy, bf16 cuBLAS GEMM); prints a table, writes CSV or JSON");
  add_bench_flags(*command, *config, *format);
  command->callback([config, format, command, &context] {
    finish_bench_config(*command, *config, *format);
    context.status = bench(*config, context.command_line);
  });
}

}  // namespace kvflash::tools
