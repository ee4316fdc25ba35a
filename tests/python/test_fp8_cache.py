"""A bfloat16 / float16 query over a float8_e4m3fn KV cache (contract 5.8) through the FA3
interface, with torch tensors and with numpy arrays (ml_dtypes). New K/V are quantised into the
cache as x / descale rounded to the nearest e4m3 value, saturating at +-448; attention reads the
cache times its descale. The cache's bytes are checked against ml_dtypes' rounding of the clamped
values, and out / LSE against the float64 reference run on the dequantised cache."""

import numpy as np
import pytest

from kvflash import flash_attn_interface as fai
from kvflash.flash_attn_interface import flash_attn_with_kvcache, get_scheduler_metadata
from reference import reference_kvcache

ml_dtypes = pytest.importorskip("ml_dtypes")
E4M3 = ml_dtypes.float8_e4m3fn

B, S_K, H, HK, D, S_NEW = 3, 48, 8, 2, 64, 2
TOLERANCE = {"bfloat16": 3e-2, "float16": 5e-3}  # q's dtype decides (cases.py's values)


def quantise(x, descale):
    """The contract's rule: x / descale in float32, clamped to +-448, rounded to nearest even."""
    return np.clip(x.astype(np.float32) / descale, -448, 448).astype(E4M3)


def make_call(q_dtype, seed):
    """numpy arguments, the caches' and new rows' float64 values as the reference should see
    them (dequantised), and the expected cache bytes after the append."""
    rng = np.random.default_rng(seed)
    per_head = (B, 1, HK, 1)
    k_descale = rng.uniform(0.002, 0.008, (B, HK)).astype(np.float32)  # some new rows saturate
    v_descale = rng.uniform(0.5, 2.0, (B, HK)).astype(np.float32)
    kw = dict(q=rng.standard_normal((B, 1, H, D)).astype(q_dtype),
              k_cache=rng.standard_normal((B, S_K, HK, D)).astype(E4M3),
              v_cache=rng.standard_normal((B, S_K, HK, D)).astype(E4M3),
              k=rng.standard_normal((B, S_NEW, HK, D)).astype(q_dtype),
              v=rng.standard_normal((B, S_NEW, HK, D)).astype(q_dtype),
              cache_seqlens=np.array([0, 17, S_K - S_NEW], np.int32),
              k_descale=k_descale, v_descale=v_descale, causal=True)
    expected_k, expected_v = kw["k_cache"].copy(), kw["v_cache"].copy()
    new_k = quantise(kw["k"], k_descale.reshape(per_head))
    new_v = quantise(kw["v"], v_descale.reshape(per_head))
    for b, start in enumerate(kw["cache_seqlens"]):
        expected_k[b, start:start + S_NEW] = new_k[b]
        expected_v[b, start:start + S_NEW] = new_v[b]
    assert (np.abs(new_k.astype(np.float32)) == 448).any(), "no saturated element drawn"
    reference = dict(q=kw["q"], cache_seqlens=kw["cache_seqlens"], causal=True,
                     k_cache=kw["k_cache"].astype(np.float64) * k_descale.reshape(B, 1, HK, 1),
                     v_cache=kw["v_cache"].astype(np.float64) * v_descale.reshape(B, 1, HK, 1),
                     k=new_k.astype(np.float64) * k_descale.reshape(per_head),
                     v=new_v.astype(np.float64) * v_descale.reshape(per_head))
    return kw, reference, expected_k, expected_v


def check(out, lse, k_cache, v_cache, q_dtype, reference, expected_k, expected_v):
    assert out.dtype == q_dtype
    np.testing.assert_array_equal(k_cache.view(np.uint8), expected_k.view(np.uint8))
    np.testing.assert_array_equal(v_cache.view(np.uint8), expected_v.view(np.uint8))
    want_out, want_lse, _, _ = reference_kvcache(**reference)
    tol = TOLERANCE[np.dtype(q_dtype).name]
    np.testing.assert_allclose(out.astype(np.float64), want_out, rtol=tol, atol=tol)
    np.testing.assert_allclose(lse, want_lse, rtol=tol, atol=tol)


