"""Distributed GTM (Zhang & Cheung) vs centralized GTM: map quality against local granularity.

Run:  OMP_NUM_THREADS=1 python benchmarks/peers_gtm.py

Data, each split at random into three equal sites (Zhang & Cheung §3):
* S-curve: sklearn make_s_curve(2000, noise=0.05); labels = 6 equal-width bins of the position t
  along the S (the paper's six coloured parts).
* oil-flow stand-in: the oil-flow data (Bishop & James 1993) is not shipped by any installable
  package, so a GENERATED stand-in is used: 1000 points, 12-D, 3 classes; each class is a noisy
  2-D manifold (u ~ U[0,1]², 8 smooth features of u) mapped into 12-D by a shared random linear map
  plus a class-specific twist and offset. It mimics the shape of the task, not the real data.
Model: 40×40 latent grid (1600 points, as the paper), 8×8 RBFs, alpha=1e-3, 40 EM iterations.
Metrics (securefed.metrics.embedding_metrics on posterior-mean projections): trustworthiness (5-NN),
CA-10NN and NMI of k-means on the labels.
"""

import argparse
import json
import time

import numpy as np
from sklearn.datasets import make_s_curve

from securefed.metrics import embedding_metrics
from securefed.peers import CentralizedGTM, DistributedGTM

KW = dict(grid=(40, 40), n_rbf=(8, 8), alpha=1e-3, iters=40)


def oil_standin(n=1000, seed=0):
    rng = np.random.default_rng(seed)
    A = rng.normal(size=(8, 12)) / np.sqrt(8)
    X, y = [], []
    for c in range(3):
        m = n // 3 + (1 if c < n % 3 else 0)
        u = rng.uniform(size=(m, 2))
        tw = 1.0 + 0.7 * c
        F = np.column_stack(
            [
                u[:, 0],
                u[:, 1],
                np.sin(3 * tw * u[:, 0]),
                np.cos(3 * u[:, 1]),
                u[:, 0] * u[:, 1],
                u[:, 0] ** 2,
                tw * u[:, 1] ** 2,
                np.sin(u[:, 0] + tw * u[:, 1]),
            ]
        )
        off = rng.normal(scale=0.8, size=12)
        X.append(F @ A + off + rng.normal(scale=0.05, size=(m, 12)))
        y.append(np.full(m, c))
    return np.vstack(X), np.concatenate(y)


def scurve():
    X, t = make_s_curve(2000, noise=0.05, random_state=0)
    edges = np.linspace(t.min(), t.max(), 7)
    return X, np.clip(np.digitize(t, edges[1:-1]), 0, 5)


def run(name, X, y):
    parts = np.array_split(np.random.default_rng(0).permutation(len(X)), 3)
    sites = [X[p] for p in parts]
    Xs, ys = np.vstack(sites), np.concatenate([y[p] for p in parts])
    print(f"# {name}: N={len(X)} d={X.shape[1]} sites={[len(s) for s in sites]}", flush=True)
    settings = [("centralized", None), *[(f"distributed c={c}", c) for c in (30, 60, 120, "all")]]
    for label, c in settings:
        t0 = time.perf_counter()
        est: CentralizedGTM | DistributedGTM
        if c is None:
            est = CentralizedGTM(**KW)
            E = est.fit_transform(sites)
        else:
            est = DistributedGTM(c, **KW)
            E = est.fit_transform(sites)
        secs = time.perf_counter() - t0
        m = embedding_metrics(Xs, E, ys, random_state=0)
        out = {
            "data": name,
            "model": label,
            "trustworthiness": round(m["trustworthiness"], 4),
            "ca_10nn": round(m["ca_10nn"], 4),
            "nmi": round(m["nmi"], 4),
            "seconds": round(secs, 1),
        }
        if isinstance(est, DistributedGTM):
            rep = est.privacy_report()
            out["smallest_group"] = min(s["smallest_group"] for s in rep["sites"])
            out["kB_up_per_site"] = round(max(s["bytes_up"] for s in rep["sites"]) / 1e3, 1)
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    run("s-curve", *scurve())
    run("oil-standin-12d", *oil_standin())
