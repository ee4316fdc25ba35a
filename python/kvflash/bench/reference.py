"""The float32 torch reference of the MLA and fp8 rows.

No peer takes those inputs as kvflash does and could check it (SDPA and FlexAttention have no qv
and no fp8 inputs; FlashInfer runs on CUDA only), so every system, kvflash included, is compared
with this instead of with kvflash's output. It reads the caches gathered from the pages, and an
all-fp8 row's q, dequantised (fp8 value times its descale, exact in float32), and computes
softmax(scale * (q.k [+ qv.v])) v with the query heads grouped over their KV head (no copy of
the cache per query head).
"""

import torch

NAME = "fp32 reference"
SCORE_BYTES = 1 << 30  # float32 scores per block of query rows (16k prefill's would be ~17 GB)


def float_reference(case, inputs):
    """The output in kvflash's (b, s_q, h, d_v) layout, float32, in blocks of query rows."""
    b, sq, h, hk = case.batch, case.seqlen_q, case.heads, case.heads_k
    k, v = (t.float() for t in inputs.contiguous_kv())  # (b, s_k, h_k, d | d_v)
    if case.fp8:
        k = k * inputs.k_descale[:, None, :, None]
        v = v * inputs.v_descale[:, None, :, None]

    def grouped(t):  # (b, s_q, h, x) -> (b, s_q, h_k, h / h_k, x)
        return t.float().reshape(b, sq, hk, h // hk, t.shape[-1])

    q = grouped(inputs.q)
    if case.fp8_q:  # q_descale is (b, h_k), as FA3's: one value per KV head's query group
        q = q * inputs.q_descale[:, None, :, None, None]
    qv = grouped(inputs.qv) if case.is_mla else None
    rows = max(1, SCORE_BYTES // (4 * b * h * case.seqlen_k))
    blocks = [_block(case, q, qv, k, v, first, min(first + rows, sq)) for first in range(0, sq, rows)]
    return torch.cat(blocks, dim=1).reshape(b, sq, h, case.dv)


def _block(case, q, qv, k, v, first, last):
    """Query rows first .. last - 1, as (b, rows, h_k, h / h_k, d_v)."""
    scores = torch.einsum("bqkgd,bskd->bkgqs", q[:, first:last], k)
    if qv is not None:
        scores += torch.einsum("bqkgd,bskd->bkgqs", qv[:, first:last], v)
    scores *= case.softmax_scale
    if case.causal and case.seqlen_q > 1:  # bottom-right: query i sees keys up to s_k - s_q + i
        seen = torch.arange(first, last, device=scores.device)[:, None] + case.seqlen_k - case.seqlen_q
        hidden = torch.arange(case.seqlen_k, device=scores.device)[None, :] > seen
        scores.masked_fill_(hidden, float("-inf"))
    return torch.einsum("bkgqs,bskd->bqkgd", scores.softmax(dim=-1), v)
