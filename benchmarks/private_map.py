"""The private map against centralized (issue 15): the product's defaults, side by side in one run.

Usage::

    OMP_NUM_THREADS=1 python benchmarks/private_map.py [--datasets digits mnist5k] [--partitions iid label]
        [--seeds 0 1 2] [--sites 10] [--parts tsne umap spectral dp large density] [--eps 0.5 1 2 4 8 inf]
        [--cell-floor F] [--cell-axes R] [--dp-noise local|distributed]

For every data set, partition and seed: the default no-rows run (cell landmarks, SecAgg+ with the data set's public
value range as bound, audit hold-out 0.2) of Fed-tSNE / Fed-UMAP / Fed-SpeClust beside the centralized method on the
pooled records — CA-10NN (or NMI), trustworthiness, membership-audit AUC, reconstruction from the coordinates
(median relative error; the mean-record guess for scale) and wall times (federated / centralized, same process,
one after the other). ``dp``: the DP billboard at each ε (δ = 1e-5 over the whole run; ``inf`` = ε 1e6, i.e. the
billboard without noise). ``large``: MNIST-15k (MNIST-5k with two one-pixel-shifted copies) at ε 1 and 4 to show the
gap as the consortium grows. ``density``: the DP density of every record on the map (coordinates kept on the sites)
at ε 1 and 4 — its fidelity and what its budget share costs the map. Prints markdown tables.
"""

from __future__ import annotations

import argparse
import math
import time
import warnings

import numpy as np


def _data(name):
    from securefed.data import load_dataset

    if name == "mnist15k":
        ds = load_dataset("mnist5k")
        img = ds.X.reshape(-1, 28, 28)
        X = np.vstack(
            [ds.X, np.roll(img, 1, axis=2).reshape(len(img), -1), np.roll(img, 1, axis=1).reshape(len(img), -1)]
        )
        return X, np.concatenate([ds.y] * 3), float(ds.X.max())
    ds = load_dataset(name)
    return ds.X, ds.y, float(np.max(np.abs(ds.X)))


def _split(X, y, P, scheme, seed):
    from securefed.data import partition

    parts = partition(X, y, P, scheme, random_state=np.random.default_rng(seed))
    return [X[i] for i in parts], np.concatenate([y[i] for i in parts]), np.vstack([X[i] for i in parts])


def _recon(est, X):
    from securefed.audits import reconstruct_from_coordinates, reconstruction_risk

    Y = est.landmark_space_.to_original(est.landmarks_, X.shape[1])
    Xh = reconstruct_from_coordinates(est.embedding_, est.landmark_embedding_, Y)
    r = reconstruction_risk(X, Xh)
    mean_guess = reconstruction_risk(X, np.broadcast_to(X.mean(axis=0), X.shape))
    return r["median_relative_error"], mean_guess["median_relative_error"]


def _piled(est):
    """How close records sit to the landmarks on the map: median distance of a record to its nearest landmark over
    the median distance between neighbouring landmarks. Records spread over the landmarks' Voronoi cells give
    ≈ 0.3–0.5; ≪ 0.3 means they are piled onto the landmarks (a map of dots, whatever its CA-kNN says)."""
    from sklearn.neighbors import NearestNeighbors

    E, L = est.embedding_, est.landmark_embedding_
    d = NearestNeighbors(n_neighbors=1).fit(L).kneighbors(E)[0][:, 0]
    dl = NearestNeighbors(n_neighbors=2).fit(L).kneighbors(L)[0][:, 1]
    return float(np.median(d) / np.median(dl))


def _central(method, X, seed, n_clusters=None):
    from securefed.estimators import CentralizedSpectralClustering, CentralizedTSNE, CentralizedUMAP

    t = time.perf_counter()
    if method == "tsne":
        out = CentralizedTSNE(random_state=seed).fit_transform(X)
    elif method == "umap":
        out = CentralizedUMAP(random_state=seed).fit_transform(X)
    else:
        out = CentralizedSpectralClustering(n_clusters, random_state=seed).fit_predict(X)
    return out, time.perf_counter() - t


def _fed(method, sites, bound, seed, **kw):
    from securefed.estimators import FedSpectralClustering, FedTSNE, FedUMAP

    cls = {"tsne": FedTSNE, "umap": FedUMAP, "spectral": FedSpectralClustering}[method]
    t = time.perf_counter()
    est = cls(value_bound=bound, random_state=seed, **kw).fit(sites)
    return est, time.perf_counter() - t


def _score(method, out, X, y, seed):
    from securefed.metrics import classification_accuracy, clustering_metrics, trustworthiness

    if method == "spectral":
        return {"nmi": clustering_metrics(out, y)["nmi"]}
    return {
        "ca": classification_accuracy(out, y, random_state=0)[10],
        "trust": trustworthiness(X, out, random_state=seed),
    }


