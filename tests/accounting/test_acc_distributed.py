"""Distributed discrete Gaussian (Kairouz, Liu & Steinke, ICML 2021) and Skellam (Agarwal, Kairouz & Liu,
NeurIPS 2021) through a modular secure sum.

References the accounting is checked against:

* **published closed form** (Canonne, Kamath & Steinke 2020): one discrete Gaussian at an integer shift Δ has
  Rényi divergence exactly αΔ²/(2σ²) whenever αΔ is an integer — brute force over the pmf reproduces it;
* **brute force**: the Rényi divergence of the n-fold convolution of discrete Gaussians (and of the Skellam pmf
  ``e^{−2λ}I_|k|(2λ)``) shifted by Δ, summed in log space over a truncated support, never exceeds the papers'
  bounds (KLS Prop. 14; AKL's Skellam bound) — and at small σ exceeds the continuous-Gaussian figure, so the τ
  correction is needed;
* **Google's dp_accounting** PLD of the discrete Gaussian (n = 1): our RDP-converted ε is an upper bound on it,
  within 25 %.
"""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.linalg import hadamard
from scipy.special import ive, logsumexp
from scipy.stats import norm

from securefed.accounting import DistributedDiscreteGaussian, DistributedSkellam, GradientPerturbation, PrivacyLedger
from securefed.accounting.distributed import (
    RDP_ORDERS,
    choose_modulus_bits,
    conditional_randomized_round,
    ddg_epsilon,
    ddg_rdp,
    ddg_tau,
    integer_sensitivity,
    padded_dimension,
    rotate,
    rotation_signs,
    rounded_l2_bound,
    skellam_rdp,
    unrotate,
    walsh_hadamard,
    wrap_probability,
)
from securefed.errors import ConfigError, OverflowRiskError
from securefed.landmarks import mmd_grad

Z = norm.isf(0.5e-6)


# ---------------------------------------------------------------------------------------------- rotation


def test_walsh_hadamard_is_the_orthonormal_sylvester_matrix_and_its_own_inverse():
    rng = np.random.default_rng(0)
    for n in (1, 2, 8, 64):
        x = rng.normal(size=n)
        np.testing.assert_allclose(walsh_hadamard(x), hadamard(n) @ x / math.sqrt(n), atol=1e-12)
        np.testing.assert_allclose(walsh_hadamard(walsh_hadamard(x)), x, atol=1e-12)
    x = rng.normal(size=300)
    s = rotation_signs("run", 2, 1, padded_dimension(300))
    y = rotate(x, s)
    assert len(y) == 512 and math.isclose(np.linalg.norm(y), np.linalg.norm(x), rel_tol=1e-12)
    np.testing.assert_allclose(unrotate(y, s, 300), x, atol=1e-12)
    assert padded_dimension(19_200) == 32_768 and padded_dimension(1) == 1 and padded_dimension(64) == 64


def test_rotation_signs_are_public_and_per_aggregation():
    a = rotation_signs("run-1", 3, 0, 1024)
    assert set(np.unique(a)) == {-1, 1} and a.dtype == np.int8
    np.testing.assert_array_equal(a, rotation_signs("run-1", 3, 0, 1024))  # every site derives the same
    for other in (
        rotation_signs("run-1", 3, 1, 1024),
        rotation_signs("run-1", 4, 0, 1024),
        rotation_signs("run-2", 3, 0, 1024),
    ):
        assert 300 < np.sum(a != other) < 724  # independent-looking
    with pytest.raises(ConfigError, match="^rotation_seed="):
        rotation_signs("", 0, 0, 8)


# ---------------------------------------------------------------------------------------------- accounting


def _dg_logpmf(s2, half):
    x = np.arange(-half, half + 1)
    lw = -x * x / (2 * s2)
    return lw - logsumexp(lw)


def _log_convolve(la, lb):
    m = la[:, None] + lb[None, :]
    idx = np.add.outer(np.arange(len(la)), np.arange(len(lb)))
    return np.array([logsumexp(m[idx == k]) for k in range(len(la) + len(lb) - 1)])


