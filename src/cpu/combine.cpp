// Merging split-KV partials through their LSE: the combine step of a call and FA3's
// flash_attn_combine, one merge routine for both.
#include <cmath>
#include <limits>
#include <vector>

#include "cpu/convert.h"
#include "cpu/kernels.h"
#include "cpu/layout.h"

namespace kvflash::cpu {

float merge_partials(int n, const float* lse, int64_t lse_stride, const float* out_rows,
                     int64_t out_stride, int d, float* merged) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  float top = kNegInf;
  for (int s = 0; s < n; ++s) top = std::max(top, lse[s * lse_stride]);
  std::fill_n(merged, d, 0.0f);
  if (top == kNegInf) return kNegInf;  // every split empty: out 0, LSE -inf, no NaN
  float sum = 0.0f;
  for (int s = 0; s < n; ++s) sum += std::exp(lse[s * lse_stride] - top);
  const float total = top + std::log(sum);
  for (int s = 0; s < n; ++s) {
    const float partial_lse = lse[s * lse_stride];
    if (partial_lse == kNegInf) continue;  // empty split: its out is never read
    const float weight = std::exp(partial_lse - total);
    const float* row = out_rows + s * out_stride;
    for (int c = 0; c < d; ++c) merged[c] += weight * row[c];
  }
  return total;
}

void combine_split_partials(const core::Problem& p, const Plan& plan, const Outputs& outputs,
                            const Partials& partials, int num_threads) {
  const HeadRowIndex lse_at(partials.lse, p.varlen_q, true);
  const HeadRowIndex out_at(partials.out, p.varlen_q, true);
  std::vector<core::SeqInfo> seqs(size_t(p.batch));
  for (int b = 0; b < p.batch; ++b) seqs[size_t(b)] = core::seq_info(p, b);
  const int pairs = p.batch * p.num_heads;
#pragma omp parallel num_threads(num_threads)
  {
    std::vector<float> merged(size_t(p.headdim_v));
#pragma omp for schedule(dynamic, 1)
    for (int x = 0; x < pairs; ++x) {
      const int b = x / p.num_heads, h = x % p.num_heads;
      const core::SeqInfo& seq = seqs[size_t(b)];
      const SeqRows out(outputs.out, b, seq.q_offset);
      for (int i = 0; i < seq.seqlen_q; ++i) {
        const float lse = merge_partials(splits_of(plan, b), lse_at.ptr(0, b, h, i, seq.q_offset),
                                         partials.lse.strides[0], out_at.ptr(0, b, h, i, seq.q_offset),
                                         partials.out.strides[0], p.headdim_v, merged.data());
        store_row(outputs.out.dtype, merged.data(), p.headdim_v, out.row(i, h));
        if (outputs.softmax_lse) {
          *HeadRowIndex(*outputs.softmax_lse, p.varlen_q, false).ptr(0, b, h, i, seq.q_offset) = lse;
        }
      }
    }
  }
}

void combine_tensors(const TensorView& out_partial, const TensorView& lse_partial,
                     const TensorView& out, const OptTensor& lse, int num_threads) {
  // out_partial (splits, <rows...>, d); lse_partial (splits, <rows...>); out (<rows...>, d).
  const int row_dims = out_partial.rank - 2;
  const int splits = int(out_partial.shape[0]);
  const int d = int(out_partial.shape[out_partial.rank - 1]);
  int64_t rows = 1;
  for (int x = 0; x < row_dims; ++x) rows *= out_partial.shape[1 + x];
#pragma omp parallel num_threads(num_threads)
  {
    std::vector<float> merged(static_cast<size_t>(d));
#pragma omp for schedule(static)
    for (int64_t row = 0; row < rows; ++row) {
      int64_t o_part = 0, l_part = 0, o_out = 0, l_out = 0;
      int64_t rest = row;
      for (int x = row_dims - 1; x >= 0; --x) {
        const int64_t index = rest % out_partial.shape[1 + x];
        rest /= out_partial.shape[1 + x];
        o_part += index * out_partial.strides[1 + x];
        l_part += index * lse_partial.strides[1 + x];
        o_out += index * out.strides[x];
        if (lse) l_out += index * lse->strides[x];
      }
      const float merged_lse = merge_partials(splits, lse_partial.ptr<const float>() + l_part,
                                              lse_partial.strides[0], out_partial.ptr<const float>() + o_part,
                                              out_partial.strides[0], d, merged.data());
      store_row(out.dtype, merged.data(), d, element_at(out, o_out));
      if (lse) lse->ptr<float>()[l_out] = merged_lse;
    }
  }
}

}  // namespace kvflash::cpu
