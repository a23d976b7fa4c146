"""Issue 2 scale benchmark: n = 70 000 generated clustered records (50-D), 10 sites, Fed-tSNE end to end
with the scalable path (feature map + approximate kNN, no n×n matrix), peak RSS, and centralized
openTSNE on the same data in the same run.

Usage: OMP_NUM_THREADS=1 python benchmarks/core_scale.py [--n 70000] [--dim 50] [--skip-central]
"""

from __future__ import annotations

import argparse
import resource
import time
import warnings

import numpy as np
from sklearn.datasets import make_blobs

from securefed.data import partition
from securefed.estimators import CentralizedTSNE, FedTSNE
from securefed.metrics import classification_accuracy

warnings.filterwarnings("ignore")


def peak_rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=70_000)
    ap.add_argument("--dim", type=int, default=50)
    ap.add_argument("--landmarks", type=int, default=500)
    ap.add_argument("--skip-central", action="store_true")
    a = ap.parse_args()
    X, y = make_blobs(a.n, a.dim, centers=20, cluster_std=4.0, center_box=(-20, 20), random_state=0)
    idx = partition(X, y, 10, "iid", random_state=0)
    sites = [X[i] for i in idx]
    yy = np.concatenate([y[i] for i in idx])
    Xp = np.vstack(sites)
    t0 = time.perf_counter()
    fed = FedTSNE(
        n_landmarks=a.landmarks, rounds=30, random_state=0, reconstruction="features", n_jobs=2, aggregation="plain"
    ).fit(sites)  # as measured: plain sums (no silent fall-back any more)
    t_fed = time.perf_counter() - t0
    ca_fed = classification_accuracy(fed.embedding_, yy, ks=(10,), random_state=0)[10]
    print(
        f"fed-tsne n={a.n} dim={a.dim} reconstruction={fed.reconstruction_} seconds={t_fed:.1f} "
        f"timings={ {k: round(v, 1) for k, v in fed.timings_.items()} } ca10={ca_fed:.4f} peak_rss_gb={peak_rss_gb():.2f}",
        flush=True,
    )
    if not a.skip_central:
        t1 = time.perf_counter()
        emb = CentralizedTSNE(random_state=0, n_jobs=2).fit_transform(Xp)
        t_c = time.perf_counter() - t1
        ca_c = classification_accuracy(emb, yy, ks=(10,), random_state=0)[10]
        print(
            f"central-tsne seconds={t_c:.1f} ca10={ca_c:.4f} ratio_fed_over_central={t_fed / t_c:.2f} "
            f"peak_rss_gb={peak_rss_gb():.2f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
