"""The scheduling backend: metadata once per batch per configuration, keyed by the whole
configuration, isolated between backends and threads, never carried over between batches."""

import threading

import numpy as np
import pytest

import kvflash
from kvflash import SchedulingBackend, flash_attn_interface as fai, scheduling
from kvflash import _call, _kvflash

from reference import reference_kvcache

B, H, HK, D, CAPACITY = 3, 4, 2, 32, 64


@pytest.fixture
def seen_metadata(monkeypatch):
    """The scheduler_metadata each call reached the C++ library with."""
    seen = []
    real_fwd = _kvflash.fwd

    def spy(call, *rest):
        seen.append(call[_call.SCHEDULER_METADATA])
        return real_fwd(call, *rest)

    monkeypatch.setattr(fai._ext, "fwd", spy)
    return seen


def make_layers(rng, n):
    return [(rng.standard_normal((B, CAPACITY, HK, D)).astype(np.float32),
             rng.standard_normal((B, CAPACITY, HK, D)).astype(np.float32)) for _ in range(n)]


def decode(q, layer, seqlens, **kw):
    return fai.flash_attn_with_kvcache(q, layer[0], layer[1], cache_seqlens=seqlens, causal=True, **kw)


@pytest.fixture
def batch_inputs():
    rng = np.random.default_rng(0)
    q = rng.standard_normal((B, 1, H, D)).astype(np.float32)
    seqlens = np.array([5, 40, 64], dtype=np.int32)
    return q, make_layers(rng, 8), seqlens


def test_one_computation_per_batch_across_layers(batch_inputs, seen_metadata):
    q, layers, seqlens = batch_inputs
    backend = SchedulingBackend()
    expected = [decode(q, layer, seqlens) for layer in layers]
    seen_metadata.clear()
    with backend.batch() as batch:
        results = [decode(q, layer, seqlens) for layer in layers]
    assert batch.computations == 1 and backend.computations == 1
    assert all(isinstance(m, kvflash.Plan) for m in seen_metadata)
    assert all(m is seen_metadata[0] for m in seen_metadata)
    for got, want in zip(results, expected):
        np.testing.assert_array_equal(got, want)


def test_sliding_window_and_full_layers_get_their_own_metadata(batch_inputs, seen_metadata):
    q, layers, seqlens = batch_inputs
    backend = SchedulingBackend()
    with backend.batch() as batch:
        for i, layer in enumerate(layers):
            window = (7, 0) if i % 2 else (-1, -1)
            decode(q, layer, seqlens, window_size=window)
    assert batch.computations == 2
    for i, plan in enumerate(seen_metadata):
        assert plan.key.window_left == (7 if i % 2 else -1)


@pytest.mark.parametrize("change", [
    dict(causal=False), dict(window_size=(3, 0)), dict(attention_chunk=8), dict(softcap=10.0),
    dict(num_splits=1), dict(pack_gqa=True), dict(sm_margin=2),
])
def test_every_plan_field_separates_configurations(batch_inputs, change, seen_metadata):
    q, layers, seqlens = batch_inputs
    with SchedulingBackend().batch() as batch:
        decode(q, layers[0], seqlens)
        fai.flash_attn_with_kvcache(q, layers[1][0], layers[1][1], cache_seqlens=seqlens,
                                    **{"causal": True, **change})
    assert batch.computations == 2
    assert seen_metadata[0] is not seen_metadata[1]


def test_shapes_dtype_and_lengths_separate_configurations():
    rng = np.random.default_rng(1)
    q = rng.standard_normal((B, 1, H, D)).astype(np.float32)
    layer = make_layers(rng, 1)[0]
    lengths = np.array([5, 40, 64], dtype=np.int32)
    base = _call.make(q=q, k_cache=layer[0], v_cache=layer[1], cache_seqlens=lengths, causal=True)
    key = scheduling.configuration_key(base)

    def changed(position, value):
        call = list(base)
        call[position] = value
        return scheduling.configuration_key(tuple(call))

    assert changed(_call.Q, q[:, :, :2].copy()) != key                      # heads
    assert changed(_call.Q, q.astype(np.float16)) != key                    # dtype
    assert changed(_call.V_CACHE, layer[1][..., :16].copy()) != key          # head dim v
    assert changed(_call.K_CACHE, layer[0][:, :32].copy()) != key            # capacity
    assert changed(_call.CACHE_SEQLENS, lengths.copy()) != key              # other lengths
    assert changed(_call.CACHE_LEFTPAD, np.zeros(B, np.int32)) != key       # leftpad
    assert changed(_call.PAGE_TABLE, np.zeros((B, 4), np.int32)) != key    # paged
    assert changed(_call.MAX_SEQLEN_Q, 4) != key                            # varlen q
    assert changed(_call.K, np.zeros((B, 1, HK, D), np.float32)) != key     # appended keys
    assert changed(_call.QV, np.zeros((B, 1, H, D), np.float32)) != key     # qv
    assert changed(_call.SINKS, np.zeros(H, np.float32)) == key             # not in the plan


def test_metadata_of_a_previous_batch_is_never_used(batch_inputs, seen_metadata):
    q, layers, seqlens = batch_inputs
    backend = SchedulingBackend()
    with backend.batch() as first:
        decode(q, layers[0], seqlens)
    seqlens[:] = [64, 1, 2]  # the engine refills its length buffer in place
    with backend.batch() as second:
        decode(q, layers[0], seqlens)
    assert second.generation != first.generation
    assert first.closed and first.computations == 1 and second.computations == 1
    assert seen_metadata[0] is not seen_metadata[1]
    fresh = fai._ext.make_plan(_call.make(q=q, k_cache=layers[0][0], v_cache=layers[0][1],
                                          cache_seqlens=seqlens, causal=True))
    assert seen_metadata[1].to_fa3() == fresh.to_fa3()
    # Outside any batch nothing is injected.
    decode(q, layers[0], seqlens)
    assert seen_metadata[2] is None


