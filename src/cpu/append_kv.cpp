// Step 1 of a call: new K/V rows into the cache (contract 5.2). Every row is written, including
// rows no query will see (upstream may skip those; the contract says the cache holds them all).
#include <algorithm>
#include <cstring>
#include <vector>

#include "cpu/convert.h"
#include "cpu/kernels.h"
#include "cpu/layout.h"
#include "cpu/rotary.h"

namespace kvflash::cpu {
namespace {

// One side (K or V) of the new rows: where they come from and go, and how they are converted.
struct NewRows {
  const TensorView* source;  // k or v
  const TensorView* cache;   // k_cache or v_cache
  const OptTensor* descale;  // k_descale or v_descale (read only for a 16-bit row into fp8)
  int dim;
  const Rotary* rotary;      // nullptr: not rotated (V, or no rotary tables)
};

// One new row into its cache slot. Same dtype: a bit copy, the first rotary_dim channels
// rotated in fp32 and rounded once, the others keeping their bits. A 16-bit row into an fp8
// cache (contract 5.8): every channel, rotated first when rotary is on, becomes x / descale in
// fp32 rounded once to e4m3 (nearest even, saturating at +-448, NaN kept): core::float_to_e4m3.
// The descale is that of the query's batch element b (not of its cache row): the one attention
// dequantises this sequence's keys with. Read only here: without an fp8 cache descales are
// ignored, and unchecked (spec 12.8).
void write_row(const NewRows& side, const char* src, char* dst, int position, int b, int hk,
               int rotary_dim, float* row) {
  const DType from = side.source->dtype, to = side.cache->dtype;
  if (from == to) {
    std::memcpy(dst, src, size_t(side.dim) * dtype_size(to));
    if (!side.rotary) return;
    load_row(to, dst, rotary_dim, row);
    side.rotary->rotate(row, position);
    store_row(to, row, rotary_dim, dst);
    return;
  }
  load_row(from, src, side.dim, row);
  if (side.rotary) side.rotary->rotate(row, position);
  const float descale = descale_at(*side.descale, b, hk);
  for (int c = 0; c < side.dim; ++c) row[c] /= descale;
  store_row(to, row, side.dim, dst);
}

void append_rows(const core::Problem& p, const NewRows& side, int b, const core::SeqInfo& s,
                 float* row) {
  const CacheRows cache(*side.cache, p);
  const SeqRows source(*side.source, b, s.knew_offset);
  for (int t = 0; t < s.seqlen_knew; ++t) {
    for (int hk = 0; hk < p.num_heads_k; ++hk) {
      write_row(side, source.row(t, hk), cache.row(s.cache_row, s.cache_seqlen + t, hk),
                s.rotary_start + t, b, hk, p.rotary_dim, row);
    }
  }
}

}  // namespace

void append_kv(const core::Problem& p, int num_threads) {
  if (!p.has_knew) return;
  const Rotary rotary(p);
  const bool write_k = p.has_k && p.args.k.has_value();
  std::vector<core::SeqInfo> seqs(size_t(p.batch));
  for (int b = 0; b < p.batch; ++b) seqs[size_t(b)] = core::seq_info(p, b);
  const NewRows v_side{&*p.args.v, &*p.args.v_cache, &p.args.v_descale, p.headdim_v, nullptr};
  const NewRows k_side{write_k ? &*p.args.k : nullptr, write_k ? &*p.args.k_cache : nullptr,
                       &p.args.k_descale, p.headdim, rotary.enabled() ? &rotary : nullptr};

#pragma omp parallel num_threads(num_threads)
  {
    std::vector<float> row(size_t(std::max(p.headdim, p.headdim_v)));
#pragma omp for schedule(dynamic, 1)
    for (int b = 0; b < p.batch; ++b) {
      const core::SeqInfo& s = seqs[size_t(b)];
      if (s.seqlen_knew == 0) continue;  // k / v may have no elements (and no data pointer)
      append_rows(p, v_side, b, s, row.data());
      if (write_k) append_rows(p, k_side, b, s, row.data());
    }
  }
}

}  // namespace kvflash::cpu
