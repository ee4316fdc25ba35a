"""The benchmark cases: what is run, how much work each case is, and the suites.

A case is one attention problem in kvflash's layout: q (batch, seqlen_q, heads, headdim) against a
cache of seqlen_k keys per sequence that already holds every key (no append in the timed call),
paged (page_size > 0, pages handed out in a random order) or dense (page_size 0).

  decode   seqlen_q 1 or 4 (speculative decoding) against a long context; figure: K/V bytes / time
  prefill  seqlen_q == seqlen_k, 16k tokens in total (batch = 16384 / seqlen); figure: FLOP / time
  extend   a chunk of new tokens against a long cached prefix (bottom-right causal); FLOP / time
  mla      DeepSeek-style absorbed MLA decode as SGLang calls FA3 (issue 16): one KV head, q the
           rotary part (d 64) against rotary keys, qv the absorbed query (d_v 512) against the
           latent cache, which is also V; bytes / time or FLOP / time by arithmetic intensity
Decode rows with kv_dtype "fp8" (issue 15) read a float8 e4m3 cache under a bf16 query, with
per-tensor descales (data.py). Prefill rows with kv_dtype "fp8_qkv" (issue 15) are FA3's all-fp8
call: q and the cache in e4m3, q / k / v descales, a bf16 output; their FLOPs are bf16 prefill's.
"""

import dataclasses
import re

BYTES_BF16 = 2
KV_BYTES = {"bf16": 2, "fp8": 1, "fp8_qkv": 1}
PREFILL_TOKENS = 16384
PREFILL_MODEL_DIM = 2048  # heads = 2048 / headdim, the FlashAttention papers' convention
# FLOP per cache byte above which an MLA row is compute bound: the H200's bf16 dense matmul over
# its memory bandwidth (989 TFLOP/s / 4.8 TB/s). MLA decode at 16 heads does ~30, at 128 ~240.
RIDGE_FLOP_PER_BYTE = 206
MLA_CONTEXT = 8192


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
    headdim_v: int = 0  # 0: headdim (MLA: the latent dim of v_cache and qv)
    # "bf16" | "fp8" (float8 e4m3 cache under a bf16 query) | "fp8_qkv" (q e4m3 too, out bf16)
    kv_dtype: str = "bf16"

    @property
    def dv(self):
        return self.headdim_v or self.headdim

    @property
    def is_mla(self):
        return self.kind == "mla"

    @property
    def fp8(self):
        """The cache is float8 e4m3 (read with k / v descales), under a bf16 or an e4m3 query."""
        return self.kv_dtype in ("fp8", "fp8_qkv")

    @property
    def fp8_q(self):
        """FA3's all-fp8 call: q is e4m3 too (with q_descale)."""
        return self.kv_dtype == "fp8_qkv"

    @property
    def dtype_suffix(self):
        """The suffix of an fp8 row's name and group (" fp8", " fp8_qkv"); bf16 rows have none."""
        return f" {self.kv_dtype}" if self.fp8 else ""

    @property
    def score_dim(self):
        """The dot product length of one score: d, or d + d_v for MLA (q.k + qv.v)."""
        return self.headdim + self.dv if self.is_mla else self.headdim

    @property
    def softmax_scale(self):
        """score_dim^-0.5 (FA3's default, 1/sqrt(576) for MLA): passed to every system so that
        none relies on its own default."""
        return self.score_dim ** -0.5

    @property
    def name(self):
        layout = f"p{self.page_size}" if self.page_size else "dense"
        mask = "causal" if self.causal else "full"
        dims = f"d{self.headdim}" + (f"/{self.dv}" if self.dv != self.headdim else "")
        return (f"{self.kind} b{self.batch} q{self.seqlen_q} k{self.seqlen_k} "
                f"h{self.heads}/{self.heads_k} {dims} {mask} {layout}{self.dtype_suffix}")

    @property
    def group(self):
        """The plot / summary group: decode by batch and head layout, prefill by head dim, MLA by
        batch and heads; fp8 rows apart from bf16 ones."""
        if self.kind == "decode":
            dense = "" if self.page_size else " dense"
            return f"decode q{self.seqlen_q} h{self.heads}/{self.heads_k} b{self.batch}{dense}{self.dtype_suffix}"
        if self.is_mla:
            return f"mla q{self.seqlen_q} h{self.heads}/{self.heads_k} b{self.batch}"
        layout = f"p{self.page_size}" if self.page_size else "dense"
        mask = "causal" if self.causal else "full"
        return f"{self.kind} d{self.headdim} {mask} {layout}{self.dtype_suffix}"

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
        """2 FLOPs per multiply-add in the scores (score_dim long) and P.V (d_v) over the visible
        pairs: 4.b.h.d per pair, 2.b.h.(576 + 512) for MLA."""
        return 2 * self.batch * self.heads * (self.score_dim + self.dv) * self.visible_pairs()

    def kv_bytes(self):
        """The cache read: keys (d) and values (d_v) of every KV head, in the cache's dtype."""
        return self.batch * self.seqlen_k * self.heads_k * (self.headdim + self.dv) * KV_BYTES[self.kv_dtype]

    def bytes_moved(self):
        """The cache read once, q (and qv) read and the output (bf16) written (the memory-bound
        figure)."""
        q_bytes = 1 if self.fp8_q else BYTES_BF16
        qo = self.batch * self.seqlen_q * self.heads * (self.score_dim * q_bytes + self.dv * BYTES_BF16)
        return self.kv_bytes() + qo

    @property
    def memory_bound(self):
        if self.is_mla:
            return self.flops() < RIDGE_FLOP_PER_BYTE * self.kv_bytes()
        return self.kind == "decode"

    @property
    def measures_host_work(self):
        """kvflash's host work per eager call is measured on batch-1 bf16 decode (issue 14: the
        GPU time is smallest there, so the host's share is largest)."""
        return self.kind == "decode" and self.batch == 1 and not self.fp8


