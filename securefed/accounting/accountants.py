"""Privacy accountants: exact μ-GDP, Opacus PRV / RDP, and the paper's Theorem 5 bound.

* ``"exact"`` — a Gaussian mechanism with sensitivity Δ and noise σ is exactly μ-GDP with μ = Δ/σ
  (Dong, Roth & Su 2019/2022, Thm 2.7 / Cor. 2.13); composing releases with μ_i gives exactly
  ``μ = √(Σ μ_i²)``, so ``R`` full-participation releases at noise multiplier ``z = σ/Δ`` are exactly
  ``√R / z``-GDP. μ-GDP is equivalent to (ε, δ(ε))-DP for all ε with
  ``δ(ε) = Φ(−ε/μ + μ/2) − e^ε Φ(−ε/μ − μ/2)`` (the analytic Gaussian mechanism of Balle & Wang 2018,
  Thm 8, with μ = Δ/σ); securefed inverts it numerically for ε. This is not a bound: it is the
  tight privacy profile of the composed Gaussian mechanism (it equals Google dp-accounting's PLD
  result up to PLD discretisation). Only for ``sample_rate = 1``.
* ``"prv"`` / ``"rdp"`` — Opacus' ``PRVAccountant`` (Gopi et al. 2021) and ``RDPAccountant``
  (Mironov 2017; Poisson-subsampled Gaussian) for subsampled steps with ``sample_rate`` q; both use
  add/remove adjacency.
* ``"paper"`` — ``papers/000`` Theorem 5: ``σ² = 8 R Δ² log(e + ε/δ)/ε²``, i.e.
  ``z² = 8 R log(e + ε/δ)/ε²``, solved for ε given z. It ignores subsampling (conservative).

A *history* is a list of ``(noise_multiplier, sample_rate, count)`` triples (Opacus' format); every
accountant takes one through :meth:`Accountant.epsilon_history`, so heterogeneous releases (dropouts
under distributed noise, data-perturbation rows) compose correctly.
"""

from __future__ import annotations

import math
import warnings
from typing import Iterable, Sequence

import numpy as np
from scipy.optimize import brentq
from scipy.special import log_ndtr, ndtr

from ..errors import ConfigError, bad_value

__all__ = [
    "ACCOUNTANTS",
    "Accountant",
    "ExactGDPAccountant",
    "OpacusAccountant",
    "PaperAccountant",
    "get_accountant",
    "gdp_delta",
    "gdp_epsilon",
    "gdp_mu",
    "compose_gdp",
    "calibrate_noise_multiplier",
    "epsilon_from_noise",
    "paper_noise_multiplier",
    "paper_epsilon",
    "check_epsilon",
    "check_delta",
    "check_releases",
    "check_sample_rate",
    "check_noise_multiplier",
]

ACCOUNTANTS = ("exact", "prv", "rdp", "paper")


# ----------------------------------------------------------------------------------------------
# validation
# ----------------------------------------------------------------------------------------------


def _num(name, v, fix):
    if isinstance(v, bool):
        raise ConfigError(bad_value(name, v, fix))
    try:
        return float(v)
    except (TypeError, ValueError):
        raise ConfigError(bad_value(name, v, fix)) from None


def check_epsilon(epsilon) -> float:
    """ε must be a positive finite number."""
    e = _num("epsilon", epsilon, "use a positive number, e.g. 1.0")
    if not math.isfinite(e) or e <= 0:
        raise ConfigError(bad_value("epsilon", epsilon, "use a positive number, e.g. 1.0"))
    return e


def check_delta(delta) -> float:
    """δ must lie in the open interval (0, 1)."""
    d = _num("delta", delta, "use a number in (0, 1), e.g. 1e-5 (well below 1/n)")
    if not (0.0 < d < 1.0):
        raise ConfigError(bad_value("delta", delta, "use a number in (0, 1), e.g. 1e-5 (well below 1/n)"))
    return d


