"""The benchmark driver (python -m kvflash.bench) on the CPU: case generation and filtering, the
suite loop's rows for systems that agree, disagree, fail or cannot take a case, and the CSV /
markdown / plot writers. Timings here mean nothing; the structure is what is tested."""

import csv
import dataclasses
import math
import os

import pytest

torch = pytest.importorskip("torch")

from kvflash.bench import __main__ as cli  # noqa: E402
from kvflash.bench import cases as suites  # noqa: E402
from kvflash.bench import reference as float_ref  # noqa: E402
from kvflash.bench.data import Inputs  # noqa: E402
from kvflash.bench.peers import Kvflash, KvflashBatchInvariant  # noqa: E402
from kvflash.bench.peers_external import FlashAttention4, FlashInfer  # noqa: E402
from kvflash.bench.system import NotRun, Prepared, System  # noqa: E402
from kvflash.bench.peers_torch import Sdpa  # noqa: E402
from kvflash.bench.report import Results, markdown, write_csv  # noqa: E402
from kvflash.bench.runner import FP8_QKV_TOLERANCE, Suite  # noqa: E402
from kvflash.bench.timing import Timer  # noqa: E402


class Shifted(System):
    """SDPA's output plus 0.1: must be reported as a mismatch."""

    name = "shifted"

    def prepare(self, case, inputs):
        inner = Sdpa("cpu", "math").prepare(case, inputs)
        return Prepared(lambda: inner.fn() + 0.1, inner.to_common, "shifted by 0.1")


class Broken(System):
    name = "broken"

    def prepare(self, case, inputs):
        if case.kind == "decode":
            raise NotRun("no decode here")
        raise ValueError("planted failure")


class LateSdpa(Sdpa):
    """SDPA in stage 2 with a background start(), as FlashInfer runs."""

    stage = 2

    def __init__(self):
        super().__init__("cpu", "math")
        self.name = "late-sdpa"
        self.started_with = None

    def start(self, cases):
        self.started_with = len(cases)


def test_suites_have_the_issue_shapes():
    default = suites.default_suite(9 << 30)
    names = [c.name for c in default]
    assert len(names) == len(set(names))
    decode = [c for c in default if c.kind == "decode"]
    assert {c.batch for c in decode} == {1, 8, 32, 64, 128}
    assert {c.seqlen_k for c in decode} == {1024, 8192, 32768, 131072}
    assert {c.seqlen_q for c in decode} == {1, 4}
    assert {(c.heads, c.heads_k) for c in decode} == {(32, 8), (8, 1), (64, 8)}
    assert all(c.kv_bytes() <= 9 << 30 for c in decode)
    prefill = [c for c in default if c.kind == "prefill"]
    assert {c.headdim for c in prefill} == {64, 128, 256}
    assert {c.page_size for c in prefill} == {0, 16, 64}
    assert all(c.batch * c.seqlen_q == 16384 for c in prefill)
    assert any(c.kind == "extend" and c.seqlen_k > 4 * c.seqlen_q for c in default)
    assert len(suites.quick_suite(9 << 30)) < len(default) // 4


def test_case_arithmetic_and_filter():
    causal = suites.Case("extend", 1, 4, 10, 2, 1, 8, True, 16)
    # bottom-right causal: rows see 7, 8, 9, 10 keys
    assert causal.visible_pairs() == 7 + 8 + 9 + 10
    assert causal.flops() == 4 * 2 * 8 * 34
    full = suites.Case("prefill", 2, 5, 5, 2, 2, 8, False, 0)
    assert full.visible_pairs() == 25
    assert full.kv_bytes() == 2 * 2 * 5 * 2 * 8 * 2
    tiny = suites.tiny_suite()
    assert [c.kind for c in suites.select(tiny, "^decode")] == ["decode"] * 4
    assert len(suites.select(tiny, "decode b2 q4,extend")) == 2
    assert suites.select(tiny, "") == tiny


