"""The CPU path against the float64 numpy reference, over randomized configurations."""

import numpy as np
import pytest

from kvflash.flash_attn_interface import flash_attn_with_kvcache

from cases import dtypes, random_case, tolerance
from reference import reference_kvcache

REFERENCE_ONLY = ("num_splits",)


def run_and_compare(kw):
    expected_out, expected_lse, expected_k, expected_v = reference_kvcache(
        **{name: value for name, value in kw.items() if name not in REFERENCE_ONLY})
    k_cache, v_cache = kw["k_cache"], kw["v_cache"]
    out, lse, out_accum, lse_accum = flash_attn_with_kvcache(**kw, return_softmax_lse=True)
    rtol, atol = tolerance(kw["q"].dtype)
    assert out.dtype == kw["q"].dtype
    assert out.shape == expected_out.shape
    assert lse.shape == expected_lse.shape and lse.dtype == np.float32
    np.testing.assert_allclose(out.astype(np.float64), expected_out, rtol=rtol, atol=atol)
    finite = np.isfinite(expected_lse)
    assert (np.isfinite(lse) == finite).all(), "rows with no visible key must have LSE -inf"
    np.testing.assert_allclose(lse[finite], expected_lse[finite], rtol=rtol, atol=atol)
    # The cache was updated in place (numpy arrays too).
    np.testing.assert_allclose(k_cache.astype(np.float64), expected_k, rtol=rtol, atol=atol)
    np.testing.assert_allclose(v_cache.astype(np.float64), expected_v, rtol=rtol, atol=atol)
    return out_accum, lse_accum


@pytest.mark.parametrize("seed", range(60))
def test_random_configuration_matches_reference(seed):
    rng = np.random.default_rng(1000 + seed)
    run_and_compare(random_case(rng))


@pytest.mark.parametrize("dtype", dtypes(), ids=lambda d: np.dtype(d).name)
def test_decode_step_each_dtype(dtype):
    rng = np.random.default_rng(7)
    kw = dict(q=rng.standard_normal((3, 1, 8, 64)).astype(dtype),
              k_cache=rng.standard_normal((3, 40, 2, 64)).astype(dtype),
              v_cache=rng.standard_normal((3, 40, 2, 64)).astype(dtype),
              k=rng.standard_normal((3, 1, 2, 64)).astype(dtype),
              v=rng.standard_normal((3, 1, 2, 64)).astype(dtype),
              cache_seqlens=np.array([0, 17, 39], dtype=np.int32), causal=True)
    run_and_compare(kw)


def test_split_kv_returns_partials_with_fa3_shapes():
    rng = np.random.default_rng(3)
    b, h, d, capacity = 2, 4, 32, 256
    kw = dict(q=rng.standard_normal((b, 1, h, d)).astype(np.float32),
              k_cache=rng.standard_normal((b, capacity, 2, d)).astype(np.float32),
              v_cache=rng.standard_normal((b, capacity, 2, d)).astype(np.float32),
              cache_seqlens=np.array([200, 256], dtype=np.int32), num_splits=4)
    out_accum, lse_accum = run_and_compare(kw)
    if out_accum.size:  # the plan split: FA3's (num_splits, b, h, s_q, d_v) / (num_splits, b, h, s_q)
        assert out_accum.shape[1:] == (b, h, 1, d) and out_accum.dtype == np.float32
        assert lse_accum.shape == out_accum.shape[:-1]
    else:
        assert out_accum.shape == (0,) and lse_accum.shape == (0,)


def test_int_cache_seqlens_covers_the_batch_of_a_paged_cache():
    # sgl-kernel expands an int to k_cache.shape[0] (the page count); kvflash to the batch size.
    rng = np.random.default_rng(5)
    kw = dict(q=rng.standard_normal((2, 1, 2, 32)).astype(np.float32),
              k_cache=rng.standard_normal((9, 4, 2, 32)).astype(np.float32),
              v_cache=rng.standard_normal((9, 4, 2, 32)).astype(np.float32),
              page_table=np.array([[8, 1, 5], [0, 2, 3]], dtype=np.int32), cache_seqlens=10)
    run_and_compare(kw)


def test_qv_absorbed_query():
    rng = np.random.default_rng(11)
    kw = dict(q=rng.standard_normal((2, 1, 4, 64)).astype(np.float32),
              qv=rng.standard_normal((2, 1, 4, 256)).astype(np.float32),
              k_cache=rng.standard_normal((2, 24, 1, 64)).astype(np.float32),
              v_cache=rng.standard_normal((2, 24, 1, 256)).astype(np.float32),
              cache_seqlens=np.array([5, 24], dtype=np.int32))
    run_and_compare(kw)


