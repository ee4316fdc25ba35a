"""The systems under test. Each takes a case's Inputs and returns a call to time.

A system's prepare(case, inputs) does everything that is not the attention itself (layout
copies, masks, plans, scheduler metadata) and returns a Prepared: fn() runs the attention,
to_common(out) turns fn's output into kvflash's (b, s_q, h, d) layout for the output check, and
note says what the system was given when it differs from kvflash's inputs. A system that cannot
take a case raises NotRun with the reason; any other exception is recorded as an error with its
message. Nothing is dropped silently: every (case, system) pair gets a row.
"""

import dataclasses

import torch


def describe(e, limit=400):
    """An exception's type and first non-empty lines (compiler errors often start with a generic
    line), on one line."""
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    return f"{type(e).__name__}: {' / '.join(lines[:3])[:limit]}"


class NotRun(Exception):
    """This system does not take this case (the message says why)."""


@dataclasses.dataclass
class Prepared:
    fn: object
    to_common: object = None
    note: str = ""


class System:
    name = ""
    stage = 0  # runner.py: 0 no compilation, 1 compiled per shape family, 2 background JIT

    def __init__(self, device):
        self.device = device
        self.cuda = device == "cuda"

    def unavailable(self):
        """Why this system cannot run at all here (import failure, ...), or None."""
        return None

    def start(self, cases):
        """Background work before the suite (JIT builds); the suite waits with wait()."""

    def wait(self, seconds):
        """Waits up to seconds for start()'s work; returns a reason if it did not finish."""
        return None

    def setup_report(self):
        """Lines for results.md about this system's setup (kernel builds), if any."""
        return []

    def prepare(self, case, inputs):
        raise NotImplementedError


class Kvflash(System):
    """kvflash.flash_attn_interface.flash_attn_with_kvcache with scheduler metadata computed
    beforehand (get_scheduler_metadata) and a preallocated output: the timed call is the GPU work
    plus the binding's launch path."""

    name = "kvflash"

    def unavailable(self):
        try:
            import kvflash
        except Exception as e:  # noqa: BLE001 - any import failure is the reason
            return f"import kvflash failed: {type(e).__name__}: {e}"
        if self.cuda and "cuda" not in kvflash.build_backends():
            return f"kvflash was built without its CUDA backend (backends: {kvflash.build_backends()})"
        return None

    def prepare(self, case, inputs):
        from kvflash.flash_attn_interface import flash_attn_with_kvcache, get_scheduler_metadata

        metadata = get_scheduler_metadata(
            case.batch, case.seqlen_q, case.seqlen_k, case.heads, case.heads_k, case.headdim,
            inputs.cache_seqlens, qkv_dtype=inputs.dtype, page_size=case.page_size or None,
            causal=case.causal)
        out = torch.empty_like(inputs.q)
        q, k_cache, v_cache = inputs.q, inputs.k_cache, inputs.v_cache
        seqlens, page_table, causal = inputs.cache_seqlens, inputs.page_table, case.causal

        def fn():
            return flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens, page_table=page_table,
                                           causal=causal, scheduler_metadata=metadata, out=out)

        return Prepared(fn, note="scheduler metadata precomputed")


def all_systems(device):
    from . import peers_external, peers_torch

    systems = [Kvflash(device)]
    if device == "cuda":
        systems += [peers_torch.Sdpa(device, "flash"), peers_torch.Sdpa(device, "cudnn")]
    else:
        systems += [peers_torch.Sdpa(device, "math")]
    systems += [peers_torch.Flex(device), peers_torch.FlexPaged(device),
                peers_external.FlashInfer(device), peers_external.FlashAttention4(device)]
    return systems