def test_suite_rows_checks_and_outputs(tmp_path):
    cases = suites.select(suites.tiny_suite(), "decode b2 q4,prefill b1 q64 k64 .* p16")
    systems = [Kvflash("cpu"), KvflashBatchInvariant("cpu"), Sdpa("cpu", "math"), Shifted("cpu"), Broken("cpu")]
    timer = Timer("cpu", min_reps=2, max_reps=2, warmup=0)
    rows = Suite(cases, systems, timer, "cpu", budget_s=60, not_run={"fa4": "x"}, log=lambda _: None).run()
    status = {(r.case.kind, r.system): r for r in rows}
    assert len(rows) == len(cases) * len(systems)
    for kind in ("decode", "prefill"):
        assert status[(kind, "kvflash")].status == "ok"
        assert status[(kind, "kvflash-bi")].status == "ok", status[(kind, "kvflash-bi")].note
        assert status[(kind, "kvflash-bi")].max_abs_diff <= 0.02
        assert status[(kind, "sdpa-math")].status == "ok", status[(kind, "sdpa-math")].note
        assert status[(kind, "sdpa-math")].max_abs_diff <= 0.02
        assert status[(kind, "shifted")].status == "mismatch"
        assert status[(kind, "shifted")].max_abs_diff > 0.05
    assert status[("decode", "broken")].status == "not run"
    assert status[("prefill", "broken")].status == "error"
    assert "planted failure" in status[("prefill", "broken")].note

    meta = dict(commit="abc", gpu="cpu", date="today", versions="v", command="cmd", method="m", build=[],
                copy_bytes_per_s=1e10, matmul_flops_per_s=1e11, copy_what="c", matmul_what="m")
    results = Results(rows, meta)
    path = tmp_path / "results.csv"
    write_csv(results, path)
    with open(path) as f:
        table = list(csv.DictReader(f))
    assert len(table) == len(rows)
    kv_row = next(r for r in table if r["system"] == "kvflash" and r["kind"] == "decode")
    # The shifted peer disagreed: never the best; kvflash-bi is kvflash itself: never a peer.
    assert kv_row["best_peer"] == "sdpa-math"
    assert float(kv_row["gb_per_s"]) > 0 and kv_row["commit"] == "abc"
    text = markdown(results)
    assert "### decode" in text and "### prefill" in text
    assert "**MISMATCH**" in text and "planted failure" in text and "no decode here" in text
    for row in rows:  # kvflash's batch-invariant variant, even the fastest, is not a peer
        if row.system == "kvflash-bi":
            row.seconds = 1e-12
    assert all(Results(rows, meta).best_peer(c)[0] == "sdpa-math" for c in cases)


def test_cli_dry_run_writes_everything(tmp_path, capsys):
    out = tmp_path / "out"
    code = cli.main(["--device", "cpu", "--tiny", "--cases", "decode b2 q1", "--peers", "kvflash,sdpa-math,flashinfer",
                     "--not-run", "fa4=wheel too large", "--min-reps", "2", "--max-reps", "2", "--out", str(out)])
    assert code == 0
    files = set(os.listdir(out))
    assert {"results.csv", "results.md"} <= files
    printed = capsys.readouterr().out
    assert "| decode b2 q1 k96 h4/2 d64 causal p16 |" in printed
    assert "FlashInfer needs a CUDA device" in printed
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return
    assert "decode.png" in files


def test_results_name_the_kvflash_switches_of_the_run(tmp_path, monkeypatch):
    for name in [k for k in os.environ if k.startswith("KVFLASH_")]:  # CI sets some of its own
        monkeypatch.delenv(name)
    monkeypatch.setenv("KVFLASH_SM90_FP8", "1")
    monkeypatch.setenv("KVFLASH_COMMIT", "abc1234")
    out = tmp_path / "out"
    code = cli.main(["--device", "cpu", "--tiny", "--cases", "decode b2 q1", "--peers", "kvflash",
                     "--min-reps", "2", "--max-reps", "2", "--out", str(out)])
    assert code == 0
    text = (out / "results.md").read_text()
    assert "`KVFLASH_SM90_FP8=1 python -m kvflash.bench" in text
    assert "KVFLASH_COMMIT=" not in text


def test_peers_list_keeps_kvflash():
    names = [s.name for s in cli.select_systems(cli.parse_args(["--device", "cpu", "--peers", "sdpa-math"]))]
    assert names == ["kvflash", "sdpa-math"]


