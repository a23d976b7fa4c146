"""No-rows mode: privacy/utility trade-off of the cell landmarks' minimum cell size ``cell_floor``.

Usage: OMP_NUM_THREADS=1 python benchmarks/audits_cell_floor.py [F ...]   (default 5 10 15 20 30)

MNIST-5k (``load_dataset("mnist5k")``), 10 sites, iid and label partitions, seed 0:
``FedTSNE(nystrom="local", landmark_method="cells", cell_floor=F, audit_holdout=0.2, allow_audit_failure=True)``
(every other option at its default; a floor that fails the default audit policy, AUC ≤ 0.6 and empirical
ε ≤ 1, is still measured and its verdict printed). Columns: the number of cells (``est.landmark_info_``), the
membership audit of the cell landmarks (``est.audit_``: AUC and empirical ε, 95 % lower bound, over the
members vs the 20 % held-out records, nearest + kde scores), CA-10NN of the embedding
(``classification_accuracy(E, y, random_state=0)[10]``) and the wall seconds of the fit.
"""

import sys
import time
import warnings

import numpy as np

from securefed.data import load_dataset, partition
from securefed.estimators import FedTSNE
from securefed.metrics import classification_accuracy

warnings.filterwarnings("ignore")


def main(floors):
    ds = load_dataset("mnist5k")
    print("| partition | floor F | cells | CA-10NN | MIA AUC | empirical ε | audit verdict | s |\n"
          "|---|---|---|---|---|---|---|---|", flush=True)
    for scheme in ("iid", "label"):
        idx = partition(ds.X, ds.y, 10, scheme, random_state=0)
        sites = [ds.X[i] for i in idx]
        y = np.concatenate([ds.y[i] for i in idx])
        for floor in floors:
            t0 = time.perf_counter()
            est = FedTSNE(nystrom="local", landmark_method="cells", cell_floor=floor, audit_holdout=0.2,
                          allow_audit_failure=True, random_state=0).fit(sites)
            ca = classification_accuracy(est.embedding_, y, random_state=0)[10]
            dt = time.perf_counter() - t0
            a, info = est.audit_, est.landmark_info_
            print(f"| {scheme} | {floor} | {info['cells']} | {ca:.3f} | {a['auc']:.3f} | {a['empirical_epsilon']:.2f} | "
                  f"{a['verdict']} | {dt:.0f} |", flush=True)


if __name__ == "__main__":
    main([int(v) for v in sys.argv[1:]] or [5, 10, 15, 20, 30])
