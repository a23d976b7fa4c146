"""Where the private map's remaining gap to centralized t-SNE comes from (issue 15): one step at a time.

Usage::

    OMP_NUM_THREADS=1 python benchmarks/private_map_gap.py [--datasets digits mnist5k] [--partitions iid label]
        [--seeds 0] [--sites 10]

For each data set, partition and seed, CA-10NN of Fed-tSNE (10 sites, SecAgg+) when one thing changes at a time:

1. the default (federated cells of ≥ 15 records, audit hold-out 0.2);
2. no audit hold-out (every record in the cells);
3. **yardstick, not private:** the cells replaced by k-means on the pooled records (k-means++, min(300, n/15)
   centres in the cells' own PCA basis, clusters under the floor of 15 dropped and the rest re-fitted until none
   is under it) — what a better federated clustering with the same floor could reach;
4. **yardstick, not private:** the same k-means without a floor (300 landmarks, some of a few records) — what the
   floor costs;
5. the DP billboard without noise (ε = 10⁶) — its random-feature fit;
6. **yardstick, not private:** the billboard's pipeline with k-means landmarks (300, public basis) instead of the
   fit — what the fit costs.

The yardsticks swap the landmark step inside the same coordinator (everything else — basis, placement, masses, the
secure sums — as in the product); they are measurements, not modes: the k-means centres are computed on pooled
records, which no party has.
"""

from __future__ import annotations

import argparse
import math
import time
import warnings

import numpy as np

from private_map import _central, _data, _fed, _score, _split


def _kmeans(F, k, floor, seed):
    """k-means++ / Lloyd on pooled records; with a floor: k = min(k, n / floor) centres, clusters under the floor
    dropped and the rest re-fitted from the survivors (Lloyd), until every cluster holds ≥ floor records."""
    from sklearn.cluster import KMeans

    k = min(k, len(F) // floor) if floor else k
    C = KMeans(k, n_init=1, random_state=seed).fit(F).cluster_centers_
    for _ in range(20 if floor else 0):
        lab = np.argmin(((F[:, None, :] - C[None]) ** 2).sum(-1), axis=1)
        keep = np.bincount(lab, minlength=len(C)) >= floor
        if keep.all():
            break
        C = KMeans(int(keep.sum()), init=C[keep], n_init=1).fit(F).cluster_centers_
    lab = np.argmin(((F[:, None, :] - C[None]) ** 2).sum(-1), axis=1)
    return C, np.bincount(lab, minlength=len(C)).astype(np.float64)


def _with_cells_yardstick(X, floor, seed):
    """Swap the federated cells for k-means on the pooled records (same basis, same coordinator)."""
    import securefed.federation.landmark_stages as stages

    original = stages.cells

    def cells(co):
        lm = yield from original(co)
        lm["Y"], lm["masses"] = _kmeans(lm["space"].features(X), 300, floor, seed)
        return lm

    return original, cells


def run(args):
    import securefed.federation.landmark_stages as stages
    import securefed.landmarks.merf as merf
    from securefed.accounting import GradientPerturbation

    rows = []
    for name in args.datasets:
        X0, y0, bound = _data(name)
        tau = bound * math.sqrt(X0.shape[1])
        for seed in args.seeds:
            for scheme in args.partitions:
                sites, y, X = _split(X0, y0, args.sites, scheme, seed)
                r = {"data": name, "part": scheme, "seed": seed}
                r["central"] = _score("tsne", _central("tsne", X, seed)[0], X, y, seed)["ca"]
                est, _ = _fed("tsne", sites, bound, seed)
                r["default"], r["cells"] = _score("tsne", est.embedding_, X, y, seed)["ca"], len(est.landmarks_)
                est, _ = _fed("tsne", sites, bound, seed, audit_holdout=0.0)
                r["nohold"], r["cells_nohold"] = _score("tsne", est.embedding_, X, y, seed)["ca"], len(est.landmarks_)
                for key, floor in (("kmeans_floor", 15), ("kmeans_nofloor", 0)):
                    original, patched = _with_cells_yardstick(X, floor, seed)
                    stages.cells = patched
                    try:
                        est, _ = _fed("tsne", sites, bound, seed, audit_holdout=0.0)
                    finally:
                        stages.cells = original
                    r[key], r[key + "_n"] = _score("tsne", est.embedding_, X, y, seed)["ca"], len(est.landmarks_)
                priv = GradientPerturbation(epsilon=1e6, delta=1e-5, tau_x=tau)
                est, _ = _fed("tsne", sites, bound, seed, privacy=priv)
                r["billboard_inf"] = _score("tsne", est.embedding_, X, y, seed)["ca"]
                fit = merf.fit_to_embedding
                B, _ = merf.public_basis(X.shape[1], 64, 0)
                F = merf.scaled_features(X, B, bound)
                merf.fit_to_embedding = lambda target, W, k, rng, **_: _kmeans(F, k, 0, seed)[0]
                try:
                    est, _ = _fed("tsne", sites, bound, seed, privacy=priv)
                finally:
                    merf.fit_to_embedding = fit
                r["billboard_kmeans"] = _score("tsne", est.embedding_, X, y, seed)["ca"]
                rows.append(r)
                print("# " + ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in r.items()),
                      flush=True)
    print("\n| data | partition | seed | centralized | 1 default (cells) | 2 no hold-out | 3 k-means ≥ 15 (yardstick) "
          "| 4 k-means, no floor (yardstick) | 5 billboard, no noise | 6 billboard pipeline, k-means (yardstick) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['data']} | {r['part']} | {r['seed']} | {r['central']:.4f} | {r['default']:.4f} ({r['cells']}) | "
              f"{r['nohold']:.4f} ({r['cells_nohold']}) | {r['kmeans_floor']:.4f} ({r['kmeans_floor_n']}) | "
              f"{r['kmeans_nofloor']:.4f} ({r['kmeans_nofloor_n']}) | {r['billboard_inf']:.4f} | "
              f"{r['billboard_kmeans']:.4f} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--datasets", nargs="+", default=["digits", "mnist5k"])
    ap.add_argument("--partitions", nargs="+", default=["iid", "label"])
    ap.add_argument("--seeds", nargs="+", type=int, default=[0])
    ap.add_argument("--sites", type=int, default=10)
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    import os
    import platform

    print(f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {platform.machine()}, {os.cpu_count()} cores, "
          f"load {os.getloadavg()[0]:.1f}, python {platform.python_version()}")
    run(args)


if __name__ == "__main__":
    main()
