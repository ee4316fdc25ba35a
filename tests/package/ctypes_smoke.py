"""The C ABI through ctypes from an installed libkvflash.so (tests/package/run.sh runs it):
version query, one CPU call (four equal keys: out is the mean of the value rows), one refused
call with its message.

    python3 ctypes_smoke.py PREFIX/lib/libkvflash.so EXPECTED_VERSION
"""
import ctypes
import sys

MAX_RANK = 6
FLOAT32, CPU = 0, 1


class Tensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("dtype", ctypes.c_int32), ("device_type", ctypes.c_int32),
                ("device_id", ctypes.c_int32), ("rank", ctypes.c_int32),
                ("shape", ctypes.c_int64 * MAX_RANK), ("strides", ctypes.c_int64 * MAX_RANK)]


_T = ctypes.POINTER(Tensor)
_I, _F = ctypes.c_int32, ctypes.c_float


class Args(ctypes.Structure):  # c_api.h's kvflash_args, field for field
    _fields_ = [("q", _T), ("k_cache", _T), ("v_cache", _T), ("k", _T), ("v", _T), ("qv", _T),
                ("rotary_cos", _T), ("rotary_sin", _T), ("cache_seqlens", _T),
                ("has_cache_seqlens_value", _I), ("cache_seqlens_value", _I), ("cache_batch_idx", _T),
                ("cache_leftpad", _T), ("page_table", _T), ("cu_seqlens_q", _T), ("cu_seqlens_k_new", _T),
                ("max_seqlen_q", _I), ("rotary_seqlens", _T), ("q_descale", _T), ("k_descale", _T),
                ("v_descale", _T), ("has_softmax_scale", _I), ("softmax_scale", _F), ("causal", _I),
                ("window_left", _I), ("window_right", _I), ("attention_chunk", _I), ("softcap", _F),
                ("rotary_interleaved", _I), ("scheduler_metadata", _T), ("num_splits", _I),
                ("pack_gqa", _I), ("sm_margin", _I), ("sinks", _T), ("only_qv", _I), ("checked", _I)]


class Outputs(ctypes.Structure):
    _fields_ = [("out", _T), ("softmax_lse", _T), ("out_accum", _T), ("softmax_lse_accum", _T)]


def tensor(values, shape):
    data = (ctypes.c_float * len(values))(*values)
    t = Tensor(ctypes.cast(data, ctypes.c_void_p), FLOAT32, CPU, 0, len(shape))
    stride = 1
    for axis in reversed(range(len(shape))):
        t.shape[axis], t.strides[axis] = shape[axis], stride
        stride *= shape[axis]
    return t, data


def main(library, expected_version):
    lib = ctypes.CDLL(library)
    lib.kvflash_version.restype = ctypes.c_char_p
    version = lib.kvflash_version().decode()
    assert version == expected_version, f"kvflash_version() {version!r}, expected {expected_version!r}"
    lib.kvflash_abi_version.restype = ctypes.c_int
    abi = lib.kvflash_abi_version()
    assert abi == 1, f"kvflash_abi_version() {abi}, this script speaks ABI 1"

    keys, dim = 4, 8
    q, q_data = tensor([0.5] * dim, (1, 1, 1, dim))
    k, k_data = tensor([1.0] * keys * dim, (1, keys, 1, dim))
    v, v_data = tensor([float(i // dim) for i in range(keys * dim)], (1, keys, 1, dim))
    out, out_data = tensor([0.0] * dim, (1, 1, 1, dim))
    args = Args()
    lib.kvflash_args_init(ctypes.byref(args))
    args.q, args.k_cache, args.v_cache = ctypes.pointer(q), ctypes.pointer(k), ctypes.pointer(v)
    outputs = Outputs(out=ctypes.pointer(out))
    message = ctypes.create_string_buffer(512)
    status = lib.kvflash_flash_attn_with_kvcache(ctypes.byref(args), ctypes.byref(outputs), None, message, 512)
    assert status == 0, f"status {status}: {message.value.decode()}"
    assert all(abs(x - 1.5) < 1e-6 for x in out_data), list(out_data)

    args.v_cache = None  # v_cache is always required
    status = lib.kvflash_flash_attn_with_kvcache(ctypes.byref(args), ctypes.byref(outputs), None, message, 512)
    assert status == 1 and b"v_cache" in message.value, (status, message.value)
    print(f"ctypes: {library}: kvflash {version} (C ABI {abi}), call ok, refused call: {message.value.decode()}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
