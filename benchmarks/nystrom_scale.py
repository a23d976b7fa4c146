"""Scalable Nyström path at n = 70 000: feature map + kNN graph, with peak RSS (no n×n matrix).

Generates 70 000 clustered records in 50 dimensions (10 Gaussian clusters, seeded), takes n_y
landmarks (k-means centroids of a 5 000-record subsample — a stand-in for FedDL's landmarks), the
Gaussian kernel with the median-heuristic γ, then times

1. C = K(X, Y) and Φ = kernel_feature_map(C, K(Y, Y));
2. knn_graph(Φ, 90, include_self=False) with pynndescent (90 = 3 × perplexity 30, openTSNE's layout),
   including pynndescent's one-off numba JIT compilation;
3. its recall against exact 90-NN on 1 000 random query points (exact search of Φ);
4. the label agreement of the graph (share of neighbours with the same generating cluster);
5. neighbor_preservation(X, Φ) at k = 10 (10 000 query points over all 70 000), to show the metric's
   cost at this size and how well Φ keeps Euclidean neighbourhoods.

Usage: ``OMP_NUM_THREADS=1 python benchmarks/nystrom_scale.py [n] [n_y]``
"""

from __future__ import annotations

import argparse
import resource
import time

import numpy as np
from sklearn.cluster import KMeans
from sklearn.neighbors import NearestNeighbors

from securefed.kernels import gaussian_kernel, local_median_sq_dist
from securefed.metrics import neighbor_preservation
from securefed.embedding.nystrom import kernel_feature_map, knn_graph


def rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6  # Linux: kB


def main(n: int = 70_000, n_y: int = 200, m: int = 50, k: int = 90, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    centers = rng.normal(0, 4.0, size=(10, m))
    y = rng.integers(0, 10, size=n)
    X = centers[y] + rng.normal(size=(n, m))
    print(f"data {n} × {m}, peak RSS so far {rss_gb():.2f} GB", flush=True)

    t = time.time()
    sub = X[rng.choice(n, 5000, replace=False)]
    Y = KMeans(n_clusters=n_y, n_init=1, random_state=seed).fit(sub).cluster_centers_
    gamma = 1.0 / local_median_sq_dist(X, random_state=seed)
    print(f"landmarks (stand-in) {time.time() - t:.1f} s, gamma {gamma:.4g}", flush=True)

    t = time.time()
    C = gaussian_kernel(X, Y, gamma)
    Phi = kernel_feature_map(C, gaussian_kernel(Y, Y, gamma))
    t_phi = time.time() - t
    print(f"feature map Φ {Phi.shape}: {t_phi:.1f} s, peak RSS {rss_gb():.2f} GB", flush=True)

    t = time.time()
    idx, dist = knn_graph(Phi, k, random_state=seed, method="nndescent", include_self=False)
    t_knn = time.time() - t
    print(f"knn_graph nndescent k={k}: {t_knn:.1f} s (incl. numba JIT), peak RSS {rss_gb():.2f} GB", flush=True)

    q = rng.choice(n, 1000, replace=False)
    exact = NearestNeighbors(n_neighbors=k + 1).fit(Phi).kneighbors(Phi[q], return_distance=False)
    exact = np.array([row[row != i][:k] for row, i in zip(exact, q)])
    recall = np.mean([len(np.intersect1d(a, b)) for a, b in zip(idx[q], exact)]) / k
    print(f"nndescent recall@{k} vs exact (1000 queries): {recall:.4f}", flush=True)

    # same-label rate of the graph's neighbours in Φ vs in X (how well Φ keeps the clusters)
    print(f"label agreement of {k}-NN in Φ: {np.mean(y[idx] == y[:, None]):.4f}", flush=True)

    t = time.time()
    npa = neighbor_preservation(X, Phi, ks=(10,), random_state=seed)
    print(
        f"NPA-10 of Φ vs X (10 000 queries over {n}): {npa[10]:.4f} in {time.time() - t:.1f} s, "
        f"peak RSS {rss_gb():.2f} GB",
        flush=True,
    )
    print(f"\nPEAK RSS {rss_gb():.2f} GB (a dense {n}×{n} float64 matrix alone would be {8 * n * n / 1e9:.1f} GB)")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("n", nargs="?", type=int, default=70_000, help="records")
    ap.add_argument("n_y", nargs="?", type=int, default=200, help="landmarks")
    a = ap.parse_args()
    main(a.n, a.n_y)