def check_releases(releases) -> int:
    """The number of releases must be a positive integer."""
    if isinstance(releases, bool) or not isinstance(releases, (int, np.integer)) or releases < 1:
        raise ConfigError(bad_value("releases", releases, "use a positive integer (rounds × local steps)"))
    return int(releases)


def check_sample_rate(q) -> float:
    """The Poisson sampling rate must lie in (0, 1]."""
    f = _num("sample_rate", q, "use a number in (0, 1]; 1.0 = every record in every step")
    if not (0.0 < f <= 1.0):
        raise ConfigError(bad_value("sample_rate", q, "use a number in (0, 1]; 1.0 = every record in every step"))
    return f


def check_noise_multiplier(z) -> float:
    """The noise multiplier σ/Δ must be positive and finite."""
    f = _num("noise_multiplier", z, "use a positive number σ/Δ, e.g. 1.0")
    if not math.isfinite(f) or f <= 0:
        raise ConfigError(bad_value("noise_multiplier", z, "use a positive number σ/Δ, e.g. 1.0"))
    return f


# ----------------------------------------------------------------------------------------------
# μ-GDP closed forms
# ----------------------------------------------------------------------------------------------


def gdp_delta(epsilon: float, mu: float) -> float:
    """``δ(ε) = Φ(−ε/μ + μ/2) − e^ε Φ(−ε/μ − μ/2)`` of a μ-GDP mechanism (Dong–Roth–Su Cor. 2.13).

    The second term is evaluated in log space so large ε does not overflow.
    """
    if mu <= 0:
        return 0.0
    a = -epsilon / mu + mu / 2.0
    b = -epsilon / mu - mu / 2.0
    first = float(ndtr(a))
    second = math.exp(min(epsilon + float(log_ndtr(b)), 700.0))
    return max(first - second, 0.0)


def gdp_epsilon(delta: float, mu: float) -> float:
    """Smallest ε ≥ 0 with ``δ(ε) ≤ δ`` for a μ-GDP mechanism (inverts :func:`gdp_delta`)."""
    delta = check_delta(delta)
    if mu <= 0 or gdp_delta(0.0, mu) <= delta:
        return 0.0
    hi = max(1.0, mu * mu / 2.0 + mu * math.sqrt(2.0 * math.log(1.0 / delta)) + 1.0)
    while gdp_delta(hi, mu) > delta:
        hi *= 2.0
        if hi > 1e8:
            return math.inf
    eps = brentq(lambda e: gdp_delta(e, mu) - delta, 0.0, hi, xtol=1e-12, rtol=1e-13, maxiter=500)
    # return the side of the root that satisfies δ(ε) ≤ δ
    while gdp_delta(eps, mu) > delta:
        eps = eps * (1 + 1e-12) + 1e-15
    return float(eps)


def gdp_mu(epsilon: float, delta: float) -> float:
    """Largest μ whose μ-GDP profile satisfies ``δ(ε) ≤ δ`` (δ(ε) increases with μ)."""
    epsilon = check_epsilon(epsilon)
    delta = check_delta(delta)
    lo, hi = 1e-8, 1.0
    while gdp_delta(epsilon, hi) < delta:
        hi *= 2.0
        if hi > 1e6:
            return math.inf
    mu = brentq(lambda m: gdp_delta(epsilon, m) - delta, lo, hi, xtol=1e-14, rtol=1e-13, maxiter=500)
    while gdp_delta(epsilon, mu) > delta:
        mu *= 1 - 1e-12
    return float(mu)


def compose_gdp(mus: Iterable[float]) -> float:
    """Composition of Gaussian releases in μ-GDP: ``μ = √(Σ μ_i²)`` (exact; Dong–Roth–Su Cor. 3.3)."""
    return math.sqrt(sum(float(m) ** 2 for m in mus))


# ----------------------------------------------------------------------------------------------
# the paper's bound (Theorem 5)
# ----------------------------------------------------------------------------------------------


def paper_noise_multiplier(epsilon: float, delta: float, releases: int) -> float:
    """``papers/000`` Theorem 5: ``z = σ/Δ = √(8 R log(e + ε/δ)) / ε``."""
    epsilon, delta, releases = check_epsilon(epsilon), check_delta(delta), check_releases(releases)
    return math.sqrt(8.0 * releases * math.log(math.e + epsilon / delta)) / epsilon


