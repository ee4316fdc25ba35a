"""FlashAttention-3's Python interface (hopper/flash_attn_interface.py), on kvflash.

Same function names, argument names, order, defaults and return conventions as FA3, so
``from kvflash.flash_attn_interface import flash_attn_with_kvcache`` replaces
``from flash_attn_interface import ...`` (or sgl_kernel.flash_attn). Tensors may be torch
tensors (CPU or CUDA), numpy arrays (ml_dtypes for bfloat16 / float8) or any DLPack producer.
Outputs are allocated by the caller's framework; the cache is updated in place.

Differences from FA3, on purpose (see the kvflash README): forward only; ``ver`` other than 3 is
a ValueError; ``score_mod`` / ``aux_tensors`` raise NotImplementedError; an int
``cache_seqlens`` covers the batch (not ``k_cache.shape[0]``); scheduler metadata is checked
against the call it is passed to.
"""

import os
import threading
import weakref

from . import _call
from . import _frameworks as fw
from . import _kvflash as _ext
from . import scheduling as _scheduling

try:
    import torch
except (ImportError, OSError):  # kvflash works without torch (or with a broken one)
    torch = None

# torch.library.custom_op (torch >= 2.4) makes the calls traceable by torch.compile.
if torch is not None and hasattr(torch.library, "custom_op"):
    from . import _torch_ops
else:
    _torch_ops = None

__all__ = [
    "flash_attn_with_kvcache",
    "flash_attn_func",
    "flash_attn_varlen_func",
    "flash_attn_combine",
    "get_scheduler_metadata",
]

_DEFAULT_QKV_DTYPE = torch.bfloat16 if torch is not None else "bfloat16"

# How the extension reaches frameworks it does not serve from C++ (numpy, CuPy, ...).
_ext.set_framework_hooks(fw.allocate, fw.current_stream)


def _check_ver(ver):
    if ver != 3:
        raise ValueError(
            f"Only ver=3 is supported by kvflash (it implements FlashAttention-3's contract); got ver={ver!r}"
        )


def _reject_fa4_only(score_mod, aux_tensors):
    if score_mod is not None:
        raise NotImplementedError("score_mod is not supported by kvflash (it is an FA4 feature); pass score_mod=None")
    if aux_tensors is not None:
        raise NotImplementedError("aux_tensors is not supported by kvflash (it is an FA4 feature); pass aux_tensors=None")


def _is_compiling():
    return _torch_ops is not None and torch.compiler.is_compiling()


# --- scheduler metadata made by get_scheduler_metadata ---------------------------------------
# The FA3 int32 tensor handed to the caller is only a serialisation; the typed Plan it came from
# knows the whole problem it was made for. Keyed by the tensor's identity (id, confirmed through a
# weak reference whose callback drops the entry when the tensor dies), so passing the tensor back
# lets the call check every PlanKey field. Tensors not made here (copies, views, FA3's own) fall
# back to the C++ check of FA3's layout.
_plans_lock = threading.RLock()  # re-entrant: a weakref callback may run under it
_plans_by_tensor = {}


def _remember_plan(tensor, plan):
    key = id(tensor)
    try:
        ref = weakref.ref(tensor, lambda _ref: _forget(key, _ref))
    except TypeError:  # a framework whose arrays take no weak reference: FA3's check applies
        return
    with _plans_lock:
        _plans_by_tensor[key] = (ref, plan)


def _forget(key, ref):
    with _plans_lock:
        entry = _plans_by_tensor.get(key)
        if entry is not None and entry[0] is ref:
            del _plans_by_tensor[key]


def _plan_for(metadata):
    """The typed Plan behind a metadata tensor made by get_scheduler_metadata (the call then
    checks the whole problem the plan was made for), else the tensor itself."""
    entry = _plans_by_tensor.get(id(metadata))
    if entry is not None and entry[0]() is metadata:
        return entry[1]
    return metadata


# --- the calls -------------------------------------------------------------------------------

