// kvflash::combine (FA3's flash_attn_combine) on the GPU against the same call on the CPU, over
// random partials with empty (-inf) splits mixed in, for both the batched and the varlen forms.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "gpu/gpu_util.h"
#include "kvflash/kvflash.h"

namespace kvflash::gpu_test {

int run_combine() {
  std::mt19937 rng(99);
  int failures = 0, cases = 0;
  for (int trial = 0; trial < 24; ++trial, ++cases) {
    const bool batched = trial % 2 == 0;
    const int splits = 1 + int(rng() % 9), b = 1 + int(rng() % 3), s = 1 + int(rng() % 17);
    const int h = 1 + int(rng() % 5), d = 8 * (1 + int(rng() % 32));
    const int64_t rows = int64_t(b) * s * h;
    std::vector<float> op(static_cast<size_t>(splits * rows * d)), lp(static_cast<size_t>(splits * rows));
    std::normal_distribution<float> normal(0.0f, 2.0f);
    for (float& x : op) x = normal(rng);
    for (float& x : lp) x = rng() % 4 == 0 ? -INFINITY : normal(rng);
    std::vector<float> out_cpu(static_cast<size_t>(rows * d)), lse_cpu(static_cast<size_t>(rows));
    std::vector<float> out_gpu(out_cpu.size()), lse_gpu(lse_cpu.size());
    auto views = [&](void* o_p, void* l_p, void* o, void* l, Device dev, TensorView (&v)[4]) {
      if (batched) {
        v[0] = TensorView::contiguous(o_p, DType::f32, {splits, b, s, h, d}, dev);
        v[1] = TensorView::contiguous(l_p, DType::f32, {splits, b, s, h}, dev);
        v[2] = TensorView::contiguous(o, DType::f32, {b, s, h, d}, dev);
        v[3] = TensorView::contiguous(l, DType::f32, {b, s, h}, dev);
      } else {
        v[0] = TensorView::contiguous(o_p, DType::f32, {splits, b * s, h, d}, dev);
        v[1] = TensorView::contiguous(l_p, DType::f32, {splits, b * s, h}, dev);
        v[2] = TensorView::contiguous(o, DType::f32, {b * s, h, d}, dev);
        v[3] = TensorView::contiguous(l, DType::f32, {b * s, h}, dev);
      }
    };
    TensorView host[4];
    views(op.data(), lp.data(), out_cpu.data(), lse_cpu.data(), Device{}, host);
    DeviceMirror mirror;
    TensorView dev[4];
    for (int i = 0; i < 4; ++i) dev[i] = mirror.upload(host[i]);
    try {
      combine(host[0], host[1], host[2], host[3]);
      combine(dev[0], dev[1], dev[2], dev[3]);
    } catch (const Error& e) {
      std::printf("combine: the call threw %s\n", e.what());
      ++failures;
      continue;
    }
    check(cudaDeviceSynchronize(), "combine");
    TensorView back_out = host[2], back_lse = host[3];
    back_out.data = out_gpu.data();
    back_lse.data = lse_gpu.data();
    DeviceMirror::download(back_out, dev[2]);
    DeviceMirror::download(back_lse, dev[3]);
    double worst = 0;
    for (size_t i = 0; i < out_cpu.size(); ++i) worst = std::max(worst, double(std::fabs(out_cpu[i] - out_gpu[i])));
    for (size_t i = 0; i < lse_cpu.size(); ++i) {
      const bool both_inf = std::isinf(lse_cpu[i]) && lse_cpu[i] == lse_gpu[i];
      if (!both_inf) worst = std::max(worst, double(std::fabs(lse_cpu[i] - lse_gpu[i])));
    }
    if (!(worst <= 1e-4)) {
      ++failures;
      std::printf("combine FAIL: splits %d b %d s %d h %d d %d %s: max |cpu - gpu| = %g\n", splits, b, s, h, d,
                  batched ? "batched" : "varlen", worst);
    }
  }
  std::printf("combine: %d of %d cases match the CPU backend\n", cases - failures, cases);
  return failures == 0 ? 0 : 1;
}

}  // namespace kvflash::gpu_test
