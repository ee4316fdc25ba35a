"""Peers from PyPI, carried to the GPU machine as wheels: FlashInfer (flashinfer-python, kernels
JIT-compiled with nvcc on first use, or loaded from precompiled AOT modules) and
FlashAttention-4 (flash-attn-4's flash_attn.cute, CuTe DSL kernels compiled on first call)."""

import threading
import time

import torch

from .system import NotRun, Prepared, System, describe

WORKSPACE_BYTES = 256 << 20


class FlashInfer(System):
    """BatchDecodeWithPagedKVCacheWrapper for paged single-token decode (also over the fp8 cache,
    planned with kv_data_type float8_e4m3fn, k_scale / v_scale the per-tensor descales),
    BatchPrefillWithPagedKVCacheWrapper for paged prefill / extend / multi-token decode,
    BatchPrefillWithRaggedKVCacheWrapper for dense prefill (also FA3's all-fp8 call: planned with
    q / kv data type float8_e4m3fn and o_data_type bf16, the per-tensor q / k / v descales passed
    as its scale_q / scale_k / scale_v, fa3 backend only), mla.BatchMLAPagedAttentionWrapper for
    MLA (q_nope = qv, q_pe = q, ckv / kpe caches = kvflash's v / k caches without the head axis);
    plan() outside timing. The attention backend is FlashInfer's own choice for the GPU ("auto":
    fa3 on Hopper, for MLA too). The kernels it needs are built in a background thread from the
    start of the suite, so their compile time overlaps the other systems' runs; FlashInfer's rows
    run last (stage 2)."""

    name = "flashinfer"
    stage = 2

    def __init__(self, device):
        super().__init__(device)
        self._built = {}  # module key -> None (ready) or the build error
        self._build_seconds = {}
        self._keys = []
        self._threads = []
        self._wrappers = {}
        self._workspace = None

    def unavailable(self):
        if not self.cuda:
            return "FlashInfer needs a CUDA device"
        try:
            import flashinfer  # noqa: F401
        except Exception as e:  # noqa: BLE001
            return f"import flashinfer failed: {describe(e)}"
        return None

    # --- kernels ---------------------------------------------------------------------------

    def _prefill_backend(self, headdim, dtype):
        from flashinfer.utils import determine_attention_backend

        return determine_attention_backend(torch.device("cuda"), 0, False, False, dtype, dtype,
                                           head_dim_qk=headdim, head_dim_vo=headdim)

    def _module_key(self, case):
        """(kind, backend, head dims) of the kernel module a case runs on."""
        if case.is_mla:
            from flashinfer.utils import determine_mla_backend

            return ("mla", determine_mla_backend(torch.device("cuda")), f"{case.headdim}/{case.dv}")
        if case.page_size and case.seqlen_q == 1:
            return ("decode fp8" if case.fp8 else "decode", "fa2", case.headdim)
        if case.fp8_q:
            return ("prefill fp8", self._prefill_backend(case.headdim, torch.float8_e4m3fn), case.headdim)
        return ("prefill", self._prefill_backend(case.headdim, torch.bfloat16), case.headdim)

    def _spec(self, key):
        """The JitSpec plan() would build for the key (same arguments, so plan() loads it)."""
        from flashinfer.jit.attention.modules import (gen_batch_decode_module, gen_batch_mla_module,
                                                      gen_batch_prefill_module)

        kind, backend, d = key
        bf16 = torch.bfloat16
        if kind == "mla":
            d_kpe, d_ckv = (int(x) for x in d.split("/"))
            return gen_batch_mla_module(backend, bf16, bf16, bf16, torch.int32, d_ckv, d_kpe, False)
        if kind.startswith("decode"):
            kv = torch.float8_e4m3fn if kind == "decode fp8" else bf16
            return gen_batch_decode_module(bf16, kv, bf16, torch.int32, d, d, 0, False, False)
        qkv = torch.float8_e4m3fn if kind == "prefill fp8" else bf16
        return gen_batch_prefill_module(backend, qkv, qkv, bf16, torch.int32, d, d, 0, False, False, False)

    def start(self, cases):
        """One build thread per kernel module (each nvcc build is a separate ninja run)."""
        self._keys = list(dict.fromkeys(self._module_key(c) for c in cases))  # in order of first use
        self._threads = [threading.Thread(target=self._build, args=(key,), daemon=True) for key in self._keys]
        for thread in self._threads:
            thread.start()

    def _build(self, key):
        start = time.perf_counter()
        try:
            self._spec(key).build_and_load()
            self._built[key] = None
        except Exception as e:  # noqa: BLE001 - recorded per module
            self._built[key] = describe(e)
        self._build_seconds[key] = time.perf_counter() - start

    def wait(self, seconds):
        deadline = time.perf_counter() + max(0.0, seconds)
        for thread in self._threads:
            thread.join(timeout=max(0.0, deadline - time.perf_counter()))
        if any(t.is_alive() for t in self._threads):
            return "JIT build still running when the time budget ran out"
        return None

    def setup_report(self):
        lines = []
        for key in self._keys:
            name = f"{self.name} kernel {key[0]} ({key[1]}) d{key[2]}"
            if key not in self._built:
                lines.append(f"{name}: still building when the run ended")
            elif self._built[key] is None:
                lines.append(f"{name}: built or loaded in {self._build_seconds[key]:.1f} s")
            else:
                lines.append(f"{name}: build FAILED after {self._build_seconds[key]:.1f} s: {self._built[key]}")
        return lines

    # --- calls -----------------------------------------------------------------------------

    def _wrapper(self, cls_name, backend):
        import flashinfer
        import flashinfer.mla

        if self._workspace is None:
            self._workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device="cuda")
        key = (cls_name, backend)
        if key not in self._wrappers:
            if cls_name == "BatchMLAPagedAttentionWrapper":  # no layout argument
                self._wrappers[key] = flashinfer.mla.BatchMLAPagedAttentionWrapper(self._workspace, backend=backend)
            else:
                cls = getattr(flashinfer, cls_name)
                kwargs = {} if cls_name == "BatchDecodeWithPagedKVCacheWrapper" else {"backend": backend}
                self._wrappers[key] = cls(self._workspace, "NHD", **kwargs)
        return self._wrappers[key]

    def prepare(self, case, inputs):
        if case.fp8 and not case.fp8_q and not (case.page_size and case.seqlen_q == 1):
            raise NotRun("the fp8 cache is benchmarked on FlashInfer's paged single-token decode only")
        if case.fp8_q and case.page_size:
            raise NotRun("FA3's all-fp8 call is benchmarked on FlashInfer's ragged (dense) prefill only")
        if case.is_mla and not case.page_size:
            raise NotRun("FlashInfer's MLA wrapper takes a paged cache only")
        key = self._module_key(case)
        if case.fp8_q and key[1] != "fa3":  # jit/attention/modules.py asserts fp8 q off fa3
            raise NotRun(f"FlashInfer runs e4m3 q/k/v prefill on its fa3 backend (sm90a) only, not {key[1]}")
        if key not in self._built:
            raise NotRun(f"kernel {key} not built: JIT build not finished within the time budget")
        if self._built[key] is not None:
            raise RuntimeError(f"JIT build of {key} failed: {self._built[key]}")
        if case.is_mla:
            return self._mla(case, inputs, key[1])
        if not case.page_size:
            return self._dense_prefill(case, inputs, key[1])
        if case.seqlen_q == 1:
            return self._paged_decode(case, inputs)
        return self._paged_prefill(case, inputs, key[1])

    def _paged_indices(self, case, inputs):
        b, page = case.batch, case.page_size
        pages_per_seq = inputs.page_table.shape[1]
        indptr = torch.arange(b + 1, dtype=torch.int32, device="cuda") * pages_per_seq
        indices = inputs.page_table.reshape(-1).contiguous()
        last = torch.full((b,), (case.seqlen_k - 1) % page + 1, dtype=torch.int32, device="cuda")
        return indptr, indices, last

    def _paged_decode(self, case, inputs):
        wrapper = self._wrapper("BatchDecodeWithPagedKVCacheWrapper", "fa2")
        indptr, indices, last = self._paged_indices(case, inputs)
        wrapper.plan(indptr, indices, last, case.heads, case.heads_k, case.headdim, case.page_size,
                     q_data_type=torch.bfloat16, kv_data_type=inputs.k_cache.dtype, sm_scale=case.softmax_scale)
        q = inputs.q.reshape(case.batch, case.heads, case.headdim)
        cache = (inputs.k_cache, inputs.v_cache)
        out = torch.empty_like(q)
        scales, note = {}, "decode kernel (no tensor cores), plan() outside timing"
        if case.fp8:  # per-tensor descales (data.py): every (batch, KV head) holds the same value
            scales = {"k_scale": inputs.k_descale[0, 0].item(), "v_scale": inputs.v_descale[0, 0].item()}
            note += "; fp8 cache, k_scale / v_scale scalars (v_scale applied to the output after the kernel)"

        def fn():
            return wrapper.run(q, cache, out=out, **scales)

        return Prepared(fn, lambda o: o.reshape(inputs.q.shape), note)

    def _mla(self, case, inputs, backend):
        """kvflash's caches (pages, page, 1, d) are FlashInfer's (pages, page, d) without the head
        axis: views, no copy. FlashInfer's kv_indptr / kv_indices count pages; kv_len_arr keys."""
        wrapper = self._wrapper("BatchMLAPagedAttentionWrapper", backend)
        indptr, indices, _ = self._paged_indices(case, inputs)
        qo_indptr = torch.arange(case.batch + 1, dtype=torch.int32, device="cuda") * case.seqlen_q
        # One query row sees every key: FlashInfer's non-causal mode (SGLang's decode call).
        wrapper.plan(qo_indptr, indptr, indices, inputs.cache_seqlens, num_heads=case.heads,
                     head_dim_ckv=case.dv, head_dim_kpe=case.headdim, page_size=case.page_size,
                     causal=case.causal and case.seqlen_q > 1, sm_scale=case.softmax_scale,
                     q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16)
        ckv, kpe = inputs.derived("flashinfer_mla_caches",
                                  lambda: (inputs.v_cache.squeeze(2), inputs.k_cache.squeeze(2)))
        rows = case.batch * case.seqlen_q
        q_nope = inputs.qv.reshape(rows, case.heads, case.dv)
        q_pe = inputs.q.reshape(rows, case.heads, case.headdim)
        out = torch.empty_like(q_nope)

        def fn():
            return wrapper.run(q_nope, q_pe, ckv, kpe, out=out)

        return Prepared(fn, lambda o: o.reshape(case.batch, case.seqlen_q, case.heads, case.dv),
                        f"BatchMLAPagedAttentionWrapper backend {backend}, plan() outside timing")

    def _paged_prefill(self, case, inputs, backend):
        wrapper = self._wrapper("BatchPrefillWithPagedKVCacheWrapper", backend)
        indptr, indices, last = self._paged_indices(case, inputs)
        qo_indptr = torch.arange(case.batch + 1, dtype=torch.int32, device="cuda") * case.seqlen_q
        wrapper.plan(qo_indptr, indptr, indices, last, case.heads, case.heads_k, case.headdim, case.page_size,
                     causal=case.causal, q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16)
        return self._ragged_call(wrapper, case, inputs, (inputs.k_cache, inputs.v_cache), backend)

    def _dense_prefill(self, case, inputs, backend):
        wrapper = self._wrapper("BatchPrefillWithRaggedKVCacheWrapper", backend)
        qo_indptr = torch.arange(case.batch + 1, dtype=torch.int32, device="cuda") * case.seqlen_q
        kv_indptr = torch.arange(case.batch + 1, dtype=torch.int32, device="cuda") * case.seqlen_k
        # The all-fp8 call writes bf16, as FA3's (FlashInfer's default output type would be q's).
        wrapper.plan(qo_indptr, kv_indptr, case.heads, case.heads_k, case.headdim, causal=case.causal,
                     sm_scale=case.softmax_scale, q_data_type=inputs.q.dtype, kv_data_type=inputs.k_cache.dtype,
                     o_data_type=torch.bfloat16)
        flat = (case.batch * case.seqlen_k, case.heads_k, case.headdim)
        return self._ragged_call(wrapper, case, inputs, (inputs.k_cache.reshape(flat), inputs.v_cache.reshape(flat)),
                                 backend)

    def _ragged_call(self, wrapper, case, inputs, kv, backend):
        q = inputs.q.reshape(case.batch * case.seqlen_q, case.heads, case.headdim)
        out = torch.empty(q.shape, dtype=torch.bfloat16, device=q.device)
        paged = len(kv) == 2 and kv[0].dim() == 4
        note = f"backend {backend}, plan() outside timing"
        # The all-fp8 ragged run takes scale_q / scale_k / scale_v positionally (prefill.py,
        # BatchPrefillWithRaggedKVCacheWrapper.run's *args): the descales (FA3's kernel multiplies
        # by them), as scalars since they are per tensor (data.py).
        scales = ()
        if case.fp8_q:
            scales = tuple(d[0, 0].item() for d in (inputs.q_descale, inputs.k_descale, inputs.v_descale))
            note += "; e4m3 q/k/v with scale_q / scale_k / scale_v scalars, bf16 out"

        def fn():
            if paged:
                return wrapper.run(q, kv, out=out)
            return wrapper.run(q, kv[0], kv[1], *scales, out=out)

        return Prepared(fn, lambda o: o.reshape(inputs.q.shape), note)


