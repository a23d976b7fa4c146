"""Cells with axis points (``cell_axes``): every cell also stands for μ ± √λ·v along its top principal axes —
post-processing of the cell's count, sum and second moments, all over ≥ floor records."""

import numpy as np
import pytest

from securefed.data import load_dataset, partition
from securefed.federation import run_in_process
from securefed.landmarks.cells import axis_points
from securefed.plan import RunPlan


def test_axis_points_are_the_cells_sigma_points():
    rng = np.random.default_rng(0)
    k, d = 4, 6
    Y = rng.normal(size=(k, d))
    A = rng.normal(size=(k, d, d))
    cov = A @ np.transpose(A, (0, 2, 1))
    c = np.array([20.0, 31.0, 17.0, 50.0])
    P, m = axis_points(Y, c, cov, 2)
    assert P.shape == (k * 5, d) and m.shape == (k * 5,)
    np.testing.assert_allclose(m.reshape(k, 5).sum(axis=1), c)  # each cell's mass shared, none created
    pts = P.reshape(k, 5, d)
    np.testing.assert_allclose(pts.mean(axis=1), Y, atol=1e-12)  # symmetric about the mean
    np.testing.assert_allclose(pts[:, 0], Y)
    for L in range(k):
        w, V = np.linalg.eigh(cov[L])
        for j, (lam, v) in enumerate(((w[-1], V[:, -1]), (w[-2], V[:, -2]))):
            a = pts[L, 1 + 2 * j] - Y[L]
            np.testing.assert_allclose(np.linalg.norm(a), np.sqrt(lam), rtol=1e-10)  # √λ_j along v_j
            assert abs(abs(a @ v) - np.sqrt(lam)) < 1e-8
            np.testing.assert_allclose(pts[L, 2 + 2 * j] - Y[L], -a)
    same = axis_points(Y, c, cov, 0)
    assert same[0] is Y and same[1] is c
    assert axis_points(Y, c, cov, 99)[0].shape == (k * (1 + 2 * d), d)  # at most d axes


def test_a_cells_run_with_axes_uses_the_leaves_second_moments():
    """With axes, the landmarks are the cell tree's leaves — their means and μ ± √λ₁·v₁, λ₁ of the covariance released
    for the leaf — checked against the leaves recomputed from the records (the same tree built on the pooled records: its queries are a function of the sums)."""
    from securefed.landmarks.celltree import CellsPlan, CellTree

    ds = load_dataset("digits")
    sites = [ds.X[i] for i in partition(ds.X, ds.y, 3, "iid", random_state=0)]
    base = dict(aggregation="plain", method="none", audit_holdout=0.0, seed=0, landmark_method="cells", cell_floor=25)
    res1 = run_in_process(RunPlan.build("api", cell_axes=1, **base), sites, site_options={"allow-plain": True})
    k = res1.landmark_info["cells"]
    assert res1.landmark_info["axes"] == 1 and len(res1.landmarks) == 3 * k
    assert res1.masses.sum() == pytest.approx(len(ds.X))
    means = res1.landmarks.reshape(k, 3, -1)[:, 0]
    X = np.vstack(sites)
    plan = CellsPlan(
        floor=25,
        basis_dim=50,
        max_cells=min(300, len(X) // 25),
        max_levels=12,
        scale=1.0,
        n_max=max(len(s) for s in sites),
        axes=1,
    )
    tree = CellTree(plan, X.shape[1])
    while (q := tree.next_query()) is not None:
        tree.absorb(q, sum(tree.upload(q, S) for S in sites))
    F = tree.features(X)
    members = tree.assign(F)
    leaves = tree.leaves()
    assert len(leaves) == k
    for L, leaf in enumerate(leaves):
        R = F[members[leaf.path]]
        assert len(R) == pytest.approx(leaf.count) and len(R) >= 25  # every leaf over at least the floor
        np.testing.assert_allclose(means[L], R.mean(axis=0), atol=1e-6)
        C = np.cov(R.T, bias=True)
        if leaf.proj is not None and len(leaf.proj[0]):
            # what the coordinator holds of a small leaf: its covariance on the released axes U, the per-coordinate
            # variances across the rest (celltree.second_rank: no full second moments of small cells)
            U = leaf.proj[0]
            P = np.eye(len(C)) - U.T @ U
            C = U.T @ (U @ C @ U.T) @ U + P @ np.diag(np.diag(C)) @ P
        lam = np.linalg.eigvalsh(C)[-1]
        assert np.linalg.norm(res1.landmarks[3 * L + 1] - means[L]) == pytest.approx(np.sqrt(lam), rel=1e-6)
    assert any("principal axes" in r["what"] for r in res1.inventory)


def test_cell_axes_must_be_a_non_negative_integer():
    from securefed.errors import ConfigError

    with pytest.raises(ConfigError, match="cell_axes"):
        RunPlan.build("api", cell_axes=-1, value_bound=1.0)
