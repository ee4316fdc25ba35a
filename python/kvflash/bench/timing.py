"""Timing and ceilings.

GPU: each repetition first writes a 256 MiB buffer (flushes the 50-60 MB L2, so K/V come from
memory as in a model with many layers), then keeps the GPU busy with a short sleep kernel while the
host issues the call, so that host overhead (Python, planning-free launch paths) is hidden; the
call itself is bracketed by CUDA events. The figure is the median of the repetitions after warm-up.
CPU (dry runs): wall-clock per call.

Host work of an eager call (kvflash's batch-1 decode rows): the same call timed with the GPU idle
when it is issued (no sleep kernel), eagerly and as a CUDA-graph replay; eager minus replay is the
host work the eager call adds (Python, binding, planning, launches) that the graph does not.
"""

import statistics
import time

import torch

FLUSH_BYTES = 256 << 20
SLEEP_CYCLES = 1_000_000  # ~0.5 ms at H200 clocks: more than any peer's host time per call


class Timer:
    def __init__(self, device, min_reps=20, max_reps=50, target_s=0.1, warmup=2):
        self.device = device
        self.min_reps = min_reps
        self.max_reps = max_reps
        self.target_s = target_s
        self.warmup = warmup
        self.cuda = device == "cuda"
        self._flush = torch.empty(FLUSH_BYTES // 4, dtype=torch.int32, device=device) if self.cuda else None

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize()

    def first_call(self, fn):
        """Runs fn once (compilation, JIT, autotuning happen here); returns (output, seconds)."""
        self.sync()
        start = time.perf_counter()
        out = fn()
        self.sync()
        return out, time.perf_counter() - start

    def measure(self, fn):
        """Seconds per call: (median, repetitions). fn has already run once."""
        for _ in range(self.warmup):
            fn()
        estimate = self._one(fn)
        reps = int(min(self.max_reps, max(self.min_reps, self.target_s / max(estimate, 1e-9))))
        samples = [self._one(fn) for _ in range(reps)]
        return statistics.median(samples), reps

    def host_work(self, fn):
        """(eager seconds, graph-replay seconds) of fn with the GPU idle when it is issued, medians;
        NaNs on the CPU, which has no graphs (the host work there is the whole call)."""
        if not self.cuda:
            return float("nan"), float("nan")
        replay = capture_graph(fn).replay
        reps = max(self.min_reps, 20)
        eager = statistics.median(self._issued_idle(fn) for _ in range(reps))
        graph = statistics.median(self._issued_idle(replay) for _ in range(reps))
        return eager, graph

    def _issued_idle(self, fn):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        self._flush.zero_()
        torch.cuda.synchronize()  # nothing queued: the host's time before each launch is timed
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        return start.elapsed_time(stop) * 1e-3

    def _one(self, fn):
        if not self.cuda:
            start = time.perf_counter()
            fn()
            return time.perf_counter() - start
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        self._flush.zero_()
        torch.cuda._sleep(SLEEP_CYCLES)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        return start.elapsed_time(stop) * 1e-3


def capture_graph(fn):
    """fn captured in a CUDA graph, after warm-up calls on a side stream (torch's recipe)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph


def _median_seconds(fn, reps, cuda):
    fn()
    if cuda:
        torch.cuda.synchronize()
    samples = []
    for _ in range(reps):
        if cuda:
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            stop.record()
            stop.synchronize()
            samples.append(start.elapsed_time(stop) * 1e-3)
        else:
            t0 = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def measure_ceilings(device):
    """Device copy bandwidth (bytes read + written per second) and bf16 matmul FLOP/s, measured
    now. GPU: 2 GiB copy, 8192^3 bf16 torch.matmul on random data. CPU: small stand-ins."""
    cuda = device == "cuda"
    n_bytes = (2 << 30) if cuda else (16 << 20)
    src = torch.empty(n_bytes // 2, dtype=torch.bfloat16, device=device).normal_()
    dst = torch.empty_like(src)
    copy_s = _median_seconds(lambda: dst.copy_(src), 20 if cuda else 5, cuda)
    del src, dst
    n = 8192 if cuda else 256
    dtype = torch.bfloat16 if cuda else torch.float32
    a = torch.randn(n, n, dtype=dtype, device=device)
    b = torch.randn(n, n, dtype=dtype, device=device)
    mm_s = _median_seconds(lambda: torch.matmul(a, b), 20 if cuda else 5, cuda)
    return {
        "copy_bytes_per_s": 2 * n_bytes / copy_s,
        "matmul_flops_per_s": 2 * n**3 / mm_s,
        "copy_what": f"device copy of {n_bytes >> 20} MiB (read + write)",
        "matmul_what": f"torch.matmul {n}^3 {str(dtype).replace('torch.', '')}",
    }
