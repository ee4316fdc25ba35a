// One CPU call through an installed kvflash: four cached keys, all equal, so every key gets the
// same weight and the output is the mean of the four value rows, whatever the query.
#include <kvflash/kvflash.h>
#include <kvflash/version.h>

#include <cmath>
#include <cstdio>
#include <vector>

int main() {
  constexpr int kKeys = 4, kDim = 8;
  std::vector<float> q(kDim, 0.5f), k_cache(kKeys * kDim, 1.0f), v_cache(kKeys * kDim), out(kDim);
  for (int i = 0; i < kKeys * kDim; ++i) v_cache[i] = float(i / kDim);  // row n holds n
  using kvflash::DType;
  using kvflash::TensorView;
  kvflash::KvCacheArgs args;
  args.q = TensorView::contiguous(q.data(), DType::f32, {1, 1, 1, kDim});
  args.k_cache = TensorView::contiguous(k_cache.data(), DType::f32, {1, kKeys, 1, kDim});
  args.v_cache = TensorView::contiguous(v_cache.data(), DType::f32, {1, kKeys, 1, kDim});
  kvflash::Outputs outputs;
  outputs.out = TensorView::contiguous(out.data(), DType::f32, {1, 1, 1, kDim});
  kvflash::flash_attn_with_kvcache(args, outputs);
  for (float x : out) {
    if (std::fabs(x - 1.5f) > 1e-6f) {
      std::printf("consumer: out %g, expected 1.5\n", x);
      return 1;
    }
  }
  std::printf("consumer: kvflash %s, out = 1.5 as expected\n", KVFLASH_VERSION_STRING);
  return 0;
}
