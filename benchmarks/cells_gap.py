"""Where the default map loses against the former federated k-means cells (issue 24): the product's cell tree beside
what each privacy rule of the tree forbids, on the same members, map and placement.

Usage::

    OMP_NUM_THREADS=1 python benchmarks/cells_gap.py [--datasets digits mnist5k] [--partitions iid label] [--seeds 0 1 2]
        [--sites 10]

For every data set, partition and seed: the records split into ``--sites`` sites (as ``private_map.py``), each site keeps 20 %
of its records out of the landmarks (the audit hold-out of the default run) and every record is placed. The product's
cell tree is built with the default cells plan on the pooled sums of the members (the tree's queries are a function of
the sums, so it is the federated tree without the secure sum's rounding); the landmarks are then drawn these ways,
mapped by the coordinator's map (``weighted_tsne``, seed 0) and every site places its records (``place_refine``):

* ``tree``: the product's landmarks (``CellTree.landmarks``: the leaves' Gaussian mixture with their released moments);
* ``tree, full leaf moments``: the same leaves, the mixture drawn with each leaf's full covariance from its records —
  what releasing every leaf's ``Σffᵀ`` would give (the membership leak of BENCHMARKS §14b);
* ``tree, leaf means``: the same leaves, their means as landmarks;
* ``oracle tree, leaf means``: a tree of exact 2-means splits of the pooled members (≥ the plan's floor), which no site
  can compute — the split rule's whole room under the laminar rule;
* ``oracle tree, released moments``: the same leaves drawn as the product draws its own — a mixture with what the
  product would release of each leaf (``Σf``, ``Σf²``, the block on ``second_rank`` axes of its parent) — so that it
  differs from ``tree`` by the split rule alone;
* ``Otsu + T Lloyd steps, released moments`` (T from ``--lloyd-steps``, default 0 1 2): each cell cut in two through
  the top principal axis of its records' full covariance (Otsu on a 12-bin histogram, as the product cuts along its
  first released axis), then T full-dimensional Lloyd steps on its records (while both halves keep the floor), the
  leaves drawn as above. T = 0 measures what the exact top axis alone buys (the product's comes from the released
  moments); each further step sums over tentative halves that move between steps;
* ``tree, 2-means of the histogram's bins``: the product's tree with each split chosen as a 2-means of the released
  12 × 12 histogram's bins (then each half's bins again) instead of Otsu cuts of its marginals (:class:`BinsTree`);
* ``flat k-means ≥ floor``: k-means on the pooled members with every cluster ≥ the floor — the Voronoi cells that move
  between Lloyd rounds (the 9fe16f9 design whose successive sums isolated records).

Only the first is private; the others are yardsticks (no party holds the pooled records). Prints CA-10NN per seed and a
markdown table (mean ± sd over the seeds).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings

import numpy as np

warnings.filterwarnings("ignore")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

VARIANTS = (
    "tree",
    "tree, full leaf moments",
    "tree, leaf means",
    "oracle tree, leaf means",
    "oracle tree, released moments",
    "tree, 2-means of the histogram's bins",
    "flat k-means ≥ floor",
)


def _lloyd_tree(F, floor, steps, leaves_out):
    """Cells cut as the product cuts them (Otsu on a 12-bin histogram along the top principal axis of the records),
    then ``steps`` Lloyd steps on the cell's records while both halves keep ``floor``; each leaf's ``(rows, its
    parent's rows)`` is appended to ``leaves_out``."""
    from securefed.landmarks.celltree import BINS, best_cut, bin_edges

    stack: list = [(np.arange(len(F)), None)]
    while stack:
        idx, up = stack.pop()
        X, lab = F[idx], None
        if len(idx) >= 2 * floor:
            w, V = np.linalg.eigh(np.cov(X.T, bias=True))
            x = (X - X.mean(axis=0)) @ V[:, -1]
            b = np.searchsorted(bin_edges(w[-1], len(X)), x, side="right")
            cut = best_cut(np.bincount(b, minlength=BINS).astype(np.float64), floor)
            if cut is not None:
                lab = (b >= cut).astype(int)
                for _ in range(steps):
                    M = np.array([X[lab == j].mean(axis=0) for j in (0, 1)])
                    new = np.argmin(((X[:, None, :] - M[None]) ** 2).sum(-1), axis=1)
                    if np.bincount(new, minlength=2).min() < floor:
                        break
                    lab = new
        if lab is None:
            leaves_out.append((idx, up))
        else:
            stack += [(idx[lab == j], idx) for j in (0, 1)]


def _bins_tree():
    """:class:`~securefed.landmarks.celltree.CellTree` whose splits are 2-means of the released histogram's bins."""
    from securefed.landmarks import celltree as ct

    class BinsTree(ct.CellTree):
        @staticmethod
        def _positions(edges):
            cs = []
            for e in edges:
                w = e[1] - e[0]
                cs.append(np.concatenate([[e[0] - w / 2], (e[:-1] + e[1:]) / 2, [e[-1] + w / 2]]))
            if len(cs) == 1:
                return cs[0][:, None]
            a, b = np.meshgrid(cs[0], cs[1], indexing="ij")
            return np.column_stack([a.ravel(), b.ravel()])

        @staticmethod
        def _two_means(P, h, lab, floor):
            """Weighted Lloyd steps on the bins (positions P, counts h) from labels ``lab``, while both sides keep
            ``floor``."""
            for _ in range(50):
                C = np.array([(h[lab == j, None] * P[lab == j]).sum(0) / max(h[lab == j].sum(), 1e-12) for j in (0, 1)])
                new = np.argmin(((P[:, None, :] - C[None]) ** 2).sum(-1), axis=1)
                new[h == 0] = lab[h == 0]
                if np.array_equal(new, lab) or np.bincount(new, weights=h, minlength=2).min() < floor:
                    break
                lab = new
            return lab

        def _absorb_counts(self, total):
            pos, accepted = 0, []
            room = int(self.plan.max_cells) - self._n_leaves()
            for cell in self.frontier:
                na, k = len(cell.axes), ct.BINS ** len(cell.axes)
                h = np.round(total[pos : pos + k])
                pos += k
                P, floor = self._positions(cell.edges), self.floor_of(cell)
                marg = h.reshape((ct.BINS,) * na)
                cut = ct.best_cut(marg if na == 1 else marg.sum(axis=1), floor) if room >= 1 else None
                if cut is None:
                    cell.leaf, cell.axes, cell.centre, cell.edges = True, None, None, None
                    continue
                room -= 1
                lab = self._two_means(P, h, (np.arange(k) // ct.BINS ** (na - 1) >= cut).astype(int), floor)
                child, nk = lab, 2
                if na == 2 and room >= 1:
                    child, nk = np.zeros(k, dtype=int), 0
                    for side in (0, 1):
                        bins = np.flatnonzero(lab == side)
                        Ps, hs = P[bins], h[bins]
                        m = hs @ Ps / hs.sum()
                        u = np.linalg.eigh(((Ps - m).T * hs) @ (Ps - m))[1][:, -1]
                        order = np.argsort((Ps - m) @ u, kind="stable")
                        c2 = ct.best_cut(hs[order], floor) if room >= 1 else None
                        l2 = np.zeros(len(bins), dtype=int)
                        if c2 is not None:
                            l2[order[c2:]] = 1
                            l2 = self._two_means(Ps, hs, l2, floor)
                        if c2 is None or np.bincount(l2, weights=hs, minlength=2).min() < floor:
                            child[bins] = nk
                            nk += 1
                        else:
                            room -= 1
                            child[bins] = nk + l2
                            nk += 2
                kids = np.bincount(child, weights=h, minlength=nk)
                cell.bin_child, cell.cut, cell.cuts2 = child, 0, ()
                cell.children = [ct._Node(cell.path + (j,), float(v), np.zeros(self.d)) for j, v in enumerate(kids)]
                accepted.append((cell, nk))
            self.frontier, self.accepted = [], accepted
            self.done = not accepted

        def route(self, cell, F):
            return cell.bin_child[ct.histogram_index(ct.projections(F, cell.centre, cell.axes), cell.edges)]

    return BinsTree


def _one(name: str, scheme: str, seed: int, n_sites: int, steps=(0, 1, 2)) -> dict:
    from placement_broadcast import _flat_kmeans, _kmeans_tree

    from securefed.data import load_dataset, partition
    from securefed.embedding.placement import place_refine, weighted_tsne
    from securefed.federation.landmark_stages import cells_floor, most_cells
    from securefed.landmarks.celltree import (
        CellsPlan,
        CellTree,
        landmark_count,
        mixture_landmarks,
        second_rank,
        split_axes,
    )
    from securefed.metrics import classification_accuracy
    from securefed.plan import RunPlan

    ds = load_dataset(name)
    X, y = ds.X, ds.y
    parts = partition(X, y, n_sites, scheme, random_state=np.random.default_rng(seed))
    members, every = [], []
    for i, idx in enumerate(parts):
        order = np.random.default_rng([seed, i]).permutation(len(idx))
        n_out = int(round(0.2 * len(idx)))
        members.append(X[idx[order[n_out:]]])
        every.append((X[idx], y[idx]))
    run = RunPlan.build("api")
    N = sum(len(m) for m in members)
    floor = cells_floor(int(run.cell_floor), N, None)
    plan = CellsPlan(
        floor=floor,
        basis_dim=int(run.basis_dim),
        max_cells=most_cells(N, floor, None),
        max_levels=int(run.cell_rounds),
        scale=float(np.abs(X).max()),
        n_max=max(len(m) for m in members),
    )
    trees = []
    for kind in (CellTree, _bins_tree()):
        tree = kind(plan, X.shape[1])
        while (q := tree.next_query()) is not None:
            tree.absorb(q, np.sum([tree.upload(q, M) for M in members], axis=0))
        trees.append(tree)
    tree, bins = trees
    Fm = tree.features(np.vstack(members))
    rows = tree.assign(Fm)
    leaves = tree.leaves()
    means = np.array([L.mean for L in leaves])
    counts = np.array([L.count for L in leaves])
    full = np.array([np.cov(Fm[rows[L.path]].T, bias=True) for L in leaves])
    k = tree.n_landmarks()

    def released(leaves):  # a leaf's mixture as the product draws it: Σf², its block on its parent's top r axes
        covs = []
        for rows, up in leaves:
            C = np.cov(Fm[rows].T, bias=True)
            r = second_rank(len(rows), C.shape[0])
            U = split_axes(np.cov(Fm[up].T, bias=True), r) if r else np.zeros((0, len(C)))
            P = np.eye(len(C)) - U.T @ U
            covs.append(U.T @ (U @ C @ U.T) @ U + P @ np.diag(np.diag(C)) @ P)
        M = np.array([Fm[rows].mean(axis=0) for rows, _ in leaves])
        c = np.array([len(rows) for rows, _ in leaves], dtype=np.float64)
        return mixture_landmarks(M, np.array(covs), c, landmark_count(len(M), plan.max_cells), 0)

    oracle: list = []
    Mo, co = _kmeans_tree(Fm, 2, floor, oracle)
    lloyd: dict = {t: [] for t in steps}
    for t in steps:
        _lloyd_tree(Fm, floor, t, lloyd[t])
    marks = {
        "tree": tree.landmarks(seed=0),
        "tree, full leaf moments": mixture_landmarks(means, full, counts, k, 0),
        "tree, leaf means": (means, counts),
        "oracle tree, leaf means": (Mo, co),
        "oracle tree, released moments": released(oracle),
        **{f"Otsu + {t} Lloyd steps, released moments": released(lloyd[t]) for t in steps},
        "tree, 2-means of the histogram's bins": bins.landmarks(seed=0),
        "flat k-means ≥ floor": _flat_kmeans(Fm, k, floor),
    }
    n_all = sum(len(e[0]) for e in every)
    out = {}
    for what, (C, c) in marks.items():
        c = np.asarray(c, dtype=np.float64) * (n_all / np.sum(c))
        E, Zn = weighted_tsne(C, c, perplexity=30.0, seed=0)
        Z = [place_refine(tree.features(Xs), C, E, c, Zn, perplexity=10.0) for Xs, _ in every]
        ys = np.concatenate([ys for _, ys in every])
        out[what] = (classification_accuracy(np.vstack(Z), ys, ks=(10,), random_state=0)[10], len(C))
    return out


def main():
    from private_map import add_grid_args

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_grid_args(ap)
    ap.add_argument("--lloyd-steps", nargs="*", type=int, default=[0, 1, 2], help="rows of Otsu + T Lloyd steps")
    a = ap.parse_args()
    res: dict = {}
    cols = [(name, scheme) for name in a.datasets for scheme in a.partitions]
    for name, scheme in cols:
        for seed in a.seeds:
            t = time.time()
            r = _one(name, scheme, seed, a.sites, tuple(a.lloyd_steps))
            for what, (ca, n) in r.items():
                res.setdefault((name, scheme, what), []).append((ca, n))
            figures = ", ".join(f"{w}: {ca:.4f} ({n})" for w, (ca, n) in r.items())
            print(f"# {name} {scheme} seed {seed} ({time.time() - t:.0f} s): {figures}", flush=True)
    print("\n| landmarks | " + " | ".join(f"{n} {s}" for n, s in cols) + " |")
    print("|---|" + "---|" * len(cols))
    rows = list(VARIANTS[:5]) + [f"Otsu + {t} Lloyd steps, released moments" for t in a.lloyd_steps]
    for what in rows + list(VARIANTS[5:]):
        cells = []
        for name, scheme in cols:
            v = np.array([ca for ca, _ in res[(name, scheme, what)]])
            n = np.mean([n for _, n in res[(name, scheme, what)]])
            cells.append(f"{v.mean():.4f} ± {v.std(ddof=1) if len(v) > 1 else 0.0:.4f} ({n:.0f})")
        print(f"| {what} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
