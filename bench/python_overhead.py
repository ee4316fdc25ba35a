"""Per-call Python overhead of kvflash.flash_attn_interface.flash_attn_with_kvcache on torch CUDA
tensors, for a decode step (target: <= 15 us, kernel time excluded).

What is timed is host time per call with the GPU kept ahead of the host: a small decode problem
whose kernels finish faster than the host can issue them, N calls back to back, no
synchronisation inside the loop. The GPU time of the same call (CUDA events) is reported too, to
show the host was the bottleneck. Variants separate the costs:

  wrapper           flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=..., page_table=...)
  wrapper+out       the same with out= preallocated (no torch.empty in the call)
  wrapper+metadata  the same with scheduler_metadata from get_scheduler_metadata (typed plan)
  in_batch          inside a SchedulingBackend batch (metadata looked up per call)
  binding           kvflash._kvflash.fwd with a prebuilt argument tuple (no Python wrapper)
  torch.empty       one torch.empty of the output's shape, for scale
  output_spec, make_plan, current_stream   pieces of the binding's work (no kernel launched)

    python3 bench/python_overhead.py [--batch 8] [--calls 2000] [--json out.json]
"""

import argparse
import json
import statistics
import time

import torch

import kvflash
from kvflash import SchedulingBackend, _call, _frameworks, _kvflash
from kvflash import flash_attn_interface as fai


def decode_problem(batch, heads, heads_k, headdim, page_size, pages_per_seq, seqlen):
    device = "cuda"
    dtype = torch.bfloat16
    num_pages = batch * pages_per_seq
    return dict(
        q=torch.randn(batch, 1, heads, headdim, device=device, dtype=dtype),
        k_cache=torch.randn(num_pages, page_size, heads_k, headdim, device=device, dtype=dtype),
        v_cache=torch.randn(num_pages, page_size, heads_k, headdim, device=device, dtype=dtype),
        page_table=torch.arange(num_pages, device=device, dtype=torch.int32).reshape(batch, pages_per_seq),
        cache_seqlens=torch.full((batch,), seqlen, device=device, dtype=torch.int32),
        causal=True,
    )


def host_us_per_call(fn, calls, repeats=7):
    """Median over repeats of host microseconds per call (GPU drained before each repeat)."""
    for _ in range(50):
        fn()
    samples = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter() - start) / calls * 1e6)
    torch.cuda.synchronize()
    return statistics.median(samples)


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


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--heads-k", type=int, default=8)
    parser.add_argument("--headdim", type=int, default=128)
    parser.add_argument("--page-size", type=int, default=16)
    parser.add_argument("--seqlen", type=int, default=64, help="cached tokens per sequence (small: the host must be the bottleneck)")
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()

    if not torch.cuda.is_available() or "cuda" not in kvflash.build_backends():
        raise SystemExit(f"needs a GPU and kvflash's CUDA backend (built: {kvflash.build_backends()})")
    pages_per_seq = max(1, -(-args.seqlen // args.page_size))
    kw = decode_problem(args.batch, args.heads, args.heads_k, args.headdim, args.page_size,
                        pages_per_seq, args.seqlen)
    out = torch.empty_like(kw["q"])
    metadata = fai.get_scheduler_metadata(
        args.batch, 1, pages_per_seq * args.page_size, args.heads, args.heads_k, args.headdim,
        kw["cache_seqlens"], qkv_dtype=torch.bfloat16, page_size=args.page_size, causal=True)
    call = _call.make(kw["q"], kw["k_cache"], kw["v_cache"], None, None, None, None, None,
                           kw["cache_seqlens"], None, None, kw["page_table"], None, None, None, None,
                           None, None, None, None, True, (-1, -1), 0, 0.0, True, None, 0, None, 0,
                           None, False)
    stream = _frameworks.current_stream(kw["q"])
    backend = SchedulingBackend()

    def in_batch():
        with backend.batch():
            for _ in range(32):  # 32 layers per batch: the per-batch planning is amortised
                fai.flash_attn_with_kvcache(**kw)

    variants = {
        "wrapper": lambda: fai.flash_attn_with_kvcache(**kw),
        "wrapper+out": lambda: fai.flash_attn_with_kvcache(**kw, out=out),
        "wrapper+metadata": lambda: fai.flash_attn_with_kvcache(**kw, scheduler_metadata=metadata),
        "binding": lambda: _kvflash.fwd(call, out, _frameworks.allocate, False, stream),
        "torch.empty": lambda: torch.empty_like(kw["q"]),
        # pieces of the binding's work, for the breakdown (no kernel launched)
        "output_spec": lambda: _kvflash.output_spec(call),
        "make_plan": lambda: _kvflash.make_plan(call),
        "current_stream": lambda: _frameworks.current_stream(kw["q"]),
    }
    results = {"config": vars(args), "device": torch.cuda.get_device_name(), "host_us": {}, "gpu_us": {}}
    for name, fn in variants.items():
        results["host_us"][name] = host_us_per_call(fn, args.calls)
    results["host_us"]["in_batch"] = host_us_per_call(in_batch, max(1, args.calls // 32)) / 32
    results["gpu_us"]["wrapper"] = gpu_us_per_call(variants["wrapper"], args.calls)

    print(f"{results['device']}: decode b={args.batch} h={args.heads}/{args.heads_k} d={args.headdim} "
          f"page={args.page_size} seqlen={args.seqlen}, bf16")
    for name, us in results["host_us"].items():
        print(f"  host {name:<18} {us:8.2f} us/call")
    print(f"  gpu  {'wrapper':<18} {results['gpu_us']['wrapper']:8.2f} us/call (kernels; below host time = host-bound)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
