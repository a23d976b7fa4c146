"""Distributed integer noise that survives a modular secure sum: the distributed discrete Gaussian and Skellam.

Each site turns its real vector into integers mod ``m = 2^bits`` and adds its own share of integer noise;
the secure sum (SecAgg+, which sums integers mod ``2^k``) reveals only the total; the server decodes it.
No float ever enters the secure sum, nothing is clipped to an "aggregation range" after the noise is added,
and the probability that any coordinate of the sum wraps around the modulus is bounded and reported.

The site's encoder (``papers``: Kairouz, Liu & Steinke, "The Distributed Discrete Gaussian Mechanism for
Federated Learning with Secure Aggregation", ICML 2021 — *KLS* — Algorithm 1; Agarwal, Kairouz & Liu,
"The Skellam Mechanism for Differentially Private Federated Learning", NeurIPS 2021 — *AKL* — Algorithm 1):

1. clip ``x`` to L2 norm ``c`` (public);
2. scale by ``1/γ`` (``γ`` = granularity);
3. pad to ``d' = 2^⌈log2 d⌉`` and rotate: ``H D x`` with the orthonormal Walsh–Hadamard matrix ``H`` and
   random signs ``D`` from a **public** seed shared by all sites (:func:`rotation_signs`; KLS §4.2 — the
   rotation "flattens" the vector so that every coordinate of the sum is sub-Gaussian);
4. randomized rounding to ℤ^{d'} (:func:`~securefed.accounting.samplers.randomized_round`); with
   ``β > 0`` *conditional* rounding, retried until ``‖x̃‖₂`` is within the bound of KLS Theorem 1 /
   :func:`rounded_l2_bound`;
5. add integer noise: ``N_Z(0, σ²)^{d'}`` from the exact CSPRNG sampler of Canonne, Kamath & Steinke
   (2020) (DDG), or ``Sk(λ, λ)^{d'}`` (Skellam);
6. reduce mod ``m`` → the ``uint64`` vector the site feeds into the secure sum (:meth:`encode`).

The server reduces the secure sum mod ``m``, maps it to ``[−m/2, m/2)``, un-rotates (``D H``), multiplies
by ``γ`` and drops the padding (:meth:`decode`).

Privacy (what is accounted)
---------------------------
*Record adjacency* (``adjacency="record"``, securefed's unit): a record changes the site's vector by at
most ``Δ`` in L2 (its sensitivity); clipping (a projection) and the rotation (an isometry) keep that, the
scaling makes it ``Δ/γ``. Randomized rounding of the two neighbours, coupled through the same uniforms,
differs by at most ``⌈|δ_j|⌉ ≤ |δ_j| + 1`` per coordinate, so every coupled pair is within
``Δ₂ = Δ/γ + √d'`` in L2 and ``Δ₁ = min(√d'·Δ/γ + d', Δ₂²)`` in L1; by joint quasi-convexity of Rényi
divergence (van Erven & Harremoës 2014, Thm 13) the release is as private as integer shifts of those
sizes. Conditioning the rounding on its norm would break that coupling, so record adjacency requires
``β = 0``. *Site adjacency* (``adjacency="site"``, the papers' unit: a whole site's vector added or
removed) uses KLS Theorem 1's rounded norm bound, with ``β`` allowed.

* DDG: the sum of ``k`` survivors' ``N_Z(0, σ²)`` is close to ``N_Z(0, kσ²)``; KLS Proposition 14 / Eq. 17
  (arXiv 2102.06387v4) gives, with ``τ = 10 Σ_{j=1}^{k−1} e^{−2π²σ² j/(j+1)}`` (KLS Theorem 1),
  ``ε(α) = min{ α/2·Δ₂²/(kσ²) + τd',  α/2·(Δ₂²/(kσ²) + 2τΔ₁/(√k σ) + τ²d'),  α/2·(Δ₂/(√k σ) + τ√d')² }``.
  (:func:`ddg_rdp`). ``τ`` grows with ``k`` and the first term shrinks, so ε is the worst over every
  ``k ∈ [t, n]`` survivors the secure sum may reveal.
* Skellam: the sum of ``k`` sites' ``Sk(λ, λ)`` is exactly ``Sk(kλ, kλ)``, variance ``μ = 2kλ``; AKL's
  Rényi bound (their Theorem for the multi-dimensional Skellam mechanism; as implemented by the authors)
  ``ε(α) = αΔ₂²/(2μ) + min(((2α − 1)Δ₂² + 6Δ₁)/(4μ²), 3Δ₁/(2μ))`` for integer ``α > 1``
  (:func:`skellam_rdp`); the worst case is ``k = t``.

``R`` releases compose additively in RDP; (ε, δ) follows from the conversion of Canonne, Kamath & Steinke
(2020, Prop. 12) / Balle et al. (2020, Thm 21) — the one Opacus uses (:func:`rdp_to_epsilon`). Poisson
subsampling is *not* credited (it never increases RDP under add/remove adjacency, by the same
quasi-convexity, so the figure stays an upper bound).

Wrap-around (the modulus rule)
------------------------------
Coordinate ``j`` of the integer sum is ``(H D Σ_i x_i/γ)_j + Σ_i r_ij + Σ_i ξ_ij``: the rotated data term
is sub-Gaussian with variance proxy ``‖Σ_i x_i/γ‖²/d' ≤ (n c/γ)²/d'`` (Hoeffding over the public random
signs, which honest sites' data do not depend on), each rounding error is mean-zero in an interval of
length 1 (proxy 1/4), each discrete Gaussian is ``σ²``-sub-Gaussian (CKS 2020), and a Skellam has the
moment generating function ``exp(2λ(cosh s − 1))``. A Chernoff bound on the sum, a union bound over the
``d'`` coordinates and both tails, and a factor ``(1 − β)^{−n}`` for conditional rounding give
:func:`wrap_probability`; :func:`choose_modulus_bits` returns the fewest bits with that probability
``≤ 2^-40`` (default). Wrap-around is a correctness event, not a privacy one (the server sees a function
of the noisy sum either way).
"""

