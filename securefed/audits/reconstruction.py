"""Reconstruction audit: play the honest-but-curious server and rebuild records from what left a site.

docs/what-leaves-each-site.md says what the server sees in each mode. This module turns each of those payloads back into
records with the best estimate the server can compute, so the report can state *measured* risk:

* **distance rows** (paper mode, Algorithm 2 of Qiao et al.; securefed's estimators send **squared**
  distances ``D²(X_p, Y)``, ``nystrom="rows"``) → :func:`reconstruct_from_distance_rows` (trilateration,
  ``squared=True``; Euclidean distances with ``squared=False``);
* **kernel rows** ``K(X_p, Y) = exp(−γ D²)`` (Qiao et al. §3.1) → :func:`reconstruct_from_kernel_rows`;
* **perturbed rows** (Qiao et al. Sec. 5.1: rows of ``X + E``, ``E ~ N(0, σ²)``) → the same trilateration
  recovers ``x + e`` exactly, so the reconstruction error is the noise itself;
* **no rows** (local placement: only each record's final 2-D coordinate leaves the site) →
  :func:`reconstruct_from_coordinates` (kernel regression from 2-D back to the data space through the landmarks,
  whose high-dimensional positions *and* 2-D embedding the server knows).

:func:`reconstruction_risk` scores an attack: relative error ``‖x̂ − x‖ / ‖x‖`` per record.
"""

from __future__ import annotations

import numpy as np

from ..errors import ConfigError, DataError, bad_value
from ..kernels import check_gamma, sq_dists

__all__ = [
    "trilateration_system",
    "reconstruct_from_distance_rows",
    "kernel_rows_to_sq_distances",
    "reconstruct_from_kernel_rows",
    "reconstruct_from_coordinates",
    "reconstruction_risk",
    "reconstruction_record",
]


def _as_matrix(name, A, ncols=None):
    try:
        A = np.asarray(A, dtype=np.float64)
    except (TypeError, ValueError):
        raise DataError(bad_value(name, type(A).__name__, "pass a 2-D numeric array (rows = points)")) from None
    if A.ndim != 2 or A.shape[0] == 0:
        raise DataError(bad_value(f"{name}.shape", A.shape, "pass a non-empty 2-D array (rows = points)"))
    if ncols is not None and A.shape[1] != ncols:
        raise DataError(bad_value(f"{name}.shape", A.shape, f"expected {ncols} columns"))
    if not np.all(np.isfinite(A)):
        raise DataError(bad_value(name, "non-finite values", "remove NaN/inf entries before the audit"))
    return A


def trilateration_system(Y: np.ndarray):
    """The linear system behind trilateration, centred on the landmark mean.

    For a record ``x`` and landmarks ``y_j`` (docs/what-leaves-each-site.md, rows = points)::

        ‖x − y_j‖² = ‖x‖² − 2 y_j·x + ‖y_j‖² = d_j²

    is linear in ``(x, ‖x‖²)``. Writing ``x = c + u`` with ``c`` the landmark mean and ``w_j = y_j − c``
    gives ``−2 w_j·u + s = d_j² − ‖w_j‖²`` with ``s = ‖u‖²``. Because ``Σ_j w_j = 0`` the column of ones is
    orthogonal to the columns of ``W``: ``s`` decouples (``s = mean_j(d_j² − ‖w_j‖²)``) and
    ``u = −½ W⁺ (d² − ‖w‖² − s)``, a minimum-norm least-squares solve.

    Parameters
    ----------
    Y : ndarray of shape (n_y, m)
        Landmarks.

    Returns
    -------
    center : ndarray (m,)
        ``c``, the landmark mean.
    W_pinv : ndarray (m, n_y)
        Pseudo-inverse of ``W`` (rank-revealing, ``rcond`` relative to the largest singular value).
    w2 : ndarray (n_y,)
        ``‖w_j‖²``.
    rank : int
        Rank of ``W``: the dimension of the landmarks' affine span. ``rank == m`` (needs ``n_y > m`` and
        landmarks in general position) means exact recovery; otherwise the solve returns the component of
        ``x − c`` in that span, i.e. the orthogonal projection of ``x`` onto the landmarks' affine hull.
    """
    Y = _as_matrix("Y", Y)
    c = Y.mean(axis=0)
    W = Y - c
    U, s, Vt = np.linalg.svd(W, full_matrices=False)
    tol = s.max(initial=0.0) * max(W.shape) * np.finfo(float).eps
    keep = s > tol
    W_pinv = (Vt[keep].T / s[keep]) @ U[:, keep].T
    return c, W_pinv, np.einsum("ij,ij->i", W, W), int(keep.sum())


