"""Accountants: exact μ-GDP vs dp-accounting PLD, calibration round trips, monotonicity, bad inputs."""

import math

import dp_accounting
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from securefed.accounting import (
    calibrate_noise_multiplier,
    compose_gdp,
    epsilon_from_noise,
    gdp_delta,
    gdp_epsilon,
    gdp_mu,
    get_accountant,
    paper_epsilon,
    paper_noise_multiplier,
)
from securefed.errors import ConfigError


def pld_epsilon(z, releases, delta):
    acc = dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-3)
    acc.compose(dp_accounting.GaussianDpEvent(z), releases)
    return acc.get_epsilon(delta)


@pytest.mark.parametrize(
    "z,releases,delta", [(1.0, 10, 1e-5), (2.0, 100, 1e-6), (0.8, 1, 1e-3), (5.0, 500, 1e-5), (20.0, 50, 1e-5)]
)
def test_exact_matches_pld_within_1_percent(z, releases, delta):
    ours = epsilon_from_noise(z, releases, delta, "exact")
    ref = pld_epsilon(z, releases, delta)
    assert abs(ours / ref - 1) < 0.01, (ours, ref)
    # PLD is a (slightly) pessimistic discretisation: never meaningfully below the exact value
    assert ours <= ref * (1 + 1e-6)


def test_exact_is_tight_gdp_profile(closed_form):
    for mu in (0.1, 0.5, 1.0, 3.0):
        for d in (1e-3, 1e-6):
            e = gdp_epsilon(d, mu)
            assert gdp_delta(e, mu) <= d
            assert gdp_delta(e * (1 - 1e-6), mu) > d * (1 - 1e-3)
            assert math.isclose(gdp_mu(e, d), mu, rel_tol=1e-6)
            # against the closed form δ(ε) = Φ(−ε/μ + μ/2) − e^ε Φ(−ε/μ − μ/2), solved in the test
            assert math.isclose(gdp_delta(e, mu), closed_form.gdp_delta(e, mu), rel_tol=1e-9)
            assert math.isclose(e, closed_form.gdp_epsilon(mu, d), rel_tol=1e-9)


def test_heterogeneous_composition_equals_mu_sum():
    acc = get_accountant("exact")
    hist = [(1.5, 1.0, 3), (4.0, 1.0, 10), (0.9, 1.0, 1)]
    mu = compose_gdp([1 / 1.5] * 3 + [1 / 4.0] * 10 + [1 / 0.9])
    assert math.isclose(acc.epsilon_history(hist, 1e-5), gdp_epsilon(1e-5, mu), rel_tol=1e-12)
    # and matches the PLD accountant composing the same heterogeneous events
    pld = dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-3)
    for z, _, c in hist:
        pld.compose(dp_accounting.GaussianDpEvent(z), c)
    assert abs(acc.epsilon_history(hist, 1e-5) / pld.get_epsilon(1e-5) - 1) < 0.01


def rdp_epsilon(z, releases, delta, q=1.0):
    """dp-accounting's RDP accountant (securefed's "rdp" uses Opacus' RDP code; this is another implementation)."""
    acc = dp_accounting.rdp.RdpAccountant()
    event = dp_accounting.GaussianDpEvent(z)
    acc.compose(event if q == 1.0 else dp_accounting.PoissonSampledDpEvent(q, event), releases)
    return acc.get_epsilon(delta)


@pytest.mark.parametrize("accountant", ["exact", "rdp", "paper"])
@pytest.mark.parametrize("eps,releases", [(0.5, 20), (1.0, 100), (4.0, 7)])
def test_calibrated_noise_gives_the_target_epsilon_by_an_independent_count(accountant, eps, releases, closed_form):
    """The z the accountant calibrates for (ε, δ) over R releases, checked by a computation that does not use
    securefed: the μ-GDP closed form (exact), dp-accounting's RDP accountant (rdp), the paper's Theorem 5 closed
    form z² = 8R·ln(e + ε/δ)/ε² (paper) — and the round trip through securefed's own ε."""
    z = calibrate_noise_multiplier(eps, 1e-5, releases, accountant)
    if accountant == "exact":
        assert closed_form.gdp_epsilon(math.sqrt(releases) / z, 1e-5) == pytest.approx(eps, rel=1e-6)
    elif accountant == "rdp":
        assert rdp_epsilon(z, releases, 1e-5) == pytest.approx(eps, rel=0.005)
    else:
        assert z * z == pytest.approx(8 * releases * math.log(math.e + eps / 1e-5) / eps**2, rel=1e-9)
    back = epsilon_from_noise(z, releases, 1e-5, accountant)
    assert eps * 0.995 <= back <= eps * (1 + 1e-9)


