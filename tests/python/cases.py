"""Random flash_attn_with_kvcache configurations (numpy), small enough for the float64 reference."""

import numpy as np

try:
    import ml_dtypes
except ImportError:  # pragma: no cover
    ml_dtypes = None


def dtypes():
    found = [np.float32, np.float16]
    if ml_dtypes is not None:
        found.append(ml_dtypes.bfloat16)
    return found


# (rtol, atol) of the comparison with the float64 reference, by q's dtype.
TOLERANCE = {"float32": (1e-4, 1e-4), "float16": (5e-3, 5e-3), "bfloat16": (3e-2, 3e-2)}


def tolerance(dtype):
    return TOLERANCE[np.dtype(dtype).name]


def random_case(rng, dtype=None):
    """Keyword arguments of one call, plus the expectations the test needs."""
    dtype = dtype or dtypes()[rng.integers(len(dtypes()))]
    batch = int(rng.integers(1, 4))
    num_heads_k = int(rng.integers(1, 3))
    num_heads = num_heads_k * int(rng.choice([1, 2, 4]))
    d = int(rng.choice([16, 32, 64]))
    d_v = d if rng.random() < 0.7 else int(rng.choice([16, 32]))
    paged = rng.random() < 0.5
    page_size = int(rng.choice([1, 4, 16])) if paged else 1
    capacity = int(rng.choice([16, 32, 48])) if not paged else page_size * int(rng.integers(2, 6))
    capacity = max(capacity, 8)
    varlen = rng.random() < 0.3
    append = rng.random() < 0.4
    packed_new = append and rng.random() < 0.4
    rotary = append and rng.random() < 0.5 and d >= 32
    s_new = int(rng.integers(1, 4)) if append else 0

    def randn(*shape):
        return rng.standard_normal(shape).astype(dtype)

    kw = {}
    if varlen:
        lens_q = rng.integers(0, 5, size=batch)
        lens_q[rng.integers(batch)] = max(1, lens_q.max())
        cu = np.concatenate([[0], np.cumsum(lens_q)]).astype(np.int32)
        kw["q"] = randn(int(cu[-1]), num_heads, d)
        kw["cu_seqlens_q"] = cu
        kw["max_seqlen_q"] = int(lens_q.max())
    else:
        kw["q"] = randn(batch, int(rng.integers(1, 5)), num_heads, d)

    use_batch_idx = not paged and rng.random() < 0.3
    cache_rows = batch + (2 if use_batch_idx else 0)
    if paged:
        pages_per_seq = capacity // page_size
        num_pages = cache_rows * pages_per_seq + 2
        kw["k_cache"] = randn(num_pages, page_size, num_heads_k, d)
        kw["v_cache"] = randn(num_pages, page_size, num_heads_k, d_v)
        kw["page_table"] = rng.permutation(num_pages)[: cache_rows * pages_per_seq].reshape(
            cache_rows, pages_per_seq).astype(np.int32)
    else:
        kw["k_cache"] = randn(cache_rows, capacity, num_heads_k, d)
        kw["v_cache"] = randn(cache_rows, capacity, num_heads_k, d_v)
    if use_batch_idx:
        kw["cache_batch_idx"] = rng.permutation(cache_rows)[:batch].astype(np.int32)

    seqlens = rng.integers(0, capacity - s_new + 1, size=batch).astype(np.int32)
    seqlens[rng.integers(batch)] = max(1, seqlens.max())  # at least one key somewhere
    if rng.random() < 0.2 and not append:
        kw["cache_seqlens"] = int(seqlens[0])
    else:
        kw["cache_seqlens"] = seqlens
    if not paged and not np.isscalar(kw["cache_seqlens"]) and rng.random() < 0.25:
        kw["cache_leftpad"] = np.array([rng.integers(0, s + 1) for s in seqlens], dtype=np.int32)

    if append:
        if packed_new:
            lens_new = rng.integers(0, s_new + 1, size=batch)
            cu_new = np.concatenate([[0], np.cumsum(lens_new)]).astype(np.int32)
            kw["k"] = randn(int(cu_new[-1]), num_heads_k, d)
            kw["v"] = randn(int(cu_new[-1]), num_heads_k, d_v)
            kw["cu_seqlens_k_new"] = cu_new
        else:
            kw["k"] = randn(batch, s_new, num_heads_k, d)
            kw["v"] = randn(batch, s_new, num_heads_k, d_v)
    if rotary:
        rotary_dim = 16 * int(rng.integers(1, d // 16 + 1))
        angles = rng.uniform(0, 2 * np.pi, size=(capacity + 8, rotary_dim // 2))
        kw["rotary_cos"] = np.cos(angles).astype(dtype)
        kw["rotary_sin"] = np.sin(angles).astype(dtype)
        kw["rotary_interleaved"] = bool(rng.random() < 0.5)

    kw["causal"] = bool(rng.random() < 0.5)
    if rng.random() < 0.3:
        kw["window_size"] = (int(rng.integers(-1, 6)), int(rng.choice([-1, 0, 2])))
    if rng.random() < 0.15:
        kw["attention_chunk"] = int(rng.choice([4, 8]))
    if rng.random() < 0.25:
        kw["softcap"] = float(rng.choice([5.0, 30.0]))
    if rng.random() < 0.25:
        kw["sinks"] = rng.standard_normal(num_heads).astype(np.float32)
    if rng.random() < 0.3:
        kw["softmax_scale"] = float(rng.uniform(0.05, 0.3))
    if rng.random() < 0.3:
        kw["num_splits"] = int(rng.choice([1, 2, 3]))
    return kw
