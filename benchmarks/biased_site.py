"""What one site with fabricated records does to the default map (issue 25 item 6; BENCHMARKS §14e).

Digits, 10 iid sites, the default plan (cells through SecAgg+, the audit gate, the t-SNE placement), in process.
Site 0 sends uploads computed from fabricated records of its declared size instead of its own: ``mean`` — every
record at the centre of the public range (8, the middle of digits' 0–16 range); ``uniform`` — records
drawn uniformly in the public range; ``one-class`` — copies of one real record of class 0 with small noise. Reported:
CA-10NN and trustworthiness of the **honest** sites' records only (site 0's records excluded), the audit verdict,
against the run with site 0 honest. Every site's checks pass in every case: a fabricated record is a record — the
secure sums, the proofs and the disclosure checks bound what the coordinator learns, not what a site feeds in.

    OMP_NUM_THREADS=1 python benchmarks/biased_site.py [--seeds 0 1 2]
"""

import argparse
import time

import numpy as np


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", nargs="+", type=int, default=[0])
    a = ap.parse_args()
    from securefed import load_dataset, partition
    from securefed.federation.inprocess import run_in_process
    from securefed.metrics import embedding_metrics
    from securefed.plan import RunPlan

    ds = load_dataset("digits")
    print(f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    for seed in a.seeds:
        idx = partition(ds.X, ds.y, 10, "iid", random_state=seed)
        rng = np.random.default_rng(seed)
        n0 = len(idx[0])
        fakes = {"honest": ds.X[idx[0]],
                 "mean": np.full((n0, ds.X.shape[1]), 8.0),
                 "uniform": rng.uniform(0.0, 16.0, size=(n0, ds.X.shape[1])),
                 "one-class": np.clip(ds.X[np.flatnonzero(ds.y == 0)[0]] + rng.normal(0.0, 0.5, (n0, ds.X.shape[1])),
                                      0.0, 16.0)}
        honest_X = np.vstack([ds.X[i] for i in idx[1:]])
        honest_y = np.concatenate([ds.y[i] for i in idx[1:]])
        for name, X0 in fakes.items():
            plan = RunPlan.build("api", method="tsne", landmark_method="cells", value_bound=16.0, seed=seed,
                                 allow_audit_failure=True)
            res = run_in_process(plan, [X0] + [ds.X[i] for i in idx[1:]])
            coords = res.embedding["coordinates"]
            E = np.vstack([coords[k] for k in sorted(coords)][1:])
            m = embedding_metrics(honest_X, E, honest_y, random_state=0)
            print(f"seed {seed} site 0 {name:9s}: honest sites' CA-10NN {m['ca_10nn']:.4f} trust "
                  f"{m['trustworthiness']:.4f}; audit AUC {res.audit['mia']['auc']:.3f} "
                  f"({'pass' if res.audit['passed'] else 'fail'}); landmarks {len(res.landmarks)}")


if __name__ == "__main__":
    main()
