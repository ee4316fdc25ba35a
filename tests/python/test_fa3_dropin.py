"""Code written against FA3's flash_attn_interface (its tests' patterns, SGLang's FA3 attention
backend) runs unchanged on kvflash, with FA3's results and return conventions (issue 17; the
compatibility table of python/README.md). Every case runs on numpy arrays, torch CPU tensors and
torch CUDA tensors (skipped where torch or a GPU is missing)."""

import numpy as np
import pytest

from kvflash import flash_attn_interface as fai

from devices import DEVICES, TORCH_DEVICES, Device, assert_close, assert_same, host, torch
from reference import reference_kvcache

B, H, HK, D, CAPACITY = 2, 4, 2, 128, 48


def decode_call(device, rng, s_q=3):
    """A causal call over a dense cache: 2 sequences of s_q query rows, 30 and 17 cached keys."""
    return dict(q=device.randn(rng, B, s_q, H, D), k_cache=device.randn(rng, B, CAPACITY, HK, D),
                v_cache=device.randn(rng, B, CAPACITY, HK, D),
                cache_seqlens=device.ints([30, 17]), causal=True)


def reference(kw, **changes):
    arguments = {name: (host(value) if name in ARRAY_ARGUMENTS and value is not None else value)
                 for name, value in {**kw, **changes}.items()}
    return reference_kvcache(**arguments)[:2]


ARRAY_ARGUMENTS = {"q", "k_cache", "v_cache", "qv", "cache_seqlens", "page_table", "cu_seqlens_q"}


# --- window_size: any pair of integers ------------------------------------------------------

def window_forms(device):
    forms = [(5, 0), [5, 0], np.array([5, 0]), np.array([5, 0], np.int64),
             (np.int64(5), np.int32(0))]
    if device.is_torch:
        forms += [torch.tensor([5, 0], device=device.name), (torch.tensor(5), torch.tensor(0)),
                  torch.tensor([5, 0], dtype=torch.int32, device=device.name)]
    return forms


@pytest.mark.parametrize("device", DEVICES)
def test_window_size_any_pair_of_integers(device):
    device, rng = Device(device), np.random.default_rng(0)
    kw = decode_call(device, rng)
    want = fai.flash_attn_with_kvcache(**kw, window_size=(5, 0))
    assert_close(want, reference(kw, window_size=(5, 0))[0], device.tol)
    for form in window_forms(device):
        assert_same(fai.flash_attn_with_kvcache(**kw, window_size=form), want)
    # None for a side (FA4's spelling) or for the whole pair: unbounded.
    assert_same(fai.flash_attn_with_kvcache(**kw, window_size=(None, None)),
                fai.flash_attn_with_kvcache(**kw, window_size=None))
    dense = dict(q=kw["q"], k=kw["k_cache"][:, :20], v=kw["v_cache"][:, :20], causal=True)
    assert_same(fai.flash_attn_func(**dense, window_size=window_forms(device)[-1]),
                fai.flash_attn_func(**dense, window_size=(5, 0)))
    metadata = fai.get_scheduler_metadata(B, 3, CAPACITY, H, HK, D, kw["cache_seqlens"],
                                          qkv_dtype=device.float_dtype, causal=True,
                                          window_size=window_forms(device)[-1])
    assert_same(fai.flash_attn_with_kvcache(**kw, window_size=(5, 0), scheduler_metadata=metadata),
                want)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bad", [(5.0, 0), np.array([5.5, 0.0]), (1, 2, 3), 5, "ab", ()])
def test_window_size_that_is_not_a_pair_of_integers_names_it(device, bad):
    device, rng = Device(device), np.random.default_rng(0)
    with pytest.raises(TypeError, match=r"^window_size must be a pair \(left, right\) of ints, got "):
        fai.flash_attn_with_kvcache(**decode_call(device, rng), window_size=bad)


# --- scheduler metadata made once per batch -------------------------------------------------

def metadata_for(kw, **changes):
    arguments = dict(batch_size=B, max_seqlen_q=kw["q"].shape[1], max_seqlen_k=CAPACITY,
                     num_heads_q=H, num_heads_kv=HK, headdim=D, cache_seqlens=kw["cache_seqlens"],
                     causal=True)
    return fai.get_scheduler_metadata(**{**arguments, **changes})