def test_cli_list_and_bad_peer(capsys):
    assert cli.main(["--list", "--quick"]) == 0
    assert "cases" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        cli.main(["--device", "cpu", "--tiny", "--peers", "nonesuch"])


def test_stages_reference_and_budget():
    cases = suites.select(suites.tiny_suite(), "decode b2 q1,extend")
    late = LateSdpa()
    timer = Timer("cpu", min_reps=2, max_reps=2, warmup=0)
    rows = Suite(suites.run_order(cases), [Kvflash("cpu"), late], timer, "cpu", budget_s=60, log=lambda _: None).run()
    assert late.started_with == len(cases)
    late_rows = [r for r in rows if r.system == "late-sdpa"]
    assert [r.status for r in late_rows] == ["ok", "ok"]
    assert all(r.reference == "kvflash" and r.max_abs_diff <= 0.02 for r in late_rows)
    assert rows.index(late_rows[0]) > max(rows.index(r) for r in rows if r.system == "kvflash")

    # After each stage but the last, the rows so far (the CLI writes its report from them).
    reports = []
    Suite(suites.run_order(cases), [Kvflash("cpu"), LateSdpa()], timer, "cpu", budget_s=60, log=lambda _: None,
          on_stage=reports.append).run()
    assert [{r.system for r in rows} for rows in reports] == [{"kvflash"}]
    assert len(reports[0]) == len(cases)

    starved = Suite(cases, [Kvflash("cpu"), late], timer, "cpu", budget_s=0, log=lambda _: None).run()
    assert {r.status for r in starved} == {"not run"}
    assert all("time budget" in r.note for r in starved)


def test_run_order_puts_one_case_of_each_group_first():
    cases = suites.default_suite(9 << 30)
    ordered = suites.run_order(cases)
    assert sorted(ordered, key=cases.index) == cases
    groups = list(dict.fromkeys(c.group for c in cases))
    assert [c.group for c in ordered[:len(groups)]] == groups


def test_host_work_columns_empty_on_the_cpu_and_filled_when_measured(tmp_path):
    """Host work of an eager call (eager minus graph replay) is measured for kvflash's batch-1
    decode rows on a GPU only: on the CPU the row runs, its host_us cell is empty and the
    markdown says so; a measured row fills the CSV columns and the markdown table."""
    cases = suites.select(suites.tiny_suite(), "decode b1 q1 .* dense")
    assert len(cases) == 1 and cases[0].measures_host_work
    assert cases[0].group.endswith("dense")  # plotted apart from the paged rows
    timer = Timer("cpu", min_reps=2, max_reps=2, warmup=0)
    assert all(math.isnan(x) for x in timer.host_work(lambda: None))
    rows = Suite(cases, [Kvflash("cpu"), Sdpa("cpu", "math")], timer, "cpu", budget_s=60, log=lambda _: None).run()
    assert [r.status for r in rows] == ["ok", "ok"]
    meta = dict(commit="abc", gpu="cpu", date="today", versions="v", command="cmd", method="m", build=[],
                copy_bytes_per_s=1e10, matmul_flops_per_s=1e11, copy_what="c", matmul_what="m")

    def written(rows):
        results = Results(rows, meta)
        path = tmp_path / "results.csv"
        write_csv(results, path)
        with open(path) as f:
            return list(csv.DictReader(f)), markdown(results)

    table, text = written(rows)
    assert {"host_us", "eager_us", "graph_us"} <= set(table[0])
    assert all(r["host_us"] == "" for r in table)
    assert "### Host work of an eager kvflash call" in text
    assert "- not measured (1 batch-1 decode rows; CUDA only)" in text

    rows[0].eager_s, rows[0].graph_s = 40e-6, 25e-6  # as a GPU run fills them
    table, text = written(rows)
    kv_row = next(r for r in table if r["system"] == "kvflash")
    assert (kv_row["host_us"], kv_row["eager_us"], kv_row["graph_us"]) == ("15.00", "40.00", "25.00")
    assert "| decode b1 q1 k64 h4/2 d64 causal dense | 40.0 | 25.0 | 15.0 |" in text


# --- MLA (issue 16) and fp8 KV cache (issue 15) rows ---------------------------------------

