"""The array frameworks and devices the drop-in tests run on: numpy arrays, torch CPU tensors
(where torch is installed) and torch CUDA tensors (where a GPU and kvflash's CUDA backend are).
Tests take a `device` parameter from DEVICES and build their inputs with `Device`."""

import numpy as np
import pytest

import kvflash

try:
    import torch
except ImportError:  # numpy cases still run
    torch = None

HAS_CUDA = torch is not None and torch.cuda.is_available() and "cuda" in kvflash.build_backends()

DEVICES = [
    "numpy",
    pytest.param("cpu", marks=pytest.mark.skipif(torch is None, reason="needs torch")),
    pytest.param("cuda", marks=pytest.mark.skipif(
        not HAS_CUDA, reason="needs a GPU and kvflash's CUDA backend")),
]
TORCH_DEVICES = DEVICES[1:]


class Device:
    """Inputs on one device: float16 on the CPU (numpy, torch), bfloat16 on CUDA (the dtype, with
    head dim 128, of the one attention instantiation of a KVFLASH_CUDA_MINIMAL build)."""

    def __init__(self, name):
        self.name = name
        self.tol = 3e-2 if name == "cuda" else 5e-3

    @property
    def is_torch(self):
        return self.name != "numpy"

    @property
    def float_dtype(self):
        if not self.is_torch:
            return np.float16
        return torch.bfloat16 if self.name == "cuda" else torch.float16

    def __call__(self, array):
        """A numpy array on this device: int arrays as int32, the rest as float_dtype."""
        array = np.asarray(array)
        if array.dtype.kind in "iu":
            array = array.astype(np.int32)
            return torch.from_numpy(array).to(self.name) if self.is_torch else array
        if not self.is_torch:
            return array.astype(np.float16)
        return torch.from_numpy(array.astype(np.float32)).to(self.name, self.float_dtype)

    def randn(self, rng, *shape):
        return self(rng.standard_normal(shape))

    def ints(self, values):
        return self(np.asarray(values, np.int32))


def host(x):
    """A float64 (or int) numpy copy of an array or tensor of any device."""
    if torch is not None and isinstance(x, torch.Tensor):
        x = x.detach().cpu()
        return x.numpy() if x.dtype == torch.int32 else x.double().numpy()
    x = np.asarray(x)
    return x if x.dtype.kind in "iu" else x.astype(np.float64)


def assert_close(got, want, tol):
    np.testing.assert_allclose(host(got), want, rtol=tol, atol=tol)


def assert_same(a, b):
    np.testing.assert_array_equal(host(a), host(b))
