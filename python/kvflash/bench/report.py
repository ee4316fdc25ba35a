"""Results: results.csv (one row per case and system), results.md (tables per kind, failures),
decode.png (K/V bandwidth vs context, one line per system, one panel per batch; fp8-cache rows in
panels of their own) and prefill.png (TFLOP/s vs sequence length, one line per system, one panel
per head dim / mask / layout, all-fp8 rows apart), each stamped with the commit and the GPU. MLA
rows (one context each) are in the tables only; all-fp8 prefill rows also in a table beside their
bf16 twins."""

import csv
import dataclasses
import math
import os

from .runner import FP8_QKV_TOLERANCE, TOLERANCE

CSV_FIELDS = [
    "commit", "gpu", "kind", "case", "batch", "seqlen_q", "seqlen_k", "heads", "heads_k", "headdim",
    "headdim_v", "causal", "page_size", "kv_dtype", "system", "status", "time_us", "gb_per_s", "tflop_per_s",
    "pct_of_ceiling", "time_vs_best_peer", "best_peer", "max_abs_diff", "reference", "reps", "setup_s",
    "host_us", "eager_us", "graph_us", "note",
]


def _finite(x):
    return x is not None and not (isinstance(x, float) and math.isnan(x))


class Results:
    """The rows with their derived figures, per case."""

    def __init__(self, rows, meta, order=None):
        self.rows = rows
        self.meta = meta
        ran = set(r.case for r in rows)
        self.cases = [c for c in order if c in ran] if order else list(dict.fromkeys(r.case for r in rows))
        self.systems = list(dict.fromkeys(r.system for r in rows))
        self.by_case = {c: {r.system: r for r in rows if r.case == c} for c in self.cases}

    def figure(self, row):
        """(GB/s, TFLOP/s, % of the ceiling that bounds the case's kind) or Nones."""
        if not row.ran or not _finite(row.seconds) or row.seconds <= 0:
            return None, None, None
        case = row.case
        gbps = case.bytes_moved() / row.seconds / 1e9
        tflops = case.flops() / row.seconds / 1e12
        if case.memory_bound:
            pct = 100 * case.bytes_moved() / row.seconds / self.meta["copy_bytes_per_s"]
        else:
            pct = 100 * case.flops() / row.seconds / self.meta["matmul_flops_per_s"]
        return gbps, tflops, pct

    def best_peer(self, case):
        """The fastest peer (not kvflash nor its variants, such as kvflash-bi) whose output agreed:
        (name, seconds) or (None, None)."""
        ok = [r for name, r in self.by_case[case].items() if not name.startswith("kvflash") and r.status == "ok"
              and _finite(r.seconds)]
        if not ok:
            return None, None
        best = min(ok, key=lambda r: r.seconds)
        return best.system, best.seconds

    def csv_rows(self):
        for row in self.rows:
            case = row.case
            gbps, tflops, pct = self.figure(row)
            peer, peer_s = self.best_peer(case)
            ratio = row.seconds / peer_s if peer_s and row.ran else None
            yield {
                "commit": self.meta["commit"], "gpu": self.meta["gpu"], "kind": case.kind, "case": case.name,
                "batch": case.batch, "seqlen_q": case.seqlen_q, "seqlen_k": case.seqlen_k, "heads": case.heads,
                "heads_k": case.heads_k, "headdim": case.headdim, "headdim_v": case.dv,
                "causal": int(case.causal), "page_size": case.page_size, "kv_dtype": case.kv_dtype,
                "system": row.system, "status": row.status,
                "time_us": _fmt(row.seconds * 1e6 if row.ran else None, 2),
                "gb_per_s": _g(gbps), "tflop_per_s": _g(tflops), "pct_of_ceiling": _fmt(pct, 1),
                "time_vs_best_peer": _fmt(ratio, 3), "best_peer": peer or "",
                "max_abs_diff": _g(row.max_abs_diff), "reference": row.reference, "reps": row.reps,
                "setup_s": _fmt(row.setup_s, 2), "host_us": _fmt(row.host_s * 1e6, 2),
                "eager_us": _fmt(row.eager_s * 1e6, 2), "graph_us": _fmt(row.graph_s * 1e6, 2), "note": row.note,
            }


def _fmt(x, digits):
    return "" if not _finite(x) else f"{x:.{digits}f}"


def _g(x):
    return "" if not _finite(x) else f"{x:.4g}"


def write_csv(results, path):
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_FIELDS)
        writer.writeheader()
        for row in results.csv_rows():
            writer.writerow(row)


# --- markdown ------------------------------------------------------------------------------

def _sig(x):
    """Three significant digits, no exponent for the usual ranges."""
    return f"{x:.3g}" if abs(x) < 1000 else f"{x:.0f}"


def _cell(results, row):
    if row is None:
        return "-"
    if row.status in ("error", "not run"):
        return row.status
    gbps, tflops, _ = results.figure(row)
    figure = f"{_sig(gbps)} GB/s" if row.case.memory_bound else f"{_sig(tflops)} TF/s"
    flag = " **MISMATCH**" if row.status == "mismatch" else ""
    return f"{row.seconds * 1e6:.1f} us, {figure}{flag}"


