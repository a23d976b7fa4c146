"""Nyström reconstruction on the server: the paper's dense forms and a scalable path (rows = points).

Paper forms (Qiao et al. §4, Algorithms 2–3)
    * :func:`nystrom_distance` — Eq. (21) ``D̂_{X,X} = B W_k^† Bᵀ`` with ``B`` the stacked client rows
      ``D(X_p, Y)`` (Eq. 20) and ``W = D(Y, Y)`` (+ ``λI`` when singular).
    * :func:`nystrom_kernel` — Algorithm 3, ``K̂_{X,X} = C W_k^† Cᵀ`` with ``C = K(X, Y)``,
      ``W = K(Y, Y)`` (the same Eq. 18 applied to the kernel matrix).

    Both form an n × n matrix (8 n² bytes: 39 GB at n = 70 000), so they refuse ``n > max_records``.

**Squared or plain distances?** The paper writes ``D`` without saying. securefed feeds Eq. (21)
*squared* Euclidean distances by default (``squared=True``) and returns the square root. Reason: the
squared-distance matrix of points in ℝ^m is ``‖x‖²1ᵀ + 1‖y‖²ᵀ − 2XYᵀ``, of rank ≤ m + 2, and the
Nyström formula is exact for any matrix whose landmark block has the full rank of the whole matrix.
So with squared distances Eq. (21) reproduces **every** pairwise distance exactly as soon as the
landmark block ``W`` has rank m + 2 (n_y ≥ m + 2 landmarks in general position), and whenever the
landmarks contain the data. Plain distances have no such low-rank structure and are only
approximated (``benchmarks/results/nystrom.md`` measures both). The same algebra is why the rows
leak the records (docs/what-leaves-each-site.md, trilateration).

Scalable path (no n × n matrix)
    * :func:`kernel_feature_map` — ``Φ = C W^{-1/2}`` so that ``ΦΦᵀ = C W^† Cᵀ = K̂`` (Alg. 3 in
      factored form); Euclidean distances between rows of Φ are the Nyström kernel-induced
      distances ``K̂_ii + K̂_jj − 2K̂_ij``.
    * :func:`distance_feature_map` — the same idea for the distance rows of Algorithm 2: landmark
      MDS (de Silva & Tenenbaum 2004) places each record in ℝ^r from its squared distances to the
      landmarks; Euclidean distances between the rows equal those between the records' projections
      onto the landmarks' affine hull (exact when the landmarks affinely span the data).
    * :func:`knn_graph` — exact (scikit-learn) or approximate (pynndescent) k-NN graph of Φ in the
      layouts openTSNE's ``PrecomputedNeighbors`` and umap-learn's ``precomputed_knn`` expect.
    * :func:`choose_reconstruction` — dense below ``dense_limit`` records, feature map above.
"""

from __future__ import annotations

import numpy as np

from ..data import as_float_matrix
from ..errors import ConfigError, DataError, bad_value

__all__ = [
    "DEFAULT_DENSE_LIMIT",
    "DEFAULT_MAX_DENSE_RECORDS",
    "EXACT_KNN_LIMIT",
    "nystrom_distance",
    "nystrom_kernel",
    "kernel_feature_map",
    "distance_feature_map",
    "knn_graph",
    "choose_reconstruction",
]

#: ``reconstruction="auto"`` uses the dense paper form up to this many records (n×n float64 = 800 MB).
DEFAULT_DENSE_LIMIT = 10_000
#: the dense forms refuse more records than this unless ``max_records`` is raised (n×n = 3.2 GB).
DEFAULT_MAX_DENSE_RECORDS = 20_000
#: ``knn_graph(method="auto")`` searches exactly up to this many points, with pynndescent above.
EXACT_KNN_LIMIT = 10_000


# --------------------------------------------------------------------------- validation


def _check_pair(R, W, rname: str) -> tuple[np.ndarray, np.ndarray]:
    R = as_float_matrix(R, rname)
    W = as_float_matrix(W, "W")
    if W.shape[0] != W.shape[1]:
        raise DataError(
            bad_value("W", f"<array of shape {W.shape}>", "W is the landmark-by-landmark matrix; it must be square")
        )
    if R.shape[1] != W.shape[0]:
        raise DataError(
            bad_value(rname, f"<{R.shape[1]} columns>", f"give one column per landmark, as W has ({W.shape[0]})")
        )
    if W.shape[0] < 2:
        raise DataError(bad_value("W", f"<{W.shape[0]} landmark>", "use at least 2 landmarks"))
    scale = max(float(np.abs(W).max()), 1e-300)
    if float(np.abs(W - W.T).max()) > 1e-8 * scale:
        raise DataError(
            bad_value("W", "<non-symmetric matrix>", "W must be D(Y, Y) or K(Y, Y) of the same landmarks (symmetric)")
        )
    return R, 0.5 * (W + W.T)


