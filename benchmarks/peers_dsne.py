"""dSNE / DP-dSNE / F-dSNE on MNIST-5k, the two set-ups of Saha et al. 2023 §4 (scaled to MNIST-5k).

Run:  OMP_NUM_THREADS=1 python benchmarks/peers_dsne.py [--setup four|all|both]

* "four": digits 0, 1, 8, 9. Reference: 200 per digit (800, as the paper). Sites get the remaining
  300 per digit: site 1 {8, 9}, site 2 {0, 9}, site 3 {0, 1} (shared digits split in halves).
* "all": all ten digits. Reference: 50 per digit (500). Each of 3 sites: 100 per digit (1000).
Metrics (securefed.metrics.embedding_metrics) on the sites' records only. Baselines on the same
records: openTSNE on the pooled [sites ∪ reference] (centralised t-SNE) and securefed's FedTSNE.
"""

import argparse
import json
import time

import numpy as np
import openTSNE

from securefed.data import load_dataset
from securefed.metrics import embedding_metrics
from securefed.peers import PEER_METHODS


def four_digits(X, y, rng):
    ref: list = []
    sites: list[list] = [[], [], []]
    for dgt in (0, 1, 8, 9):
        idx = rng.permutation(np.flatnonzero(y == dgt))
        ref.append(idx[:200])
        rest = idx[200:]
        if dgt == 8:
            sites[0].append(rest)
        elif dgt == 1:
            sites[2].append(rest)
        elif dgt == 9:
            sites[0].append(rest[:150])
            sites[1].append(rest[150:])
        else:  # 0
            sites[1].append(rest[:150])
            sites[2].append(rest[150:])
    return np.concatenate(ref), [np.concatenate(s) for s in sites]


def all_digits(X, y, rng):
    ref: list = []
    sites: list[list] = [[], [], []]
    for dgt in range(10):
        idx = rng.permutation(np.flatnonzero(y == dgt))
        ref.append(idx[:50])
        for s in range(3):
            sites[s].append(idx[50 + 100 * s : 150 + 100 * s])
    return np.concatenate(ref), [np.concatenate(s) for s in sites]


def row(name, X_sites, y_sites, E, secs, extra=None):
    m = embedding_metrics(X_sites, E, y_sites, random_state=0)
    r = {
        "method": name,
        "ca_10nn": m["ca_10nn"],
        "nmi": m["nmi"],
        "trustworthiness": m["trustworthiness"],
        "seconds": round(secs, 1),
    }
    r.update(extra or {})
    print(json.dumps(r), flush=True)
    return r


def run(setup):
    ds = load_dataset("mnist5k")
    X, y = ds.X, ds.y
    rng = np.random.default_rng(0)
    ref, sites_idx = (four_digits if setup == "four" else all_digits)(X, y, rng)
    sites = [X[i] for i in sites_idx]
    Xs = np.vstack(sites)
    ys = np.concatenate([y[i] for i in sites_idx])
    print(f"# setup={setup} sites={[len(s) for s in sites]} reference={len(ref)}", flush=True)
    rows = []
    t = time.perf_counter()
    E = np.asarray(openTSNE.TSNE(random_state=0, n_jobs=1).fit(np.vstack([Xs, X[ref]])))[: len(Xs)]
    rows.append(row("openTSNE (pooled sites+reference)", Xs, ys, E, time.perf_counter() - t))
    try:
        from securefed.estimators import FedTSNE

        t = time.perf_counter()
        E = FedTSNE(random_state=0, aggregation="plain").fit_transform(sites)  # as measured: plain sums
        rows.append(row("FedTSNE (securefed, defaults)", Xs, ys, E, time.perf_counter() - t))
    except Exception as exc:  # report, do not hide
        print(json.dumps({"method": "FedTSNE", "error": f"{type(exc).__name__}: {exc}"}), flush=True)
    for name in ("dsne", "dp-dsne", "fdsne"):
        est = PEER_METHODS[name](random_state=0, reference=X[ref], noise_seed=0)
        t = time.perf_counter()
        E = est.fit_transform(sites)
        extra = {
            "releases_per_site": est.releases_,
            "sigma": est.noise_multiplier_,
            "epsilon_record": est.epsilon_,
            "epsilon_per_row": est.epsilon_per_row_,
            "delta": est.delta_,
            "MB_up_per_site": round(est.bytes_up_ / 1e6, 2),
        }
        rows.append(row(name, Xs, ys, E, time.perf_counter() - t, extra))
    return rows


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--setup", choices=["four", "all", "both"], default="both")
    a = ap.parse_args()
    for s in ["four", "all"] if a.setup == "both" else [a.setup]:
        run(s)
