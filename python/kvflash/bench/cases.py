"""The benchmark cases: what is run, how much work each case is, and the suites.

A case is one attention problem in kvflash's layout: q (batch, seqlen_q, heads, headdim) against a
cache of seqlen_k keys per sequence that already holds every key (no append in the timed call),
paged (page_size > 0, pages handed out in a random order) or dense (page_size 0).

  decode   seqlen_q 1 or 4 (speculative decoding) against a long context; figure: K/V bytes / time
  prefill  seqlen_q == seqlen_k, 16k tokens in total (batch = 16384 / seqlen); figure: FLOP / time
  extend   a chunk of new tokens against a long cached prefix (bottom-right causal); FLOP / time
"""

import dataclasses
import re

BYTES_BF16 = 2
PREFILL_TOKENS = 16384
PREFILL_MODEL_DIM = 2048  # heads = 2048 / headdim, the FlashAttention papers' convention


@dataclasses.dataclass(frozen=True)
class Case:
    kind: str  # "decode" | "prefill" | "extend"
    batch: int
    seqlen_q: int
    seqlen_k: int
    heads: int
    heads_k: int
    headdim: int
    causal: bool
    page_size: int  # 0: dense cache

    @property
    def name(self):
        layout = f"p{self.page_size}" if self.page_size else "dense"
        mask = "causal" if self.causal else "full"
        return (f"{self.kind} b{self.batch} q{self.seqlen_q} k{self.seqlen_k} "
                f"h{self.heads}/{self.heads_k} d{self.headdim} {mask} {layout}")

    @property
    def group(self):
        """The plot / summary group: decode by batch and head layout, prefill by head dim."""
        if self.kind == "decode":
            dense = "" if self.page_size else " dense"
            return f"decode q{self.seqlen_q} h{self.heads}/{self.heads_k} b{self.batch}{dense}"
        layout = f"p{self.page_size}" if self.page_size else "dense"
        mask = "causal" if self.causal else "full"
        return f"{self.kind} d{self.headdim} {mask} {layout}"

    def visible_pairs(self):
        """(query, key) pairs that take part, per sequence and head. Causal is bottom-right
        aligned (FA3's convention): query i sees keys 0 .. seqlen_k - seqlen_q + i."""
        if not self.causal:
            return self.seqlen_q * self.seqlen_k
        offset = self.seqlen_k - self.seqlen_q
        rows = self.seqlen_q
        # sum over i of min(offset + i + 1, seqlen_k)
        return rows * offset + rows * (rows + 1) // 2

    def flops(self):
        """2 FLOPs per multiply-add in Q.K^T and P.V over the visible pairs."""
        return 4 * self.batch * self.heads * self.headdim * self.visible_pairs()

    def kv_bytes(self):
        return 2 * self.batch * self.seqlen_k * self.heads_k * self.headdim * BYTES_BF16

    def bytes_moved(self):
        """K and V read once, q read and the output written (the memory-bound figure)."""
        qo = 2 * self.batch * self.seqlen_q * self.heads * self.headdim * BYTES_BF16
        return self.kv_bytes() + qo

    @property
    def memory_bound(self):
        return self.kind == "decode"

    @property
    def measures_host_work(self):
        """kvflash's host work per eager call is measured on batch-1 decode (issue 14: the
        GPU time is smallest there, so the host's share is largest)."""
        return self.kind == "decode" and self.batch == 1


def decode_cases(batches, contexts, seqlens_q, heads, max_kv_bytes, page_size=16):
    cases = []
    for seqlen_q in seqlens_q:
        for batch in batches:
            for context in contexts:
                case = Case("decode", batch, seqlen_q, context, heads[0], heads[1], 128, True, page_size)
                if case.kv_bytes() <= max_kv_bytes:
                    cases.append(case)
    return cases


def prefill_cases(seqlens, headdims, causals, page_sizes):
    cases = []
    for page_size in page_sizes:
        for headdim in headdims:
            heads = PREFILL_MODEL_DIM // headdim
            for causal in causals:
                for seqlen in seqlens:
                    batch = max(1, PREFILL_TOKENS // seqlen)
                    cases.append(Case("prefill", batch, seqlen, seqlen, heads, heads, headdim, causal, page_size))
    return cases


def extend_cases(chunks_and_prefixes, page_size=16):
    return [Case("extend", 1, chunk, prefix + chunk, 32, 8, 128, True, page_size)
            for chunk, prefix in chunks_and_prefixes]


SEQLENS = [512, 1024, 2048, 4096, 8192, 16384]
CONTEXTS = [1024, 8192, 32768, 131072]
# b1 x 8k on a contiguous cache: the paged row's dense twin, for the host work of an eager call.
DENSE_DECODE = decode_cases([1], [8192], [1], (32, 8), 1 << 40, page_size=0)


def default_suite(max_kv_bytes):
    """The issue's suite. Decode first (the serving case), then prefill, then extend."""
    cases = decode_cases([1, 8, 32, 64, 128], CONTEXTS, [1, 4], (32, 8), max_kv_bytes)
    cases += DENSE_DECODE
    for heads in [(8, 1), (64, 8)]:
        cases += decode_cases([1, 32, 128], [8192, 32768], [1], heads, max_kv_bytes)
    cases += prefill_cases(SEQLENS, [64, 128, 256], [True, False], [0])
    cases += prefill_cases(SEQLENS, [128], [True, False], [16, 64])
    cases += extend_cases([(1024, 16384), (2048, 65536), (4096, 131072)])
    return cases


def quick_suite(max_kv_bytes):
    """About a minute on an H200 (FlashInfer's kernels precompiled): one of each kind."""
    cases = decode_cases([1, 64], [8192, 32768], [1], (32, 8), max_kv_bytes)
    cases += DENSE_DECODE
    cases += decode_cases([32], [8192], [4], (32, 8), max_kv_bytes)
    cases += prefill_cases([1024, 8192], [128], [True, False], [0])
    cases += prefill_cases([4096], [128], [True], [16])
    cases += extend_cases([(2048, 65536)])
    return cases


def tiny_suite():
    """Minute shapes for CPU dry runs and tests: every kind and layout, fractions of a second."""
    return [
        Case("decode", 2, 1, 96, 4, 2, 64, True, 16),
        Case("decode", 1, 1, 64, 4, 2, 64, True, 0),
        Case("decode", 2, 4, 80, 4, 2, 64, True, 16),
        Case("prefill", 2, 48, 48, 2, 2, 64, True, 0),
        Case("prefill", 1, 64, 64, 2, 2, 64, False, 0),
        Case("prefill", 1, 64, 64, 2, 2, 64, True, 16),
        Case("extend", 1, 16, 112, 4, 2, 64, True, 16),
    ]


def run_order(cases):
    """The middle case of each group first, then the rest in listing order: a stage cut short by
    the time budget (FlexAttention recompiles per shape) still covers every group."""
    groups = {}
    for case in cases:
        groups.setdefault(case.group, []).append(case)
    first = [members[len(members) // 2] for members in groups.values()]
    chosen = set(first)
    return first + [c for c in cases if c not in chosen]


def select(cases, patterns):
    """Cases whose name matches any of the comma-separated regular expressions (all if none)."""
    if not patterns:
        return list(cases)
    compiled = [re.compile(p.strip()) for p in patterns.split(",") if p.strip()]
    return [c for c in cases if any(p.search(c.name) for p in compiled)]