def _renyi(lp, lq, a):
    return float(logsumexp(a * lp + (1 - a) * lq) / (a - 1))


def _shift(lp, d):
    return np.concatenate([np.full(d, -np.inf), lp[:-d]])


@pytest.mark.parametrize("s2", [0.3, 1.0, 2.0])
def test_single_discrete_gaussian_matches_the_published_closed_form(s2):
    lp = _dg_logpmf(s2, 80)
    for d in (1, 3):
        for a in (2, 5, 10):  # αΔ integer: D_α = αΔ²/(2σ²) exactly (CKS 2020)
            brute = _renyi(_shift(lp, d), lp, a)
            assert math.isclose(brute, a * d * d / (2 * s2), rel_tol=1e-9)
            assert math.isclose(float(ddg_rdp(a, l2=d, l1=d, sigma2=s2, n=1, dim=1)), brute, rel_tol=1e-9)


def test_sum_of_discrete_gaussians_never_exceeds_kls_bound():
    worst_gap_over_gauss = 0.0
    for s2 in (0.3, 0.5, 1.0):
        p = _dg_logpmf(s2, 40)
        s = p
        for n in (2, 3):
            s = _log_convolve(s, p)
            for d in (1, 3):
                for a in (2, 5, 10):
                    brute = _renyi(_shift(s, d), s, a)
                    bound = float(ddg_rdp(a, l2=d, l1=d, sigma2=s2, n=n, dim=1))
                    assert brute <= bound * (1 + 1e-9), (s2, n, d, a, brute, bound)
                    worst_gap_over_gauss = max(worst_gap_over_gauss, brute - a * d * d / (2 * n * s2))
                    if s2 == 1.0:  # τ ≈ 5e-4: the bound is tight
                        assert bound - brute <= 2 * ddg_tau(s2, n) + 1e-9
    # the sum of discrete Gaussians is NOT a discrete Gaussian: at σ² = 0.3 it leaks more than N(0, nσ²) would
    assert worst_gap_over_gauss > 0.05


def test_skellam_bound_never_below_brute_force_and_sharp_for_large_variance():
    for lam in (2.0, 10.0, 50.0, 500.0):
        half = int(14 * math.sqrt(2 * lam) + 40)  # pmf e^{−2λ}I_k(2λ) stays above 1e-300 here
        k = np.arange(-half, half + 1)
        lq = np.log(ive(np.abs(k), 2 * lam))
        assert np.all(np.isfinite(lq))
        for d in (1, 3):
            lp = np.log(ive(np.abs(k - d), 2 * lam))
            for a in (2, 4, 8, 16):
                brute = _renyi(lp, lq, a)
                bound = float(skellam_rdp(a, l2=d, l1=d, variance=2 * lam))
                assert brute <= bound * (1 + 1e-9), (lam, d, a, brute, bound)
                if lam >= 50:
                    assert bound <= brute * 1.06


def test_single_discrete_gaussian_against_dp_accounting_pld():
    from dp_accounting.pld import privacy_loss_distribution as pld

    for sigma, R in ((2.0, 10), (5.0, 100)):
        ref = pld.from_discrete_gaussian_mechanism(sigma, sensitivity=1).self_compose(R).get_epsilon_for_delta(1e-5)
        ours = ddg_epsilon(l2=1, l1=1, sigma2=sigma**2, n_sites=1, min_survivors=1, dim=1, releases=R, delta=1e-5)
        assert ref <= ours <= 1.25 * ref, (sigma, R, ref, ours)


def test_worst_case_over_survivors_and_tau_growth():
    # τ grows with the number of summed sites; ε is the worst over every k ≥ t the secure sum may reveal
    assert ddg_tau(0.3, 2) < ddg_tau(0.3, 5) < ddg_tau(0.3, 20)
    e = [
        ddg_epsilon(l2=3, l1=3, sigma2=0.3, n_sites=n, min_survivors=2, dim=16, releases=5, delta=1e-5)
        for n in (2, 5, 20)
    ]
    assert e[0] <= e[1] <= e[2]


