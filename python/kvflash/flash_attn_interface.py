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

import threading
import weakref

from . import _call
from . import _varlen
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
    # Looked up once: the decode step's wrapper asks on every call (torch.compile recognises the
    # function itself, under any name).
    _torch_is_compiling = torch.compiler.is_compiling
else:
    _torch_ops = None
    _torch_is_compiling = None

__all__ = [
    "flash_attn_with_kvcache",
    "flash_attn_func",
    "flash_attn_varlen_func",
    "flash_attn_combine",
    "get_scheduler_metadata",
]

_DEFAULT_QKV_DTYPE = torch.bfloat16 if torch is not None else "bfloat16"
# Value head dims above this are MLA's latent cache (the contract allows them only with d <= 64).
_MAX_HEADDIM_V_WITHOUT_MLA = 256

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
    return _torch_is_compiling is not None and _torch_is_compiling()


# --- scheduler metadata made by get_scheduler_metadata ---------------------------------------
# The FA3 int32 tensor handed to the caller is only a serialisation; the typed Plan it came from
# knows the whole problem it was made for. Keyed by the tensor's identity (id, confirmed through a
# weak reference whose callback drops the entry when the tensor dies), so passing the tensor back
# lets the call check the PlanKey it was made for. Tensors not made here (copies, views, FA3's own) fall
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
    checks the problem the plan was made for, python/README.md's rule), else the tensor itself."""
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
    compiling = _torch_is_compiling is not None and _torch_is_compiling()
    if scheduler_metadata is not None and not compiling:
        scheduler_metadata = _plan_for(scheduler_metadata)  # before the tuple: no second tuple
    # _call.make's tuple, written out: a call of make would cost a frame per attention call.
    call = (q, k_cache, v_cache, k, v, qv, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
            cache_leftpad, page_table, cu_seqlens_q, cu_seqlens_k_new, max_seqlen_q, rotary_seqlens,
            q_descale, k_descale, v_descale, softmax_scale, causal, window_size, attention_chunk,
            softcap, rotary_interleaved, scheduler_metadata, num_splits, pack_gqa, sm_margin, sinks,
            only_qv, batch_invariant, False)
    if compiling:
        return _torch_ops.traced_kvcache(call, return_softmax_lse, out)
    # FA3's last-dimension asserts on k_cache / v_cache are made by the extension (one crossing).
    if scheduler_metadata is None:
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


def _forward_only(name, run, *inputs):
    """run(), the forward pass of `name`. When autograd would record it (an input requires grad
    with grad enabled), its outputs get a backward that raises a RuntimeError naming `name`: the
    forward runs as FA3's does, and only a backward pass is refused."""
    if _is_compiling() or not fw.wants_grad(*inputs):
        return run()  # compiled: the custom op has no backward, so autograd reports one itself
    return _ForwardOnly.apply(name, run, *[t for t in inputs if t is not None])


if torch is not None:
    class _ForwardOnly(torch.autograd.Function):
        """Outputs of a kvflash forward pass in an autograd graph, with no backward."""

        @staticmethod
        def forward(ctx, name, run, *inputs):
            ctx.name = name
            result = run()
            if isinstance(result, tuple):  # (out, softmax_lse, ...): only out carries a gradient
                ctx.mark_non_differentiable(*result[1:])
            return result

        @staticmethod
        def backward(ctx, *grads):
            raise RuntimeError(
                f"kvflash.{ctx.name} is forward only: it has no backward pass (an input required "
                "grad, so the forward ran, but gradients cannot be computed). Use FlashAttention "
                "for training, or run under torch.no_grad() / torch.inference_mode().")


def _is_torch_tensor(t):
    # Written against the module's own `torch` so that torch.compile can trace it.
    return torch is not None and isinstance(t, torch.Tensor)


def _contiguous_last_dim(t):
    """FA3's maybe_contiguous for the dense / varlen keys and values."""
    if _is_torch_tensor(t):
        return t if t.stride(-1) == 1 else t.contiguous()
    return fw.make_contiguous_last_dim(t)


