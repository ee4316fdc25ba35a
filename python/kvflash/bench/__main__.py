"""python -m kvflash.bench: kvflash against its peers, side by side in one run.

    python -m kvflash.bench                        # the default suite (< 10 min on an H200)
    python -m kvflash.bench --quick                # about a minute
    python -m kvflash.bench --cases 'decode b64,prefill .* d128' --peers kvflash,flashinfer
    python -m kvflash.bench --list                 # the cases, nothing run
    python -m kvflash.bench --device cpu --tiny    # dry run on the CPU (structure, checks, outputs)

Writes results.csv, results.md, decode.png and prefill.png into --out (default
bench/results/<date>) and prints the markdown last; results.csv and results.md are written after
each stage of systems too, so a run killed in a later stage keeps the stages done. kvflash-bi is
kvflash in batch-invariant mode (its cost), never counted as a peer.
"""

import argparse
import datetime
import os
import platform
import shlex
import subprocess
import sys
import time
import traceback

from . import cases as suites


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m kvflash.bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    size = p.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="a one-minute subset")
    size.add_argument("--tiny", action="store_true", help="minute shapes (CPU dry runs, tests)")
    p.add_argument("--cases", default="", help="comma-separated regular expressions on case names")
    p.add_argument("--peers", default="",
                   help="comma-separated peers to run (default: all); kvflash, the reference, always runs")
    p.add_argument("--not-run", action="append", default=[], metavar="SYSTEM=REASON",
                   help="report SYSTEM as not run for REASON (e.g. its wheels could not be carried)")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--out", default="", help="output folder (default bench/results/<UTC date>)")
    p.add_argument("--budget", type=float, default=540.0, help="seconds for the whole run, setup included")
    p.add_argument("--min-reps", type=int, default=20)
    p.add_argument("--max-reps", type=int, default=50)
    p.add_argument("--max-kv-gib", type=float, default=9.0, help="largest decode K/V cache (GiB)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--list", action="store_true", help="print the cases and exit")
    return p.parse_args(argv)


def select_cases(args):
    max_kv = int(args.max_kv_gib * (1 << 30))
    if args.tiny:
        cases = suites.tiny_suite()
    elif args.quick:
        cases = suites.quick_suite(max_kv)
    else:
        cases = suites.default_suite(max_kv)
    return suites.select(cases, args.cases)


def select_systems(args):
    from .peers import all_systems

    systems = all_systems(args.device)
    if args.peers:
        wanted = {p.strip() for p in args.peers.split(",") if p.strip()}
        unknown = wanted - {s.name for s in systems}
        if unknown:
            raise SystemExit(f"unknown systems {sorted(unknown)}; known: {[s.name for s in systems]}")
        # kvflash is every row's reference (the peers' outputs are compared with its own), so a
        # list that names only peers still runs it: `--peers flashinfer` once gave rows without it.
        systems = [s for s in systems if s.name in wanted or s.name == "kvflash"]
    return systems


def parse_not_run(items):
    reasons = {}
    for item in items:
        name, _, reason = item.partition("=")
        reasons[name.strip()] = reason.strip() or "not run (no reason given)"
    return reasons