META = dict(commit="abc", gpu="cpu", date="today", versions="v", command="cmd", method="m", build=[],
            copy_bytes_per_s=1e10, matmul_flops_per_s=1e11, copy_what="c", matmul_what="m")


class KvflashOnlyQv(Kvflash):
    """kvflash scoring with qv.v alone (drops MLA's rotary term): must disagree with the reference."""

    name = "only-qv"

    def prepare(self, case, inputs):
        return self._prepared(case, inputs, "only_qv", only_qv=True)


class KvflashUnitVDescale(System):
    """kvflash reading the fp8 values without their descale: must disagree with the reference."""

    name = "unit-v-descale"

    def prepare(self, case, inputs):
        from kvflash.flash_attn_interface import flash_attn_with_kvcache

        ones = torch.ones_like(inputs.v_descale)
        return Prepared(lambda: flash_attn_with_kvcache(
            inputs.q, inputs.k_cache, inputs.v_cache, cache_seqlens=inputs.cache_seqlens,
            page_table=inputs.page_table, causal=True, k_descale=inputs.k_descale, v_descale=ones))


def test_mla_and_fp8_cases_in_the_suites():
    default = [c.name for c in suites.default_suite(9 << 30)]
    for name in ["mla b64 q1 k8192 h16/1 d64/512 causal p64", "mla b64 q1 k8192 h16/1 d64/512 causal p1",
                 "mla b128 q1 k8192 h128/1 d64/512 causal p64", "decode b64 q1 k8192 h32/8 d128 causal p16 fp8",
                 "decode b1 q1 k8192 h32/8 d128 causal p16 fp8"]:
        assert name in default
    # The bf16 rows keep their names (committed results are compared by name).
    assert "decode b64 q1 k8192 h32/8 d128 causal p16" in default
    quick = [c.name for c in suites.quick_suite(9 << 30)]
    assert [n for n in quick if n.startswith("mla")] == ["mla b64 q1 k8192 h16/1 d64/512 causal p64"]
    tiny = suites.tiny_suite()
    assert [c.name for c in tiny if c.is_mla] == ["mla b2 q1 k80 h4/1 d64/512 causal p16"]
    assert [c.name for c in tiny if c.fp8] == ["decode b3 q1 k80 h4/2 d64 causal p16 fp8",
                                              "prefill b1 q64 k64 h2/2 d64 full dense fp8_qkv"]
    # The MLA cases obey the cache budget like the decode ones.
    assert not [c for c in suites.default_suite(1 << 29) if c.is_mla]
    # fp8 rows are their own plot group and not issue 14's host-work rows.
    fp8_b1 = next(c for c in suites.default_suite(9 << 30) if c.fp8 and c.batch == 1)
    assert fp8_b1.group.endswith("fp8") and not fp8_b1.measures_host_work


def test_mla_and_fp8_bytes_and_flops():
    """The issues' figures: MLA cache bytes b.s_k.(512 + 64).2 and FLOP 2.b.h.s_q.s_k.(576 + 512);
    fp8 cache bytes 2.b.s_k.h_k.d at one byte."""
    small = suites.Case("mla", 64, 1, 8192, 16, 1, 64, True, 64, headdim_v=512)
    large = suites.Case("mla", 128, 1, 8192, 128, 1, 64, True, 64, headdim_v=512)
    for c in (small, large):
        assert c.kv_bytes() == c.batch * 8192 * (512 + 64) * 2
        assert c.flops() == 2 * c.batch * c.heads * 1 * 8192 * (576 + 512)
        assert c.bytes_moved() == c.kv_bytes() + c.batch * c.heads * (64 + 512 + 512) * 2  # q, qv, out
        assert c.softmax_scale == pytest.approx(576 ** -0.5)
        assert c.dv == 512 and c.score_dim == 576
    assert small.memory_bound and not large.memory_bound
    fp8 = suites.Case("decode", 64, 1, 8192, 32, 8, 128, True, 16, kv_dtype="fp8")
    bf16 = suites.Case("decode", 64, 1, 8192, 32, 8, 128, True, 16)
    assert fp8.kv_bytes() == 2 * 64 * 8192 * 8 * 128 * 1 == bf16.kv_bytes() // 2
    assert fp8.flops() == bf16.flops() and fp8.memory_bound
    assert fp8.softmax_scale == pytest.approx(128 ** -0.5)


