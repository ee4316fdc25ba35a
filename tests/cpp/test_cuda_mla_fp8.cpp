// The CUDA backend's host half for MLA over an fp8 e4m3 cache (contract 5.8, issue 16): qv and
// only_qv with a 16-bit query over an fp8 cache run the sm80 family's (64, 512) rows on every GPU
// (never sm90_mla, whose kernel reads 16-bit caches only). The kernels fold one descale into
// every score, so q reaches them scaled by k_descale and qv by v_descale, as workspace copies
// (QueryCopyParams); these tests check the parameter blocks the copies and the attention get.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/kernel_family.h"
#include "core/planner.h"
#include "core/problem.h"
#include "cuda/host/call_params.h"
#include "kvflash/errors.h"
#include "kvflash/kvflash.h"
#include "oracle/random_case.h"
#include "cpp/cuda_host_util.h"

namespace kvflash {
namespace {

using namespace testing;  // the table and the calls (cuda_host_util.h)

constexpr int kHeads = 16;  // MlaCall's query heads here, on its one KV head

// MlaCall over an fp8 e4m3 cache (k_cache and v_cache e4m3; q and qv bf16) with its descales,
// k_descale and v_descale (b, 1) interleaved in one buffer (batch stride 2).
struct Fp8MlaCall : MlaCall {
  std::vector<float> descales;
  Fp8MlaCall(int b, int s_q, int dv) : MlaCall(b, s_q, kHeads, dv), descales(2 * size_t(b), 0.5f) {
    args.k_cache->dtype = args.v_cache->dtype = DType::e4m3;
    args.k_descale = descale_view(0, b);
    args.v_descale = descale_view(1, b);
  }
  TensorView descale_view(int which, int b) {
    TensorView t = TensorView::contiguous(descales.data() + which, DType::f32, {b, 1});
    t.strides[0] = 2;
    return t;
  }
  const float* k_descale() const { return descales.data(); }
  const float* v_descale() const { return descales.data() + 1; }
};

size_t align_256(size_t bytes) { return (bytes + 255) / 256 * 256; }

// A query copy of `dim`-wide rows from `src` to `dst`: dense in the workspace (b, s_q, h, dim), or
// (total, h, dim) for varlen q (batch stride 0), head h scaled by scale[b, h / 16] (nullptr: not
// scaled).
void expect_copy(const cuda::QueryCopyParams& copy, const void* src, const char* dst, int dim, int s_q,
                 bool varlen, const float* scale) {
  EXPECT_EQ(copy.src.data, src);
  EXPECT_EQ(copy.src.head_stride, dim);
  EXPECT_EQ(copy.src.token_stride, kHeads * dim);
  EXPECT_EQ(copy.dst.data, dst);
  EXPECT_EQ(copy.dst.head_stride, dim);
  EXPECT_EQ(copy.dst.token_stride, kHeads * dim);
  EXPECT_EQ(copy.dst.batch_stride, varlen ? 0 : s_q * kHeads * dim);
  EXPECT_EQ(copy.src.batch_stride, varlen ? 0 : s_q * kHeads * dim);
  EXPECT_EQ(copy.num_heads, kHeads);
  EXPECT_EQ(copy.headdim, dim);
  EXPECT_EQ(copy.group, kHeads);
  EXPECT_EQ(copy.scale.data, scale);
  if (scale) {
    EXPECT_EQ(copy.scale.batch_stride, 2);
    EXPECT_EQ(copy.scale.head_stride, 1);
  }
}

// The attention reads what the copies wrote.
void expect_reads_copies(const cuda::CallParams& c) {
  if (c.copy_q) {
    EXPECT_EQ(c.attention.q.data, c.q_copy.dst.data);
    EXPECT_EQ(c.attention.q.batch_stride, c.q_copy.dst.batch_stride);
    EXPECT_EQ(c.attention.q.token_stride, c.q_copy.dst.token_stride);
    EXPECT_EQ(c.attention.q.head_stride, c.q_copy.dst.head_stride);
  }
  if (c.copy_qv) {
    EXPECT_EQ(c.attention.qv.data, c.qv_copy.dst.data);
    EXPECT_EQ(c.attention.qv.batch_stride, c.qv_copy.dst.batch_stride);
    EXPECT_EQ(c.attention.qv.token_stride, c.qv_copy.dst.token_stride);
    EXPECT_EQ(c.attention.qv.head_stride, c.qv_copy.dst.head_stride);
  }
}

// MLA over an fp8 cache (qv: d <= 64 or no q, d_v 256 and up; without qv: d <= 64, d_v above 256,
// the latent width) plans the sm80 family's (64, 512) kernel on every arch, decode and prefill
// shapes: the sm90_mla kernel reads 16-bit caches only (the same qv call over a 16-bit cache goes
// to it on sm_90). Each kernel has its row under both 16-bit queries.
TEST(KernelFamily, Fp8MlaRunsTheSm80MlaRows) {
  int pairs = 0;
  for (int d = 0; d <= 64; d += 16) {
    for (int dv = 256; dv <= 512; dv += 16) {
      for (bool qv : {false, true}) {
        if (!qv && (d == 0 || dv == 256)) continue;
        ++pairs;
        for (int arch : {80, 86, 89, 90, 100, 120}) {
          for (int64_t rows : {1, 9, 16, 17, 4096}) {
            SCOPED_TRACE(std::to_string(arch) + ": " + std::to_string(d) + " x " + std::to_string(dv) +
                         (qv ? " qv, " : ", ") + std::to_string(rows) + " rows");
            core::FamilyInputs in{arch, /*sixteen_bit=*/false, d, dv, rows};
            in.has_qv = qv;
            in.max_seqlen_q = 1;  // a decode: what the sm90_mla kernel takes in 16 bits
            in.one_split = true;
            const KernelChoice k = core::choose_kernel(in);
            EXPECT_EQ(k.family, KernelFamily::sm80);
            EXPECT_EQ(k.headdim, 64);
            EXPECT_EQ(k.headdim_v, 512);
            for (DType q : {bf16, f16}) EXPECT_TRUE(in_table(k, q, true));
            in.sixteen_bit = true;
            EXPECT_EQ(core::kernel_family(in), arch == 90 && qv ? KernelFamily::sm90_mla : KernelFamily::sm80);
          }
        }
      }
    }
  }
  EXPECT_EQ(pairs, 5 * 17 + 4 * 16);
}

// qv over an fp8 cache: q is copied times k_descale and qv times v_descale (each head's KV head's,
// of its batch element), both in the query's type, after any split partials in the workspace; the
// kernels read the copies with no score descales (1), and v_descale still scales the output. The
// plan is the sm80 decode kernel on an H200 too.
TEST(CudaParams, Fp8QvScalesQAndQvIntoTheWorkspace) {
  for (int dv : {256, 512}) {
    SCOPED_TRACE("d_v " + std::to_string(dv));
    Fp8MlaCall call(2, 1, dv);
    const core::Problem p = call.problem();
    EXPECT_NO_THROW(cuda::check_supported(p, call.outputs));
    const Plan plan = core::make_plan(p);
    EXPECT_EQ(plan.kernel, (KernelChoice{KernelFamily::sm80, KernelShape::decode_8, 64, 512}));
    const cuda::WorkspaceLayout layout = cuda::workspace_layout(p, plan);
    const size_t rows = 2 * kHeads;  // b x s_q x h
    EXPECT_EQ(layout.qv_copy - layout.q_copy, align_256(rows * 64 * 2));
    EXPECT_EQ(layout.total - layout.qv_copy, rows * dv * 2);
    std::vector<char> workspace(layout.total);
    const cuda::CallParams c = cuda::call_params(p, plan, call.outputs, workspace.data());
    ASSERT_TRUE(c.copy_q);
    ASSERT_TRUE(c.copy_qv);
    expect_copy(c.q_copy, call.q.data(), workspace.data() + layout.q_copy, 64, 1, false, call.k_descale());
    expect_copy(c.qv_copy, call.qv.data(), workspace.data() + layout.qv_copy, dv, 1, false, call.v_descale());
    EXPECT_EQ(c.q_copy.rotary.dim, 0);
    EXPECT_EQ(c.qv_copy.rotary.dim, 0);
    expect_reads_copies(c);
    EXPECT_EQ(c.attention.headdim, 64);
    EXPECT_EQ(c.attention.headdim_v, dv);
    EXPECT_EQ(c.attention.q_descale.data, nullptr);
    EXPECT_EQ(c.attention.k_descale.data, nullptr);
    EXPECT_EQ(c.attention.v_descale.data, call.v_descale());
    EXPECT_EQ(c.attention.v_descale.batch_stride, 2);
    EXPECT_EQ(c.attention.cache.k, call.k_cache.data());
    EXPECT_EQ(c.out_type, cuda::ElemType::bf16);
  }
}

// MLA's latent width over an fp8 cache without qv: the (64, 512) kernel folds both descales
// itself (q.k's k_descale into the score scale, v_descale into the output), no copy.
TEST(CudaParams, Fp8LatentWidthWithoutQvFoldsTheDescales) {
  Fp8MlaCall call(2, 1, 512);
  call.args.qv.reset();
  const core::Problem p = call.problem();
  EXPECT_NO_THROW(cuda::check_supported(p, call.outputs));
  const Plan plan = core::make_plan(p);
  EXPECT_EQ(plan.kernel, (KernelChoice{KernelFamily::sm80, KernelShape::decode_8, 64, 512}));
  const cuda::CallParams c = cuda::call_params(p, plan, call.outputs, nullptr);
  EXPECT_FALSE(c.copy_q);
  EXPECT_FALSE(c.copy_qv);
  EXPECT_EQ(c.attention.q.data, call.q.data());
  EXPECT_EQ(c.attention.qv.data, nullptr);
  EXPECT_EQ(c.attention.k_descale.data, call.k_descale());
  EXPECT_EQ(c.attention.v_descale.data, call.v_descale());
}

// only_qv: the scores are qv.v alone, so only qv is copied (q, given or not, is never read); an
// absent descale is 1, so its tensor is not copied either.
TEST(CudaParams, Fp8QvCopiesOnlyWhatTheScoresRead) {
  Fp8MlaCall call(2, 1, 256);
  const Plan plan = core::make_plan(call.problem());
  const size_t qv_bytes = 2 * kHeads * 256 * 2;
  for (bool q_given : {true, false}) {
    SCOPED_TRACE(q_given ? "only_qv, q and k_cache given" : "only_qv, no q nor k_cache");
    Fp8MlaCall only(2, 1, 256);
    only.args.only_qv = true;
    if (!q_given) only.args.q.reset(), only.args.k_cache.reset();
    const core::Problem p = only.problem();
    EXPECT_NO_THROW(cuda::check_supported(p, only.outputs));
    const cuda::WorkspaceLayout layout = cuda::workspace_layout(p, plan);
    EXPECT_EQ(layout.total - layout.qv_copy, qv_bytes);
    std::vector<char> workspace(layout.total);
    const cuda::CallParams c = cuda::call_params(p, plan, only.outputs, workspace.data());
    EXPECT_FALSE(c.copy_q);
    ASSERT_TRUE(c.copy_qv);
    expect_copy(c.qv_copy, only.qv.data(), workspace.data() + layout.qv_copy, 256, 1, false, only.v_descale());
    expect_reads_copies(c);
    EXPECT_EQ(c.attention.headdim, 0);
    EXPECT_EQ(c.attention.k_descale.data, nullptr);
    EXPECT_EQ(c.attention.v_descale.data, only.v_descale());
  }
  const auto copies = [&](bool k_descale, bool v_descale) {
    Fp8MlaCall partial(2, 1, 256);
    if (!k_descale) partial.args.k_descale.reset();
    if (!v_descale) partial.args.v_descale.reset();
    const core::Problem p = partial.problem();
    std::vector<char> workspace(cuda::workspace_layout(p, plan).total);
    const cuda::CallParams c = cuda::call_params(p, plan, partial.outputs, workspace.data());
    expect_reads_copies(c);
    EXPECT_EQ(c.attention.k_descale.data, nullptr);
    EXPECT_EQ(c.attention.v_descale.data, v_descale ? partial.v_descale() : nullptr);
    if (c.copy_q) EXPECT_EQ(c.q_copy.scale.data, partial.k_descale());
    return std::pair{c.copy_q, c.copy_qv};
  };
  EXPECT_EQ(copies(true, false), std::pair(true, false));
  EXPECT_EQ(copies(false, true), std::pair(false, true));
  EXPECT_EQ(copies(false, false), std::pair(false, false));
}

// Appending with rotary: new K rows are rotated and quantised by k_descale (the append kernel),
// and q is rotated and scaled in one pass (rounded to its own type after the rotation, as if
// rotated in memory, then once more after the scale); qv is never rotated.
TEST(CudaParams, Fp8QvRotatesAndScalesQInOnePass) {
  Fp8MlaCall call(2, 2, 256);
  std::vector<uint16_t> k(2 * 2 * 64), v(2 * 2 * 256), cos(64 * 32), sin(cos.size());
  call.args.k = TensorView::contiguous(k.data(), DType::bf16, {2, 2, 1, 64});
  call.args.v = TensorView::contiguous(v.data(), DType::bf16, {2, 2, 1, 256});
  call.args.rotary_cos = TensorView::contiguous(cos.data(), DType::bf16, {64, 32});
  call.args.rotary_sin = TensorView::contiguous(sin.data(), DType::bf16, {64, 32});
  call.args.causal = true;
  const core::Problem p = call.problem();
  EXPECT_NO_THROW(cuda::check_supported(p, call.outputs));
  const Plan plan = core::make_plan(p);
  const cuda::WorkspaceLayout layout = cuda::workspace_layout(p, plan);
  std::vector<char> workspace(layout.total);
  const cuda::CallParams c = cuda::call_params(p, plan, call.outputs, workspace.data());
  ASSERT_TRUE(c.append);
  EXPECT_EQ(c.append_params.rotary.dim, 64);
  EXPECT_EQ(c.append_params.k_descale.data, call.k_descale());
  EXPECT_EQ(c.append_params.v_descale.data, call.v_descale());
  ASSERT_TRUE(c.copy_q);
  expect_copy(c.q_copy, call.q.data(), workspace.data() + layout.q_copy, 64, 2, false, call.k_descale());
  EXPECT_EQ(c.q_copy.rotary.dim, 64);
  EXPECT_EQ(c.q_copy.rotary.cos, cos.data());
  EXPECT_EQ(c.q_copy.rotary.sin, sin.data());
  EXPECT_TRUE(c.q_copy.per_row);  // causal: query row i at position start + i
  ASSERT_TRUE(c.copy_qv);
  expect_copy(c.qv_copy, call.qv.data(), workspace.data() + layout.qv_copy, 256, 2, false, call.v_descale());
  EXPECT_EQ(c.qv_copy.rotary.dim, 0);
  expect_reads_copies(c);
  EXPECT_EQ(c.attention.k_descale.data, nullptr);
}

// Varlen q: the copies are (total_q, h, dim), addressed by absolute token (batch stride 0), and
// their kernels find each sequence's rows through cu_seqlens_q.
TEST(CudaParams, Fp8QvVarlenCopies) {
  Fp8MlaCall call(2, 2, 256);
  std::vector<int32_t> cu = {0, 1, 3};
  call.args.q = TensorView::contiguous(call.q.data(), DType::bf16, {3, kHeads, 64});
  call.args.qv = TensorView::contiguous(call.qv.data(), DType::bf16, {3, kHeads, 256});
  call.args.cu_seqlens_q = TensorView::contiguous(cu.data(), DType::i32, {3});
  call.args.max_seqlen_q = 2;
  call.outputs.out = TensorView::contiguous(call.out.data(), DType::bf16, {3, kHeads, 256});
  call.outputs.softmax_lse = TensorView::contiguous(call.lse.data(), DType::f32, {kHeads, 3});
  const core::Problem p = call.problem();
  const Plan plan = core::make_plan(p);
  const cuda::WorkspaceLayout layout = cuda::workspace_layout(p, plan);
  EXPECT_EQ(layout.total - layout.qv_copy, size_t(3) * kHeads * 256 * 2);
  std::vector<char> workspace(layout.total);
  const cuda::CallParams c = cuda::call_params(p, plan, call.outputs, workspace.data());
  expect_copy(c.q_copy, call.q.data(), workspace.data() + layout.q_copy, 64, 2, true, call.k_descale());
  expect_copy(c.qv_copy, call.qv.data(), workspace.data() + layout.qv_copy, 256, 2, true, call.v_descale());
  for (const cuda::QueryCopyParams* copy : {&c.q_copy, &c.qv_copy}) {
    EXPECT_EQ(copy->len.cu_seqlens_q.data, cu.data());
    EXPECT_EQ(copy->len.total_q, 3);
    EXPECT_EQ(copy->len.seqlen_q, 2);
  }
  expect_reads_copies(c);
}

// Split-KV: the copies follow the partials, the per-batch splits and the split columns in the
// workspace, each region inside its own bytes; a Plan made for the call and reused is accepted
// (its workspace is the call's, copies included), one whose decisions differ is refused.
TEST(CudaParams, Fp8QvSplitWorkspace) {
  Fp8MlaCall call(2, 1, 256);
  call.args.num_splits = 4;
  const core::Problem p = call.problem();
  const Plan plan = core::accept_plan(core::make_plan(p), p);
  ASSERT_EQ(plan.num_splits, 4);
  const cuda::WorkspaceLayout layout = cuda::workspace_layout(p, plan);
  const size_t rows = 2 * kHeads;
  EXPECT_LE(layout.out_partial + 4 * rows * 256 * 4, layout.lse_partial);
  EXPECT_LE(layout.lse_partial + 4 * rows * 4, layout.splits);
  EXPECT_LE(layout.splits + 2 * 4, layout.work);
  EXPECT_LE(layout.work + size_t(layout.work_columns) * sizeof(cuda::SplitWork), layout.q_copy);
  EXPECT_LE(layout.q_copy + rows * 64 * 2, layout.qv_copy);
  EXPECT_EQ(layout.qv_copy + rows * 256 * 2, layout.total);
  std::vector<char> workspace(layout.total);
  const cuda::CallParams c = cuda::call_params(p, plan, call.outputs, workspace.data());
  ASSERT_TRUE(c.combine);
  EXPECT_EQ(c.attention.out_partial, reinterpret_cast<float*>(workspace.data() + layout.out_partial));
  EXPECT_EQ(c.q_copy.dst.data, workspace.data() + layout.q_copy);
  EXPECT_EQ(c.qv_copy.dst.data, workspace.data() + layout.qv_copy);
  expect_reads_copies(c);

  Fp8MlaCall other(2, 1, 256);
  other.args.num_splits = 2;
  try {
    core::accept_plan(core::make_plan(other.problem()), p);
    ADD_FAILURE() << "a plan of 2 splits was accepted for a call of 4";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "scheduler_metadata");
    EXPECT_NE(std::string(e.what()).find("num_splits"), std::string::npos) << e.what();
  }
}

// The CUDA backend takes every call over an fp8 cache of the random case space, qv's and
// only_qv's among them (some host buffers are refused for their 16-byte row alignment only).
TEST(CudaParams, EveryFp8CallIsTaken) {
  int qv = 0, taken = 0;
  for (uint64_t seed = 1; seed <= 1500; ++seed) {
    oracle::Case c = oracle::make_random_case(seed);
    if (c.args.v_cache->dtype != DType::e4m3) continue;
    validate(c.args);
    const core::Problem p = core::resolve(c.args);
    const oracle::CaseOutputs outs = oracle::allocate_outputs(output_spec(c.args), false);
    SCOPED_TRACE(oracle::describe(c));
    try {
      cuda::check_supported(p, outs.outputs);
      ++taken;
      qv += p.has_qv;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("not aligned to 16 bytes"), std::string::npos) << e.what();
    }
  }
  EXPECT_GT(qv, 10);
  EXPECT_GT(taken, 100);
}

}  // namespace
}  // namespace kvflash