def test_outputs_written_into_caller_out():
    rng = np.random.default_rng(2)
    q = rng.standard_normal((1, 2, 2, 16)).astype(np.float32)
    cache = rng.standard_normal((1, 8, 1, 16)).astype(np.float32)
    out = np.full((1, 2, 2, 16), np.nan, dtype=np.float32)
    result = flash_attn_with_kvcache(q, cache, cache.copy(), cache_seqlens=8, out=out)
    assert result is out
    assert np.isfinite(out).all()


def test_rejected_call_leaves_the_cache_untouched():
    rng = np.random.default_rng(4)
    k_cache = rng.standard_normal((2, 8, 1, 16)).astype(np.float32)
    before = k_cache.copy()
    with pytest.raises(ValueError):
        flash_attn_with_kvcache(
            rng.standard_normal((2, 1, 1, 16)).astype(np.float32), k_cache, k_cache.copy(),
            k=np.ones((2, 1, 1, 16), np.float32), v=np.ones((2, 1, 1, 16), np.float32),
            cache_seqlens=np.array([1, 2, 3], dtype=np.int32))
    np.testing.assert_array_equal(k_cache, before)


@pytest.mark.skipif(len(dtypes()) < 3, reason="needs ml_dtypes for bfloat16")
def test_bfloat16_sinks():
    bf16 = dtypes()[2]
    rng = np.random.default_rng(9)
    kw = dict(q=rng.standard_normal((2, 2, 4, 32)).astype(bf16),
              k_cache=rng.standard_normal((2, 16, 2, 32)).astype(bf16),
              v_cache=rng.standard_normal((2, 16, 2, 32)).astype(bf16),
              cache_seqlens=np.array([0, 9], dtype=np.int32),
              sinks=(rng.standard_normal(4) * 2).astype(bf16), causal=True)
    run_and_compare(kw)  # sequence 0 has no key: out 0, LSE = the sink


@pytest.mark.parametrize("seed", range(8))
def test_dense_and_varlen_functions_match_reference(seed):
    from kvflash.flash_attn_interface import flash_attn_func, flash_attn_varlen_func

    rng = np.random.default_rng(2000 + seed)
    h_k = int(rng.integers(1, 3))
    h, d = h_k * int(rng.choice([1, 2])), int(rng.choice([16, 32]))
    opts = dict(causal=bool(rng.random() < 0.5), softcap=float(rng.choice([0.0, 8.0])),
                window_size=(int(rng.choice([-1, 2])), -1))
    lens_q, lens_k = rng.integers(1, 6, size=3), rng.integers(1, 9, size=3)
    qs = [rng.standard_normal((n, h, d)).astype(np.float32) for n in lens_q]
    ks = [rng.standard_normal((n, h_k, d)).astype(np.float32) for n in lens_k]
    vs = [rng.standard_normal((n, h_k, d)).astype(np.float32) for n in lens_k]
    cu_q = np.concatenate([[0], np.cumsum(lens_q)]).astype(np.int32)
    cu_k = np.concatenate([[0], np.cumsum(lens_k)]).astype(np.int32)
    out, lse = flash_attn_varlen_func(np.concatenate(qs), np.concatenate(ks), np.concatenate(vs),
                                      cu_q, cu_k, int(lens_q.max()), int(lens_k.max()),
                                      return_attn_probs=True, **opts)
    for b in range(3):
        want, want_lse, *_ = reference_kvcache(qs[b][None], ks[b][None], vs[b][None], **opts)
        np.testing.assert_allclose(out[cu_q[b]:cu_q[b + 1]], want[0], rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(lse[:, cu_q[b]:cu_q[b + 1]], want_lse[0], rtol=1e-4, atol=1e-4)
        dense = flash_attn_func(qs[b][None], ks[b][None], vs[b][None], **opts)
        np.testing.assert_allclose(dense[0], want[0], rtol=1e-4, atol=1e-4)


def test_only_qv_without_q_and_k_cache():
    rng = np.random.default_rng(12)
    qv = rng.standard_normal((2, 1, 4, 256)).astype(np.float32)
    v_cache = rng.standard_normal((2, 16, 1, 256)).astype(np.float32)
    seqlens = np.array([3, 16], dtype=np.int32)
    out = flash_attn_with_kvcache(None, None, v_cache, qv=qv, cache_seqlens=seqlens, only_qv=True,
                                  softmax_scale=0.05)
    # The same scores as q = 0 against a zero k_cache: qv . v alone.
    want, *_ = reference_kvcache(np.zeros((2, 1, 4, 64), np.float32), np.zeros((2, 16, 1, 64), np.float32),
                                 v_cache, qv=qv, cache_seqlens=seqlens, softmax_scale=0.05)
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4)
