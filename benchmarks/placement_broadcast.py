"""The sites' placement alone, on one fixed broadcast (issue 27): to compare placement implementations, or landmark
counts, on exactly the same landmarks, masses, map and ``Zn``.

Usage::

    # 1. the broadcast: the default cells (Fashion-MNIST subset of n records, digits or mnist5k; P iid sites) and the
    #    coordinator's map of them
    OMP_NUM_THREADS=1 python benchmarks/placement_broadcast.py broadcast [--dataset fashion-mnist --n 20000] [--sites 10] \
        [--landmarks L] --out bc.npz
    # 2. place some sites' records against it with the securefed on PYTHONPATH (e.g. an older commit's tree:
    #    git archive 9fe16f9 | tar -x -C /tmp/before; PYTHONPATH=/tmp/before python benchmarks/placement_broadcast.py ...)
    OMP_NUM_THREADS=1 python benchmarks/placement_broadcast.py place bc.npz [--sites-placed 0 1 2] [--pooled]
        [--remap exact|grid]   # redraw the coordinator's map first, pair by pair or on the grid (prints its CPU s)
    # 3. yardsticks (not private: no party holds the pooled records): k-means landmarks on the pooled records, with
    #    every cluster of at least --floor records (smaller ones dropped, their records reassigned), mapped by the
    #    coordinator's map and placed by every site as in step 2
    OMP_NUM_THREADS=1 python benchmarks/placement_broadcast.py yardstick bc.npz --k 1300 [--floor 15]
    #    … or a laminar yardstick: a tree of k-means splits of the pooled records (each cell split by a k-means into
    #    --k parts, else 2, while every part keeps --floor records), its leaves' means as landmarks
    OMP_NUM_THREADS=1 python benchmarks/placement_broadcast.py yardstick bc.npz --tree --k 2 --floor 15

Step 1 runs the landmark stage as ``securefed run`` does (cells, SecAgg+, audit) with ``method none`` and maps the
cells with ``weighted_tsne`` (seed 0); the masses are rescaled to every record as the coordinator does. Step 2 prints
each site's CPU seconds and the CA-10NN among the placed records (``--pooled``: every site's records placed together as
one site, to measure what the split into sites costs). Fashion-MNIST needs the Debian package ``dataset-fashion-mnist``.
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

    ds = load_dataset(a.dataset)
    keep = np.arange(len(ds.X))
    if a.dataset == "fashion-mnist" and a.n < len(ds.X):
        keep = fashion_mnist_subset(len(ds.X), a.n)
    X, y = ds.X[keep], ds.y[keep]
    parts = partition(X, y, a.sites, "iid", random_state=np.random.default_rng(0))
    sites = [X[i] for i in parts]
    plan = RunPlan.build(
        "cli",
        method="none",
        landmark_method="cells",
        keep_rows=True,
        min_sites=1,
        value_bound=float(np.abs(X).max()),  # the public pixel bound: 255 (16 for digits)
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
    E, Zn = d["E"], float(d["Zn"])
    if a.remap:
        from securefed.embedding.placement import weighted_tsne

        t = time.process_time()
        E, Zn = weighted_tsne(d["Y"], d["c"], perplexity=30.0, seed=0, exact=a.remap == "exact")
        print(f"map ({a.remap}, {len(E)} landmarks): {time.process_time() - t:.1f} CPU s", flush=True)
    out, ys = [], []
    if a.pooled:
        t = time.process_time()
        F = np.vstack([d[f"F{i}"] for i in which])
        ys = [d["y"][cuts[i] : cuts[i + 1]] for i in which]
        out.append(place_refine(F, d["Y"], E, d["c"], Zn, perplexity=a.perplexity))
        print(f"pooled: {len(F)} records, {time.process_time() - t:.1f} CPU s", flush=True)
        which = []
    for i in which:
        t = time.process_time()
        out.append(place_refine(d[f"F{i}"], d["Y"], E, d["c"], Zn, perplexity=a.perplexity))
        ys.append(d["y"][cuts[i] : cuts[i + 1]])
        print(f"site {i}: {len(ys[-1])} records, {time.process_time() - t:.1f} CPU s", flush=True)
    ca = classification_accuracy(np.vstack(out), np.concatenate(ys), ks=(10,), random_state=0)[10]
    print(f"CA-10NN among the placed records: {ca:.4f}")


def yardstick(a):
    from securefed.embedding.placement import place_refine, weighted_tsne
    from securefed.metrics import classification_accuracy

    d = np.load(a.broadcast)
    n_sites = sum(1 for k in d.files if k.startswith("F"))
    Fs = [d[f"F{i}"] for i in range(n_sites)]
    F = np.vstack(Fs)
    if a.tree:
        C, c = _kmeans_tree(F, a.k, a.floor)
        what = f"tree of {a.k}-means splits"
    else:
        C, c = _flat_kmeans(F, a.k, a.floor)
        what = "k-means"
    E, Zn = weighted_tsne(C, c, perplexity=30.0, seed=0)
    out = [place_refine(Fi, C, E, c, Zn, perplexity=a.perplexity) for Fi in Fs]
    ca = classification_accuracy(np.vstack(out), d["y"], ks=(10,), random_state=0)[10]
    print(f"{what} yardstick: {len(C)} clusters (smallest {c.min():.0f} records), CA-10NN {ca:.4f}")


def _kmeans_tree(F, k, floor, leaves_out=None):
    """A tree of k-means splits (else 2-means) of ``F`` while every part keeps ``floor`` rows: ``(leaf means, leaf
    sizes)``; with a list ``leaves_out``, each leaf's ``(rows, its parent's rows)`` is appended to it."""
    from sklearn.cluster import KMeans

    leaves: list = []
    parents: list = []
    stack: list = [(np.arange(len(F)), None)]
    while stack:
        idx, up = stack.pop()
        for kk in (k, 2) if k > 2 else (2,):
            if len(idx) < max(2, kk) * floor:
                continue
            part = KMeans(kk, n_init=3, random_state=0).fit_predict(F[idx])
            if np.bincount(part, minlength=kk).min() >= floor:
                stack += [(idx[part == j], idx) for j in range(kk)]
                break
        else:
            leaves.append(idx)
            parents.append(up)
    if leaves_out is not None:
        leaves_out += list(zip(leaves, parents))
    return np.array([F[i].mean(axis=0) for i in leaves]), np.array([len(i) for i in leaves], dtype=np.float64)


def _flat_kmeans(F, k, floor):
    from sklearn.cluster import KMeans

    from securefed.landmarks.celltree import _nearest  # each record's nearest centre, in blocks

    C = KMeans(k, n_init=1, random_state=0, max_iter=50).fit(F).cluster_centers_
    for _ in range(30):  # drop the smaller half of the clusters under the floor, one Lloyd step, until none is
        a_ = _nearest(F, C)
        cnt = np.bincount(a_, minlength=len(C))
        small = np.flatnonzero(cnt < floor)
        if len(small) == 0:
            break
        C = np.delete(C, small[np.argsort(cnt[small], kind="stable")][: max(1, len(small) // 2)], axis=0)
        a_ = _nearest(F, C)
        S = np.zeros_like(C)
        np.add.at(S, a_, F)
        C = S / np.maximum(np.bincount(a_, minlength=len(C)), 1)[:, None]
    a_ = _nearest(F, C)
    c = np.bincount(a_, minlength=len(C)).astype(np.float64)
    return C[c > 0], c[c > 0]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="step", required=True)
    b = sub.add_parser("broadcast")
    b.add_argument("--n", type=int, default=20_000, help="records of Fashion-MNIST (a seeded subset)")
    b.add_argument("--dataset", default="fashion-mnist", help="or digits, mnist5k (all their records)")
    b.add_argument("--sites", type=int, default=10)
    b.add_argument("--landmarks", type=int, default=None, help="cap on the cells (default: auto, as securefed run)")
    b.add_argument("--out", default="broadcast.npz")
    p = sub.add_parser("place")
    p.add_argument("broadcast")
    p.add_argument("--sites-placed", nargs="+", type=int, default=None)
    p.add_argument("--perplexity", type=float, default=10.0)
    p.add_argument("--pooled", action="store_true")
    p.add_argument("--remap", choices=["exact", "grid"], default=None)
    y = sub.add_parser("yardstick")
    y.add_argument("broadcast")
    y.add_argument("--k", type=int, required=True)
    y.add_argument("--floor", type=int, default=1)
    y.add_argument("--tree", action="store_true")
    y.add_argument("--perplexity", type=float, default=10.0)
    a = ap.parse_args()
    {"broadcast": broadcast, "place": place, "yardstick": yardstick}[a.step](a)


if __name__ == "__main__":
    main()