def paper_epsilon(noise_multiplier: float, releases: int, delta: float) -> float:
    """ε for which Theorem 5 of ``papers/000`` holds at the given σ/Δ: solve ``z² ε² = 8R log(e + ε/δ)``."""
    z, R, delta = check_noise_multiplier(noise_multiplier), check_releases(releases), check_delta(delta)

    def g(e):
        return 8.0 * R * math.log(math.e + e / delta) - (z * e) ** 2

    hi = 1.0
    while g(hi) > 0:
        hi *= 2.0
        if hi > 1e12:
            return math.inf
    lo = 1e-300
    return float(brentq(g, lo, hi, xtol=1e-14, rtol=1e-13, maxiter=500))


# ----------------------------------------------------------------------------------------------
# accountants
# ----------------------------------------------------------------------------------------------


History = Sequence[tuple[float, float, int]]


class Accountant:
    """Base: ``epsilon(z, R, δ, q)`` and ``epsilon_history(history, δ)``."""

    name = "?"

    def epsilon(self, noise_multiplier, releases, delta, sample_rate=1.0) -> float:
        """ε after ``releases`` Gaussian releases at noise multiplier ``z = σ/Δ`` and rate ``q``."""
        z = check_noise_multiplier(noise_multiplier)
        R = check_releases(releases)
        q = check_sample_rate(sample_rate)
        return self.epsilon_history([(z, q, R)], check_delta(delta))

    def epsilon_history(self, history: History, delta: float) -> float:  # pragma: no cover - abstract
        raise TypeError("use a concrete accountant")


class ExactGDPAccountant(Accountant):
    """Exact accounting of full-participation Gaussian releases via μ-GDP (see module docstring)."""

    name = "exact"

    @staticmethod
    def mu(history: History) -> float:
        """``μ = √(Σ count/z²)`` for a history of full-participation releases."""
        total = 0.0
        for z, q, c in history:
            if q != 1.0:
                raise ConfigError(bad_value("sample_rate", q, "the exact accountant covers full participation only; "
                                            "use accountant='prv' or 'rdp' for subsampled steps"))
            total += c / (z * z)
        return math.sqrt(total)

    def epsilon_history(self, history, delta):
        if not history:
            return 0.0
        return gdp_epsilon(check_delta(delta), self.mu(history))


class OpacusAccountant(Accountant):
    """Opacus' ``PRVAccountant`` or ``RDPAccountant`` over a history (Poisson-subsampled Gaussian)."""

    def __init__(self, name: str, eps_error: float = 0.01):
        if name not in ("prv", "rdp"):
            raise ConfigError(bad_value("accountant", name, "use 'prv' or 'rdp'"))
        self.name = name
        self.eps_error = eps_error
        self._cache: dict = {}

    def epsilon_history(self, history, delta):
        hist = [(float(z), float(q), int(c)) for z, q, c in history if c > 0]
        if not hist:
            return 0.0
        key = (tuple(sorted(hist)), float(delta))
        if key in self._cache:
            return self._cache[key]
        from opacus.accountants import PRVAccountant, RDPAccountant

        with warnings.catch_warnings(), np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            warnings.simplefilter("ignore")
            rdp = RDPAccountant()
            rdp.history = list(hist)
            eps = float(rdp.get_epsilon(delta=delta))
            # PRV's grid grows with ε; far above any useful ε (> 50) its memory use explodes, and
            # the RDP figure (a valid upper bound) is used instead.
            if self.name == "prv" and eps <= 50.0:
                prv = PRVAccountant()
                prv.history = list(hist)
                try:
                    prv_eps = float(prv.get_epsilon(delta=delta, eps_error=self.eps_error))
                except (MemoryError, ValueError, FloatingPointError):
                    prv_eps = math.inf  # PRV's grid failed: keep the RDP upper bound
                eps = min(eps, prv_eps)
        eps = max(eps, 0.0)
        if len(self._cache) > 4096:
            self._cache.clear()
        self._cache[key] = eps
        return eps


