"""The call tuple: one flash_attn_with_kvcache call as it crosses into the extension, FA3's
arguments in FA3's order plus kvflash's, in python/src/call_args.h's CallField order. One tuple
keeps the crossing cheap; this module is the Python side's one statement of the order."""

FIELDS = (
    "q", "k_cache", "v_cache", "k", "v", "qv", "rotary_cos", "rotary_sin", "cache_seqlens",
    "cache_batch_idx", "cache_leftpad", "page_table", "cu_seqlens_q", "cu_seqlens_k_new",
    "max_seqlen_q", "rotary_seqlens", "q_descale", "k_descale", "v_descale", "softmax_scale",
    "causal", "window_size", "attention_chunk", "softcap", "rotary_interleaved",
    "scheduler_metadata", "num_splits", "pack_gqa", "sm_margin", "sinks", "only_qv", "batch_invariant",
    "checked",
)

(Q, K_CACHE, V_CACHE, K, V, QV, ROTARY_COS, ROTARY_SIN, CACHE_SEQLENS, CACHE_BATCH_IDX,
 CACHE_LEFTPAD, PAGE_TABLE, CU_SEQLENS_Q, CU_SEQLENS_K_NEW, MAX_SEQLEN_Q, ROTARY_SEQLENS,
 Q_DESCALE, K_DESCALE, V_DESCALE, SOFTMAX_SCALE, CAUSAL, WINDOW_SIZE, ATTENTION_CHUNK, SOFTCAP,
 ROTARY_INTERLEAVED, SCHEDULER_METADATA, NUM_SPLITS, PACK_GQA, SM_MARGIN, SINKS, ONLY_QV,
 BATCH_INVARIANT, CHECKED) = range(len(FIELDS))

# FA3's defaults of flash_attn_with_kvcache, and kvflash's for its extras.
_DEFAULTS = dict.fromkeys(FIELDS)
_DEFAULTS.update(causal=False, window_size=(-1, -1), attention_chunk=0, softcap=0.0,
                 rotary_interleaved=True, num_splits=0, sm_margin=0, only_qv=False,
                 batch_invariant=False, checked=False)


def make(**arguments):
    """The call tuple of flash_attn_with_kvcache's arguments given by name (the others at their
    defaults). A name that is not a field is a TypeError."""
    unknown = arguments.keys() - _DEFAULTS.keys()
    if unknown:
        raise TypeError(f"internal: not a call field: {', '.join(sorted(unknown))}")
    values = {**_DEFAULTS, **arguments}
    return tuple(values[name] for name in FIELDS)


def with_metadata(call, metadata):
    """The same call with another scheduler_metadata."""
    return call[:SCHEDULER_METADATA] + (metadata,) + call[SCHEDULER_METADATA + 1:]