def test_integer_sensitivity_and_rounding_bound():
    l2, l1 = integer_sensitivity(dim=64, granularity=0.5, adjacency="record", l2_sensitivity=2.0)
    assert l2 == 4.0 + 8.0 and l1 == min(8 * 4.0 + 64, l2 * l2)
    with pytest.raises(ConfigError, match="^beta="):
        integer_sensitivity(dim=64, granularity=0.5, adjacency="record", l2_sensitivity=2.0, beta=0.1)
    l2s, _ = integer_sensitivity(dim=64, granularity=0.5, adjacency="site", clip=1.0, beta=math.exp(-0.5))
    assert l2s == rounded_l2_bound(2.0, 64, math.exp(-0.5)) < 2.0 + 8.0
    # conditional rounding: the bound of KLS Theorem 1 holds for every returned vector
    rng = np.random.default_rng(1)
    x = rng.normal(size=256)
    x *= 30 / np.linalg.norm(x)
    for _ in range(20):
        r = conditional_randomized_round(x, beta=math.exp(-0.5), norm=30.0)
        assert np.linalg.norm(r) <= rounded_l2_bound(30.0, 256, math.exp(-0.5))


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**31), d=st.integers(1, 40), scale=st.floats(0.01, 50), shift=st.floats(1e-6, 5))
def test_coupled_rounding_difference_within_record_sensitivity(seed, d, scale, shift):
    """The coupling behind the record bound: rounding two vectors with the same uniforms moves them apart by at
    most ‖a − b‖ + √d (here with the exact monotone coupling u < frac)."""
    rng = np.random.default_rng(seed)
    a = rng.normal(size=d) * scale
    b = a + rng.normal(size=d) * shift
    u = rng.random(d)
    ra = np.floor(a) + (u < a - np.floor(a))
    rb = np.floor(b) + (u < b - np.floor(b))
    assert np.linalg.norm(ra - rb) <= np.linalg.norm(a - b) + math.sqrt(d) + 1e-9
    assert (
        np.abs(ra - rb).sum()
        <= min(math.sqrt(d) * np.linalg.norm(a - b) + d, np.linalg.norm(a - b) + math.sqrt(d)) ** 2 + 1e-9
        or np.abs(ra - rb).sum() <= math.sqrt(d) * np.linalg.norm(a - b) + d + 1e-9
    )


# ---------------------------------------------------------------------------------------------- modulus


def test_modulus_rule_monte_carlo_and_monotonicity():
    n, d, s2 = 3, 64, 400.0
    b = choose_modulus_bits(n_sites=n, dim=d, clip_int=50.0, sigma2=s2, target=0.1)
    p_b = wrap_probability(b, n_sites=n, dim=d, clip_int=50.0, sigma2=s2)
    assert p_b <= 0.1 < wrap_probability(b - 1, n_sites=n, dim=d, clip_int=50.0, sigma2=s2)
    # the real wrap frequency at b bits and at b − 1 bits, by simulation of the summed noise
    from securefed.accounting.samplers import discrete_gaussian

    trials = 100
    half = 2 ** (b - 1)
    wraps = 0
    for _ in range(trials):
        tot = sum(discrete_gaussian(s2, d) for _ in range(n)) + rng_data(d, n, 50.0)
        wraps += bool(np.any((tot >= half) | (tot < -half)))
    assert wraps / trials <= p_b + Z * math.sqrt(p_b * (1 - p_b) / trials) + 1e-12
    assert choose_modulus_bits(n_sites=10, dim=d, clip_int=50.0, sigma2=s2) >= choose_modulus_bits(
        n_sites=3, dim=d, clip_int=50.0, sigma2=s2
    )
    assert choose_modulus_bits(n_sites=3, dim=d, clip_int=50.0, lam=s2 / 2) >= 2
    with pytest.raises(OverflowRiskError, match="^max_bits=8 is invalid"):
        choose_modulus_bits(n_sites=3, dim=d, clip_int=1e6, sigma2=s2, max_bits=8)


def rng_data(d, n, clip_int):
    """The rotated data term of n sites (each clipped to clip_int), rounded — as the encoder sends it."""
    rng = np.random.default_rng()
    out = np.zeros(d)
    for _ in range(n):
        v = rng.normal(size=d)
        out += rotate(v * clip_int / np.linalg.norm(v), rotation_signs("mc", 0, 0, d))
    return np.round(out)


