"""Where the private map's remaining gap to centralized t-SNE comes from (issue 15): one step at a time.

Usage::

    OMP_NUM_THREADS=1 python benchmarks/private_map_gap.py [--datasets digits mnist5k] [--partitions iid label]
        [--seeds 0] [--sites 10] [--parts gap dp-landmarks] [--k 20 40 80 150 300] [--eps 1 4]

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

With ``--parts dp-landmarks`` (under DP): how many landmarks, how accurate, does the billboard's
pipeline need, and can a DP release deliver them at this n? For k landmarks:

a. **yardstick, not private:** k-means centres (k of them, pooled, public basis) in the billboard's pipeline;
b. **optimistic bound of one DP k-means release:** the same centres' sums and counts (assignment by the pooled
   k-means, for free) released with Gaussian noise for (ε, δ = 1e-5) — sums clipped to the public feature norm,
   Δ = 2·norm, counts Δ = √2, μ split 0.8 / 0.2, the noise added **once** (as distributed noise would) and the
   pipeline's own releases at ε = 10⁶; a real DP k-means would also pay for its assignment rounds, so this is an
   optimistic estimate (not a proof) of what noisy k-means sums can give;
c. the billboard's random-feature fit (k landmarks) without noise, with its distance to the exact mean embedding
   (MMD in the random-feature space) beside that of the k-means centres: does matching the embedding make good
   landmarks?

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


def _cells_yardstick(X, floor, seed, sites, bound):
    """Fed-tSNE without hold-out with the federated cells swapped for k-means on the pooled records (same basis,
    same coordinator)."""
    import securefed.federation.landmark_stages as stages

    original = stages.cells

    def cells(co):
        lm = yield from original(co)
        lm["Y"], lm["masses"] = _kmeans(lm["space"].features(X), 300, floor, seed)
        return lm

    stages.cells = cells
    try:
        return _fed("tsne", sites, bound, seed, audit_holdout=0.0)[0]
    finally:
        stages.cells = original


def _cases(args):
    """Every (data set, seed, partition) of the command line: its sites, pooled labels and records."""
    for name in args.datasets:
        X0, y0, bound = _data(name)
        tau = bound * math.sqrt(X0.shape[1])
        for seed in args.seeds:
            for scheme in args.partitions:
                sites, y, X = _split(X0, y0, args.sites, scheme, seed)
                yield name, bound, tau, seed, scheme, sites, y, X


def _billboard_with(fit, sites, bound, tau, seed, **kw):
    """The DP billboard at ε = 10⁶ with ``fit`` in place of its random-feature fit (a yardstick swap)."""
    import securefed.landmarks.merf as merf
    from securefed.accounting import GradientPerturbation

    original = merf.fit_to_embedding
    merf.fit_to_embedding = fit
    try:
        return _fed("tsne", sites, bound, seed, privacy=GradientPerturbation(epsilon=1e6, delta=1e-5, tau_x=tau), **kw)[
            0
        ]
    finally:
        merf.fit_to_embedding = original


def _noisy_centres(F, k, eps, seed, rng):
    """Optimistic one-release DP k-means (module docstring, b): pooled k-means assignment, noisy sums and counts."""
    from sklearn.cluster import KMeans

    import securefed.landmarks.merf as merf
    from securefed.accounting.accountants import gdp_mu

    lab = KMeans(k, n_init=1, random_state=seed).fit(F).labels_
    sums = np.array([F[lab == j].sum(axis=0) for j in range(k)])
    counts = np.bincount(lab, minlength=k).astype(np.float64)
    if math.isinf(eps):
        return sums / counts[:, None]
    mu = gdp_mu(eps, 1e-5)
    s_sum = 2.0 * merf.FEATURE_NORM / (mu * math.sqrt(0.8))
    s_cnt = math.sqrt(2.0) / (mu * math.sqrt(0.2))
    noisy = sums + rng.normal(0.0, s_sum, sums.shape)
    cnt = np.maximum(counts + rng.normal(0.0, s_cnt, k), 1.0)
    return noisy / cnt[:, None]


def dp_landmarks(args):
    """How many landmarks the billboard's pipeline needs, and what a DP release of k-means sums could give."""
    import securefed.landmarks.merf as merf

    rows = []
    for name, bound, tau, seed, scheme, sites, y, X in _cases(args):
        B, _ = merf.public_basis(X.shape[1], 64, 0)
        F = merf.scaled_features(X, B, bound)
        W = merf.rff_frequencies(F.shape[1])
        exact = merf.rff(F, W).mean(axis=0)
        cen = _score("tsne", _central("tsne", X, seed)[0], X, y, seed)["ca"]
        for k in args.k:
            r = {"data": name, "part": scheme, "seed": seed, "k": k, "central": cen}
            for key, eps in [("kmeans", math.inf)] + [(f"noisy_{e:g}", e) for e in args.eps]:
                Y = _noisy_centres(F, k, eps, seed, np.random.default_rng([seed, k, 7]))
                if key == "kmeans":
                    r["mmd_kmeans"] = float(np.linalg.norm(merf.rff(Y, W).mean(axis=0) - exact))
                est = _billboard_with(lambda target, W_, kk, rng, Y=Y, **_: Y, sites, bound, tau, seed, n_landmarks=k)
                r[key] = _score("tsne", est.embedding_, X, y, seed)["ca"]
            seen: dict = {}
            fit = merf.fit_to_embedding

            def fit_and_keep(target, W_, kk, rng, seen=seen, fit=fit, **kw):
                seen["Y"] = fit(target, W_, kk, rng, **kw)
                return seen["Y"]

            est = _billboard_with(fit_and_keep, sites, bound, tau, seed, n_landmarks=k)
            r["fit"] = _score("tsne", est.embedding_, X, y, seed)["ca"]
            r["mmd_fit"] = float(np.linalg.norm(merf.rff(seen["Y"], W).mean(axis=0) - exact))
            rows.append(r)
            print(
                "# " + ", ".join(f"{a}={v:.4g}" if isinstance(v, float) else f"{a}={v}" for a, v in r.items()),
                flush=True,
            )
    noisy = [f"noisy_{e:g}" for e in args.eps]
    print(
        "\n| data | partition | seed | centralized | k | a k-means centres | "
        + " | ".join(f"b noisy k-means sums, ε = {e:g} (bound)" for e in args.eps)
        + " | c billboard fit, no noise | MMD to the exact embedding: k-means / fit |"
    )
    print("|---|---|---|---|---|---|" + "---|" * len(noisy) + "---|---|")
    for r in rows:
        print(
            f"| {r['data']} | {r['part']} | {r['seed']} | {r['central']:.4f} | {r['k']} | {r['kmeans']:.4f} | "
            + " | ".join(f"{r[n]:.4f}" for n in noisy)
            + f" | {r['fit']:.4f} | {r['mmd_kmeans']:.4f} / {r['mmd_fit']:.4f} |"
        )


