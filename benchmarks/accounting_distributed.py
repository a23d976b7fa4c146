"""Fed-tSNE+ with distributed noise that survives the secure sum (issue 14): digits, FedDL landmarks, gradient rule.

Four noise recipes in the same run plan (everything else equal), at each ε:

  local     : every site adds its full σ_p (Gaussian, exact μ-GDP accountant) — private on its own
  gaussian  : continuous shares σ_p/√t through the SecAgg+ fixed-point codec (the earlier distributed mode)
  ddg       : distributed discrete Gaussian (Kairouz, Liu & Steinke, ICML 2021): clip, public rotation, randomized
              rounding, N_Z(0, σ²) per site, SecAgg+ mod 2^bits, KLS Prop. 14 accounting (worst over t..n survivors)
  skellam   : distributed Skellam (Agarwal, Kairouz & Liu, NeurIPS 2021), AKL's RDP bound

Data: sklearn's digits (1797 × 64) scaled to [0, 1] (τ_X = √64 = 8 is the public domain bound: nothing clipped),
split iid over the sites. FedDL (landmark_method feddl) with n_y landmarks, S rounds, Q = 1 step (gradient rule,
R = S releases), γ = 1/τ_X² (public), SecAgg+ in process, then the no-rows placement (nystrom local: each site places
its own records on the landmark map). Utility: CA-10NN of the final 2-D map (securefed.metrics.embedding_metrics).

Columns: ε target, recipe, ε reported by the run (ddg / skellam: the paper's bound; its ledger's dominating bound in
brackets), accountant, CA-10NN, wall seconds of the whole run, wrap-around probability bound per aggregation,
modulus bits of the integer sum (SecAgg+ words: at least 16), whether the sites sent clip counts in the clear.

Usage: PYTHONPATH=. OMP_NUM_THREADS=1 python benchmarks/accounting_distributed.py [--eps 1 4] [--sites 5] [--landmarks 50]
           [--rounds 20] [--seed 0] [--repeats 1] [--recipes local gaussian ddg skellam]
"""

import argparse
import json
import os
import platform
import time

import numpy as np

OUT = os.path.join(os.path.dirname(__file__), "results", "accounting_distributed.jsonl")


def plan_for(recipe: str, eps: float, a):
    from securefed.plan import RunPlan

    noise = "local" if recipe == "local" else "distributed"
    extra = {} if recipe == "local" else {"distributed_mechanism": recipe}
    return RunPlan.build(
        "api",
        method="tsne",
        landmark_method="feddl",
        nystrom="local",
        landmarks=a.landmarks,
        rounds=a.rounds,
        local_steps=1,
        rule="gradient",
        aggregation="secagg",
        epsilon=eps,
        clip_norm=8.0,
        noise=noise,
        audit_holdout=0.0,
        seed=a.seed,
        run_id=f"bench-{recipe}-{eps:g}",
        **extra,
    )


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--eps", nargs="+", type=float, default=[1.0, 4.0])
    ap.add_argument("--recipes", nargs="+", default=["local", "gaussian", "ddg", "skellam"])
    ap.add_argument("--sites", type=int, default=5)
    ap.add_argument("--landmarks", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="runs per row (the noise is secret: every run differs); CA-10NN and seconds are then mean ± sd",
    )
    ap.add_argument("--no-record", action="store_true")
    a = ap.parse_args()

    from sklearn.datasets import load_digits

    from securefed.data import partition
    from securefed.federation import run_in_process
    from securefed.metrics import embedding_metrics

    X, y = load_digits(return_X_y=True)
    X = X.astype(np.float64) / 16.0
    parts = partition(X, y, a.sites, "iid", random_state=a.seed)
    names = [f"site{i}" for i in range(a.sites)]
    machine = f"{os.cpu_count()}-core {platform.machine()}, Python {platform.python_version()}"
    print(
        f"digits {X.shape}, {a.sites} sites iid, n_y = {a.landmarks}, S = {a.rounds}, Q = 1, δ = 1e-5, seed {a.seed}, "
        f"{a.repeats} run(s) per row (mean ± sd; wall s: mean)"
    )
    print(
        "| ε target | recipe | ε reported (ledger bound) | accountant | CA-10NN | wall s | wrap prob. / sum | modulus bits "
        "| clip counts in the clear |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for eps in a.eps:
        for recipe in a.recipes:
            plan = plan_for(recipe, eps, a)
            cas, secs = [], []
            for _ in range(a.repeats):
                t0 = time.perf_counter()
                res = run_in_process(plan, [X[i] for i in parts], names=names)
                secs.append(time.perf_counter() - t0)
                E = np.vstack([res.embedding["coordinates"][n] for n in names])
                ys = np.concatenate([y[i] for i in parts])
                Xs = np.vstack([X[i] for i in parts])
                cas.append(embedding_metrics(Xs, E, ys, random_state=a.seed)["ca_10nn"])
            ca, dt = float(np.mean(cas)), float(np.mean(secs))
            ca_txt = f"{ca:.4f}" + (f" ± {np.std(cas, ddof=1):.4f}" if len(cas) > 1 else "")
            p = res.privacy
            integer = recipe in ("ddg", "skellam")
            eps_txt = f"{p['epsilon']:.5f}" + (f" ({p['epsilon_ledger']:.5f})" if integer else "")
            sent = "none" if integer else f"yes ({res.aggregation['clipped']} coords clipped)"
            acct = p["accountant"].split(":")[0] + (
                " (KLS Prop. 14)" if recipe == "ddg" else " (AKL)" if recipe == "skellam" else ""
            )
            wrap = f"{p['wrap_probability']:.2g}" if integer else "– (fixed point: clipped, counted)"
            bits = (
                f"{p['modulus_bits']} (SecAgg+ {p['secagg_modulus_bits']})"
                if integer
                else f"{plan.modulus_bits} (fixed point)"
            )
            print(
                f"| {eps:g} | {recipe} | {eps_txt} | {acct} | {ca_txt} | {dt:.1f} | {wrap} | {bits} | {sent} |",
                flush=True,
            )
            if not a.no_record:
                os.makedirs(os.path.dirname(OUT), exist_ok=True)
                with open(OUT, "a") as fh:
                    fh.write(
                        json.dumps(
                            {
                                "epsilon_target": eps,
                                "recipe": recipe,
                                "epsilon": p["epsilon"],
                                "epsilon_ledger": p.get("epsilon_ledger"),
                                "accountant": p["accountant"],
                                "ca10": float(ca),
                                "ca10_runs": [float(c) for c in cas],
                                "seconds": dt,
                                "wrap_probability": p.get("wrap_probability"),
                                "modulus_bits": p.get("modulus_bits"),
                                "sites": a.sites,
                                "landmarks": a.landmarks,
                                "rounds": a.rounds,
                                "seed": a.seed,
                                "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                                "machine": machine,
                            }
                        )
                        + "\n"
                    )


if __name__ == "__main__":
    main()
