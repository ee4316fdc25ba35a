"""kvflash.flash_attn_interface against FA3's documented signatures (kvflash spec 2.1, 6.5, 8):
argument names, order, defaults, and return arity."""

import inspect

import numpy as np
import pytest

from kvflash import flash_attn_interface as fai

_ = inspect.Parameter.empty  # "no default"

# FA3 (hopper/flash_attn_interface.py), then kvflash's documented extras (sgl-kernel's sinks,
# score_mod, aux_tensors, ver; out; only_qv).
KVCACHE = [
    ("q", _), ("k_cache", _), ("v_cache", _), ("k", None), ("v", None), ("qv", None),
    ("rotary_cos", None), ("rotary_sin", None), ("cache_seqlens", None), ("cache_batch_idx", None),
    ("cache_leftpad", None), ("page_table", None), ("cu_seqlens_q", None),
    ("cu_seqlens_k_new", None), ("max_seqlen_q", None), ("rotary_seqlens", None),
    ("q_descale", None), ("k_descale", None), ("v_descale", None), ("softmax_scale", None),
    ("causal", False), ("window_size", (-1, -1)), ("attention_chunk", 0), ("softcap", 0.0),
    ("rotary_interleaved", True), ("scheduler_metadata", None), ("num_splits", 0),
    ("pack_gqa", None), ("sm_margin", 0), ("return_softmax_lse", False),
    # extras
    ("sinks", None), ("score_mod", None), ("aux_tensors", None), ("ver", 3), ("out", None),
    ("only_qv", False), ("batch_invariant", False),
]

FUNC = [
    ("q", _), ("k", _), ("v", _), ("softmax_scale", None), ("causal", False), ("qv", None),
    ("q_descale", None), ("k_descale", None), ("v_descale", None), ("window_size", (-1, -1)),
    ("attention_chunk", 0), ("softcap", 0.0), ("num_splits", 1), ("pack_gqa", None),
    ("deterministic", False), ("sm_margin", 0), ("return_attn_probs", False),
]

VARLEN = [
    ("q", _), ("k", _), ("v", _), ("cu_seqlens_q", _), ("cu_seqlens_k", _), ("max_seqlen_q", _),
    ("max_seqlen_k", _), ("seqused_q", None), ("seqused_k", None), ("softmax_scale", None),
    ("causal", False), ("qv", None), ("q_descale", None), ("k_descale", None),
    ("v_descale", None), ("window_size", (-1, -1)), ("attention_chunk", 0), ("softcap", 0.0),
    ("num_splits", 1), ("pack_gqa", None), ("deterministic", False), ("sm_margin", 0),
    ("return_attn_probs", False),
    # extras: a paged K/V (FA4 and sgl-kernel), sgl-kernel's return_softmax_lse
    ("page_table", None), ("return_softmax_lse", False),
]

SCHEDULER = [
    ("batch_size", _), ("max_seqlen_q", _), ("max_seqlen_k", _), ("num_heads_q", _),
    ("num_heads_kv", _), ("headdim", _), ("cache_seqlens", _), ("qkv_dtype", "bfloat16"),
    ("headdim_v", None), ("cu_seqlens_q", None), ("cu_seqlens_k_new", None),
    ("cache_leftpad", None), ("page_size", None), ("max_seqlen_k_new", 0), ("causal", False),
    ("window_size", (-1, -1)), ("attention_chunk", 0), ("has_softcap", False), ("num_splits", 0),
    ("pack_gqa", None), ("sm_margin", 0),
    # extra: whether the calls pass qv (None: read from headdim_v)
    ("has_qv", None),
]

COMBINE = [("out_partial", _), ("lse_partial", _), ("out", None), ("out_dtype", None)]


def signature_of(fn):
    result = []
    for p in inspect.signature(fn).parameters.values():
        assert p.kind == inspect.Parameter.POSITIONAL_OR_KEYWORD, f"{fn.__name__}: {p.name} is {p.kind}"
        default = p.default
        if p.name == "qkv_dtype":  # torch.bfloat16 when torch is importable
            default = str(default).replace("torch.", "")
        result.append((p.name, default))
    return result


@pytest.mark.parametrize("name, expected", [
    ("flash_attn_with_kvcache", KVCACHE),
    ("flash_attn_func", FUNC),
    ("flash_attn_varlen_func", VARLEN),
    ("get_scheduler_metadata", SCHEDULER),
    ("flash_attn_combine", COMBINE),
])
def test_signature_matches_fa3(name, expected):
    assert signature_of(getattr(fai, name)) == expected


def small_call():
    rng = np.random.default_rng(0)
    return dict(q=rng.standard_normal((2, 1, 2, 16)).astype(np.float32),
                k_cache=rng.standard_normal((2, 8, 1, 16)).astype(np.float32),
                v_cache=rng.standard_normal((2, 8, 1, 16)).astype(np.float32),
                cache_seqlens=np.array([3, 8], dtype=np.int32))


