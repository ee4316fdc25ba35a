// check_values(): the contents of the index and length tensors (host copies), checked before
// anything is written. Each rule reports the first bad entry by name and index.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/validate.h"

namespace kvflash::core {

namespace {

using std::to_string;

[[noreturn]] void bad_value(const char* argument, const std::string& message) {
  fail(ErrorKind::invalid_value, argument, message);
}

std::string entry(const char* name, int64_t i, int64_t value) {
  return std::string(name) + "[" + to_string(i) + "] = " + to_string(value);
}

// cu_seqlens: starts at 0, never decreases, ends at `total` rows of `rows_name`.
void check_cu_seqlens(const int32_t* cu, int batch, const char* name, int64_t total,
                      const char* rows_name) {
  if (cu[0] != 0) bad_value(name, entry(name, 0, cu[0]) + ", expected 0");
  for (int b = 1; b <= batch; ++b) {
    if (cu[b] < cu[b - 1]) {
      bad_value(name, entry(name, b, cu[b]) + " is less than " + entry(name, b - 1, cu[b - 1]) +
                          " (cumulative lengths must not decrease)");
    }
  }
  if (cu[batch] != total) {
    bad_value(name, entry(name, batch, cu[batch]) + ", expected the total " + to_string(total) +
                        " (" + rows_name + ")");
  }
}

void check_lengths(const Problem& p, const HostIndices& h) {
  if (h.cu_seqlens_q) {
    check_cu_seqlens(h.cu_seqlens_q, p.batch, "cu_seqlens_q", p.total_q, "q.shape[0]");
    for (int b = 0; b < p.batch; ++b) {
      const int len = h.cu_seqlens_q[b + 1] - h.cu_seqlens_q[b];
      if (len > p.seqlen_q) {
        bad_value("cu_seqlens_q", "cu_seqlens_q[" + to_string(b + 1) + "] - cu_seqlens_q[" +
                                      to_string(b) + "] = " + to_string(len) +
                                      " exceeds max_seqlen_q = " + to_string(p.seqlen_q));
      }
    }
  }
  if (p.knew_packed) {
    check_cu_seqlens(h.cu_seqlens_k_new, p.batch, "cu_seqlens_k_new", p.args.k->size(0),
                     "k.shape[0]");
  }
}

// Cache lengths, left padding and capacity, sequence by sequence.
void check_cache_extent(const Problem& p, const HostIndices& h) {
  const std::string capacity =
      p.paged ? "max_num_pages_per_seq * page_size = " + to_string(p.max_pages_per_seq) + " * " +
                    to_string(p.page_size)
              : "k_cache.shape[1]";
  for (int b = 0; b < p.batch; ++b) {
    const SeqInfo s = seq_info(p, h, b);
    if (h.cache_seqlens && s.cache_seqlen < 0) {
      bad_value("cache_seqlens", entry("cache_seqlens", b, s.cache_seqlen) + " must be >= 0");
    }
    if (h.cache_leftpad && (s.leftpad < 0 || s.leftpad > s.cache_seqlen)) {
      bad_value("cache_leftpad", entry("cache_leftpad", b, s.leftpad) + " is out of range [0, " +
                                     to_string(s.cache_seqlen) + "] (cache_seqlens[" +
                                     to_string(b) + "] = " + to_string(s.cache_seqlen) + ")");
    }
    const int64_t end = int64_t{s.cache_seqlen} + s.seqlen_knew;
    if (end > p.seqlen_k) {
      bad_value(h.cache_seqlens ? "cache_seqlens" : "k",
                "cache_seqlens[" + to_string(b) + "] + new tokens = " + to_string(s.cache_seqlen) +
                    " + " + to_string(s.seqlen_knew) + " = " + to_string(end) +
                    " exceeds the cache capacity " + to_string(p.seqlen_k) + " (" + capacity + ")");
    }
  }
}

// cache_batch_idx rows, then every page a sequence reads or the append writes.
void check_cache_rows(const Problem& p, const HostIndices& h) {
  const int rows = p.paged ? static_cast<int>(p.args.page_table->size(0)) : p.num_cache_rows;
  if (h.cache_batch_idx) {
    for (int b = 0; b < p.batch; ++b) {
      const int row = h.cache_batch_idx[b];
      if (row < 0 || row >= rows) {
        bad_value("cache_batch_idx", entry("cache_batch_idx", b, row) + " is out of range [0, " +
                                         to_string(rows) + ")");
      }
    }
  }
  if (!p.paged) return;
  for (int b = 0; b < p.batch; ++b) {
    const SeqInfo s = seq_info(p, h, b);
    const int end = s.cache_seqlen + s.seqlen_knew;
    if (end <= s.leftpad) continue;
    const int32_t* row = h.page_table + int64_t{s.cache_row} * h.page_table_row_stride;
    for (int page = s.leftpad / p.page_size; page <= (end - 1) / p.page_size; ++page) {
      if (row[page] < 0 || row[page] >= p.num_cache_rows) {
        bad_value("page_table", "page_table[" + to_string(s.cache_row) + ", " + to_string(page) +
                                    "] = " + to_string(row[page]) + " is out of range [0, " +
                                    to_string(p.num_cache_rows) + ") (batch " + to_string(b) + ")");
      }
    }
  }
}

// Every position rotated (new keys at start + t, queries at start or start + i) needs a row.
void check_rotary_positions(const Problem& p, const HostIndices& h) {
  if (h.rotary_seqlens) {
    for (int b = 0; b < p.batch; ++b) {
      if (h.rotary_seqlens[b] < 0) {
        bad_value("rotary_seqlens",
                  entry("rotary_seqlens", b, h.rotary_seqlens[b]) + " must be >= 0");
      }
    }
  }
  if (p.rotary_dim == 0) return;
  const int64_t rows = p.args.rotary_cos->size(0);
  for (int b = 0; b < p.batch; ++b) {
    const SeqInfo s = seq_info(p, h, b);
    int64_t last = -1;  // the largest rotated position of this sequence
    if (s.seqlen_knew > 0) last = int64_t{s.rotary_start} + s.seqlen_knew - 1;
    if (s.seqlen_q > 0 && p.has_q) {
      const int64_t q_last =
          p.rotate_q_per_row ? int64_t{s.rotary_start} + s.seqlen_q - 1 : s.rotary_start;
      last = std::max(last, q_last);
    }
    if (last >= rows) {
      bad_value("rotary_cos", "rotary_cos / rotary_sin have " + to_string(rows) +
                                  " rows, but batch " + to_string(b) + " rotates position " +
                                  to_string(last) + " (rotary start " + to_string(s.rotary_start) +
                                  ", " + to_string(s.seqlen_knew) + " new keys, " +
                                  to_string(s.seqlen_q) + " queries)");
    }
  }
}

// Two sequences appending into one cache slot (duplicated page ids, or cache_batch_idx naming a
// row twice) leave whichever write lands last: refused. Runs after the range checks above.
void check_append_slots(const Problem& p, const HostIndices& h) {
  if (!p.has_knew) return;
  struct Slot {
    int64_t slot;  // row of the cache, flattened over (page or cache row, position)
    int b;
    int position;
  };
  std::vector<Slot> slots;
  for (int b = 0; b < p.batch; ++b) {
    const SeqInfo s = seq_info(p, h, b);
    for (int t = s.cache_seqlen; t < s.cache_seqlen + s.seqlen_knew; ++t) {
      const int64_t row =
          p.paged ? h.page_table[int64_t{s.cache_row} * h.page_table_row_stride + t / p.page_size]
                  : s.cache_row;
      const int64_t within = p.paged ? t % p.page_size : t;
      slots.push_back({row * (p.paged ? p.page_size : p.seqlen_k) + within, b, t});
    }
  }
  std::sort(slots.begin(), slots.end(), [](const Slot& x, const Slot& y) {
    return x.slot != y.slot ? x.slot < y.slot : x.b < y.b;
  });
  for (size_t i = 1; i < slots.size(); ++i) {
    if (slots[i].slot != slots[i - 1].slot) continue;
    const Slot& first = slots[i - 1];
    const Slot& second = slots[i];
    const char* name = p.paged ? "page_table" : "cache_batch_idx";
    bad_value(name, "batch " + to_string(first.b) + " and batch " + to_string(second.b) +
                        " both append into cache " +
                        (p.paged ? "page " + to_string(first.slot / p.page_size) + ", row " +
                                       to_string(first.slot % p.page_size)
                                 : "row " + to_string(first.slot / p.seqlen_k) + ", position " +
                                       to_string(first.slot % p.seqlen_k)) +
                        " (positions " + to_string(first.position) + " and " +
                        to_string(second.position) + "); " + name +
                        " must give each appending sequence its own slots");
  }
}

}  // namespace

void check_values(const Problem& p, const HostIndices& h) {
  check_lengths(p, h);
  check_cache_extent(p, h);
  check_cache_rows(p, h);
  check_rotary_positions(p, h);
  check_append_slots(p, h);
}

bool checked_mode(const KvCacheArgs& args) {
  static const bool from_env = [] {
    const char* v = std::getenv("KVFLASH_CHECK");
    return v != nullptr && std::strcmp(v, "0") != 0 && v[0] != '\0';
  }();
  return args.checked || from_env;
}

}  // namespace kvflash::core
