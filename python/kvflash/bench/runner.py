"""The suite loop: every (case, system) pair gets one row, whatever happens.

Systems run in stages, each a pass over the cases (regenerated from the same seed each time):
  stage 0  kvflash and SDPA: fast, no compilation; kvflash's output is the reference every peer
           is checked against (when kvflash fails on a case, the first peer that ran is); MLA and
           fp8-cache cases are checked against a float32 torch reference instead, kvflash included
  stage 1  FlexAttention (dense, paged) and FlashAttention-4: compiled per shape family
  stage 2  FlashInfer: its kernels JIT-build in background threads from the start of the run
Later stages compare against kvflash's output computed again, untimed. A global time budget bounds
the run; each stage leaves a share of it to the stages after it, and cases it leaves out are rows
"not run" with that reason. Cases run representative-first (cases.run_order), so a cut stage still
covers every group.
"""

import dataclasses
import time

import torch

from . import reference as float_ref
from .data import Inputs
from .system import NotRun, describe

# Errors after which the CUDA context is unusable: the run stops and the rest is "not run".
FATAL_CUDA_ERRORS = ("illegal memory access", "unspecified launch failure", "illegal instruction",
                     "misaligned address", "device-side assert")
TOLERANCE = 2e-2  # max |out - reference| for bf16 outputs of N(0,1) data (different summation orders)
# All-fp8 rows: FA3-style kernels (FlashInfer's fa3, FA3's own) round P to e4m3 (2^-4 relative)
# before P.V. A float64 emulation of that on these rows' data is off by up to 0.06 (a causal row's
# first queries, few keys: fp8 decode's 0.02 and the fp8 tests' 0.03 would call it a mismatch); a
# dropped descale is off by more than 0.2 (test_bench_driver.py).
FP8_QKV_TOLERANCE = 0.1
STAGE_SHARE = {1: 0.3, 2: 0.2}  # budget share kept for each later stage that has systems


@dataclasses.dataclass
class Row:
    case: object
    system: str
    status: str  # ok | mismatch | error | not run
    seconds: float = float("nan")
    reps: int = 0
    setup_s: float = float("nan")
    max_abs_diff: float = float("nan")
    reference: str = ""
    note: str = ""
    eager_s: float = float("nan")  # timing.Timer.host_work: kvflash's batch-1 decode rows on a GPU
    graph_s: float = float("nan")

    @property
    def ran(self):
        return self.status in ("ok", "mismatch")

    @property
    def host_s(self):
        """Host work of the eager call: eager minus graph replay (NaN when not measured)."""
        return self.eager_s - self.graph_s


def compare(out, reference):
    """(max |out - reference|, finite): outputs in kvflash's (b, s_q, h, d) layout."""
    out = out.float()
    finite = bool(torch.isfinite(out).all())
    diff = (out - reference.float()).abs().max().item() if out.shape == reference.shape else float("inf")
    return diff, finite


def tolerance(case):
    return FP8_QKV_TOLERANCE if case.fp8_q else TOLERANCE


