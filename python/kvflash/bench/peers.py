"""The systems under test: kvflash and its peers (peers_torch.py, peers_external.py), all
System subclasses (system.py)."""

import torch

from . import peers_external, peers_torch
from .system import Prepared, System


class Kvflash(System):
    """kvflash.flash_attn_interface.flash_attn_with_kvcache with scheduler metadata computed
    beforehand (get_scheduler_metadata) and a preallocated output: the timed call is the GPU work
    plus the binding's launch path. MLA as SGLang calls FA3 (q the rotary part against k_cache,
    qv the absorbed query against v_cache, the latent cache); fp8 with k_descale / v_descale, and
    FA3's all-fp8 call (q e4m3 too) with q_descale and a bf16 output. softmax_scale is always
    given (the case's, FA3's default) so that every system uses one."""

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
        from kvflash.flash_attn_interface import get_scheduler_metadata

        # An fp8 cache is planned with the cache's dtype (contract 5.8); so is the all-fp8 call.
        metadata = get_scheduler_metadata(
            case.batch, case.seqlen_q, case.seqlen_k, case.heads, case.heads_k, case.headdim,
            inputs.cache_seqlens, qkv_dtype=inputs.k_cache.dtype, headdim_v=case.dv,
            page_size=case.page_size or None, causal=case.causal)
        return self._prepared(case, inputs, "scheduler metadata precomputed", scheduler_metadata=metadata)

    @staticmethod
    def _prepared(case, inputs, note, **options):
        from kvflash.flash_attn_interface import flash_attn_with_kvcache

        b, sq, h = inputs.q.shape[:3]
        out_dtype = torch.bfloat16 if case.fp8_q else inputs.q.dtype  # FA3's all-fp8 call writes bf16
        out = torch.empty(b, sq, h, case.dv, dtype=out_dtype, device=inputs.q.device)
        q, k_cache, v_cache = inputs.q, inputs.k_cache, inputs.v_cache
        seqlens, page_table = inputs.cache_seqlens, inputs.page_table
        if case.is_mla:
            options["qv"] = inputs.qv
        if case.fp8:
            options.update(k_descale=inputs.k_descale, v_descale=inputs.v_descale)
        if case.fp8_q:
            options["q_descale"] = inputs.q_descale
        causal, scale = case.causal, case.softmax_scale

        def fn():
            return flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens, page_table=page_table,
                                           causal=causal, softmax_scale=scale, out=out, **options)

        return Prepared(fn, note=note)


class KvflashBatchInvariant(Kvflash):
    """kvflash's batch-invariant mode (a sequence's output independent of the rest of the batch:
    a fixed key count per split), to measure what it costs. Not a peer: report.py leaves kvflash's
    own variants out of the best peer."""

    name = "kvflash-bi"

    def prepare(self, case, inputs):
        return self._prepared(case, inputs, "batch_invariant=True, planned per call", batch_invariant=True)


def all_systems(device):
    systems = [Kvflash(device), KvflashBatchInvariant(device)]
    if device == "cuda":
        systems += [peers_torch.Sdpa(device, "flash"), peers_torch.Sdpa(device, "cudnn")]
    else:
        systems += [peers_torch.Sdpa(device, "math")]
    systems += [peers_torch.Flex(device), peers_torch.FlexPaged(device),
                peers_external.FlashInfer(device), peers_external.FlashAttention4(device)]
    return systems
