"""Integer noise from the operating system's CSPRNG: exact discrete Gaussian, Skellam, randomized rounding.

Randomness
----------
Every random bit comes from ``os.urandom`` (read in 64 KiB blocks and consumed as 64-bit words,
:class:`UrandomSource`). No numpy PRNG, no seed: nothing here can be reproduced, by design (these samplers
release DP noise). Statistical tests therefore use thresholds with a fixed failure probability.

Discrete Gaussian — exact
-------------------------
:func:`discrete_gaussian` implements Canonne, Kamath & Steinke, "The Discrete Gaussian for Differential
Privacy" (NeurIPS 2020), Algorithm 1 (``Bernoulli(exp(−γ))`` for rational γ), Algorithm 2 (discrete
Laplace) and Algorithm 3 (discrete Gaussian by rejection from the discrete Laplace with ``t = ⌊σ⌋ + 1``),
in exact integer/rational arithmetic: ``σ²`` is a :class:`fractions.Fraction`, every Bernoulli trial
compares a uniform integer from :class:`UrandomSource` with an integer threshold. The output follows
``P[X = x] ∝ exp(−x²/(2σ²))`` on ℤ exactly (no floating point anywhere).

Skellam — float-assisted Poisson
--------------------------------
:func:`skellam` returns ``Poisson(λ) − Poisson(λ)`` (variance ``2λ``; Agarwal, Kairouz & Liu 2021). The
Poisson sampler is Hörmann's PTRS transformed rejection (1993) for ``λ ≥ 10`` and Knuth's product method
below, driven by 53-bit uniforms from ``os.urandom``. Its acceptance tests are in double precision, so
the pmf is exact only up to rounding of the log-density (relative error ≈ 1e-16·λ·log λ): stated, not
hidden. Unlike floating-point Laplace/Gaussian noise (Mironov 2012), the output is an integer added to an
integer, so the set of possible outputs does not depend on the input.

Randomized rounding — exact
---------------------------
:func:`randomized_round` rounds each coordinate ``x`` to ``⌊x⌋ + Bernoulli(x − ⌊x⌋)`` with the Bernoulli
decided exactly (the fractional part of a double is a dyadic rational: it is compared bit by bit with
fresh random bits).
"""

from __future__ import annotations

import math
import os
from fractions import Fraction

import numpy as np

from ..errors import ConfigError, bad_value

__all__ = [
    "UrandomSource",
    "SeededWordSource",
    "bernoulli_exp",
    "discrete_laplace",
    "discrete_gaussian",
    "discrete_gaussian_pmf",
    "poisson",
    "skellam",
    "randomized_round",
    "uniform53",
    "as_fraction",
]

_BLOCK = 1 << 16  # bytes per os.urandom call