def test_float_reference_matches_kvflash_and_reads_the_descales():
    for case in [c for c in suites.tiny_suite() if c.is_mla or c.fp8]:
        inputs = Inputs(case, "cpu")
        ref = float_ref.float_reference(case, inputs)
        assert ref.dtype == torch.float32 and ref.shape == (case.batch, case.seqlen_q, case.heads, case.dv)
        out = Kvflash("cpu").prepare(case, inputs).fn()
        assert out.shape == ref.shape
        assert (out.float() - ref).abs().max().item() < 5e-3
    fp8 = next(c for c in suites.tiny_suite() if c.fp8)
    inputs = Inputs(fp8, "cpu")
    assert inputs.k_cache.dtype == torch.float8_e4m3fn and inputs.v_cache.dtype == torch.float8_e4m3fn
    assert inputs.k_descale.shape == (fp8.batch, fp8.heads_k) and inputs.k_descale.dtype == torch.float32
    assert inputs.k_descale.unique().numel() == 1 and inputs.v_descale.unique().numel() == 1  # per tensor
    assert not torch.equal(inputs.k_descale, inputs.v_descale)


def test_float_reference_in_blocks_of_query_rows(monkeypatch):
    """Blocks of 5 query rows (the 16k rows' would be 1k) give the one-block output, causal mask
    included."""
    case = next(c for c in suites.tiny_suite() if c.kind == "prefill" and c.causal and not c.page_size)
    inputs = Inputs(case, "cpu")
    whole = float_ref.float_reference(case, inputs)
    monkeypatch.setattr(float_ref, "SCORE_BYTES", 4 * case.batch * case.heads * case.seqlen_k * 5)
    assert torch.allclose(float_ref.float_reference(case, inputs), whole, atol=1e-6, rtol=0)


def test_mla_and_fp8_rows_on_the_cpu():
    """kvflash (and its batch-invariant mode) agree with the float32 reference; SDPA's math backend
    runs MLA as [qv|q] attention and refuses the fp8 cache; systems that drop MLA's rotary term or
    a descale disagree; the CUDA peers are not run, never an error."""
    cases = [c for c in suites.tiny_suite() if c.is_mla or c.fp8]
    systems = [Kvflash("cpu"), KvflashBatchInvariant("cpu"), Sdpa("cpu", "math"), KvflashOnlyQv("cpu"),
               KvflashUnitVDescale("cpu"), FlashInfer("cpu"), FlashAttention4("cpu")]
    timer = Timer("cpu", min_reps=2, max_reps=2, warmup=0)
    rows = Suite(cases, systems, timer, "cpu", budget_s=60, log=lambda _: None).run()
    assert len(rows) == len(cases) * len(systems)
    row = {(r.case.kind, r.system): r for r in rows}
    for kind in ("mla", "decode"):
        for system in ("kvflash", "kvflash-bi"):
            r = row[(kind, system)]
            assert r.status == "ok", r.note
            assert r.reference == float_ref.NAME and math.isfinite(r.max_abs_diff) and r.max_abs_diff < 5e-3
            assert "kvflash did not run" not in r.note
        for system in ("flashinfer", "fa4"):
            assert row[(kind, system)].status == "not run" and "CUDA" in row[(kind, system)].note
    assert row[("mla", "sdpa-math")].status == "ok" and row[("mla", "sdpa-math")].max_abs_diff < 0.02
    assert "[qv|q]" in row[("mla", "sdpa-math")].note
    assert row[("decode", "sdpa-math")].status == "not run" and "fp8" in row[("decode", "sdpa-math")].note
    assert row[("mla", "only-qv")].status == "mismatch" and row[("mla", "only-qv")].max_abs_diff > 0.05
    assert row[("decode", "unit-v-descale")].status == "mismatch"
    assert row[("decode", "unit-v-descale")].max_abs_diff > 0.05

    results = Results(rows, META)
    mla_case = next(c for c in cases if c.is_mla)
    kv = results.by_case[mla_case]["kvflash"]
    gbps, tflops, _ = results.figure(kv)
    assert gbps == pytest.approx(mla_case.bytes_moved() / kv.seconds / 1e9)
    assert tflops == pytest.approx(mla_case.flops() / kv.seconds / 1e12)
    assert results.best_peer(mla_case)[0] == "sdpa-math"  # only-qv disagreed: never the best
    text = markdown(results)
    assert "### mla" in text and "| mla b2 q1 k80 h4/1 d64/512 causal p16 |" in text


