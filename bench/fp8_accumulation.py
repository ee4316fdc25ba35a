"""How precisely the GPU's fp8 (e4m3) tensor cores accumulate a dot product, measured.

The sm90 fp8 prefill kernel's scores come from QGMMA (e4m3 x e4m3 -> fp32 accumulator, k-steps of
32 added in the accumulator). Its LSEs missed the oracle's fp32-accumulation bound by about
(d / 32) x 2^-13 relative (BENCHMARKS.md, session 23), as if each k-step were added with ~13 bits.
This measures that directly on the same instructions through cuBLASLt: torch._scaled_mm on e4m3
inputs with use_fast_accum=True (the sum stays in the tensor cores, as in the kernel) and False
(cuBLASLt promotes partial sums to fp32 on the CUDA cores), against the exact sums (products of
e4m3 values and their sums over <= 1024 terms are exact in float64).

    python3 bench/fp8_accumulation.py            # on a GPU with fp8 tensor cores (sm_89+)

Prints, per depth K, the largest and median error of each mode relative to sum_k |a_k b_k| (the
bound the oracle scales its score tolerance by), also in bits (-log2).
"""

import math

import torch


def exact_products(a, b):
    """Exact float64 a @ b.T of e4m3 matrices (on the CPU)."""
    return a.cpu().double() @ b.cpu().double().T, a.cpu().double().abs() @ b.cpu().double().abs().T


def relative_errors(got, exact, bound):
    rel = ((got.cpu().double() - exact).abs() / bound.clamp_min(1e-300)).flatten()
    return rel.max().item(), rel.median().item()


def bits(x):
    return -math.log2(x) if x > 0 else float("inf")


def main():
    if not torch.cuda.is_available():
        raise SystemExit("fp8_accumulation.py: needs a CUDA GPU with fp8 tensor cores")
    torch.manual_seed(0)
    rows = cols = 256
    one = torch.tensor(1.0, device="cuda")
    print(f"{torch.cuda.get_device_name()}: relative error / sum|a b|, max and median (bits)")
    print(f"{'K':>5} {'fast accum max':>16} {'median':>16} {'promoted max':>16} {'median':>16}")
    for depth in (32, 64, 128, 256, 512, 1024):
        # N(0, 4) rounded to e4m3: products span many binades, as q.k's do.
        a = (2 * torch.randn(rows, depth, device="cuda")).to(torch.float8_e4m3fn)
        b = (2 * torch.randn(cols, depth, device="cuda")).to(torch.float8_e4m3fn)
        exact, bound = exact_products(a, b)
        cells = []
        for fast in (True, False):
            got = torch._scaled_mm(a, b.t(), scale_a=one, scale_b=one, out_dtype=torch.float32,
                                   use_fast_accum=fast)
            worst, median = relative_errors(got, exact, bound)
            cells += [f"{worst:.2e} ({bits(worst):4.1f})", f"{median:.2e} ({bits(median):4.1f})"]
        print(f"{depth:>5} " + " ".join(f"{c:>16}" for c in cells))


if __name__ == "__main__":
    main()