def flash_attn_with_kvcache(
    q,
    k_cache,
    v_cache,
    k=None,
    v=None,
    qv=None,
    rotary_cos=None,
    rotary_sin=None,
    cache_seqlens=None,
    cache_batch_idx=None,
    cache_leftpad=None,
    page_table=None,
    cu_seqlens_q=None,
    cu_seqlens_k_new=None,
    max_seqlen_q=None,
    rotary_seqlens=None,
    q_descale=None,
    k_descale=None,
    v_descale=None,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    attention_chunk=0,
    softcap=0.0,
    rotary_interleaved=True,
    scheduler_metadata=None,
    num_splits=0,
    pack_gqa=None,
    sm_margin=0,
    return_softmax_lse=False,
    sinks=None,
    score_mod=None,
    aux_tensors=None,
    ver=3,
    out=None,
    only_qv=False,
    batch_invariant=False,
):
    """Attention of q against a (paged) KV cache, appending k / v into it first (in place).

    Arguments and results are FA3's (kvflash spec section 3). Extras: ``sinks`` (h,) float32 or
    bfloat16 per-head sink logits; ``only_qv`` scores with qv·v alone (q and k_cache may be
    None); ``out`` a caller-provided output; ``batch_invariant`` (not in FA3) splits every
    sequence by a fixed key count, so its output bits do not depend on the rest of the batch. Returns ``out``, or with ``return_softmax_lse``
    FA3's four values ``(out, softmax_lse, out_accum, softmax_lse_accum)`` (the last two empty
    when the call does not split).
    """
    # The per-call path of every decode step: kept to a few operations (python_overhead.py).
    if ver != 3:
        _check_ver(ver)
    if score_mod is not None or aux_tensors is not None:
        _reject_fa4_only(score_mod, aux_tensors)
    # _call.make's tuple, written out: a call of make would cost a frame per attention call.
    call = (q, k_cache, v_cache, k, v, qv, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
            cache_leftpad, page_table, cu_seqlens_q, cu_seqlens_k_new, max_seqlen_q, rotary_seqlens,
            q_descale, k_descale, v_descale, softmax_scale, causal, window_size, attention_chunk,
            softcap, rotary_interleaved, scheduler_metadata, num_splits, pack_gqa, sm_margin, sinks,
            only_qv, batch_invariant, False)
    if _torch_ops is not None and torch.compiler.is_compiling():
        return _torch_ops.traced_kvcache(call, return_softmax_lse, out)
    # FA3's last-dimension asserts on k_cache / v_cache are made by the extension (one crossing).
    if scheduler_metadata is not None:
        plan = _plan_for(scheduler_metadata)
        if plan is not scheduler_metadata:
            call = _call.with_metadata(call, plan)
    else:
        batch = _scheduling.active_batch()
        if batch is not None:  # the engine's batch supplies this configuration's metadata
            metadata = batch.metadata_for(call)
            if metadata is not None:
                call = _call.with_metadata(call, metadata)
    return _ext.fwd(call, out, return_softmax_lse)


def _run(call, return_softmax_lse, out):
    """The dense / varlen functions' call after FA3's Python-level checks (no scheduling batch:
    it supplies the engine's attention calls only)."""
    if _is_compiling():
        return _torch_ops.traced_kvcache(call, return_softmax_lse, out)
    metadata = call[_call.SCHEDULER_METADATA]
    if metadata is not None:
        plan = _plan_for(metadata)
        if plan is not metadata:
            call = _call.with_metadata(call, plan)
    return _ext.fwd(call, out, return_softmax_lse)


def _forward_only(name, *tensors):
    if _is_compiling():
        return  # the custom op has no backward: autograd reports it if one is attempted
    if fw.wants_grad(*tensors):
        raise RuntimeError(
            f"kvflash.{name} is forward only: an input requires grad while autograd is enabled. "
            "Run it under torch.no_grad() / torch.inference_mode(), or detach the inputs.")


def _is_torch_tensor(t):
    # Written against the module's own `torch` so that torch.compile can trace it.
    return torch is not None and isinstance(t, torch.Tensor)


def _contiguous_last_dim(t):
    """FA3's maybe_contiguous for the dense / varlen keys and values."""
    if _is_torch_tensor(t):
        return t if t.stride(-1) == 1 else t.contiguous()
    return fw.make_contiguous_last_dim(t)


def _attention_result(result, return_attn_probs):
    if not return_attn_probs:
        return result
    out, lse = result[0], result[1]
    return out, lse


