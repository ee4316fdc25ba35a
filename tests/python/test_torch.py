"""torch tensors: CPU and CUDA calls, in-place cache updates,
torch.compile(fullgraph=True) through the custom op, and CUDA-graph capture of a decode step.
Skipped where torch is absent; the CUDA tests need a GPU and kvflash's CUDA backend."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import kvflash  # noqa: E402
from kvflash import SchedulingBackend, flash_attn_interface as fai  # noqa: E402

from reference import reference_kvcache  # noqa: E402

HAS_CUDA = torch.cuda.is_available() and "cuda" in kvflash.build_backends()
needs_cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs a GPU and kvflash's CUDA backend")

TOL = {torch.float32: 1e-4, torch.float16: 5e-3, torch.bfloat16: 3e-2}


def as_numpy(t):
    if t is None:
        return None
    t = t.detach().cpu()
    return t.numpy() if t.dtype == torch.int32 else t.float().numpy()


def decode_inputs(device, dtype, b=3, h=8, hk=2, d=64, capacity=128, paged=False, seed=0):
    g = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=g).to(device=device, dtype=dtype)

    kw = dict(q=randn(b, 1, h, d), k=randn(b, 1, hk, d), v=randn(b, 1, hk, d),
              cache_seqlens=torch.tensor([0, 37, capacity - 1][:b], dtype=torch.int32, device=device),
              causal=True)
    if paged:
        page = 16
        pages = b * capacity // page
        kw["k_cache"], kw["v_cache"] = randn(pages, page, hk, d), randn(pages, page, hk, d)
        kw["page_table"] = torch.randperm(pages, generator=g).reshape(b, -1).to(device=device, dtype=torch.int32)
    else:
        kw["k_cache"], kw["v_cache"] = randn(b, capacity, hk, d), randn(b, capacity, hk, d)
    return kw


def check_against_reference(kw, out, lse, k_before, v_before):
    numpy_kw = {name: (as_numpy(value) if torch.is_tensor(value) else value)
                for name, value in kw.items() if name != "scheduler_metadata"}
    numpy_kw["k_cache"], numpy_kw["v_cache"] = as_numpy(k_before), as_numpy(v_before)
    want_out, want_lse, want_k, want_v = reference_kvcache(**numpy_kw)
    tol = TOL[kw["q"].dtype]
    np.testing.assert_allclose(as_numpy(out), want_out, rtol=tol, atol=tol)
    np.testing.assert_allclose(as_numpy(lse), want_lse, rtol=tol, atol=tol)
    np.testing.assert_allclose(as_numpy(kw["k_cache"]), want_k, rtol=tol, atol=tol)
    np.testing.assert_allclose(as_numpy(kw["v_cache"]), want_v, rtol=tol, atol=tol)


def run_decode(kw):
    k_before, v_before = kw["k_cache"].clone(), kw["v_cache"].clone()
    out, lse, *rest = fai.flash_attn_with_kvcache(**kw, return_softmax_lse=True)
    assert out.device == kw["q"].device and out.dtype == kw["q"].dtype
    assert lse.dtype == torch.float32 and len(rest) == 2
    check_against_reference(kw, out, lse, k_before, v_before)
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("paged", [False, True])
def test_cpu_tensors(dtype, paged):
    run_decode(decode_inputs("cpu", dtype, paged=paged))


def test_int_cache_seqlens_and_non_contiguous_views():
    kw = decode_inputs("cpu", torch.float32)
    kw["cache_seqlens"] = 40
    big = torch.randn(3, 128, 4, 64)
    kw["k_cache"] = big[:, :, 1:3]  # strided heads: only the last dim must be contiguous
    kw["v_cache"] = big[:, :, 2:4].clone()
    run_decode(kw)


TENSORS_TO_VIEW = {
    "bf16": lambda: torch.randn(2, 1, 4, 64, dtype=torch.bfloat16),
    "size-1 dim with a stride of its own": lambda: torch.randn(2, 3, 4, 64)[:, 1:2],
    "transposed": lambda: torch.randn(4, 64).t(),
    "storage offset": lambda: torch.randn(10, 64)[3:],
    "empty": lambda: torch.empty(0, 4, 64),
    "0-d": lambda: torch.tensor(3.0),
    "float8": lambda: torch.randn(4, 8).to(torch.float8_e4m3fn),
    "int32": lambda: torch.arange(6, dtype=torch.int32),
    "requires grad": lambda: torch.randn(3, 4, requires_grad=True),
    "broadcast": lambda: torch.randn(1, 64).expand(5, 64),
    "float64": lambda: torch.randn(3, dtype=torch.float64),
    "float16": lambda: torch.randn(3, dtype=torch.float16),
}


@pytest.mark.parametrize("make", TENSORS_TO_VIEW.values(), ids=TENSORS_TO_VIEW.keys())
def test_exchange_view_equals_attribute_view(make):
    # The per-call path reads torch tensors through torch's DLPack C exchange table where torch
    # has one; the attribute path (which also words the errors) must see the same tensor.
    t = make()
    by_attributes = kvflash._kvflash._torch_view(t, "attributes")
    by_exchange = kvflash._kvflash._torch_view(t, "exchange")
    if hasattr(torch.Tensor, "__dlpack_c_exchange_api__"):
        assert by_exchange == by_attributes
    else:
        assert by_exchange is None


@pytest.mark.parametrize("make, message", [
    (lambda: torch.arange(6), "tensor has dtype torch.int64"),
    (lambda: torch.empty(3, 4, device="meta"), "tensor is on device meta"),
    (lambda: torch.randn(1, 1, 1, 1, 1, 1, 2), "tensor has 7 dimensions"),
])
def test_tensors_the_exchange_cannot_describe_get_torch_worded_errors(make, message):
    t = make()
    assert kvflash._kvflash._torch_view(t, "exchange") is None
    with pytest.raises((TypeError, ValueError), match=message):
        kvflash._kvflash._torch_view(t, "attributes")


def test_outputs_are_plain_row_major_torch_tensors():
    kw = decode_inputs("cpu", torch.bfloat16)
    # q row-major but for the stride of its size-1 dim: out is still torch.empty's row-major
    kw["q"] = torch.randn(3 * 8 * 64, dtype=torch.bfloat16).as_strided((3, 1, 8, 64), (512, 7, 64, 1))
    out = fai.flash_attn_with_kvcache(**kw)
    assert type(out) is torch.Tensor and out.is_contiguous() and out.stride() == (512, 512, 64, 1)
    assert not out.requires_grad and out.data_ptr() != kw["q"].data_ptr()
    kw["q"] = torch.randn(3, 1, 8, 64, dtype=torch.bfloat16)
    out, lse, out_accum, lse_accum = fai.flash_attn_with_kvcache(**kw, return_softmax_lse=True)
    assert out.shape == kw["q"].shape and out.stride() == kw["q"].stride()
    assert lse.shape == (3, 8, 1) and lse.dtype == torch.float32 and lse.is_contiguous()


def test_cache_last_dim_assertions_on_torch_tensors():
    kw = decode_inputs("cpu", torch.float32)
    for name in ("k_cache", "v_cache"):
        strided = {**kw, name: torch.randn(3, 128, 2, 128)[..., ::2]}
        with pytest.raises(AssertionError, match=f"^{name} must have contiguous last dimension$"):
            fai.flash_attn_with_kvcache(**strided)


def test_the_wrapper_builds_the_call_in_call_args_order(monkeypatch):
    # flash_attn_with_kvcache writes _call.make's tuple out for speed: the two must agree.
    from kvflash import _call

    names = list(_call.FIELDS[:-1])
    values = {name: object() for name in names}
    seen = []
    monkeypatch.setattr(fai._ext, "fwd", lambda call, out, return_lse: seen.append(call))
    fai.flash_attn_with_kvcache(**values)
    assert seen == [_call.make(**values)]


def test_scheduler_metadata_is_a_torch_int32_tensor():
    kw = decode_inputs("cpu", torch.float16)
    metadata = fai.get_scheduler_metadata(3, 1, 128, 8, 2, 64, kw["cache_seqlens"],
                                          qkv_dtype=torch.float16, causal=True, max_seqlen_k_new=1)
    assert metadata.dtype == torch.int32 and metadata.dim() == 1
    run_decode({**kw, "scheduler_metadata": metadata})


def compiled_decode(backend):
    def step(q, k_cache, v_cache, k, v, cache_seqlens):
        out, lse, *_ = fai.flash_attn_with_kvcache(q, k_cache, v_cache, k=k, v=v,
                                                   cache_seqlens=cache_seqlens, causal=True,
                                                   return_softmax_lse=True)
        return out * 2, lse

    return torch.compile(step, fullgraph=True, backend=backend)


def test_torch_compile_fullgraph_traces_the_custom_op():
    torch._dynamo.reset()
    kw = decode_inputs("cpu", torch.float32)
    eager_kw = {name: (value.clone() if torch.is_tensor(value) else value) for name, value in kw.items()}
    out, lse = compiled_decode("aot_eager")(kw["q"], kw["k_cache"], kw["v_cache"], kw["k"], kw["v"],
                                            kw["cache_seqlens"])
    want, want_lse, *_ = fai.flash_attn_with_kvcache(**eager_kw, return_softmax_lse=True)
    torch.testing.assert_close(out, want * 2)
    torch.testing.assert_close(lse, want_lse)
    torch.testing.assert_close(kw["k_cache"], eager_kw["k_cache"])  # the op's mutation is kept


def test_custom_op_passes_opcheck():
    kw = decode_inputs("cpu", torch.float32, b=2, capacity=64)
    args = (kw["q"], kw["k_cache"], kw["v_cache"], kw["k"], kw["v"], None, None, None,
            kw["cache_seqlens"], None, None, None, None, None, None, None, None, None, None, None,
            None, True, -1, -1, 0, 0.0, True, None, 0, None, 0, None, False, True)
    torch.library.opcheck(torch.ops.kvflash.fwd_kvcache.default, args,
                          test_utils=("test_schema", "test_faketensor"))


# The CUDA tests use bf16 and head dim 128: the instantiation every CUDA build has (CI's minimal
# build included).
GPU = dict(dtype=torch.bfloat16, d=128)


@needs_cuda
@pytest.mark.parametrize("paged", [False, True])
def test_cuda_decode(paged):
    run_decode(decode_inputs("cuda", paged=paged, **GPU))


@needs_cuda
def test_cuda_runs_on_the_current_stream():
    kw = decode_inputs("cuda", **GPU)
    expected = fai.flash_attn_with_kvcache(**{n: (v.clone() if torch.is_tensor(v) else v) for n, v in kw.items()})
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        out = fai.flash_attn_with_kvcache(**kw)
    torch.cuda.current_stream().wait_stream(stream)
    torch.testing.assert_close(out, expected)


@needs_cuda
def test_cuda_torch_compile_inductor():
    torch._dynamo.reset()
    kw = decode_inputs("cuda", **GPU)
    eager_kw = {name: (value.clone() if torch.is_tensor(value) else value) for name, value in kw.items()}
    out, _ = compiled_decode("inductor")(kw["q"], kw["k_cache"], kw["v_cache"], kw["k"], kw["v"],
                                         kw["cache_seqlens"])
    want = fai.flash_attn_with_kvcache(**eager_kw)
    torch.testing.assert_close(out, want * 2)


@needs_cuda
@pytest.mark.parametrize("with_backend", [False, True])
def test_cuda_graph_capture_of_a_decode_step(with_backend):
    kw = decode_inputs("cuda", paged=True, **GPU)
    q, k_cache, v_cache, page_table = kw["q"], kw["k_cache"], kw["v_cache"], kw["page_table"]
    k, v, seqlens = kw["k"], kw["v"], kw["cache_seqlens"]
    backend = SchedulingBackend(cuda_graph=True, max_batch_size=8) if with_backend else None

    def step():
        return fai.flash_attn_with_kvcache(q, k_cache, v_cache, k=k, v=v, cache_seqlens=seqlens,
                                           page_table=page_table, causal=True)

    def in_batch(fn):
        if backend is None:
            return fn()
        with backend.batch(graph="bs3"):
            return fn()

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        in_batch(step)  # warm-up outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = in_batch(step)

    # Replay with new inputs written into the captured buffers.
    new = decode_inputs("cuda", paged=True, seed=1, **GPU)
    q.copy_(new["q"])
    k.copy_(new["k"])
    v.copy_(new["v"])
    seqlens.copy_(torch.tensor([5, 90, 60], dtype=torch.int32))
    k_before, v_before = k_cache.clone(), v_cache.clone()
    if backend is not None:
        assert backend.refill("bs3") == 1
    graph.replay()
    torch.cuda.synchronize()
    lse_free = {"q": q, "k_cache": k_cache, "v_cache": v_cache, "k": k, "v": v,
                "cache_seqlens": seqlens, "page_table": page_table, "causal": True}
    numpy_kw = {name: (as_numpy(value) if torch.is_tensor(value) else value) for name, value in lse_free.items()}
    numpy_kw["k_cache"], numpy_kw["v_cache"] = as_numpy(k_before), as_numpy(v_before)
    want_out, _, want_k, _ = reference_kvcache(**numpy_kw)
    np.testing.assert_allclose(as_numpy(out), want_out, rtol=3e-2, atol=3e-2)
    np.testing.assert_allclose(as_numpy(k_cache), want_k, rtol=3e-2, atol=3e-2)


def test_varlen_and_combine_with_torch_tensors():
    g = torch.Generator().manual_seed(3)
    q = torch.randn(7, 4, 32, generator=g)
    k = torch.randn(9, 2, 32, generator=g)
    v = torch.randn(9, 2, 32, generator=g)
    cu_q = torch.tensor([0, 3, 7], dtype=torch.int32)
    cu_k = torch.tensor([0, 5, 9], dtype=torch.int32)
    out, lse = fai.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 4, 5, causal=True, return_attn_probs=True)
    want, want_lse = fai.flash_attn_varlen_func(q.numpy(), k.numpy(), v.numpy(), cu_q.numpy(),
                                                cu_k.numpy(), 4, 5, causal=True, return_attn_probs=True)
    assert isinstance(out, torch.Tensor) and out.shape == (7, 4, 32) and lse.shape == (4, 7)
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(lse.numpy(), want_lse, rtol=1e-5, atol=1e-5)

    out_partial = torch.randn(3, 2, 1, 4, 16, generator=g)
    lse_partial = torch.randn(3, 2, 1, 4, generator=g)
    combined, combined_lse = fai.flash_attn_combine(out_partial, lse_partial, out_dtype=torch.bfloat16)
    assert combined.dtype == torch.bfloat16 and combined_lse.dtype == torch.float32
    torch.testing.assert_close(combined_lse, torch.logsumexp(lse_partial, dim=0))
    weights = torch.softmax(lse_partial, dim=0)[..., None]
    torch.testing.assert_close(combined.float(), (weights * out_partial).sum(0), rtol=1e-2, atol=1e-2)