class Suite:
    def __init__(self, cases, systems, timer, device, budget_s, not_run=None, seed=0, log=print,
                 on_row=None, stage_share=STAGE_SHARE, setup_share=0.3, on_stage=None):
        self.cases = cases  # in the order they are run
        self.systems = systems
        self.timer = timer
        self.device = device
        self.budget_s = budget_s
        self.deadline = time.perf_counter() + budget_s
        self.stage_share = stage_share
        # Compile / JIT time one system may spend over the run; past it, its remaining cases are
        # rows "not run" with that reason (so one peer's recompiles cannot eat another's time).
        self.setup_budget = budget_s * setup_share
        self.setup_used = {}
        self.broken = None  # the fatal error that ended the run, if any
        self.not_run = dict(not_run or {})
        self.seed = seed
        self.log = log
        self.on_row = on_row  # called with each timed row as it is made (partial results)
        # Called with the rows so far after each stage (a report of the stages done, which a run
        # killed in a later stage keeps).
        self.on_stage = on_stage
        self.rows = []

    def remaining(self):
        return self.deadline - time.perf_counter()

    def run(self):
        reasons = {s.name: self.not_run.get(s.name) or s.unavailable() for s in self.systems}
        for name, reason in reasons.items():
            if reason:
                self.log(f"[bench] {name}: not run: {reason}")
        for system in self.systems:
            if not reasons[system.name]:
                try:
                    system.start(self.cases)
                except Exception as e:  # noqa: BLE001 - the system is then reported as not run
                    reasons[system.name] = f"setup failed: {describe(e)}"
                    self.log(f"[bench] {system.name}: not run: {reasons[system.name]}")
        ready = [s for s in self.systems if not reasons[s.name]]
        stages = sorted({s.stage for s in ready})
        for stage in stages:
            systems = [s for s in ready if s.stage == stage]
            reserve = self.budget_s * sum(self.stage_share.get(later, 0.0) for later in stages if later > stage)
            for system in systems:
                waited = system.wait(self.remaining() - reserve - 60)  # a minute left to run its cases
                if waited:
                    self.log(f"[bench] {system.name}: {waited}")
            self._pass(systems, reference_timed=stage == 0, reserve=reserve)
            if self.on_stage and stage != stages[-1]:
                self.on_stage(list(self.rows))
        for system in self.systems:
            if reasons[system.name]:
                self.rows += [Row(c, system.name, "not run", note=reasons[system.name]) for c in self.cases]
        return self.rows

    def _pass(self, systems, reference_timed, reserve=0.0):
        if not systems:
            return
        for index, case in enumerate(self.cases):
            if self.broken:
                for c in self.cases[index:]:
                    self.rows += [Row(c, s.name, "not run", note=f"CUDA context lost: {self.broken}") for s in systems]
                return
            if self.remaining() <= reserve:
                for c in self.cases[index:]:
                    self.rows += [Row(c, s.name, "not run", note="suite time budget used up") for s in systems]
                self.log(f"[bench] time budget used up: {len(self.cases) - index} cases left for "
                         f"{', '.join(s.name for s in systems)}")
                return
            self._case(case, systems, reference_timed)

    def _case(self, case, systems, reference_timed):
        try:
            inputs = Inputs(case, self.device, seed=self.seed)
        except Exception as e:  # noqa: BLE001 - e.g. out of memory for the largest cases
            self.rows += [Row(case, s.name, "error", note=f"inputs: {describe(e)}") for s in systems]
            return
        try:
            timed_here = reference_timed and any(s.name == "kvflash" for s in systems)
            reference, ref_name = self._reference(case, inputs, timed_here)
            for system in systems:  # kvflash first (all_systems' order)
                row, out = self._run(system, case, inputs, reference, ref_name)
                self._emit(row)
                if reference is None and out is not None:
                    reference, ref_name = out, system.name
        finally:
            inputs.free()
            if self.device == "cuda" and not self.broken:
                torch.cuda.synchronize()
                torch.cuda.empty_cache()

    def _reference(self, case, inputs, timed_here):
        """(reference output, its name) before the case's systems run: the float32 reference for
        MLA / fp8 cases; otherwise kvflash's output, made untimed unless kvflash runs here."""
        if case.is_mla or case.fp8:
            try:
                return float_ref.float_reference(case, inputs), float_ref.NAME
            except Exception as e:  # noqa: BLE001 - e.g. out of memory: kvflash is the reference
                self.log(f"[bench] {case.name}: {float_ref.NAME} failed ({describe(e)}); checking against kvflash")
        return (None, "") if timed_here else self._untimed_reference(case, inputs)

    def _untimed_reference(self, case, inputs):
        """kvflash's output for stages after 0 (its timed row was made in stage 0)."""
        kvflash = next((s for s in self.systems if s.name == "kvflash"), None)
        if kvflash is None or "kvflash" in self.not_run or kvflash.unavailable():
            return None, ""
        try:
            return kvflash.prepare(case, inputs).fn().clone(), "kvflash"
        except Exception:  # noqa: BLE001 - the rows then say they are unchecked
            return None, ""

    def _run(self, system, case, inputs, reference, ref_name):
        """(row, output in kvflash's layout or None)."""
        row = Row(case, system.name, "error", reference=ref_name)
        out = None
        if self.setup_used.get(system.name, 0.0) > self.setup_budget:
            row.status = "not run"
            row.note = f"setup (compile / JIT) time budget of {self.setup_budget:.0f} s used up"
            return row, None
        start = time.perf_counter()
        try:
            prepared = system.prepare(case, inputs)
            row.note = prepared.note
            out, _ = self.timer.first_call(prepared.fn)
            row.setup_s = time.perf_counter() - start
            out = (prepared.to_common(out) if prepared.to_common else out).clone()
            self._check(row, out, reference)
            row.seconds, row.reps = self.timer.measure(prepared.fn)
            if system.name == "kvflash" and case.measures_host_work:
                self._host_work(row, prepared.fn)
        except NotRun as e:
            row.status, row.note = "not run", str(e)
        except Exception as e:  # noqa: BLE001 - every failure is a row with its reason
            row.status = "error"
            row.note = describe(e) + (f" ({row.note})" if row.note else "")
            if self.device == "cuda" and any(k in str(e) for k in FATAL_CUDA_ERRORS):
                self.broken = f"{system.name} on {case.name}: {describe(e)}"
        setup = row.setup_s if row.ran else time.perf_counter() - start
        self.setup_used[system.name] = self.setup_used.get(system.name, 0.0) + setup
        return row, (out if row.status == "ok" else None)

    def _host_work(self, row, fn):
        try:
            row.eager_s, row.graph_s = self.timer.host_work(fn)
        except Exception as e:  # noqa: BLE001 - the row keeps its timing; the note says why
            row.note += f"; host work not measured: {describe(e)}"

    def _check(self, row, out, reference):
        if reference is None:
            row.status = "ok"
            if row.system != "kvflash":
                row.note += "; unchecked: no reference output (kvflash did not run)"
            return
        if row.reference not in ("kvflash", float_ref.NAME):
            row.note += f"; checked against {row.reference} (kvflash did not run)"
        row.max_abs_diff, finite = compare(out, reference)
        row.status = "ok" if finite and row.max_abs_diff <= tolerance(row.case) else "mismatch"
        if not finite:
            row.note += "; output has NaN/Inf"

    def _emit(self, row):
        self.rows.append(row)
        if self.on_row:
            self.on_row(row)
        time_text = f"{row.seconds * 1e6:10.1f} us" if row.ran else " " * 13
        self.log(f"[bench] {row.case.name:<48} {row.system:<12} {row.status:<9} {time_text} {row.note}")
