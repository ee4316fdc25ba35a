"""PyTorch's own attention: SDPA (one backend forced per system) and FlexAttention (compiled),
dense and through torch's experimental paged attention. They take head-major (b, h, s, d)
contiguous K/V, gathered from kvflash's pages outside the timed region.

MLA has no qv argument here; it is run as plain attention of q' = [qv | q] (d 576) against
k' = [v | k] and v (d_v 512), where the backend takes those dims, and is otherwise not run. An fp8
cache under a bf16 query is not run: these take q, k and v in one dtype, and a dequantised bf16
copy would read twice the bytes of the case. Nor is FA3's all-fp8 call (SDPA_FP8_QKV and
FLEX_FP8_QKV say why).
"""

import torch
import torch.nn.functional as F

from .system import NotRun, Prepared, System, describe

GATHERED = "K/V gathered from pages into contiguous (b,h,s,d) outside timing"
HEAD_MAJOR = "q/K/V copied to (b,h,s,d) outside timing"


def _layout_note(case):
    return GATHERED if case.page_size else HEAD_MAJOR


def _from_heads_major(out):
    return out.transpose(1, 2)


def _expand_heads(k, v, heads):
    group = heads // k.shape[1]
    return k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)


# FA3's all-fp8 call. SDPA: torch 2.11's one fp8 entry is torch/nn/attention/experimental/
# _scaled_dot_product_attention_quantized.py, running FA3's kernels from an external
# flash_attn_interface module (flash-attn-3, registered by torch/nn/attention/_fa3.py); cuDNN's fp8
# attention needs the cudnn frontend's Python package. The device has neither (KINDS.md's package
# list). FlexAttention compiles fp8 q/k/v on sm89-sm99 (flex_attention.py, _enforce_mem_layouts)
# but has no descale arguments.
SDPA_FP8_QKV = ("no all-fp8 call: torch 2.11's one fp8 SDPA (torch.nn.attention.experimental."
                "_scaled_dot_product_attention_quantized) runs FA3's flash_attn_interface (flash-attn-3), "
                "not on the device; cuDNN fp8 through its own API: not reachable from torch 2.11 without "
                "the cudnn frontend Python package, which the device does not have")
FLEX_FP8_QKV = ("all-fp8 not wired: flex_attention takes e4m3 q/k/v on sm89-sm99 but no q/k/v descales "
                "(they would have to be folded into its scale and output)")


def _refuse_fp8(case, name, all_fp8_reason):
    if case.fp8_q:
        raise NotRun(f"{name}: {all_fp8_reason}")
    if case.fp8:
        raise NotRun(f"{name} takes q, k and v in one dtype: no fp8 cache under a bf16 query")


def _mla_note(case):
    return f"MLA as attention of [qv|q] (d {case.score_dim}) on [v|k] and v (d_v {case.dv}); " + _layout_note(case)


