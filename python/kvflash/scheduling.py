"""The scheduling backend: scheduler metadata computed once per forward batch, for each exact
configuration, and handed to every flash_attn_with_kvcache call of that batch that brings none.

An engine creates one backend and enters it for each forward batch::

    backend = kvflash.SchedulingBackend()
    with backend.batch():                  # or: b = backend.begin(); ...; b.end()
        for layer in layers:
            flash_attn_with_kvcache(...)   # no scheduler_metadata: the batch supplies it

What it fixes in the wrapper it descends from (kvflash spec section 12, items 4-7 and 16-18):

* The metadata is keyed by everything that changes the plan (every PlanKey field: shapes, heads,
  head dims, dtype, page size, causal, window, chunk, softcap, leftpad, varlen, num_splits,
  pack_gqa, sm_margin, device) and by the length tensors it was computed from, never by call
  site, so sliding-window and full-attention layers of one batch get their own metadata.
* The active batch lives in a contextvars.ContextVar, not a module global: two backends, two
  threads or two asyncio tasks never see each other's batch.
* A batch's metadata dies with it (each batch has a generation); nothing is reused across batches.
* Each Plan is checked against the call it is given to by the C++ library (python/README.md,
  "Scheduler metadata"): a key that missed a field would give a plan the call refuses (naming the
  field) or replaces by its own, never a silent misuse.

CUDA-graph mode (``SchedulingBackend(cuda_graph=True, max_batch_size=N)``) keeps each
configuration's metadata in a fixed-capacity int32 buffer (FA3's layout, capacity for N
sequences) that the captured kernels read; ``refill(graph)`` recomputes them in place from the
length tensors they were captured with, before each replay.
"""

import contextvars
import itertools
import threading

from . import _call as c
from . import _frameworks as fw
from . import _kvflash as _ext

__all__ = ["SchedulingBackend", "Batch", "active_batch"]

_active = contextvars.ContextVar("kvflash_scheduling_batch", default=None)


def active_batch():
    """The batch entered in this context (thread / task), or None."""
    return _active.get()


def configuration_key(call):
    """Everything in a call that changes its plan, as hashable bytes (made by the extension, in
    one crossing): the shapes, dtypes and devices of the tensors the plan reads the shape of, the
    length tensors by identity (the batch keeps them alive, so an identity cannot be reused while
    it is cached), and every scalar of the PlanKey. A malformed call raises what the call would."""
    return _ext.configuration_key(call)


class Batch:
    """One forward batch of one backend. A context manager; or begin() / end()."""

    def __init__(self, backend, generation, graph):
        self.backend = backend
        self.generation = generation
        self.graph = graph
        self.computations = 0  # metadata computed in this batch
        self._lock = threading.Lock()
        self._metadata = {}  # configuration key -> (metadata, the call it was made for)
        self._token = None
        self._closed = False

    def __enter__(self):
        self._token = _active.set(self)
        return self

    def __exit__(self, *exc):
        self.end()
        return False

    def end(self):
        """Leaves the batch: its metadata is dropped and never used again."""
        with self._lock:
            self._closed = True
            self._metadata.clear()
        if self._token is not None:
            token, self._token = self._token, None
            try:
                _active.reset(token)
            except ValueError:  # ended from another context: that context's value is not ours
                if _active.get() is self:
                    _active.set(None)

    @property
    def closed(self):
        return self._closed

    def metadata_for(self, call):
        """The metadata for this call's configuration, computed at the first call that needs it."""
        key = _ext.configuration_key(call)  # configuration_key(call), one Python frame less
        with self._lock:
            if self._closed:
                return None
            entry = self._metadata.get(key)
            if entry is None:
                entry = (self.backend._compute(call, key, self.graph), call)
                self._metadata[key] = entry
                self.computations += 1
            return entry[0]

    def __repr__(self):
        return (f"<kvflash Batch generation={self.generation} configurations={len(self._metadata)}"
                f"{' closed' if self._closed else ''}>")


