#include "progress.h"

#include <unistd.h>

#include <cstdio>

namespace kvflash::tools {

namespace {
constexpr double kQuietSeconds = 2.0;  // runs shorter than this print nothing off a terminal
using Clock = std::chrono::steady_clock;
}  // namespace

Progress::Progress(std::string label, int64_t total)
    : label_(std::move(label)), total_(total), terminal_(isatty(STDERR_FILENO) != 0),
      start_(Clock::now()), last_draw_(start_) {}

Progress::~Progress() { finish(); }

void Progress::update(int64_t done) {
  const auto now = Clock::now();
  const double elapsed = std::chrono::duration<double>(now - start_).count();
  const double fraction = total_ > 0 ? double(done) / double(total_) : 1.0;
  if (terminal_) {
    // Redraw at most ~10 times a second.
    if (drawn_ && done < total_ && now - last_draw_ < std::chrono::milliseconds(100)) return;
    constexpr int kWidth = 30;
    const int filled = int(fraction * kWidth);
    std::fprintf(stderr, "\r%s [%.*s%*s] %lld/%lld %.1fs", label_.c_str(), filled,
                 "##############################", kWidth - filled, "", (long long)done,
                 (long long)total_, elapsed);
    std::fflush(stderr);
    drawn_ = true;
    last_draw_ = now;
    return;
  }
  const int tenth = int(fraction * 10);
  if (elapsed < kQuietSeconds || tenth == last_tenth_) return;
  last_tenth_ = tenth;
  std::fprintf(stderr, "%s: %lld/%lld (%.1fs)\n", label_.c_str(), (long long)done,
               (long long)total_, elapsed);
  drawn_ = true;
}

void Progress::finish() {
  if (terminal_ && drawn_) {
    std::fprintf(stderr, "\n");
    std::fflush(stderr);
  }
}

}  // namespace kvflash::tools
