// kvflash's on / off switches in the environment, read at each use (a user or a test may flip one
// between calls). A switch on by default is off only when set to "0"; an opt-in one (kernels not
// yet validated on a GPU) is on only when set to "1".
#pragma once

#include <cstdlib>
#include <cstring>

namespace kvflash::core {

inline bool env_switch(const char* name, bool default_on) {
  const char* value = std::getenv(name);
  if (value == nullptr) return default_on;
  return default_on ? std::strcmp(value, "0") != 0 : std::strcmp(value, "1") == 0;
}

}  // namespace kvflash::core
