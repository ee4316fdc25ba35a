#include "cuda/host/call_params.h"

#include <string>

#include "core/heuristics.h"
#include "core/limits.h"
#include "core/split_rule.h"
#include "kvflash/errors.h"

namespace kvflash::cuda {
namespace {

[[noreturn]] void unsupported(const std::string& argument, const std::string& what) {
  throw Error(ErrorKind::unsupported, argument, what + " not supported on CUDA yet");
}

size_t align_up(size_t n) { return (n + 255) / 256 * 256; }

IntVec int_vec(const OptTensor& t) {
  if (!t) return {};
  return IntVec{t->ptr<const int32_t>(), t->rank > 0 ? t->stride(0) : 1};
}

// The kernels move 16-byte chunks of rows: rows must start on 16-byte boundaries.
void require_aligned_rows(const OptTensor& t, const char* name) {
  if (!t) return;
  const int64_t align = core::kCudaRowAlignBytes;
  bool ok = reinterpret_cast<uintptr_t>(t->data) % align == 0;
  for (int i = 0; i + 1 < t->rank; ++i) ok = ok && (t->stride(i) * int64_t(dtype_size(t->dtype))) % align == 0;
  if (!ok) {
    throw Error(ErrorKind::unsupported, name,
                std::string(name) + " with rows not aligned to 16 bytes (strides " +
                    "and data pointer) is not supported on CUDA yet");
  }
}

int64_t q_rows(const core::Problem& p) { return p.varlen_q ? p.total_q : int64_t(p.batch) * p.seqlen_q; }

LengthParams length_params(const core::Problem& p) {
  const KvCacheArgs& a = p.args;
  LengthParams l;
  l.batch = p.batch;
  l.seqlen_q = p.seqlen_q;
  l.total_q = int(q_rows(p));
  l.cu_seqlens_q = int_vec(a.cu_seqlens_q);
  l.cache_seqlens = int_vec(a.cache_seqlens);
  l.cache_seqlens_value = a.cache_seqlens ? -1 : a.cache_seqlens_value.value_or(-1);
  l.cache_leftpad = int_vec(a.cache_leftpad);
  l.cache_batch_idx = int_vec(a.cache_batch_idx);
  l.num_cache_seqs = p.paged ? int(a.page_table->size(0)) : p.num_cache_rows;
  l.capacity = p.seqlen_k;
  l.has_knew = p.has_knew;
  l.cu_seqlens_k_new = int_vec(a.cu_seqlens_k_new);
  l.seqlen_knew = p.knew_packed ? 0 : p.seqlen_knew;
  l.total_knew = p.has_knew ? int(p.knew_packed ? a.k->size(0) : int64_t(p.batch) * p.seqlen_knew) : 0;
  // Read only when rotary is on (as core::seq_info): its entries are unbounded otherwise.
  if (p.rotary_dim > 0) l.rotary_seqlens = int_vec(a.rotary_seqlens);
  return l;
}

// Without k_cache (only_qv) the K addressing is V's: the kernels then read no K element
// (AttentionParams::headdim 0) but every address they form stays inside a tensor.
CacheParams cache_params(const core::Problem& p) {
  const KvCacheArgs& a = p.args;
  CacheParams c;
  const TensorView& v = *a.v_cache;
  const TensorView& k = a.k_cache ? *a.k_cache : v;
  c.k = k.data;
  c.v = v.data;
  c.k_row_stride = k.stride(0), c.k_pos_stride = k.stride(1), c.k_head_stride = k.stride(2);
  c.v_row_stride = v.stride(0), c.v_pos_stride = v.stride(1), c.v_head_stride = v.stride(2);
  c.paged = p.paged;
  if (p.paged) {
    c.page_size = core::FastDivisor(p.page_size);
    c.num_pages = int(k.size(0) < v.size(0) ? k.size(0) : v.size(0));
    c.page_table = a.page_table->ptr<const int32_t>();
    c.page_table_row_stride = a.page_table->stride(0);
    c.page_table_col_stride = a.page_table->stride(1);
    c.pages_per_seq = int(a.page_table->size(1));
  }
  return c;
}

// The call's rotary tables (dim 0: no rotary).
RotaryParams rotary_params(const core::Problem& p) {
  RotaryParams r;
  if (p.rotary_dim <= 0) return r;
  const KvCacheArgs& a = p.args;
  r.cos = a.rotary_cos->data, r.sin = a.rotary_sin->data;
  r.row_stride = a.rotary_cos->stride(0), r.col_stride = a.rotary_cos->stride(1);
  r.rows = int(a.rotary_cos->size(0));
  r.dim = p.rotary_dim, r.interleaved = p.rotary_interleaved;
  return r;
}

// (batch, token, head) addressing of a (b, s, h, d) or varlen (total, h, d) tensor.
RowLayout row_layout(const TensorView& t, bool varlen) {
  if (varlen) return RowLayout{t.data, 0, t.stride(0), t.stride(1)};
  return RowLayout{t.data, t.stride(0), t.stride(1), t.stride(2)};
}

// Whether the scores have the q.k term (q may be absent, or ignored with only_qv: spec 3).
bool uses_qk(const core::Problem& p) { return p.has_q && p.has_k && !p.only_qv; }

// An fp8 q the plan's kernel reads in 16 bits: converted to bf16 into the workspace.
bool converts_fp8_query(const core::Problem& p, const Plan& plan) { return p.fp8 && !reads_fp8_query(p, plan); }

DescaleView descale_view(const OptTensor& t) {
  if (!t) return {};
  return DescaleView{t->ptr<const float>(), t->stride(0), t->stride(1)};
}

// qv over an fp8 cache: the kernels fold one factor into every score (q_descale * k_descale,
// common/cta_work.cuh ScoreScale), which cannot give the qv.v term v_descale apart from q.k's
// k_descale. So q is scaled by k_descale and qv by v_descale into their copies, rounded once to
// the query's type, and the kernels get no score descales; v_descale still scales the output.
// (A 16-bit query: validate refuses an fp8 qv, and a qv of another dtype than q.)
bool scales_queries(const core::Problem& p) { return p.fp8_cache && p.has_qv; }

// The factors q's and qv's copies are scaled by (data nullptr: not scaled; an absent descale is 1).
DescaleView q_scale(const core::Problem& p) {
  return scales_queries(p) ? descale_view(p.args.k_descale) : DescaleView{};
}
DescaleView qv_scale(const core::Problem& p) {
  return scales_queries(p) ? descale_view(p.args.v_descale) : DescaleView{};
}

// Whether the attention reads q from a copy in the workspace: rotated (rotary), converted or
// scaled. A q the scores ignore (absent, or only_qv) is not copied.
bool copies_q(const core::Problem& p, const Plan& plan) {
  return uses_qk(p) && (p.rotary_dim > 0 || converts_fp8_query(p, plan) || q_scale(p).data);
}
bool copies_qv(const core::Problem& p) { return qv_scale(p).data != nullptr; }

// q's copy's element: bf16 for a converted fp8 q, else q's own type (rotated or scaled, rounded
// once). qv's copy is of qv's type, which is q's.
size_t q_copy_elem_bytes(const core::Problem& p, const Plan& plan) {
  return converts_fp8_query(p, plan) ? 2 : dtype_size(p.dtype);
}

// A copy of the query rows `src` (`dim` wide) into the workspace at `dst`, dense in the query's
// (batch, token, head) order, not rotated nor scaled.
QueryCopyParams query_copy(const core::Problem& p, const LengthParams& len, const RowLayout& src, int dim,
                           char* dst) {
  QueryCopyParams c;
  c.len = len;
  c.src = src;
  const int64_t row = int64_t(p.num_heads) * dim;
  c.dst = RowLayout{dst, p.varlen_q ? 0 : int64_t(p.seqlen_q) * row, row, dim};
  c.num_heads = p.num_heads, c.headdim = dim, c.group = p.group;
  return c;
}

AttentionParams attention_params(const core::Problem& p, const Plan& plan, const Outputs& outputs,
                                 const LengthParams& len, const CacheParams& cache) {
  const KvCacheArgs& a = p.args;
  AttentionParams at;
  at.len = len;
  at.cache = cache;
  // Without q.k the query rows are qv's (q may be absent): never read, headdim 0.
  at.q = row_layout(uses_qk(p) ? *a.q : *a.qv, p.varlen_q);
  if (a.qv) at.qv = row_layout(*a.qv, p.varlen_q);
  at.out = row_layout(outputs.out, p.varlen_q);
  if (outputs.softmax_lse) {
    const TensorView& l = *outputs.softmax_lse;  // (b, h, s_q) | (h, total_q)
    at.lse = l.ptr<float>();
    if (p.varlen_q) at.lse_head_stride = l.stride(0), at.lse_token_stride = l.stride(1);
    else at.lse_batch_stride = l.stride(0), at.lse_head_stride = l.stride(1), at.lse_token_stride = l.stride(2);
  }
  at.num_heads = p.num_heads, at.num_heads_k = p.num_heads_k, at.group = p.group;
  at.headdim = uses_qk(p) ? p.headdim : 0, at.headdim_v = p.headdim_v;
  at.softmax_scale = p.softmax_scale, at.softcap = p.softcap;
  at.window_left = p.window_left, at.window_right = p.window_right;
  at.attention_chunk = p.attention_chunk;
  if (a.sinks) {
    if (a.sinks->dtype == DType::f32) at.sinks_f32 = a.sinks->ptr<const float>();
    else at.sinks_bf16 = a.sinks->ptr<const uint16_t>();
    at.sinks_stride = a.sinks->stride(0);
  }
  if (p.fp8_cache) {  // descales are read only for fp8 tensors (spec 12.8)
    if (!scales_queries(p)) {  // else they are in the query copies
      if (p.fp8) at.q_descale = descale_view(a.q_descale);
      at.k_descale = descale_view(a.k_descale);
    }
    at.v_descale = descale_view(a.v_descale);
  }
  at.num_splits = plan.num_splits;
  at.split_block_n = plan.block_n > 0 ? plan.block_n : 64;
  return at;
}

// Partials in FA3's shapes: (splits, b, h, s, dv) | (splits, h, total, dv), caller's or ours.
// The caller's hold every split of every element, as FA3's do (unused splits: LSE -inf); ours
// only the splits the lengths need: the grid launches those alone, an element with one split
// writes out itself, and the combine skips it.
void partial_layout(const core::Problem& p, const Plan& plan, const Outputs& outputs, char* ws,
                    const WorkspaceLayout& layout, AttentionParams& at) {
  const int64_t h = p.num_heads, dv = p.headdim_v, rows_per_batch = p.varlen_q ? p.total_q : p.seqlen_q;
  const bool caller_partials = outputs.out_accum && outputs.softmax_lse_accum;
  at.single_split_writes_out = !caller_partials;
  if (caller_partials) {
    const TensorView& o = *outputs.out_accum;
    const TensorView& l = *outputs.softmax_lse_accum;
    at.out_partial = o.ptr<float>(), at.lse_partial = l.ptr<float>();
    at.op_split_stride = o.stride(0), at.lp_split_stride = l.stride(0);
    if (p.varlen_q) {
      at.op_head_stride = o.stride(1), at.op_token_stride = o.stride(2);
      at.lp_head_stride = l.stride(1), at.lp_token_stride = l.stride(2);
    } else {
      at.op_batch_stride = o.stride(1), at.op_head_stride = o.stride(2), at.op_token_stride = o.stride(3);
      at.lp_batch_stride = l.stride(1), at.lp_head_stride = l.stride(2), at.lp_token_stride = l.stride(3);
    }
  } else {
    at.out_partial = reinterpret_cast<float*>(ws + layout.out_partial);
    at.lse_partial = reinterpret_cast<float*>(ws + layout.lse_partial);
    at.op_token_stride = dv, at.op_head_stride = rows_per_batch * dv;
    at.op_batch_stride = p.varlen_q ? 0 : h * rows_per_batch * dv;
    at.op_split_stride = int64_t(p.varlen_q ? 1 : p.batch) * h * rows_per_batch * dv;
    at.lp_token_stride = 1, at.lp_head_stride = rows_per_batch;
    at.lp_batch_stride = p.varlen_q ? 0 : h * rows_per_batch;
    at.lp_split_stride = int64_t(p.varlen_q ? 1 : p.batch) * h * rows_per_batch;
  }
  at.rule.block_m = plan.block_m > 0 ? plan.block_m : 64;
  at.rule.block_n = at.split_block_n;
  at.rule.group = plan.pack_gqa ? p.group : 1;
  at.rule.heads = core::scheduled_heads(plan);
  at.rule.num_sms = core::usable_sms(plan.key);
  at.rule.ctas_per_sm = core::family_ctas_per_sm(plan.kernel.family);
  at.rule.batch_invariant = plan.key.batch_invariant;
}

// The combine reads the partials as rows (batch, token, head) -> out / LSE.
CombineParams split_combine_params(const core::Problem& p, const Plan& plan, const AttentionParams& at) {
  CombineParams cp;
  cp.out_partial = at.out_partial, cp.lse_partial = at.lse_partial;
  cp.op_split = at.op_split_stride, cp.lp_split = at.lp_split_stride;
  cp.op_a = at.op_batch_stride, cp.op_b = at.op_token_stride, cp.op_c = at.op_head_stride;
  cp.lp_a = at.lp_batch_stride, cp.lp_b = at.lp_token_stride, cp.lp_c = at.lp_head_stride;
  cp.out = at.out.data;
  cp.o_a = at.out.batch_stride, cp.o_b = at.out.token_stride, cp.o_c = at.out.head_stride;
  cp.lse = at.lse;
  cp.l_a = at.lse_batch_stride, cp.l_b = at.lse_token_stride, cp.l_c = at.lse_head_stride;
  // Ours are combined per (element, query index, head), skipping one-split elements.
  const bool by_sequence = at.single_split_writes_out;
  const int rows_per_batch = p.varlen_q ? p.total_q : p.seqlen_q;
  cp.dim_a = p.varlen_q && !by_sequence ? 1 : p.batch;
  cp.dim_b = by_sequence ? p.seqlen_q : rows_per_batch;
  cp.dim_c = p.num_heads;
  cp.num_splits = plan.num_splits;
  cp.headdim_v = p.headdim_v;
  if (by_sequence) {
    cp.splits_per_batch = at.splits_per_batch, cp.splits_alone = at.splits_alone;
    cp.rule = at.rule, cp.len = at.len;
  }
  return cp;
}

}  // namespace

bool reads_fp8_query(const core::Problem& p, const Plan& plan) {
  return p.fp8 && plan.kernel.family == KernelFamily::sm90;
}

WorkspaceLayout workspace_layout(const core::Problem& p, const Plan& plan) {
  WorkspaceLayout w;
  size_t at = 0;
  const size_t rows = size_t(q_rows(p)) * size_t(p.num_heads);
  if (plan.num_splits > 1) {
    w.out_partial = at;
    at += align_up(size_t(plan.num_splits) * rows * size_t(p.headdim_v) * 4);
    w.lse_partial = at;
    at += align_up(size_t(plan.num_splits) * rows * 4);
    w.splits = at;
    at += align_up(size_t(p.batch) * 4);
    w.work_columns = int(core::portable_split_columns(p.batch, plan.num_splits,
                                                      core::scheduled_heads(plan),
                                                      core::usable_sms(plan.key),
                                                      core::family_ctas_per_sm(plan.kernel.family)));
    w.work = at;
    at += align_up(size_t(w.work_columns) * sizeof(SplitWork));
  }
  if (copies_q(p, plan)) {
    w.q_copy = at;
    at += align_up(rows * size_t(p.headdim) * q_copy_elem_bytes(p, plan));
  }
  if (copies_qv(p)) {
    w.qv_copy = at;
    at += align_up(rows * size_t(p.headdim_v) * dtype_size(p.dtype));
  }
  w.total = at;
  return w;
}

CallParams call_params(const core::Problem& p, const Plan& plan, const Outputs& outputs, char* ws) {
  const KvCacheArgs& a = p.args;
  const WorkspaceLayout layout = workspace_layout(p, plan);
  const LengthParams len = length_params(p);
  const CacheParams cache = cache_params(p);
  CallParams call;
  call.out_type = p.dtype == DType::f16 ? ElemType::f16 : ElemType::bf16;

  if (p.has_knew) {
    AppendParams& ap = call.append_params;
    call.append = true;
    ap.len = len;
    ap.cache = cache;
    ap.k_new = row_layout(*a.k, p.knew_packed);
    ap.v_new = row_layout(*a.v, p.knew_packed);
    ap.num_heads_k = p.num_heads_k, ap.headdim = p.headdim, ap.headdim_v = p.headdim_v;
    ap.rotary = rotary_params(p);
    if (p.fp8_cache) ap.k_descale = descale_view(a.k_descale), ap.v_descale = descale_view(a.v_descale);
    call.append_rows = p.knew_packed ? len.total_knew : p.seqlen_knew;
  }

  AttentionParams& at = call.attention;
  at = attention_params(p, plan, outputs, len, cache);
  if (copies_q(p, plan)) {
    call.copy_q = true;
    call.q_copy = query_copy(p, len, at.q, p.headdim, ws + layout.q_copy);
    call.q_copy.rotary = rotary_params(p);
    call.q_copy.per_row = p.rotate_q_per_row;
    call.q_copy.scale = q_scale(p);
    at.q = call.q_copy.dst;
  }
  if (copies_qv(p)) {
    call.copy_qv = true;
    call.qv_copy = query_copy(p, len, at.qv, p.headdim_v, ws + layout.qv_copy);
    call.qv_copy.scale = qv_scale(p);
    at.qv = call.qv_copy.dst;
  }
  if (plan.num_splits <= 1) return call;

  partial_layout(p, plan, outputs, ws, layout, at);
  if (a.scheduler_metadata) {  // FA3's layout starts with the per-batch splits (read clamped)
    at.splits_per_batch = a.scheduler_metadata->ptr<const int32_t>();
  } else if (p.batch == 1 || plan.key.batch_invariant) {
    // Batch-invariant mode needs only the sequence's own lengths, whatever the batch.
    at.splits_alone = true;  // no prepare kernel: the kernels compute the one sequence's splits
  } else {
    PrepareParams& pp = call.prepare_params;
    call.prepare = true;
    pp.len = len;
    pp.num_splits = plan.num_splits;
    pp.rule = at.rule;
    pp.splits_out = reinterpret_cast<int32_t*>(ws + layout.splits);
    // Split columns only where they launch fewer CTAs than batch x num_splits; elsewhere the
    // CTAs skip reading their column first.
    if (at.single_split_writes_out && layout.work_columns < int64_t(p.batch) * plan.num_splits) {
      pp.work_out = reinterpret_cast<SplitWork*>(ws + layout.work);
      pp.num_work = layout.work_columns;
    }
    at.splits_per_batch = pp.splits_out;
    at.split_work = pp.work_out, at.num_split_work = pp.num_work;
  }
  call.combine = true;
  call.combine_params = split_combine_params(p, plan, at);
  return call;
}

CombineParams combine_params(const TensorView& out_partial, const TensorView& lse_partial,
                             const TensorView& out, const OptTensor& lse) {
  const bool batched = out_partial.rank == 5;
  const int o = batched ? 1 : 0;  // first row dim after the split dim
  CombineParams cp;
  cp.out_partial = out_partial.ptr<const float>(), cp.lse_partial = lse_partial.ptr<const float>();
  cp.op_split = out_partial.stride(0), cp.lp_split = lse_partial.stride(0);
  cp.op_a = batched ? out_partial.stride(1) : 0, cp.op_b = out_partial.stride(1 + o), cp.op_c = out_partial.stride(2 + o);
  cp.lp_a = batched ? lse_partial.stride(1) : 0, cp.lp_b = lse_partial.stride(1 + o), cp.lp_c = lse_partial.stride(2 + o);
  cp.out = out.data;
  cp.o_a = batched ? out.stride(0) : 0, cp.o_b = out.stride(o), cp.o_c = out.stride(1 + o);
  if (lse) {
    cp.lse = lse->ptr<float>();
    cp.l_a = batched ? lse->stride(0) : 0, cp.l_b = lse->stride(o), cp.l_c = lse->stride(1 + o);
  }
  cp.dim_a = batched ? int(out_partial.size(1)) : 1;
  cp.dim_b = int(out_partial.size(1 + o));
  cp.dim_c = int(out_partial.size(2 + o));
  cp.num_splits = int(out_partial.size(0));
  cp.headdim_v = int(out_partial.size(-1));
  return cp;
}

int rows_per_cta(const Plan& plan) {
  switch (plan.kernel.shape) {
    case KernelShape::decode_8: return 8;
    case KernelShape::decode_16: return 16;
    default: return plan.block_m > 0 ? plan.block_m : 1;
  }
}

void check_supported(const core::Problem& p, const Outputs& outputs) {
  if (p.dtype != DType::bf16 && p.dtype != DType::f16 && p.dtype != DType::e4m3) {
    unsupported("q", std::string("dtype ") + dtype_name(p.dtype) + " is");
  }
  if (p.headdim % core::kCudaHeadDimMultiple != 0 || p.headdim_v % core::kCudaHeadDimMultiple != 0) {
    unsupported("q", "head dims not a multiple of 8 are");
  }
  const KvCacheArgs& a = p.args;
  require_aligned_rows(a.q, "q");
  require_aligned_rows(a.qv, "qv");
  require_aligned_rows(a.k_cache, "k_cache");
  require_aligned_rows(a.v_cache, "v_cache");
  require_aligned_rows(a.k, "k");
  require_aligned_rows(a.v, "v");
  require_aligned_rows(outputs.out, "out");
}

void check_launchable(const CallParams& call, const Plan& plan) {
  const AttentionGrid g = attention_grid(call.attention, rows_per_cta(plan));
  if (g.x > core::kCudaMaxGridX) {
    throw Error(ErrorKind::unsupported, "q",
                "more than 2^31 - 1 query tiles per KV head are not supported on CUDA yet (got " +
                    std::to_string(g.x) + ")");
  }
  if (g.z > core::kCudaMaxGridYZ) {
    throw Error(ErrorKind::unsupported, "num_splits",
                "batch * num_splits above 65535 is not supported on CUDA yet (got " +
                    std::to_string(g.z) + ")");
  }
  if (g.y > core::kCudaMaxGridYZ) {
    throw Error(ErrorKind::unsupported, "k_cache",
                "more than 65535 KV heads are not supported on CUDA yet (got " + std::to_string(g.y) + ")");
  }
  // The d_v 512 prefill CTA's shared memory (core/limits.h): refused on GPUs with less per CTA.
  const int arch = plan.key.arch;
  if (plan.kernel.shape == KernelShape::prefill && plan.kernel.headdim_v == 512 &&
      core::cuda_max_smem_per_cta_kb(arch) < core::kCudaMla512PrefillSmemKB) {
    throw Error(ErrorKind::unsupported, "q",
                "head dim 512 of V (MLA) with more than 16 query rows per KV head needs " +
                    std::to_string(core::kCudaMla512PrefillSmemKB) +
                    " KB of shared memory per CTA (sm_80, sm_87, sm_90, sm_100, sm_103); sm_" +
                    std::to_string(arch) + " is not supported on CUDA yet");
  }
  const int64_t batch = call.attention.len.batch;
  if ((call.append || call.copy_q || call.copy_qv) && batch > core::kCudaMaxGridYZ) {
    throw Error(ErrorKind::unsupported, "q",
                "a batch above 65535 with new k / v or a query copied first (rotary, an fp8 q, qv "
                "over an fp8 cache) is not supported on CUDA yet (got " + std::to_string(batch) + ")");
  }
}

void check_combine(const CombineParams& p) {
  if (p.headdim_v > core::kCudaMaxHeadDimV) unsupported("out_partial", "combine of head dims above 512 is");
}

}  // namespace kvflash::cuda
