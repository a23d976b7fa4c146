"""Statistical tests of the CSPRNG samplers (no seed is possible: every threshold fails a correct sampler with
probability ≤ 1e-6).

* discrete Gaussian (Canonne, Kamath & Steinke 2020, Alg. 1–3): chi-square against the exact pmf, mean, variance;
* Skellam = Poisson − Poisson (product method for λ < 10, PTRS above): chi-square against the exact pmf
  ``e^{−2λ} I_|k|(2λ)``, mean, variance;
* randomized rounding: values in {⌊x⌋, ⌊x⌋ + 1}, unbiased.
"""

import math
from fractions import Fraction

import numpy as np
import pytest
from scipy.special import ive
from scipy.stats import chi2, norm

from securefed.accounting.samplers import (
    UrandomSource,
    bernoulli_exp,
    discrete_gaussian,
    discrete_gaussian_pmf,
    discrete_laplace,
    poisson,
    randomized_round,
    skellam,
)
from securefed.errors import ConfigError

FAIL = 1e-6
Z = norm.isf(FAIL / 2)  # two-sided normal quantile, ≈ 4.89


def _chi_square_ok(draws, pmf_fn, min_expected=20.0):
    """Chi-square goodness of fit on the central bins (expected count ≥ min_expected) plus the two tails."""
    n = len(draws)
    lo, hi = int(draws.min()), int(draws.max())
    xs = np.arange(min(lo, -1), max(hi, 1) + 1)
    p = pmf_fn(xs)
    keep = p * n >= min_expected
    a, b = xs[keep][0], xs[keep][-1]
    central = np.arange(a, b + 1)
    pc = pmf_fn(central)
    p_left = float(pmf_fn(np.arange(a - 2000, a)).sum())
    p_right = max(1.0 - pc.sum() - p_left, 0.0)
    counts = np.array([np.sum(draws == x) for x in central])
    obs = np.concatenate([[np.sum(draws < a)], counts, [np.sum(draws > b)]])
    exp = n * np.concatenate([[p_left], pc, [p_right]])
    use = exp > 0
    stat = float(np.sum((obs[use] - exp[use]) ** 2 / exp[use]))
    df = int(use.sum()) - 1
    return stat, chi2.isf(FAIL, df), df


def _moments(pmf_fn, half):
    xs = np.arange(-half, half + 1, dtype=float)
    p = pmf_fn(xs)
    p = p / p.sum()
    var = float(np.sum(p * xs**2))
    m4 = float(np.sum(p * xs**4))
    return var, m4


def _check_mean_var(draws, var, m4):
    n = len(draws)
    assert abs(draws.mean()) <= Z * math.sqrt(var / n)
    # Var(sample variance) ≈ (μ4 − σ⁴)/n; 1.2 × Z for the estimator's own non-normality at this n
    assert abs(draws.var() - var) <= 1.2 * Z * math.sqrt((m4 - var**2) / n)


@pytest.mark.parametrize("sigma2,n", [(Fraction(7, 3), 100_000), (Fraction(1, 2), 30_000)])
def test_discrete_gaussian_fits_the_exact_pmf(sigma2, n):
    x = discrete_gaussian(sigma2, n)
    assert x.dtype == np.int64
    stat, thr, df = _chi_square_ok(x, lambda s: discrete_gaussian_pmf(sigma2, s))
    assert stat <= thr, (stat, thr, df)
    var, m4 = _moments(lambda s: discrete_gaussian_pmf(sigma2, s), 200)
    _check_mean_var(x, var, m4)
    # CKS 2020: Var[N_Z(0, σ²)] ≤ σ²(1 − 4π²σ²/(e^{4π²σ²} − 1)) < σ² (the exact variance, here from the pmf)
    s2 = float(sigma2)
    assert var <= s2 * (1 - 4 * math.pi**2 * s2 / math.expm1(4 * math.pi**2 * s2)) * (1 + 1e-12)


def test_discrete_gaussian_large_sigma_moments():
    s2 = 10**6
    x = discrete_gaussian(s2, 20_000)
    _check_mean_var(x, float(s2), 3.0 * float(s2) ** 2)  # CKS: within 1e-100 of the continuous moments here


def test_cks_building_blocks():
    src = UrandomSource()
    n = 60_000
    # Bernoulli(exp(−γ)) for γ = 5/2 (> 1: the ⌊γ⌋ + fractional path) and γ = 1/3
    for num, den in ((5, 2), (1, 3)):
        p = math.exp(-num / den)
        hits = sum(bernoulli_exp(num, den, src) for _ in range(n))
        assert abs(hits / n - p) <= Z * math.sqrt(p * (1 - p) / n)
    # discrete Laplace with scale t = 3: P[y] ∝ e^{−|y|/3}
    y = np.array([discrete_laplace(3, src) for _ in range(n)])
    z = (1 + math.exp(-1 / 3)) / (1 - math.exp(-1 / 3))
    stat, thr, _ = _chi_square_ok(y, lambda s: np.exp(-np.abs(s) / 3.0) / z)
    assert stat <= thr


def _skellam_pmf(lam):
    return lambda k: ive(np.abs(np.asarray(k, dtype=float)), 2 * lam)  # e^{−2λ} I_|k|(2λ)


@pytest.mark.parametrize("lam", [3.5, 40.0])
def test_skellam_fits_the_exact_pmf(lam):
    x = skellam(lam, 100_000)
    stat, thr, df = _chi_square_ok(x, _skellam_pmf(lam))
    assert stat <= thr, (stat, thr, df)
    var = 2 * lam
    _check_mean_var(x, var, 3 * var**2 + var)  # Skellam: κ4 = 2λ, so μ4 = 3σ⁴ + 2λ


def test_poisson_large_rate_moments():
    lam = 1e6
    x = poisson(lam, 100_000)
    assert abs(x.mean() - lam) <= Z * math.sqrt(lam / len(x))
    assert abs(x.var() - lam) <= 1.2 * Z * math.sqrt((3 * lam**2 + lam - lam**2) / len(x))
    with pytest.raises(ConfigError, match="^lam="):
        poisson(-1.0, 3)


def test_randomized_round_is_unbiased_and_integer():
    n = 100_000
    for v in (0.3, -2.75, 7.0):
        r = randomized_round(np.full(n, v))
        assert set(np.unique(r)) <= {math.floor(v), math.floor(v) + 1}
        p = v - math.floor(v)
        assert abs((r - math.floor(v)).mean() - p) <= Z * math.sqrt(max(p * (1 - p), 1e-12) / n)
    with pytest.raises(ConfigError, match="^x="):
        randomized_round(np.array([np.nan]))


def test_no_reproducibility_by_design():
    assert not np.array_equal(discrete_gaussian(4, 50), discrete_gaussian(4, 50))
    assert not np.array_equal(skellam(20.0, 50), skellam(20.0, 50))