def _trilaterate_sq(D2: np.ndarray, Y: np.ndarray) -> tuple[np.ndarray, int]:
    c, W_pinv, w2, rank = trilateration_system(Y)
    b = D2 - w2[None, :]
    s = b.mean(axis=1, keepdims=True)
    U = -0.5 * (b - s) @ W_pinv.T
    return c[None, :] + U, rank


def reconstruct_from_distance_rows(D_rows, Y, *, squared: bool = False, return_rank: bool = False):
    """Trilateration: rebuild records from their distance rows to the landmarks (docs/what-leaves-each-site.md, Nyström row).

    Solves ``‖x‖² − 2 y_j·x + ‖y_j‖² = d_j²`` (linear in ``(x, ‖x‖²)``) by least squares; see
    :func:`trilateration_system`. Exact (to round-off) when ``n_y > m`` and the landmarks are in general
    position; with ``n_y ≤ m`` (rank of the centred landmarks ``< m``) the estimate is the orthogonal
    projection of ``x`` onto the landmarks' affine span. For noisy rows it is the linear least-squares estimate;
    for rows of a perturbed record ``x + e`` (Qiao et al. Sec. 5.1) it returns ``x + e``.

    Parameters
    ----------
    D_rows : array (n, n_y)
        Distances from each record to each landmark: Euclidean ``D`` (``squared=False``, the default) or
        ``D²`` (``squared=True``). securefed's Nyström stage (``FedTSNE``/``FedUMAP`` with ``nystrom="rows"``)
        sends squared distances ``D²(X_p, Y)``; spectral clustering sends kernel rows
        (:func:`reconstruct_from_kernel_rows`).
    Y : array (n_y, m)
        Landmarks (the server knows them).
    squared : bool
        Whether ``D_rows`` already holds squared distances.
    return_rank : bool
        Also return the rank of the centred landmark matrix (``m`` means exact recovery is possible).

    Returns
    -------
    X_hat : ndarray (n, m)
        The server's estimate of the records (``(X_hat, rank)`` when ``return_rank``).
    """
    Y = _as_matrix("Y", Y)
    D = _as_matrix("D_rows", D_rows, ncols=Y.shape[0])
    if np.any(D < 0):
        raise DataError(bad_value("D_rows", "negative entries", "distances must be non-negative"))
    D2 = D if squared else D * D
    X_hat, rank = _trilaterate_sq(D2, Y)
    return (X_hat, rank) if return_rank else X_hat


def kernel_rows_to_sq_distances(K_rows, gamma: float) -> np.ndarray:
    """Invert the Gaussian kernel: ``d² = −log(k) / γ`` (Qiao et al. §3.1, ``K = exp(−γ D²)``).

    Entries that underflowed to 0 carry no distance and become ``inf`` (the caller drops them).
    Entries above 1 by more than round-off are not kernel values and raise :class:`DataError`.
    """
    g = check_gamma(gamma)
    K = np.asarray(K_rows, dtype=np.float64)
    if K.ndim != 2 or not np.all(np.isfinite(K)):
        raise DataError(bad_value("K_rows", "non-finite or not 2-D", "pass the (n, n_y) kernel rows"))
    if np.any(K < 0) or np.any(K > 1.0 + 1e-9):
        raise DataError(
            bad_value(
                "K_rows",
                "values outside [0, 1]",
                "Gaussian kernel values lie in [0, 1]; "
                "pass kernel rows, or use reconstruct_from_distance_rows for distances",
            )
        )
    with np.errstate(divide="ignore"):
        D2 = -np.log(np.minimum(K, 1.0)) / g
    return D2


def reconstruct_from_kernel_rows(K_rows, Y, gamma: float, *, return_rank: bool = False):
    """Rebuild records from Gaussian kernel rows ``K(X_p, Y)``: invert ``d² = −log k / γ``, then trilaterate.

    Kernel rows leak exactly what distance rows leak (docs/what-leaves-each-site.md). Entries that underflowed to zero are dropped
    from that record's equations (a per-record least-squares solve with the remaining landmarks); a record needs
    at least ``m + 2`` usable entries for exact recovery.

    Parameters
    ----------
    K_rows : array (n, n_y)
        ``exp(−γ ‖x_i − y_j‖²)``.
    Y : array (n_y, m)
        Landmarks.
    gamma : float
        Kernel bandwidth (public: the server chose or received it).
    return_rank : bool
        Also return the rank of the centred landmarks.
    """
    Y = _as_matrix("Y", Y)
    K = np.asarray(K_rows, dtype=np.float64)
    if K.ndim != 2 or K.shape[1] != Y.shape[0]:
        raise DataError(bad_value("K_rows.shape", K.shape, f"expected (n, {Y.shape[0]}) kernel rows"))
    D2 = kernel_rows_to_sq_distances(K, gamma)
    finite = np.isfinite(D2)
    X_hat, rank = _trilaterate_sq(np.where(finite, D2, 0.0), Y)
    bad_rows = np.flatnonzero(~finite.all(axis=1))
    if bad_rows.size:
        y2 = np.einsum("ij,ij->i", Y, Y)
        A_full = np.hstack([-2.0 * Y, np.ones((Y.shape[0], 1))])
        for i in bad_rows:
            ok = finite[i]
            if ok.sum() < 2:
                X_hat[i] = Y.mean(axis=0)  # nothing usable: the landmark mean is all the row says
                continue
            z, *_ = np.linalg.lstsq(A_full[ok], D2[i, ok] - y2[ok], rcond=None)
            X_hat[i] = z[:-1]
    return (X_hat, rank) if return_rank else X_hat


