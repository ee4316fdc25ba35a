#include "options.h"

#include <cstdlib>
#include <sstream>

namespace kvflash::tools {

namespace {

int64_t parse_integer(const std::string& name, const std::string& text) {
  char* end = nullptr;
  const long long value = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0') {
    throw UsageError{"--" + name + " expects an integer, got '" + text + "'"};
  }
  return value;
}

std::vector<std::string> split(const std::string& text, char separator) {
  std::vector<std::string> parts;
  std::stringstream stream(text);
  std::string part;
  while (std::getline(stream, part, separator)) parts.push_back(part);
  return parts;
}

}  // namespace

Options::Options(int argc, char** argv) {
  for (int i = 0; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg.rfind("--", 0) != 0 || arg.size() == 2) {
      throw UsageError{"unexpected argument '" + arg + "' (flags look like --name value)"};
    }
    arg = arg.substr(2);
    const size_t equals = arg.find('=');
    if (equals != std::string::npos) {
      values_[arg.substr(0, equals)] = arg.substr(equals + 1);
    } else if (i + 1 < argc && std::string(argv[i + 1]).rfind("--", 0) != 0) {
      values_[arg] = argv[++i];
    } else {
      values_[arg] = "";  // a switch
    }
  }
}

const std::string* Options::take(const std::string& name) {
  auto it = values_.find(name);
  if (it == values_.end()) return nullptr;
  used_[name] = true;
  return &it->second;
}

bool Options::flag(const std::string& name) {
  const std::string* value = take(name);
  if (!value) return false;
  if (value->empty() || *value == "true" || *value == "1") return true;
  if (*value == "false" || *value == "0") return false;
  throw UsageError{"--" + name + " is a switch (give it alone or =true/=false), got '" + *value + "'"};
}

std::string Options::text(const std::string& name, const std::string& fallback) {
  const std::string* value = take(name);
  if (!value) return fallback;
  if (value->empty()) throw UsageError{"--" + name + " expects a value"};
  return *value;
}

int64_t Options::integer(const std::string& name, int64_t fallback, int64_t min, int64_t max) {
  const std::string* value = take(name);
  if (!value) return fallback;
  const int64_t result = parse_integer(name, *value);
  if (result < min || result > max) {
    throw UsageError{"--" + name + " must be in [" + std::to_string(min) + ", " +
                     std::to_string(max) + "], got " + *value};
  }
  return result;
}

double Options::number(const std::string& name, double fallback) {
  const std::string* value = take(name);
  if (!value) return fallback;
  char* end = nullptr;
  const double result = std::strtod(value->c_str(), &end);
  if (value->empty() || *end != '\0') {
    throw UsageError{"--" + name + " expects a number, got '" + *value + "'"};
  }
  return result;
}

std::vector<int64_t> Options::integers(const std::string& name,
                                       const std::vector<int64_t>& fallback) {
  const std::string* value = take(name);
  if (!value) return fallback;
  std::vector<int64_t> result;
  if (*value == "none") return result;
  for (const std::string& part : split(*value, ',')) {
    const int64_t v = parse_integer(name, part);
    if (v <= 0) throw UsageError{"--" + name + " values must be positive, got " + part};
    result.push_back(v);
  }
  if (result.empty()) throw UsageError{"--" + name + " expects a comma-separated list"};
  return result;
}

std::vector<std::string> Options::texts(const std::string& name,
                                        const std::vector<std::string>& fallback) {
  const std::string* value = take(name);
  if (!value) return fallback;
  std::vector<std::string> result = split(*value, ',');
  if (result.empty()) throw UsageError{"--" + name + " expects a comma-separated list"};
  return result;
}

std::pair<int64_t, int64_t> Options::range(const std::string& name,
                                           std::pair<int64_t, int64_t> fallback, int64_t min,
                                           int64_t max) {
  const std::string* value = take(name);
  if (!value) return fallback;
  const size_t dash = value->find('-', 1);
  std::pair<int64_t, int64_t> result;
  if (dash == std::string::npos) {
    result.first = result.second = parse_integer(name, *value);
  } else {
    result = {parse_integer(name, value->substr(0, dash)),
              parse_integer(name, value->substr(dash + 1))};
  }
  if (result.first < min || result.second > max || result.first > result.second) {
    throw UsageError{"--" + name + " must be a value or a range lo-hi within [" +
                     std::to_string(min) + ", " + std::to_string(max) + "], got " + *value};
  }
  return result;
}

void Options::reject_unused() const {
  std::string unknown;
  for (const auto& [name, value] : values_) {
    if (!used_.count(name)) unknown += (unknown.empty() ? "--" : ", --") + name;
  }
  if (!unknown.empty()) throw UsageError{"unknown flag(s): " + unknown};
}

}  // namespace kvflash::tools
