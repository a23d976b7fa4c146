"""Which reading of Eq. (21) of Qiao et al. reproduces distances better: squared or plain distances?

For digits and mnist5k, with landmark sets Y of several sizes, compare the estimated distance matrix
with the true one (relative Frobenius error) and the 10-NN recall of each reconstruction:

* paper-sq     nystrom_distance(D²(X,Y), D²(Y,Y), squared=True)
* paper-plain  nystrom_distance(D(X,Y), D(Y,Y), squared=False)
* lmds         distance_feature_map(D²(X,Y), D²(Y,Y)) → Euclidean distances of the rows
* kernel-phi   kernel_feature_map(K(X,Y), K(Y,Y)) with the median-heuristic γ (10-NN recall only:
               its distances are kernel-induced, not Euclidean)

Landmarks: k-means centroids (a stand-in for FedDL's MMD-fitted landmarks, which sit in the data
distribution) — seeded. Usage: ``OMP_NUM_THREADS=1 python benchmarks/nystrom_forms.py``
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from sklearn.cluster import KMeans

from securefed.data import load_dataset
from securefed.kernels import gaussian_kernel, local_median_sq_dist, sq_dists
from securefed.embedding.nystrom import distance_feature_map, kernel_feature_map, nystrom_distance


def knn_sets(D: np.ndarray, k: int) -> np.ndarray:
    D = D.copy()
    np.fill_diagonal(D, np.inf)
    return np.argpartition(D, k, axis=1)[:, :k]


def recall(A: np.ndarray, B: np.ndarray) -> float:
    return float(np.mean([len(np.intersect1d(a, b)) for a, b in zip(A, B)]) / A.shape[1])


def main(names=("digits", "mnist5k"), sizes=(10, 50, 100, 300), k=10, seed=0) -> None:
    print(
        "| dataset | n × m | n_y | paper-sq rel.err | paper-plain rel.err | lmds rel.err | "
        f"paper-sq {k}-NN recall | paper-plain {k}-NN recall | lmds {k}-NN recall | kernel-Φ {k}-NN recall |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name in names:
        ds = load_dataset(name)
        X = ds.X
        D2 = sq_dists(X)
        D = np.sqrt(D2)
        true_nn = knn_sets(D, k)
        gamma = 1.0 / local_median_sq_dist(X, random_state=seed)
        for n_y in sizes:
            Y = KMeans(n_clusters=n_y, n_init=1, random_state=seed).fit(X).cluster_centers_
            B2, W2 = sq_dists(X, Y), sq_dists(Y)
            Dsq = nystrom_distance(B2, W2, squared=True)
            Dpl = nystrom_distance(np.sqrt(B2), np.sqrt(W2), squared=False)
            Z = distance_feature_map(B2, W2)
            Dl = np.sqrt(sq_dists(Z))
            Phi = kernel_feature_map(gaussian_kernel(X, Y, gamma), gaussian_kernel(Y, Y, gamma))
            Dk = np.sqrt(sq_dists(Phi))
            err = [np.linalg.norm(E - D) / np.linalg.norm(D) for E in (Dsq, Dpl, Dl)]
            rec = [recall(knn_sets(E, k), true_nn) for E in (Dsq, Dpl, Dl, Dk)]
            print(
                f"| {name} | {X.shape[0]} × {X.shape[1]} | {n_y} | "
                + " | ".join(f"{e:.3f}" for e in err)
                + " | "
                + " | ".join(f"{r:.3f}" for r in rec)
                + " |",
                flush=True,
            )


if __name__ == "__main__":
    t = time.time()
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="?", default="digits,mnist5k", help="comma-separated built-in data sets")
    main(tuple(ap.parse_args().names.split(",")))
    print(f"\nwall time {time.time() - t:.1f} s")
