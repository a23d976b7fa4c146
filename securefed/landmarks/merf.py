"""DP landmarks in two releases: a random-feature mean embedding and the landmarks' counts (the DP billboard), and
an optional third: a noisy 2-D density of every record on the billboard's map.

The landmarks of the no-rows mode under differential privacy (beyond the paper; in the spirit of DP-MERF, Harder
et al., AISTATS 2021 — ``docs/papers.md``). Everything public is fixed before any data is seen: the feature basis
(:func:`public_basis`: a low-pass 2-D DCT for square images, a seeded random orthonormal projection otherwise, the
identity for ≤ ``dim`` features), the scale (the public value bound), the random frequencies
(:func:`rff_frequencies`, public seed, two public length scales) and the number of landmarks.

* **Release 1** — each site sums ``φ(x) = [cos Wx, sin Wx]/√m`` over its records (:func:`rff`); ``‖φ(x)‖ = 1``
  exactly, so replacing one record changes the sum by at most ``Δ₁ = 2`` (L2; not √2: for the fixed frequencies
  ``⟨φ(a), φ(b)⟩ = (1/m) Σ cos(w·(a − b))`` can be negative, ``docs/maths.md`` §12). The total carries Gaussian noise
  ``N(0, σ₁² I)``.
* The coordinator fits ``k`` landmarks whose mean feature matches the noisy mean embedding
  (:func:`fit_to_embedding`) — post-processing.
* **Release 2** — each site counts its records nearest to each landmark (:func:`securefed.landmarks.cells.
  cell_counts`); replacing one record moves one count from one landmark to another: ``Δ₂ = √2``. The total carries
  ``N(0, σ₂² I)``; the masses ``max(count, 1)`` rescaled to the public total are post-processing.
* **Release 3** (optional, ``density_share`` > 0, coordinates kept on the sites) — each site places every record
  against the landmark map alone (:func:`securefed.embedding.placement.place_refine` with ``interact=False``: a
  function of that record and the billboard — not the refined placement, in which a site's records move each
  other) and counts them on a public ``grid × grid`` window of the landmark map (:func:`density_counts`):
  ``Δ₃ = √2``, ``N(0, σ₃² I)``. The shared picture of all records, without any record's coordinate leaving its site.

Accounting (:func:`billboard_noise`, :mod:`securefed.accounting.billboard`): with ``μ = gdp_mu(ε, δ)`` for the whole run, release 1 gets ``μ₁ = μ√(1−ρ−ρ₃)``,
release 2 ``μ₂ = μ√ρ`` (ρ = ``count_share``) and release 3 ``μ₃ = μ√ρ₃`` (ρ₃ = ``density_share``, 0 without it), so
``√(μ₁² + μ₂² + μ₃²) = μ`` exactly (μ-GDP composition; Dong, Roth, Su). The landmarks, their masses and their map
are (ε, δ)-DP for every record — a billboard: a site that places its own records from the billboard and its own
data reveals about **other** sites' records only what the billboard does (joint DP, Hsu et al. 2014). A record's own coordinate is a function of that record: sent to the coordinator,
it is **not** covered by ε.
"""

from __future__ import annotations

import math

import numpy as np


__all__ = [
    "public_basis",
    "scaled_features",
    "rff_frequencies",
    "rff",
    "fit_to_embedding",
    "billboard_noise",
    "density_box",
    "density_counts",
    "RFF_SENSITIVITY",
    "COUNT_SENSITIVITY",
    "DEFAULT_LENGTHSCALES",
    "DEFAULT_FREQUENCIES",
    "FEATURE_NORM",
]

RFF_SENSITIVITY = 2.0  # replace-one L2 change of Σφ (‖φ‖ = 1); not √2: ⟨φ(a), φ(b)⟩ can be < 0 (maths §12)
COUNT_SENSITIVITY = math.sqrt(2.0)  # replace-one L2 change of the per-landmark counts
DEFAULT_LENGTHSCALES = (3.0, 6.0)  # public: in units of the scaled features (records scaled into [−1, 1])
DEFAULT_FREQUENCIES = 2000  # public: m random frequencies (4 000 numbers per site in release 1)
FEATURE_NORM = 10.0  # public: features clipped to this norm (the fit's starting radius)
RFF_SEED = 12345  # public seed of the frequencies


def _dct_matrix(n: int) -> np.ndarray:
    k = np.arange(n)[:, None]
    i = np.arange(n)[None, :]
    C = np.cos(np.pi * (2 * i + 1) * k / (2 * n)) * np.sqrt(2.0 / n)
    C[0] /= np.sqrt(2.0)
    return C


