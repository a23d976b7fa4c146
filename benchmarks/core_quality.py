"""Issue 2 quality benchmark: federated vs centralized, mean of seeds, paper vs feature-map reconstruction.

Usage: OMP_NUM_THREADS=1 python benchmarks/core_quality.py [--datasets digits mnist5k] [--seeds 0 1 2]
       [--methods tsne umap spectral] [--out benchmarks/results/core_quality.jsonl]
Prints one JSON line per (dataset, partition, method, variant, seed) and a summary table at the end.
"""

from __future__ import annotations

import argparse
import json
import time
import warnings

import numpy as np

from securefed.data import load_dataset, partition
from securefed.estimators import (
    CentralizedSpectralClustering,
    CentralizedTSNE,
    CentralizedUMAP,
    FedSpectralClustering,
    FedTSNE,
    FedUMAP,
)
from securefed.metrics import clustering_metrics, embedding_metrics

warnings.filterwarnings("ignore")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--datasets", nargs="+", default=["digits", "mnist5k"])
    ap.add_argument("--partitions", nargs="+", default=["iid", "label"])
    ap.add_argument("--methods", nargs="+", default=["tsne", "umap", "spectral"])
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--landmarks", type=int, default=500)
    ap.add_argument("--variants", nargs="+", default=["central", "paper", "features", "local"])
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    rows = []
    for name in a.datasets:
        ds = load_dataset(name)
        for part in a.partitions:
            for seed in a.seeds:
                idx = partition(ds.X, ds.y, 10, part, random_state=seed)
                sites = [ds.X[i] for i in idx]
                X = np.vstack(sites)
                y = np.concatenate([ds.y[i] for i in idx])
                for method in a.methods:
                    variants = [("central", None), ("paper", "rows"), ("features", "rows")]
                    if method == "tsne":
                        variants.append(("local", "local"))
                    variants = [v for v in variants if v[0] in a.variants]
                    for variant, mode in variants:
                        t0 = time.perf_counter()
                        common = dict(
                            n_landmarks=a.landmarks,
                            random_state=seed,
                            nystrom=mode,
                            aggregation="plain",
                            reconstruction=variant if variant in ("paper", "features") else "auto",
                        )
                        if method == "tsne":
                            emb = (
                                CentralizedTSNE(random_state=seed).fit_transform(X)
                                if mode is None
                                else FedTSNE(**common).fit_transform(sites)
                            )
                            score = embedding_metrics(X, emb, y, random_state=0)["ca_10nn"]
                            key = "ca_10nn"
                        elif method == "umap":
                            emb = (
                                CentralizedUMAP(random_state=seed).fit_transform(X)
                                if mode is None
                                else FedUMAP(**common).fit_transform(sites)
                            )
                            score = embedding_metrics(X, emb, y, random_state=0)["ca_10nn"]
                            key = "ca_10nn"
                        else:
                            k = len(np.unique(y))
                            lab = (
                                CentralizedSpectralClustering(k, random_state=seed).fit_predict(X)
                                if mode is None
                                else FedSpectralClustering(k, **common).fit_predict(sites)
                            )
                            score = clustering_metrics(lab, y)["nmi"]
                            key = "nmi"
                        row = dict(
                            dataset=name,
                            partition=part,
                            method=method,
                            variant=variant,
                            seed=seed,
                            metric=key,
                            value=float(score),
                            seconds=round(time.perf_counter() - t0, 1),
                        )
                        rows.append(row)
                        print(json.dumps(row), flush=True)
                        if a.out:
                            with open(a.out, "a") as fh:
                                fh.write(json.dumps(row) + "\n")
    summarize(rows)


def summarize(rows):
    """Print the markdown table of means (also usable on the JSON lines file: see __main__)."""
    from collections import defaultdict

    agg = defaultdict(list)
    for r in rows:
        agg[(r["dataset"], r["partition"], r["method"], r["variant"], r["metric"])].append(r["value"])
    print("\n| dataset | partition | method | variant | metric | mean | seeds | Δ vs central (points) |")
    print("|---|---|---|---|---|---|---|---|")
    for (d, p, m, v, k), vals in sorted(agg.items()):
        c = agg.get((d, p, m, "central", k))
        delta = "" if v == "central" or not c else f"{100 * (np.mean(vals) - np.mean(c)):+.2f}"
        print(f"| {d} | {p} | {m} | {v} | {k} | {np.mean(vals):.4f} | {len(vals)} | {delta} |")


def table(path):
    """The BENCHMARKS.md layout: centralized | paper (Δ) | features (Δ) per dataset/partition/method."""
    import collections

    rows = [json.loads(line) for line in open(path)]
    agg = collections.defaultdict(list)
    for r in rows:
        agg[(r["dataset"], r["partition"], r["method"], r["variant"])].append(r["value"])
    print(
        "| dataset | partition | method (metric) | centralized | paper (Δ) | features (Δ) | seeds (central / paper / features) |"
    )
    print("|---|---|---|---|---|---|---|")
    names = {"tsne": "t-SNE (CA-10NN)", "umap": "UMAP (CA-10NN)", "spectral": "spectral (NMI)"}
    for m in ("tsne", "umap", "spectral"):
        for d in ("digits", "mnist5k"):
            for p in ("iid", "label"):
                c = agg.get((d, p, m, "central"))
                if not c:
                    continue
                cm = np.mean(c)
                cells = []
                for v in ("paper", "features"):
                    x = agg.get((d, p, m, v))
                    if not x:
                        cells.append("–")
                    elif m == "spectral":
                        cells.append(f"{np.mean(x):.4f} ({np.mean(x) - cm:+.3f})")
                    else:
                        cells.append(f"{np.mean(x):.4f} ({100 * (np.mean(x) - cm):+.2f})")
                n = " / ".join(str(len(agg.get((d, p, m, v), []))) for v in ("central", "paper", "features"))
                print(f"| {d} | {p} | {names[m]} | {cm:.4f} | {cells[0]} | {cells[1]} | {n} |")


if __name__ == "__main__":
    import sys

    if len(sys.argv) == 3 and sys.argv[1] == "--summarize":
        summarize([json.loads(line) for line in open(sys.argv[2])])
    elif len(sys.argv) == 3 and sys.argv[1] == "--table":
        table(sys.argv[2])
    else:
        main()
