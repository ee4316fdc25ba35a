"""Per-call host overhead of kvflash.flash_attn_interface.flash_attn_with_kvcache for a decode step
on torch tensors (target on CUDA: <= 15 us of host time per call, kernel time excluded), split
into its pieces.

On CUDA the GPU is kept ahead of the host (a small decode problem whose kernels finish faster
than the host issues them; N calls back to back, no synchronisation inside the loop), so host time
per call is what the calls cost the host; the GPU time of the same call (CUDA events) is reported
to show the host was the bottleneck. On the CPU the kernel runs inside the call: the default
problem is tiny and the `native` row (the same call made from C++) carries the kernel's time, so
the rows above it are the Python side's cost. Rows (host us per call, min over repeats):

  wrapper           flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=..., page_table=...)
  wrapper+out       the same with out= preallocated (no output allocation in the call)
  wrapper+metadata  the same with scheduler_metadata from get_scheduler_metadata (typed plan)
  in_batch          inside a SchedulingBackend batch of 32 calls (metadata looked up per call)
  binding           kvflash._kvflash.fwd on a prebuilt call tuple with out given (no Python wrapper)
  binding+alloc     the same without out (the binding allocates it through torch)
  native            the C++ library alone: flash_attn_with_kvcache called from C++ on the imported
                    call (validation, planning, launches; on the CPU also the kernel)
  configuration_key the scheduling backend's per-call key (one crossing)
  output_spec, make_plan   binding crossings that import the call and validate / plan it
  torch.empty_like  one empty_like of q (numpy.empty_like with --framework numpy), for scale

and the breakdown of `wrapper`: Python wrapper (wrapper+out - binding), output allocation
(wrapper - wrapper+out), binding (binding - native: imports, output_spec, stream, workspace) and
the C++ library (native).

    python3 bench/python_overhead.py [--device cuda|cpu] [--batch 8] [--calls 2000] [--json out.json]
    python3 bench/python_overhead.py --device cpu --framework numpy   # the same rows on numpy
                                                                       # arrays (float16)
"""

import argparse
import json
import time

import numpy as np
import torch

import kvflash
from kvflash import SchedulingBackend, _call, _kvflash
from kvflash import flash_attn_interface as fai

# The decode problem timed on each device when no shape is given: the H200 figure's problem on
# CUDA; on the CPU, where the kernel runs inside the call, one tiny head so that little of the
# time is kernel.
DEFAULTS = {
    "cuda": dict(batch=8, heads=32, heads_k=8, headdim=128, page_size=16, seqlen=64),
    "cpu": dict(batch=1, heads=1, heads_k=1, headdim=64, page_size=16, seqlen=1),
}


def decode_problem(device, batch, heads, heads_k, headdim, page_size, seqlen):
    dtype = torch.bfloat16
    pages_per_seq = max(1, -(-seqlen // page_size))
    num_pages = batch * pages_per_seq
    return dict(
        q=torch.randn(batch, 1, heads, headdim, device=device, dtype=dtype),
        k_cache=torch.randn(num_pages, page_size, heads_k, headdim, device=device, dtype=dtype),
        v_cache=torch.randn(num_pages, page_size, heads_k, headdim, device=device, dtype=dtype),
        page_table=torch.arange(num_pages, device=device, dtype=torch.int32).reshape(batch, pages_per_seq),
        cache_seqlens=torch.full((batch,), seqlen, device=device, dtype=torch.int32),
        causal=True,
    )


def as_numpy(kw):
    """The problem's tensors as numpy arrays (float16: numpy has no bfloat16 of its own)."""
    def convert(t):
        if not isinstance(t, torch.Tensor):
            return t
        return t.numpy() if t.dtype == torch.int32 else t.float().numpy().astype(np.float16)
    return {name: convert(t) for name, t in kw.items()}


def synchronize(device):
    if device == "cuda":
        torch.cuda.synchronize()


def host_us_per_call(fn, calls, device, repeats=7):
    """Least over repeats of host microseconds per call (the device drained before each repeat):
    the least is the figure other processes on the machine disturbed least."""
    for _ in range(50):
        fn()
    samples = []
    for _ in range(repeats):
        synchronize(device)
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter() - start) / calls * 1e6)
    synchronize(device)
    return min(samples)


