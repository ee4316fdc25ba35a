// Shard layouts and the reduction of a rank's masked attention to ordinary calls (shard_calls.h).
#include "parallel/shard_calls.h"

#include <algorithm>
#include <string>

#include "core/mask.h"
#include "core/validate.h"

namespace kvflash::cp {

ShardLayout ShardLayout::contiguous(int world_size, int64_t positions_per_rank) {
  ShardLayout layout;
  layout.kind = Kind::contiguous;
  layout.world_size = world_size;
  layout.positions_per_rank = positions_per_rank;
  return layout;
}

ShardLayout ShardLayout::strided_pages(int world_size, int page_size) {
  ShardLayout layout;
  layout.kind = Kind::strided_pages;
  layout.world_size = world_size;
  layout.page_size = page_size;
  return layout;
}

void ShardLayout::check() const {
  if (world_size < 1) {
    core::fail(ErrorKind::invalid_value, "world_size",
               "world_size must be at least 1 (got " + std::to_string(world_size) + ")");
  }
  if (kind == Kind::contiguous && positions_per_rank < 1) {
    core::fail(ErrorKind::invalid_value, "positions_per_rank",
               "a contiguous layout needs positions_per_rank >= 1 (got " +
                   std::to_string(positions_per_rank) + ")");
  }
  if (kind == Kind::strided_pages && page_size < 1) {
    core::fail(ErrorKind::invalid_value, "page_size",
               "a strided layout needs page_size >= 1 (got " + std::to_string(page_size) + ")");
  }
}

int ShardLayout::owner(int64_t pos) const {
  if (kind == Kind::contiguous) return int(pos / positions_per_rank);
  return int((pos / page_size) % world_size);
}

int64_t ShardLayout::owned_before(int rank, int64_t pos) const {
  if (kind == Kind::contiguous) {
    const int64_t lo = int64_t(rank) * positions_per_rank;
    return std::clamp<int64_t>(pos - lo, 0, positions_per_rank);
  }
  // Whole pages before `pos` whose index is rank mod world_size, then the owned part of pos's page.
  const int64_t page = pos / page_size;
  const int64_t whole = page > rank ? (page - rank - 1) / world_size + 1 : 0;
  const int64_t partial = page % world_size == rank ? pos - page * page_size : 0;
  return whole * page_size + partial;
}

std::vector<LocalRange> local_visible_keys(const ShardLayout& layout, int rank, int seqlen_q,
                                           int64_t seqlen_k, int window_left, int window_right,
                                           int chunk) {
  std::vector<LocalRange> ranges(static_cast<size_t>(seqlen_q));
  for (int i = 0; i < seqlen_q; ++i) {
    const core::KeyRange global =
        core::visible_keys(i, seqlen_q, int(seqlen_k), window_left, window_right, chunk);
    ranges[size_t(i)] = {layout.owned_before(rank, global.lo), layout.owned_before(rank, global.hi)};
  }
  return ranges;
}

namespace {

bool is_empty(const LocalRange& r) { return r.lo >= r.hi; }

// The call for rows [row0, row0 + rows) whose bounds move by (lo_step, hi_step) per row.
ShardCall make_call(const std::vector<LocalRange>& ranges, int row0, int rows, int64_t lo_step,
                    int64_t hi_step) {
  const LocalRange& first = ranges[size_t(row0)];
  const LocalRange& last = ranges[size_t(row0 + rows - 1)];
  ShardCall call;
  call.row0 = row0;
  call.rows = rows;
  call.leftpad = first.lo;
  call.seqlen = last.hi;
  const int64_t keys = last.hi - first.lo;
  if (lo_step == 0 && hi_step == 1) call.window_right = 0;
  if (lo_step == 1 && hi_step == 0) call.window_left = int(keys - rows);
  if (lo_step == 1 && hi_step == 1) {
    call.window_left = int(first.hi - first.lo - 1);
    call.window_right = 0;
  }
  return call;
}

}  // namespace

std::vector<ShardCall> calls_for_rows(const std::vector<LocalRange>& ranges) {
  std::vector<ShardCall> calls;
  const int n = int(ranges.size());
  int row = 0;
  while (row < n) {
    if (is_empty(ranges[size_t(row)])) {
      ++row;
      continue;
    }
    // The first step fixes the run's kind; the run lasts while every step is the same.
    int64_t lo_step = 0, hi_step = 0;
    int end = row + 1;
    if (end < n && !is_empty(ranges[size_t(end)])) {
      lo_step = ranges[size_t(end)].lo - ranges[size_t(row)].lo;
      hi_step = ranges[size_t(end)].hi - ranges[size_t(row)].hi;
      const bool expressible = (lo_step == 0 || lo_step == 1) && (hi_step == 0 || hi_step == 1);
      if (expressible) {
        while (end < n && !is_empty(ranges[size_t(end)]) &&
               ranges[size_t(end)].lo - ranges[size_t(end - 1)].lo == lo_step &&
               ranges[size_t(end)].hi - ranges[size_t(end - 1)].hi == hi_step) {
          ++end;
        }
      } else {
        lo_step = hi_step = 0;
      }
    }
    calls.push_back(make_call(ranges, row, end - row, lo_step, hi_step));
    row = end;
  }
  return calls;
}

LocalRange call_range(const ShardCall& call, int t) {
  // The contract's bottom-right rule (contract 5.4) on the call's own keys [leftpad, seqlen).
  const int64_t keys = call.seqlen - call.leftpad;
  const int64_t diag = t + keys - call.rows;
  int64_t lo = 0, hi = keys;
  if (call.window_left >= 0) lo = std::max(lo, diag - call.window_left);
  if (call.window_right >= 0) hi = std::min(hi, diag + call.window_right + 1);
  return {call.leftpad + lo, call.leftpad + std::max(lo, hi)};
}

std::optional<ShardCall> whole_sequence_call(const std::vector<LocalRange>& ranges) {
  const int n = int(ranges.size());
  const std::vector<ShardCall> calls = calls_for_rows(ranges);
  if (calls.empty()) return ShardCall{0, n, 0, 0, -1, -1};
  if (calls.size() != 1 || calls[0].row0 + calls[0].rows != n) return std::nullopt;
  // Rows before the run keep the run's diagonal; they must come out exactly as given (empty).
  ShardCall whole = calls[0];
  whole.row0 = 0;
  whole.rows = n;
  for (int t = 0; t < n; ++t) {
    const LocalRange got = call_range(whole, t), want = ranges[size_t(t)];
    const bool same = is_empty(got) ? is_empty(want) : (got.lo == want.lo && got.hi == want.hi);
    if (!same) return std::nullopt;
  }
  return whole;
}

}  // namespace kvflash::cp
