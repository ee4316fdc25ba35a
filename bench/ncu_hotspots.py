"""Where a kernel's time goes, from Nsight Compute's source view: the SASS instructions and loops
holding the most warp-stall samples, with their top stall reasons.

On the GPU machine (a kernel built with -lineinfo, as the project's CMake builds them):

    ncu --kernel-name regex:prefill_kernel --launch-count 1 --set full --import-source yes \\
        -o /tmp/r build-gpu/kvflash bench --device cuda --context none --prefill 512 ...
    ncu -i /tmp/r.ncu-rep --page source --csv --print-source sass > src.csv

then here: `python3 bench/ncu_hotspots.py src.csv [--top 25]`. Session 15 found the epilogue's
row-store loop this way (30% of the sm90 prefill kernel's samples at 32 prompts of 512 tokens).
"""

import argparse
import csv
import re
import sys

SAMPLES = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"


def number(text):
    """A CSV cell as a number (ncu writes thousands separators; empty cells are 0)."""
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def read_source(path):
    """The per-instruction rows of ncu's `--page source --csv --print-source sass` output:
    (address, source text, samples, executed, {stall reason: samples})."""
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    header_at = next(i for i, row in enumerate(rows) if SAMPLES in row and "Source" in row)
    header = rows[header_at]
    col = {name: i for i, name in enumerate(header)}
    reasons = [h for h in header if h.startswith("stall_") and "(Not" not in h]
    out = []
    for row in rows[header_at + 1:]:
        if len(row) < len(header):
            continue
        stalls = {h[len("stall_"):]: number(row[col[h]]) for h in reasons}
        out.append((int(row[col["Address"]], 16), row[col["Source"]].strip(), number(row[col[SAMPLES]]),
                    number(row[col[EXECUTED]]), stalls))
    return out


def loops(instructions):
    """(first, last) index pairs of the listing's loop bodies: each branch back to an earlier
    instruction's address. An mbarrier wait branches back to its retry code, which the compiler
    may place far away: such "loops" can span most of a kernel, so read the innermost first."""
    index = {address: i for i, (address, _, _, _, _) in enumerate(instructions)}
    bodies = []
    for last, (_, text, _, _, _) in enumerate(instructions):
        match = re.search(r"\bBRA\b.*?0x([0-9a-f]+)", text)
        first = index.get(int(match.group(1), 16)) if match else None
        if first is not None and first < last:
            bodies.append((first, last))
    return bodies


def top_reasons(stalls, count=2):
    ranked = sorted(stalls.items(), key=lambda kv: -kv[1])[:count]
    return ", ".join(f"{name} {value:.0f}" for name, value in ranked if value > 0)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("csv", help="ncu --page source --csv --print-source sass output")
    parser.add_argument("--top", type=int, default=20, help="instructions to list")
    args = parser.parse_args(argv)
    instructions = read_source(args.csv)
    total = sum(s for _, _, s, _, _ in instructions) or 1.0
    executed = sum(e for _, _, _, e, _ in instructions) or 1.0
    print(f"{len(instructions)} SASS instructions, {total:.0f} stall samples, {executed:.0f} executed (warp level)")
    print(f"\ntop {args.top} instructions by samples:")
    ranked = sorted(range(len(instructions)), key=lambda i: -instructions[i][2])[: args.top]
    for i in sorted(ranked):
        _, text, samples, count, stalls = instructions[i]
        print(f"  {i:6d} {100 * samples / total:5.1f}%  exec {count:10.0f}  {text[:56]:56s}  {top_reasons(stalls)}")
    print("\nloops holding >= 2% of the samples (innermost first):")
    bodies = sorted(loops(instructions), key=lambda b: b[1] - b[0])
    for first, last in bodies:
        body = instructions[first:last + 1]
        share = sum(s for _, _, s, _, _ in body) / total
        if share >= 0.02:
            ran = sum(e for _, _, _, e, _ in body) / executed
            print(f"  {first:6d}-{last:<6d} {last - first + 1:5d} instructions  {100 * share:5.1f}% of samples, "
                  f"{100 * ran:5.1f}% of executed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
