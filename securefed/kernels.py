"""Squared distances, the Gaussian kernel and bandwidth heuristics (rows = points).

Qiao et al. §3.1: ``K_{X,Y} = exp(−γ D²)`` with
``D² = diag(X Xᵀ) 1ᵀ − 2 X Yᵀ + 1 diag(Y Yᵀ)ᵀ`` (row convention).
"""

from __future__ import annotations

import numpy as np

from .errors import ConfigError, bad_value

__all__ = ["sq_dists", "gaussian_kernel", "median_gamma", "local_median_sq_dist", "check_gamma"]


def sq_dists(A: np.ndarray, B: np.ndarray | None = None) -> np.ndarray:
    """Squared Euclidean distances between the rows of ``A`` and ``B`` (Qiao et al. §3.1, D²).

    Negative round-off is clamped to zero; the diagonal of ``sq_dists(A)`` is exactly zero.
    """
    A = np.asarray(A, dtype=np.float64)
    same = B is None
    B = A if same else np.asarray(B, dtype=np.float64)
    a2 = np.einsum("ij,ij->i", A, A)
    b2 = a2 if same else np.einsum("ij,ij->i", B, B)
    D2 = a2[:, None] - 2.0 * (A @ B.T) + b2[None, :]
    np.maximum(D2, 0.0, out=D2)
    if same:
        np.fill_diagonal(D2, 0.0)
    return D2


def gaussian_kernel(A: np.ndarray, B: np.ndarray | None = None, gamma: float = 1.0) -> np.ndarray:
    """Gaussian kernel matrix ``K_{A,B} = exp(−γ ‖a_i − b_j‖²)`` (Qiao et al. §3.1)."""
    check_gamma(gamma)
    return np.exp(-gamma * sq_dists(A, B))


def check_gamma(gamma: float) -> float:
    """Validate a kernel bandwidth ``γ > 0`` and return it as float."""
    try:
        g = float(gamma)
    except (TypeError, ValueError):
        raise ConfigError(
            bad_value("gamma", gamma, "give a positive number, or None for the median heuristic")
        ) from None
    if not np.isfinite(g) or g <= 0:
        raise ConfigError(bad_value("gamma", gamma, "give a positive number, or None for the median heuristic"))
    return g


def local_median_sq_dist(X: np.ndarray, max_points: int = 1000, random_state=None) -> float:
    """Median squared pairwise distance of a site's records (on a random subsample of ``max_points``).

    Each site computes this locally; only the scalar leaves the site (see :func:`median_gamma`).
    """
    rng = np.random.default_rng(random_state)
    X = np.asarray(X, dtype=np.float64)
    if len(X) > max_points:
        X = X[rng.choice(len(X), max_points, replace=False)]
    D2 = sq_dists(X)
    iu = np.triu_indices(len(X), k=1)
    vals = D2[iu]
    return float(np.median(vals)) if vals.size else 0.0


def median_gamma(site_medians, weights=None) -> float:
    """The median heuristic ``γ = 1 / median‖x − x'‖²``, federated.

    The pooled median is not available without pooling, so securefed uses the record-weighted mean of
    the sites' local medians of squared pairwise distances (each a single scalar per site). On IID
    partitions this equals the pooled median up to sampling error; on label-skewed partitions local
    medians are smaller (within-class), which makes γ somewhat larger — a sharper kernel, which the
    MMD landmark fit tolerates well.
    """
    m = np.asarray(site_medians, dtype=float)
    w = np.ones_like(m) if weights is None else np.asarray(weights, dtype=float)
    med = float(np.sum(w * m) / np.sum(w))
    if not np.isfinite(med) or med <= 0:
        raise ConfigError(
            bad_value(
                "median squared distance",
                med,
                "data have no spread; check for constant records or pass gamma explicitly",
            )
        )
    return 1.0 / med