def flash_attn_func(
    q,
    k,
    v,
    softmax_scale=None,
    causal=False,
    qv=None,
    q_descale=None,
    k_descale=None,
    v_descale=None,
    window_size=(-1, -1),
    attention_chunk=0,
    softcap=0.0,
    num_splits=1,
    pack_gqa=None,
    deterministic=False,
    sm_margin=0,
    return_attn_probs=False,
):
    """Dense attention, q (b, s_q, h, d) against k / v (b, s_k, h_k, d|d_v); forward only.
    Returns out, or (out, softmax_lse) with return_attn_probs (FA3's convention)."""
    _forward_only("flash_attn_func", q, k, v, qv)
    k, v = _contiguous_last_dim(k), _contiguous_last_dim(v)
    call = _call.make(
        q, k, v, None, None, qv, None, None, None, None, None, None, None, None, None, None,
        q_descale, k_descale, v_descale, softmax_scale, causal, window_size, attention_chunk,
        softcap, True, None, num_splits, pack_gqa, sm_margin, None, False)
    result = _run(call, return_attn_probs, None)
    return _attention_result(result, return_attn_probs)


def _host_values(t):
    """The values of an index tensor readable without a device sync (numpy, CPU torch), or of a
    CUDA tensor in checked mode (KVFLASH_CHECK=1); None otherwise."""
    import numpy as np

    if t is None:
        return None
    if _is_torch_tensor(t):
        if t.device.type != "cpu" and os.environ.get("KVFLASH_CHECK", "0") in ("", "0"):
            return None
        return t.detach().cpu().numpy().astype(np.int64)
    return np.asarray(t).astype(np.int64)


def _check_packed_keys(cu_seqlens_k, seqused_k, total_k):
    """Sequence b's keys are rows [cu_seqlens_k[b], cu_seqlens_k[b] + seqused_k[b]) of k: every one
    must exist (a last entry past k.shape[0], or seqused_k past its segment, read other rows)."""
    cu = _host_values(cu_seqlens_k)
    if cu is None:
        return
    if cu.size == 0 or cu[0] != 0:
        raise ValueError(f"cu_seqlens_k[0] must be 0 (got {cu[:1].tolist()})")
    for b in range(1, cu.size):
        if cu[b] < cu[b - 1]:
            raise ValueError(f"cu_seqlens_k[{b}] = {cu[b]} is less than cu_seqlens_k[{b - 1}] = {cu[b - 1]} "
                             "(cumulative lengths must not decrease)")
    if cu[-1] > total_k:
        raise ValueError(f"cu_seqlens_k[{cu.size - 1}] = {cu[-1]} exceeds the {total_k} rows of k (k.shape[0])")
    used = _host_values(seqused_k)
    if used is None:
        return
    for b in range(min(used.size, cu.size - 1)):
        if not 0 <= used[b] <= cu[b + 1] - cu[b]:
            raise ValueError(f"seqused_k[{b}] = {used[b]} is out of range [0, {cu[b + 1] - cu[b]}] "
                             f"(the segment cu_seqlens_k[{b + 1}] - cu_seqlens_k[{b}])")


def _packed_keys_as_pages(k, v, cu_seqlens_k, max_seqlen_k, seqused_k):
    """Packed (total_k, h_k, d) keys seen as a paged cache of page size 1: sequence b's key j is
    page cu_seqlens_k[b] + j. Returns (k_cache, v_cache, page_table, cache_seqlens)."""
    total_k = k.shape[0]
    _check_packed_keys(cu_seqlens_k, seqused_k, total_k)
    k_cache = k.reshape(total_k, 1, *k.shape[1:])
    v_cache = v.reshape(total_k, 1, *v.shape[1:])
    last_page = max(total_k - 1, 0)
    if _is_torch_tensor(k):
        starts = cu_seqlens_k[:-1].to(torch.int32)
        offsets = torch.arange(max_seqlen_k, dtype=torch.int32, device=starts.device)
        page_table = (starts[:, None] + offsets[None, :]).clamp_(max=last_page).to(torch.int32)
        lengths = (cu_seqlens_k[1:] - cu_seqlens_k[:-1]).to(torch.int32)
    else:
        import numpy as np

        cu = np.asarray(cu_seqlens_k)
        page_table = np.minimum(cu[:-1, None] + np.arange(max_seqlen_k)[None, :], last_page).astype(np.int32)
        lengths = (cu[1:] - cu[:-1]).astype(np.int32)
    return k_cache, v_cache, page_table, (seqused_k if seqused_k is not None else lengths)