@pytest.mark.parametrize("device", DEVICES)
def test_metadata_of_a_compatible_problem_gives_the_calls_own_result(device):
    device, rng = Device(device), np.random.default_rng(1)
    kw = decode_call(device, rng, s_q=1)
    own = fai.flash_attn_with_kvcache(**kw)
    # FA3's pattern: metadata made with max_seqlen_k_new for a call that appends nothing; the
    # default qkv_dtype (bfloat16) for a float16 call; a larger capacity.
    for changes in (dict(max_seqlen_k_new=1, qkv_dtype=device.float_dtype), dict(),
                    dict(max_seqlen_k=4 * CAPACITY, qkv_dtype=device.float_dtype)):
        metadata = metadata_for(kw, **changes)
        assert_same(fai.flash_attn_with_kvcache(**kw, scheduler_metadata=metadata), own)
    # A copy is not kvflash's tensor: FA3's layout is read instead. On the host its entries are
    # checked and the call runs its own vectors; on a GPU the kernels read its split counts (as
    # FA3 does), which may split a sequence differently from the device's own rule.
    copy = metadata_for(kw, qkv_dtype=device.float_dtype)
    copy = copy.clone() if device.is_torch else copy.copy()
    with_copy = fai.flash_attn_with_kvcache(**kw, scheduler_metadata=copy)
    if device.name == "cuda":
        assert_close(with_copy, host(own), device.tol)
    else:
        assert_same(with_copy, own)


@pytest.mark.parametrize("device", DEVICES)
def test_metadata_that_would_change_the_result_is_refused_naming_the_field(device):
    device, rng = Device(device), np.random.default_rng(2)
    kw = decode_call(device, rng, s_q=1)
    metadata = metadata_for(kw, num_splits=3, qkv_dtype=device.float_dtype)
    with pytest.raises(ValueError, match=r"^scheduler_metadata was made for a different problem: "
                                         r"num_splits \(plan made for 3, call has 1\), "
                                         r"which changes num_splits"):
        fai.flash_attn_with_kvcache(**kw, num_splits=1, scheduler_metadata=metadata)
    with pytest.raises(ValueError, match="^scheduler_metadata was made for a different problem: "
                                         "batch \\(plan made for 1, call has 2\\)"):
        fai.flash_attn_with_kvcache(**kw, scheduler_metadata=metadata_for(
            kw, batch_size=1, cache_seqlens=kw["cache_seqlens"][:1]))


