"""Cell landmarks: federated k-means cells in a federated PCA basis, every revealed mean over ≥ ``floor`` records.

The default landmarks of the no-rows mode (beyond the paper; ``docs/what-leaves-each-site.md``). Every arrow
site → coordinator is one secure sum, so the coordinator sees only totals over sites:

0. **basis** — each site sums ``[n_p, Σx, Σxxᵀ]`` (:func:`site_moments`); the coordinator takes the global mean μ
   and the top principal axes V (:func:`pca_basis`) and broadcasts them; a site's features are ``F = (X − μ)V``.
1. **cells** — rounds of a *count pass* (:func:`cell_counts`: records nearest to each landmark) and a *sum pass*
   (:func:`cell_sums`: per-landmark feature sums, counts and, while the cells grow, second moments). Between the
   two passes the coordinator drops every cell that holds fewer than ``floor`` records (:func:`prune`): the dropped
   cells' records move to surviving cells, which can only grow, so **every mean the sum pass reveals is over at
   least ``floor`` records** (the count pass reveals counts, never a sum of features). While growing, every cell
   with at least ``margin · floor`` records splits in two along its own first principal axis, at μ ± 0.8·√λ₁·v₁
   (the two-means split of a Gaussian: both halves survive the floor; :func:`split_cells`).
2. the landmarks are the cell means ``Y`` with their masses ``c`` (the pooled counts) and, with ``axes`` = R > 0,
   each cell's **axis points** μ ± √λ_j·v_j along its top R principal axes (:func:`axis_points`; the sigma points of
   the cell's Gaussian), the cell's mass shared equally among its 1 + 2R points. The last sum pass then carries the
   second moments too; the points are post-processing of a cell's count, sum and second moments (over ≥ ``floor``
   records, like every other revealed statistic). Other sites' records are then represented by the spread of
   their cells, not only by the cells' centres. The points leak more than the means (at floor 15 the membership
   audit fails with them: AUC 0.61–0.62); floor 25 with one axis passes as floor 15 without and maps slightly
   better (``BENCHMARKS.md`` §9g). Off by default (``axes`` = 0).

The membership audit measures what the cells still leak (a cell mean of ≥ 15 records passes the default gate on
MNIST-5k: AUC 0.585; of ≥ 10: 0.58–0.62 depending on the split — ``BENCHMARKS.md``).
"""

from __future__ import annotations

import numpy as np

from ..errors import ConfigError, bad_value
from ..kernels import sq_dists

__all__ = [
    "site_moments",
    "pca_basis",
    "features",
    "nearest_cell",
    "cell_counts",
    "cell_sums",
    "prune",
    "cell_update",
    "split_cells",
    "axis_points",
]


def site_moments(X: np.ndarray) -> np.ndarray:
    """``[n_p, Σx, vec(Σxxᵀ)]`` of one site (1 + m + m² numbers; one secure sum for the basis)."""
    X = np.asarray(X, dtype=np.float64)
    return np.concatenate([[len(X)], X.sum(axis=0), (X.T @ X).ravel()])


def pca_basis(
    total: np.ndarray, m: int, dim: int, standardize: bool = False
) -> tuple[np.ndarray, np.ndarray, float, np.ndarray]:
    """From summed moments: the global mean μ, the top ``dim`` principal axes V (m × dim), the total variance
    tr Σ and the per-feature standard deviations σ.

    With ``standardize`` the axes are those of the correlation matrix and V is returned premultiplied by
    diag(1/σ), so that :func:`features` ``(X − μ)V`` standardises the records first (a constant feature gets
    weight 0); tr Σ is then that of the correlation matrix."""
    n = float(total[0])
    if not n > 1:
        raise ConfigError(bad_value("records", n, "the basis needs at least 2 records over all sites"))
    mu = total[1 : 1 + m] / n
    C = total[1 + m :].reshape(m, m) / n - np.outer(mu, mu)
    C = (C + C.T) / 2.0
    sd = np.sqrt(np.maximum(np.diag(C), 0.0))
    inv = np.where(sd > 1e-12 * max(float(sd.max(initial=0.0)), 1e-300), 1.0 / np.maximum(sd, 1e-300), 0.0)
    if standardize:
        C = C * np.outer(inv, inv)
    w, V = np.linalg.eigh(C)
    V = V[:, np.argsort(w)[::-1][:dim]]
    if standardize:
        V = inv[:, None] * V
    return mu, V, float(max(np.trace(C), 0.0)), sd


def features(X: np.ndarray, mu: np.ndarray, V: np.ndarray) -> np.ndarray:
    """A site's records in the broadcast basis: ``(X − μ) V``."""
    return (np.asarray(X, dtype=np.float64) - mu) @ V


def nearest_cell(F: np.ndarray, Y: np.ndarray) -> np.ndarray:
    return np.argmin(sq_dists(F, Y), axis=1)


def cell_counts(F: np.ndarray, Y: np.ndarray) -> np.ndarray:
    """Count pass: how many of this site's records are nearest to each landmark (k numbers)."""
    return np.bincount(nearest_cell(F, Y), minlength=len(Y)).astype(np.float64)