class FlashAttention4(System):
    """flash_attn.cute (flash-attn-4): flash_attn_func on dense caches, flash_attn_varlen_func
    with page_table / seqused_k on paged ones. Kernels are compiled by the CuTe DSL on first call
    (counted in setup, not in the timing)."""

    name = "fa4"
    stage = 1

    def unavailable(self):
        if not self.cuda:
            return "FlashAttention-4 needs a CUDA device"
        try:
            from flash_attn.cute import flash_attn_func, flash_attn_varlen_func  # noqa: F401
        except Exception as e:  # noqa: BLE001
            return f"import flash_attn.cute failed: {describe(e)}"
        return None

    def prepare(self, case, inputs):
        from flash_attn.cute import flash_attn_func, flash_attn_varlen_func

        if case.is_mla or case.fp8:
            raise NotRun("MLA (qv) and fp8 rows are not wired for flash_attn.cute in this bench")
        q, k, v, causal = inputs.q, inputs.k_cache, inputs.v_cache, case.causal
        if case.page_size:
            seqused, table = inputs.cache_seqlens, inputs.page_table

            def fn():
                return flash_attn_varlen_func(q, k, v, seqused_k=seqused, page_table=table, causal=causal,
                                              max_seqlen_q=case.seqlen_q, max_seqlen_k=case.seqlen_k)
            note = f"flash_attn_varlen_func with page_table (page {case.page_size})"
        else:
            def fn():
                return flash_attn_func(q, k, v, causal=causal)
            note = "flash_attn_func"
        return Prepared(fn, lambda o: o[0] if isinstance(o, tuple) else o, note)