def maps(args):
    rows = []
    for name in args.datasets:
        X0, y0, bound = _data(name)
        n_cl = len(np.unique(y0))
        for method in [m for m in ("tsne", "umap", "spectral") if m in args.parts]:
            for seed in args.seeds:
                for scheme in args.partitions:
                    sites, y, X = _split(X0, y0, args.sites, scheme, seed)
                    kw = {"n_clusters": n_cl} if method == "spectral" else {}
                    kw.update(
                        {
                            k: v
                            for k, v in (("cell_floor", args.cell_floor), ("cell_axes", args.cell_axes))
                            if v is not None
                        }
                    )
                    est, t_fed = _fed(method, sites, bound, seed, **kw)
                    out = est.labels_ if method == "spectral" else est.embedding_
                    fed = _score(method, out, X, y, seed)
                    cen_out, t_cen = _central(method, X, seed, n_cl)
                    cen = _score(method, cen_out, X, y, seed)
                    rec = _recon(est, X) if method != "spectral" else (float("nan"), float("nan"))
                    piled = _piled(est) if method != "spectral" else float("nan")
                    rows.append(
                        dict(
                            data=name,
                            method=method,
                            part=scheme,
                            seed=seed,
                            cells=len(est.landmarks_),
                            auc=est.audit_["auc"],
                            rec=rec[0],
                            rec_mean=rec[1],
                            t_fed=t_fed,
                            t_cen=t_cen,
                            rt=est.result_.round_trips,
                            piled=piled,
                            **{f"fed_{k}": v for k, v in fed.items()},
                            **{f"cen_{k}": v for k, v in cen.items()},
                        )
                    )
                    r = rows[-1]
                    print(
                        f"# {name} {method} {scheme} seed {seed}: "
                        + ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in r.items()),
                        flush=True,
                    )
    _table_maps(rows)