def git_commit():
    """Short commit, '+dirty' when the tree has changes; KVFLASH_COMMIT overrides (copies
    without .git)."""
    if os.environ.get("KVFLASH_COMMIT"):
        return os.environ["KVFLASH_COMMIT"]
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        commit = subprocess.run(["git", "-C", here, "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", here, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return commit + ("+dirty" if dirty else "")
    except Exception:  # noqa: BLE001 - no git or not a checkout
        return "unknown"


def switches():
    """kvflash's KVFLASH_* switches set for this run (kernel opt-ins / opt-outs change the rows),
    as `NAME=value ` prefixes of the command; KVFLASH_COMMIT only names the commit."""
    return "".join(f"{k}={shlex.quote(v)} " for k, v in sorted(os.environ.items())
                   if k.startswith("KVFLASH_") and k != "KVFLASH_COMMIT")


def versions():
    import torch

    found = [f"python {platform.python_version()}", f"torch {torch.__version__}"]
    for module, label in [("kvflash", "kvflash"), ("flashinfer", "flashinfer"), ("flash_attn.cute", "flash-attn-4"),
                          ("cutlass", "cutlass-dsl")]:
        try:
            mod = __import__(module, fromlist=["_"])
            found.append(f"{label} {getattr(mod, '__version__', '?')}")
        except Exception:  # noqa: BLE001 - absent peers are listed as such
            found.append(f"{label} absent")
    return ", ".join(found)


def device_name(device):
    import torch

    if device == "cuda":
        return torch.cuda.get_device_name()
    return f"CPU ({platform.processor() or platform.machine()}, {os.cpu_count()} threads)"


def main(argv=None):
    started = time.perf_counter()
    args = parse_args(sys.argv[1:] if argv is None else argv)
    cases = select_cases(args)
    if args.list:
        for case in cases:
            print(case.name)
        print(f"{len(cases)} cases")
        return 0
    if not cases:
        raise SystemExit("no case matches --cases")
    import torch

    from .report import Results, markdown, write_csv, write_plots
    from .runner import Suite
    from .timing import Timer, measure_ceilings

    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch sees no GPU (use --device cpu for a dry run)")
    date = datetime.datetime.now(datetime.timezone.utc)
    out_dir = args.out or os.path.join("bench", "results", date.strftime("%Y-%m-%d"))
    os.makedirs(out_dir, exist_ok=True)
    systems = select_systems(args)
    timer = Timer(args.device, min_reps=args.min_reps, max_reps=args.max_reps)
    print(f"[bench] {len(cases)} cases x {len(systems)} systems on {device_name(args.device)}; budget {args.budget:.0f} s",
          flush=True)
    try:
        ceilings = measure_ceilings(args.device)
    except Exception as e:  # noqa: BLE001 - the suite still runs; % of ceiling stays empty
        nan = float("nan")
        ceilings = {"copy_bytes_per_s": nan, "matmul_flops_per_s": nan, "copy_what": f"failed: {e}",
                    "matmul_what": f"failed: {e}"}
    # The budget counts from the start of the process; keep a few seconds for the reports.
    budget = args.budget - (time.perf_counter() - started) - 10
    partial = PartialRows(os.path.join(out_dir, "rows.partial.csv"))
    meta = dict(ceilings, commit=git_commit(), gpu=device_name(args.device),
                date=date.strftime("%Y-%m-%d %H:%M UTC"), versions=versions(),
                command=switches() + "python -m kvflash.bench " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:])),
                method=method_text(args), build=[])

    def report(rows):
        """results.csv and results.md of the rows so far (after each stage, then of the whole run)."""
        meta["build"] = [line for system in systems for line in system.setup_report()]
        results = Results(rows, meta, order=cases)
        write_csv(results, os.path.join(out_dir, "results.csv"))
        text = markdown(results)
        with open(os.path.join(out_dir, "results.md"), "w") as f:
            f.write(text + "\n")
        return results, text

    suite = Suite(suites.run_order(cases), systems, timer, args.device, budget, parse_not_run(args.not_run), args.seed,
                  log=lambda line: print(line, flush=True), on_row=partial.add, on_stage=report)
    try:
        rows = suite.run()
    except Exception:  # noqa: BLE001 - a driver bug must not lose the rows measured so far
        traceback.print_exc()
        rows = suite.rows
        print("[bench] the suite stopped early (traceback above); reporting the rows made so far", flush=True)
    results, text = report(rows)
    try:
        plots = [] if args.no_plots else write_plots(results, out_dir)
    except Exception:  # noqa: BLE001 - the CSV and markdown are written; say why the plots are not
        traceback.print_exc()
        plots = []
    partial.remove()
    print(f"[bench] wrote {out_dir}: results.csv, results.md" + "".join(f", {os.path.basename(p)}" for p in plots))
    print(text)
    return 0


class PartialRows:
    """Each timed row appended as it is made, so that a run killed from outside still leaves its
    measurements; removed once results.csv is written."""

    def __init__(self, path):
        self.path = path
        with open(path, "w") as f:
            f.write("case,system,status,time_us,max_abs_diff,note\n")

    def add(self, row):
        with open(self.path, "a") as f:
            note = row.note.replace(",", ";").replace("\n", " ")
            f.write(f"{row.case.name},{row.system},{row.status},{row.seconds * 1e6:.2f},{row.max_abs_diff:.4g},{note}\n")

    def remove(self):
        if os.path.exists(self.path):
            os.remove(self.path)


def method_text(args):
    if args.device == "cpu":
        return "CPU dry run: wall-clock per call, median (not a benchmark)."
    return (f"CUDA events around each call; before each call a 256 MiB buffer is written (L2 flushed) and a "
            f"sleep kernel hides the host's launch time; median of {args.min_reps}-{args.max_reps} calls after "
            "a first call (compile / JIT, reported as setup) and 2 warm-ups. Inputs: bf16 N(0,1), pages in "
            "random order (fp8 rows: the cache, and q on FA3's all-fp8 prefill rows, N(0,1) / descale rounded "
            "to e4m3, per-tensor descales; all-fp8 rows write bf16); every "
            "peer gets the same data and its output is compared with kvflash's (MLA and fp8 rows: every "
            "system's with a float32 torch reference). Systems "
            "run in stages over the cases (kvflash and SDPA; then the compiled FlexAttention / FA4; then "
            "FlashInfer once its kernels are built), each stage regenerating the same inputs; a time budget "
            "bounds the run and what it leaves out is listed as not run. kvflash's batch-1 bf16 decode rows also "
            "give the host work of an eager call (its own section).")


if __name__ == "__main__":
    sys.exit(main())