# ---------------------------------------------------------------------------------------------- end to end


@pytest.mark.parametrize("cls", [DistributedDiscreteGaussian, DistributedSkellam])
def test_encode_secure_sum_decode(cls):
    P, dim = 4, 3000  # padded to 4096
    mech = cls(
        dim=dim,
        n_sites=P,
        min_survivors=3,
        rotation_seed="run-9",
        epsilon=2.0,
        delta=1e-5,
        releases=10,
        l2_sensitivity=0.01,
        clip=1.0,
    )
    rng = np.random.default_rng(2)
    xs = [rng.normal(size=dim) * 0.01 for _ in range(P)]
    xs[0] = xs[0] / np.linalg.norm(xs[0]) * 5.0  # over the clip norm: clipped at the site, silently
    ups = [mech.encode(x, round=1, step=0) for x in xs]
    for u in ups:
        assert u.dtype == np.uint64 and len(u) == 4096 and int(u.max()) < 2**mech.modulus_bits
    total64 = np.zeros(4096, dtype=np.uint64)
    for u in ups:
        total64 += u  # a 64-bit secure sum; the decoder reduces mod 2^bits itself
    mask = np.uint64(2**mech.modulus_bits - 1)
    total_k = np.zeros(4096, dtype=np.uint64)
    for u in ups:
        total_k = (total_k + u) & mask  # a secure sum mod 2^bits
    est = mech.decode(total64, round=1, step=0)
    np.testing.assert_array_equal(est, mech.decode(total_k, round=1, step=0))
    truth = sum(xs[1:]) + xs[0] / np.linalg.norm(xs[0]) * 1.0
    err = est - truth
    sd = mech.report()["central_std"] * math.sqrt(P / mech.min_survivors)  # all P sites' noise is in the sum
    assert abs(err.mean()) <= Z * sd / math.sqrt(dim) + 1e-12
    assert abs(err.std() / sd - 1) <= 0.1  # 4096 rotated coordinates: sd of the estimate ≈ 1.1 %
    # a dropout: the survivors' sum decodes to the survivors' vectors
    surv = ups[1] + ups[2] + ups[3]
    err3 = mech.decode(surv, round=1, step=0) - sum(xs[1:])
    assert abs(err3.std() / (sd * math.sqrt(3 / P)) - 1) <= 0.1
    # decoding with another aggregation's signs scrambles the sum (the signs are per (round, step))
    assert np.std(mech.decode(total64, round=2, step=0) - est) > sd


@pytest.mark.parametrize("cls", [DistributedDiscreteGaussian, DistributedSkellam])
def test_calibration_meets_target_and_ledger_multiplier_dominates(cls):
    mech = cls(
        dim=19_200,
        n_sites=10,
        min_survivors=7,
        rotation_seed="r",
        epsilon=1.0,
        delta=1e-5,
        releases=60,
        l2_sensitivity=1e-3,
        clip=1.0,
    )
    rep = mech.report()
    assert 0.999 <= rep["epsilon"] <= 1.0 and mech.epsilon() == pytest.approx(rep["epsilon"])
    assert mech.epsilon(120) > mech.epsilon(60) > mech.epsilon(30)
    assert rep["padded_dim"] == 32_768 and rep["modulus_bits"] <= 64 and rep["wrap_probability_bound"] <= 2**-40
    assert rep["l2_sensitivity_integer"] == pytest.approx((1 + 0.01) * 1e-3 / mech.granularity, rel=1e-12)
    z = mech.ledger_noise_multiplier()
    a = RDP_ORDERS[RDP_ORDERS <= 1e4]
    for k in range(mech.min_survivors, mech.n_sites + 1):
        if cls is DistributedDiscreteGaussian:
            curve = ddg_rdp(a, l2=mech.l2_int, l1=mech.l1_int, sigma2=float(mech.sigma2), n=k, dim=mech.padded_dim)
        else:
            curve = skellam_rdp(a, l2=mech.l2_int, l1=mech.l1_int, variance=2 * mech.lam * k)
        assert np.all(a / (2 * z * z) >= curve * (1 - 1e-12))
    # write-ahead into an RDP ledger; the exact/PRV accountants would not be upper bounds here
    with pytest.raises(ConfigError, match="^ledger accountant='exact'"):
        mech.record_release(PrivacyLedger(None, "x", delta=1e-5), site=0, round=0, step=0)
    led = PrivacyLedger(None, "ddg", delta=1e-5, accountant="rdp")
    ev = mech.record_release(led, site=3, round=0, step=0)
    assert ev["mechanism"] == mech.mechanism and ev["noise_multiplier"] == pytest.approx(z) and ev["sample_rate"] == 1.0