def test_calibration_prv_subsampled_against_an_independent_accountant():
    """Poisson-subsampled Gaussian releases: the z securefed's PRV accountant calibrates for ε = 1 gives ε ≈ 1 in
    dp-accounting's PLD accountant (another numerical method, another code base)."""
    z = calibrate_noise_multiplier(1.0, 1e-5, 200, "prv", sample_rate=0.05)
    pld = dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-3)
    pld.compose(dp_accounting.PoissonSampledDpEvent(0.05, dp_accounting.GaussianDpEvent(z)), 200)
    assert pld.get_epsilon(1e-5) == pytest.approx(1.0, rel=0.02)
    back = epsilon_from_noise(z, 200, 1e-5, "prv", sample_rate=0.05)
    assert 0.98 <= back <= 1.0 + 1e-9
    # RDP is an upper bound of the PRV/true ε
    assert epsilon_from_noise(z, 200, 1e-5, "rdp", sample_rate=0.05) >= back


def test_paper_closed_form_and_ratio():
    eps, d, R = 1.0, 1e-5, 50
    z = paper_noise_multiplier(eps, d, R)
    assert math.isclose(z * z, 8 * R * math.log(math.e + eps / d) / eps**2, rel_tol=1e-12)
    assert math.isclose(paper_epsilon(z, R, d), eps, rel_tol=1e-9)
    ratio = z / calibrate_noise_multiplier(eps, d, R, "exact")
    assert 2.0 < ratio < 3.0  # docs/maths.md: the paper needs ~2.2–2.7× the noise


@settings(max_examples=40, deadline=None)
@given(
    z=st.floats(0.3, 30),
    dz=st.floats(1.01, 3),
    R=st.integers(1, 2000),
    dR=st.integers(1, 500),
    d=st.sampled_from([1e-3, 1e-5, 1e-8]),
)
def test_exact_and_paper_monotone(z, dz, R, dR, d):
    for name in ("exact", "paper"):
        e = epsilon_from_noise(z, R, d, name)
        assert epsilon_from_noise(z * dz, R, d, name) <= e + 1e-12
        assert epsilon_from_noise(z, R + dR, d, name) >= e - 1e-12


@settings(max_examples=10, deadline=None)
@given(z=st.floats(0.6, 10), R=st.integers(1, 300), q=st.sampled_from([0.01, 0.1, 1.0]))
def test_rdp_monotone(z, R, q):
    e = epsilon_from_noise(z, R, 1e-5, "rdp", q)
    assert epsilon_from_noise(z * 1.3, R, 1e-5, "rdp", q) <= e + 1e-12
    assert epsilon_from_noise(z, R + 10, 1e-5, "rdp", q) >= e - 1e-12


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), float("inf"), "x", True])
def test_bad_epsilon(bad):
    with pytest.raises(ConfigError, match="epsilon"):
        calibrate_noise_multiplier(bad, 1e-5, 10)


@pytest.mark.parametrize("bad", [0, 1, 1.5, -1e-5, float("nan")])
def test_bad_delta(bad):
    with pytest.raises(ConfigError, match="delta"):
        epsilon_from_noise(1.0, 10, bad)


def test_bad_other_inputs():
    with pytest.raises(ConfigError, match="releases"):
        epsilon_from_noise(1.0, 0, 1e-5)
    with pytest.raises(ConfigError, match="noise_multiplier"):
        epsilon_from_noise(-1.0, 3, 1e-5)
    with pytest.raises(ConfigError, match="sample_rate"):
        epsilon_from_noise(1.0, 3, 1e-5, "rdp", sample_rate=1.5)
    with pytest.raises(ConfigError, match="sample_rate"):
        epsilon_from_noise(1.0, 3, 1e-5, "exact", sample_rate=0.5)
    with pytest.raises(ConfigError, match="accountant"):
        get_accountant("moments")
