"""What the cell tree's released sums say about membership (BENCHMARKS §14b–c).

Three measurements, each on the pooled sums of the default cells (the tree is a deterministic function of the sums,
so building it on the pooled members gives the coordinator's view):

* ``--leverage DATA ...`` — the coordinator's leverage test: route each candidate record down the public splits and
  add up its z-scores ``(lev − r/m) / (√(2r)/m)`` under every released second-moment block on its path (members vs
  the held-out records); with ``--c`` the constant of ``celltree.second_rank`` (8 by default).
* ``--span DATA ...`` — the residual test against full second moments: the share of members whose features lie in a
  released cell's span (residual < 1e-6), and the AUC of the residual.
* ``--audit-sizes N ...`` — the default run's own membership audit on ``make_blobs(N, 50 features, 20 centres)``,
  10 iid sites (``--dim-floor`` sets ``celltree.DIM_FLOOR``).

DATA is a built-in data set (``digits``, ``mnist5k``) or ``blobs:N``.

    OMP_NUM_THREADS=1 python benchmarks/cells_moments.py --leverage digits blobs:1000 blobs:2000 --c 2 4 8
    OMP_NUM_THREADS=1 python benchmarks/cells_moments.py --span digits
    OMP_NUM_THREADS=1 python benchmarks/cells_moments.py --audit-sizes 400 1000 2000 10000
"""

import argparse
import time

import numpy as np


def _data(name: str):
    from sklearn.datasets import make_blobs

    from securefed import load_dataset

    if name.startswith("blobs:"):
        X, y = make_blobs(n_samples=int(name.split(":")[1]), n_features=50, centers=20, random_state=0)
        return X, y
    ds = load_dataset(name)
    return ds.X, ds.y


def _members(X, y):
    """Each of 10 iid sites' members and hold-out, as the product splits them (hold-out 0.2, seed 0)."""
    from securefed import partition
    from securefed.federation.inprocess import site_names
    from securefed.federation.site import SiteWorker

    idx = partition(X, y, 10, "iid", random_state=0)
    splits = [SiteWorker({"site-name": n}, X[i]).split(0.2, 0) for n, i in zip(site_names(len(idx)), idx)]
    return np.vstack([a for a, _ in splits]), np.vstack([b for _, b in splits])


def _tree(M, scale: float):
    import securefed.landmarks.celltree as ct

    plan = ct.CellsPlan(
        floor=15, basis_dim=50, max_cells=min(300, len(M) // 15), max_levels=12, scale=scale, n_max=len(M)
    )
    tree = ct.CellTree(plan, M.shape[1])
    while (q := tree.next_query()) is not None:
        tree.absorb(q, tree.upload(q, M))
    return tree


def _cells(tree):
    stack, out = [tree.root], []
    while stack:
        c = stack.pop()
        out.append(c)
        stack += list(c.children or [])
    return out


def _blocks(c, d: int):
    if c.second is not None:
        U, Q = np.eye(d), c.second
    elif getattr(c, "proj", None) is not None and len(c.proj[0]):
        U, Q = c.proj
    else:
        return None
    g = U @ c.mean
    S = Q - c.count * np.outer(g, g)
    return U, (S + S.T) / 2.0


def _scores(tree, X):
    """(smallest relative residual off a released block's span, summed leverage z-score) along each record's path."""
    F = tree.features(X)
    memb = tree.assign(F)
    resid, z = np.full(len(F), np.inf), np.zeros(len(F))
    for c in _cells(tree):
        idx = memb.get(c.path, np.zeros(0, dtype=int))
        b = _blocks(c, tree.d)
        if b is None or len(idx) == 0:
            continue
        U, S = b
        w, V = np.linalg.eigh(S)
        keep = w > 1e-9 * max(float(w.max()), 1e-300)
        G = (F[idx] - c.mean) @ U.T
        P = V[:, keep]
        if keep.sum() < len(U):
            R = G - (G @ P) @ P.T
            rel = np.linalg.norm(R, axis=1) / np.maximum(np.linalg.norm(G, axis=1), 1e-12)
            resid[idx] = np.minimum(resid[idx], rel)
        GP = G @ P
        lev = np.einsum("ij,j,ij->i", GP, 1.0 / w[keep], GP)
        r, m = int(keep.sum()), float(c.count)
        z[idx] -= (lev - r / m) / (np.sqrt(2.0 * r) / m)
    return resid, z


def _auc(members, others) -> float:
    from sklearn.metrics import roc_auc_score

    s = np.r_[members, others]
    finite = s[np.isfinite(s)]
    top = float(np.abs(finite).max()) + 1.0 if finite.size else 1.0
    s = np.where(np.isfinite(s), s, np.sign(s) * top)  # ±inf (no rank-deficient block on the path): the extremes
    return float(roc_auc_score(np.r_[np.ones(len(members)), np.zeros(len(others))], s))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--leverage", nargs="*", default=[], metavar="DATA")
    ap.add_argument("--span", nargs="*", default=[], metavar="DATA")
    ap.add_argument("--c", nargs="+", type=float, default=[8.0], help="celltree.SECOND_RANK_C values (--leverage)")
    ap.add_argument("--audit-sizes", nargs="*", type=int, default=[], metavar="N")
    ap.add_argument("--dim-floor", type=float, default=None, help="celltree.DIM_FLOOR for --audit-sizes")
    a = ap.parse_args()
    import securefed.landmarks.celltree as ct

    print(f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    for name in a.leverage:
        X, y = _data(name)
        M, H = _members(X, y)
        for c in a.c:
            ct.SECOND_RANK_C = float(c)
            tree = _tree(M, float(np.ceil(np.abs(X).max())))
            (_, zm), (_, zh) = _scores(tree, M), _scores(tree, H)
            print(f"leverage {name} c={c:g}: leaves {len(tree.leaves())}, path-leverage AUC {_auc(zm, zh):.3f}")
    for name in a.span:
        X, y = _data(name)
        M, H = _members(X, y)
        tree = _tree(M, float(np.ceil(np.abs(X).max())))
        (rm, _), (rh, _) = _scores(tree, M), _scores(tree, H)
        print(f"span {name}: members with residual < 1e-6 {np.mean(rm < 1e-6):.3f}, residual AUC {_auc(-rm, -rh):.3f}")
    if a.audit_sizes:
        from securefed.data import partition
        from securefed.federation.inprocess import run_in_process
        from securefed.plan import RunPlan

        if a.dim_floor is not None:
            ct.DIM_FLOOR = float(a.dim_floor)
        for n in a.audit_sizes:
            X, y = _data(f"blobs:{n}")
            parts = partition(X, y, 10, "iid", random_state=0)
            plan = RunPlan.build(
                "api",
                method="none",
                landmark_method="cells",
                value_bound=float(np.ceil(np.abs(X).max())),
                allow_audit_failure=True,
                seed=0,
            )
            t = time.time()
            res = run_in_process(plan, [X[i] for i in parts])
            print(
                f"audit blobs {n}: floor {res.landmark_info['floor']}, cells {res.landmark_info['cells']}, "
                f"landmarks {len(res.landmarks)}, AUC {res.audit['mia']['auc']:.3f}, round trips "
                f"{res.round_trips}, {time.time() - t:.1f} s"
            )


if __name__ == "__main__":
    main()