def run(args):
    import securefed.landmarks.merf as merf
    from securefed.accounting import GradientPerturbation

    rows = []
    for name, bound, tau, seed, scheme, sites, y, X in _cases(args):
        r = {"data": name, "part": scheme, "seed": seed}
        r["central"] = _score("tsne", _central("tsne", X, seed)[0], X, y, seed)["ca"]
        est, _ = _fed("tsne", sites, bound, seed)
        r["default"], r["cells"] = _score("tsne", est.embedding_, X, y, seed)["ca"], len(est.landmarks_)
        est, _ = _fed("tsne", sites, bound, seed, audit_holdout=0.0)
        r["nohold"], r["cells_nohold"] = _score("tsne", est.embedding_, X, y, seed)["ca"], len(est.landmarks_)
        for key, floor in (("kmeans_floor", 15), ("kmeans_nofloor", 0)):
            est = _cells_yardstick(X, floor, seed, sites, bound)
            r[key], r[key + "_n"] = _score("tsne", est.embedding_, X, y, seed)["ca"], len(est.landmarks_)
        est, _ = _fed("tsne", sites, bound, seed, privacy=GradientPerturbation(epsilon=1e6, delta=1e-5, tau_x=tau))
        r["billboard_inf"] = _score("tsne", est.embedding_, X, y, seed)["ca"]
        B, _ = merf.public_basis(X.shape[1], 64, 0)
        F = merf.scaled_features(X, B, bound)
        est = _billboard_with(
            lambda target, W, k, rng, F=F, seed=seed, **_: _kmeans(F, k, 0, seed)[0], sites, bound, tau, seed
        )
        r["billboard_kmeans"] = _score("tsne", est.embedding_, X, y, seed)["ca"]
        rows.append(r)
        print(
            "# " + ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in r.items()), flush=True
        )
    print(
        "\n| data | partition | seed | centralized | 1 default (cells) | 2 no hold-out | 3 k-means ≥ 15 (yardstick) "
        "| 4 k-means, no floor (yardstick) | 5 billboard, no noise | 6 billboard pipeline, k-means (yardstick) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['data']} | {r['part']} | {r['seed']} | {r['central']:.4f} | {r['default']:.4f} ({r['cells']}) | "
            f"{r['nohold']:.4f} ({r['cells_nohold']}) | {r['kmeans_floor']:.4f} ({r['kmeans_floor_n']}) | "
            f"{r['kmeans_nofloor']:.4f} ({r['kmeans_nofloor_n']}) | {r['billboard_inf']:.4f} | "
            f"{r['billboard_kmeans']:.4f} |"
        )


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--datasets", nargs="+", default=["digits", "mnist5k"])
    ap.add_argument("--partitions", nargs="+", default=["iid", "label"])
    ap.add_argument("--seeds", nargs="+", type=int, default=[0])
    ap.add_argument("--sites", type=int, default=10)
    ap.add_argument("--parts", nargs="+", default=["gap"], choices=["gap", "dp-landmarks"])
    ap.add_argument(
        "--k", nargs="+", type=int, default=[20, 40, 80, 150, 300], help="dp-landmarks: numbers of landmarks"
    )
    ap.add_argument(
        "--eps", nargs="+", type=float, default=[1.0, 4.0], help="dp-landmarks: ε of the noisy k-means bound"
    )
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    import os
    import platform

    print(
        f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {platform.machine()}, {os.cpu_count()} cores, "
        f"load {os.getloadavg()[0]:.1f}, python {platform.python_version()}"
    )
    if "gap" in args.parts:
        run(args)
    if "dp-landmarks" in args.parts:
        dp_landmarks(args)


if __name__ == "__main__":
    main()
