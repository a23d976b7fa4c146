"""No-rows mode: privacy/utility trade-off of the cell landmarks' minimum cell size ``cell_floor``.

Usage: OMP_NUM_THREADS=1 python benchmarks/audits_cell_floor.py [F ...] [--holdout H ...]
       (default floors 5 10 15 20 30, hold-out 0.2)

MNIST-5k (``load_dataset("mnist5k")``), 10 sites, iid and label partitions, seed 0:
``FedTSNE(nystrom="local", landmark_method="cells", cell_floor=F, audit_holdout=H, allow_audit_failure=True)``
(every other option at its default; a floor that fails the default audit policy, AUC ≤ 0.6 and empirical
ε ≤ 1, is still measured and its verdict printed). Columns: the number of cells (``est.landmark_info_``), the
membership audit of the cell landmarks (``est.audit_``: AUC and empirical ε, 95 % lower bound, over the
members vs the held-out records (a share H of each site's records: a smaller H puts more records in the cells
but leaves the audit fewer non-members), nearest + kde scores), CA-10NN of the embedding
(``classification_accuracy(E, y, random_state=0)[10]``) and the wall seconds of the fit.
"""

import argparse
import time
import warnings

import numpy as np

from securefed.data import load_dataset, partition
from securefed.estimators import FedTSNE
from securefed.metrics import classification_accuracy

warnings.filterwarnings("ignore")


def main(floors, holdouts):
    ds = load_dataset("mnist5k")
    print(
        "| partition | floor F | hold-out H | cells | CA-10NN | MIA AUC | empirical ε | audit verdict | s |\n"
        "|---|---|---|---|---|---|---|---|---|",
        flush=True,
    )
    for scheme in ("iid", "label"):
        idx = partition(ds.X, ds.y, 10, scheme, random_state=0)
        sites = [ds.X[i] for i in idx]
        y = np.concatenate([ds.y[i] for i in idx])
        for floor, hold in [(f, h) for f in floors for h in holdouts]:
            t0 = time.perf_counter()
            est = FedTSNE(
                nystrom="local",
                landmark_method="cells",
                cell_floor=floor,
                audit_holdout=hold,
                aggregation="plain",
                allow_audit_failure=True,
                random_state=0,
            ).fit(sites)
            ca = classification_accuracy(est.embedding_, y, random_state=0)[10]
            dt = time.perf_counter() - t0
            a, info = est.audit_, est.landmark_info_
            print(
                f"| {scheme} | {floor} | {hold:g} | {info['cells']} | {ca:.3f} | {a['auc']:.3f} | {a['empirical_epsilon']:.2f} | "
                f"{a['verdict']} | {dt:.0f} |",
                flush=True,
            )


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("floors", nargs="*", type=int, default=[5, 10, 15, 20, 30])
    ap.add_argument("--holdout", nargs="+", type=float, default=[0.2])
    args = ap.parse_args()
    main(args.floors, args.holdout)