def gpu_us_per_call(fn, calls):
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    fn()
    torch.cuda.synchronize()
    start.record()
    for _ in range(calls):
        fn()
    stop.record()
    torch.cuda.synchronize()
    return start.elapsed_time(stop) * 1e3 / calls


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("cuda", "cpu"), help="default: cuda when available")
    for name in DEFAULTS["cuda"]:
        parser.add_argument("--" + name.replace("_", "-"), type=int,
                            help=f"default {DEFAULTS['cuda'][name]} on cuda, {DEFAULTS['cpu'][name]} on cpu")
    parser.add_argument("--framework", choices=("torch", "numpy"), default="torch",
                        help="the caller's arrays (numpy: CPU only)")
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    if args.device is None:
        args.device = "cuda" if torch.cuda.is_available() and "cuda" in kvflash.build_backends() else "cpu"
    if args.device == "cuda" and (not torch.cuda.is_available() or "cuda" not in kvflash.build_backends()):
        raise SystemExit(f"--device cuda needs a GPU and kvflash's CUDA backend (built: {kvflash.build_backends()})")
    if args.framework == "numpy" and args.device != "cpu":
        raise SystemExit("--framework numpy runs on the CPU only (--device cpu)")
    for name, value in DEFAULTS[args.device].items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    return args


def main():
    args = parse_args()
    device = args.device
    if device == "cpu":
        # One thread: the CPU kernel's fork/join (OpenMP, shared with torch) would otherwise be
        # most of a call on a busy machine, and it is not what this measures.
        torch.set_num_threads(1)
    shape = {name: getattr(args, name) for name in DEFAULTS["cuda"]}
    kw = decode_problem(device, **shape)
    numpy = args.framework == "numpy"
    if numpy:
        kw = as_numpy(kw)
    empty_like = np.empty_like if numpy else torch.empty_like
    out = empty_like(kw["q"])
    pages_per_seq = kw["page_table"].shape[1]
    metadata = fai.get_scheduler_metadata(
        args.batch, 1, pages_per_seq * args.page_size, args.heads, args.heads_k, args.headdim,
        kw["cache_seqlens"], qkv_dtype="float16" if numpy else torch.bfloat16,
        page_size=args.page_size, causal=True)
    call = _call.make(q=kw["q"], k_cache=kw["k_cache"], v_cache=kw["v_cache"],
                      cache_seqlens=kw["cache_seqlens"], page_table=kw["page_table"], causal=True)
    backend = SchedulingBackend()
    layers = 32  # calls per batch: the per-batch planning is amortised as in an engine

    def in_batch():
        with backend.batch():
            for _ in range(layers):
                fai.flash_attn_with_kvcache(**kw)

    variants = {
        "wrapper": lambda: fai.flash_attn_with_kvcache(**kw),
        "wrapper+out": lambda: fai.flash_attn_with_kvcache(**kw, out=out),
        "wrapper+metadata": lambda: fai.flash_attn_with_kvcache(**kw, scheduler_metadata=metadata),
        "binding": lambda: _kvflash.fwd(call, out, False),
        "binding+alloc": lambda: _kvflash.fwd(call, None, False),
        "configuration_key": lambda: _kvflash.configuration_key(call),
        "output_spec": lambda: _kvflash.output_spec(call),
        "make_plan": lambda: _kvflash.make_plan(call),
        f"{args.framework}.empty_like": lambda: empty_like(kw["q"]),
    }
    host = {}
    for name, fn in variants.items():
        host[name] = host_us_per_call(fn, args.calls, device)
        if name == "wrapper+metadata":
            host["in_batch"] = host_us_per_call(in_batch, max(1, args.calls // layers), device) / layers
        if name == "binding+alloc":
            synchronize(device)
            host["native"] = min(_kvflash.native_call_us(call, out, args.calls) for _ in range(7))
            synchronize(device)
    breakdown = {
        "python wrapper": host["wrapper+out"] - host["binding"],
        "output allocation": host["wrapper"] - host["wrapper+out"],
        "binding": host["binding"] - host["native"],
        "C++ library (native)": host["native"],
    }
    results = {"config": vars(args),
               "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
               "host_us": host, "breakdown_us": breakdown, "gpu_us": {}}
    if device == "cuda":
        results["gpu_us"]["wrapper"] = gpu_us_per_call(variants["wrapper"], args.calls)

    dtype = "float16 numpy" if numpy else "bf16 torch"
    print(f"{results['device']}: decode b={args.batch} h={args.heads}/{args.heads_k} d={args.headdim} "
          f"page={args.page_size} seqlen={args.seqlen}, {dtype}, kvflash {kvflash.build_backends()}")
    for name, us in host.items():
        print(f"  host {name:<20} {us:8.2f} us/call")
    print(f"  breakdown of host wrapper ({host['wrapper']:.2f} us/call):")
    for name, us in breakdown.items():
        print(f"    {name:<22} {us:8.2f} us/call")
    if device == "cuda":
        print(f"  gpu  {'wrapper':<20} {results['gpu_us']['wrapper']:8.2f} us/call "
              "(kernels; below host time = host-bound)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