def mla_call(device, rng):
    """SGLang's MLA decode (small): the rotary part q / k_cache (d 64), the latent cache and qv
    (d_v 512), one KV head, a paged cache of page 1 in shuffled order."""
    lengths, heads, pages = [5, 8], 3, 16
    table = rng.permutation(pages).reshape(B, pages // B)
    return dict(q=device.randn(rng, B, 1, heads, 64), k_cache=device.randn(rng, pages, 1, 1, 64),
                v_cache=device.randn(rng, pages, 1, 1, 512), qv=device.randn(rng, B, 1, heads, 512),
                page_table=device.ints(table), cache_seqlens=device.ints(lengths), causal=True)


@pytest.mark.parametrize("device", DEVICES)
def test_mla_metadata_made_the_fa3_way_serves_calls_with_qv(device):
    # FA3's get_scheduler_metadata has no qv argument (FA3 plans before it reads qv): headdim_v
    # 512 is MLA's latent width, planned for calls that pass qv.
    device, rng = Device(device), np.random.default_rng(5)
    kw = mla_call(device, rng)
    own = fai.flash_attn_with_kvcache(**kw)
    want = reference(kw)[0]
    assert_close(own, want, device.tol)
    arguments = dict(batch_size=B, max_seqlen_q=1, max_seqlen_k=8, num_heads_q=3, num_heads_kv=1,
                     headdim=64, cache_seqlens=kw["cache_seqlens"], qkv_dtype=device.float_dtype,
                     headdim_v=512, page_size=1, causal=True)
    for has_qv in (None, True):
        metadata = fai.get_scheduler_metadata(**arguments, has_qv=has_qv)
        assert fai._plan_for(metadata).key.has_qv
        assert_same(fai.flash_attn_with_kvcache(**kw, scheduler_metadata=metadata), own)
    # Below MLA's width, None plans without qv, as FA3 does.
    narrow = fai.get_scheduler_metadata(**{**arguments, "headdim_v": 256})
    assert not fai._plan_for(narrow).key.has_qv
    # Planned without qv: the same plan on the CPU; on sm_90 a different kernel family, refused
    # by name (the error the bench met before has_qv was read from the shape).
    metadata = fai.get_scheduler_metadata(**arguments, has_qv=False)
    try:
        assert_same(fai.flash_attn_with_kvcache(**kw, scheduler_metadata=metadata), own)
    except ValueError as e:
        assert str(e).startswith("scheduler_metadata was made for a different problem: has_qv "
                                 "(plan made for false, call has true)"), e


# --- flash_attn_varlen_func: seqused_q, seqused_k, a paged K/V --------------------------------

CU_Q, USED_Q = [0, 5, 9, 16], [3, 4, 0]         # rows 5, 4, 7; used 3, 4, 0
CU_K, USED_K = [0, 20, 33, 50], [18, 13, 9]     # keys 20, 13, 17; used 18, 13, 9


def varlen_expected(q, k, v, causal):
    """Per sequence: the used rows attend the used keys (float64 reference); the other rows are
    out 0 and LSE -inf. Returns (out (total_q, h, d), lse (h, total_q))."""
    out = np.zeros(q.shape)
    lse = np.full((H, q.shape[0]), -np.inf)
    for b in range(3):
        rows = slice(CU_Q[b], CU_Q[b] + USED_Q[b])
        keys = slice(CU_K[b], CU_K[b] + USED_K[b])
        if USED_Q[b] == 0:
            continue
        o, l = reference_kvcache(q[None, rows], k[None, keys], v[None, keys], causal=causal)[:2]
        out[rows], lse[:, rows] = o[0], l[0]
    return out, lse


def paged(device, rng, k, v, page_size=8):
    """The used keys of each sequence in a shuffled paged cache: (k_cache, v_cache, page_table)."""
    pages_per_seq = 3
    order = rng.permutation(3 * pages_per_seq)
    k_cache = np.zeros((3 * pages_per_seq, page_size, HK, D))
    v_cache = np.zeros_like(k_cache)
    table = order.reshape(3, pages_per_seq)
    for b in range(3):
        for j in range(USED_K[b]):
            page, slot = table[b, j // page_size], j % page_size
            k_cache[page, slot], v_cache[page, slot] = k[CU_K[b] + j], v[CU_K[b] + j]
    return device(k_cache), device(v_cache), device.ints(table)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("keys", ["packed", "paged"])
def test_varlen_seqused_and_paged_kv(device, causal, keys):
    device, rng = Device(device), np.random.default_rng(3)
    q, k, v = (device.randn(rng, n, h, D) for n, h in ((16, H), (50, HK), (50, HK)))
    want_out, want_lse = varlen_expected(host(q), host(k), host(v), causal)
    common = dict(seqused_q=device.ints(USED_Q), seqused_k=device.ints(USED_K), causal=causal,
                  return_attn_probs=True)
    if keys == "packed":
        out, lse = fai.flash_attn_varlen_func(q, k, v, device.ints(CU_Q), device.ints(CU_K), 7, 20,
                                              **common)
    else:
        k_cache, v_cache, table = paged(device, rng, host(k), host(v))
        out, lse = fai.flash_attn_varlen_func(q, k_cache, v_cache, device.ints(CU_Q), None, 7, None,
                                              page_table=table, **common)
    assert_close(out, want_out, device.tol)
    assert_close(lse, want_lse, device.tol)
    # sgl-kernel's return_softmax_lse: (out, softmax_lse, out_accum, softmax_lse_accum).
    common.pop("return_attn_probs")
    if keys == "packed":
        result = fai.flash_attn_varlen_func(q, k, v, device.ints(CU_Q), device.ints(CU_K), 7, 20,
                                            return_softmax_lse=True, **common)
        assert len(result) == 4
        assert_same(result[0], out)
        assert_same(result[1], lse)


# --- inputs that require grad: forward runs, backward is refused ------------------------------

@pytest.mark.parametrize("device", TORCH_DEVICES)
def test_requires_grad_runs_forward_and_refuses_backward(device):
    device, rng = Device(device), np.random.default_rng(4)
    q, k = device.randn(rng, 1, 4, H, D), device.randn(rng, 1, 6, HK, D)
    q.requires_grad_()
    out, lse = fai.flash_attn_func(q, k, k, causal=True, return_attn_probs=True)
    assert out.requires_grad and not lse.requires_grad
    with torch.no_grad():
        assert torch.equal(out, fai.flash_attn_func(q, k, k, causal=True))
    with pytest.raises(RuntimeError, match="^kvflash.flash_attn_func is forward only"):
        out.float().sum().backward()
    cu_q, cu_k = device.ints([0, 4]), device.ints([0, 6])
    out = fai.flash_attn_varlen_func(q[0], k[0], k[0], cu_q, cu_k, 4, 6)
    with torch.no_grad():
        assert torch.equal(out, fai.flash_attn_varlen_func(q[0], k[0], k[0], cu_q, cu_k, 4, 6))
    with pytest.raises(RuntimeError, match="^kvflash.flash_attn_varlen_func is forward only"):
        out.float().sum().backward()


# --- flash_attn_combine, head dims 64 and 512 (MLA) -------------------------------------------

def combine_expected(out_partial, lse_partial):
    top = lse_partial.max(axis=0)
    shift = np.where(np.isinf(top), 0.0, top)
    weights = np.exp(lse_partial - shift)
    total = weights.sum(axis=0)
    with np.errstate(divide="ignore", invalid="ignore"):
        lse = np.where(total > 0, np.log(total) + shift, -np.inf)
        scale = np.where(total > 0, weights / total, 0.0)
    return (scale[..., None] * out_partial).sum(axis=0), lse


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("headdim", [64, 512])
def test_combine_on_every_device(device, headdim):
    device, rng = Device(device), np.random.default_rng(5)
    out_partial = rng.standard_normal((3, 2, 2, H, headdim))
    lse_partial = rng.standard_normal((3, 2, 2, H))
    lse_partial[1, 0, 0, 0] = -np.inf      # an empty split
    lse_partial[:, 1, 1, 2] = -np.inf      # a row with no key at all: out 0, LSE -inf
    want_out, want_lse = combine_expected(out_partial, lse_partial)
    as_f32 = (lambda a: torch.from_numpy(a).float().to(device.name)) if device.is_torch else \
        (lambda a: a.astype(np.float32))
    out, lse = fai.flash_attn_combine(as_f32(out_partial), as_f32(lse_partial))
    assert_close(out, want_out, 1e-5)
    assert_close(lse, want_lse, 1e-5)
    out16, _ = fai.flash_attn_combine(as_f32(out_partial), as_f32(lse_partial),
                                      out_dtype=device.float_dtype)
    assert out16.dtype == device.float_dtype and host(out16).shape == want_out.shape
    assert_close(out16, want_out, device.tol)


# --- the argument types FA3's callers pass (SGLang's FA3 backend, FA3's tests) ----------------

def qkv_dtype_forms(device):
    if device.name == "cuda":
        forms = [torch.bfloat16, "bfloat16"]
    else:
        forms = [np.float16, np.dtype("float16"), "float16", "half"]
        if torch is not None:
            forms.append(torch.float16)
    return forms


@pytest.mark.parametrize("device", DEVICES)
def test_qkv_dtype_as_torch_numpy_or_name(device):
    device, rng = Device(device), np.random.default_rng(6)
    kw = decode_call(device, rng, s_q=1)
    own = fai.flash_attn_with_kvcache(**kw)
    for form in qkv_dtype_forms(device):
        metadata = metadata_for(kw, qkv_dtype=form)
        assert_same(fai.flash_attn_with_kvcache(**kw, scheduler_metadata=metadata), own)
    with pytest.raises(TypeError, match="^qkv_dtype 'int8' is not a dtype kvflash takes"):
        metadata_for(kw, qkv_dtype="int8")


@pytest.mark.parametrize("device", DEVICES)
def test_none_means_the_default(device):
    device, rng = Device(device), np.random.default_rng(7)
    kw = decode_call(device, rng)
    own = fai.flash_attn_with_kvcache(**kw)
    assert_close(own, reference(kw)[0], device.tol)
    for name, none_value in (("softcap", 0.0), ("attention_chunk", 0), ("num_splits", 0),
                             ("sm_margin", 0), ("pack_gqa", None), ("max_seqlen_q", None),
                             ("softmax_scale", D ** -0.5), ("window_size", (-1, -1))):
        assert_same(fai.flash_attn_with_kvcache(**kw, **{name: None}),
                    fai.flash_attn_with_kvcache(**kw, **{name: none_value}))
    metadata = metadata_for(kw, qkv_dtype=device.float_dtype, max_seqlen_k_new=None,
                            num_splits=None, sm_margin=None, attention_chunk=None)
    assert_same(fai.flash_attn_with_kvcache(**kw, scheduler_metadata=metadata), own)
    # No cache_seqlens: every sequence has the whole capacity, as an int or a tensor says.
    full = {**kw, "cache_seqlens": None}
    assert_same(fai.flash_attn_with_kvcache(**full),
                fai.flash_attn_with_kvcache(**kw | {"cache_seqlens": CAPACITY}))
    assert_same(fai.flash_attn_with_kvcache(**full),
                fai.flash_attn_with_kvcache(**kw | {"cache_seqlens": device.ints([CAPACITY] * B)}))


def sglang_varlen_call(device, rng):
    """SGLang's extend / decode call: q (total, h, d) with cu_seqlens_q and an int max_seqlen_q,
    a paged cache (page size 4), device cache_seqlens, and cu_seqlens_k (its new keys, already in
    the cache) passed as cu_seqlens_k_new without k / v, which FA3 ignores."""
    pages = rng.permutation(2 * 12).reshape(2, 12)
    return dict(q=device.randn(rng, 7, H, D), k_cache=device.randn(rng, 24, 4, HK, D),
                v_cache=device.randn(rng, 24, 4, HK, D), page_table=device.ints(pages),
                cache_seqlens=device.ints([30, 9]), cu_seqlens_q=device.ints([0, 4, 7]),
                max_seqlen_q=4, causal=True)


@pytest.mark.parametrize("device", DEVICES)
def test_sglang_varlen_call_and_scalar_types(device):
    device, rng = Device(device), np.random.default_rng(8)
    kw = sglang_varlen_call(device, rng)
    out, lse, *rest = fai.flash_attn_with_kvcache(**kw, return_softmax_lse=True)
    want_out, want_lse = reference(kw)
    assert_close(out, want_out, device.tol)
    assert_close(lse, want_lse, device.tol)
    assert tuple(lse.shape) == (H, 7) and len(rest) == 2  # varlen LSE: (h, total_q)
    assert_same(fai.flash_attn_with_kvcache(**kw, cu_seqlens_k_new=device.ints([0, 3, 6])), out)
    scalars = [(np.int64(4), None), (4, np.float32(D ** -0.5)), (4, D ** -0.5)]
    if device.is_torch:
        scalars.append((torch.tensor(4), torch.tensor(D ** -0.5)))
    for max_seqlen_q, softmax_scale in scalars:
        assert_same(fai.flash_attn_with_kvcache(**kw | {"max_seqlen_q": max_seqlen_q},
                                                softmax_scale=softmax_scale), out)


@pytest.mark.parametrize("device", DEVICES)
def test_out_buffer_and_return_softmax_lse(device):
    device, rng = Device(device), np.random.default_rng(9)
    kw = decode_call(device, rng)
    own, lse, out_accum, lse_accum = fai.flash_attn_with_kvcache(**kw, return_softmax_lse=True)
    assert tuple(own.shape) == (B, 3, H, D) and tuple(lse.shape) == (B, H, 3)
    buffer = device(np.zeros((B, 3, H, D)))
    assert fai.flash_attn_with_kvcache(**kw, out=buffer) is buffer
    assert_same(buffer, own)
    out, *rest = fai.flash_attn_with_kvcache(**kw, out=buffer, return_softmax_lse=True)
    assert out is buffer and len(rest) == 3


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("num_splits", [0, 1, 3])
@pytest.mark.parametrize("pack_gqa", [None, True, False])
def test_num_splits_and_pack_gqa(device, num_splits, pack_gqa):
    device, rng = Device(device), np.random.default_rng(10)
    kw = decode_call(device, rng)
    out, lse, out_accum, lse_accum = fai.flash_attn_with_kvcache(
        **kw, num_splits=num_splits, pack_gqa=pack_gqa, sm_margin=4, return_softmax_lse=True)
    want_out, want_lse = reference(kw)
    assert_close(out, want_out, device.tol)
    assert_close(lse, want_lse, device.tol)
    # FA3's partials: empty when the call does not split, else (splits, b, h, s_q[, d_v]).
    if out_accum.numel() if device.is_torch else out_accum.size:
        splits = out_accum.shape[0]
        assert tuple(out_accum.shape) == (splits, B, H, 3, D)
        assert tuple(lse_accum.shape) == (splits, B, H, 3)


@pytest.mark.parametrize("device", DEVICES)
def test_dense_function_arguments(device):
    device, rng = Device(device), np.random.default_rng(11)
    q = device.randn(rng, B, 5, H, D)
    k, v = device.randn(rng, B, 9, HK, D), device.randn(rng, B, 9, HK, D)
    want = reference_kvcache(host(q), host(k), host(v), causal=True)[0]
    for deterministic in (False, True):
        for num_splits, pack_gqa in ((1, None), (0, True), (2, False)):
            out = fai.flash_attn_func(q, k, v, causal=True, deterministic=deterministic,
                                      num_splits=num_splits, pack_gqa=pack_gqa, sm_margin=2)
            assert_close(out, want, device.tol)