def test_two_backends_do_not_interfere(batch_inputs):
    q, layers, seqlens = batch_inputs
    a = SchedulingBackend()
    with a.batch() as batch_a:
        b = SchedulingBackend()  # constructed later: must not take over a's calls
        decode(q, layers[0], seqlens)
        with b.batch() as batch_b:  # nested: the inner batch is the active one
            decode(q, layers[1], seqlens)
            decode(q, layers[2], seqlens)
        decode(q, layers[3], seqlens)
        assert scheduling.active_batch() is batch_a
    assert scheduling.active_batch() is None
    assert (a.computations, b.computations) == (1, 1)
    assert (batch_a.computations, batch_b.computations) == (1, 1)


def test_threads_have_their_own_batches(batch_inputs):
    q, layers, seqlens = batch_inputs
    backends = [SchedulingBackend(), SchedulingBackend()]
    barrier = threading.Barrier(2)
    results, errors = {}, []

    def worker(index):
        try:
            lengths = seqlens.copy() if index else seqlens
            with backends[index].batch() as batch:
                barrier.wait()
                for layer in layers:
                    decode(q, layer, lengths)
                barrier.wait()
                results[index] = (batch.computations, scheduling.active_batch() is batch)
        except Exception as error:  # pragma: no cover - reported below
            errors.append(error)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert results == {0: (1, True), 1: (1, True)}
    assert [b.computations for b in backends] == [1, 1]


def test_a_thread_started_inside_a_batch_does_not_inherit_it(batch_inputs, seen_metadata):
    q, layers, seqlens = batch_inputs
    with SchedulingBackend().batch():
        t = threading.Thread(target=decode, args=(q, layers[0], seqlens))
        t.start()
        t.join()
    assert seen_metadata == [None]


def test_many_threads_in_one_batch_compute_once(batch_inputs):
    import contextvars

    q, layers, seqlens = batch_inputs
    backend = SchedulingBackend()
    with backend.batch() as batch:
        context = contextvars.copy_context()
        threads = [threading.Thread(target=context.copy().run, args=(decode, q, layer, seqlens))
                   for layer in layers]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert batch.computations == 1


def test_begin_end(batch_inputs, seen_metadata):
    q, layers, seqlens = batch_inputs
    backend = SchedulingBackend()
    batch = backend.begin()
    decode(q, layers[0], seqlens)
    decode(q, layers[1], seqlens)
    batch.end()
    decode(q, layers[2], seqlens)
    assert batch.computations == 1
    assert batch.closed and seen_metadata[2] is None


def test_explicit_metadata_wins_over_the_batch(batch_inputs, seen_metadata):
    q, layers, seqlens = batch_inputs
    metadata = fai.get_scheduler_metadata(B, 1, CAPACITY, H, HK, D, seqlens, qkv_dtype="float32",
                                          causal=True)
    with SchedulingBackend().batch() as batch:
        decode(q, layers[0], seqlens, scheduler_metadata=metadata)
    assert batch.computations == 0
    assert isinstance(seen_metadata[0], kvflash.Plan)  # the typed plan behind the tensor


def test_cuda_graph_mode_refills_fixed_buffers_in_place(batch_inputs, seen_metadata):
    q, layers, seqlens = batch_inputs
    backend = SchedulingBackend(cuda_graph=True, max_batch_size=8)
    with backend.batch(graph="bs3") as batch:  # "capture"
        captured = [decode(q, layer, seqlens) for layer in layers[:4]]
    assert batch.computations == 1
    (buffer,) = backend.graph_buffers("bs3")
    assert len(buffer) == 1 + 4 * 8  # capacity for max_batch_size sequences
    used = seen_metadata[0]
    assert np.shares_memory(used, buffer)
    np.testing.assert_array_equal(captured[0], decode(q, layers[0], seqlens))

    seqlens[:] = [64, 3, 9]  # new lengths for the replay, written in place
    assert backend.refill("bs3") == 1
    call = _call.make(q=q, k_cache=layers[0][0], v_cache=layers[0][1], cache_seqlens=seqlens,
                      causal=True)
    expected = fai._ext.make_plan(call).to_fa3()
    np.testing.assert_array_equal(buffer[: len(expected)], expected)
    # A replayed call reads the refilled buffer, and the results follow the new lengths.
    out = fai.flash_attn_with_kvcache(q, layers[0][0], layers[0][1], cache_seqlens=seqlens,
                                      causal=True, scheduler_metadata=used)
    want, *_ = reference_kvcache(q, layers[0][0], layers[0][1], cache_seqlens=seqlens, causal=True)
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4)
    # The next batch of the same graph fills the same buffer.
    with backend.batch(graph="bs3"):
        decode(q, layers[1], seqlens)
    assert backend.graph_buffers("bs3")[0] is buffer


def test_a_plan_names_the_kernels_that_run_it(batch_inputs):
    q, layers, seqlens = batch_inputs
    plan = fai._ext.make_plan(_call.make(q=q, k_cache=layers[0][0], v_cache=layers[0][1],
                                         cache_seqlens=seqlens, causal=True))
    # numpy inputs run on the CPU backend: no GPU kernel family, no instantiation.
    assert (plan.kernel.family, plan.kernel.shape) == ("cpu", "none")
    assert (plan.kernel.headdim, plan.kernel.headdim_v) == (0, 0)
    assert "cpu" in repr(plan.kernel)