def decode_cases(batches, contexts, seqlens_q, heads, max_kv_bytes, page_size=16, kv_dtype="bf16"):
    cases = []
    for seqlen_q in seqlens_q:
        for batch in batches:
            for context in contexts:
                case = Case("decode", batch, seqlen_q, context, heads[0], heads[1], 128, True, page_size,
                            kv_dtype=kv_dtype)
                if case.kv_bytes() <= max_kv_bytes:
                    cases.append(case)
    return cases


def prefill_cases(seqlens, headdims, causals, page_sizes, kv_dtype="bf16"):
    cases = []
    for page_size in page_sizes:
        for headdim in headdims:
            heads = PREFILL_MODEL_DIM // headdim
            for causal in causals:
                for seqlen in seqlens:
                    batch = max(1, PREFILL_TOKENS // seqlen)
                    cases.append(Case("prefill", batch, seqlen, seqlen, heads, heads, headdim, causal, page_size,
                                      kv_dtype=kv_dtype))
    return cases


def extend_cases(chunks_and_prefixes, page_size=16):
    return [Case("extend", 1, chunk, prefix + chunk, 32, 8, 128, True, page_size)
            for chunk, prefix in chunks_and_prefixes]


def mla_cases(batches_heads_pages, max_kv_bytes):
    """DeepSeek-V3's absorbed MLA decode (d 64 rotary, d_v 512 latent, one KV head) over 8k keys,
    one case per (batch, query heads, page size) that fits the cache budget."""
    cases = [Case("mla", batch, 1, MLA_CONTEXT, heads, 1, 64, True, page, headdim_v=512)
             for batch, heads, page in batches_heads_pages]
    return [c for c in cases if c.kv_bytes() <= max_kv_bytes]


SEQLENS = [512, 1024, 2048, 4096, 8192, 16384]
CONTEXTS = [1024, 8192, 32768, 131072]
# b1 x 8k on a contiguous cache: the paged row's dense twin, for the host work of an eager call.
DENSE_DECODE = decode_cases([1], [8192], [1], (32, 8), 1 << 40, page_size=0)
# Issue 16: 16 heads (a TP-8 shard, memory bound) at SGLang's page sizes 64 and 1 (its default);
# 128 heads (the whole model, compute bound).
MLA_SHAPES = [(64, 16, 64), (64, 16, 1), (128, 128, 64)]
# Issue 15's all-fp8 prefill (>= 1,000 TFLOP/s at 16k d128 full, >= 1.4x bf16's): 2k and 16k at
# d128 both masks, 16k full at d64 / d256; each has a bf16 twin in the dense prefill rows above it.
FP8_PREFILL = (prefill_cases([2048, 16384], [128], [True, False], [0], kv_dtype="fp8_qkv")
               + prefill_cases([16384], [64, 256], [False], [0], kv_dtype="fp8_qkv"))


def default_suite(max_kv_bytes):
    """The issue's suite. Decode first (the serving case), then prefill, then extend."""
    cases = decode_cases([1, 8, 32, 64, 128], CONTEXTS, [1, 4], (32, 8), max_kv_bytes)
    cases += DENSE_DECODE
    for heads in [(8, 1), (64, 8)]:
        cases += decode_cases([1, 32, 128], [8192, 32768], [1], heads, max_kv_bytes)
    cases += decode_cases([1, 64], [8192], [1], (32, 8), max_kv_bytes, kv_dtype="fp8")
    cases += mla_cases(MLA_SHAPES, max_kv_bytes)
    cases += prefill_cases(SEQLENS, [64, 128, 256], [True, False], [0])
    cases += prefill_cases(SEQLENS, [128], [True, False], [16, 64])
    cases += FP8_PREFILL
    cases += extend_cases([(1024, 16384), (2048, 65536), (4096, 131072)])
    return cases


def quick_suite(max_kv_bytes):
    """About a minute on an H200 (FlashInfer's kernels precompiled): one of each kind."""
    cases = decode_cases([1, 64], [8192, 32768], [1], (32, 8), max_kv_bytes)
    cases += DENSE_DECODE
    cases += decode_cases([32], [8192], [4], (32, 8), max_kv_bytes)
    cases += mla_cases(MLA_SHAPES[:1], max_kv_bytes)
    cases += prefill_cases([1024, 8192], [128], [True, False], [0])
    cases += prefill_cases([4096], [128], [True], [16])
    cases += prefill_cases([8192], [128], [False], [0], kv_dtype="fp8_qkv")
    cases += extend_cases([(2048, 65536)])
    return cases


def tiny_suite():
    """Minute shapes for CPU dry runs and tests: every kind and layout, fractions of a second."""
    return [
        Case("decode", 2, 1, 96, 4, 2, 64, True, 16),
        Case("decode", 1, 1, 64, 4, 2, 64, True, 0),
        Case("decode", 2, 4, 80, 4, 2, 64, True, 16),
        Case("decode", 3, 1, 80, 4, 2, 64, True, 16, kv_dtype="fp8"),
        Case("mla", 2, 1, 80, 4, 1, 64, True, 16, headdim_v=512),
        Case("prefill", 2, 48, 48, 2, 2, 64, True, 0),
        Case("prefill", 1, 64, 64, 2, 2, 64, False, 0),
        Case("prefill", 1, 64, 64, 2, 2, 64, True, 16),
        Case("prefill", 1, 64, 64, 2, 2, 64, False, 0, kv_dtype="fp8_qkv"),
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