def _table_maps(rows):
    print(
        "\n| data | method | partition | seeds | fed | centralized | Δ (pt) | trust Δ | cells | AUC max | recon. median rel. err. (mean guess) | round trips | fed s / central s | record–landmark / landmark spacing |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    keys = sorted({(r["data"], r["method"], r["part"]) for r in rows})
    for d, m, p in keys:
        rs = [r for r in rows if (r["data"], r["method"], r["part"]) == (d, m, p)]
        k = "nmi" if m == "spectral" else "ca"
        f = np.array([r[f"fed_{k}"] for r in rs])
        c = np.array([r[f"cen_{k}"] for r in rs])
        scale = 1.0 if k == "nmi" else 100.0
        tr = f"{np.mean([r['fed_trust'] - r['cen_trust'] for r in rs]):+.3f}" if k == "ca" else "–"
        rec = (
            f"{np.mean([r['rec'] for r in rs]):.3f} ({np.mean([r['rec_mean'] for r in rs]):.3f})" if k == "ca" else "–"
        )
        print(
            f"| {d} | {m} | {p} | {len(rs)} | {f.mean():.4f} ± {f.std():.4f} | {c.mean():.4f} | "
            f"{scale * (f.mean() - c.mean()):+.2f} | {tr} | {np.mean([r['cells'] for r in rs]):.0f} | "
            f"{max(r['auc'] for r in rs):.3f} | {rec} | {np.mean([r['rt'] for r in rs]):.0f} | "
            f"{np.mean([r['t_fed'] / r['t_cen'] for r in rs]):.2f} | "
            + (f"{np.mean([r['piled'] for r in rs]):.2f} |" if k == "ca" else "– |")
        )


def dp(args, datasets, eps_list, seeds):
    from securefed.accounting import GradientPerturbation

    rows = []
    for name in datasets:
        X0, y0, bound = _data(name)
        tau = bound * math.sqrt(X0.shape[1])
        for seed in seeds:
            cen_ca = None
            for scheme in args.partitions:
                sites, y, X = _split(X0, y0, args.sites, scheme, seed)
                if cen_ca is None:
                    cen_ca = _score("tsne", _central("tsne", X, seed)[0], X, y, seed)["ca"]
                for e in eps_list:
                    eps = 1e6 if math.isinf(e) else e
                    priv = GradientPerturbation(epsilon=eps, delta=1e-5, tau_x=tau, noise=args.dp_noise)
                    est, t_fed = _fed("tsne", sites, bound, seed, privacy=priv)
                    ca = _score("tsne", est.embedding_, X, y, seed)["ca"]
                    rows.append(
                        dict(
                            data=name,
                            part=scheme,
                            seed=seed,
                            eps=e,
                            ca=ca,
                            cen=cen_ca,
                            spent=est.privacy_["epsilon"],
                            t=t_fed,
                            auc=est.audit_["auc"],
                        )
                    )
                    print(
                        f"# dp {name} {scheme} seed {seed} eps {e}: CA {ca:.4f} (central {cen_ca:.4f}), "
                        f"ε spent {est.privacy_['epsilon']:.4g}, AUC {est.audit_['auc']:.3f}, {t_fed:.1f} s",
                        flush=True,
                    )
    print(
        "\n| data | partition | ε (δ = 1e-5, whole run) | seeds | CA-10NN | centralized | Δ (pt) | ε spent (ledger) | audit AUC max |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for d in datasets:
        for p in args.partitions:
            for e in eps_list:
                rs = [r for r in rows if (r["data"], r["part"], r["eps"]) == (d, p, e)]
                if not rs:
                    continue
                ca = np.array([r["ca"] for r in rs])
                cen = np.mean([r["cen"] for r in rs])
                print(
                    f"| {d} | {p} | {'∞ (σ → 0)' if math.isinf(e) else e:} | {len(rs)} | {ca.mean():.4f} ± {ca.std():.4f} | "
                    f"{cen:.4f} | {100 * (ca.mean() - cen):+.2f} | {np.max([r['spent'] for r in rs]):.4g} | "
                    f"{max(r['auc'] for r in rs):.3f} |"
                )


def density(args, eps_list, seeds):
    """The DP density (billboard release 3, coordinates kept on the sites): its fidelity and what its budget share
    costs the map. Fidelity = Pearson correlation of the noisy counts with the exact counts, on the same public grid,
    of (a) the landmark-only positions it estimates and (b) the sites' refined coordinates (what pooling the kept
    coordinates would show); the map's CA-10NN with and without the density's share, same ε."""
    from securefed.accounting import GradientPerturbation
    from securefed.embedding.placement import place_refine
    from securefed.landmarks.merf import density_counts

    X0, y0, bound = _data("mnist5k")
    tau = bound * math.sqrt(X0.shape[1])
    print(
        "\n| ε (δ = 1e-5) | seed | partition | corr. with landmark-only counts | corr. with refined-coordinate counts | "
        "noise σ per cell | records per cell (mean / max) | CA-10NN with density (share 0.2) | without | ε spent |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for seed in seeds:
        for scheme in args.partitions:
            sites, y, X = _split(X0, y0, args.sites, scheme, seed)
            for e in eps_list:
                priv = GradientPerturbation(epsilon=e, delta=1e-5, tau_x=tau)
                est, _ = _fed("tsne", sites, bound, seed, privacy=priv, coordinates="keep", density_share=0.2)
                d = est.result_.embedding["density"]
                F = est.landmark_space_.features(X)
                E = est.landmark_embedding_
                alone = place_refine(
                    F,
                    est.landmarks_,
                    E,
                    est.landmark_masses_,
                    est.landmark_map_zn_,
                    perplexity=float(est.plan_.placement_perplexity),
                    interact=False,
                )
                exact_lm = density_counts(alone, d["lo"], d["hi"], d["grid"])
                exact_ref = density_counts(est.embedding_, d["lo"], d["hi"], d["grid"])
                noisy = d["counts"].ravel()
                base, _ = _fed("tsne", sites, bound, seed, privacy=priv, coordinates="keep")
                ca = _score("tsne", est.embedding_, X, y, seed)["ca"]
                ca0 = _score("tsne", base.embedding_, X, y, seed)["ca"]
                print(
                    f"| {e:g} | {seed} | {scheme} | {np.corrcoef(noisy, exact_lm)[0, 1]:.3f} | "
                    f"{np.corrcoef(noisy, exact_ref)[0, 1]:.3f} | {d['sigma_per_cell']:.1f} | "
                    f"{exact_lm.mean():.1f} / {exact_lm.max():.0f} | {ca:.4f} | {ca0:.4f} | "
                    f"{est.privacy_['epsilon']:.4g} |",
                    flush=True,
                )


def add_grid_args(ap):
    """The data sets, partitions, seeds and number of sites of a benchmark grid (here and in ``cells_gap.py``)."""
    ap.add_argument("--datasets", nargs="+", default=["digits", "mnist5k"])
    ap.add_argument("--partitions", nargs="+", default=["iid", "label"])
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--sites", type=int, default=10)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_grid_args(ap)
    ap.add_argument("--parts", nargs="+", default=["tsne", "umap", "spectral", "dp", "large"])
    ap.add_argument("--eps", nargs="+", type=float, default=[0.5, 1.0, 2.0, 4.0, 8.0, float("inf")])
    ap.add_argument(
        "--dp-noise",
        default="local",
        choices=["local", "distributed"],
        help="dp: each site adds the full σ (local, the default) or a share σ/√n inside SecAgg+",
    )
    ap.add_argument("--cell-floor", type=int, default=None, help="maps: the cells' floor (default: the product's)")
    ap.add_argument("--cell-axes", type=int, default=None, help="maps: axis points per cell (default: the product's)")
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    import platform
    import os

    print(
        f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}, python {platform.python_version()}"
    )
    if {"tsne", "umap", "spectral"} & set(args.parts):
        maps(args)
    if "dp" in args.parts:
        # the whole curve on the first seed; ε 1 and 4 on every seed
        dp(args, [d for d in args.datasets if d == "mnist5k"] or args.datasets, args.eps, args.seeds[:1])
        if len(args.seeds) > 1:
            dp(args, [d for d in args.datasets if d == "mnist5k"] or args.datasets, [1.0, 4.0], args.seeds[1:])
    if "density" in args.parts:
        density(args, [1.0, 4.0], args.seeds)
    if "large" in args.parts:
        dp(args, ["mnist15k"], [1.0, 4.0], args.seeds[:1])


if __name__ == "__main__":
    main()
