"""Canary audit vs the claimed ε: empirical ε lower bounds with 200 and 1000 trial pairs.

Tiny data (3 sites × 12 records × 3 features, seed 7), DP FedDL with 4 landmarks, 3 rounds of gradient averaging
(R = 3 releases per site), τ_X = 3, γ = 1/τ_X², δ = 1e-5, exact accountant, secret (CSPRNG) noise unless said.
Configurations: claimed ε ∈ {0.5, 1, 2, 4}, "∞" (no noise at all), "σ/100" (claims ε = 1, adds σ/100) and
"seeded" (claims ε = 1, noise seeded from a public seed: the distinguishing game of issue 14).

For each configuration one set of 1000 pairs (each: one run with the canary, one without) is run; the 200-pair
bound uses the first 200 pairs of the same set. Threshold chosen on the first half of the pairs, bound on the
second half (so 100 / 500 test pairs), Clopper–Pearson 95 %. Columns:

* ``release`` — the likelihood-ratio statistic on the canary site's noisy releases (the audit's default);
* ``landmarks`` — black-box, final landmarks only;
* ``seeded`` — the seed-knowing attacker (regenerates the noise from the public seed);
* ``attainable`` — ε of the canary's μ̂ (what the release test tends to with unlimited trials);
* ``max`` — the bound of a perfect test on the test pairs (100 → 3.28, 500 → 4.90).

Usage: ``OMP_NUM_THREADS=1 PYTHONPATH=. python benchmarks/audits_canary.py [--trials 1000] [--small 200]``
(prints the table, then one JSON line per configuration).
"""

from __future__ import annotations

import argparse
import json
import math
import time
from typing import Any

import numpy as np

from securefed.audits.canary import run_canary_trials
from securefed.audits.stats import perfect_test_epsilon

CONFIGS: list[tuple[str, dict[str, Any]]] = [
    ("0.5", dict(epsilon=0.5, noise="secret")),
    ("1", dict(epsilon=1.0, noise="secret")),
    ("2", dict(epsilon=2.0, noise="secret")),
    ("4", dict(epsilon=4.0, noise="secret")),
    ("inf (no noise)", dict(epsilon=math.inf, noise="none")),
    ("1, sigma/100", dict(epsilon=1.0, noise="secret", sigma_scale=0.01)),
    ("1, seeded", dict(epsilon=1.0, noise="seeded")),
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=1000)
    ap.add_argument("--small", type=int, default=200)
    ap.add_argument("--only", nargs="*", help="configuration labels to run (default: all)")
    args = ap.parse_args()
    rng = np.random.default_rng(7)
    sites = [rng.normal(size=(12, 3)) for _ in range(3)]
    rows = []
    head = (
        f"{'claimed eps':>15} | {'release':>13} | {'landmarks':>13} | {'seeded':>13} | {'attainable':>10} | "
        f"{'max':>11} | {'Delta att.':>10} | {'wall s':>7}"
    )
    print(
        f"canary audit: 3 sites x 12 records x 3 features, 4 landmarks, R = 3 releases, delta = 1e-5, 95 %; "
        f"bounds as {args.small} / {args.trials} pairs",
        flush=True,
    )
    print(head)
    print("-" * len(head), flush=True)
    for label, kw in CONFIGS:
        if args.only and label not in args.only:
            continue
        t0 = time.perf_counter()
        tr = run_canary_trials(sites, tau_x=3.0, n_landmarks=4, rounds=3, trials=args.trials, random_state=11, **kw)
        wall = time.perf_counter() - t0
        res = {
            s: [tr.audit(s, trials=n) for n in (args.small, args.trials)] for s in ("release", "landmarks", "seeded")
        }
        att = res["release"][0].attainable_epsilon
        cells = " | ".join(
            f"{res[s][0].epsilon_lower_bound:5.2f} / {res[s][1].epsilon_lower_bound:5.2f}"
            for s in ("release", "landmarks", "seeded")
        )
        mx = f"{perfect_test_epsilon(args.small // 2, 0.95, 1e-5):4.2f} / {perfect_test_epsilon(args.trials - args.trials // 2, 0.95, 1e-5):4.2f}"
        verdict = res["release"][1].verdict
        print(
            f"{label:>15} | {cells} | {att:10.3g} | {mx:>11} | {tr.sensitivity_attained:10.2f} | {wall:7.0f}"
            f"   {verdict}"
            + ("" if kw.get("noise") != "seeded" else f" (seeded attacker: {res['seeded'][1].verdict})"),
            flush=True,
        )
        rows.append(
            {
                "config": label,
                "claimed_epsilon": tr.claimed_epsilon,
                "trials": args.trials,
                "wall_seconds": wall,
                "canary_mu": tr.canary_mu,
                "attainable_epsilon": att,
                "sensitivity_attained": tr.sensitivity_attained,
                "sensitivity_max": tr.sensitivity_max,
                "bounds": {
                    s: {
                        str(r.trials): {
                            "epsilon_lower_bound": r.epsilon_lower_bound,
                            "tpr": r.tpr,
                            "fpr": r.fpr,
                            "threshold": r.threshold,
                            "verdict": r.verdict,
                        }
                        for r in v
                    }
                    for s, v in res.items()
                },
            }
        )
    for row in rows:
        print(json.dumps(row))


if __name__ == "__main__":
    main()
