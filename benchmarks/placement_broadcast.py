"""The sites' placement alone, on one fixed broadcast (issue 27): to compare placement implementations, or landmark
counts, on exactly the same landmarks, masses, map and ``Zn``.

Usage::

    # 1. the broadcast: the default cells on Fashion-MNIST (n records, P iid sites), the coordinator's map of them
    OMP_NUM_THREADS=1 python benchmarks/placement_broadcast.py broadcast --n 20000 --sites 10 [--landmarks 300] --out bc.npz
    # 2. place some sites' records against it with the securefed on PYTHONPATH (e.g. an older commit's tree:
    #    git archive 9fe16f9 | tar -x -C /tmp/before; PYTHONPATH=/tmp/before python benchmarks/placement_broadcast.py ...)
    OMP_NUM_THREADS=1 python benchmarks/placement_broadcast.py place bc.npz [--sites-placed 0 1 2]

Step 1 runs the landmark stage as ``securefed run`` does (cells, SecAgg+, audit) with ``method none`` and maps the
cells with ``weighted_tsne`` (seed 0); the masses are rescaled to every record as the coordinator does. Step 2 prints
each site's CPU seconds and the CA-10NN among the placed records. Needs the Debian package ``dataset-fashion-mnist``.
"""

from __future__ import annotations

import argparse
import time
import warnings

import numpy as np

warnings.filterwarnings("ignore")


def broadcast(a):
    from securefed.data import fashion_mnist_subset, load_dataset, partition
    from securefed.embedding.placement import weighted_tsne
    from securefed.federation import run_in_process
    from securefed.plan import RunPlan

    ds = load_dataset("fashion-mnist")
    keep = fashion_mnist_subset(len(ds.X), a.n) if a.n < len(ds.X) else np.arange(len(ds.X))
    X, y = ds.X[keep], ds.y[keep]
    parts = partition(X, y, a.sites, "iid", random_state=np.random.default_rng(0))
    sites = [X[i] for i in parts]
    plan = RunPlan.build(
        "cli",
        method="none",
        landmark_method="cells",
        keep_rows=True,
        min_sites=1,
        value_bound=255.0,
        landmarks=a.landmarks,
    )
    t = time.process_time()
    res = run_in_process(plan, sites)
    N = float(sum(len(s) for s in sites))
    c = res.masses * (N / res.masses.sum())
    E, Zn = weighted_tsne(res.landmarks, c, perplexity=30.0, seed=0)
    print(
        f"cells {len(res.landmarks)}, audit AUC {res.audit['auc']:.3f} ({res.audit['verdict']}), "
        f"{time.process_time() - t:.1f} CPU s, map span {np.ptp(E, axis=0)}",
        flush=True,
    )
    np.savez(
        a.out,
        Y=res.landmarks,
        E=E,
        c=c,
        Zn=Zn,
        y=np.concatenate([y[i] for i in parts]),
        **{f"F{i}": res.landmark_space.features(s) for i, s in enumerate(sites)},
    )


def place(a):
    from securefed.embedding.placement import place_refine
    from securefed.metrics import classification_accuracy

    d = np.load(a.broadcast)
    n_sites = sum(1 for k in d.files if k.startswith("F"))
    which = a.sites_placed if a.sites_placed is not None else list(range(n_sites))
    cuts = np.cumsum([0] + [len(d[f"F{i}"]) for i in range(n_sites)])
    out, ys = [], []
    for i in which:
        t = time.process_time()
        out.append(place_refine(d[f"F{i}"], d["Y"], d["E"], d["c"], float(d["Zn"]), perplexity=a.perplexity))
        ys.append(d["y"][cuts[i] : cuts[i + 1]])
        print(f"site {i}: {len(ys[-1])} records, {time.process_time() - t:.1f} CPU s", flush=True)
    ca = classification_accuracy(np.vstack(out), np.concatenate(ys), ks=(10,), random_state=0)[10]
    print(f"CA-10NN among the placed records: {ca:.4f}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="step", required=True)
    b = sub.add_parser("broadcast")
    b.add_argument("--n", type=int, default=20_000)
    b.add_argument("--sites", type=int, default=10)
    b.add_argument("--landmarks", type=int, default=300)
    b.add_argument("--out", default="broadcast.npz")
    p = sub.add_parser("place")
    p.add_argument("broadcast")
    p.add_argument("--sites-placed", nargs="+", type=int, default=None)
    p.add_argument("--perplexity", type=float, default=10.0)
    a = ap.parse_args()
    broadcast(a) if a.step == "broadcast" else place(a)


if __name__ == "__main__":
    main()