from __future__ import annotations

import hashlib
import math
from fractions import Fraction
from typing import Callable

import numpy as np
from scipy.optimize import brentq

from ..errors import ConfigError, OverflowRiskError, bad_value
from .accountants import check_delta, check_epsilon, check_releases
from .samplers import discrete_gaussian, randomized_round, skellam

__all__ = [
    "padded_dimension",
    "rotation_signs",
    "walsh_hadamard",
    "rotate",
    "unrotate",
    "rounded_l2_bound",
    "conditional_randomized_round",
    "integer_sensitivity",
    "ddg_tau",
    "ddg_rdp",
    "skellam_rdp",
    "rdp_to_epsilon",
    "ddg_epsilon",
    "skellam_epsilon",
    "wrap_probability",
    "choose_modulus_bits",
    "DistributedDiscreteGaussian",
    "DistributedSkellam",
    "RDP_ORDERS",
    "fit_integer_mechanism",
    "integer_claim",
    "check_integer_claim",
    "noise_of",
]

#: integer Rényi orders: 2..128, then geometric up to 10^7 (small ε needs large orders)
RDP_ORDERS = np.unique(np.concatenate([np.arange(2, 129), np.round(np.geomspace(129, 1e7, 400))])).astype(np.float64)

_DEFAULT_WRAP = 2.0**-40


# ---------------------------------------------------------------------------------------------- rotation


def padded_dimension(dim: int) -> int:
    """``2^⌈log2 d⌉`` — the Walsh–Hadamard transform needs a power of two (19 200 → 32 768)."""
    if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)) or dim < 1:
        raise ConfigError(bad_value("dim", dim, "use the positive number of coordinates of the summed vector"))
    return 1 << (int(dim) - 1).bit_length()


