// When a call runs on the sm90 prefill family (prefill.h). Host code, in every CUDA build.
#include "cuda/sm90/prefill.h"

namespace kvflash::cuda::sm90 {

bool prefill_takes(const core::Problem& p, const Plan& plan) {
#if defined(KVFLASH_WITH_SM90)
  if (plan.key.arch != 90 || plan.num_splits != 1) return false;
  if (p.dtype != DType::bf16 && p.dtype != DType::f16) return false;
  if (p.fp8 || p.has_qv || p.only_qv || !p.has_q) return false;
  if (p.headdim != p.headdim_v || (p.headdim != 64 && p.headdim != 128 && p.headdim != 256)) return false;
  if (p.seqlen_q < 64 || p.total_q < 1 || p.seqlen_k < 1 || p.num_cache_rows < 1) return false;
  if (p.paged && (p.page_size % prefill_block_n(p.headdim) != 0 || p.args.cache_leftpad)) return false;
  return true;
#else
  (void)p, (void)plan;
  return false;
#endif
}

}  // namespace kvflash::cuda::sm90
