// A progress bar on stderr for long loops: redrawn in place on a terminal; elsewhere (CI logs) a
// line every tenth of the way, and only once the loop has run past ~2 s, so short runs stay quiet.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace kvflash::tools {

class Progress {
 public:
  Progress(std::string label, int64_t total);
  ~Progress();
  void update(int64_t done);

 private:
  void finish();
  std::string label_;
  int64_t total_;
  bool terminal_;
  bool drawn_ = false;
  int last_tenth_ = -1;
  std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point last_draw_;
};

}  // namespace kvflash::tools