def public_basis(m: int, dim: int = 64, seed: int = 0) -> tuple[np.ndarray, str]:
    """A data-independent orthonormal basis (m × d) and its name: the ``√dim × √dim`` low-frequency 2-D DCT when the
    ``m`` features are a square image, a seeded random projection when ``m > dim``, else the identity."""
    side = int(round(math.sqrt(m)))
    keep = int(round(math.sqrt(dim)))
    if m <= dim:
        return np.eye(m), "identity"
    if side * side == m and keep * keep == dim and keep < side:
        C = _dct_matrix(side)[:keep]
        return np.einsum("ai,bj->ijab", C, C).reshape(m, dim), f"dct {keep}x{keep} of a {side}x{side} image"
    Q, _ = np.linalg.qr(np.random.default_rng([seed, 0xB45]).standard_normal((m, dim)))
    return Q, f"random projection to {dim} dimensions (public seed {seed})"


def scaled_features(X: np.ndarray, B: np.ndarray, scale: float, norm: float = FEATURE_NORM) -> np.ndarray:
    """``(X / scale) B``, each row clipped to the public ``norm`` (``scale``: the public bound on |feature values|)."""
    F = (np.asarray(X, dtype=np.float64) / float(scale)) @ B
    r = np.linalg.norm(F, axis=1, keepdims=True)
    return F * np.minimum(1.0, norm / np.maximum(r, 1e-12))


def rff_frequencies(
    d: int, n_freq: int = DEFAULT_FREQUENCIES, lengthscales=DEFAULT_LENGTHSCALES, seed: int = RFF_SEED
) -> np.ndarray:
    """Public random Fourier frequencies W (n_freq × d), split evenly over the length scales."""
    rng = np.random.default_rng(seed)
    per = int(math.ceil(n_freq / len(lengthscales)))
    return np.vstack([rng.standard_normal((per, d)) / float(ls) for ls in lengthscales])[:n_freq]


def rff(F: np.ndarray, W: np.ndarray) -> np.ndarray:
    """``φ(x) = [cos Wx, sin Wx]/√m`` per row: ``‖φ(x)‖ = 1`` exactly."""
    A = F @ W.T
    return np.hstack([np.cos(A), np.sin(A)]) / math.sqrt(W.shape[0])


def fit_to_embedding(
    target: np.ndarray, W: np.ndarray, k: int, rng, *, radius: float = FEATURE_NORM, iters: int = 500, lr: float = 0.05
) -> np.ndarray:
    """``k`` landmarks whose mean feature matches ``target`` (the noisy mean embedding): Adam on
    ``‖mean φ(Y) − target‖²`` from a data-independent random start (post-processing of release 1)."""
    rng = np.random.default_rng(rng)
    m, d = W.shape
    Y = rng.standard_normal((k, d)) * (radius / math.sqrt(d)) * 0.5
    mom = np.zeros_like(Y)
    v = np.zeros_like(Y)
    for it in range(iters):
        A = Y @ W.T
        C, S = np.cos(A), np.sin(A)
        r = np.hstack([C, S]).mean(axis=0) / math.sqrt(m) - target
        G = ((-S * r[:m] + C * r[m:]) @ W) * (2.0 / (k * math.sqrt(m)))
        mom = 0.9 * mom + 0.1 * G
        v = 0.999 * v + 0.001 * G * G
        Y -= lr * (mom / (1 - 0.9 ** (it + 1))) / (np.sqrt(v / (1 - 0.999 ** (it + 1))) + 1e-12)
    return Y


def billboard_noise(epsilon: float, delta: float, count_share: float = 0.2, density_share: float = 0.0) -> dict:
    """σ₁, σ₂ (and σ₃ of the optional density release) for (ε, δ) over the whole run (μ-GDP split; module
    docstring): ``μ₁² = μ²(1 − count_share − density_share)``, ``μ₂² = μ²·count_share``, ``μ₃² = μ²·density_share``;
    the split itself is :func:`securefed.accounting.billboard.billboard_noise`, with this module's sensitivities."""
    from ..accounting.billboard import billboard_noise as split

    return split(
        epsilon,
        delta,
        count_share,
        density_share,
        sensitivities=(RFF_SENSITIVITY, COUNT_SENSITIVITY, COUNT_SENSITIVITY),
    )


def density_box(E: np.ndarray, pad: float = 0.05) -> tuple[np.ndarray, np.ndarray]:
    """The public window of the density grid: the landmark map's bounding box widened by ``pad`` of its extent on
    every side (the map is post-processing of the DP releases, so the window is too)."""
    E = np.asarray(E, dtype=np.float64)
    lo, hi = E.min(axis=0), E.max(axis=0)
    ext = np.maximum(hi - lo, 1e-12)
    return lo - pad * ext, hi + pad * ext


def density_counts(P: np.ndarray, lo: np.ndarray, hi: np.ndarray, grid: int) -> np.ndarray:
    """Records per cell of a ``grid × grid`` window ``[lo, hi]`` (row-major, first map axis first): each record in
    exactly one cell (positions outside the window fall into its border cells), so replacing one record moves one
    count from one cell to another — L2 sensitivity √2, whatever the other records are."""
    P = np.asarray(P, dtype=np.float64)
    idx = np.floor((P - lo) / (hi - lo) * grid).astype(np.int64)
    idx = np.clip(idx, 0, grid - 1)
    return np.bincount(idx[:, 0] * grid + idx[:, 1], minlength=grid * grid).astype(np.float64)
