"""High-dimensional affinities of t-SNE / dSNE (Saha et al. 2023, Eq. 1 and Algorithm 1).

Each site of dSNE computes its affinity matrix on ``[X_local ; X_reference]`` (rows = points) and never
shares it. The calibration is the classic one (van der Maaten & Hinton 2008): for every point ``i`` a
bandwidth is found by binary search so that the entropy of ``p_{·|i}`` equals ``log(perplexity)``.

For speed at MNIST scale the conditional distribution of a point is restricted to its
``⌊3·perplexity⌋`` nearest neighbours, as Barnes-Hut-SNE and openTSNE do; the entropy target is then
reached exactly on that support (the remaining Gaussian weights are below ``e^{-9}`` of the largest for
typical data and are treated as zero).
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
from sklearn.neighbors import NearestNeighbors

from ..errors import ConfigError, DataError, bad_value

__all__ = [
    "conditional_probabilities",
    "calibrate_perplexity",
    "row_entropies",
    "joint_probabilities",
    "knn_affinities",
]


def conditional_probabilities(sq_dist: np.ndarray, beta: np.ndarray) -> np.ndarray:
    """Eq. (1) of Saha et al. 2023: ``p_{j|i} = exp(-β_i d_ij²) / Σ_{k≠i} exp(-β_i d_ik²)``.

    Parameters
    ----------
    sq_dist : ndarray of shape (n, k)
        Squared distances from each point ``i`` to its candidate neighbours ``j`` (``j ≠ i`` already
        excluded; that is the ``p_{i|i} = 0`` case of Eq. 1).
    beta : ndarray of shape (n,)
        Precisions ``β_i = 1 / (2 σ_i(ρ)²)``.

    Returns
    -------
    ndarray of shape (n, k)
        Rows sum to one.
    """
    # Shift by the row minimum: exp of the nearest neighbour is 1, no underflow of the whole row.
    shifted = sq_dist - sq_dist.min(axis=1, keepdims=True)
    w = np.exp(-beta[:, None] * shifted)
    return w / w.sum(axis=1, keepdims=True)


def row_entropies(P: np.ndarray) -> np.ndarray:
    """Shannon entropy in nats of each row of a row-stochastic matrix, ``H_i = -Σ_j p_{j|i} ln p_{j|i}``."""
    with np.errstate(divide="ignore", invalid="ignore"):
        logs = np.where(P > 0, np.log(P), 0.0)
    return -(P * logs).sum(axis=1)


def calibrate_perplexity(
    sq_dist: np.ndarray, perplexity: float, *, tol: float = 1e-10, max_iter: int = 200
) -> tuple[np.ndarray, np.ndarray]:
    """Binary search of Algorithm 1 (Saha et al. 2023): find ``β_i`` with ``H(P_i) = ln ρ``.

    The entropy of Eq. (1) decreases monotonically in ``β_i``, so bisection on ``ln β_i`` converges
    for every row at once (vectorised over rows).

    Parameters
    ----------
    sq_dist : ndarray of shape (n, k)
        Squared distances to the ``k`` candidate neighbours of each point (self excluded).
    perplexity : float
        Target perplexity ``ρ``; needs ``1 < ρ < k`` (the entropy of ``k`` points is at most ``ln k``).
    tol : float
        Stop when every row's entropy is within ``tol`` nats of ``ln ρ``.
    max_iter : int
        Bisection steps (each halves the bracket in ``ln β``).

    Returns
    -------
    P : ndarray of shape (n, k)
        Conditional probabilities ``p_{j|i}`` (rows sum to one).
    beta : ndarray of shape (n,)
        The calibrated precisions.
    """
    sq_dist = np.asarray(sq_dist, dtype=np.float64)
    n, k = sq_dist.shape
    if not (1.0 < perplexity < k):
        raise ConfigError(
            bad_value("perplexity", perplexity, f"use 1 < perplexity < {k} (the number of candidate neighbours)")
        )
    target = np.log(perplexity)
    shifted = sq_dist - sq_dist.min(axis=1, keepdims=True)
    scale = np.maximum(np.median(shifted, axis=1), 1e-300)
    # Bracket in log β: the entropy spans (0, ln k) as β goes from +∞ to 0.
    lo = np.log(1e-20 / scale)
    hi = np.log(1e20 / scale)
    log_beta = np.log(1.0 / scale)
    for _ in range(max_iter):
        P = conditional_probabilities(shifted, np.exp(log_beta))
        H = row_entropies(P)
        err = H - target
        if np.all(np.abs(err) < tol):
            break
        too_flat = err > 0  # entropy too high → raise β
        lo = np.where(too_flat, log_beta, lo)
        hi = np.where(too_flat, hi, log_beta)
        log_beta = 0.5 * (lo + hi)
    beta = np.exp(log_beta)
    return conditional_probabilities(shifted, beta), beta


def joint_probabilities(P_cond: sp.csr_matrix) -> sp.csr_matrix:
    """Algorithm 1, step 2 of Saha et al. 2023: ``p_ij = (p_{j|i} + p_{i|j}) / (2N)``.

    Parameters
    ----------
    P_cond : sparse matrix of shape (N, N)
        Row ``i`` holds ``p_{j|i}``.

    Returns
    -------
    csr_matrix of shape (N, N)
        Symmetric, non-negative, sums to one.
    """
    N = P_cond.shape[0]
    P = (P_cond + P_cond.T) / (2.0 * N)
    P = sp.csr_matrix(P)
    P.eliminate_zeros()
    return P


def knn_affinities(X: np.ndarray, perplexity: float = 30.0, n_neighbors: int | None = None) -> sp.csr_matrix:
    """Sparse joint affinities ``P`` of t-SNE on the rows of ``X`` (Eq. 1 + Algorithm 1, kNN support).

    Parameters
    ----------
    X : ndarray of shape (N, m)
        The points (for dSNE: ``[X_local ; X_reference]``).
    perplexity : float
        ``ρ`` of Eq. (1).
    n_neighbors : int, optional
        Support of each conditional distribution; default ``min(N − 1, ⌊3ρ⌋)``.

    Returns
    -------
    csr_matrix of shape (N, N)
        Symmetric ``P`` that sums to one.
    """
    X = np.asarray(X, dtype=np.float64)
    N = X.shape[0]
    if N < 3:
        raise DataError(bad_value("n_points", N, "t-SNE affinities need at least 3 points"))
    if n_neighbors is None:
        n_neighbors = int(min(N - 1, max(int(3 * perplexity), 2)))
    if not (1 <= n_neighbors <= N - 1):
        raise ConfigError(bad_value("n_neighbors", n_neighbors, f"use 1..{N - 1}"))
    if perplexity >= n_neighbors:
        raise ConfigError(
            bad_value(
                "perplexity",
                perplexity,
                f"use a perplexity below the number of neighbours ({n_neighbors}); with {N} points "
                f"at most {max((N - 1) / 3, 1.0):.1f} is sensible",
            )
        )
    nn = NearestNeighbors(n_neighbors=n_neighbors + 1).fit(X)
    dist, idx = nn.kneighbors(X)
    # Drop the point itself (p_{i|i} = 0). With duplicates the self index may not be in column 0.
    keep = idx != np.arange(N)[:, None]
    first_k = np.cumsum(keep, axis=1) <= n_neighbors
    keep &= first_k
    idx = idx[keep].reshape(N, n_neighbors)
    d2 = dist[keep].reshape(N, n_neighbors) ** 2
    P_rows, _ = calibrate_perplexity(d2, perplexity)
    P_cond = sp.csr_matrix((P_rows.ravel(), idx.ravel(), np.arange(0, N * n_neighbors + 1, n_neighbors)), shape=(N, N))
    return joint_probabilities(P_cond)
