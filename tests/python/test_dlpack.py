"""Any DLPack producer works: a minimal object with __dlpack__ / __dlpack_device__ (no numpy or
torch type visible to kvflash), on the CPU and, where torch and kvflash's CUDA backend exist, on
the GPU."""

import numpy as np
import pytest

import kvflash
from kvflash import flash_attn_interface as fai

from reference import reference_kvcache


class Producer:
    """Exports another array through DLPack only."""

    def __init__(self, array):
        self.array = array
        self.shape = tuple(array.shape)

    def __dlpack__(self, *args, **kwargs):
        return self.array.__dlpack__(*args, **kwargs)

    def __dlpack_device__(self):
        return self.array.__dlpack_device__()


def inputs(rng):
    return dict(q=rng.standard_normal((2, 1, 4, 32)).astype(np.float32),
                k_cache=rng.standard_normal((2, 16, 2, 32)).astype(np.float32),
                v_cache=rng.standard_normal((2, 16, 2, 32)).astype(np.float32),
                k=rng.standard_normal((2, 1, 2, 32)).astype(np.float32),
                v=rng.standard_normal((2, 1, 2, 32)).astype(np.float32),
                cache_seqlens=np.array([3, 15], dtype=np.int32))


def test_cpu_producer_is_read_written_in_place_and_gets_numpy_outputs():
    kw = inputs(np.random.default_rng(0))
    want_out, _, want_k, _ = reference_kvcache(**{n: (v.copy() if isinstance(v, np.ndarray) else v)
                                                   for n, v in kw.items()}, causal=True)
    wrapped = {n: Producer(v) for n, v in kw.items()}
    out = fai.flash_attn_with_kvcache(**wrapped, causal=True)
    assert isinstance(out, np.ndarray)
    np.testing.assert_allclose(out, want_out, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(kw["k_cache"], want_k, rtol=1e-4, atol=1e-4)  # written through DLPack


def test_gpu_producer_with_caller_output():
    torch = pytest.importorskip("torch")
    if not (torch.cuda.is_available() and "cuda" in kvflash.build_backends()):
        pytest.skip("needs a GPU and kvflash's CUDA backend")
    kw = inputs(np.random.default_rng(1))
    want_out, _, want_k, _ = reference_kvcache(**{n: (v.copy() if isinstance(v, np.ndarray) else v)
                                                   for n, v in kw.items()}, causal=True)
    on_gpu = {n: torch.from_numpy(v).cuda() for n, v in kw.items()}
    for name in ("q", "k_cache", "v_cache", "k", "v"):
        on_gpu[name] = on_gpu[name].to(torch.bfloat16)
    on_gpu["q"] = torch.nn.functional.pad(on_gpu["q"], (0, 96))  # head dim 128 (every CUDA build)
    for name in ("k_cache", "v_cache", "k", "v"):
        on_gpu[name] = torch.nn.functional.pad(on_gpu[name], (0, 96))
    out = torch.empty_like(on_gpu["q"])
    with pytest.raises(TypeError, match="pass out="):
        fai.flash_attn_with_kvcache(**{n: Producer(v) for n, v in on_gpu.items()}, causal=True,
                                    softmax_scale=32 ** -0.5)
    fai.flash_attn_with_kvcache(**{n: Producer(v) for n, v in on_gpu.items()}, causal=True,
                                softmax_scale=32 ** -0.5, out=Producer(out))
    torch.cuda.synchronize()
    np.testing.assert_allclose(out[..., :32].float().cpu().numpy(), want_out, rtol=3e-2, atol=3e-2)
    np.testing.assert_allclose(on_gpu["k_cache"][..., :32].float().cpu().numpy(), want_k, rtol=3e-2, atol=3e-2)