def flash_attn_varlen_func(
    q,
    k,
    v,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q,
    max_seqlen_k,
    seqused_q=None,
    seqused_k=None,
    softmax_scale=None,
    causal=False,
    qv=None,
    q_descale=None,
    k_descale=None,
    v_descale=None,
    window_size=(-1, -1),
    attention_chunk=0,
    softcap=0.0,
    num_splits=1,
    pack_gqa=None,
    deterministic=False,
    sm_margin=0,
    return_attn_probs=False,
):
    """Packed variable-length attention: q (total_q, h, d), k / v (total_k, h_k, d|d_v) with
    prefix sums cu_seqlens_q / cu_seqlens_k; forward only. Returns out, or (out, softmax_lse)."""
    _forward_only("flash_attn_varlen_func", q, k, v, qv)
    if seqused_q is not None:
        raise NotImplementedError(
            "seqused_q is not supported by kvflash's flash_attn_varlen_func; give the query lengths through cu_seqlens_q")
    if max_seqlen_q is None or max_seqlen_k is None:
        raise ValueError("max_seqlen_q and max_seqlen_k are required for FA3")
    k, v = _contiguous_last_dim(k), _contiguous_last_dim(v)
    k_cache, v_cache, page_table, cache_seqlens = _packed_keys_as_pages(
        k, v, cu_seqlens_k, int(max_seqlen_k), seqused_k)
    call = _call.make(
        q, k_cache, v_cache, None, None, qv, None, None, cache_seqlens, None, None, page_table,
        cu_seqlens_q, None, max_seqlen_q, None, q_descale, k_descale, v_descale, softmax_scale,
        causal, window_size, attention_chunk, softcap, True, None, num_splits, pack_gqa,
        sm_margin, None, False)
    result = _run(call, return_attn_probs, None)
    return _attention_result(result, return_attn_probs)


def flash_attn_combine(out_partial, lse_partial, out=None, out_dtype=None):
    """Combines split-KV partials: out_partial (num_splits, b, s, h, d) and lse_partial
    (num_splits, b, s, h), float32, through their LSE. Returns (out, lse)."""
    shape = tuple(out_partial.shape)
    if out is None:
        code = fw.F32 if out_dtype is None else fw.dtype_code(out_dtype)
        out = fw.allocate(out_partial, shape[1:], code)
    lse = fw.allocate(out_partial, tuple(lse_partial.shape)[1:], fw.F32)
    _ext.combine(out_partial, lse_partial, out, lse, fw.current_stream(out_partial))
    return out, lse


def get_scheduler_metadata(
    batch_size,
    max_seqlen_q,
    max_seqlen_k,
    num_heads_q,
    num_heads_kv,
    headdim,
    cache_seqlens,
    qkv_dtype=_DEFAULT_QKV_DTYPE,
    headdim_v=None,
    cu_seqlens_q=None,
    cu_seqlens_k_new=None,
    cache_leftpad=None,
    page_size=None,
    max_seqlen_k_new=0,
    causal=False,
    window_size=(-1, -1),
    attention_chunk=0,
    has_softcap=False,
    num_splits=0,
    pack_gqa=None,
    sm_margin=0,
):
    """FA3's scheduler metadata, made once per batch and passed to every layer's call as
    scheduler_metadata: an int32 tensor of FA3's length on cache_seqlens' device. kvflash checks
    it against each call it is given to (the whole problem when the tensor comes from here)."""
    device_type, device_id = fw.device_of(cache_seqlens)
    left, right = window_size
    # The plan is made on the host: lengths on a GPU are read back once per batch.
    plan = _ext.get_scheduler_metadata(
        int(batch_size), int(max_seqlen_q), int(max_seqlen_k), int(num_heads_q), int(num_heads_kv),
        int(headdim), fw.on_host(cache_seqlens), fw.dtype_code(qkv_dtype),
        None if headdim_v is None else int(headdim_v), fw.on_host(cu_seqlens_q),
        fw.on_host(cu_seqlens_k_new), fw.on_host(cache_leftpad),
        None if page_size is None else int(page_size), int(max_seqlen_k_new),
        bool(causal), -1 if left is None else int(left), -1 if right is None else int(right),
        int(attention_chunk or 0), bool(has_softcap), int(num_splits),
        None if pack_gqa is None else bool(pack_gqa), int(sm_margin), False, device_type, device_id)
    metadata = fw.int32_tensor(plan.to_fa3(), cache_seqlens)
    _remember_plan(metadata, plan)
    return metadata
