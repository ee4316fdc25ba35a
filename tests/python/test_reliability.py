"""Issue 18 through the Python API (numpy on the CPU): the findings of the malformed-call survey,
each now refused with a clear error that leaves the caches alone, or given its documented meaning."""

import numpy as np
import pytest

from kvflash import flash_attn_interface as fai

F32 = np.float32


def rand(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(F32)


def decode_call(**change):
    kw = dict(q=rand(2, 1, 4, 32, seed=1), k_cache=rand(2, 16, 2, 32, seed=2),
              v_cache=rand(2, 16, 2, 32, seed=3), cache_seqlens=np.array([3, 9], np.int32))
    kw.update(change)
    return kw


def test_k_cache_is_v_cache_with_append_is_refused_and_writes_nothing():
    kw = decode_call(k=rand(2, 1, 2, 32, seed=4), v=rand(2, 1, 2, 32, seed=5))
    kw["v_cache"] = kw["k_cache"]
    before = kw["k_cache"].copy()
    with pytest.raises(ValueError, match="k_cache and v_cache overlap in memory"):
        fai.flash_attn_with_kvcache(**kw)
    assert np.array_equal(kw["k_cache"], before)


def test_new_k_from_rows_of_the_cache_is_refused():
    kw = decode_call(v=rand(2, 1, 2, 32, seed=5))
    kw["k"] = kw["k_cache"][:, 10:11]
    with pytest.raises(ValueError, match="k_cache and k overlap in memory"):
        fai.flash_attn_with_kvcache(**kw)


def test_interleaved_kv_views_of_one_buffer_append_as_separate_caches():
    kv = rand(2, 2, 16, 2, 32, seed=6)
    new_k, new_v = rand(2, 1, 2, 32, seed=7), rand(2, 1, 2, 32, seed=8)
    separate = decode_call(k_cache=kv[:, 0].copy(), v_cache=kv[:, 1].copy(), k=new_k, v=new_v)
    views = decode_call(k_cache=kv[:, 0], v_cache=kv[:, 1], k=new_k, v=new_v)
    assert np.array_equal(fai.flash_attn_with_kvcache(**views), fai.flash_attn_with_kvcache(**separate))
    assert np.array_equal(kv[:, 0], separate["k_cache"]) and np.array_equal(kv[:, 1], separate["v_cache"])


def test_softcap_inf_is_no_softcap():
    kw = decode_call()
    assert np.array_equal(fai.flash_attn_with_kvcache(**kw, softcap=float("inf")),
                          fai.flash_attn_with_kvcache(**kw, softcap=0.0))


def test_get_scheduler_metadata_refuses_sizes_the_call_would():
    with pytest.raises(ValueError, match="headdim must be <= 256"):
        fai.get_scheduler_metadata(2, 1, 64, 4, 2, 100000, np.array([3, 9], np.int32), qkv_dtype="float32")
    with pytest.raises(ValueError, match="batch_size must be <= 1048576"):
        fai.get_scheduler_metadata(1 << 30, 1, 64, 4, 2, 32, None, qkv_dtype="float32")


def test_batch_of_2_to_30_stride_0_views_is_refused_before_allocating():
    batch = 1 << 30
    q = np.broadcast_to(rand(1, 1, 4, 32), (batch, 1, 4, 32))
    cache = np.broadcast_to(rand(1, 16, 2, 32), (batch, 16, 2, 32))
    with pytest.raises(ValueError, match="batch_size 1073741824 exceeds kvflash's limit"):
        fai.flash_attn_with_kvcache(q, cache, cache, cache_seqlens=3)


def varlen(cu_k, seqused_k=None):
    q = rand(4, 2, 32, seed=9)
    k = rand(10, 1, 32, seed=10)
    cu_q = np.array([0, 2, 4], np.int32)
    return fai.flash_attn_varlen_func(q, k, k, cu_q, np.array(cu_k, np.int32), 2, 8,
                                      seqused_k=None if seqused_k is None else np.array(seqused_k, np.int32))


@pytest.mark.parametrize("cu_k, seqused_k, message", [
    ([0, 4, 12], None, r"cu_seqlens_k\[2\] = 12 exceeds the 10 rows of k"),
    ([0, 6, 4], None, r"cu_seqlens_k\[2\] = 4 is less than cu_seqlens_k\[1\] = 6"),
    ([1, 4, 10], None, r"cu_seqlens_k\[0\] must be 0"),
    ([0, 4, 10], [5, 6], r"seqused_k\[0\] = 5 is out of range \[0, 4\]"),
    ([0, 4, 10], [4, -1], r"seqused_k\[1\] = -1 is out of range \[0, 6\]"),
])
def test_varlen_keys_must_lie_inside_k(cu_k, seqused_k, message):
    with pytest.raises(ValueError, match=message):
        varlen(cu_k, seqused_k)


def test_varlen_keys_inside_k_run():
    assert np.isfinite(varlen([0, 4, 10], [4, 3])).all()
    assert np.isfinite(varlen([0, 4, 9])).all()  # rows past the last entry are simply unused


def batch_of(sequences):
    """A decode batch of (length, seed) sequences over one capacity: q, caches, lengths."""
    q = np.stack([rand(1, 4, 32, seed=s) for _, s in sequences])
    cache = np.stack([rand(2, 4096, 2, 32, seed=100 + s) for _, s in sequences], axis=1)
    lengths = np.array([n for n, _ in sequences], np.int32)
    return q, cache[0], cache[1], lengths


def test_batch_invariant_mode_keeps_a_sequences_bits():
    mine = (3001, 7)
    results = []
    for sequences, at in [([mine], 0), ([mine, (4096, 1), (5, 2)], 0), ([(17, 3), (2500, 4), mine], 2)]:
        q, k_cache, v_cache, lengths = batch_of(sequences)
        out, lse, *_ = fai.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=lengths,
                                                   return_softmax_lse=True, batch_invariant=True)
        results.append((out[at].tobytes(), lse[at].tobytes()))
    assert results[1] == results[0] and results[2] == results[0]


def test_batch_invariant_is_part_of_the_plan():
    q, k_cache, v_cache, lengths = batch_of([(30, 1), (40, 2)])
    plan = fai.get_scheduler_metadata(2, 1, 4096, 4, 2, 32, lengths, qkv_dtype="float32")
    with pytest.raises(ValueError, match=r"batch_invariant \(plan made for false, call has true\)"):
        fai.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=lengths,
                                    scheduler_metadata=plan, batch_invariant=True)


def test_scheduling_backend_from_threads_gives_serial_results():
    import threading

    import kvflash

    calls = [decode_call(cache_seqlens=np.array([3 + t, 16 - t], np.int32)) for t in range(4)]
    serial = [fai.flash_attn_with_kvcache(**kw) for kw in calls]
    backend = kvflash.SchedulingBackend()
    mismatches = []

    def worker(t):
        for _ in range(20):
            with backend.batch():
                for _layer in range(3):
                    if not np.array_equal(fai.flash_attn_with_kvcache(**calls[t]), serial[t]):
                        mismatches.append(t)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert mismatches == []


def test_batch_invariant_under_torch_compile_is_not_yet_supported():
    torch = pytest.importorskip("torch")
    from kvflash import _call, _torch_ops

    q = torch.zeros((1, 1, 4, 32))
    call = _call.make(q=q, k_cache=q, v_cache=q, batch_invariant=True)
    with pytest.raises(NotImplementedError, match="batch_invariant=True is not supported under torch.compile"):
        _torch_ops.traced_kvcache(call, False, None)