def test_cli_dry_run_mla_and_fp8_columns(tmp_path):
    out = tmp_path / "out"
    code = cli.main(["--device", "cpu", "--tiny", "--cases", "^mla,fp8$", "--peers", "kvflash,sdpa-math,flashinfer",
                     "--min-reps", "2", "--max-reps", "2", "--out", str(out), "--no-plots"])
    assert code == 0
    with open(out / "results.csv") as f:
        table = list(csv.DictReader(f))
    kv = {r["kind"]: r for r in table if r["system"] == "kvflash"}
    assert set(kv) == {"mla", "decode"}
    assert (kv["mla"]["headdim"], kv["mla"]["headdim_v"], kv["mla"]["kv_dtype"]) == ("64", "512", "bf16")
    assert (kv["decode"]["headdim_v"], kv["decode"]["kv_dtype"]) == ("64", "fp8")
    for r in kv.values():
        assert r["status"] == "ok" and r["reference"] == float_ref.NAME and float(r["max_abs_diff"]) < 5e-3


# --- FA3's all-fp8 prefill (issue 15) -------------------------------------------------------

class KvflashUnitQDescale(System):
    """kvflash's all-fp8 call with q read without its descale: must disagree with the reference."""

    name = "unit-q-descale"

    def prepare(self, case, inputs):
        inner = Kvflash("cpu").prepare(case, inputs)
        inputs.q_descale.fill_(1.0)  # after the reference was made from the true descale
        return inner


def test_all_fp8_prefill_cases_in_the_suites():
    """The issue's shape (16k d128, both masks) and 2k d128, 16k d64 / d256 full, each beside its
    bf16 twin; FLOPs are bf16 prefill's, K/V and q one byte, the output bf16; plotted apart."""
    default = suites.default_suite(9 << 30)
    fp8 = [c for c in default if c.fp8_q]
    assert [c.name for c in fp8] == [
        "prefill b8 q2048 k2048 h16/16 d128 causal dense fp8_qkv",
        "prefill b1 q16384 k16384 h16/16 d128 causal dense fp8_qkv",
        "prefill b8 q2048 k2048 h16/16 d128 full dense fp8_qkv",
        "prefill b1 q16384 k16384 h16/16 d128 full dense fp8_qkv",
        "prefill b1 q16384 k16384 h32/32 d64 full dense fp8_qkv",
        "prefill b1 q16384 k16384 h8/8 d256 full dense fp8_qkv"]
    for case in fp8:
        twin = dataclasses.replace(case, kv_dtype="bf16")
        assert twin in default and case.fp8 and not twin.fp8_q
        assert case.flops() == twin.flops() and not case.memory_bound
        assert case.kv_bytes() == twin.kv_bytes() // 2
        q_bytes = case.batch * case.seqlen_q * case.heads * case.headdim
        assert case.bytes_moved() == twin.bytes_moved() - twin.kv_bytes() // 2 - q_bytes
        assert case.group == twin.group + " fp8_qkv" and not case.measures_host_work
    quick = suites.quick_suite(9 << 30)
    quick_fp8 = [c for c in quick if c.fp8_q]
    assert [c.name for c in quick_fp8] == ["prefill b2 q8192 k8192 h16/16 d128 full dense fp8_qkv"]
    assert dataclasses.replace(quick_fp8[0], kv_dtype="bf16") in quick
    assert suites.select(default, "fp8_qkv") == fp8 and not suites.select(fp8, "fp8$")