Q_DTYPES = [ml_dtypes.bfloat16, np.float16]


@pytest.mark.parametrize("q_dtype", Q_DTYPES, ids=lambda d: np.dtype(d).name)
def test_numpy_16_bit_query_over_fp8_cache(q_dtype):
    kw, reference, expected_k, expected_v = make_call(q_dtype, seed=1)
    out, lse, *_ = flash_attn_with_kvcache(**kw, return_softmax_lse=True)
    check(out, lse, kw["k_cache"], kw["v_cache"], q_dtype, reference, expected_k, expected_v)


@pytest.mark.parametrize("q_dtype", Q_DTYPES, ids=lambda d: np.dtype(d).name)
def test_torch_16_bit_query_over_fp8_cache(q_dtype):
    torch = pytest.importorskip("torch")
    kw, reference, expected_k, expected_v = make_call(q_dtype, seed=2)
    torch_dtype = {np.dtype(ml_dtypes.bfloat16): torch.bfloat16, np.dtype(np.float16): torch.float16}

    def to_torch(a):
        if not isinstance(a, np.ndarray):
            return a
        if a.dtype == E4M3:
            return torch.from_numpy(a.view(np.uint8).copy()).view(torch.float8_e4m3fn)
        if a.dtype in torch_dtype:
            return torch.from_numpy(a.astype(np.float32)).to(torch_dtype[a.dtype])
        return torch.from_numpy(a.copy())

    tkw = {name: to_torch(value) for name, value in kw.items()}
    out, lse, *_ = flash_attn_with_kvcache(**tkw, return_softmax_lse=True)
    assert out.dtype == torch_dtype[np.dtype(q_dtype)]
    as_e4m3 = lambda t: t.view(torch.uint8).numpy().view(E4M3)  # noqa: E731
    check(out.float().numpy().astype(q_dtype), lse.numpy(), as_e4m3(tkw["k_cache"]),
          as_e4m3(tkw["v_cache"]), q_dtype, reference, expected_k, expected_v)


def test_q_descale_with_16_bit_query_is_refused():
    kw, *_ = make_call(np.float16, seed=3)
    kw["q_descale"] = kw["k_descale"]
    with pytest.raises(ValueError, match="q_descale is only for a float8_e4m3fn query"):
        flash_attn_with_kvcache(**kw)


def test_fp8_metadata_means_the_all_fp8_call():
    """get_scheduler_metadata's one qkv_dtype: float8_e4m3fn plans FA3's all-fp8 call
    (PlanKey.fp8_query), which a 16-bit query over an fp8 cache still takes where the plans agree
    (the CPU here; on sm_90, where the sm90 fp8 kernel takes a prefill, it is refused naming fp8_query)."""
    kw, *_ = make_call(ml_dtypes.bfloat16, seed=4)
    own = flash_attn_with_kvcache(**kw)
    args = dict(batch_size=B, max_seqlen_q=1, max_seqlen_k=S_K, num_heads_q=H, num_heads_kv=HK,
                headdim=D, cache_seqlens=kw["cache_seqlens"], max_seqlen_k_new=S_NEW, causal=True)
    fp8 = get_scheduler_metadata(**args, qkv_dtype=E4M3)
    assert fai._plan_for(fp8).key.fp8_query
    assert not fai._plan_for(get_scheduler_metadata(**args, qkv_dtype=ml_dtypes.bfloat16)).key.fp8_query
    kw, *_ = make_call(ml_dtypes.bfloat16, seed=4)  # the first call appended into its cache
    np.testing.assert_array_equal(flash_attn_with_kvcache(**kw, scheduler_metadata=fp8), own)
