"""Enforced bounds behind every sensitivity claim (docs/maths.md; Qiao et al. Theorems 3 and 5 assume them).

* ``τ_X`` — each record is clipped to norm ``τ_X`` (:func:`clip_records`), and the number of clipped
  records is reported (never a silent clip).
* ``τ_Y`` — every ``Y`` a site or the server holds is projected onto the spectral-norm ball
  ``‖Y‖₂ ≤ τ_Y`` (:func:`project_spectral`).
* ``Υ`` — then ``‖y_i − x_j‖ ≤ ‖y_i‖ + ‖x_j‖ ≤ τ_Y + τ_X`` holds automatically (a row's norm is at most
  the spectral norm), so ``Υ = τ_X + τ_Y`` is enforced without a further step (:func:`enforced_upsilon`).

The rule for ``τ_X`` (:func:`default_tau_x`)
-------------------------------------------
``τ_X`` must be **public**: a clip norm read off the data (max or quantile of the records' norms) is
itself a function of the records and leaks (the max norm *is* one record's norm), and it is not
covered by the (ε, δ) accounting. securefed therefore takes ``τ_X`` from the user, or derives it
from the data *domain* the user states — features known to lie in ``[lo, hi]`` give
``τ_X = √m · max(|lo|, |hi|)`` (e.g. MNIST pixels in ``[0, 1]``: ``τ_X = 28``), which involves no
record at all. A tighter clip (records are usually far inside the domain ball) is a public choice
the user makes; clipping only ever costs accuracy, never privacy. A differentially private quantile
of the norms would be a third option; securefed does not implement one (it would need its own
budget share and a non-Gaussian mechanism in the ledger).
"""

from __future__ import annotations

import math

import numpy as np

from ..errors import ConfigError, DataError, bad_value

__all__ = ["clip_records", "default_tau_x", "project_spectral", "enforced_upsilon", "default_tau_y", "check_bound"]


def check_bound(name: str, value) -> float:
    """Validate a norm bound (positive, finite) and return it as float."""
    try:
        f = float(value)
    except (TypeError, ValueError):
        raise ConfigError(bad_value(name, value, "give a positive finite norm bound, e.g. 1.0")) from None
    if not math.isfinite(f) or f <= 0:
        raise ConfigError(bad_value(name, value, "give a positive finite norm bound, e.g. 1.0"))
    return f


def clip_records(X, tau_x) -> tuple[np.ndarray, int]:
    """Clip every record (row) to ℓ₂ norm at most ``τ_X``: ``x ← x · min(1, τ_X/‖x‖)``.

    Returns
    -------
    (X_clipped, n_clipped) : a new float64 array and the number of rows that were scaled down.
    """
    tau = check_bound("tau_x", tau_x)
    X = np.array(X, dtype=np.float64, copy=True)
    if X.ndim != 2:
        raise DataError(bad_value("X.shape", X.shape, "give a 2-D array, rows = records"))
    if not np.all(np.isfinite(X)):
        raise DataError(bad_value("X", "non-finite values", "remove or impute NaN/inf before clipping"))
    norms = np.linalg.norm(X, axis=1)
    over = norms > tau
    if np.any(over):
        # a few ulps inside the sphere so that round-off never leaves a norm above τ_X
        X[over] *= (tau / norms[over] * (1.0 - 8 * np.finfo(float).eps))[:, None]
        idx = np.flatnonzero(over)
        while True:
            bad = np.linalg.norm(X[idx], axis=1) > tau
            if not np.any(bad):
                break
            X[idx[bad]] *= 1.0 - 8 * np.finfo(float).eps
    return X, int(over.sum())


def default_tau_x(n_features: int, value_range=None, *, tau_x=None) -> float:
    """The public clip norm τ_X (see the module docstring for the rule).

    Parameters
    ----------
    n_features : int
        ``m``.
    value_range : (lo, hi), optional
        A public range every feature lies in (the data *domain*, not the observed data).
    tau_x : float, optional
        An explicit bound; returned as is (validated).

    Returns
    -------
    float
        ``tau_x`` if given, else ``√m · max(|lo|, |hi|)``.
    """
    if tau_x is not None:
        return check_bound("tau_x", tau_x)
    if value_range is None:
        raise ConfigError(
            bad_value(
                "tau_x",
                None,
                "give a public clip norm (--clip-norm T) or the public feature range; "
                "a norm read off the records would leak and is not accounted",
            )
        )
    try:
        lo, hi = (float(v) for v in value_range)
    except (TypeError, ValueError):
        raise ConfigError(bad_value("value_range", value_range, "give (lo, hi) with lo < hi")) from None
    if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
        raise ConfigError(bad_value("value_range", value_range, "give finite (lo, hi) with lo < hi"))
    if isinstance(n_features, bool) or int(n_features) < 1:
        raise ConfigError(bad_value("n_features", n_features, "use a positive integer"))
    return check_bound("tau_x", math.sqrt(int(n_features)) * max(abs(lo), abs(hi)))


def default_tau_y(tau_x: float, n_landmarks: int) -> float:
    """``τ_Y = √n_y · τ_X``: the smallest spectral ball containing every ``Y`` whose rows lie in the
    record ball, so the projection leaves landmarks that stay within the data's range untouched."""
    return math.sqrt(int(n_landmarks)) * check_bound("tau_x", tau_x)


def project_spectral(Y, tau_y) -> np.ndarray:
    """Project ``Y`` onto the spectral-norm ball ``{‖Y‖₂ ≤ τ_Y}`` (Frobenius-nearest point).

    The Frobenius projection onto a spectral-norm ball clips the singular values:
    ``Y = U diag(s) Vᵀ → U diag(min(s, τ_Y)) Vᵀ``. ``Y`` is returned unchanged (a copy) when already inside.
    """
    tau = check_bound("tau_y", tau_y)
    Y = np.array(Y, dtype=np.float64, copy=True)
    if Y.ndim != 2 or not np.all(np.isfinite(Y)):
        raise DataError(bad_value("Y", f"array{Y.shape}", "give a finite 2-D landmark matrix"))
    # cheap exit: ‖Y‖₂ ≤ ‖Y‖_F
    if np.linalg.norm(Y) <= tau:
        return Y
    U, s, Vt = np.linalg.svd(Y, full_matrices=False)
    if s[0] <= tau:
        return Y
    s = np.minimum(s, np.nextafter(tau, 0.0))
    out = (U * s) @ Vt
    top = np.linalg.norm(out, 2)
    if top > tau:  # round-off of the reconstruction
        out *= np.nextafter(tau / top, 0.0)
    return out


def enforced_upsilon(tau_x, tau_y) -> float:
    """``Υ = τ_X + τ_Y`` — implied by clipping and the spectral projection (no further step needed)."""
    return check_bound("tau_x", tau_x) + check_bound("tau_y", tau_y)
