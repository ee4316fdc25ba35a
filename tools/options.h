// Command-line flags of the kvflash program: "--name value" or "--name=value", each flag read at
// most once by the command that owns it; anything left unread is reported as unknown.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace kvflash::tools {

// A bad flag or value; main() prints it with the command's usage and exits with status 2.
struct UsageError {
  std::string message;
};

class Options {
 public:
  // argv after the command name.
  Options(int argc, char** argv);

  bool has(const std::string& name) const { return values_.count(name) != 0; }
  bool flag(const std::string& name);  // a switch: "--name" (or --name=true/false)
  std::string text(const std::string& name, const std::string& fallback);
  int64_t integer(const std::string& name, int64_t fallback, int64_t min, int64_t max);
  double number(const std::string& name, double fallback);
  // A comma-separated list of positive integers ("1,8,32"), or "none" for an empty list.
  std::vector<int64_t> integers(const std::string& name, const std::vector<int64_t>& fallback);
  std::vector<std::string> texts(const std::string& name, const std::vector<std::string>& fallback);
  // An integer range "lo-hi" (or a single value), e.g. --prompt-len 512-2048.
  std::pair<int64_t, int64_t> range(const std::string& name, std::pair<int64_t, int64_t> fallback,
                                    int64_t min, int64_t max);
  // Throws UsageError naming every flag no command read.
  void reject_unused() const;

 private:
  std::map<std::string, std::string> values_;
  std::map<std::string, bool> used_;
  const std::string* take(const std::string& name);
};

}  // namespace kvflash::tools
