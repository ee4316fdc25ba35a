// Step 1 of a call: new K/V rows into the cache (contract 5.2). Every row is written, including
// rows no query will see (upstream may skip those; the contract says the cache holds them all).
#include <cstring>
#include <vector>

#include "cpu/convert.h"
#include "cpu/kernels.h"
#include "cpu/layout.h"
#include "cpu/rotary.h"

namespace kvflash::cpu {
void append_kv(const core::Problem& p, int num_threads) {
  if (!p.has_knew) return;
  const Rotary rotary(p);
  const bool write_k = p.has_k && p.args.k.has_value();
  std::vector<core::SeqInfo> seqs(size_t(p.batch));
  for (int b = 0; b < p.batch; ++b) seqs[size_t(b)] = core::seq_info(p, b);
  const DType k_dtype = write_k ? p.args.k_cache->dtype : p.dtype;
  const size_t k_bytes = size_t(p.headdim) * dtype_size(k_dtype);
  const size_t v_bytes = size_t(p.headdim_v) * dtype_size(p.args.v_cache->dtype);

#pragma omp parallel num_threads(num_threads)
  {
    std::vector<float> k_row(size_t(p.headdim > 0 ? p.headdim : 1));
#pragma omp for schedule(dynamic, 1)
    for (int b = 0; b < p.batch; ++b) {
      const core::SeqInfo& s = seqs[size_t(b)];
      if (s.seqlen_knew == 0) continue;  // k / v may have no elements (and no data pointer)
      const CacheRows v_cache(*p.args.v_cache, p);
      const SeqRows v_new(*p.args.v, b, s.knew_offset);
      for (int t = 0; t < s.seqlen_knew; ++t) {
        const int pos = s.cache_seqlen + t;
        for (int hk = 0; hk < p.num_heads_k; ++hk) {
          std::memcpy(v_cache.row(s.cache_row, pos, hk), v_new.row(t, hk), v_bytes);
        }
      }
      if (!write_k) continue;
      const CacheRows k_cache(*p.args.k_cache, p);
      const SeqRows k_new(*p.args.k, b, s.knew_offset);
      for (int t = 0; t < s.seqlen_knew; ++t) {
        const int pos = s.cache_seqlen + t;
        for (int hk = 0; hk < p.num_heads_k; ++hk) {
          char* dst = k_cache.row(s.cache_row, pos, hk);
          std::memcpy(dst, k_new.row(t, hk), k_bytes);
          if (!rotary.enabled()) continue;
          // Rotate in fp32 and round once to the storage type (contract 5.2); the channels past
          // rotary_dim keep their bits.
          load_row(k_dtype, dst, p.rotary_dim, k_row.data());
          rotary.rotate(k_row.data(), s.rotary_start + t);
          store_row(k_dtype, k_row.data(), p.rotary_dim, dst);
        }
      }
    }
  }
}

}  // namespace kvflash::cpu
