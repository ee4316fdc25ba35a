"""Every rejected call reaches Python as the natural exception, with the C++ message intact
(kvflash::Error kinds: invalid_value -> ValueError, invalid_type -> TypeError, unsupported ->
NotImplementedError, device_failure -> RuntimeError), and FA3's Python-level errors."""

import re
import subprocess
import sys

import numpy as np
import pytest

from kvflash import flash_attn_interface as fai

try:
    import ml_dtypes
except ImportError:  # pragma: no cover
    ml_dtypes = None

F32 = np.float32


def base(**change):
    rng = np.random.default_rng(0)
    kw = dict(q=rng.standard_normal((2, 1, 4, 32)).astype(F32),
              k_cache=rng.standard_normal((2, 16, 2, 32)).astype(F32),
              v_cache=rng.standard_normal((2, 16, 2, 32)).astype(F32),
              cache_seqlens=np.array([3, 16], dtype=np.int32))
    kw.update(change)
    return kw


def new_kv(s=1, d=32):
    return np.ones((2, s, 2, d), F32)


# (id, keyword changes, exception type, the start of the message: upstream's wording where it exists)
CASES = [
    ("dtype q/k", dict(k_cache=np.ones((2, 16, 2, 32), np.float16)), TypeError,
     "query and key must have the same dtype"),
    ("dtype q/v", dict(v_cache=np.ones((2, 16, 2, 32), np.float16)), TypeError,
     "query and value must have the same dtype"),
    ("int64 lengths", dict(cache_seqlens=np.array([3, 16], np.int64)), TypeError,
     "cache_seqlens has dtype int64"),
    ("lengths shape", dict(cache_seqlens=np.array([3, 16, 1], np.int32)), ValueError,
     "cache_seqlens must have shape"),
    ("page_table dtype", dict(page_table=np.zeros((2, 4), np.float32),
                              k_cache=np.ones((8, 4, 2, 32), F32), v_cache=np.ones((8, 4, 2, 32), F32)),
     TypeError, "page_table must have dtype torch.int32"),
    ("cu_seqlens_q without max", dict(q=np.ones((2, 4, 32), F32), cu_seqlens_q=np.array([0, 1, 2], np.int32)),
     ValueError, "max_seqlen_q must be provided if cu_seqlens_q is provided"),
    ("heads", dict(q=np.ones((2, 1, 3, 32), F32)), ValueError,
     "Number of heads in key/value must divide number of heads in query"),
    ("head dim", dict(q=np.ones((2, 1, 4, 264), F32), k_cache=np.ones((2, 16, 2, 264), F32),
                      v_cache=np.ones((2, 16, 2, 264), F32)), ValueError,
     "FlashAttention forward only supports head dimension at most 256"),
    ("batch", dict(k_cache=np.ones((3, 16, 2, 32), F32), v_cache=np.ones((3, 16, 2, 32), F32)),
     ValueError, "batch_size must be equal to batch_size_k"),
    ("k without v", dict(k=new_kv()), ValueError, "If k_new is supplied, v_new must also be passed in"),
    ("rotary without k", dict(rotary_cos=np.ones((32, 8), F32), rotary_sin=np.ones((32, 8), F32)),
     ValueError, "If rotary cos/sin are provided, new key / value to be appended to KV cache must also be provided"),
    ("rotary dim", dict(k=new_kv(), v=new_kv(), rotary_cos=np.ones((32, 4), F32), rotary_sin=np.ones((32, 4), F32)),
     ValueError, "Only rotary dimensions divisible by 16 are currently supported"),
    ("num_splits", dict(num_splits=300), ValueError, "num_splits > 256 not supported"),
    ("q last dim", dict(q=np.ones((2, 1, 4, 64), F32)[..., ::2]), ValueError,
     "q must have contiguous last dimension"),
    ("only_qv without qv", dict(only_qv=True), ValueError, "only_qv=True requires qv"),
    ("sinks dtype", dict(sinks=np.ones(4, np.float16)), TypeError, "sinks must have dtype float32 or bfloat16"),
    ("sinks shape", dict(sinks=np.ones(3, F32)), ValueError, "sinks must have shape"),
    ("window", dict(window_size=(-2, 0)), ValueError, "window_size[0] must be >= -1"),
    ("not a tensor", dict(q=[[1.0]]), TypeError, "q must be a tensor"),
    ("window type", dict(window_size=3), TypeError, "window_size must be a pair"),
    ("read-only cache", dict(k=new_kv(), v=new_kv()), ValueError, "k_cache must be writable"),
    ("ver", dict(ver=4), ValueError, "Only ver=3 is supported by kvflash"),
    ("score_mod", dict(score_mod=lambda s: s), NotImplementedError, "score_mod is not supported by kvflash"),
    ("aux_tensors", dict(aux_tensors=[np.ones(1)]), NotImplementedError, "aux_tensors is not supported by kvflash"),
    ("k_cache last dim", dict(k_cache=np.ones((2, 16, 2, 64), F32)[..., ::2]), AssertionError,
     "k_cache must have contiguous last dimension"),
    ("v_cache last dim", dict(v_cache=np.ones((2, 16, 2, 64), F32)[..., ::2]), AssertionError,
     "v_cache must have contiguous last dimension"),
]


