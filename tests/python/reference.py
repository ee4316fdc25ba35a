"""A naive float64 reference of flash_attn_with_kvcache, written from the kvflash spec
(sections 3, 5 and 13) with numpy alone: one batch element, one head, one query row at a time.
It shares nothing with kvflash's C++ (nor with the C++ oracle) on purpose."""

import math

import numpy as np


def as_f64(a):
    return None if a is None else np.asarray(a).astype(np.float64)


def _rotate(x, cos_row, sin_row, interleaved):
    """Rotary on the first 2 * len(cos_row) channels of x (float64), spec 5.2."""
    x = x.copy()
    half = len(cos_row)
    if interleaved:
        x1, x2 = x[0:2 * half:2].copy(), x[1:2 * half:2].copy()
        x[0:2 * half:2] = x1 * cos_row - x2 * sin_row
        x[1:2 * half:2] = x1 * sin_row + x2 * cos_row
    else:
        x1, x2 = x[:half].copy(), x[half:2 * half].copy()
        x[:half] = x1 * cos_row - x2 * sin_row
        x[half:2 * half] = x1 * sin_row + x2 * cos_row
    return x


def _visible(i, seqlen_q, seqlen_k, window_left, window_right, chunk):
    """Boolean mask over keys 0..seqlen_k-1 for query row i (spec 5.4, bottom-right aligned)."""
    diag = i + seqlen_k - seqlen_q
    j = np.arange(seqlen_k)
    keep = np.ones(seqlen_k, dtype=bool)
    if window_right >= 0:
        keep &= j <= diag + window_right
    if window_left >= 0:
        keep &= j >= diag - window_left
    if chunk > 0:
        c0 = (diag // chunk) * chunk  # floor division, also for a negative diagonal
        keep &= (j >= c0) & (j < c0 + chunk)
    return keep


def _round_to(values, dtype):
    """float64 values stored in a cache of `dtype` (the cache keeps rounded rows)."""
    return np.asarray(values).astype(dtype).astype(np.float64)


def reference_kvcache(q, k_cache, v_cache, k=None, v=None, qv=None, rotary_cos=None,
                      rotary_sin=None, cache_seqlens=None, cache_batch_idx=None, cache_leftpad=None,
                      page_table=None, cu_seqlens_q=None, cu_seqlens_k_new=None, max_seqlen_q=None,
                      rotary_seqlens=None, softmax_scale=None, causal=False, window_size=(-1, -1),
                      attention_chunk=0, softcap=0.0, rotary_interleaved=True, sinks=None):
    """Returns (out, lse, k_cache_after, v_cache_after), all float64; out has q's layout with
    v's head dim, lse is (b, h, s_q) or (h, total_q). The caches are copied, then appended."""
    cache_dtype = np.asarray(k_cache).dtype
    kc, vc = as_f64(k_cache), as_f64(v_cache)
    qf, qvf = as_f64(q), as_f64(qv)
    varlen = cu_seqlens_q is not None
    batch = len(cu_seqlens_q) - 1 if varlen else qf.shape[0]
    num_heads, d = qf.shape[-2], qf.shape[-1]
    num_heads_k, d_v = vc.shape[-2], vc.shape[-1]
    group = num_heads // num_heads_k
    paged = page_table is not None
    page_size = kc.shape[1] if paged else 1
    capacity = page_table.shape[1] * page_size if paged else kc.shape[1]
    static_sq = max_seqlen_q if varlen else qf.shape[1]
    if softmax_scale is None:
        softmax_scale = (d + (qvf.shape[-1] if qvf is not None else 0)) ** -0.5
    window_left, window_right = window_size
    if causal:
        window_right = 0
    # Query rows are rotated per row when the mask is causal or local (after normalising
    # windows that reach past the static sizes, spec 5.4).
    wl = -1 if window_left >= capacity - 1 else window_left
    wr = -1 if window_right >= static_sq - 1 else window_right
    rotate_per_row = wl >= 0 or wr >= 0 or attention_chunk > 0

    def locate(row, pos):
        if paged:
            return page_table[row, pos // page_size], pos % page_size
        return row, pos

    out_rows, lse_rows = [], []
    for b in range(batch):
        if varlen:
            q0, seqlen_q = int(cu_seqlens_q[b]), int(cu_seqlens_q[b + 1] - cu_seqlens_q[b])
            q_rows = qf[q0:q0 + seqlen_q]
            qv_rows = qvf[q0:q0 + seqlen_q] if qvf is not None else None
        else:
            seqlen_q = qf.shape[1]
            q_rows = qf[b]
            qv_rows = qvf[b] if qvf is not None else None
        leftpad = int(cache_leftpad[b]) if cache_leftpad is not None else 0
        if cache_seqlens is None:
            cache_seqlen = capacity
        elif np.isscalar(cache_seqlens):
            cache_seqlen = int(cache_seqlens)
        else:
            cache_seqlen = int(cache_seqlens[b])
        row = int(cache_batch_idx[b]) if cache_batch_idx is not None else b
        rotary_start = int(rotary_seqlens[b]) if rotary_seqlens is not None else cache_seqlen

        if k is not None:  # append (spec 5.2)
            if cu_seqlens_k_new is not None:
                k0 = int(cu_seqlens_k_new[b])
                new_k = as_f64(k)[k0:int(cu_seqlens_k_new[b + 1])]
                new_v = as_f64(v)[k0:int(cu_seqlens_k_new[b + 1])]
            else:
                new_k, new_v = as_f64(k)[b], as_f64(v)[b]
            for t in range(new_k.shape[0]):
                key = new_k[t]
                if rotary_cos is not None:
                    pos = rotary_start + t
                    cos_row, sin_row = as_f64(rotary_cos)[pos], as_f64(rotary_sin)[pos]
                    key = np.stack([_rotate(key[h], cos_row, sin_row, rotary_interleaved)
                                    for h in range(num_heads_k)])
                page, slot = locate(row, cache_seqlen + t)
                kc[page, slot] = _round_to(key, cache_dtype)
                vc[page, slot] = new_v[t]
            seqlen_new = new_k.shape[0]
        else:
            seqlen_new = 0
        seqlen_k = cache_seqlen - leftpad + seqlen_new
        places = [locate(row, leftpad + j) for j in range(seqlen_k)]
        keys = np.stack([kc[p, s] for p, s in places]) if places else np.zeros((0, num_heads_k, d))
        values = np.stack([vc[p, s] for p, s in places]) if places else np.zeros((0, num_heads_k, d_v))

        out_b = np.zeros((seqlen_q, num_heads, d_v))
        lse_b = np.full((num_heads, seqlen_q), -np.inf)
        for i in range(seqlen_q):
            keep = _visible(i, seqlen_q, seqlen_k, window_left, window_right, attention_chunk)
            for h in range(num_heads):
                hk = h // group
                qrow = q_rows[i, h]
                if rotary_cos is not None:
                    pos = rotary_start + (i if rotate_per_row else 0)
                    qrow = _rotate(qrow, as_f64(rotary_cos)[pos], as_f64(rotary_sin)[pos],
                                   rotary_interleaved)
                scores = keys[:, hk] @ qrow
                if qv_rows is not None:
                    scores = scores + values[:, hk] @ qv_rows[i, h]
                scores = scores * softmax_scale
                if softcap > 0:
                    scores = softcap * np.tanh(scores / softcap)
                scores = np.where(keep, scores, -np.inf)
                sink = float(np.asarray(sinks, dtype=np.float64)[h]) if sinks is not None else None
                m = scores.max() if keep.any() else -np.inf
                if sink is not None:
                    m = max(m, sink)
                if m == -np.inf:
                    continue  # no key and no sink: out 0, lse -inf
                weights = np.where(keep, np.exp(scores - m), 0.0)
                denominator = weights.sum() + (math.exp(sink - m) if sink is not None else 0.0)
                out_b[i, h] = (weights @ values[:, hk]) / denominator
                lse_b[h, i] = m + math.log(denominator)
        out_rows.append(out_b)
        lse_rows.append(lse_b)

    if varlen:
        out = np.concatenate(out_rows, axis=0) if out_rows else np.zeros((0, num_heads, d_v))
        lse = np.concatenate(lse_rows, axis=1)
    else:
        out = np.stack(out_rows)
        lse = np.stack(lse_rows)
    return out, lse, kc, vc