def test_kvcache_returns_out_or_fa3_four_values():
    kw = small_call()
    out = fai.flash_attn_with_kvcache(**kw)
    assert isinstance(out, np.ndarray) and out.shape == (2, 1, 2, 16)
    result = fai.flash_attn_with_kvcache(**kw, return_softmax_lse=True)
    assert isinstance(result, tuple) and len(result) == 4
    out, lse, *rest = result  # sglang's unpacking
    assert lse.shape == (2, 2, 1)
    # num_splits == 1: the partials are empty tensors
    assert all(r.size == 0 for r in fai.flash_attn_with_kvcache(**kw, num_splits=1, return_softmax_lse=True)[2:])


def test_positional_call_in_fa3_order():
    kw = small_call()
    expected = fai.flash_attn_with_kvcache(**kw, causal=True)
    positional = fai.flash_attn_with_kvcache(
        kw["q"], kw["k_cache"], kw["v_cache"], None, None, None, None, None, kw["cache_seqlens"],
        None, None, None, None, None, None, None, None, None, None, None, True)
    np.testing.assert_array_equal(positional, expected)


def test_dense_and_varlen_return_conventions():
    rng = np.random.default_rng(1)
    q = rng.standard_normal((2, 3, 2, 16)).astype(np.float32)
    k = rng.standard_normal((2, 5, 1, 16)).astype(np.float32)
    out = fai.flash_attn_func(q, k, k.copy())
    assert out.shape == (2, 3, 2, 16)
    out, lse = fai.flash_attn_func(q, k, k.copy(), return_attn_probs=True)
    assert lse.shape == (2, 2, 3)
    cu_q = np.array([0, 3, 6], dtype=np.int32)
    cu_k = np.array([0, 5, 10], dtype=np.int32)
    packed = fai.flash_attn_varlen_func(q.reshape(6, 2, 16), k.reshape(10, 1, 16),
                                        k.reshape(10, 1, 16).copy(), cu_q, cu_k, 3, 5)
    np.testing.assert_allclose(packed.reshape(2, 3, 2, 16), out, rtol=1e-5, atol=1e-5)
    packed, lse_packed = fai.flash_attn_varlen_func(
        q.reshape(6, 2, 16), k.reshape(10, 1, 16), k.reshape(10, 1, 16).copy(), cu_q, cu_k, 3, 5,
        return_attn_probs=True)
    assert lse_packed.shape == (2, 6)


def test_combine_returns_out_and_lse():
    rng = np.random.default_rng(2)
    out_partial = rng.standard_normal((3, 2, 1, 4, 16)).astype(np.float32)
    lse_partial = rng.standard_normal((3, 2, 1, 4)).astype(np.float32)
    out, lse = fai.flash_attn_combine(out_partial, lse_partial)
    assert out.shape == (2, 1, 4, 16) and lse.shape == (2, 1, 4)
    weights = np.exp(lse_partial - lse_partial.max(0))
    expected = (weights[..., None] * out_partial).sum(0) / weights.sum(0)[..., None]
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(lse, np.log(np.exp(lse_partial.astype(np.float64)).sum(0)), rtol=1e-5, atol=1e-5)


def test_scheduler_metadata_has_fa3_length_and_is_accepted_back():
    kw = small_call()
    metadata = fai.get_scheduler_metadata(2, 1, 8, 2, 1, 16, kw["cache_seqlens"], qkv_dtype="float32")
    assert metadata.dtype == np.int32 and metadata.ndim == 1
    # FA3's layout: semaphore + b_r * (2 + [not local] + [causal or local]), b_r = round_up(b, 4)
    assert len(metadata) in (8 + 4, 8 + 4 + 1, 12 + 1, 12, 16, 16 + 1)
    np.testing.assert_array_equal(fai.flash_attn_with_kvcache(**kw, scheduler_metadata=metadata),
                                  fai.flash_attn_with_kvcache(**kw))


def test_call_tuple_order_agrees_with_the_extension():
    from kvflash import _call, _kvflash

    assert len(_call.FIELDS) == _kvflash.call_field_count()
    # FA3's arguments keep FA3's order in the tuple.
    fa3 = [name for name, _ in KVCACHE[: KVCACHE.index(("return_softmax_lse", False))]]
    assert [f for f in _call.FIELDS if f in fa3] == fa3


def test_call_fields_are_given_by_name():
    from kvflash import _call

    call = _call.make(q=1, causal=True)
    assert len(call) == len(_call.FIELDS) and call[_call.Q] == 1 and call[_call.CAUSAL] is True
    assert call[_call.WINDOW_SIZE] == (-1, -1) and call[_call.CHECKED] is False
    with pytest.raises(TypeError, match="^internal: not a call field: k_new"):
        _call.make(q=1, k_new=2)