def _attention_result(result, return_attn_probs, return_softmax_lse=False):
    """FA3's return convention: out, or (out, softmax_lse) with return_attn_probs;
    sgl-kernel's return_softmax_lse: (out, softmax_lse, out_accum, softmax_lse_accum)."""
    if return_softmax_lse or not return_attn_probs:
        return result
    return result[0], result[1]


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
    """Dense attention, q (b, s_q, h, d) against k / v (b, s_k, h_k, d|d_v). Returns out, or
    (out, softmax_lse) with return_attn_probs (FA3's convention). Forward only: with inputs that
    require grad the forward runs and a backward pass raises. ``deterministic`` concerns FA3's
    backward only (kvflash's forward is deterministic)."""
    k, v = _contiguous_last_dim(k), _contiguous_last_dim(v)
    call = _call.make(
        q=q, k_cache=k, v_cache=v, qv=qv, q_descale=q_descale, k_descale=k_descale,
        v_descale=v_descale, softmax_scale=softmax_scale, causal=causal, window_size=window_size,
        attention_chunk=attention_chunk, softcap=softcap, num_splits=num_splits,
        pack_gqa=pack_gqa, sm_margin=sm_margin)
    return _forward_only(
        "flash_attn_func",
        lambda: _attention_result(_run(call, return_attn_probs, None), return_attn_probs),
        q, k, v, qv)


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
    page_table=None,
    return_softmax_lse=False,
):
    """Packed variable-length attention: q (total_q, h, d) with prefix sums cu_seqlens_q against
    k / v (total_k, h_k, d|d_v) with prefix sums cu_seqlens_k, or, with ``page_table`` (b, pages)
    (FA4 / sgl-kernel's extra), against a paged K/V (num_pages, page_size, h_k, d|d_v) whose
    lengths are seqused_k. seqused_q / seqused_k: rows / keys used per sequence (FA3). Returns out,
    or (out, softmax_lse) with return_attn_probs, or sgl-kernel's (out, softmax_lse, out_accum,
    softmax_lse_accum) with return_softmax_lse. Forward only, as flash_attn_func."""
    if max_seqlen_q is None or (max_seqlen_k is None and page_table is None):
        raise ValueError("max_seqlen_q and max_seqlen_k are required for FA3")
    k, v = _contiguous_last_dim(k), _contiguous_last_dim(v)
    if page_table is None:
        _varlen.check_packed_keys(cu_seqlens_k, seqused_k, k.shape[0])
        k, v, page_table = _varlen.packed_keys_as_pages(k, v, cu_seqlens_k, int(max_seqlen_k))
    cache_seqlens = _varlen.key_lengths(cu_seqlens_k, seqused_k)
    if seqused_q is not None:
        cu_seqlens_q, page_table, cache_seqlens = _varlen.split_unused_query_rows(
            cu_seqlens_q, seqused_q, page_table, cache_seqlens)
    call = _call.make(
        q=q, k_cache=k, v_cache=v, qv=qv, cache_seqlens=cache_seqlens, page_table=page_table,
        cu_seqlens_q=cu_seqlens_q, max_seqlen_q=max_seqlen_q, q_descale=q_descale,
        k_descale=k_descale, v_descale=v_descale, softmax_scale=softmax_scale, causal=causal,
        window_size=window_size, attention_chunk=attention_chunk, softcap=softcap,
        num_splits=num_splits, pack_gqa=pack_gqa, sm_margin=sm_margin)
    with_lse = return_attn_probs or return_softmax_lse
    return _forward_only(
        "flash_attn_varlen_func",
        lambda: _attention_result(_run(call, with_lse, None), return_attn_probs,
                                  return_softmax_lse),
        q, k, v, qv)


def flash_attn_combine(out_partial, lse_partial, out=None, out_dtype=None):
    """Combines split-KV partials: out_partial (num_splits, b, s, h, d) and lse_partial
    (num_splits, b, s, h), float32, through their LSE. Returns (out, lse)."""
    shape = tuple(out_partial.shape)
    if out is None:
        code = fw.F32 if out_dtype is None else fw.dtype_code(out_dtype)
        out = fw.allocate(out_partial, shape[1:], code)
    lse = fw.allocate(out_partial, tuple(lse_partial.shape)[1:], fw.F32)
    try:
        _ext.combine(out_partial, lse_partial, out, lse, fw.current_stream(out_partial))
    except NotImplementedError:
        # Head dims the CUDA combine kernel does not take (above 512) are merged by torch on
        # the same device, after the same argument checks, so CPU and CUDA behave alike from
        # Python.
        if not (_is_torch_tensor(out_partial) and out_partial.is_cuda and shape[-1] > 512):
            raise
        _combine_by_torch(out_partial, lse_partial, out, lse)
    return out, lse


def _combine_by_torch(out_partial, lse_partial, out, lse):
    """The combine (kvflash spec, split-KV): lse = log sum_s exp(lse_s), out = sum_s
    exp(lse_s - lse) out_s; every split empty (all -inf) gives out 0 and lse -inf."""
    top = lse_partial.amax(dim=0)
    shift = torch.where(torch.isinf(top), torch.zeros_like(top), top)
    weights = torch.exp(lse_partial - shift)
    total = weights.sum(dim=0)
    empty = total == 0
    lse.copy_(torch.where(empty, torch.full_like(top, float("-inf")), torch.log(total) + shift))
    scale = torch.where(empty, torch.zeros_like(weights), weights / torch.where(empty, 1.0, total))
    out.copy_((scale.unsqueeze(-1) * out_partial).sum(dim=0))


def _plans_for_qv(has_qv, headdim_v):
    if has_qv is not None:
        return bool(has_qv)
    return headdim_v is not None and int(headdim_v) > _MAX_HEADDIM_V_WITHOUT_MLA


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
    has_qv=None,
):
    """FA3's scheduler metadata, made once per batch and passed to every layer's call as
    scheduler_metadata: an int32 tensor of FA3's length on cache_seqlens' device. kvflash checks
    it against each call it is given to (the whole problem when the tensor comes from here).

    has_qv (kvflash's, not FA3's): whether the calls pass qv. FA3 plans before it looks at qv, so
    its callers cannot say; kvflash's plan depends on it (MLA runs its own kernel family), and
    None reads it from the shape: headdim_v above 256 is MLA's latent width, which engines
    always call with qv."""
    device_type, device_id = fw.device_of(cache_seqlens)
    left, right = _ext.window_pair(window_size)
    # The plan is made on the host: lengths on a GPU are read back once per batch.
    plan = _ext.get_scheduler_metadata(
        int(batch_size), int(max_seqlen_q), int(max_seqlen_k), int(num_heads_q), int(num_heads_kv),
        int(headdim), fw.on_host(cache_seqlens), fw.dtype_code(qkv_dtype),
        None if headdim_v is None else int(headdim_v), fw.on_host(cu_seqlens_q),
        fw.on_host(cu_seqlens_k_new), fw.on_host(cache_leftpad),
        None if page_size is None else int(page_size), int(max_seqlen_k_new or 0),
        bool(causal), left, right, int(attention_chunk or 0), bool(has_softcap),
        int(num_splits or 0), None if pack_gqa is None else bool(pack_gqa), int(sm_margin or 0),
        _plans_for_qv(has_qv, headdim_v), device_type, device_id)
    metadata = fw.int32_tensor(plan.to_fa3(), cache_seqlens)
    _remember_plan(metadata, plan)
    return metadata
