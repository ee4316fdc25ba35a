"""The sm90 prefill family's opt-in variants timed against its defaults in one process, on one GPU.

kvflash reads its switches at each call, so one process can flip them between calls and time every
variant on the same inputs and the same machine (comparisons across device calls mix machines):
rung 3 / rung 4 (`KVFLASH_SM90_PINGPONG`), and at d 64 in 16 bits rung 8 (three consumer groups
over 192-row tiles, the default there) / rung 3 (`KVFLASH_SM90_THREE_GROUPS=0`). Rows: 16k x 16k,
16 heads, a dense cache, d 128 (full and
causal), 64 and 256 (full), bf16 and all-fp8 (unit descales). Median of 10 calls after 2, CUDA
events, no L2 flush (the 16k rows are compute-bound).

    PYTHONPATH=<kvflash package> python3 bench/sm90_variants.py     # on an sm_90 GPU, torch CUDA
"""

import os

import torch

from kvflash.flash_attn_interface import flash_attn_with_kvcache

SEQ, HEADS = 16384, 16


def median_ms(fn, iters=10):
    for _ in range(2):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(iters):
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def prefill_call(dtype, headdim, causal):
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(1, SEQ, HEADS, headdim, device="cuda", generator=g, dtype=torch.bfloat16) for _ in range(3))
    kw = dict(cache_seqlens=torch.full((1,), SEQ, dtype=torch.int32, device="cuda"), causal=causal)
    if dtype == "fp8":
        q, k, v = (t.to(torch.float8_e4m3fn) for t in (q, k, v))
        one = torch.ones(1, HEADS, device="cuda")
        kw.update(q_descale=one, k_descale=one, v_descale=one)
    return lambda: flash_attn_with_kvcache(q, k, v, **kw)


SWITCHES = {"pp": "KVFLASH_SM90_PINGPONG", "tg": "KVFLASH_SM90_THREE_GROUPS"}
DEFAULTS = {"pp": "0", "tg": "1"}


def variants(dtype, headdim):
    """Each variant's switches: the default first."""
    if dtype == "bf16" and headdim == 64:
        return [dict(tg="1"), dict(tg="0", pp="0"), dict(tg="0", pp="1")]
    return [dict(pp="0"), dict(pp="1")]


def main():
    print(f"{torch.cuda.get_device_name()}: ms and TFLOP/s per variant ("
          + ", ".join(f"{k}: {v}" for k, v in SWITCHES.items()) + ")")
    for headdim, causal in ((128, False), (128, True), (64, False), (64, True), (256, False)):
        flops = 4 * SEQ * SEQ * HEADS * headdim / (2 if causal else 1)
        for dtype in ("bf16", "fp8"):
            fn = prefill_call(dtype, headdim, causal)
            cells = []
            for switches in variants(dtype, headdim):
                for key, name in SWITCHES.items():
                    os.environ[name] = switches.get(key, DEFAULTS[key])
                ms = median_ms(fn)
                label = " ".join(f"{k}{v}" for k, v in switches.items())
                cells.append(f"{label} {ms:.3f} ms {flops / ms / 1e9:.0f}")
            print(f"d {headdim} {'causal' if causal else 'full'} {dtype}: " + " | ".join(cells), flush=True)
            del fn
            torch.cuda.empty_cache()
    for name in SWITCHES.values():
        os.environ.pop(name, None)


if __name__ == "__main__":
    main()