def _check_rank(rank, n_y: int) -> int | None:
    if rank is None:
        return None
    if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)) or not 1 <= rank <= n_y:
        raise ConfigError(
            bad_value(
                "rank", rank, f"use an integer between 1 and the number of landmarks ({n_y}), or None for full rank"
            )
        )
    return int(rank)


def _check_reg(reg) -> float:
    if reg is None:
        return 0.0
    try:
        r = float(reg)
    except (TypeError, ValueError):
        raise ConfigError(bad_value("reg", reg, "use a small non-negative number such as 1e-8, or None")) from None
    if not np.isfinite(r) or r < 0:
        raise ConfigError(bad_value("reg", reg, "use a small non-negative number such as 1e-8, or None"))
    return r


def _check_rtol(rtol) -> float:
    try:
        r = float(rtol)
    except (TypeError, ValueError):
        raise ConfigError(bad_value("rtol", rtol, "use a small positive number such as 1e-10")) from None
    if not np.isfinite(r) or not 0 < r < 1:
        raise ConfigError(bad_value("rtol", rtol, "use a small positive number such as 1e-10"))
    return r


def _check_dense(n: int, max_records: int) -> None:
    if n > max_records:
        gb = 8.0 * n * n / 1e9
        raise ConfigError(
            bad_value(
                "n_records",
                n,
                f"the dense n×n reconstruction would need {gb:.1f} GB; use the feature-map path "
                f"(reconstruction='features': kernel_feature_map/distance_feature_map + knn_graph) or raise max_records",
            )
        )


def _rank_k_pinv_factors(W: np.ndarray, rank: int | None, reg: float, rtol: float) -> tuple[np.ndarray, np.ndarray]:
    """Factors of ``W_k^†`` for symmetric ``W``: ``W_k^† = U diag(inv) Uᵀ``.

    Qiao et al. Eq. (18) and Theorem 2: ``W_k^†`` is the Moore–Penrose inverse of the best rank-k
    approximation of ``W + λI`` (the λI of §4 for singular W). For a symmetric (possibly indefinite,
    as a distance matrix is) ``W`` the best rank-k approximation keeps the k eigenvalues of largest
    magnitude. Eigenvalues with ``|λ_i| ≤ rtol · max|λ|`` count as zero (pseudo-inverse cut-off).
    """
    evals, evecs = np.linalg.eigh(W + reg * np.eye(len(W)) if reg else W)
    order = np.argsort(-np.abs(evals), kind="stable")
    evals, evecs = evals[order], evecs[:, order]
    top = float(np.abs(evals[0]))
    keep = np.abs(evals) > rtol * top if top > 0 else np.zeros(len(evals), dtype=bool)
    if rank is not None:
        keep[rank:] = False
    return evecs[:, keep], 1.0 / evals[keep]


def _nystrom_dense(R, W, rname: str, rank, reg, rtol, max_records: int) -> np.ndarray:
    """Eq. (18) of Qiao et al.: ``R W_k^† Rᵀ`` (validated, symmetrised), the core of Eq. (21) and Alg. 3."""
    R, W = _check_pair(R, W, rname)
    _check_dense(len(R), max_records)
    U, inv = _rank_k_pinv_factors(W, _check_rank(rank, len(W)), _check_reg(reg), _check_rtol(rtol))
    RU = R @ U
    Z = (RU * inv) @ RU.T
    return 0.5 * (Z + Z.T)


# --------------------------------------------------------------------------- paper forms (dense)


