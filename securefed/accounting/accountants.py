"""Privacy accountants: exact μ-GDP, Opacus PRV / RDP, and the paper's Theorem 5 formula.

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
* ``"paper"`` — Qiao et al. Theorem 5's formula ``σ² = 8 R Δ² log(e + ε/δ)/ε²``, i.e.
  ``z² = 8 R log(e + ε/δ)/ε²``, solved for ε given z (:func:`paper_epsilon`). **The paper's formula is
  not a bound**: at large ε it is below the true ε of the composed Gaussian mechanism (z = 0.5, R = 1000,
  δ = 1e-5: the formula gives 762, the exact μ-GDP accountant 2269). The ``"paper"`` accountant therefore
  calibrates with the paper's recipe but *spends and reports* ``max(paper formula, exact μ-GDP ε)``
  (the exact figure at full participation, which upper-bounds any subsampled run, since Poisson
  subsampling never increases ε), so every ε it prints is a valid upper bound.

Every accountant takes the releases as events (:mod:`.events`): :meth:`Accountant.supports` says whether it can
account an event tree (``exact``: Gaussian noise at full participation; ``prv``: Gaussian noise, any Poisson rate;
``rdp``: every kind — the integer mechanisms through the Gaussian that dominates their Rényi divergence;
``paper``: Gaussian noise), :meth:`Accountant.compose` adds one to what it has composed, :meth:`Accountant.get_epsilon`
returns the ε of all of it (dp-accounting's ``supports`` / ``compose`` / ``get_epsilon``). Internally an event tree
is a *history*, a list of ``(noise_multiplier, sample_rate, count)`` triples (Opacus' format;
:func:`.events.history_of`), which :meth:`Accountant.epsilon_history` composes — so heterogeneous releases
(dropouts under distributed noise, data-perturbation rows, the billboard's releases) compose correctly.
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
    "gdp_estimate_noise_multiplier",
    "rdp_epsilon",
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
# the paper's formula (Theorem 5) — not a bound
# ----------------------------------------------------------------------------------------------


def paper_noise_multiplier(epsilon: float, delta: float, releases: int) -> float:
    """Qiao et al. Theorem 5: ``z = σ/Δ = √(8 R log(e + ε/δ)) / ε``."""
    epsilon, delta, releases = check_epsilon(epsilon), check_delta(delta), check_releases(releases)
    return math.sqrt(8.0 * releases * math.log(math.e + epsilon / delta)) / epsilon


def paper_epsilon(noise_multiplier: float, releases: int, delta: float) -> float:
    """The paper's formula (Qiao et al. Theorem 5) solved for ε: ``z² ε² = 8R log(e + ε/δ)``.

    This is what the paper *claims* for ``R`` Gaussian releases at ``z = σ/Δ``; it is **not** an upper
    bound on the true ε (e.g. ``z = 0.5, R = 1000, δ = 1e-5``: 762 against the exact 2269). Report it as
    "the paper's formula" next to an accountant's ε, never as a bound.
    """
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
    """Base: ``supports(event)``, ``compose(event)``, ``get_epsilon(δ)``; ``epsilon(z, R, δ, q)`` and
    ``epsilon_history(history, δ)`` for the numeric forms."""

    name = "?"
    #: noise kinds this accountant composes (:data:`.events.NOISE_KINDS`), and whether it takes Poisson sampling
    noise_kinds: tuple = ("gaussian",)
    subsampling = True

    def supports(self, event) -> bool:
        """True when every release of ``event`` (a :class:`~.events.ReleaseEvent` or a composition) has a noise kind
        and a sampling this accountant accounts soundly."""
        from .events import leaves

        return all(
            e.noise.kind in self.noise_kinds and (self.subsampling or e.sampling.rate == 1.0) for e in leaves(event)
        )

    def _refuse_unsupported(self, event) -> None:
        from .events import leaves

        for e in leaves(event):
            if e.noise.kind not in self.noise_kinds:
                raise ConfigError(
                    bad_value(
                        "accountant",
                        self.name,
                        f"does not account {e.noise.kind} noise "
                        f"({e.mechanism}); use "
                        + ("'rdp'" if e.noise.kind != "gaussian" else "'exact', 'prv' or 'rdp'"),
                    )
                )
            if not self.subsampling and e.sampling.rate != 1.0:
                raise ConfigError(
                    bad_value(
                        "sample_rate",
                        e.sampling.rate,
                        f"the {self.name} accountant covers full "
                        "participation only; use accountant='prv' or 'rdp' for subsampled steps",
                    )
                )

    def compose(self, event, count: int = 1) -> "Accountant":
        """Add ``count`` times ``event`` to what this accountant has composed (ConfigError if it does not
        :meth:`supports` it); returns the accountant."""
        from .events import ComposedEvent, history_of

        self._refuse_unsupported(event)
        composed = getattr(self, "_composed", None)
        if composed is None:
            composed = []
            self._composed: list = composed
        composed.extend([event] * int(count))
        self._composed_history = history_of(ComposedEvent(tuple(composed)))
        return self

    def get_epsilon(self, delta) -> float:
        """ε at ``delta`` of everything :meth:`compose` added."""
        return self.epsilon_history(getattr(self, "_composed_history", []), check_delta(delta))

    def epsilon_of_event(self, event, delta) -> float:
        """ε at ``delta`` of one event tree (ConfigError if not :meth:`supports`)."""
        from .events import history_of

        self._refuse_unsupported(event)
        return self.epsilon_history(history_of(event), check_delta(delta))

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
    subsampling = False

    @staticmethod
    def mu(history: History) -> float:
        """``μ = √(Σ count/z²)`` for a history of full-participation releases."""
        total = 0.0
        for z, q, c in history:
            if q != 1.0:
                raise ConfigError(
                    bad_value(
                        "sample_rate",
                        q,
                        "the exact accountant covers full participation only; "
                        "use accountant='prv' or 'rdp' for subsampled steps",
                    )
                )
            total += c / (z * z)
        return math.sqrt(total)

    def epsilon_history(self, history, delta):
        if not history:
            return 0.0
        return gdp_epsilon(check_delta(delta), self.mu(history))


_RDP_MAX_ORDER = 16384


def rdp_epsilon(history: History, delta: float) -> float:
    """ε of a Poisson-subsampled Gaussian history from Opacus' RDP analysis (Mironov 2017; Mironov,
    Talwar & Zhang 2019), over Opacus' default orders **extended upwards while the best order is the
    largest one tried** (up to 16384).

    Opacus' default orders stop at α = 63, and the RDP→(ε, δ) conversion then cannot go below
    ``≈ (log(1/δ) − log α)/(α − 1) ≈ 0.1`` at δ = 1e-5, whatever the noise: small targets (ε = 0.05)
    would look unreachable. Larger orders only ever lower the minimum (it is a minimum over orders).
    """
    from opacus.accountants.analysis import rdp as _rdp

    hist = [(float(z), float(q), int(c)) for z, q, c in history if c > 0]
    if not hist:
        return 0.0
    orders = [1 + x / 10.0 for x in range(1, 100)] + list(range(12, 64))
    rdp = sum(_rdp.compute_rdp(q=q, noise_multiplier=z, steps=c, orders=orders) for z, q, c in hist)
    eps, best = _rdp.get_privacy_spent(orders=orders, rdp=rdp, delta=delta)
    while best >= orders[-1] and orders[-1] < _RDP_MAX_ORDER:
        top = orders[-1]
        more: list[float] = [int(top * f) for f in (1.25, 1.5, 1.75, 2.0)]
        more_rdp = sum(_rdp.compute_rdp(q=q, noise_multiplier=z, steps=c, orders=more) for z, q, c in hist)
        orders = orders + more
        rdp = np.concatenate([np.atleast_1d(rdp), np.atleast_1d(more_rdp)])
        eps, best = _rdp.get_privacy_spent(orders=orders, rdp=rdp, delta=delta)
    return float(eps)


class OpacusAccountant(Accountant):
    """Opacus' ``PRVAccountant`` (Gopi et al. 2021) or RDP analysis (:func:`rdp_epsilon`) over a history
    (Poisson-subsampled Gaussian, add/remove adjacency). PRV's figure is its upper estimate; where it is
    larger than RDP's (or fails), RDP's — also a valid upper bound — is used."""

    # ε of a history is a deterministic function of (accountant, eps_error, history, δ): one cache for all
    # instances (every ledger and calibration builds its own accountant)
    _cache: dict = {}

    def __init__(self, name: str, eps_error: float = 0.01):
        if name not in ("prv", "rdp"):
            raise ConfigError(bad_value("accountant", name, "use 'prv' or 'rdp'"))
        self.name = name
        # RDP composes the integer mechanisms through the Gaussian that dominates their Rényi divergence at every
        # order (KLS 2021 Prop. 14, AKL 2021); PRV is tight for Gaussian noise only and would not bound them
        self.noise_kinds = ("gaussian", "discrete-gaussian", "skellam") if name == "rdp" else ("gaussian",)
        self.eps_error = eps_error

    def epsilon_history(self, history, delta):
        hist = [(float(z), float(q), int(c)) for z, q, c in history if c > 0]
        if not hist:
            return 0.0
        key = (self.name, float(self.eps_error), tuple(sorted(hist)), float(delta))
        if key in self._cache:
            return self._cache[key]
        from opacus.accountants import PRVAccountant

        with warnings.catch_warnings(), np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            warnings.simplefilter("ignore")
            eps = rdp_epsilon(hist, delta)
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
    """Qiao et al. Theorem 5's formula, floored by the exact accountant so that it is a valid bound.

    ``ε = max(paper formula, exact μ-GDP ε at full participation)``. The paper's formula
    (``σ² = 8 R Δ² log(e + ε/δ)/ε²``; smallest noise multiplier and total count of a heterogeneous history)
    is not an upper bound at large ε (module docstring); the exact μ-GDP ε of the same releases treated as
    full-participation releases is one (Poisson subsampling never increases ε), so the maximum is a valid
    upper bound that equals the paper's figure wherever the paper's figure is itself valid.
    """

    name = "paper"

    def epsilon_history(self, history, delta):
        hist = [(float(z), float(q), int(c)) for z, q, c in history if c > 0]
        if not hist:
            return 0.0
        z = min(h[0] for h in hist)
        R = sum(h[2] for h in hist)
        exact = ExactGDPAccountant().epsilon_history([(zz, 1.0, c) for zz, _, c in hist], delta)
        return max(paper_epsilon(z, R, delta), exact)


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


_Z_MAX = 1e7  # beyond this no finite target is missed by the accountants here; a safe, sane cap


def gdp_estimate_noise_multiplier(epsilon, delta, releases, sample_rate=1.0) -> float:
    """A starting point for calibration: the exact μ-GDP noise multiplier at full participation
    (``z = √R/μ(ε, δ)``), or under Poisson subsampling the CLT estimate of Dong, Roth & Su (2022, Thm 3.5 /
    Cor. 5.4): ``μ ≈ q √(R (e^{1/z²} − 1))``, i.e. ``z = 1/√(log(1 + μ²/(q² R)))``. Only a bracket start."""
    epsilon, delta, R, q = (
        check_epsilon(epsilon),
        check_delta(delta),
        check_releases(releases),
        check_sample_rate(sample_rate),
    )
    mu = gdp_mu(epsilon, delta)
    if not math.isfinite(mu):
        return 0.1
    if q == 1.0:
        return math.sqrt(R) / mu
    return 1.0 / math.sqrt(math.log1p(mu * mu / (q * q * R)))


def calibrate_noise_multiplier(epsilon, delta, releases, accountant="exact", sample_rate=1.0, *, rtol=1e-3) -> float:
    """Smallest noise multiplier ``z = σ/Δ`` (to a relative ``rtol``) whose ε after ``releases`` releases is ≤ ``epsilon``.

    ``exact``: ``z = √R / μ(ε, δ)`` in closed form (plus a numerical inversion of δ(ε); Dong, Roth & Su
    2022, Cor. 2.13 and 3.3).
    ``paper``: the paper's recipe ``z = √(8 R log(e + ε/δ))/ε`` (Qiao et al. Theorem 5), raised to the
    exact μ-GDP ``z`` where the recipe's ε is not a valid bound (see :class:`PaperAccountant`).
    ``prv`` / ``rdp``: bracket ``z`` by doubling from the μ-GDP estimate (:func:`gdp_estimate_noise_multiplier`;
    for PRV from the RDP-calibrated ``z``, which PRV's ε — never above RDP's here — also meets) until the
    accountant's ε is ≤ the target (halving for the lower end), then bisect in ``log z`` until
    ``z_hi/z_lo ≤ 1 + rtol``. The returned ``z`` is always on the safe side: ``accountant ε(z) ≤ epsilon``.
    For PRV (an upper estimate with absolute error ``eps_error = 0.01``) and RDP (a convex bound in the
    order) the returned ε is within ``max(2 %, 0.011)`` of the target (tested on a grid ε ∈ [0.05, 20],
    R ∈ [1, 1000], q ∈ {0.01, 0.1, 1}).

    Raises
    ------
    ConfigError
        naming ``epsilon`` when even ``z = 10^7`` does not reach the target.
    """
    epsilon, delta, R = check_epsilon(epsilon), check_delta(delta), check_releases(releases)
    q = check_sample_rate(sample_rate)
    acc = get_accountant(accountant)
    if acc.name == "exact":
        if q != 1.0:
            raise ConfigError(
                bad_value("sample_rate", q, "the exact accountant covers full participation only; use 'prv' or 'rdp'")
            )
        z = math.sqrt(R) / gdp_mu(epsilon, delta)
        while acc.epsilon(z, R, delta) > epsilon:
            z *= 1 + 1e-12
        return z
    if acc.name == "paper":
        z = max(paper_noise_multiplier(epsilon, delta, R), calibrate_noise_multiplier(epsilon, delta, R, "exact"))
        while acc.epsilon(z, R, delta, q) > epsilon:
            z *= 1 + 1e-12
        return z

    def eps_at(z):
        return acc.epsilon(z, R, delta, q)

    if acc.name == "prv":
        hi = calibrate_noise_multiplier(epsilon, delta, R, "rdp", q, rtol=rtol)
    else:
        hi = max(gdp_estimate_noise_multiplier(epsilon, delta, R, q), 1e-2)
    while eps_at(hi) > epsilon:
        hi *= 2.0
        if hi > _Z_MAX:
            raise ConfigError(
                bad_value(
                    "epsilon",
                    epsilon,
                    f"is unreachable: even noise multiplier {_Z_MAX:g} gives "
                    f"ε = {eps_at(_Z_MAX):.3g} with {R} releases at sample rate {q}, δ = {delta:g}; "
                    "raise epsilon or delta, or lower the number of releases",
                )
            )
    lo = hi
    step = 1.25 if acc.name == "prv" else 2.0  # PRV starts from RDP's z, which is close
    while eps_at(lo) <= epsilon:
        hi = lo
        lo = lo / step
        if lo < 1e-2:  # any target this large is met by a tiny z; no need to go lower (and accountants misbehave)
            return hi
    while hi / lo > 1.0 + rtol:
        mid = math.sqrt(lo * hi)
        if eps_at(mid) <= epsilon:
            hi = mid
        else:
            lo = mid
    return hi
