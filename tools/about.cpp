#include "about.h"

#include <fstream>

#include "build_info.h"  // generated: KVFLASH_GIT_COMMIT
#include "cpu/isa.h"
#include "kvflash/kvflash.h"
#include "kvflash/version.h"

namespace kvflash::tools {

std::string version_text() {
  return std::string("kvflash ") + KVFLASH_VERSION_STRING + " (commit " + KVFLASH_GIT_COMMIT + ", backends " +
         build_backends() + ", CPU kernels " + cpu::isa_name(cpu::active_isa()) + ")";
}

std::string cpu_model() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line)) {
    if (line.rfind("model name", 0) != 0) continue;
    const size_t colon = line.find(':');
    if (colon != std::string::npos && colon + 2 <= line.size()) return line.substr(colon + 2);
  }
  return "unknown";
}

nlohmann::json provenance(const std::string& device, const std::string& command_line) {
  return {{"version", KVFLASH_VERSION_STRING},
          {"commit", KVFLASH_GIT_COMMIT},
          {"backends", build_backends()},
          {"cpu", cpu_model()},
          {"cpu_isa", cpu::isa_name(cpu::active_isa())},
          {"device", device},
          {"command", command_line}};
}

}  // namespace kvflash::tools