@pytest.mark.parametrize("causal", [False, True])
def test_all_fp8_prefill_on_the_cpu_matches_a_float64_reference(causal):
    """kvflash's all-fp8 call (e4m3 q / k / v with their descales) writes bf16 that agrees with
    the float64 reference (tests/python/reference.py) of the dequantised inputs, within the fp8
    tolerance and bf16's rounding; reading q without its descale is a mismatch."""
    from reference import reference_kvcache

    case = dataclasses.replace(next(c for c in suites.tiny_suite() if c.fp8_q), causal=causal)
    inputs = Inputs(case, "cpu")
    assert inputs.q.dtype == inputs.k_cache.dtype == inputs.v_cache.dtype == torch.float8_e4m3fn
    assert inputs.q_descale.shape == (case.batch, case.heads_k) and inputs.q_descale.dtype == torch.float32
    assert len({inputs.q_descale[0, 0].item(), inputs.k_descale[0, 0].item(), inputs.v_descale[0, 0].item()}) == 3

    def dequantised(t, descale):  # (b, s, h_k or h, d) float64 times the (b, h_k) descale
        x = t.double().reshape(case.batch, t.shape[1], case.heads_k, -1, case.headdim)
        return (x * descale.double()[:, None, :, None, None]).reshape(t.shape).numpy()

    want, *_ = reference_kvcache(dequantised(inputs.q, inputs.q_descale),
                                 dequantised(inputs.k_cache, inputs.k_descale),
                                 dequantised(inputs.v_cache, inputs.v_descale),
                                 cache_seqlens=inputs.cache_seqlens.numpy(), softmax_scale=case.softmax_scale,
                                 causal=causal)
    out = Kvflash("cpu").prepare(case, inputs).fn()
    assert out.dtype == torch.bfloat16 and out.shape == inputs.q.shape
    diff = (out.double() - torch.from_numpy(want)).abs().max().item()
    assert diff <= FP8_QKV_TOLERANCE
    assert diff < 1e-2  # the CPU backend keeps P in bf16 (contract 5.8): bf16's rounding only

    timer = Timer("cpu", min_reps=2, max_reps=2, warmup=0)
    rows = Suite([case], [Kvflash("cpu"), KvflashBatchInvariant("cpu"), KvflashUnitQDescale("cpu")], timer, "cpu",
                 budget_s=60, log=lambda _: None).run()
    row = {r.system: r for r in rows}
    for system in ("kvflash", "kvflash-bi"):
        assert row[system].status == "ok" and row[system].reference == float_ref.NAME
        assert row[system].max_abs_diff < 1e-2
    assert row["unit-q-descale"].status == "mismatch" and row["unit-q-descale"].max_abs_diff > 2 * FP8_QKV_TOLERANCE


def test_all_fp8_rows_peers_and_report(tmp_path):
    """On the all-fp8 tiny row SDPA and FlexAttention say why they do not run, FlashInfer needs
    CUDA; the CSV keeps kv_dtype fp8_qkv and the markdown sets kvflash's fp8 TFLOP/s beside its
    bf16 twin's."""
    out = tmp_path / "out"
    code = cli.main(["--device", "cpu", "--tiny", "--cases", "prefill b1 q64 k64 h2/2 d64 full dense",
                     "--peers", "kvflash,sdpa-math,flex,flashinfer", "--min-reps", "2", "--max-reps", "2",
                     "--out", str(out), "--no-plots"])
    assert code == 0
    with open(out / "results.csv") as f:
        table = {(r["case"], r["system"]): r for r in csv.DictReader(f)}
    name = "prefill b1 q64 k64 h2/2 d64 full dense fp8_qkv"
    kv = table[(name, "kvflash")]
    assert (kv["status"], kv["kv_dtype"], kv["reference"]) == ("ok", "fp8_qkv", float_ref.NAME)
    assert float(kv["tflop_per_s"]) > 0
    assert table[(name, "sdpa-math")]["status"] == "not run"
    assert "cudnn frontend" in table[(name, "sdpa-math")]["note"]
    assert "_scaled_dot_product_attention_quantized" in table[(name, "sdpa-math")]["note"]
    assert table[(name, "flex")]["status"] == "not run" and "descales" in table[(name, "flex")]["note"]
    assert table[(name, "flashinfer")]["status"] == "not run" and "CUDA" in table[(name, "flashinfer")]["note"]
    text = (out / "results.md").read_text()
    assert "### kvflash all-fp8 vs bf16 prefill (same shape, this run)" in text
    assert f"| {name} | " in text.split("### kvflash all-fp8 vs bf16")[1]
