#include "options.h"

#include <sstream>

#include "host_tensor.h"

namespace kvflash::tools {

namespace {

std::vector<std::string> split(const std::string& text, char separator) {
  std::vector<std::string> parts;
  std::stringstream stream(text);
  std::string part;
  while (std::getline(stream, part, separator)) parts.push_back(part);
  return parts;
}

int64_t parse_integer(const std::string& name, const std::string& text) {
  try {
    size_t used = 0;
    const long long value = std::stoll(text, &used);
    if (used == text.size()) return value;
  } catch (const std::exception&) {
  }
  throw CLI::ValidationError(name, "expects an integer, got '" + text + "'");
}

}  // namespace

CLI::Option* add_integer_list(CLI::App& app, const std::string& name, std::vector<int64_t>& target,
                              const std::string& help) {
  auto parse = [&target, name](const std::string& text) {
    target.clear();
    if (text == "none") return;
    for (const std::string& part : split(text, ',')) {
      const int64_t value = parse_integer(name, part);
      if (value <= 0) throw CLI::ValidationError(name, "values must be positive, got " + part);
      target.push_back(value);
    }
    if (target.empty()) throw CLI::ValidationError(name, "expects a comma-separated list");
  };
  return app.add_option_function<std::string>(name, parse, help)->type_name("N,N,..|none");
}

CLI::Option* add_integer_range(CLI::App& app, const std::string& name, std::pair<int64_t, int64_t>& target,
                               int64_t min, int64_t max, const std::string& help) {
  auto parse = [&target, name, min, max](const std::string& text) {
    const size_t dash = text.find('-', 1);
    if (dash == std::string::npos) {
      target.first = target.second = parse_integer(name, text);
    } else {
      target = {parse_integer(name, text.substr(0, dash)), parse_integer(name, text.substr(dash + 1))};
    }
    if (target.first < min || target.second > max || target.first > target.second) {
      throw CLI::ValidationError(name, "must be a value or a range lo-hi within [" + std::to_string(min) + ", " +
                                           std::to_string(max) + "], got " + text);
    }
  };
  return app.add_option_function<std::string>(name, parse, help)->type_name("LO-HI");
}

CLI::Option* add_dtype_list(CLI::App& app, const std::string& name, std::vector<DType>& target,
                            const std::string& help) {
  auto parse = [&target, name](const std::string& text) {
    target.clear();
    for (const std::string& part : split(text, ',')) {
      try {
        target.push_back(parse_dtype(part));
      } catch (const UsageError& e) {
        throw CLI::ValidationError(name, e.message);
      }
    }
    if (target.empty()) throw CLI::ValidationError(name, "expects a comma-separated list");
  };
  return app.add_option_function<std::string>(name, parse, help)->type_name("DTYPE,..");
}

CLI::Option* add_device(CLI::App& app, std::string& target) {
  return app.add_option("--device", target, "where the tensors live: cuda when a GPU is usable (auto)")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}))
      ->capture_default_str();
}

}  // namespace kvflash::tools
