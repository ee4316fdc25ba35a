// `kvflash check`: a quick randomized self-test. Each case is a random call from the oracle's
// generator (src/oracle/random_case.h), run through the library and compared with the float64
// oracle: outputs, LSE, split partials, appended and untouched cache rows, read-only inputs.
#include <chrono>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>

#include "about.h"
#include "commands.h"
#include "kvflash/kvflash.h"
#include "oracle/oracle.h"
#include "oracle/random_case.h"
#include "progress.h"

namespace kvflash::tools {

namespace {

struct CheckConfig {
  int64_t cases = 200;
  uint64_t seed = 1;
  int threads = 0;
  bool verbose = false;
  bool coverage = false;
  bool json = false;  // the summary as one JSON object on stdout instead of text
};

// Runs one case; returns "" when it passes, else what went wrong. Caller-owned split partials
// (out_accum, softmax_lse_accum) on every other seed, the LSE on two seeds of three, so every
// combination of optional outputs runs; the typed Plan is handed to the call when the case
// brings no scheduler metadata of its own, so that path runs too.
std::string check_case(const oracle::Case& c, const RunOptions& run_options) {
  // The oracle reads the cache as it is before the call appends to it.
  const oracle::OracleResult ref = oracle::run_oracle(c.args);
  const bool with_partials = c.seed % 2 == 0, with_lse = c.seed % 3 != 0;
  const Plan plan = make_plan(c.args);
  KvCacheArgs args = c.args;
  if (!args.plan && !args.scheduler_metadata) args.plan = &plan;
  oracle::CaseOutputs outputs =
      oracle::allocate_outputs(output_spec(args, args.plan), with_partials, with_lse);
  try {
    flash_attn_with_kvcache(args, outputs.outputs, run_options);
  } catch (const Error& e) {
    return std::string("rejected (") + error_kind_name(e.kind()) + " in '" + e.argument() +
           "'): " + e.what();
  }
  // The CPU backend keeps P in fp32, so it is held to the oracle's tighter profile.
  const oracle::Comparison result =
      oracle::compare(c, ref, outputs.outputs, outputs.outputs.out_accum ? &plan : nullptr,
                      oracle::ToleranceProfile::fp32_probabilities);
  return result.ok ? "" : std::to_string(result.failures) + " bad values; first: " +
                              result.first_failure + "; worst: " + result.worst;
}

int check(const CheckConfig& config, const std::string& command_line) {
  RunOptions run_options;
  run_options.num_threads = config.threads;
  oracle::Coverage coverage;
  nlohmann::json failures = nlohmann::json::array();
  const auto start = std::chrono::steady_clock::now();
  {
    Progress progress("check", config.cases);
    for (int64_t i = 0; i < config.cases; ++i) {
      const uint64_t seed = config.seed + uint64_t(i);
      oracle::Case c = oracle::make_random_case(seed);
      coverage.add(c);
      const std::string failure = check_case(c, run_options);
      if (!failure.empty()) {
        failures.push_back({{"seed", seed}, {"case", oracle::describe(c)}, {"failure", failure}});
        if (!config.json) std::printf("FAIL %s\n     %s\n", oracle::describe(c).c_str(), failure.c_str());
      } else if (config.verbose && !config.json) {
        std::printf("ok   %s\n", oracle::describe(c).c_str());
      }
      progress.update(i + 1);
    }
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const int64_t failed = int64_t(failures.size());
  const uint64_t last_seed = config.seed + uint64_t(config.cases) - 1;
  if (config.json) {
    nlohmann::json summary = {{"passed", config.cases - failed}, {"failed", failed},
                              {"seeds", {config.seed, last_seed}}, {"seconds", seconds},
                              {"failures", failures}, {"provenance", provenance("cpu", command_line)}};
    if (config.coverage) summary["coverage"] = coverage.report();
    std::printf("%s\n", summary.dump(2).c_str());
  } else {
    if (config.coverage) std::printf("%s\n", coverage.report().c_str());
    std::printf("check: %lld passed, %lld failed (seeds %llu-%llu, %.1f s)\n", (long long)(config.cases - failed),
                (long long)failed, (unsigned long long)config.seed, (unsigned long long)last_seed, seconds);
  }
  return failed == 0 ? 0 : 1;
}

}  // namespace

void add_check_command(CLI::App& app, CommandContext& context) {
  auto config = std::make_shared<CheckConfig>();
  CLI::App* command = app.add_subcommand(
      "check", "N random calls drawn over the whole contract, each compared with the float64 oracle (CPU)");
  command->add_option("--cases", config->cases, "random calls")->check(CLI::Range(int64_t(1), int64_t(1) << 32))
      ->capture_default_str();
  command->add_option("--seed", config->seed, "first case's seed (case i: seed + i)")->capture_default_str();
  command->add_option("--threads", config->threads, "CPU threads (0: all)")->check(CLI::Range(0, 4096))
      ->capture_default_str();
  command->add_flag("--verbose", config->verbose, "a line per case");
  command->add_flag("--coverage", config->coverage, "which features the cases exercised");
  command->add_flag("--json", config->json, "the summary as one JSON object on stdout");
  command->callback([config, &context] { context.status = check(*config, context.command_line); });
}

}  // namespace kvflash::tools
