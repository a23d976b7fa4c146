"""σ needed for the same (ε, δ): paper Theorem 5 vs exact μ-GDP (and PRV/RDP), and Δ: Theorem 5 vs min bound.

Usage: python benchmarks/accounting_sigma_ratio.py
Prints markdown tables (figures computed, nothing hard-coded).
"""

import argparse
import math
import time

from securefed.accounting import calibrate_noise_multiplier, epsilon_from_noise, gradient_sensitivity


def main():
    t0 = time.perf_counter()
    print("## Noise multiplier z = σ/Δ for a target (ε, δ): paper Theorem 5 vs exact μ-GDP\n")
    print("| δ | releases R | ε | z paper | z exact | ratio paper/exact | z PRV | z RDP |")
    print("|---|---|---|---|---|---|---|---|")
    ratios = []
    for delta in (1e-5, 1e-6):
        for R in (1, 10, 60, 300, 1000):
            for eps in (0.5, 1.0, 2.0, 4.0, 8.0):
                zp = calibrate_noise_multiplier(eps, delta, R, "paper")
                ze = calibrate_noise_multiplier(eps, delta, R, "exact")
                zr = calibrate_noise_multiplier(eps, delta, R, "rdp")
                zprv = calibrate_noise_multiplier(eps, delta, R, "prv") if R in (10, 300) else float("nan")
                ratios.append(zp / ze)
                print(f"| {delta:g} | {R} | {eps:g} | {zp:.4g} | {ze:.4g} | {zp / ze:.3f} | {zprv:.4g} | {zr:.4g} |")
    print(f"\nratio paper/exact over the grid: min {min(ratios):.3f}, max {max(ratios):.3f}\n")

    print("## ε at a fixed noise multiplier (δ = 1e-5): paper bound vs accountants\n")
    print("| z | R | q | exact | PRV | RDP | paper |")
    print("|---|---|---|---|---|---|---|")
    for z, R, q in ((5.0, 300, 1.0), (20.0, 300, 1.0), (50.0, 1000, 1.0), (1.0, 1000, 0.01), (2.0, 3000, 0.05)):
        ex = epsilon_from_noise(z, R, 1e-5, "exact") if q == 1.0 else float("nan")
        print(
            f"| {z:g} | {R} | {q:g} | {ex:.4g} | {epsilon_from_noise(z, R, 1e-5, 'prv', q):.4g} | "
            f"{epsilon_from_noise(z, R, 1e-5, 'rdp', q):.4g} | {epsilon_from_noise(z, R, 1e-5, 'paper', q):.4g} |"
        )

    print("\n## Sensitivity Δ: Theorem 5 vs the bounds securefed uses (τ_Y = √n_y τ_X, Υ = τ_X + τ_Y)\n")
    print("| n_p | n_y | γ | τ_X | Theorem 5 | kernel shape | Lipschitz | min | Theorem5/min |")
    print("|---|---|---|---|---|---|---|---|---|")
    for n, ny, tau in ((500, 300, 10.0), (500, 100, 10.0), (5000, 300, 10.0), (500, 300, 1.0)):
        for gfac in (1.0, 0.1):
            g = gfac / tau**2
            s = gradient_sensitivity(n, ny, g, tau, math.sqrt(ny) * tau)
            print(
                f"| {n} | {ny} | {g:.3g} | {tau:g} | {s.theorem5:.3g} | {s.kernel_shape:.3g} | {s.lipschitz:.3g} | "
                f"{s.value:.3g} ({s.rule}) | {s.theorem5 / s.value:.1f} |"
            )
    print(f"\n(total {time.perf_counter() - t0:.1f} s)")


if __name__ == "__main__":
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    main()
