// kvflash: the command-line program. `kvflash run` serves a batch end to end, `kvflash check`
// tests the library against the oracle on random calls, `kvflash bench` measures it.
// `kvflash <command> --help` lists a command's flags.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <exception>
#include <string>

#include "about.h"
#include "commands.h"
#include "kvflash/errors.h"
#include "kvflash/kvflash.h"
#include "options.h"

namespace {

std::string join(int argc, char** argv) {
  std::string line;
  for (int i = 0; i < argc; ++i) line += (i ? " " : "") + std::string(argv[i]);
  return line;
}

std::string command_name(const CLI::App& app) {
  const auto chosen = app.get_subcommands();
  return chosen.empty() ? "kvflash" : "kvflash " + chosen.front()->get_name();
}

}  // namespace

int main(int argc, char** argv) {
  using namespace kvflash::tools;
  CommandContext context{join(argc, argv)};
  CLI::App app{"kvflash: FlashAttention-3's flash_attn_with_kvcache on the CPU and CUDA", "kvflash"};
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::Throw);  // a flag given twice
  app.set_version_flag("--version", [] { return version_text(); });
  app.require_subcommand(1, 1);
  app.footer(std::string("backends built in: ") + kvflash::build_backends() +
             "\n`kvflash <command> --help` lists a command's flags.");
  add_run_command(app, context);
  add_check_command(app, context);
  add_bench_command(app, context);
  if (argc < 2) {
    std::printf("%s", app.help().c_str());
    return 2;
  }
  try {
    app.parse(argc, argv);
    return context.status;
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;  // --help and --version exit 0
  } catch (const UsageError& e) {
    std::fprintf(stderr, "%s: %s\n(add --help for the flags)\n", command_name(app).c_str(), e.message.c_str());
    return 2;
  } catch (const kvflash::Error& e) {
    std::fprintf(stderr, "%s: %s (%s%s%s)\n", command_name(app).c_str(), e.what(),
                 kvflash::error_kind_name(e.kind()), e.argument().empty() ? "" : ", argument ",
                 e.argument().c_str());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", command_name(app).c_str(), e.what());
    return 1;
  }
}