def _kind_table(results, kind):
    cases = [c for c in results.cases if c.kind == kind]
    if not cases:
        return []
    peers = [s for s in results.systems if s != "kvflash"]
    head = ["case", "kvflash", "% ceiling", "best peer", "kvflash speedup"] + peers
    lines = [f"### {kind}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for case in cases:
        rows = results.by_case[case]
        kv = rows.get("kvflash")
        _, _, pct = results.figure(kv) if kv else (None, None, None)
        peer, peer_s = results.best_peer(case)
        speedup = f"{peer_s / kv.seconds:.2f}x" if peer_s and kv and kv.ran else "-"
        cells = [case.name, _cell(results, kv), _fmt(pct, 1) or "-", peer or "-", speedup]
        cells += [_cell(results, rows.get(p)) for p in peers]
        lines.append("| " + " | ".join(cells) + " |")
    return lines + [""]


def _failures(results):
    """Each (system, status, reason) once, with how many cases it covers."""
    counts = {}
    for row in results.rows:
        if row.status in ("error", "not run", "mismatch"):
            reason = row.note if row.status != "mismatch" else f"max |diff| {row.max_abs_diff:.3g} vs {row.reference}"
            key = (row.system, row.status, reason)
            counts.setdefault(key, []).append(row.case.name)
    lines = []
    for (system, status, reason), names in counts.items():
        example = names[0] + (f" and {len(names) - 1} more" if len(names) > 1 else "")
        lines.append(f"- **{system}** {status} ({len(names)} cases, e.g. {example}): {reason}")
    return lines


def _notes(results):
    """What each peer was given when it differs from kvflash's inputs (one line per note)."""
    seen = {}
    for row in results.rows:
        if row.ran and row.note:
            seen.setdefault((row.system, row.note), 0)
            seen[(row.system, row.note)] += 1
    return [f"- {system} ({n} cases): {note}" for (system, note), n in seen.items()]


def markdown(results):
    m = results.meta
    lines = [
        f"## kvflash vs peers: {m['gpu']}, commit {m['commit']}, {m['date']}", "",
        f"Command: `{m['command']}`. Versions: {m['versions']}.", "",
        f"Ceilings measured in this run: copy **{_sig(m['copy_bytes_per_s'] / 1e9)} GB/s** ({m['copy_what']}), "
        f"matmul **{_sig(m['matmul_flops_per_s'] / 1e12)} TFLOP/s** ({m['matmul_what']}). "
        "% ceiling: decode = bytes moved (K/V cache in its dtype + q + out) per second / copy bandwidth; "
        "prefill / extend = attention FLOPs (4·b·h·d per visible query-key pair, causal bottom-right) "
        "per second / matmul (all-fp8 rows too: bf16's, and fp8 tensor cores peak at twice it); "
        "MLA (d 64 + d_v 512 scores, d_v 512 values) by the bound of the row: "
        "bytes (latent + rotary cache + q, qv, out) below 206 FLOP per cache byte, else FLOPs "
        "(2·b·h·(576 + 512) per pair).",
        "",
        f"Method: {m['method']}", "",
        "Cells: median time per call and GB/s (decode, memory-bound MLA) or TFLOP/s (prefill, extend, "
        "compute-bound MLA). kvflash speedup = best peer's time / kvflash's time (> 1: kvflash faster); "
        f"the best peer is the fastest whose output agreed with the reference (max |diff| <= {TOLERANCE}; "
        f"{FP8_QKV_TOLERANCE} on all-fp8 rows, whose P FA3-style kernels round to e4m3): kvflash's output, "
        "or for MLA and fp8 rows a float32 torch reference that kvflash is checked against too.", "",
    ]
    for kind in ("decode", "mla", "prefill", "extend"):
        lines += _kind_table(results, kind)
    lines += _fp8_twin_table(results)
    lines += _host_work_table(results)
    failures = _failures(results)
    lines += ["### Not run, errors and disagreements", ""] + (failures or ["- none"]) + [""]
    lines += ["### What the peers were given", ""] + (_notes(results) or ["- nothing to note"]) + [""]
    lines += ["### Setup time (compile / JIT / plan + first call, outside the timings)", ""]
    lines += _setup_totals(results) + [f"- {line}" for line in m.get("build", [])] + [""]
    return "\n".join(lines)


def _fp8_twin_table(results):
    """Issue 15: kvflash's TFLOP/s on each all-fp8 prefill row against its bf16 twin's (the same
    shape in the same run), where both agreed with their reference."""
    lines = []
    for case in (c for c in results.cases if c.fp8_q):
        twin = dataclasses.replace(case, kv_dtype="bf16")
        rows = [results.by_case.get(c, {}).get("kvflash") for c in (case, twin)]
        if all(r is not None and r.status == "ok" for r in rows):
            fp8, bf16 = (results.figure(r)[1] for r in rows)
            lines.append(f"| {case.name} | {_sig(fp8)} | {_sig(bf16)} | {fp8 / bf16:.2f}x |")
    if not lines:
        return []
    return ["### kvflash all-fp8 vs bf16 prefill (same shape, this run)", "",
            "| case | fp8 TF/s | bf16 TF/s | fp8 / bf16 |", "|---|---|---|---|"] + lines + [""]


def _host_work_table(results):
    """kvflash's host work per eager call (timing.Timer.host_work), where it was measured."""
    lines = ["### Host work of an eager kvflash call", "",
             "The timed call issued with the GPU idle, eagerly and replayed from a CUDA graph (medians); "
             "host us = eager - graph: what the eager call costs the host beyond a graph launch.", ""]
    rows = [r for r in results.rows if r.system == "kvflash" and r.case.measures_host_work]
    measured = [r for r in rows if _finite(r.host_s)]
    if not measured:
        return lines + [f"- not measured ({len(rows)} batch-1 decode rows; CUDA only)", ""]
    lines += ["| case | eager us | graph us | host us |", "|---|---|---|---|"]
    for r in measured:
        lines.append(f"| {r.case.name} | {r.eager_s * 1e6:.1f} | {r.graph_s * 1e6:.1f} | {r.host_s * 1e6:.1f} |")
    return lines + [""]


def _setup_totals(results):
    totals = {}
    for row in results.rows:
        if _finite(row.setup_s):
            count, seconds = totals.get(row.system, (0, 0.0))
            totals[row.system] = (count + 1, seconds + row.setup_s)
    return [f"- {system}: {seconds:.1f} s over {count} cases" for system, (count, seconds) in totals.items()]


# --- plots ---------------------------------------------------------------------------------

def _series(results, cases, system, x_of, y_of):
    points = []
    for case in cases:
        row = results.by_case[case].get(system)
        if row is not None and row.status == "ok":
            y = y_of(row)
            if y is not None:
                points.append((x_of(case), y))
    return sorted(points)


PEER_COLORS = ["tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown", "tab:pink", "tab:olive"]


def _panel(ax, results, cases, x_of, y_of, title, ceiling=None):
    peers = [s for s in results.systems if s != "kvflash"]
    for system in results.systems:
        points = _series(results, cases, system, x_of, y_of)
        if points:
            xs, ys = zip(*points)
            # One colour per system in every panel of every figure; kvflash black and thick.
            color = "black" if system == "kvflash" else PEER_COLORS[peers.index(system) % len(PEER_COLORS)]
            ax.plot(xs, ys, marker="o", markersize=3, label=system, color=color,
                    linewidth=2.5 if system == "kvflash" else 1.2)
    if ceiling and math.isfinite(ceiling):
        ax.axhline(ceiling, linestyle="--", color="grey", linewidth=0.8, label="ceiling")
    ax.set_ylim(bottom=0)
    ax.set_xscale("log", base=2)
    ax.set_title(title, fontsize=8)
    ax.tick_params(labelsize=7)


def _grid(plt, groups, title, stamp):
    columns = min(4, len(groups))
    rows = -(-len(groups) // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(4 * columns, 3 * rows), squeeze=False)
    for ax in axes.flat[len(groups):]:
        ax.axis("off")
    fig.suptitle(f"{title}\n{stamp}", fontsize=9)
    return fig, axes.flat


def write_plots(results, out_dir):
    """decode.png and prefill.png; returns the paths written (none if matplotlib is missing)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception:  # noqa: BLE001 - plots are optional; the CSV and markdown carry the data
        return []
    m = results.meta
    stamp = f"{m['gpu']}, commit {m['commit']}, {m['date']}"
    written = []
    specs = [
        ("decode", ("decode",), lambda c: c.seqlen_k, lambda r: results.figure(r)[0], "context (tokens)",
         "GB/s", m["copy_bytes_per_s"] / 1e9, "decode: K/V bandwidth vs context"),
        ("prefill", ("prefill", "extend"), lambda c: c.seqlen_q, lambda r: results.figure(r)[1],
         "query tokens per sequence", "TFLOP/s", m["matmul_flops_per_s"] / 1e12,
         "prefill / extend: TFLOP/s vs sequence length"),
    ]
    for name, kinds, x_of, y_of, xlabel, ylabel, ceiling, title in specs:
        cases = [c for c in results.cases if c.kind in kinds]
        groups = list(dict.fromkeys(c.group for c in cases))
        if not groups:
            continue
        fig, axes = _grid(plt, groups, title, stamp)
        for ax, group in zip(axes, groups):
            _panel(ax, results, [c for c in cases if c.group == group], x_of, y_of, group, ceiling)
            ax.set_xlabel(xlabel, fontsize=7)
            ax.set_ylabel(ylabel, fontsize=7)
        legend = {}
        for ax in fig.axes:
            for handle, label in zip(*ax.get_legend_handles_labels()):
                legend.setdefault(label, handle)
        fig.legend(list(legend.values()), list(legend.keys()), loc="lower center", ncol=len(legend), fontsize=7)
        fig.tight_layout(rect=(0, 0.05, 1, 0.93))
        path = os.path.join(out_dir, f"{name}.png")
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written
