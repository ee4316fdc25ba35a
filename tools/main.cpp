// kvflash: the command-line program. `kvflash run` serves a batch end to end, `kvflash check`
// tests the library against the oracle on random calls, `kvflash bench` measures it.
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>

#include "commands.h"
#include "kvflash/errors.h"
#include "kvflash/kvflash.h"

namespace {

const char* kUsage = R"(usage: kvflash <command> [flags]

commands:
  run     a serving-shaped workload: prefill a batch of prompts into a paged KV cache, then
          decode token by token; sampled calls are verified against the float64 oracle.
            --batch 8 --prompt-len 512-2048 --decode-steps 128 --heads 32 --kv-heads 8
            --head-dim 128 --page-size 16 --dtype bf16|fp16|fp32 --threads 0 (all)
            --device auto|cpu|cuda --seed 0 --verify-every 16 (0: off)
            --verify-sequences 4 --verify-rows 4
  check   N random calls drawn over the whole contract, each compared with the oracle.
            --cases 200 --seed 1 --threads 0 --verbose --coverage
  bench   decode and prefill sweeps beside the device's ceilings measured in the same run (CPU:
          memory read, fp32 GEMM; CUDA: device copy, bf16 cuBLAS GEMM; calls planned beforehand,
          CUDA passes replayed as graphs); prints a table and writes CSV or JSON.
            --batch 1,8,16 --context 1024,4096,16384 --prefill 512,2048,4096 (or none)
            --prefill-batch 1 (prompts per prefill row)
            --dtype bf16,fp16 --heads 32 --kv-heads 8 --head-dim 128 --page-size 16
            --threads 0 --device auto|cpu|cuda --num-splits 0 (heuristic) --repeats 7
            --warmup 2 --min-working-set-mib 1024 --bandwidth-mib 3072 --format csv|json --out FILE
            --non-causal (prefill rows see every key; default causal), --page-size 0 (dense cache)
            --quick (a small grid, for a smoke test))";

}  // namespace

int main(int argc, char** argv) {
  using namespace kvflash::tools;
  if (argc < 2 || std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0 ||
      std::strcmp(argv[1], "help") == 0) {
    std::printf("%s\n\nbackends built in: %s\n", kUsage, kvflash::build_backends());
    return argc < 2 ? 2 : 0;
  }
  const std::string command = argv[1];
  try {
    Options options(argc - 2, argv + 2);
    if (command == "run") return run_command(options);
    if (command == "check") return check_command(options);
    if (command == "bench") return bench_command(options);
    std::fprintf(stderr, "kvflash: unknown command '%s'\n\n%s\n", command.c_str(), kUsage);
    return 2;
  } catch (const UsageError& e) {
    std::fprintf(stderr, "kvflash %s: %s\n(kvflash --help lists the flags)\n", command.c_str(),
                 e.message.c_str());
    return 2;
  } catch (const kvflash::Error& e) {
    std::fprintf(stderr, "kvflash %s: %s (%s%s%s)\n", command.c_str(), e.what(),
                 kvflash::error_kind_name(e.kind()), e.argument().empty() ? "" : ", argument ",
                 e.argument().c_str());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kvflash %s: %s\n", command.c_str(), e.what());
    return 1;
  }
}