def _nw_predict(Zq, Zl, Yl, h, exclude_self=False):
    D2 = sq_dists(Zq, Zl)
    logw = -D2 / (2.0 * h * h)
    if exclude_self:
        np.fill_diagonal(logw, -np.inf)
    logw -= logw.max(axis=1, keepdims=True)
    w = np.exp(logw)
    w /= w.sum(axis=1, keepdims=True)
    return w @ Yl


def reconstruct_from_coordinates(coords_sites, landmark_coords, Y, *, bandwidths=None, return_info: bool = False):
    """No-rows mode attack: map each record's final 2-D coordinate back to the data space.

    The server knows the landmarks ``Y`` (n_y × m), their 2-D embedding ``Z_Y`` and every record's 2-D
    coordinate ``z``. Its best generic estimate of the record is a Nadaraya–Watson kernel regression through
    the landmarks (the only high-dimensional points it holds)::

        x̂(z) = Σ_j w_j(z) y_j,   w_j(z) ∝ exp(−‖z − z_j‖² / (2h²)),

    with the bandwidth ``h`` chosen by the server itself by leave-one-out prediction of the landmarks
    (``ŷ_j`` from the other landmarks' ``(z_k, y_k)``), i.e. tuned to be as good as the server can make it
    without any record.

    Parameters
    ----------
    coords_sites : list of arrays (n_p, 2) or one array (n, 2)
        Final coordinates that left each site.
    landmark_coords : array (n_y, 2)
        The landmarks' embedding (computed by the server).
    Y : array (n_y, m)
        Landmarks.
    bandwidths : sequence of float, optional
        Candidate ``h`` values; default: 24 values log-spaced between 0.01 and 3 times the median
        nearest-neighbour distance among the landmark coordinates.
    return_info : bool
        Also return ``{"bandwidth": h, "loo_relative_error": ...}``.

    Returns
    -------
    X_hat : ndarray (n, m) or list of arrays (one per site, when a list was given)
    """
    Y = _as_matrix("Y", Y)
    Zl = _as_matrix("landmark_coords", landmark_coords)
    if Zl.shape[0] != Y.shape[0]:
        raise DataError(
            bad_value("landmark_coords.shape", Zl.shape, f"give one coordinate per landmark ({Y.shape[0]})")
        )
    as_list = isinstance(coords_sites, (list, tuple))
    parts = (
        [_as_matrix(f"coords_sites[{i}]", c, ncols=Zl.shape[1]) for i, c in enumerate(coords_sites)]
        if as_list
        else [_as_matrix("coords_sites", coords_sites, ncols=Zl.shape[1])]
    )
    if Y.shape[0] < 3:
        raise ConfigError(bad_value("n_landmarks", Y.shape[0], "the coordinate attack needs at least 3 landmarks"))
    if bandwidths is None:
        Dl = sq_dists(Zl)
        np.fill_diagonal(Dl, np.inf)
        nn = float(np.median(np.sqrt(Dl.min(axis=1))))
        nn = nn if nn > 0 else 1.0
        bandwidths = nn * np.logspace(-2, np.log10(3.0), 24)
    best = None
    ynorm = np.maximum(np.linalg.norm(Y, axis=1), 1e-12)
    for h in bandwidths:
        if not h > 0:
            raise ConfigError(bad_value("bandwidths", h, "use positive bandwidths"))
        pred = _nw_predict(Zl, Zl, Y, float(h), exclude_self=True)
        err = float(np.median(np.linalg.norm(pred - Y, axis=1) / ynorm))
        if best is None or err < best[1]:
            best = (float(h), err)
    h = best[0]
    out = [_nw_predict(P, Zl, Y, h) for P in parts]
    X_hat = out if as_list else out[0]
    if return_info:
        return X_hat, {"bandwidth": h, "loo_relative_error": best[1], "attack": "nadaraya-watson via landmarks"}
    return X_hat


