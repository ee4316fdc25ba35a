// libFuzzer target: Plan (de)serialisation. get_scheduler_metadata over fuzzed arguments (host
// length tensors included); a plan it makes must survive to_fa3 -> from_fa3 unchanged. Then
// Plan::from_fa3 over an arbitrary PlanKey and arbitrary int32 words: an Error, or a plan whose
// vectors pass check_plan_vectors (to_fa3 runs it) and serialise back to the same words.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "call_builder.h"

namespace {

using namespace kvflash;

SchedulerArgs scheduler_args(fuzz::CallBuilder& call, FuzzedDataProvider& in) {
  SchedulerArgs a;
  a.batch_size = in.ConsumeIntegralInRange(-1, 6);
  a.max_seqlen_q = in.ConsumeIntegralInRange(-1, 300);
  a.max_seqlen_k = in.ConsumeBool() ? call.value() : in.ConsumeIntegralInRange(0, 100000);
  a.num_heads_q = in.ConsumeIntegralInRange(0, 64);
  a.num_heads_kv = in.ConsumeIntegralInRange(0, 16);
  a.headdim = in.ConsumeBool() ? 128 : call.value();
  if (in.ConsumeBool()) a.headdim_v = call.value();
  const DType dtypes[] = {DType::bf16, DType::f16, DType::e4m3, DType::f32, DType::i32};
  a.qkv_dtype = dtypes[in.ConsumeIntegralInRange(0, 4)];
  const auto lengths = [&](int64_t n) {
    TensorView t = call.tensor(DType::i32, {n < 0 ? 0 : n});
    for (int64_t i = 0; i < n; ++i) t.ptr<int32_t>()[i] = call.value();
    return t;
  };
  if (in.ConsumeBool()) a.cache_seqlens = lengths(a.batch_size);
  if (in.ConsumeBool()) a.cu_seqlens_q = lengths(a.batch_size + 1);
  if (in.ConsumeBool()) a.cu_seqlens_k_new = lengths(a.batch_size + 1);
  if (in.ConsumeBool()) a.cache_leftpad = lengths(a.batch_size);
  if (in.ConsumeBool()) a.page_size = call.value();
  a.max_seqlen_k_new = in.ConsumeIntegralInRange(-1, 4);
  a.causal = in.ConsumeBool();
  a.window_left = in.ConsumeIntegralInRange(-2, 64);
  a.window_right = in.ConsumeIntegralInRange(-2, 64);
  a.attention_chunk = in.ConsumeIntegralInRange(-1, 64);
  a.has_softcap = in.ConsumeBool();
  a.num_splits = in.ConsumeIntegralInRange(-1, 300);
  if (in.ConsumeBool()) a.pack_gqa = in.ConsumeBool();
  a.sm_margin = in.ConsumeIntegralInRange(-1, 8);
  a.has_qv = in.ConsumeBool();
  return a;
}

PlanKey any_key(fuzz::CallBuilder& call, FuzzedDataProvider& in) {
  PlanKey k;
  k.batch = in.ConsumeIntegralInRange(-2, 40);
  for (int* field : {&k.max_seqlen_q, &k.max_seqlen_k, &k.num_heads, &k.num_heads_k, &k.headdim,
                     &k.headdim_v, &k.page_size, &k.max_seqlen_k_new, &k.window_left,
                     &k.window_right, &k.attention_chunk, &k.num_splits, &k.pack_gqa,
                     &k.sm_margin, &k.num_sms, &k.arch}) {
    *field = call.value();
  }
  k.dtype = static_cast<DType>(in.ConsumeIntegralInRange(0, 5));
  k.varlen_q = in.ConsumeBool(), k.has_leftpad = in.ConsumeBool(), k.causal = in.ConsumeBool();
  k.has_softcap = in.ConsumeBool(), k.has_qv = in.ConsumeBool(), k.fp8_query = in.ConsumeBool();
  return k;
}

bool same_vectors(const Plan& a, const Plan& b) {
  return a.num_splits_dynamic == b.num_splits_dynamic && a.num_m_blocks == b.num_m_blocks &&
         a.batch_order == b.batch_order && a.num_nheads_in_l2 == b.num_nheads_in_l2 &&
         a.num_splits == b.num_splits && a.block_m == b.block_m && a.pack_gqa == b.pack_gqa;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  fuzz::CallBuilder call(in);
  try {
    const Plan plan = get_scheduler_metadata(scheduler_args(call, in));
    const std::vector<int32_t> words = plan.to_fa3();
    const Plan back = Plan::from_fa3(words.data(), words.size(), plan.key);
    if (!same_vectors(plan, back) || back.to_fa3() != words) __builtin_trap();
  } catch (const Error&) {
  }
  try {
    const PlanKey key = any_key(call, in);
    std::vector<int32_t> words(in.ConsumeIntegralInRange<size_t>(0, 200));
    for (int32_t& w : words) w = call.value();
    const Plan plan = Plan::from_fa3(words.data(), words.size(), key);
    std::vector<int32_t> again = plan.to_fa3();
    if (again.size() != words.size()) __builtin_trap();
  } catch (const Error&) {
  }
  return 0;
}