class Sdpa(System):
    """torch.nn.functional.scaled_dot_product_attention with one backend forced."""

    BACKENDS = {"flash": "FLASH_ATTENTION", "cudnn": "CUDNN_ATTENTION", "math": "MATH"}

    def __init__(self, device, backend):
        super().__init__(device)
        self.backend_name = backend
        self.name = f"sdpa-{backend}"

    def _backend(self):
        from torch.nn.attention import SDPBackend

        return getattr(SDPBackend, self.BACKENDS[self.backend_name])

    def unavailable(self):
        try:
            self._backend()
        except Exception as e:  # noqa: BLE001
            return f"torch.nn.attention.SDPBackend.{self.BACKENDS[self.backend_name]} missing: {e}"
        return None

    def _mask(self, case, q, k, v, gqa):
        """(keyword arguments that make the mask, note). Bottom-right causal with s_q < s_k:
        CausalBias(lower_right) calls the flash kernel directly when it can take the case and
        silently another kernel when not, so for sdpa-flash that is checked first; cuDNN gets the
        mask materialized (its sdpa_kernel context then refuses the case rather than fall back)."""
        if not case.causal or case.seqlen_q == 1:
            return {}, ""  # one query row sees the whole context: no mask needed
        if case.seqlen_q == case.seqlen_k:
            return {"is_causal": True}, ""
        from torch.nn.attention.bias import causal_lower_right

        bias = causal_lower_right(case.seqlen_q, case.seqlen_k)
        if self.backend_name == "cudnn":
            return {"attn_mask": bias._materialize(q.device)}, "bottom-right causal as a materialized boolean mask"
        if self.backend_name == "flash":
            params = torch.backends.cuda.SDPAParams(q, k, v, None, 0.0, False, gqa)
            if not torch.backends.cuda.can_use_flash_attention(params, False):
                raise RuntimeError("can_use_flash_attention is False for this bottom-right causal case "
                                   "(CausalBias would run another kernel)")
        return {"attn_mask": bias}, "bottom-right causal via causal_lower_right"

    def _call(self, case, q, k, v, gqa):
        from torch.nn.attention import sdpa_kernel

        mask_kwargs, note = self._mask(case, q, k, v, gqa)
        backend, scale = self._backend(), case.softmax_scale

        def fn():
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v, enable_gqa=gqa, scale=scale, **mask_kwargs)

        return fn, note

    def _mla(self, case, inputs):
        """MLA through the one KV head by enable_gqa, never expanded (a copy of the latent cache
        per query head); a backend that refuses d 576 / d_v 512 makes the row not run."""
        q, k, v = inputs.mla_heads_major()
        try:
            fn, mask_note = self._call(case, q, k, v, True)
            fn()
        except Exception as e:  # noqa: BLE001 - the backend's refusal is the reason
            raise NotRun(f"SDPA {self.backend_name} does not take MLA as d {case.score_dim} / d_v {case.dv} "
                         f"attention: {describe(e, 160)}") from e
        return Prepared(fn, _from_heads_major, "; ".join(filter(None, [_mla_note(case), mask_note])))

    def prepare(self, case, inputs):
        _refuse_fp8(case, "SDPA", SDPA_FP8_QKV)
        if case.is_mla:
            return self._mla(case, inputs)
        q, k, v = inputs.heads_major()
        gqa = case.heads != case.heads_k
        notes = [_layout_note(case)]
        try:
            fn, mask_note = self._call(case, q, k, v, gqa)
            fn()
        except Exception as e:  # noqa: BLE001 - a refusal of grouped-query heads: expand them
            if not gqa:
                raise
            k, v = _expand_heads(k, v, case.heads)
            fn, mask_note = self._call(case, q, k, v, False)
            notes.append(f"GQA refused ({describe(e, 100)}); K/V heads expanded to {case.heads}")
        notes += [mask_note] if mask_note else []
        return Prepared(fn, _from_heads_major, "; ".join(notes))


class _FlexBase(System):
    stage = 1
    _compiled = {}

    def unavailable(self):
        try:
            from torch.nn.attention import flex_attention  # noqa: F401
        except Exception as e:  # noqa: BLE001
            return f"torch.nn.attention.flex_attention missing: {e}"
        return None

    def flex(self, dynamic):
        """flex_attention compiled with dynamic shapes (one compile per mask kind and head dim
        rather than per shape), or static; eager (unfused) on the CPU: dry runs only."""
        from torch.nn.attention.flex_attention import flex_attention

        if not self.cuda:
            return flex_attention
        if dynamic not in _FlexBase._compiled:
            import torch._dynamo

            torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 256)
            _FlexBase._compiled[dynamic] = torch.compile(flex_attention, dynamic=dynamic)
        return _FlexBase._compiled[dynamic]

    def first_working(self, make_call, note, attempts=None):
        """The first of (dynamic compile, static compile, page-sized tiles for paged) whose first
        call runs; every refusal's reason is kept in the error when none does."""
        errors = []
        for dynamic, options in attempts or self.attempts():
            fn = make_call(self.flex(dynamic), options)
            try:
                fn()
            except Exception as e:  # noqa: BLE001 - try the next variant, keep the reason
                errors.append(f"dynamic={dynamic} kernel_options={options}: {describe(e, 200)}")
                continue
            extra = [] if dynamic or not self.cuda else ["static-shape compile (dynamic refused)"]
            extra += [f"kernel_options={options}"] if options else []
            return Prepared(fn, _from_heads_major, "; ".join([note] + extra))
        raise RuntimeError(" | ".join(errors))

    def attempts(self):
        return [(True, None), (False, None)] if self.cuda else [(True, None)]


def _causal_mod(case, device):
    # A tensor, not a Python int: the compiled kernel takes it as an input instead of
    # recompiling for every (seqlen_q, seqlen_k) pair.
    offset = torch.tensor(case.seqlen_k - case.seqlen_q, device=device)

    def causal(b, h, q_idx, kv_idx):
        return kv_idx <= q_idx + offset

    return causal