def cell_sums(F: np.ndarray, Y: np.ndarray, second_moments: bool = False) -> np.ndarray:
    """Sum pass: per landmark ``Σx`` (k·d), the count (k) and, with ``second_moments``, ``Σxxᵀ`` (k·d²)."""
    a = nearest_cell(F, Y)
    k, d = Y.shape
    S = np.zeros((k, d))
    np.add.at(S, a, F)
    c = np.bincount(a, minlength=k).astype(np.float64)
    parts = [S.ravel(), c]
    if second_moments:
        Q = np.zeros((k, d, d))
        np.add.at(Q, a, F[:, :, None] * F[:, None, :])
        parts.append(Q.ravel())
    return np.concatenate(parts)


def prune(Y: np.ndarray, counts: np.ndarray, floor: int) -> np.ndarray:
    """The landmarks whose cell holds at least ``floor`` records (a typed error when none does)."""
    keep = counts >= floor
    if not keep.any():  # never reveal a mean over fewer than floor records
        raise ConfigError(
            bad_value(
                "cell_floor",
                floor,
                f"no cell holds {floor} records ({int(counts.sum())} in all); lower the floor or bring more records",
            )
        )
    return Y[keep]


def cell_update(total: np.ndarray, k: int, d: int, second_moments: bool = False):
    """Cell means, counts and (with ``second_moments``) covariances from a sum pass's total."""
    S = total[: k * d].reshape(k, d)
    c = total[k * d : k * d + k]
    Y = S / np.maximum(c, 1e-12)[:, None]
    cov = None
    if second_moments:
        Q = total[k * d + k :].reshape(k, d, d) / np.maximum(c, 1e-12)[:, None, None]
        cov = Q - Y[:, :, None] * Y[:, None, :]
    return Y, c, cov


def split_cells(
    Y: np.ndarray, c: np.ndarray, cov: np.ndarray, k_target: int, floor: int, margin: float = 2.0
) -> np.ndarray:
    """Split the fullest cells along their principal axes, up to ``k_target`` landmarks: a cell with at least
    ``2 · margin · floor`` records splits in four (μ ± 0.8·√λ₁·v₁ ± 0.8·√λ₂·v₂), one with at least ``margin · floor``
    in two (μ ± 0.8·√λ₁·v₁) — the two-means split of a Gaussian, whose halves each keep about half the records.
    Returns the new landmarks (unchanged when nothing may split)."""
    k = len(Y)
    elig = np.flatnonzero(c >= margin * floor)
    elig = elig[np.argsort(-c[elig])]
    room = max(0, k_target - k)
    quad, pair, grown = [], [], 0
    for i in elig:
        if c[i] >= 2 * margin * floor and Y.shape[1] >= 2 and grown + 3 <= room:
            quad.append(i)
            grown += 3
        elif grown + 1 <= room:
            pair.append(i)
            grown += 1
    if not quad and not pair:
        return Y
    keep = np.ones(k, bool)
    keep[quad + pair] = False
    out = [Y[keep]]
    for idx, n_axes in ((pair, 1), (quad, 2)):
        if not idx:
            continue
        w, V = np.linalg.eigh(cov[idx])
        a1 = V[:, :, -1] * np.sqrt(np.maximum(w[:, -1], 0.0))[:, None] * 0.8
        if n_axes == 1:
            out += [Y[idx] + a1, Y[idx] - a1]
        else:
            a2 = V[:, :, -2] * np.sqrt(np.maximum(w[:, -2], 0.0))[:, None] * 0.8
            out += [Y[idx] + a1 + a2, Y[idx] + a1 - a2, Y[idx] - a1 + a2, Y[idx] - a1 - a2]
    return np.vstack(out)


def axis_points(Y: np.ndarray, c: np.ndarray, cov: np.ndarray, axes: int) -> tuple[np.ndarray, np.ndarray]:
    """Every cell as ``1 + 2·axes`` landmarks: its mean μ and μ ± √λ_j·v_j for its top ``axes`` principal axes
    (λ_j, v_j of the cell's covariance), each with mass ``c / (1 + 2·axes)``. Returns ``(landmarks, masses)``,
    the points of cell L at rows ``L·(1 + 2·axes) …``; ``axes = 0`` returns the means and counts unchanged."""
    if axes <= 0:
        return Y, c
    k, d = Y.shape
    r = min(int(axes), d)
    w, V = np.linalg.eigh(cov)  # ascending eigenvalues per cell
    pts = [Y[:, None, :]]
    for j in range(r):
        a = V[:, :, -1 - j] * np.sqrt(np.maximum(w[:, -1 - j], 0.0))[:, None]
        pts += [(Y + a)[:, None, :], (Y - a)[:, None, :]]
    P = np.concatenate(pts, axis=1)
    return P.reshape(k * (1 + 2 * r), d), np.repeat(np.asarray(c, dtype=np.float64) / (1 + 2 * r), 1 + 2 * r)