@pytest.mark.parametrize("change, error, message", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_error_type_and_message(change, error, message):
    kw = base(**change)
    if "read-only" in message or "writable" in message:
        kw["k_cache"].setflags(write=False)
    with pytest.raises(error) as info:
        fai.flash_attn_with_kvcache(**kw)
    # The message starts with the library's own words: nothing prepended, nothing lost.
    assert re.match(re.escape(message), str(info.value)), str(info.value)


def test_error_names_the_argument_and_both_values():
    with pytest.raises(ValueError) as info:
        fai.flash_attn_with_kvcache(**base(cache_seqlens=np.array([3, 16, 1], np.int32)))
    text = str(info.value)
    assert "cache_seqlens" in text and "(2,)" in text and "(3,)" in text


def test_scheduler_metadata_for_another_problem_names_the_field():
    kw = base()
    metadata = fai.get_scheduler_metadata(2, 1, 16, 4, 2, 32, kw["cache_seqlens"], qkv_dtype="float32")
    with pytest.raises(ValueError, match="window_left"):
        fai.flash_attn_with_kvcache(**kw, scheduler_metadata=metadata, window_size=(4, 0))


def test_foreign_scheduler_metadata_is_checked_for_length():
    kw = base()
    metadata = fai.get_scheduler_metadata(2, 1, 16, 4, 2, 32, kw["cache_seqlens"], qkv_dtype="float32")
    foreign = np.concatenate([metadata, np.zeros(4, np.int32)])  # not made by kvflash: FA3's check
    with pytest.raises(ValueError, match="^scheduler_metadata must have shape"):
        fai.flash_attn_with_kvcache(**kw, scheduler_metadata=foreign)


def test_get_scheduler_metadata_errors():
    lengths = np.array([3, 16], np.int32)
    with pytest.raises(ValueError, match="^Number of heads in key/value must divide number of heads in query"):
        fai.get_scheduler_metadata(2, 1, 16, 3, 2, 32, lengths)
    with pytest.raises(TypeError, match="^qkv_dtype"):
        fai.get_scheduler_metadata(2, 1, 16, 4, 2, 32, lengths, qkv_dtype="int8")


def test_combine_errors():
    with pytest.raises(ValueError, match="^FlashAttention combine only supports num_splits at most 256"):
        fai.flash_attn_combine(np.zeros((257, 1, 1, 1, 8), F32), np.zeros((257, 1, 1, 1), F32))
    with pytest.raises(TypeError, match="^out_partial must have dtype float32"):
        fai.flash_attn_combine(np.zeros((2, 1, 1, 1, 8), np.float16), np.zeros((2, 1, 1, 1), F32),
                               out=np.zeros((1, 1, 1, 8), F32))


def test_varlen_errors():
    q = np.ones((4, 2, 32), F32)
    cu = np.array([0, 2, 4], np.int32)
    with pytest.raises(ValueError, match="^max_seqlen_q and max_seqlen_k are required for FA3"):
        fai.flash_attn_varlen_func(q, q, q, cu, cu, None, None)
    with pytest.raises(ValueError, match=r"^seqused_q\[1\] is 3, expected a value in \[0, 2\]"):
        fai.flash_attn_varlen_func(q, q, q, cu, cu, 2, 2, seqused_q=np.array([1, 3], np.int32))
    with pytest.raises(ValueError, match="^flash_attn_varlen_func needs seqused_k or cu_seqlens_k"):
        fai.flash_attn_varlen_func(q, q[None], q[None], cu, None, 2, None,
                                   page_table=np.zeros((2, 1), np.int32))


@pytest.mark.skipif(ml_dtypes is None, reason="needs ml_dtypes")
def test_fp8_on_the_cpu_is_reported_not_crashed():
    e4m3 = ml_dtypes.float8_e4m3fn
    kw = base(q=np.ones((2, 1, 4, 32), e4m3), k_cache=np.ones((2, 16, 2, 32), e4m3),
              v_cache=np.ones((2, 16, 2, 32), e4m3))
    try:
        out = fai.flash_attn_with_kvcache(**kw)
    except (NotImplementedError, TypeError, ValueError) as error:
        assert str(error)  # a clear refusal is fine; a crash is not
    else:
        assert out.dtype == ml_dtypes.bfloat16  # FA3: fp8 input gives a bf16 output


def test_numpy_bfloat16_without_ml_dtypes_is_named(monkeypatch):
    from kvflash import _frameworks

    monkeypatch.setitem(sys.modules, "ml_dtypes", None)  # `import ml_dtypes` now raises ImportError
    with pytest.raises(TypeError, match=r"^a bfloat16 numpy array needs the ml_dtypes package"):
        _frameworks.numpy_dtype(_frameworks.BF16)
    assert _frameworks.numpy_dtype(_frameworks.F16) == np.float16


def test_import_does_not_load_ml_dtypes():
    # Engines pass torch tensors: ml_dtypes (another C extension) loads only for numpy bf16 / fp8.
    code = "import sys, kvflash; assert 'ml_dtypes' not in sys.modules, 'ml_dtypes imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("kind, error", [(0, ValueError), (1, TypeError), (2, NotImplementedError),
                                         (3, RuntimeError)])
def test_every_error_kind_maps_to_its_exception(kind, error):
    from kvflash import _kvflash

    message = "cache_seqlens[1] = 99 is out of range [0, 16] (naming the argument and both values)"
    with pytest.raises(error) as info:
        _kvflash._raise_error(kind, "cache_seqlens", message)
    assert type(info.value) is error and str(info.value) == message


def test_cuda_request_without_the_backend_is_not_implemented():
    import kvflash

    if "cuda" in kvflash.build_backends():
        pytest.skip("built with the CUDA backend")
    from kvflash import _kvflash

    with pytest.raises(NotImplementedError):
        _kvflash.get_scheduler_metadata(2, 1, 16, 4, 2, 32, np.array([3, 16], np.int32), 2, None,
                                        None, None, None, None, 0, False, -1, -1, 0, False, 0, None,
                                        0, False, 2, 0)
