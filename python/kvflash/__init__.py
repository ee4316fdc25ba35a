"""kvflash: FlashAttention-3's flash_attn_with_kvcache contract, on the CPU and on CUDA.

    from kvflash.flash_attn_interface import flash_attn_with_kvcache

Works with torch tensors, numpy arrays (ml_dtypes for bfloat16 / float8) and any DLPack
producer; torch and a GPU are optional.
"""

from ._kvflash import Plan, PlanKey, __version__, build_backends, cuda_available
from .flash_attn_interface import (
    flash_attn_combine,
    flash_attn_func,
    flash_attn_varlen_func,
    flash_attn_with_kvcache,
    get_scheduler_metadata,
)
from .scheduling import Batch, SchedulingBackend, active_batch

__all__ = [
    "Batch",
    "Plan",
    "PlanKey",
    "SchedulingBackend",
    "active_batch",
    "build_backends",
    "cuda_available",
    "flash_attn_combine",
    "flash_attn_func",
    "flash_attn_varlen_func",
    "flash_attn_with_kvcache",
    "get_scheduler_metadata",
]