class _GraphSlot:
    """A configuration's metadata in CUDA-graph mode: a fixed int32 buffer in FA3's layout, the
    Plan it encodes and the call (with its length tensors) it is recomputed from."""

    def __init__(self, buffer, plan, call):
        self.buffer = buffer
        self.plan = plan
        self.size = plan.fa3_size
        self.call = call

    def metadata(self):
        # Host memory: the call reads and checks the buffer itself. A GPU: kvflash's kernels
        # compute the per-batch splits on the device inside the graph, so the call takes the
        # typed Plan (its static decisions) and the buffer serves FA3-layout readers.
        if fw.device_of(self.buffer)[0] == 1:
            return self.buffer[: self.size]
        return self.plan


class SchedulingBackend:
    """Creates batches; see the module documentation."""

    def __init__(self, cuda_graph=False, max_batch_size=None):
        self.cuda_graph = bool(cuda_graph)
        self.max_batch_size = max_batch_size
        self.computations = 0  # over all batches
        self._lock = threading.Lock()
        self._generations = itertools.count(1)
        self._slots = {}  # (graph, configuration key) -> _GraphSlot

    def batch(self, graph=None):
        """A new batch (enter it with `with`). In CUDA-graph mode, `graph` names the captured
        graph (e.g. its batch size) whose fixed buffers the batch fills."""
        if self.cuda_graph and graph is None:
            graph = "default"
        with self._lock:
            generation = next(self._generations)
        return Batch(self, generation, graph)

    def begin(self, graph=None):
        """Enters a new batch in the current context; call .end() on it after the forward."""
        return self.batch(graph).__enter__()

    def _compute(self, call, key, graph):
        plan = _ext.make_plan(call)
        with self._lock:
            self.computations += 1
        if not self.cuda_graph:
            return plan
        return self._fill_slot(graph, key, call, plan).metadata()

    def _capacity(self, plan):
        if self.max_batch_size is None:
            return plan.fa3_size
        rounded = (int(self.max_batch_size) + 3) // 4 * 4
        return max(plan.fa3_size, 1 + 4 * rounded)

    def _fill_slot(self, graph, key, call, plan):
        values = plan.to_fa3()
        like = call[c.Q] if call[c.Q] is not None else call[c.V_CACHE]
        with self._lock:
            slot = self._slots.get((graph, key))
            if fw.is_capturing(like):
                # Nothing may be copied from the host while a graph is captured: the buffer was
                # filled by the warm-up run, and refill() refreshes it before each replay.
                if slot is None or slot.size != len(values):
                    raise RuntimeError(
                        "kvflash: run this configuration once in a batch of this graph before "
                        "capturing it (its metadata buffer is made and filled outside the capture)")
                slot.call = call
                return slot
            if slot is None or len(slot.buffer) < len(values):
                buffer = fw.int32_tensor([0] * self._capacity(plan), like)
                slot = _GraphSlot(buffer, plan, call)
                self._slots[(graph, key)] = slot
            slot.plan, slot.size, slot.call = plan, len(values), call
            fw.copy_into(slot.buffer, values)
        return slot

    def refill(self, graph="default"):
        """CUDA-graph mode, before a replay: recomputes every configuration captured for `graph`
        from its length tensors (which the engine has refilled in place) into the same buffers.
        Returns how many configurations were refilled."""
        with self._lock:
            slots = [s for (g, _key), s in self._slots.items() if g == graph]
        for slot in slots:
            plan = _ext.make_plan(slot.call)
            values = plan.to_fa3()
            if len(values) != slot.size:
                raise ValueError(
                    f"scheduler_metadata for graph {graph!r} changed length ({slot.size} -> {len(values)}); "
                    "a graph must be replayed with the configuration it was captured with")
            with self._lock:
                fw.copy_into(slot.buffer, values)
                slot.plan = plan
                self.computations += 1
        return len(slots)

    def graph_buffers(self, graph="default"):
        """The fixed metadata buffers of a graph (for inspection)."""
        with self._lock:
            return [s.buffer for (g, _key), s in self._slots.items() if g == graph]
