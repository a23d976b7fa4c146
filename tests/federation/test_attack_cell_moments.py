"""The coordinator's membership test on the cell tree's released second moments.

Before this change every child of an accepted split released its full ``Σffᵀ`` (d = 50 basis dimensions) down to
cells of 15 records. The centred scatter of m ≤ d records spans exactly their (m − 1)-dimensional subspace, so the
coordinator — holding the sums, routing a candidate record down the public splits — sees a member's features inside
its cell's span and a non-member's outside: on digits every member had a residual < 1e-6 off some released span
(membership AUC 0.90, the audit of the landmarks meanwhile reporting 0.57 and PASS). Now a cell of m records releases
its second moments on r = ``second_rank(m, d)`` public axes only, where a member's leverage is no longer separable.
The attack below is written here from the definition (route, project, residual / leverage), not with the tree's own
covariance code."""

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

import securefed.landmarks.celltree as ct
from securefed import load_dataset, partition


def _tree_and_split():
    ds = load_dataset("digits")
    rng = np.random.default_rng(0)
    order = rng.permutation(len(ds.X))
    M, H = ds.X[order[:1437]], ds.X[order[1437:]]
    parts = partition(M, ds.y[order[:1437]], 10, "iid", random_state=0)
    plan = ct.CellsPlan(floor=15, basis_dim=50, max_cells=95, max_levels=12, scale=16.0, n_max=len(M))
    tree = ct.CellTree(plan, M.shape[1])
    while (q := tree.next_query()) is not None:
        tree.absorb(q, sum(tree.upload(q, M[i]) for i in parts))  # the pooled total of the sites' uploads
    return tree, M, H


def _released(tree):
    stack, out = [tree.root], []
    while stack:
        c = stack.pop()
        out.append(c)
        stack += list(c.children or [])
    return out


def _blocks(c, d):
    """(U: r × d, the centred scatter on U) of a released cell: the root's full Σffᵀ, else its released block."""
    if c.second is not None:
        U, Q = np.eye(d), c.second
    elif getattr(c, "proj", None) is not None and len(c.proj[0]):
        U, Q = c.proj
    else:
        return None
    g = U @ c.mean
    return U, Q - c.count * np.outer(g, g)


@pytest.mark.slow
def test_released_second_moments_do_not_give_members_away():
    tree, M, H = _tree_and_split()
    d = tree.d
    cells = _released(tree)
    # 1. what is released: no block with r + 8 r^1.5 > m (independently of second_rank's loop)
    for c in cells:
        b = _blocks(c, d)
        if b is not None and c is not tree.root:
            r = len(b[0])
            assert r + 8.0 * r**1.5 <= c.count + 1e-9, (c.path, r, c.count)

    # 2. the attack: for each record, its smallest relative residual off a released block's span, among the cells
    #    on its public path, and its summed leverage z-score along the path
    def scores(X):
        F = tree.features(X)
        memb = tree.assign(F)
        resid = np.full(len(F), np.inf)
        z = np.zeros(len(F))
        for c in cells:
            idx = memb.get(c.path, np.zeros(0, dtype=int))
            b = _blocks(c, d)
            if b is None or len(idx) == 0:
                continue
            U, S = b
            w, V = np.linalg.eigh((S + S.T) / 2.0)
            keep = w > 1e-9 * max(w.max(), 1e-300)
            G = (F[idx] - c.mean) @ U.T
            P = V[:, keep]
            if keep.sum() < len(U):  # a rank-deficient block: the residual off its span
                R = G - (G @ P) @ P.T
                resid[idx] = np.minimum(
                    resid[idx], np.linalg.norm(R, axis=1) / np.maximum(np.linalg.norm(G, axis=1), 1e-12)
                )
            lev = np.einsum("ij,j,ij->i", G @ P, 1.0 / w[keep], G @ P)
            r, m = int(keep.sum()), c.count
            z[idx] -= (lev - r / m) / (np.sqrt(2.0 * r) / m)
        return resid, z

    (rm, zm), (_, zh) = scores(M), scores(H)
    assert np.mean(rm < 1e-6) < 0.01, np.mean(rm < 1e-6)  # on the old tree: every member (1.0)
    y = np.r_[np.ones(len(M)), np.zeros(len(H))]
    auc = roc_auc_score(y, np.r_[zm, zh])
    assert auc < 0.6, auc