def nystrom_distance(
    B,
    W,
    rank=None,
    reg=None,
    *,
    squared: bool = True,
    rtol: float = 1e-10,
    max_records: int = DEFAULT_MAX_DENSE_RECORDS,
) -> np.ndarray:
    """Estimate all pairwise distances from landmark distances: Qiao et al. Eq. (21), ``D̂ = B W_k^† Bᵀ``.

    Parameters
    ----------
    B : ndarray (n, n_y)
        Stacked client rows ``[D(X_1, Y); …; D(X_P, Y)]`` (Eq. 20), in the site order of the output.
    W : ndarray (n_y, n_y)
        ``D(Y, Y)``.
    rank : int, optional
        k of the rank-k pseudo-inverse ``W_k^†`` (largest-magnitude eigenvalues; default: all above
        the ``rtol`` cut-off).
    reg : float, optional
        λ of the ``W + λI`` regulariser (§4; default 0).
    squared : bool, default True
        ``True``: ``B`` and ``W`` hold **squared** Euclidean distances and Eq. (21) estimates squared
        distances (exact when the landmark block has the full rank m + 2, see the module notes).
        ``False``: they hold plain distances (the approximate reading of the paper).
    rtol : float
        Relative eigenvalue cut-off of the pseudo-inverse.
    max_records : int
        Refuse ``n`` above this (the result is n × n).

    Returns
    -------
    D_hat : ndarray (n, n)
        Symmetric, non-negative **distances** (not squared) with a zero diagonal, usable as
        ``metric="precomputed"`` input. Post-processing, documented: the estimate is symmetrised,
        negative entries (round-off or approximation error) are clamped to 0 before the square root,
        and the diagonal is set to 0.
    """
    D = _nystrom_dense(B, W, "B", rank, reg, rtol, max_records)
    np.maximum(D, 0.0, out=D)
    if squared:
        np.sqrt(D, out=D)
    np.fill_diagonal(D, 0.0)
    return D


def nystrom_kernel(
    C, W, rank=None, reg=None, *, rtol: float = 1e-10, max_records: int = DEFAULT_MAX_DENSE_RECORDS
) -> np.ndarray:
    """Nyström kernel matrix ``K̂ = C W_k^† Cᵀ`` (Qiao et al. Algorithm 3 with Eq. 18).

    Parameters
    ----------
    C : ndarray (n, n_y)
        Stacked client rows ``K(X_p, Y)``.
    W : ndarray (n_y, n_y)
        ``K(Y, Y)``.
    rank, reg, rtol, max_records
        As in :func:`nystrom_distance`.

    Returns
    -------
    K_hat : ndarray (n, n), symmetric positive semi-definite (up to round-off).
        Exact (``K̂ = K``) when the landmarks are the data points (``C = W``) and no rank cut-off
        applies, because ``W W^† W = W``.
    """
    return _nystrom_dense(C, W, "C", rank, reg, rtol, max_records)


# --------------------------------------------------------------------------- scalable path


def kernel_feature_map(C, W, rtol: float = 1e-10, rank=None, reg=None) -> np.ndarray:
    """Nyström feature map ``Φ = C W^{-1/2}`` (Algorithm 3 of Qiao et al. in factored form).

    With ``W = U Λ Uᵀ`` (eigendecomposition), eigenpairs with ``λ_i ≤ rtol · λ_max`` are dropped
    (they carry only round-off; negative ones cannot occur in an exact kernel matrix and are dropped
    as well), and ``Φ = C U_r Λ_r^{-1/2}``. Then ``ΦΦᵀ = C W^† Cᵀ = K̂`` (with the same cut-off) and
    ``‖φ_i − φ_j‖² = K̂_ii + K̂_jj − 2K̂_ij``, the kernel-induced distance of the Nyström kernel — for a
    Gaussian kernel and landmarks rich enough that ``K̂ ≈ K`` this is ``2 − 2k(x_i, x_j)``, a monotone
    function of the Euclidean distance. Memory O(n · n_y); no n × n matrix is formed.

    Parameters
    ----------
    C : ndarray (n, n_y)
        Stacked ``K(X_p, Y)`` rows.
    W : ndarray (n_y, n_y)
        ``K(Y, Y)``, positive semi-definite.
    rtol : float
        Relative eigenvalue cut-off.
    rank : int, optional
        Keep at most the ``rank`` largest eigenvalues.
    reg : float, optional
        λ added to W's diagonal first.

    Returns
    -------
    Phi : ndarray (n, r), r ≤ n_y.
    """
    C, W = _check_pair(C, W, "C")
    rank = _check_rank(rank, len(W))
    rtol = _check_rtol(rtol)
    reg = _check_reg(reg)
    evals, evecs = np.linalg.eigh(W + reg * np.eye(len(W)) if reg else W)
    evals, evecs = evals[::-1], evecs[:, ::-1]  # descending
    if evals[0] <= 0:
        raise DataError(
            bad_value("W", "<no positive eigenvalue>", "W must be a positive semi-definite kernel matrix K(Y, Y)")
        )
    keep = evals > rtol * evals[0]
    if rank is not None:
        keep[rank:] = False
    return np.ascontiguousarray(C @ (evecs[:, keep] / np.sqrt(evals[keep])))


