"""What kvflash needs from the caller's array framework: output allocation, the current stream,
and a few stride / dtype questions. torch, numpy and CuPy are known by name; nothing here
imports torch, CuPy or ml_dtypes unless the caller's tensors need them."""

import sys

import numpy as np

# kvflash::DType codes (include/kvflash/tensor.h), in enum order.
F32, F16, BF16, E4M3, I32, F64 = range(6)
DTYPE_NAMES = ("float32", "float16", "bfloat16", "float8_e4m3fn", "int32", "float64")


def torch_module():
    """torch, if the caller has imported it (kvflash never imports it for numpy callers)."""
    return sys.modules.get("torch")


def is_torch(t):
    torch = torch_module()
    return torch is not None and isinstance(t, torch.Tensor)


def _ml_dtypes():
    """ml_dtypes (numpy's bfloat16 / float8 types), imported on first need: a process that passes
    torch tensors never loads it (one less extension in engines' processes, and import time)."""
    try:
        import ml_dtypes
    except ImportError:
        return None
    return ml_dtypes


def numpy_dtype(code):
    if code in (BF16, E4M3):
        ml_dtypes = _ml_dtypes()
        if ml_dtypes is None:
            raise TypeError(
                f"a {DTYPE_NAMES[code]} numpy array needs the ml_dtypes package (pip install ml_dtypes)"
            )
        return np.dtype(ml_dtypes.bfloat16 if code == BF16 else ml_dtypes.float8_e4m3fn)
    return np.dtype(DTYPE_NAMES[code])


def torch_dtype(code):
    return getattr(torch_module(), DTYPE_NAMES[code])


def dtype_code(dtype):
    """kvflash's code for a dtype given as a torch dtype, a numpy dtype (or scalar type, such as
    np.float16 or ml_dtypes.bfloat16) or a name."""
    name = str(dtype).replace("torch.", "")
    if isinstance(dtype, type):  # numpy scalar types print as "<class 'numpy.float16'>"
        try:
            name = np.dtype(dtype).name
        except TypeError:
            pass
    aliases = {"float16": F16, "half": F16, "bfloat16": BF16, "float8_e4m3fn": E4M3,
               "float32": F32, "float": F32, "int32": I32, "float64": F64}
    if name in aliases:
        return aliases[name]
    raise TypeError(f"qkv_dtype {dtype!r} is not a dtype kvflash takes "
                    "(float16, bfloat16, float8_e4m3fn)")


def allocate(like, shape, code):
    """An uninitialised output of `shape` and kvflash dtype `code`, made by `like`'s framework
    on `like`'s device (torch's caching allocator for torch, numpy for numpy)."""
    torch = torch_module()
    if torch is not None and isinstance(like, torch.Tensor):
        return torch.empty(shape, dtype=torch_dtype(code), device=like.device)
    if isinstance(like, np.ndarray):
        return np.empty(shape, dtype=numpy_dtype(code))
    if type(like).__module__.split(".")[0] == "cupy":
        import cupy

        with cupy.cuda.Device(like.device.id):
            return cupy.empty(shape, dtype=numpy_dtype(code))
    device = getattr(like, "__dlpack_device__", lambda: None)()
    if device is not None and device[0] == 1:  # kDLCPU: numpy owns host outputs
        return np.empty(shape, dtype=numpy_dtype(code))
    raise TypeError(f"kvflash cannot allocate outputs for {type(like).__name__} tensors on "
                    f"device {device}; pass out= (and use a framework kvflash knows: torch, numpy, CuPy)")


def current_stream(like):
    """The stream the caller's framework is working on, as an integer handle (0 on the CPU)."""
    torch = torch_module()
    if torch is not None and isinstance(like, torch.Tensor):
        if not like.is_cuda:
            return 0
        get_raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        if get_raw is not None:
            return get_raw(like.get_device())
        return torch.cuda.current_stream(like.device).cuda_stream
    if type(like).__module__.split(".")[0] == "cupy":
        import cupy

        return cupy.cuda.get_current_stream().ptr
    return 0


def last_dim_contiguous(t):
    """stride(-1) == 1 in elements (FA3's k_cache / v_cache assertion); unknown frameworks pass
    and the C++ checks decide."""
    if t is None or len(t.shape) == 0:
        return True
    if t.shape[-1] <= 1:
        return True
    if is_torch(t):
        return t.stride(-1) == 1
    if isinstance(t, np.ndarray):
        return t.strides[-1] == t.itemsize
    return True


def make_contiguous_last_dim(t):
    """FA3's maybe_contiguous: a copy only when the last dimension is strided."""
    if t is None or last_dim_contiguous(t):
        return t
    if is_torch(t):
        return t.contiguous()
    if isinstance(t, np.ndarray):
        return np.ascontiguousarray(t)
    return t


def int32_tensor(values, like):
    """An int32 tensor of `values` in `like`'s framework and on its device."""
    torch = torch_module()
    if torch is not None and isinstance(like, torch.Tensor):
        return torch.tensor(values, dtype=torch.int32).to(like.device, non_blocking=True)
    if type(like).__module__.split(".")[0] == "cupy":
        import cupy

        with cupy.cuda.Device(like.device.id):
            return cupy.asarray(np.asarray(values, dtype=np.int32))
    return np.asarray(values, dtype=np.int32)


def copy_into(dst, values):
    """Overwrites the first len(values) entries of the int32 tensor `dst` in place."""
    n = len(values)
    if is_torch(dst):
        torch = torch_module()
        dst[:n].copy_(torch.tensor(values, dtype=torch.int32), non_blocking=False)
    else:
        dst[:n] = np.asarray(values, dtype=np.int32)


def device_of(t):
    """(kvflash DeviceType code, device index): (1, 0) for the CPU, (2, i) for CUDA device i."""
    if t is None:
        return (1, 0)
    if is_torch(t):
        return (2, t.get_device()) if t.is_cuda else (1, 0)
    if isinstance(t, np.ndarray):
        return (1, 0)
    device = getattr(t, "__dlpack_device__", None)
    if device is not None:
        kind, index = device()
        return (int(kind), int(index))
    return (1, 0)


def is_capturing(like):
    """True while the caller's CUDA stream is being captured into a graph."""
    torch = torch_module()
    if torch is not None and isinstance(like, torch.Tensor) and like.is_cuda:
        return torch.cuda.is_current_stream_capturing()
    return False


def on_host(t):
    """A host copy of a device tensor (torch / CuPy), or t itself when it is host memory."""
    if t is None:
        return None
    if is_torch(t):
        return t.cpu() if t.is_cuda else t
    if type(t).__module__.split(".")[0] == "cupy":
        return t.get()
    return t


def wants_grad(*tensors):
    """True when torch autograd would want a backward pass through these tensors."""
    torch = torch_module()
    if torch is None or not torch.is_grad_enabled():
        return False
    return any(t is not None and is_torch(t) and t.requires_grad for t in tensors)
