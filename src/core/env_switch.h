// kvflash's switches in the environment, read at each use, so a user or a test may flip one
// between calls. Off switches (KVFLASH_SM90, _SM90_SMALL_PAGES, _SM90_MLA, _SM90_FP8, _SM90_SMALL_TILES,
// _SM90_THREE_GROUPS: a kernel family or shape back to the one before it, to compare with or to
// fall back to) are on unless set to "0"; opt-in ones (KVFLASH_SM90_PERSISTENT, _SM90_PINGPONG:
// kernels correct on the GPU but not shown faster than the default; _SM90_THREE_GROUP_PAGES: not
// yet run on a GPU) are off unless "1".
#pragma once

#include <cstdlib>
#include <cstring>

namespace kvflash::core {

inline bool env_switch_on(const char* name) {
  const char* value = std::getenv(name);
  return value == nullptr || std::strcmp(value, "0") != 0;
}

inline bool env_opted_in(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr && std::strcmp(value, "1") == 0;
}

}  // namespace kvflash::core