def distance_feature_map(B, W, rtol: float = 1e-10, rank=None) -> np.ndarray:
    """Coordinates from squared landmark distances: landmark MDS (de Silva & Tenenbaum 2004).

    The scalable counterpart of Eq. (21) of Qiao et al.: from ``B = D²(X, Y)`` and ``W = D²(Y, Y)``
    compute the landmarks' classical-MDS Gram matrix ``G = −½ J W J`` (``J = I − 11ᵀ/n_y``),
    ``G = V Λ Vᵀ`` keeping ``λ_i > rtol · λ_max`` (and at most ``rank``), then place every record at
    ``x̃ = −½ Λ^{-1/2} Vᵀ (b_x − w̄)`` with ``w̄`` the column means of ``W``. Euclidean distances
    between rows of the result equal the distances between the records' orthogonal projections
    onto the affine hull of the landmarks — hence exact whenever the landmarks affinely span the
    data (n_y ≥ m + 1 in general position). Memory O(n · n_y).

    Returns
    -------
    Z : ndarray (n, r), r ≤ n_y − 1.
    """
    B, W = _check_pair(B, W, "B")
    rank = _check_rank(rank, len(W))
    rtol = _check_rtol(rtol)
    if float(W.min()) < 0 or float(B.min()) < 0:
        raise DataError(bad_value("B/W", "<negative entries>", "pass squared Euclidean distances (non-negative)"))
    col_mean = W.mean(axis=0)
    G = -0.5 * (W - col_mean[None, :] - W.mean(axis=1)[:, None] + W.mean())
    evals, evecs = np.linalg.eigh(0.5 * (G + G.T))
    evals, evecs = evals[::-1], evecs[:, ::-1]
    if evals[0] <= 0:
        raise DataError(bad_value("W", "<landmarks all coincide>", "use at least 2 distinct landmarks"))
    keep = evals > rtol * evals[0]
    if rank is not None:
        keep[rank:] = False
    return np.ascontiguousarray(-0.5 * (B - col_mean[None, :]) @ (evecs[:, keep] / np.sqrt(evals[keep])))


def knn_graph(
    Phi, k: int, random_state=None, method: str = "auto", include_self: bool = True, n_jobs: int = 1
) -> tuple[np.ndarray, np.ndarray]:
    """k-nearest-neighbour graph of the rows of ``Phi`` (Euclidean), without any n × n matrix.

    Parameters
    ----------
    Phi : ndarray (n, r)
        Feature-map rows (:func:`kernel_feature_map` or :func:`distance_feature_map`).
    k : int
        Number of **columns** returned, 1 ≤ k < n (with ``include_self`` the point itself is one of them).
    method : {"auto", "exact", "nndescent"}
        ``exact`` — scikit-learn ``NearestNeighbors``; ``nndescent`` — pynndescent's approximate
        NN-descent (``random_state`` seeds it; with numba threads results can still vary slightly);
        ``auto`` — exact up to :data:`EXACT_KNN_LIMIT` points, nndescent above.
    include_self : bool, default True
        ``True``: column 0 is the point itself at distance 0, then its k − 1 nearest others — the
        layout umap-learn's ``UMAP(precomputed_knn=(idx, dist, None), n_neighbors=k)`` requires
        ("the nearest neighbor of each item should be itself"). ``False``: the k nearest *others*,
        the layout openTSNE's own ``KNNIndex.build`` returns (it queries k + 1 and drops column 0), which
        ``openTSNE.nearest_neighbors.PrecomputedNeighbors(idx, dist)`` passes straight to
        ``PerplexityBasedNN``; use ``k ≥ 3 · perplexity`` there.
    n_jobs : int
        Threads for the search.

    Returns
    -------
    indices : ndarray of int64 (n, k), distances : ndarray of float64 (n, k)
        Sorted by increasing distance per row. Duplicates of a point never displace it: the point
        itself is removed from its neighbour list wherever the search put it.
    """
    X = as_float_matrix(Phi, "Phi")
    n = len(X)
    if (
        isinstance(k, bool)
        or not isinstance(k, (int, np.integer))
        or not 1 <= k < n
        or (include_self is False and k > n - 1)
    ):
        raise ConfigError(bad_value("k", k, f"use an integer with 1 ≤ k < n = {n}"))
    if include_self and k < 2:
        raise ConfigError(bad_value("k", k, "with include_self=True use k ≥ 2 (the point itself takes one column)"))
    if method not in ("auto", "exact", "nndescent"):
        raise ConfigError(bad_value("method", method, "use 'auto', 'exact' or 'nndescent'"))
    k_other = k - 1 if include_self else k
    if method == "auto":
        method = "exact" if n <= EXACT_KNN_LIMIT else "nndescent"
    seed = int(np.random.default_rng(random_state).integers(0, 2**31 - 1))
    if method == "exact":
        from sklearn.neighbors import NearestNeighbors

        nn = NearestNeighbors(n_neighbors=k_other + 1, n_jobs=n_jobs).fit(X)
        dist, ind = nn.kneighbors(X)
    else:
        from pynndescent import NNDescent

        index = NNDescent(
            X, n_neighbors=k_other + 1, metric="euclidean", random_state=seed, n_jobs=n_jobs, low_memory=True
        )
        ind, dist = index.neighbor_graph
    ind = np.asarray(ind, dtype=np.int64)
    dist = np.asarray(dist, dtype=np.float64)
    rows = np.arange(n)
    is_self = ind == rows[:, None]
    order = np.argsort(is_self, axis=1, kind="stable")  # others first (distance order kept), self last
    ind = np.take_along_axis(ind, order, axis=1)[:, :k_other]
    dist = np.take_along_axis(dist, order, axis=1)[:, :k_other]
    if np.any(ind < 0):
        raise DataError(
            bad_value(
                "Phi", "<incomplete neighbour graph>", "too few distinct points for k; lower k or use method='exact'"
            )
        )
    if include_self:
        ind = np.hstack([rows[:, None], ind])
        dist = np.hstack([np.zeros((n, 1)), dist])
    return np.ascontiguousarray(ind), np.ascontiguousarray(dist)


