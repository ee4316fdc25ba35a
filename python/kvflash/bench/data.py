"""The inputs of one case, made once and handed to every system.

kvflash's layout is the source of truth: q (b, s_q, h, d); a paged cache (pages, page_size, h_k, d)
with a page table of randomly ordered pages, or a dense cache (b, s_k, h_k, d). Other layouts
(contiguous per-sequence K/V gathered from the pages, head-major copies) are derived from it on
demand, outside any timed region, and cached so that peers share them.
"""

import torch


class Inputs:
    def __init__(self, case, device, dtype=torch.bfloat16, seed=0):
        self.case = case
        self.device = device
        self.dtype = dtype
        generator = torch.Generator(device=device).manual_seed(seed)
        b, sq, sk = case.batch, case.seqlen_q, case.seqlen_k
        h, hk, d = case.heads, case.heads_k, case.headdim

        def randn(*shape):
            return torch.randn(*shape, generator=generator, device=device, dtype=dtype)

        self.q = randn(b, sq, h, d)
        self.cache_seqlens = torch.full((b,), sk, dtype=torch.int32, device=device)
        if case.page_size:
            pages_per_seq = -(-sk // case.page_size)
            num_pages = b * pages_per_seq
            self.k_cache = randn(num_pages, case.page_size, hk, d)
            self.v_cache = randn(num_pages, case.page_size, hk, d)
            order = torch.randperm(num_pages, generator=generator, device=device)
            self.page_table = order.to(torch.int32).reshape(b, pages_per_seq)
        else:
            self.k_cache = randn(b, sk, hk, d)
            self.v_cache = randn(b, sk, hk, d)
            self.page_table = None
        self._derived = {}

    def derived(self, key, make):
        """A layout made once per case (shared between peers)."""
        if key not in self._derived:
            self._derived[key] = make()
        return self._derived[key]

    def contiguous_kv(self):
        """(k, v) as (b, s_k, h_k, d), gathered from the pages when the cache is paged."""
        return self.derived("contiguous_kv", self._gather)

    def _gather(self):
        if self.page_table is None:
            return self.k_cache, self.v_cache
        b, sk = self.case.batch, self.case.seqlen_k

        def gather(cache):
            pages = cache[self.page_table.long()]  # (b, pages_per_seq, page, h_k, d)
            return pages.reshape(b, -1, *cache.shape[2:])[:, :sk].contiguous()

        return gather(self.k_cache), gather(self.v_cache)

    def heads_major(self):
        """(q, k, v) as (b, h, s, d) contiguous: the layout SDPA and FlexAttention take."""
        def make():
            k, v = self.contiguous_kv()
            return tuple(t.transpose(1, 2).contiguous() for t in (self.q, k, v))

        return self.derived("heads_major", make)

    def free(self):
        self._derived.clear()
        self.q = self.k_cache = self.v_cache = self.page_table = self.cache_seqlens = None
