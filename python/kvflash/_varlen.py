"""flash_attn_varlen_func's keys and queries as a flash_attn_with_kvcache call, for torch tensors
(CPU or CUDA: device-side ops only, no host synchronisation, so CUDA graphs can capture them) and
numpy arrays.

* Packed keys (total_k, h_k, d) are a paged cache of page size 1: key j of sequence b is page
  cu_seqlens_k[b] + j; its length is seqused_k[b] when given, else cu_seqlens_k's difference.
* A paged K/V (page_table) is the cache itself; the lengths are seqused_k (or cu_seqlens_k's).
* FA3's seqused_q (sequence b uses the first seqused_q[b] of its cu_seqlens_q rows) is a batch of
  twice the sequences: 2b holds b's used rows and attends b's keys, 2b + 1 holds the rest and
  attends none, so those rows get out 0 and LSE -inf (FA3 leaves them unwritten).
"""

import os

import numpy as np

from . import _frameworks as fw


def _torch():
    return fw.torch_module()


def _lengths(cu_seqlens):
    """Differences of prefix sums, as int32."""
    if fw.is_torch(cu_seqlens):
        return (cu_seqlens[1:] - cu_seqlens[:-1]).to(_torch().int32)
    cu = np.asarray(cu_seqlens)
    return (cu[1:] - cu[:-1]).astype(np.int32)


def _host_values(t):
    """An index tensor's values where reading them costs no device sync (numpy, CPU torch), or of
    a CUDA tensor in checked mode (KVFLASH_CHECK=1); None otherwise (the kernels clamp)."""
    if t is None:
        return None
    if fw.is_torch(t):
        if t.device.type != "cpu" and os.environ.get("KVFLASH_CHECK", "0") in ("", "0"):
            return None
        return t.detach().cpu().numpy().astype(np.int64)
    return np.asarray(t).astype(np.int64)


def check_packed_keys(cu_seqlens_k, seqused_k, total_k):
    """Sequence b's keys are rows [cu_seqlens_k[b], cu_seqlens_k[b] + seqused_k[b]) of k: every one
    must exist (a last entry past k.shape[0], or seqused_k past its segment, would read other
    sequences' rows)."""
    cu = _host_values(cu_seqlens_k)
    if cu is None:
        return
    if cu.size == 0 or cu[0] != 0:
        raise ValueError(f"cu_seqlens_k[0] must be 0 (got {cu[:1].tolist()})")
    for b in range(1, cu.size):
        if cu[b] < cu[b - 1]:
            raise ValueError(f"cu_seqlens_k[{b}] = {cu[b]} is less than cu_seqlens_k[{b - 1}] = "
                             f"{cu[b - 1]} (cumulative lengths must not decrease)")
    if cu[-1] > total_k:
        raise ValueError(f"cu_seqlens_k[{cu.size - 1}] = {cu[-1]} exceeds the {total_k} rows of k (k.shape[0])")
    used = _host_values(seqused_k)
    if used is None:
        return
    for b in range(min(used.size, cu.size - 1)):
        if not 0 <= used[b] <= cu[b + 1] - cu[b]:
            raise ValueError(f"seqused_k[{b}] = {used[b]} is out of range [0, {cu[b + 1] - cu[b]}] "
                             f"(the segment cu_seqlens_k[{b + 1}] - cu_seqlens_k[{b}])")


def packed_keys_as_pages(k, v, cu_seqlens_k, max_seqlen_k):
    """Packed (total_k, h_k, d) keys as pages of one key. Returns (k_cache, v_cache, page_table)."""
    total_k = k.shape[0]
    k_cache = k.reshape(total_k, 1, *k.shape[1:])
    v_cache = v.reshape(total_k, 1, *v.shape[1:])
    last_page = max(total_k - 1, 0)
    if fw.is_torch(k):
        torch = _torch()
        starts = cu_seqlens_k[:-1].to(torch.int32)
        offsets = torch.arange(max_seqlen_k, dtype=torch.int32, device=starts.device)
        page_table = (starts[:, None] + offsets[None, :]).clamp_(max=last_page).to(torch.int32)
    else:
        cu = np.asarray(cu_seqlens_k)
        page_table = np.minimum(cu[:-1, None] + np.arange(max_seqlen_k)[None, :], last_page)
        page_table = page_table.astype(np.int32)
    return k_cache, v_cache, page_table


def key_lengths(cu_seqlens_k, seqused_k):
    """Keys attended per sequence: seqused_k, else cu_seqlens_k's differences."""
    if seqused_k is not None:
        return seqused_k
    if cu_seqlens_k is None:
        raise ValueError(
            "flash_attn_varlen_func needs seqused_k or cu_seqlens_k for the key lengths")
    return _lengths(cu_seqlens_k)


def _check_host_seqused_q(used, rows):
    """seqused_q read on the host: each entry in [0, its sequence's cu_seqlens_q rows]."""
    used, rows = np.asarray(used), np.asarray(rows)
    bad = np.flatnonzero((used < 0) | (used > rows))
    if bad.size:
        b = int(bad[0])
        raise ValueError(f"seqused_q[{b}] is {int(used[b])}, expected a value in "
                         f"[0, {int(rows[b])}] (sequence {b}'s rows in cu_seqlens_q)")


def split_unused_query_rows(cu_seqlens_q, seqused_q, page_table, cache_seqlens):
    """seqused_q as a doubled batch (module documentation). Returns the doubled call's
    (cu_seqlens_q, page_table, cache_seqlens). On a GPU, entries outside [0, rows] are clamped
    (reading them would need a host synchronisation); on the host they are a ValueError."""
    rows = _lengths(cu_seqlens_q)
    if fw.is_torch(cu_seqlens_q):
        torch = _torch()
        if not cu_seqlens_q.is_cuda:
            _check_host_seqused_q(seqused_q.cpu().numpy(), rows.cpu().numpy())
        used = torch.minimum(seqused_q.to(rows.dtype).clamp(min=0), rows)
        starts = cu_seqlens_q[:-1].to(torch.int32)
        bounds = torch.stack((starts, starts + used), dim=1).reshape(-1)
        cu = torch.cat((bounds, cu_seqlens_q[-1:].to(torch.int32)))
        seqlens = torch.stack((cache_seqlens, torch.zeros_like(cache_seqlens)), dim=1).reshape(-1)
        return cu, page_table.repeat_interleave(2, dim=0), seqlens
    _check_host_seqused_q(seqused_q, rows)
    cu_q = np.asarray(cu_seqlens_q).astype(np.int32)
    bounds = np.stack((cu_q[:-1], cu_q[:-1] + np.asarray(seqused_q, np.int32)), axis=1).reshape(-1)
    cu = np.concatenate((bounds, cu_q[-1:])).astype(np.int32)
    lengths = np.asarray(cache_seqlens, np.int32)
    seqlens = np.stack((lengths, np.zeros_like(lengths)), axis=1).reshape(-1)
    return cu, np.repeat(np.asarray(page_table), 2, axis=0), seqlens
