"""No-rows mode: privacy/utility trade-off of the Lloyd refinement floor (issue 5).

Usage: OMP_NUM_THREADS=1 python benchmarks/audits_refine_tradeoff.py [F:R ...]   (default 5:10 10:10 20:10 20:3 40:10)
Digits, 10 sites, label partition, 300 landmarks, seed 0: CA-10NN of FedTSNE(nystrom="local") and the
membership audit (nearest + kde scores) on the refined landmarks.
"""

import sys
import warnings

import numpy as np

from securefed.audits import membership_audit
from securefed.data import load_dataset, partition
from securefed.estimators import FedTSNE
from securefed.metrics import classification_accuracy

warnings.filterwarnings("ignore")


def main(settings):
    ds = load_dataset("digits")
    idx = partition(ds.X, ds.y, 10, "label", random_state=0)
    sites = [ds.X[i] for i in idx]
    y = np.concatenate([ds.y[i] for i in idx])
    print("| floor F | rounds R | CA-10NN | MIA AUC | empirical ε |\n|---|---|---|---|---|")
    for floor, rounds in settings:
        out = {}

        def auditor(members, holdout, res):
            out["mia"] = membership_audit(members, holdout, res.landmarks, res.gamma, scores=("nearest", "kde"),
                                          random_state=0).to_dict()
            return {}

        est = FedTSNE(nystrom="local", refine_rounds=rounds, refine_min_cluster=floor, auditor=auditor,
                      audit_holdout=0.2, random_state=0).fit(sites)
        ca = classification_accuracy(est.embedding_, y, random_state=0)[10]
        print(f"| {floor} | {rounds} | {ca:.3f} | {out['mia']['auc']:.3f} | {out['mia']['empirical_epsilon']:.2f} |", flush=True)


if __name__ == "__main__":
    args = sys.argv[1:] or ["5:10", "10:10", "20:10", "20:3", "40:10"]
    main([tuple(int(v) for v in a.split(":")) for a in args])