def test_typed_errors():
    kw = dict(dim=100, n_sites=3, rotation_seed="s", epsilon=1.0, releases=5, l2_sensitivity=0.1, clip=1.0)
    with pytest.raises(ConfigError, match="^min_survivors="):
        DistributedDiscreteGaussian(**dict(kw, min_survivors=4))
    with pytest.raises(ConfigError, match="^dim="):
        DistributedDiscreteGaussian(**dict(kw, dim=0))
    with pytest.raises(ConfigError, match="^beta="):
        DistributedDiscreteGaussian(**dict(kw, beta=0.3))  # record adjacency needs unconditional rounding
    with pytest.raises(ConfigError, match="^l2_sensitivity="):
        DistributedDiscreteGaussian(**dict(kw, l2_sensitivity=5.0))
    with pytest.raises(OverflowRiskError, match="^max_bits="):
        DistributedDiscreteGaussian(**dict(kw, max_bits=10))
    site = DistributedDiscreteGaussian(**dict(kw, adjacency="site", l2_sensitivity=None))
    assert site.beta == pytest.approx(math.exp(-0.5)) and site.report()["adjacency"] == "site"
    m = DistributedDiscreteGaussian(**kw)
    with pytest.raises(ConfigError, match="^x="):
        m.encode(np.ones(99), round=0, step=0)
    with pytest.raises(ConfigError, match="^total="):
        m.decode(np.ones(128), round=0, step=0)


# ---------------------------------------------------------------------------------------------- FedDL plug-in


def _gp(rule="gradient", **kw):
    rng = np.random.default_rng(0)
    m = GradientPerturbation(epsilon=1.0, tau_x=2.0, **kw)
    sites = [rng.normal(size=(40 + 10 * p, 3)) for p in range(3)]
    clipped = m.prepare(sites, gamma=0.5, n_landmarks=6, rounds=5, local_steps=1, rule=rule, n_clients=3)
    return m, clipped


def test_gradient_perturbation_builds_the_integer_mechanism():
    m, _ = _gp(min_survivors=2)
    w = [0.2, 0.3, 0.5]
    ddg = m.distributed_mechanism("ddg", n_features=3, rotation_seed="run", weights=w)
    assert ddg.dim == 18 and ddg.releases == 5 and ddg.min_survivors == 2 and ddg.epsilon_target == 1.0
    assert ddg.l2_sensitivity == pytest.approx(max(wp * s.value for wp, s in zip(w, m.sens)))
    assert isinstance(m.distributed_mechanism("skellam", n_features=3, rotation_seed="run"), DistributedSkellam)
    with pytest.raises(ConfigError, match="^rule='model'"):
        _gp("model")[0].distributed_mechanism("ddg", n_features=3, rotation_seed="run")
    with pytest.raises(ConfigError, match="^kind="):
        m.distributed_mechanism("laplace", n_features=3, rotation_seed="run")


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**31), far=st.floats(0, 100))
def test_gradient_norm_bound_holds_at_any_landmarks(seed, far):
    m, clipped = _gp()
    rng = np.random.default_rng(seed)
    Y = rng.normal(size=(6, 3)) * far
    for p, X in enumerate(clipped):
        assert np.linalg.norm(mmd_grad(X, Y, 0.5, n_norm=len(X))) <= m.gradient_norm_bound(p) * (1 + 1e-12)