class Flex(_FlexBase):
    """torch.nn.attention.flex_attention (compiled) on contiguous K/V, bottom-right causal by a
    block mask (none when every key is visible)."""

    name = "flex"

    def __init__(self, device):
        super().__init__(device)
        self._mla_refused = {}  # (score dim, d_v) -> reason: one failed compile, not one per case

    def prepare(self, case, inputs):
        from torch.nn.attention.flex_attention import create_block_mask

        _refuse_fp8(case, "FlexAttention", FLEX_FP8_QKV)
        q, k, v = inputs.mla_heads_major() if case.is_mla else inputs.heads_major()
        block_mask = None
        if case.causal and case.seqlen_q > 1:
            block_mask = create_block_mask(_causal_mod(case, self.device), B=None, H=None, Q_LEN=case.seqlen_q,
                                           KV_LEN=case.seqlen_k, device=self.device)
        gqa, scale = case.heads != case.heads_k, case.softmax_scale

        def make_call(flex, options):
            return lambda: flex(q, k, v, block_mask=block_mask, scale=scale, enable_gqa=gqa, kernel_options=options)

        mode = "; compiled" if self.cuda else "; eager"
        if not case.is_mla:
            return self.first_working(make_call, _layout_note(case) + mode)
        dims = (case.score_dim, case.dv)
        if dims not in self._mla_refused:
            try:  # one static compile: d 576 pads to 1024 in Triton, which may not fit
                return self.first_working(make_call, _mla_note(case) + mode, [(False, None)] if self.cuda else None)
            except RuntimeError as e:
                self._mla_refused[dims] = describe(e, 200)
        raise NotRun(f"FlexAttention does not run MLA as d {dims[0]} / d_v {dims[1]} attention: "
                     f"{self._mla_refused[dims]}")


class FlexPaged(_FlexBase):
    """FlexAttention through torch.nn.attention.experimental._paged_attention.PagedAttention:
    kvflash's page table and pages (copied head-major into PagedAttention's (1, h_k, pages*page, d)
    cache outside timing), the logical block mask converted to physical pages. Decode only."""

    name = "flex-paged"

    def prepare(self, case, inputs):
        if case.kind != "decode" or not case.page_size:
            raise NotRun("flex-paged runs the paged decode cases only")
        _refuse_fp8(case, "FlexAttention", FLEX_FP8_QKV)
        from torch.nn.attention.experimental._paged_attention import PagedAttention
        from torch.nn.attention.flex_attention import create_block_mask, noop_mask

        b, page = case.batch, case.page_size
        num_pages, pages_per_seq = inputs.k_cache.shape[0], inputs.page_table.shape[1]
        paged = PagedAttention(num_pages, page, b, device=self.device)
        table = inputs.page_table.long()
        paged.page_table[:, :pages_per_seq] = table
        rows = torch.arange(b, device=self.device)[:, None]
        paged.physical_to_logical[rows, table] = torch.arange(pages_per_seq, device=self.device)[None, :]
        paged.capacity[:] = pages_per_seq * page

        def head_major(cache):
            return cache.permute(2, 0, 1, 3).reshape(1, case.heads_k, num_pages * page, case.headdim).contiguous()

        k, v = head_major(inputs.k_cache), head_major(inputs.v_cache)
        q = inputs.q.transpose(1, 2).contiguous()
        mask_mod = _causal_mod(case, self.device) if case.causal and case.seqlen_q > 1 else noop_mask
        logical = create_block_mask(mask_mod, B=b, H=None, Q_LEN=case.seqlen_q, KV_LEN=pages_per_seq * page,
                                    BLOCK_SIZE=(128, page), device=self.device)
        block_mask = paged.convert_logical_block_mask(logical)
        gqa, scale = case.heads != case.heads_k, case.softmax_scale
        self._page = page

        def make_call(flex, options):
            return lambda: flex(q, k, v, block_mask=block_mask, scale=scale, enable_gqa=gqa, kernel_options=options)

        return self.first_working(make_call, f"page {page}, PagedAttention cache copied head-major outside timing")

    def attempts(self):
        # The default tiles first; tiles of one page if those are refused (KV block = page size).
        tiles = {"BLOCK_N": self._page}
        if not self.cuda:
            return [(True, None)]
        return [(True, None), (True, tiles), (False, None), (False, tiles)]
