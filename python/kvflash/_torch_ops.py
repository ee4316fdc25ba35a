"""torch.library custom ops, so torch.compile(fullgraph=True) traces kvflash calls.

Eager calls do not go through these ops (the binding is called directly, which is cheaper);
flash_attn_interface routes a call here only while torch.compile / torch.export is tracing.
The fake implementations give the output shapes without running anything. Under tracing,
return_softmax_lse yields (out, softmax_lse, empty, empty): the split partials are internal.
"""

from typing import Optional, Tuple

import torch
from torch import Tensor

from . import _kvflash as _ext


@torch.library.custom_op("kvflash::fwd_kvcache", mutates_args=("k_cache", "v_cache"))
def fwd_kvcache(
    q: Optional[Tensor], k_cache: Optional[Tensor], v_cache: Tensor, k: Optional[Tensor],
    v: Optional[Tensor], qv: Optional[Tensor], rotary_cos: Optional[Tensor],
    rotary_sin: Optional[Tensor], cache_seqlens: Optional[Tensor], cache_seqlens_value: Optional[int],
    cache_batch_idx: Optional[Tensor], cache_leftpad: Optional[Tensor], page_table: Optional[Tensor],
    cu_seqlens_q: Optional[Tensor], cu_seqlens_k_new: Optional[Tensor], max_seqlen_q: Optional[int],
    rotary_seqlens: Optional[Tensor], q_descale: Optional[Tensor], k_descale: Optional[Tensor],
    v_descale: Optional[Tensor], softmax_scale: Optional[float], causal: bool, window_left: int,
    window_right: int, attention_chunk: int, softcap: float, rotary_interleaved: bool,
    scheduler_metadata: Optional[Tensor], num_splits: int, pack_gqa: Optional[bool], sm_margin: int,
    sinks: Optional[Tensor], only_qv: bool, return_lse: bool,
) -> Tuple[Tensor, Tensor]:
    seqlens = cache_seqlens if cache_seqlens is not None else cache_seqlens_value
    call = (q, k_cache, v_cache, k, v, qv, rotary_cos, rotary_sin, seqlens, cache_batch_idx,
            cache_leftpad, page_table, cu_seqlens_q, cu_seqlens_k_new, max_seqlen_q, rotary_seqlens,
            q_descale, k_descale, v_descale, softmax_scale, causal, (window_left, window_right),
            attention_chunk, softcap, rotary_interleaved, scheduler_metadata, num_splits, pack_gqa,
            sm_margin, sinks, only_qv, False, False)  # batch_invariant (refused when tracing), checked
    like = q if q is not None else v_cache
    result = _ext.fwd(call, None, return_lse)
    if return_lse:
        return result[0], result[1]
    return result, like.new_empty((0,), dtype=torch.float32)


@fwd_kvcache.register_fake
def _fwd_kvcache_fake(q, k_cache, v_cache, k, v, qv, rotary_cos, rotary_sin, cache_seqlens,
                      cache_seqlens_value, cache_batch_idx, cache_leftpad, page_table, cu_seqlens_q,
                      cu_seqlens_k_new, max_seqlen_q, rotary_seqlens, q_descale, k_descale,
                      v_descale, softmax_scale, causal, window_left, window_right, attention_chunk,
                      softcap, rotary_interleaved, scheduler_metadata, num_splits, pack_gqa,
                      sm_margin, sinks, only_qv, return_lse):
    rows = q if q is not None else qv
    out_dtype = torch.bfloat16 if rows.dtype == torch.float8_e4m3fn else rows.dtype
    out = rows.new_empty((*rows.shape[:-1], v_cache.shape[-1]), dtype=out_dtype)
    if not return_lse:
        return out, rows.new_empty((0,), dtype=torch.float32)
    if cu_seqlens_q is not None:  # (total_q, h, d) -> (h, total_q)
        lse_shape = (rows.shape[1], rows.shape[0])
    else:  # (b, s_q, h, d) -> (b, h, s_q)
        lse_shape = (rows.shape[0], rows.shape[2], rows.shape[1])
    return out, rows.new_empty(lse_shape, dtype=torch.float32)


def traced_kvcache(call, return_softmax_lse, out):
    """flash_attn_with_kvcache while torch.compile traces: the call tuple (python/src/call_args.h's
    order) through the custom op."""
    (q, k_cache, v_cache, k, v, qv, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
     cache_leftpad, page_table, cu_seqlens_q, cu_seqlens_k_new, max_seqlen_q, rotary_seqlens,
     q_descale, k_descale, v_descale, softmax_scale, causal, window_size, attention_chunk, softcap,
     rotary_interleaved, scheduler_metadata, num_splits, pack_gqa, sm_margin, sinks, only_qv,
     batch_invariant, _checked) = call
    if batch_invariant:
        raise NotImplementedError("batch_invariant=True is not supported under torch.compile yet")
    if k_cache is not None:
        assert k_cache.stride(-1) == 1, "k_cache must have contiguous last dimension"
    assert v_cache.stride(-1) == 1, "v_cache must have contiguous last dimension"
    if out is not None:
        raise TypeError("Tracing (torch.compile/torch.export) with pre-allocated output tensor is not supported.")
    if isinstance(scheduler_metadata, _ext.Plan):
        scheduler_metadata = None  # typed plans cannot cross a traced op; the call plans itself
    seqlens_value = cache_seqlens if isinstance(cache_seqlens, int) else None
    seqlens_tensor = None if seqlens_value is not None else cache_seqlens
    # Plain Python (the extension's window_pair is opaque to the tracer): None or a pair of ints.
    left, right = (None, None) if window_size is None else window_size
    out, lse = torch.ops.kvflash.fwd_kvcache(
        q, k_cache, v_cache, k, v, qv, rotary_cos, rotary_sin, seqlens_tensor, seqlens_value,
        cache_batch_idx, cache_leftpad, page_table, cu_seqlens_q, cu_seqlens_k_new, max_seqlen_q,
        rotary_seqlens, q_descale, k_descale, v_descale, softmax_scale, bool(causal),
        -1 if left is None else int(left), -1 if right is None else int(right),
        int(attention_chunk or 0), float(softcap), bool(rotary_interleaved), scheduler_metadata,
        int(num_splits or 0), pack_gqa, int(sm_margin), sinks, bool(only_qv),
        bool(return_softmax_lse))
    if not return_softmax_lse:
        return out
    empty = lse.new_empty((0,))
    return out, lse, empty, empty
