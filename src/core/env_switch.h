// kvflash's off switches in the environment (KVFLASH_SM90, _SM90_SMALL_PAGES, _SM90_MLA: a kernel
// family's calls back to the portable kernels, to compare with or to fall back to), read at each
// use, so a user or a test may flip one between calls. A switch is on unless set to "0".
#pragma once

#include <cstdlib>
#include <cstring>

namespace kvflash::core {

inline bool env_switch_on(const char* name) {
  const char* value = std::getenv(name);
  return value == nullptr || std::strcmp(value, "0") != 0;
}

}  // namespace kvflash::core