def reconstruction_risk(X_true, X_hat, *, within=(0.05, 0.10, 0.25), reference=None) -> dict:
    """Score a reconstruction: relative error ``e_i = ‖x̂_i − x_i‖ / ‖x_i‖`` per record.

    Parameters
    ----------
    X_true, X_hat : arrays (n, m)
        The records and the attacker's estimates (same order).
    within : sequence of float
        Report the fraction of records with ``e_i ≤`` each level (``0.05`` is the headline figure).
    reference : array (m,), optional
        A no-information guess (the average record: what anyone who knows the population's average knows without
        the run): its median relative error and its share of records within 5 % are reported as the baseline, and
        ``fraction_within_5pct_beyond_baseline`` counts the records the attack rebuilds to within 5 % that the
        guess does not — so a reader can tell whether the attack learned anything beyond "a typical record".

    Returns
    -------
    dict
        ``median_relative_error``, ``mean_relative_error``, ``p10_relative_error``, ``p90_relative_error``,
        ``min_relative_error``, ``fraction_within_5pct`` (and ``fraction_within_<k>pct`` for each level),
        ``n_records``, ``n_zero_norm_records`` (records with ‖x‖ = 0 are excluded from the relative figures),
        and, when ``reference`` is given, ``baseline_median_relative_error``, ``baseline_fraction_within_5pct`` and
        ``fraction_within_5pct_beyond_baseline``.
    """
    X = _as_matrix("X_true", X_true)
    Xh = _as_matrix("X_hat", X_hat, ncols=X.shape[1])
    if Xh.shape != X.shape:
        raise DataError(bad_value("X_hat.shape", Xh.shape, f"must match X_true.shape {X.shape}"))
    norms = np.linalg.norm(X, axis=1)
    nz = norms > 0
    if not np.any(nz):
        raise DataError(bad_value("X_true", "all-zero records", "relative error needs records with non-zero norm"))
    rel = np.linalg.norm(Xh - X, axis=1)[nz] / norms[nz]
    out = {
        "n_records": int(X.shape[0]),
        "n_zero_norm_records": int((~nz).sum()),
        "median_relative_error": float(np.median(rel)),
        "mean_relative_error": float(np.mean(rel)),
        "min_relative_error": float(np.min(rel)),
        "p10_relative_error": float(np.quantile(rel, 0.10)),
        "p90_relative_error": float(np.quantile(rel, 0.90)),
    }
    for lv in within:
        out[f"fraction_within_{round(100 * lv):d}pct"] = float(np.mean(rel <= lv))
    if "fraction_within_5pct" not in out:
        out["fraction_within_5pct"] = float(np.mean(rel <= 0.05))
    if reference is not None:
        ref = np.asarray(reference, dtype=np.float64).reshape(1, -1)
        if ref.shape[1] != X.shape[1]:
            raise DataError(bad_value("reference.shape", ref.shape, f"give one vector of length {X.shape[1]}"))
        base = np.linalg.norm(X[nz] - ref, axis=1) / norms[nz]
        out["baseline_median_relative_error"] = float(np.median(base))
        out["baseline_fraction_within_5pct"] = float(np.mean(base <= 0.05))
        # the records the attack rebuilds to within 5 % that the no-information guess does not: what the run gave away
        out["fraction_within_5pct_beyond_baseline"] = float(np.mean((rel <= 0.05) & (base > 0.05)))
    return out


def reconstruction_record(X_true, X_hat, *, mode: str, attack: str, Y=None, reference=None, **info) -> dict:
    """The ``audit/reconstruction.json`` record: :func:`reconstruction_risk` plus what was attacked and how.

    Parameters
    ----------
    mode : str
        What left the sites: ``"rows"`` (distance rows), ``"kernel_rows"``, ``"perturbed_rows"`` or ``"local"``.
    attack : str
        Which attack produced ``X_hat`` (e.g. ``"trilateration"``).
    Y : array, optional
        Landmarks; their count/shape is recorded (and their mean is the baseline when ``reference`` is not given).
    reference : array (m,), optional
        The no-information guess the attack is judged against (:func:`reconstruction_risk`): the average record.
    **info
        Extra JSON-ready facts (e.g. ``rank``, ``bandwidth``).
    """
    ref = reference if reference is not None else (None if Y is None else np.asarray(Y, dtype=np.float64).mean(axis=0))
    rec: dict = {"format": "securefed.audits.reconstruction/1", "mode": str(mode), "attack": str(attack)}
    if Y is not None:
        rec["n_landmarks"], rec["n_features"] = int(np.shape(Y)[0]), int(np.shape(Y)[1])
    rec.update(reconstruction_risk(X_true, X_hat, reference=ref))
    rec.update(info)
    return rec
