"""The cells' shared pieces: the federated PCA basis, a site's features in it, nearest-landmark counts, axis points.

The default landmarks of the no-rows mode are the cell tree of :mod:`securefed.landmarks.celltree` (each query
recomputed by every site; ``docs/what-leaves-each-site.md``). What it and the other stages take from here:

* :func:`site_moments` / :func:`pca_basis` — the basis sum ``[n_p, Σx, Σxxᵀ]`` of each site (one secure sum) and
  the global mean μ, the top principal axes V and the spread it gives; :func:`features` — a site's records
  ``F = (X − μ)V`` in that basis;
* :func:`cell_counts` — how many of a site's records are nearest to each landmark (the placement's own share of a
  cell's mass; the billboard's release 2);
* :func:`axis_points` — with ``cell_axes`` = R > 0, each cell's points μ ± √λ_j·v_j along its top R principal axes
  (the sigma points of the cell's Gaussian), the cell's mass shared among its 1 + 2R points: post-processing of a
  cell's released count, sums and second moments. They leak more than the means (at floor 15 the membership audit
  failed with them: AUC 0.61–0.62, ``BENCHMARKS.md`` §9g). Off by default.
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