class UrandomSource:
    """Uniform integers from ``os.urandom``, buffered (one system call per 64 KiB).

    Only :meth:`randbelow` and :meth:`bits64` are used by the samplers; both consume whole 64-bit words.
    """

    def __init__(self):
        self._words: list[int] = []

    def _refill(self) -> None:
        self._words = np.frombuffer(os.urandom(_BLOCK), dtype="<u8").tolist()

    def bits64(self) -> int:
        """One uniform integer in ``[0, 2^64)``."""
        if not self._words:
            self._refill()
        return self._words.pop()

    def randbelow(self, n: int) -> int:
        """A uniform integer in ``[0, n)`` (rejection sampling on ``n.bit_length()`` bits; exact)."""
        if n <= 0:
            raise ConfigError(bad_value("n", n, "randbelow needs a positive bound"))
        k = n.bit_length()
        if k <= 64:
            shift = 64 - k
            while True:
                r = self.bits64() >> shift
                if r < n:
                    return r
        while True:
            r = 0
            for _ in range((k + 63) // 64):
                r = (r << 64) | self.bits64()
            r >>= (-k) % 64
            if r < n:
                return r

    def words(self, count: int) -> np.ndarray:
        """``count`` uniform 64-bit words as a ``uint64`` array (straight from ``os.urandom``)."""
        return np.frombuffer(os.urandom(8 * int(count)), dtype="<u8").copy()


_SOURCE = UrandomSource()


class SeededWordSource(UrandomSource):
    """TESTING ONLY: the same interface as :class:`UrandomSource`, its words from a seeded PCG64 Generator.

    Anyone who knows the seed reproduces every "random" bit, so noise drawn from it protects nothing; the
    federation uses it only behind the plan option ``noise-seed-for-testing`` (the run's ε is then reported
    void and every ledger event says ``noise_source: "seeded-testing"``).
    """

    def __init__(self, seed: int, key=()):
        super().__init__()
        self._gen = np.random.Generator(np.random.PCG64([int(seed), *[int(k) for k in key]]))

    def _refill(self) -> None:
        self._words = self._gen.integers(0, 2**64, size=_BLOCK // 8, dtype=np.uint64).tolist()

    def words(self, count: int) -> np.ndarray:
        return self._gen.integers(0, 2**64, size=int(count), dtype=np.uint64)


def as_fraction(value, name: str = "sigma2") -> Fraction:
    """A positive rational from an int, a Fraction, a decimal string or a float (a float is taken exactly)."""
    try:
        f = Fraction(value)
    except (TypeError, ValueError):
        raise ConfigError(bad_value(name, value, "give a positive rational, e.g. Fraction(9, 4) or 2.25")) from None
    if f <= 0:
        raise ConfigError(bad_value(name, value, "give a positive rational, e.g. Fraction(9, 4) or 2.25"))
    return f


# ---------------------------------------------------------------------------------------------- CKS 2020


def _bernoulli(num: int, den: int, src: UrandomSource) -> bool:
    """Bernoulli(num/den) exactly (``0 ≤ num ≤ den``)."""
    return src.randbelow(den) < num


def _bernoulli_exp_le1(num: int, den: int, src: UrandomSource) -> bool:
    """CKS Algorithm 1, γ = num/den ∈ [0, 1]: K ← 1; while Bernoulli(γ/K): K ← K + 1; return K odd."""
    k = 1
    while _bernoulli(num, den * k, src):
        k += 1
    return k % 2 == 1


def bernoulli_exp(num: int, den: int, src: UrandomSource | None = None) -> bool:
    """Bernoulli(exp(−num/den)) exactly, for integers ``num ≥ 0, den > 0`` (CKS 2020, Algorithm 1)."""
    src = _SOURCE if src is None else src
    while num > den:  # γ > 1: ⌊γ⌋ trials of Bernoulli(e^{-1}), then the fractional part
        if not _bernoulli_exp_le1(1, 1, src):
            return False
        num -= den
    return _bernoulli_exp_le1(num, den, src)


def discrete_laplace(t: int, src: UrandomSource | None = None) -> int:
    """``P[Y = y] ∝ exp(−|y|/t)`` on ℤ for a positive integer ``t`` (CKS 2020, Algorithm 2 with s = 1)."""
    src = _SOURCE if src is None else src
    while True:
        u = src.randbelow(t)
        if not bernoulli_exp(u, t, src):
            continue
        v = 0
        while bernoulli_exp(1, 1, src):
            v += 1
        y = u + t * v
        negative = _bernoulli(1, 2, src)
        if negative and y == 0:
            continue
        return -y if negative else y


def _isqrt_floor_fraction(f: Fraction) -> int:
    """``⌊√f⌋`` for a non-negative rational, exactly."""
    return math.isqrt(f.numerator * f.denominator) // f.denominator


def discrete_gaussian(sigma2, size: int = 1, src: UrandomSource | None = None) -> np.ndarray:
    """``size`` draws of the discrete Gaussian ``N_Z(0, σ²)``: ``P[X = x] ∝ exp(−x²/(2σ²))``, ``x ∈ ℤ``.

    Exact (CKS 2020, Algorithm 3): ``t = ⌊σ⌋ + 1``; draw ``Y`` from the discrete Laplace with scale ``t``
    (Algorithm 2); accept with probability ``exp(−(|Y| − σ²/t)²/(2σ²))`` — for ``σ² = n/d`` the rational
    exponent ``(|Y|·d·t − n)² / (2·n·d·t²)`` — each ``Bernoulli(exp(−γ))`` by Algorithm 1. This is the
    same algorithm as :func:`discrete_laplace` / :func:`bernoulli_exp`, inlined for speed (≈ 15 µs a draw).

    Parameters
    ----------
    sigma2 : Fraction, int, str or float
        The variance parameter ``σ²`` (a float is converted exactly).
    size : int
    src : UrandomSource, optional

    Returns
    -------
    ndarray of int64
    """
    src = _SOURCE if src is None else src
    s2 = as_fraction(sigma2)
    n, d = s2.numerator, s2.denominator
    t = _isqrt_floor_fraction(s2) + 1
    den = 2 * n * d * t * t
    dt = d * t
    words = src._words
    bits64 = src.bits64
    big_randbelow = src.randbelow
    t_shift = 64 - t.bit_length()
    small_t = t.bit_length() <= 64

    def rb(m):  # uniform in [0, m), exact
        k = m.bit_length()
        if k > 64:
            return big_randbelow(m)
        sh = 64 - k
        while True:
            r = (words.pop() if words else bits64()) >> sh
            if r < m:
                return r

    def bern_exp_le1(num, dd):  # Algorithm 1, γ = num/dd ≤ 1
        k = 1
        while rb(dd * k) < num:
            k += 1
        return k & 1

    def bern_exp_minus1():  # Algorithm 1 with γ = 1 (its first trial, Bernoulli(1), always succeeds)
        k = 2
        while rb(k) == 0:
            k += 1
        return k & 1

    def bern_exp(num, dd):  # Algorithm 1, any γ = num/dd ≥ 0
        while num > dd:
            if not bern_exp_minus1():
                return 0
            num -= dd
        return bern_exp_le1(num, dd)

    out = np.empty(int(size), dtype=np.int64)
    for i in range(int(size)):
        while True:
            # ---- Algorithm 2: discrete Laplace, scale t
            while True:
                if small_t:
                    while True:
                        u = (words.pop() if words else bits64()) >> t_shift
                        if u < t:
                            break
                else:
                    u = rb(t)
                if not bern_exp_le1(u, t):
                    continue
                v = 0
                while bern_exp_minus1():  # V ← number of successes of Bernoulli(e^{-1})
                    v += 1
                y = u + t * v
                neg = (words.pop() if words else bits64()) >> 63
                if neg and y == 0:
                    continue
                break
            # ---- Algorithm 3: accept with probability exp(−(|Y| − σ²/t)²/(2σ²))
            a = y * dt - n
            if bern_exp(a * a, den):
                out[i] = -y if neg else y
                break
    return out


def discrete_gaussian_pmf(sigma2, support: np.ndarray) -> np.ndarray:
    """The exact pmf of ``N_Z(0, σ²)`` on ``support`` (normalised over ``|x| ≤ 40σ + 40``; float64)."""
    s2 = float(as_fraction(sigma2))
    half = int(40 * math.sqrt(s2) + 40)
    xs = np.arange(-half, half + 1, dtype=float)
    w = np.exp(-xs * xs / (2 * s2))
    z = w.sum()
    sup = np.asarray(support, dtype=float)
    return np.exp(-sup * sup / (2 * s2)) / z


# ---------------------------------------------------------------------------------------------- uniforms


def uniform53(size: int, src: UrandomSource | None = None) -> np.ndarray:
    """Uniform doubles ``k·2⁻⁵³`` in ``[0, 1)`` from ``os.urandom`` (53 random bits each)."""
    src = _SOURCE if src is None else src
    w = src.words(size) >> np.uint64(11)
    return w.astype(np.float64) * 2.0**-53


def randomized_round(x, src: UrandomSource | None = None) -> np.ndarray:
    """Round each coordinate to ``⌊x⌋ + Bernoulli(x − ⌊x⌋)`` exactly (unbiased; ``|R(x) − x| < 1``).

    The fractional part ``f`` of a double is an exact dyadic rational; ``Bernoulli(f)`` is decided by
    comparing a uniform 64-bit integer ``U`` with ``⌊f·2⁶⁴⌋`` and, on a tie (probability 2⁻⁶⁴), with further
    bits of ``f`` against fresh random bits (exactly, in Python integers).
    """
    src = _SOURCE if src is None else src
    x = np.asarray(x, dtype=np.float64)
    if not np.all(np.isfinite(x)) or (x.size and np.max(np.abs(x)) >= 2.0**52):
        raise ConfigError(
            bad_value(
                "x",
                "non-finite or |x| ≥ 2^52",
                "scale the vector so every coordinate is finite and below 2^52 in magnitude",
            )
        )
    fl = np.floor(x)
    f = x - fl  # exact for |x| < 2^52
    scaled = np.ldexp(f, 64)  # exact (power-of-two scaling), in [0, 2^64)
    thr = np.floor(scaled)
    u = src.words(x.size).reshape(x.shape)
    # compare u < thr without float rounding: thr ≤ 2^64 − 2^11 fits uint64 exactly (a double below 2^64)
    thr_u = np.minimum(thr, np.float64(2.0**64 - 2048.0)).astype(np.uint64)
    up = u < thr_u
    tie = (u == thr_u) & (scaled > thr)
    for idx in zip(*np.nonzero(tie)):  # probability 2^-64 per coordinate: exact slow path
        rem = Fraction(float(scaled[idx])) - int(thr[idx])  # in (0, 1), dyadic
        up[idx] = src.randbelow(rem.denominator) < rem.numerator
    return (fl + up).astype(np.int64)


# ---------------------------------------------------------------------------------------------- Poisson / Skellam


def _poisson_small(lam: float, size: int, src: UrandomSource) -> np.ndarray:
    """Knuth's product method (λ < 10): the number of uniforms whose running product stays above e^{−λ}."""
    limit = math.exp(-lam)
    out = np.zeros(size, dtype=np.int64)
    prod = uniform53(size, src) + 2.0**-54
    active = prod > limit
    while np.any(active):
        idx = np.flatnonzero(active)
        out[idx] += 1
        prod[idx] *= uniform53(len(idx), src) + 2.0**-54
        active[idx] = prod[idx] > limit
    return out


def _poisson_ptrs(lam: float, size: int, src: UrandomSource) -> np.ndarray:
    """Hörmann (1993) PTRS transformed rejection with squeeze, λ ≥ 10 (vectorised over the pending draws)."""
    from scipy.special import gammaln

    slam, loglam = math.sqrt(lam), math.log(lam)
    b = 0.931 + 2.53 * slam
    a = -0.059 + 0.02483 * b
    inv_alpha = 1.1239 + 1.1328 / (b - 3.4)
    vr = 0.9277 - 3.6224 / (b - 2)
    out = np.empty(size, dtype=np.int64)
    pending = np.arange(size)
    while pending.size:
        m = pending.size
        U = uniform53(m, src) - 0.5
        V = uniform53(m, src)
        us = 0.5 - np.abs(U)
        k = np.floor((2 * a / np.maximum(us, 1e-300) + b) * U + lam + 0.43)
        fast = (us >= 0.07) & (V <= vr)
        reject = (k < 0) | ((us < 0.013) & (V > us))
        slow = ~fast & ~reject
        acc = fast.copy()
        if np.any(slow):
            ks = k[slow]
            lhs = np.log(np.maximum(V[slow], 1e-300)) + math.log(inv_alpha) - np.log(a / (us[slow] ** 2) + b)
            rhs = -lam + ks * loglam - gammaln(ks + 1)
            acc[slow] = lhs <= rhs
        out[pending[acc]] = k[acc].astype(np.int64)
        pending = pending[~acc]
    return out


def poisson(lam: float, size: int, src: UrandomSource | None = None) -> np.ndarray:
    """``size`` Poisson(λ) draws from ``os.urandom`` uniforms (PTRS for λ ≥ 10, product method below; float caveat
    in the module docstring)."""
    src = _SOURCE if src is None else src
    lam = float(lam)
    if not (math.isfinite(lam) and lam >= 0):
        raise ConfigError(bad_value("lam", lam, "give a finite rate λ ≥ 0"))
    if lam > 2.0**50:
        raise ConfigError(
            bad_value(
                "lam",
                lam,
                "is too large for a double-precision Poisson sampler (≤ 2^50); use more bits "
                "of granularity instead of a larger noise rate",
            )
        )
    size = int(size)
    if lam == 0 or size == 0:
        return np.zeros(size, dtype=np.int64)
    return _poisson_ptrs(lam, size, src) if lam >= 10 else _poisson_small(lam, size, src)


def skellam(lam: float, size: int, src: UrandomSource | None = None) -> np.ndarray:
    """Symmetric Skellam ``Poisson(λ) − Poisson(λ)`` (mean 0, variance 2λ); Agarwal, Kairouz & Liu (2021)."""
    return poisson(lam, size, src) - poisson(lam, size, src)
