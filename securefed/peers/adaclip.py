"""AdaCliP noise for dSNE updates (Saha et al. 2023, Algorithms 3 and 4; Pichapati et al. 2019).

AdaCliP keeps, for every coordinate of the released matrix, a running mean estimate ``m`` and a
running variance estimate ``s``. Each row ``g_i`` (one reference point's 2-D update) is transformed
``w_i = (g_i − m_i) / b_i``, clipped to unit L2 norm, perturbed with ``N(0, σ² I)`` and rescaled
``g̃_i = b_i w̃_i + m_i``. The estimates are then updated **from the noisy output only** (so they are
post-processing and cost no privacy).

Row convention: the input is an ``(N, m)`` matrix, one row per reference point, ``m`` = embedding
dimension. ``m``, ``s`` and ``b`` have the same shape.
"""

from __future__ import annotations

import numpy as np

from ..errors import ConfigError, DataError, bad_value

__all__ = ["adaclip_scale", "noise_addition", "AdaCliP"]


def adaclip_scale(s: np.ndarray) -> np.ndarray:
    """Algorithm 4, line 6 of Saha et al. 2023: ``b_ij = √s_ij · √(Σ_j' s_ij')`` (row-wise sum).

    This is the form the F-dSNE paper prints and its authors' reference code uses; the scale is
    per coordinate, the sum runs over the coordinates of one row.
    """
    return np.sqrt(s) * np.sqrt(s.sum(axis=1, keepdims=True))


def noise_addition(
    G: np.ndarray, m: np.ndarray, b: np.ndarray, sigma: float, rng: np.random.Generator, *, clip: bool = True
) -> np.ndarray:
    """Algorithm 3 (noiseAddition) of Saha et al. 2023: transform → clip → noise → rescale.

    Parameters
    ----------
    G : ndarray of shape (N, m)
        Rows ``g_i`` to privatise.
    m, b : ndarray of shape (N, m)
        Mean estimate and (positive) scale of every coordinate.
    sigma : float
        Noise standard deviation in the transformed space (per coordinate).
    rng : numpy.random.Generator
        Source of the Gaussian noise.
    clip : bool
        Clip each transformed row to unit norm (``ŵ_i = w_i / max(1, ‖w_i‖)``). Only ``clip=True``
        bounds the sensitivity; ``False`` exists to test the transform's exactness.

    Returns
    -------
    ndarray of shape (N, m)
        ``g̃_i = b_i ⊙ (ŵ_i + N(0, σ² I)) + m_i``.
    """
    w = (G - m) / b
    if clip:
        norms = np.linalg.norm(w, axis=1, keepdims=True)
        w = w / np.maximum(1.0, norms)
    if sigma > 0:
        w = w + rng.normal(0.0, sigma, size=w.shape)
    return b * w + m


class AdaCliP:
    """Stateful AdaCliP mechanism (Algorithm 4 of Saha et al. 2023).

    Parameters
    ----------
    shape : tuple of int
        Shape ``(N, m)`` of every matrix released through this mechanism.
    sigma : float
        Noise standard deviation ``σ`` in the transformed (clipped to norm 1) space.
    h1, h2 : float
        Lower and upper bounds of the variance estimate ``v`` (Algorithm 4, line 10).
    beta1, beta2 : float
        Exponential-averaging factors of the mean ``m`` and variance ``s`` estimates (lines 9, 11).
    s0 : float
        Initial variance estimate (``s`` starts at ``s0`` everywhere, ``m`` at zero).
    clip : bool
        Clip transformed rows to unit norm (needed for any privacy guarantee).
    random_state : None, int or numpy.random.Generator
        Noise source. For deployments where the noise itself must resist a strong adversary,
        pass a Generator seeded from ``os.urandom``; the estimators of this package do so.

    Notes
    -----
    The variance update uses the mean estimate *before* its own update, as in the original AdaCliP
    (Pichapati et al. 2019, Alg. 1): ``v = clip((g̃ − m_t)² − b_t² σ², h1, h2)``; then
    ``m_{t+1} = β1 m_t + (1 − β1) g̃`` and ``s_{t+1} = β2 s_t + (1 − β2) v``. (The paper's
    ``β2 (s_t)²`` is a typo: the authors' code and AdaCliP use ``β2 s_t``.)
    """

    def __init__(
        self,
        shape,
        sigma: float,
        *,
        h1: float = 1e-12,
        h2: float = 1e4,
        beta1: float = 0.99,
        beta2: float = 0.9,
        s0: float = 1.0,
        clip: bool = True,
        random_state=None,
    ):
        if not (np.isfinite(sigma) and sigma >= 0):
            raise ConfigError(bad_value("sigma", sigma, "use a non-negative finite noise scale"))
        if not (0 < h1 <= h2):
            raise ConfigError(bad_value("h1, h2", (h1, h2), "use 0 < h1 <= h2, e.g. h1=1e-12, h2=1e4"))
        for name, val in (("beta1", beta1), ("beta2", beta2)):
            if not (0.0 <= val < 1.0):
                raise ConfigError(bad_value(name, val, "use a value in [0, 1), e.g. 0.9"))
        if not (s0 > 0):
            raise ConfigError(bad_value("s0", s0, "use a positive initial variance, e.g. 1.0"))
        self.shape = tuple(int(x) for x in shape)
        self.sigma = float(sigma)
        self.h1, self.h2, self.beta1, self.beta2 = float(h1), float(h2), float(beta1), float(beta2)
        self.clip = bool(clip)
        self.rng = np.random.default_rng(random_state)
        self.m = np.zeros(self.shape)
        self.s = np.full(self.shape, float(s0))
        self.releases = 0

    def __call__(self, G: np.ndarray) -> np.ndarray:
        """Privatise one matrix ``G`` and update the estimates from the noisy output (Alg. 4)."""
        G = np.asarray(G, dtype=np.float64)
        if G.shape != self.shape:
            raise DataError(bad_value("G.shape", G.shape, f"pass a matrix of shape {self.shape}"))
        if not np.all(np.isfinite(G)):
            raise DataError(bad_value("G", "non-finite values", "the update diverged; lower the learning rate"))
        b = adaclip_scale(self.s)
        G_noisy = noise_addition(G, self.m, b, self.sigma, self.rng, clip=self.clip)
        v = np.clip((G_noisy - self.m) ** 2 - b**2 * self.sigma**2, self.h1, self.h2)
        self.m = self.beta1 * self.m + (1.0 - self.beta1) * G_noisy
        self.s = self.beta2 * self.s + (1.0 - self.beta2) * v
        self.releases += 1
        return G_noisy