class PaperAccountant(Accountant):
    """``papers/000`` Theorem 5 (``σ² = 8 R Δ² log(e + ε/δ)/ε²``), ignoring subsampling.

    For a heterogeneous history the smallest noise multiplier and the total count are used (the
    theorem is stated for equal noise; this is its conservative extension).
    """

    name = "paper"

    def epsilon_history(self, history, delta):
        hist = [(float(z), float(q), int(c)) for z, q, c in history if c > 0]
        if not hist:
            return 0.0
        z = min(h[0] for h in hist)
        R = sum(h[2] for h in hist)
        return paper_epsilon(z, R, delta)


def get_accountant(name: str) -> Accountant:
    """Build an accountant by name: ``"exact"``, ``"prv"``, ``"rdp"`` or ``"paper"``."""
    if isinstance(name, Accountant):
        return name
    if name == "exact":
        return ExactGDPAccountant()
    if name in ("prv", "rdp"):
        return OpacusAccountant(name)
    if name == "paper":
        return PaperAccountant()
    raise ConfigError(bad_value("accountant", name, f"use one of {', '.join(ACCOUNTANTS)}"))


def epsilon_from_noise(noise_multiplier, releases, delta, accountant="exact", sample_rate=1.0) -> float:
    """ε spent by ``releases`` Gaussian releases at ``z = σ/Δ`` (and sampling rate ``q``)."""
    return get_accountant(accountant).epsilon(noise_multiplier, releases, delta, sample_rate)


def calibrate_noise_multiplier(epsilon, delta, releases, accountant="exact", sample_rate=1.0) -> float:
    """Smallest noise multiplier ``z = σ/Δ`` whose ε after ``releases`` releases is ≤ ``epsilon``.

    ``exact``: ``z = √R / μ(ε, δ)`` in closed form (plus a numerical inversion of δ(ε)).
    ``paper``: ``z = √(8 R log(e + ε/δ))/ε`` (Theorem 5 of ``papers/000``).
    ``prv`` / ``rdp``: bisection in ``log z`` on Opacus' ε (ε decreases with z); the returned z is on
    the safe side (its ε is ≤ the target).
    """
    epsilon, delta, R = check_epsilon(epsilon), check_delta(delta), check_releases(releases)
    q = check_sample_rate(sample_rate)
    acc = get_accountant(accountant)
    if acc.name == "exact":
        if q != 1.0:
            raise ConfigError(bad_value("sample_rate", q, "the exact accountant covers full participation only; use 'prv' or 'rdp'"))
        z = math.sqrt(R) / gdp_mu(epsilon, delta)
        while acc.epsilon(z, R, delta) > epsilon:
            z *= 1 + 1e-12
        return z
    if acc.name == "paper":
        return paper_noise_multiplier(epsilon, delta, R)

    def f(logz):
        return acc.epsilon(math.exp(logz), R, delta, q) - epsilon

    if acc.name == "prv":
        # RDP upper-bounds the true ε, so the RDP-calibrated z is feasible for PRV: a safe upper bracket
        hi_z = calibrate_noise_multiplier(epsilon, delta, R, "rdp", q)
        lo, hi = math.log(hi_z) - math.log(1.25), math.log(hi_z)
    else:
        lo, hi = math.log(0.05), math.log(2.0)
    while f(hi) > 0:
        lo, hi = hi, hi + math.log(4.0)
        if hi > math.log(1e6):
            raise ConfigError(bad_value("epsilon", epsilon, "is unreachable with a finite noise multiplier; raise epsilon or lower releases"))
    while f(lo) <= 0:
        hi, lo = lo, lo - math.log(4.0)
        if lo < math.log(1e-6):
            return math.exp(hi)
    root = brentq(f, lo, hi, xtol=1e-5, maxiter=200)
    z = math.exp(root)
    while acc.epsilon(z, R, delta, q) > epsilon:
        z *= 1.0005
    return z