def rotation_signs(seed: str, round: int, step: int, dim: int) -> np.ndarray:
    """The public ±1 signs ``D`` of the randomized Walsh–Hadamard rotation for one aggregation.

    SHAKE-256 of ``"securefed-rotation|seed|round|step|dim"``: every site and the server derive the same
    signs from the public seed (KLS §4.2: the rotation's randomness is shared, not secret), and a new
    diagonal for every aggregation.
    """
    if not isinstance(seed, str) or not seed:
        raise ConfigError(
            bad_value("rotation_seed", seed, "give a non-empty public string shared by all sites (e.g. the run id)")
        )
    d = int(dim)
    raw = hashlib.shake_256(f"securefed-rotation|{seed}|{int(round)}|{int(step)}|{d}".encode()).digest((d + 7) // 8)
    bits = np.unpackbits(np.frombuffer(raw, dtype=np.uint8))[:d]
    return (1 - 2 * bits.astype(np.int8)).astype(np.int8)


def walsh_hadamard(x: np.ndarray) -> np.ndarray:
    """Orthonormal fast Walsh–Hadamard transform ``H x / √d`` of a vector whose length is a power of two.

    ``H`` (Sylvester order) is symmetric and ``(H/√d)² = I``: the transform is its own inverse.
    """
    y = np.array(x, dtype=np.float64, copy=True)
    n = y.shape[0]
    if n & (n - 1):
        raise ConfigError(bad_value("len(x)", n, "pad to a power of two first (padded_dimension)"))
    h = 1
    while h < n:
        y = y.reshape(-1, 2, h)
        y = np.stack([y[:, 0, :] + y[:, 1, :], y[:, 0, :] - y[:, 1, :]], axis=1)
        h *= 2
    return y.reshape(n) / math.sqrt(n)


def rotate(x: np.ndarray, signs: np.ndarray) -> np.ndarray:
    """``H D x`` (``x`` zero-padded to ``len(signs)``)."""
    d = len(signs)
    v = np.zeros(d)
    v[: len(x)] = x
    return walsh_hadamard(signs * v)


def unrotate(y: np.ndarray, signs: np.ndarray, dim: int | None = None) -> np.ndarray:
    """``D H y`` — the inverse of :func:`rotate` — truncated to the first ``dim`` coordinates."""
    out = signs * walsh_hadamard(y)
    return out if dim is None else out[: int(dim)]


# ---------------------------------------------------------------------------------------------- rounding


def rounded_l2_bound(norm: float, dim: int, beta: float) -> float:
    """KLS Theorem 1's bound on ``‖x̃‖₂`` after (conditional) randomized rounding of ``‖x‖₂ ≤ norm``:

    ``min(norm + √d, √(norm² + d/4 + √(2 log(1/β))·(norm + √d/2)))`` (the second only for ``β > 0``).
    """
    b1 = norm + math.sqrt(dim)
    if beta <= 0:
        return b1
    b2 = math.sqrt(norm * norm + dim / 4.0 + math.sqrt(2.0 * math.log(1.0 / beta)) * (norm + math.sqrt(dim) / 2.0))
    return min(b1, b2)


def conditional_randomized_round(
    x: np.ndarray, *, beta: float, norm: float, max_tries: int = 10_000, src=None
) -> np.ndarray:
    """KLS Algorithm 1, step 3: randomized rounding, retried until ``‖x̃‖₂ ≤ rounded_l2_bound(norm, d, β)``.

    Each try succeeds with probability ≥ 1 − β (KLS Theorem 1); ``β = 0`` never retries (the bound
    ``norm + √d`` always holds).
    """
    bound = rounded_l2_bound(norm, len(x), beta)
    for _ in range(int(max_tries)):
        r = randomized_round(x, src)
        if beta <= 0 or float(np.linalg.norm(r.astype(np.float64))) <= bound:
            return r
    raise ConfigError(
        bad_value(
            "beta",
            beta,
            f"conditional rounding failed {max_tries} times: the input's norm exceeds `norm` (clip it first)",
        )
    )


def integer_sensitivity(
    *,
    dim: int,
    granularity: float,
    adjacency: str,
    l2_sensitivity: float | None = None,
    clip: float | None = None,
    beta: float = 0.0,
) -> tuple[float, float]:
    """``(Δ₂, Δ₁)`` of the rounded, scaled vector in integer units (module docstring).

    ``adjacency="record"``: ``Δ₂ = Δ/γ + √d``, ``Δ₁ = min(√d·Δ/γ + d, Δ₂²)`` (coupled rounding; ``β`` must be 0).
    ``adjacency="site"``: ``Δ₂ = rounded_l2_bound(c/γ, d, β)``, ``Δ₁ = Δ₂·min(√d, Δ₂)`` (KLS Theorem 1).
    """
    d = float(dim)
    if adjacency == "record":
        if beta != 0:
            raise ConfigError(
                bad_value(
                    "beta",
                    beta,
                    "record adjacency needs unconditional rounding (beta=0): conditioning "
                    "on the norm breaks the coupling of neighbouring data sets' roundings",
                )
            )
        s = float(l2_sensitivity) / granularity
        l2 = s + math.sqrt(d)
        return l2, min(math.sqrt(d) * s + d, l2 * l2)
    if adjacency == "site":
        l2 = rounded_l2_bound(float(clip) / granularity, int(d), beta)
        return l2, l2 * min(math.sqrt(d), l2)
    raise ConfigError(
        bad_value("adjacency", adjacency, "use 'record' (one record of a site) or 'site' (a whole site's vector)")
    )


# ---------------------------------------------------------------------------------------------- accounting


def ddg_tau(sigma2: float, n: int) -> float:
    """KLS Theorem 1: ``τ = 10 Σ_{k=1}^{n−1} exp(−2π²σ² k/(k+1))`` for ``n`` summed ``N_Z(0, σ²)``."""
    k = np.arange(1, int(n), dtype=np.float64)
    return float(10.0 * np.sum(np.exp(-2.0 * math.pi**2 * float(sigma2) * k / (k + 1)))) if n > 1 else 0.0


def ddg_rdp(alpha, *, l2: float, l1: float, sigma2: float, n: int, dim: int) -> np.ndarray:
    """Rényi DP of one release of the sum of ``n`` sites' ``N_Z(0, σ²)^d`` noise at integer shifts with
    ``‖Δ‖₂ ≤ l2``, ``‖Δ‖₁ ≤ l1`` (KLS Proposition 14 / Eq. 17; ``τ`` from :func:`ddg_tau`)."""
    a = np.asarray(alpha, dtype=np.float64)
    tau = ddg_tau(sigma2, n)
    s = math.sqrt(n * float(sigma2))
    l2s, l1s = l2 / s, l1 / s
    t1 = a / 2.0 * l2s**2 + tau * dim
    t2 = a / 2.0 * (l2s**2 + 2.0 * l1s * tau + tau**2 * dim)
    t3 = a / 2.0 * (l2s + math.sqrt(dim) * tau) ** 2
    return np.minimum(np.minimum(t1, t2), t3)


def skellam_rdp(alpha, *, l2: float, l1: float, variance: float) -> np.ndarray:
    """Rényi DP of one release with symmetric Skellam noise of total variance ``μ`` per coordinate at integer
    shifts ``‖Δ‖₂ ≤ l2``, ``‖Δ‖₁ ≤ l1`` (AKL 2021, multi-dimensional Skellam; integer ``α > 1``):
    ``αΔ₂²/(2μ) + min(((2α − 1)Δ₂² + 6Δ₁)/(4μ²), 3Δ₁/(2μ))``."""
    a = np.asarray(alpha, dtype=np.float64)
    mu = float(variance)
    return a * l2**2 / (2 * mu) + np.minimum(((2 * a - 1) * l2**2 + 6 * l1) / (4 * mu**2), 3 * l1 / (2 * mu))


def rdp_to_epsilon(rdp: np.ndarray, delta: float, orders: np.ndarray = RDP_ORDERS) -> tuple[float, float]:
    """``(ε, α*)`` from an RDP curve: ``ε = min_α rdp(α) + log((α−1)/α) − (log δ + log α)/(α − 1)``
    (Canonne, Kamath & Steinke 2020, Prop. 12; Balle et al. 2020, Thm 21)."""
    a = np.asarray(orders, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        eps = np.asarray(rdp, dtype=np.float64) + np.log((a - 1) / a) - (math.log(delta) + np.log(a)) / (a - 1)
    eps = np.where(np.isfinite(eps), eps, np.inf)
    i = int(np.argmin(eps))
    return float(max(eps[i], 0.0)), float(a[i])


def ddg_epsilon(
    *, l2: float, l1: float, sigma2: float, n_sites: int, min_survivors: int, dim: int, releases: int, delta: float
) -> float:
    """ε after ``releases`` DDG releases, worst over ``k ∈ [min_survivors, n_sites]`` survivors (integer units)."""
    worst = 0.0
    for k in range(int(min_survivors), int(n_sites) + 1):
        eps, _ = rdp_to_epsilon(releases * ddg_rdp(RDP_ORDERS, l2=l2, l1=l1, sigma2=sigma2, n=k, dim=dim), delta)
        worst = max(worst, eps)
    return worst


def skellam_epsilon(*, l2: float, l1: float, lam: float, min_survivors: int, releases: int, delta: float) -> float:
    """ε after ``releases`` Skellam releases with ``min_survivors`` sites each adding ``Sk(λ, λ)`` (more survivors
    only add variance)."""
    mu = 2.0 * float(lam) * int(min_survivors)
    eps, _ = rdp_to_epsilon(releases * skellam_rdp(RDP_ORDERS, l2=l2, l1=l1, variance=mu), delta)
    return eps


# ---------------------------------------------------------------------------------------------- modulus


def wrap_probability(
    bits: int, *, n_sites: int, dim: int, clip_int: float, sigma2: float = 0.0, lam: float = 0.0, beta: float = 0.0
) -> float:
    """Upper bound on P[some coordinate of the integer sum leaves ``[−2^{bits−1}, 2^{bits−1})``] (module docstring).

    Parameters
    ----------
    bits : int
        ``m = 2^bits``.
    n_sites : int
        The most sites whose vectors can be summed.
    dim : int
        Padded dimension ``d'``.
    clip_int : float
        ``c/γ``: every site's scaled vector has L2 norm at most this.
    sigma2, lam : float
        Per-site discrete Gaussian ``σ²`` (DDG) or Skellam rate ``λ`` (``Sk(λ, λ)``).
    beta : float
        Conditional rounding's ``β`` (inflates the bound by ``(1 − β)^{−n}``).
    """
    n = int(n_sites)
    a = 2.0 ** (int(bits) - 1)
    v = (n * clip_int) ** 2 / dim + n / 4.0 + n * float(sigma2)  # sub-Gaussian variance proxy
    L = n * float(lam)  # Skellam: log E e^{sX} = 2L(cosh s − 1)

    def deriv(s):
        return -a + s * v + 2.0 * L * math.sinh(s)

    hi = a / v if v > 0 else 1.0
    while deriv(hi) < 0:
        hi *= 2.0
    s = brentq(deriv, 0.0, hi, xtol=1e-15, rtol=1e-12, maxiter=500) if deriv(0.0) < 0 else 0.0
    log_tail = -s * a + s * s * v / 2.0 + (2.0 * L * (math.cosh(s) - 1.0) if L > 0 else 0.0)
    log_p = math.log(2.0 * dim) + log_tail - n * math.log1p(-beta)
    return math.exp(min(log_p, 0.0))


def choose_modulus_bits(
    *,
    n_sites: int,
    dim: int,
    clip_int: float,
    sigma2: float = 0.0,
    lam: float = 0.0,
    beta: float = 0.0,
    target: float = _DEFAULT_WRAP,
    max_bits: int = 64,
) -> int:
    """The fewest bits ``b`` with :func:`wrap_probability` ``≤ target``; :class:`OverflowRiskError` above ``max_bits``."""
    if not (0 < target < 1):
        raise ConfigError(bad_value("wrap_probability", target, "give a probability in (0, 1), e.g. 2**-40"))
    for b in range(2, int(max_bits) + 1):
        if (
            wrap_probability(b, n_sites=n_sites, dim=dim, clip_int=clip_int, sigma2=sigma2, lam=lam, beta=beta)
            <= target
        ):
            return b
    raise OverflowRiskError(
        bad_value(
            "max_bits",
            max_bits,
            f"the integer sum needs more bits for wrap probability ≤ "
            f"{target:.3g}; coarsen the granularity (larger γ / rounding_slack), lower the clip "
            "norm, or accept a larger wrap probability",
        )
    )


_wrap_probability_fn = wrap_probability  # the mechanisms' parameter of the same name shadows it


# ---------------------------------------------------------------------------------------------- mechanisms


def _pos(name, v):
    try:
        f = float(v)
    except (TypeError, ValueError):
        raise ConfigError(bad_value(name, v, "give a positive finite number")) from None
    if not (math.isfinite(f) and f > 0):
        raise ConfigError(bad_value(name, v, "give a positive finite number"))
    return f


class _DistributedInteger:
    """Shared plan, encoder and decoder of :class:`DistributedDiscreteGaussian` and :class:`DistributedSkellam`."""

    mechanism = "?"
    # set by the subclass: its noise sampler and the ε its calibration reached
    _noise: Callable[..., np.ndarray]
    epsilon_accounted: float

    def __init__(
        self,
        *,
        dim,
        n_sites,
        rotation_seed,
        epsilon,
        delta=1e-5,
        releases=1,
        l2_sensitivity=None,
        clip,
        min_survivors=None,
        adjacency="record",
        granularity=None,
        rounding_slack=0.01,
        beta=None,
        wrap_probability=_DEFAULT_WRAP,
        max_bits=64,
    ):
        self.dim = int(dim) if not isinstance(dim, bool) and isinstance(dim, (int, np.integer)) and dim >= 1 else None
        if self.dim is None:
            raise ConfigError(bad_value("dim", dim, "use the positive number of coordinates (e.g. n_y × m = 19200)"))
        self.padded_dim = padded_dimension(self.dim)
        if isinstance(n_sites, bool) or not isinstance(n_sites, (int, np.integer)) or n_sites < 1:
            raise ConfigError(bad_value("n_sites", n_sites, "use the number of sites in the secure sum"))
        self.n_sites = int(n_sites)
        t = self.n_sites if min_survivors is None else min_survivors
        if isinstance(t, bool) or not isinstance(t, (int, np.integer)) or not (1 <= t <= self.n_sites):
            raise ConfigError(
                bad_value("min_survivors", min_survivors, f"use the secure sum's threshold, 1..{self.n_sites}")
            )
        self.min_survivors = int(t)
        rotation_signs(rotation_seed, 0, 0, 1)  # validates the seed
        self.rotation_seed = rotation_seed
        self.epsilon_target = check_epsilon(epsilon)
        self.delta = check_delta(delta)
        self.releases = check_releases(releases)
        if adjacency not in ("record", "site"):
            raise ConfigError(
                bad_value("adjacency", adjacency, "use 'record' (one record of a site) or 'site' (a whole site)")
            )
        self.adjacency = adjacency
        self.clip = _pos("clip", clip)
        if adjacency == "record":
            self.l2_sensitivity = _pos("l2_sensitivity", l2_sensitivity)
            if self.l2_sensitivity > 2 * self.clip:
                raise ConfigError(
                    bad_value(
                        "l2_sensitivity",
                        l2_sensitivity,
                        f"exceeds 2·clip = {2 * self.clip:g}, the most "
                        "a clipped vector can change; check the clip norm",
                    )
                )
        else:
            self.l2_sensitivity = None
        self.beta = (0.0 if adjacency == "record" else math.exp(-0.5)) if beta is None else float(beta)
        if not (0.0 <= self.beta < 1.0):
            raise ConfigError(bad_value("beta", beta, "use a number in [0, 1) (the paper's experiments use exp(-0.5))"))
        base = self.l2_sensitivity if adjacency == "record" else self.clip
        if granularity is None:
            self.rounding_slack = _pos("rounding_slack", rounding_slack)
            # Δ/γ = √d'/slack: rounding inflates the integer sensitivity by the factor (1 + slack)
            self.granularity = self.rounding_slack * base / math.sqrt(self.padded_dim)
        else:
            self.granularity = _pos("granularity", granularity)
            self.rounding_slack = math.sqrt(self.padded_dim) * self.granularity / base
        self.l2_int, self.l1_int = integer_sensitivity(
            dim=self.padded_dim,
            granularity=self.granularity,
            adjacency=adjacency,
            l2_sensitivity=self.l2_sensitivity,
            clip=self.clip,
            beta=self.beta,
        )
        self.wrap_target = float(wrap_probability)
        self.max_bits = int(max_bits)
        self._calibrate()
        self.modulus_bits = choose_modulus_bits(
            n_sites=self.n_sites,
            dim=self.padded_dim,
            clip_int=self.clip / self.granularity,
            beta=self.beta,
            target=self.wrap_target,
            max_bits=self.max_bits,
            **self._noise_kw(),
        )
        self.wrap_probability_bound = _wrap_probability_fn(
            self.modulus_bits,
            n_sites=self.n_sites,
            dim=self.padded_dim,
            clip_int=self.clip / self.granularity,
            beta=self.beta,
            **self._noise_kw(),
        )
        self.modulus = 1 << self.modulus_bits

    # subclasses: _calibrate (sets the noise parameter and self.epsilon_accounted), _noise_kw, _noise, epsilon

    def _bisect(self, eps_of, lo, hi):
        """Smallest noise parameter p (to 1e-6 relative) with eps_of(p) ≤ target; eps_of decreases in p."""
        while eps_of(hi) > self.epsilon_target:
            hi *= 4.0
            if hi > 1e40:
                raise ConfigError(
                    bad_value(
                        "epsilon",
                        self.epsilon_target,
                        "is unreachable with this sensitivity and "
                        "dimension (the τ term of the distributed discrete Gaussian does not vanish)",
                    )
                )
        while lo > 1e-12 and eps_of(lo) <= self.epsilon_target:
            lo /= 4.0
        while hi / lo > 1 + 1e-6:
            mid = math.sqrt(lo * hi)
            if eps_of(mid) <= self.epsilon_target:
                hi = mid
            else:
                lo = mid
        return hi

    # ------------------------------------------------------------------ site side

    def encode(self, x, *, round: int, step: int, src=None) -> np.ndarray:
        """The site's input to the modular secure sum: ``uint64`` values in ``[0, 2^modulus_bits)``, length
        ``padded_dim``. Clips, scales, rotates (public signs of ``(round, step)``), rounds, adds this site's
        noise from the CSPRNG and reduces mod ``2^modulus_bits``. How many coordinates were clipped never
        leaves the site (it is not returned).

        ``src``: the random words of the rounding and the noise (default: ``os.urandom``). Only tests pass a
        :class:`~securefed.accounting.samplers.SeededWordSource` (whoever knows its seed removes the noise)."""
        v = np.asarray(x, dtype=np.float64).ravel()
        if v.shape[0] != self.dim or not np.all(np.isfinite(v)):
            raise ConfigError(bad_value("x", f"array{np.shape(x)}", f"give {self.dim} finite coordinates"))
        nrm = float(np.linalg.norm(v))
        if nrm > self.clip:
            v = v * (self.clip / nrm)
        z = rotate(v / self.granularity, rotation_signs(self.rotation_seed, round, step, self.padded_dim))
        r = conditional_randomized_round(z, beta=self.beta, norm=self.clip / self.granularity, src=src)
        y = r + self._noise(self.padded_dim, src)
        return y.astype(np.uint64) & np.uint64(self.modulus - 1) if self.modulus_bits < 64 else y.astype(np.uint64)

    # ------------------------------------------------------------------ server side

    def decode(self, total, *, round: int, step: int, shape=None) -> np.ndarray:
        """The server's estimate of ``Σ_i clip(x_i)`` plus the summed noise from the secure sum's output
        ``total = Σ_i encode(x_i) mod 2^k`` (any ``k ≥ modulus_bits``): reduce mod ``2^modulus_bits``, center,
        un-rotate, multiply by the granularity, drop the padding (and reshape to ``shape``)."""
        t = np.asarray(total)
        if t.shape != (self.padded_dim,) or t.dtype.kind not in "ui":
            raise ConfigError(
                bad_value("total", f"{t.dtype}{t.shape}", f"give the secure sum's {self.padded_dim} unsigned integers")
            )
        u = t.astype(np.uint64)
        if self.modulus_bits < 64:
            u = u & np.uint64(self.modulus - 1)
            c = u.astype(np.int64)
            c = np.where(c >= self.modulus // 2, c - self.modulus, c)
        else:
            c = u.view(np.int64)
        out = self.granularity * unrotate(
            c.astype(np.float64), rotation_signs(self.rotation_seed, round, step, self.padded_dim), self.dim
        )
        return out if shape is None else out.reshape(shape)

    # ------------------------------------------------------------------ accounting

    def ledger_noise_multiplier(self) -> float:
        """A Gaussian noise multiplier ``z`` whose RDP ``α/(2z²)`` is ≥ this mechanism's at every order ``α ≥ 1``
        (so composing releases in a ledger with the ``"rdp"`` accountant at ``sample_rate = 1`` is an upper bound)."""
        raise NotImplementedError  # pragma: no cover

    def record_release(
        self, ledger, *, site: int, round: int, step: int, attempt: int = 0, noise_source: str = "secure"
    ) -> dict:
        """Write-ahead ledger event of one site's release (before :meth:`encode`'s output leaves the site).

        The ledger must use the ``"rdp"`` accountant: the event carries the RDP-dominating Gaussian noise
        multiplier (:meth:`ledger_noise_multiplier`) at ``sample_rate = 1``; the exact μ-GDP and PRV
        accountants are tight for Gaussian noise only and would not be upper bounds here.
        """
        if (
            getattr(ledger, "accountant_name", None) != "rdp"
        ):  # the ledger would refuse the event (it does not support it)
            raise ConfigError(
                bad_value(
                    "ledger accountant",
                    getattr(ledger, "accountant_name", None),
                    f"{self.mechanism} releases compose by Rényi DP: open the ledger with accountant='rdp'",
                )
            )
        return ledger.record(
            self.release_event(),
            site=site,
            round=round,
            step=step,
            attempt=attempt,
            noise="distributed-integer",
            noise_source=noise_source,
            min_survivors=self.min_survivors,
            modulus_bits=self.modulus_bits,
            granularity=self.granularity,
            adjacency=self.adjacency,
        )

    def release_event(self, count: int = 1):
        """The event of one site's release (:mod:`.events`): integer noise (``discrete-gaussian`` / ``skellam``) on
        the integer L2 sensitivity, accounted at the Gaussian whose Rényi divergence dominates the mechanism's at every
        order (:meth:`ledger_noise_multiplier`), full participation. Only the RDP accountant supports it."""
        from .events import gaussian_release

        z = float(self.ledger_noise_multiplier())
        return gaussian_release(
            self.mechanism,
            sigma=float(z * self.l2_int),
            sensitivity=float(self.l2_int),
            noise_multiplier=z,
            count=int(count),
        )

    def release(self, x, *, site: int, round: int, step: int, ledger=None, attempt: int = 0) -> np.ndarray:
        """:meth:`record_release` (when a ledger is given), then :meth:`encode` — the write-ahead order."""
        if ledger is not None:
            self.record_release(ledger, site=site, round=round, step=step, attempt=attempt)
        return self.encode(x, round=round, step=step)

    def _report_common(self) -> dict:
        return {
            "mechanism": self.mechanism,
            "adjacency": self.adjacency,
            "epsilon": self.epsilon_accounted,
            "epsilon_target": self.epsilon_target,
            "delta": self.delta,
            "releases": self.releases,
            "accountant": "rdp (paper's bound; Poisson subsampling not credited)",
            "n_sites": self.n_sites,
            "min_survivors": self.min_survivors,
            "dim": self.dim,
            "padded_dim": self.padded_dim,
            "clip": self.clip,
            "l2_sensitivity": self.l2_sensitivity,
            "granularity": self.granularity,
            "rounding_slack": self.rounding_slack,
            "beta": self.beta,
            "l2_sensitivity_integer": self.l2_int,
            "l1_sensitivity_integer": self.l1_int,
            "modulus_bits": self.modulus_bits,
            "wrap_probability_bound": self.wrap_probability_bound,
            "wrap_probability_target": self.wrap_target,
            "rotation": "randomized Walsh–Hadamard, public signs from rotation_seed",
            "noise_source": "secure (os.urandom)",
            "ledger_noise_multiplier": self.ledger_noise_multiplier(),
        }


class DistributedDiscreteGaussian(_DistributedInteger):
    """The distributed discrete Gaussian mechanism (Kairouz, Liu & Steinke, ICML 2021) for a modular secure sum.

    Every site builds the same object from public numbers, calls :meth:`encode` (or :meth:`release`, which
    writes the ledger event first) on its vector and feeds the ``uint64`` result into the secure sum; the
    server calls :meth:`decode` on the sum. See the module docstring for the accounting and the modulus rule.

    Parameters
    ----------
    dim : int
        Length of the summed vector (FedDL gradient: ``n_y × m``).
    n_sites : int
        Sites in the secure sum.
    rotation_seed : str
        Public seed of the rotation signs, identical at every site and the server (e.g. the run id).
    epsilon, delta : float
        Target (ε, δ) over ``releases`` releases.
    releases : int
        Number of aggregations each record takes part in.
    l2_sensitivity : float
        ``adjacency="record"``: how far one record moves a site's (clipped) vector in L2.
    clip : float
        Public L2 bound every site's vector is clipped to (1-Lipschitz: it never increases the sensitivity).
    min_survivors : int, optional
        The secure sum's threshold ``t``: it never reveals a sum of fewer sites (default ``n_sites``).
    adjacency : {"record", "site"}
    granularity : float, optional
        ``γ``; default ``rounding_slack · Δ / √d'`` (rounding adds ``rounding_slack`` to the integer sensitivity).
    rounding_slack : float
    beta : float, optional
        Conditional rounding (site adjacency only; default ``exp(−0.5)`` there, 0 for records).
    wrap_probability : float
        Target bound on the probability that any coordinate of the sum wraps around (default 2^-40).
    max_bits : int
        Largest modulus the secure sum supports (SecAgg+: 64).

    Attributes
    ----------
    sigma2 : Fraction
        Each site's discrete Gaussian variance parameter, in integer units.
    modulus_bits : int
    wrap_probability_bound : float
    epsilon_accounted : float
    """

    mechanism = "distributed-discrete-gaussian"

    def _calibrate(self):
        d, n, t = self.padded_dim, self.n_sites, self.min_survivors

        def eps_of(s2):
            return ddg_epsilon(
                l2=self.l2_int,
                l1=self.l1_int,
                sigma2=s2,
                n_sites=n,
                min_survivors=t,
                dim=d,
                releases=self.releases,
                delta=self.delta,
            )

        s2 = self._bisect(eps_of, 1e-2, max(1.0, self.l2_int**2))
        # an exact rational a little above (more noise only helps): 2^-8 granularity
        self.sigma2 = Fraction(math.ceil(s2 * 256), 256)
        self.epsilon_accounted = eps_of(float(self.sigma2))
        if self.epsilon_accounted > self.epsilon_target * (1 + 1e-12):
            raise ConfigError(
                bad_value("epsilon", self.epsilon_target, "calibration failed to meet the target")
            )  # pragma: no cover

    def _noise_kw(self):
        return {"sigma2": float(self.sigma2)}

    def _noise(self, size, src=None):
        return discrete_gaussian(self.sigma2, size, src)

    def epsilon(self, releases: int | None = None) -> float:
        """ε after ``releases`` releases (default: the planned number), worst over the survivors ``k ≥ t``."""
        R = self.releases if releases is None else check_releases(releases)
        return ddg_epsilon(
            l2=self.l2_int,
            l1=self.l1_int,
            sigma2=float(self.sigma2),
            n_sites=self.n_sites,
            min_survivors=self.min_survivors,
            dim=self.padded_dim,
            releases=R,
            delta=self.delta,
        )

    def ledger_noise_multiplier(self) -> float:
        """``1/√(Δ₂²/(tσ²) + 2τd')`` — dominates KLS Prop. 14's first term for every ``α ≥ 1`` (worst survivors)."""
        worst = max(
            self.l2_int**2 / (k * float(self.sigma2)) + 2 * ddg_tau(float(self.sigma2), k) * self.padded_dim
            for k in range(self.min_survivors, self.n_sites + 1)
        )
        return 1.0 / math.sqrt(worst)

    def report(self) -> dict:
        """Every number of the plan (JSON-able): goes into the run's privacy report."""
        out = self._report_common()
        out.update(
            {
                "paper": "Kairouz, Liu & Steinke, ICML 2021 (Prop. 14 / Thm 1); sampler: Canonne, Kamath & Steinke 2020, Alg. 1-3",
                "sigma2_site_integer": str(self.sigma2),
                "tau": ddg_tau(float(self.sigma2), self.n_sites),
                "central_std": self.granularity * math.sqrt(self.min_survivors * float(self.sigma2)),
            }
        )
        return out


class DistributedSkellam(_DistributedInteger):
    """The distributed Skellam mechanism (Agarwal, Kairouz & Liu, NeurIPS 2021): every site adds ``Sk(λ, λ)``.

    Same parameters, encoder, decoder and modulus rule as :class:`DistributedDiscreteGaussian` (whose
    docstring lists them); the noise is ``Poisson(λ) − Poisson(λ)`` per coordinate (variance ``2λ``), and
    the sum over ``k`` sites is exactly ``Sk(kλ, kλ)``.

    Attributes
    ----------
    lam : float
        Each site's Poisson rate, in integer units.
    """

    mechanism = "distributed-skellam"

    def _calibrate(self):
        t = self.min_survivors

        def eps_of(lam):
            return skellam_epsilon(
                l2=self.l2_int, l1=self.l1_int, lam=lam, min_survivors=t, releases=self.releases, delta=self.delta
            )

        self.lam = float(self._bisect(eps_of, 1e-2, max(1.0, self.l2_int**2)))
        self.epsilon_accounted = eps_of(self.lam)

    def _noise_kw(self):
        return {"lam": self.lam}

    def _noise(self, size, src=None):
        return skellam(self.lam, size, src)

    def epsilon(self, releases: int | None = None) -> float:
        """ε after ``releases`` releases (default: the planned number) with ``t`` survivors (the worst case)."""
        R = self.releases if releases is None else check_releases(releases)
        return skellam_epsilon(
            l2=self.l2_int, l1=self.l1_int, lam=self.lam, min_survivors=self.min_survivors, releases=R, delta=self.delta
        )

    def ledger_noise_multiplier(self) -> float:
        """``√(μ/(Δ₂² + 3Δ₁))`` with ``μ = 2tλ``: dominates AKL's bound for every ``α ≥ 1``."""
        mu = 2.0 * self.lam * self.min_survivors
        return math.sqrt(mu / (self.l2_int**2 + 3 * self.l1_int))

    def report(self) -> dict:
        """Every number of the plan (JSON-able)."""
        out = self._report_common()
        out.update(
            {
                "paper": "Agarwal, Kairouz & Liu, NeurIPS 2021 (Skellam RDP bound)",
                "lambda_site_integer": self.lam,
                "central_std": self.granularity * math.sqrt(2 * self.lam * self.min_survivors),
                "poisson_sampler": "PTRS (Hörmann 1993) on os.urandom uniforms; double-precision acceptance test",
            }
        )
        return out


# ------------------------------------------------------------------------------ fitting to the ledger, claims


def fit_integer_mechanism(gp, kind: str, *, n_features: int, rotation_seed: str, weights):
    """The run's distributed discrete Gaussian or Skellam mechanism (:mod:`securefed.accounting.distributed`), built
    by the coordinator and by every site from the same public plan (deterministic, so both get the same numbers).

    Its input is a site's weighted gradient ``w_p ∇f_p`` (Qiao et al. Eq. 13; ``w_p`` the plan's normalised weight);
    record sensitivity ``max_p w_p Δ_p`` and clip ``max_p w_p ‖∇f_p‖`` bound (:meth:`GradientPerturbation.
    distributed_mechanism`); the rotation seed is the public run id; ``releases = S·Q``; ``t`` the plan's min survivors.

    The ε target is the plan's; if the ledger's dominating Gaussian (``ledger_noise_multiplier``: KLS Prop. 14 /
    AKL's bound, each dominated for every α) would exceed it over the planned releases, the target is lowered
    until it fits — more noise, never less — so that the write-ahead ledger never refuses a planned release.
    """
    from .events import history_of

    target = float(gp.epsilon_target)
    R = int(gp.releases_planned)
    eps = target
    for _ in range(40):
        mech = gp.distributed_mechanism(
            kind, n_features=int(n_features), rotation_seed=str(rotation_seed), weights=weights, epsilon=eps
        )
        led = float(gp.ledger.epsilon_of(history_of(mech.release_event(count=R))))  # the ledger's ε of the whole plan
        if led <= target * (1 - 1e-9):
            mech.ledger_epsilon = led
            mech.epsilon_plan_target = target
            return mech
        eps *= min(0.999, target * (1 - 1e-6) / led)
    raise ConfigError(
        bad_value(
            "epsilon",
            target,
            f"the {kind} mechanism's ledger bound does not fit this ε; raise it or use distributed-mechanism gaussian",
        )
    )  # pragma: no cover


def integer_claim(mech) -> dict:
    """What the coordinator tells the sites it computed (they check it against their own computation)."""
    noise = str(mech.sigma2) if hasattr(mech, "sigma2") else repr(float(mech.lam))
    return {
        "mechanism": mech.mechanism,
        "noise": noise,
        "modulus_bits": int(mech.modulus_bits),
        "granularity": float(mech.granularity),
        "padded_dim": int(mech.padded_dim),
        "clip": float(mech.clip),
    }


def noise_of(mech) -> float:
    return float(mech.sigma2) if hasattr(mech, "sigma2") else float(mech.lam)


def check_integer_claim(mech, claim) -> None:
    """Refuse (:class:`~securefed.errors.ProtocolError`) what the coordinator claims of the integer mechanism unless it
    is this party's own calibration: the same mechanism, per-site noise (σ² or λ) and modulus bits not below its own,
    the same granularity and padded dimension (the coordinator decodes with them)."""
    from fractions import Fraction

    from ..errors import ProtocolError

    if claim is None:
        raise ProtocolError("the DP plan names an integer mechanism but carries no claim of its parameters; refusing")
    if claim.get("mechanism") != mech.mechanism:
        raise ProtocolError(
            f"the server claims mechanism {claim.get('mechanism')!r}, the plan gives {mech.mechanism!r}; refusing"
        )
    if float(Fraction(str(claim["noise"]))) < noise_of(mech) * (1 - 1e-9):
        raise ProtocolError(
            f"the server asks for per-site noise {claim['noise']} but this site's own calibration of "
            f"{mech.mechanism} gives {noise_of(mech):.6g} (integer units); refusing"
        )
    if int(claim["modulus_bits"]) < mech.modulus_bits:
        raise ProtocolError(
            f"the server announces a modulus of 2^{claim['modulus_bits']} but this site's wrap-around "
            f"bound needs 2^{mech.modulus_bits}; refusing"
        )
    if (
        not np.isclose(float(claim["granularity"]), mech.granularity, rtol=1e-12)
        or int(claim["padded_dim"]) != mech.padded_dim
    ):
        raise ProtocolError(
            f"the server's granularity {claim['granularity']} / dimension {claim['padded_dim']} differ "
            f"from this site's {mech.granularity} / {mech.padded_dim}; refusing"
        )