def choose_reconstruction(
    n: int, reconstruction: str = "auto", dense_limit: int = DEFAULT_DENSE_LIMIT, *, noisy_landmarks: bool = False
) -> str:
    """Pick the server's reconstruction path by data size and landmark kind.

    ``"paper"`` — the dense n × n forms of Algorithms 2–3 (:func:`nystrom_distance`,
    :func:`nystrom_kernel`; 8 n² bytes). ``"features"`` — the feature maps + :func:`knn_graph`
    (memory O(n · n_y + n · k)). ``"auto"`` takes ``"paper"`` for ``n ≤ dense_limit`` (10 000 records
    = 0.8 GB per n × n matrix) and ``"features"`` above — and always ``"features"`` when
    ``noisy_landmarks`` (landmarks learned with differential-privacy noise). Eq. (21) is a Nyström
    approximation of the squared-distance matrix that is accurate only when the landmarks lie among the
    data; DP noise pushes them far outside (MNIST-5k, ε = 1: landmark norms ≈ 135 against record norms
    ≈ 9), and there Eq. (21)'s 10-NN accuracy falls to 0.50 while the landmark-MDS feature map — the
    records' projection onto the landmarks' affine hull — keeps 0.93 (BENCHMARKS, accounting section;
    ``benchmarks/accounting_reconstruction.py``). Forcing ``"paper"`` above ``dense_limit``
    raises :class:`ConfigError` stating the memory it would need; raise ``dense_limit`` deliberately
    to allow it.
    """
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 2:
        raise ConfigError(bad_value("n", n, "the number of records must be an integer ≥ 2"))
    if isinstance(dense_limit, bool) or not isinstance(dense_limit, (int, np.integer)) or dense_limit < 2:
        raise ConfigError(bad_value("dense_limit", dense_limit, "use an integer number of records ≥ 2, e.g. 10000"))
    if reconstruction not in ("auto", "paper", "features"):
        raise ConfigError(
            bad_value(
                "reconstruction", reconstruction, "use 'auto', 'paper' (dense n×n, Alg. 2–3) or 'features' (scalable)"
            )
        )
    if reconstruction == "auto":
        return "paper" if (n <= dense_limit and not noisy_landmarks) else "features"
    if reconstruction == "paper" and n > dense_limit:
        raise ConfigError(
            bad_value(
                "reconstruction",
                "paper",
                f"n={n} records need {8.0 * n * n / 1e9:.1f} GB per n×n matrix, above "
                f"dense_limit={dense_limit}; use 'features' or 'auto', or raise dense_limit explicitly",
            )
        )
    return reconstruction
