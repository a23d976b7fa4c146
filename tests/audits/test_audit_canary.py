"""The canary audit and the seed-knowing distinguishing game (issue 14, items 1 and 7).

Every claim about an honest run is a Clopper–Pearson statement: if the mechanism is (ε, δ)-DP, the bound exceeds
ε with probability at most 1 − confidence. The honest-run tests use confidences whose union over the statistics
checked in one test is ≥ 1 − 1e-3, so each fails spuriously at most once in a thousand runs (secret noise is not
reproducible). The leaky-run tests do not depend on luck: with σ/100 the canary's μ̂ ≈ 22 (error rate per trial at
the threshold ½ about Φ(−11) ≈ 1e-28), without noise or with the seed known the statistic is exactly 0 or 1.
"""

import math

import numpy as np
import pytest

from securefed.accounting import GradientPerturbation
from securefed.audits import canary as canary_mod
from securefed.audits.canary import CanaryTrials, choose_canary, distinguishing_game, run_canary_trials
from securefed.audits.stats import (
    best_threshold,
    clopper_pearson,
    epsilon_lower_bound,
    perfect_test_epsilon,
    trials_for_epsilon,
)
from securefed.errors import ConfigError

CONF = 0.999  # one statistic per honest-run test: spurious failure ≤ 1e-3
LEAKY_CONF = 0.99  # leaky runs are separated whatever the luck; 30 pairs at 99 % can show up to 1.64
PAIRS = 30  # trial pairs of the fast tests (60 tiny runs, ~2–4 s)
TAU = 3.0


@pytest.fixture(scope="module")
def tiny_sites():
    """Three sites × 12 records × 3 features (each trial is two full DP FedDL runs: keep it tiny)."""
    rng = np.random.default_rng(7)
    return [rng.normal(size=(12, 3)) for _ in range(3)]


def run(sites, **kw):
    opts = dict(epsilon=1.0, tau_x=TAU, n_landmarks=4, rounds=3, local_steps=1, random_state=0)
    opts.update(kw)
    return run_canary_trials(sites, **opts)


# ------------------------------------------------------------------------------------------ statistics helpers


def test_perfect_test_bound_is_the_log_of_the_clopper_pearson_ends_by_hand():
    # k = 0 of n: the exact upper end solves (1 - p)^n = α/2; k = n: the lower end solves p^n = α/2
    for n, conf in [(50, 0.95), (200, 0.95), (40, 0.999), (1000, 0.95)]:
        a = (1 - conf) / 2
        p = a ** (1 / n)
        lo, _ = clopper_pearson(n, n, conf)
        _, hi = clopper_pearson(0, n, conf)
        assert lo == pytest.approx(p, rel=1e-10) and hi == pytest.approx(1 - p, rel=1e-10)
        by_hand = math.log(p / (1 - p))
        assert perfect_test_epsilon(n, conf) == pytest.approx(by_hand, rel=1e-12)
        assert float(epsilon_lower_bound(n, 0, n, n, 0.0, conf)[0]) == pytest.approx(by_hand, rel=1e-10)
        d = 1e-3
        assert perfect_test_epsilon(n, conf, d) == pytest.approx(math.log((p - d) / (1 - p)), rel=1e-12)
        assert float(epsilon_lower_bound(n, 0, n, n, d, conf)[0]) == pytest.approx(
            math.log((p - d) / (1 - p)), rel=1e-9
        )
    # the figure of issue 14: 50 test trials at 95 % can show at most 2.57
    assert perfect_test_epsilon(50, 0.95) == pytest.approx(2.5696, abs=1e-4)


def test_trials_for_epsilon_is_the_smallest_count_that_can_refute_the_claim():
    for eps in (0.5, 1.0, 2.0, 4.0):
        for conf in (0.95, 0.999):
            n = trials_for_epsilon(eps, conf)
            assert perfect_test_epsilon(n, conf) > eps
            assert n == 1 or perfect_test_epsilon(n - 1, conf) <= eps
    assert trials_for_epsilon(1.0, 0.95) == 12 and trials_for_epsilon(4.0, 0.95) == 204
    with pytest.raises(ConfigError):
        trials_for_epsilon(math.inf)


def test_best_threshold_separates_and_matches_the_perfect_bound(closed_form):
    pos, neg = np.linspace(1.0, 2.0, 30), np.linspace(-1.0, 0.5, 30)
    t, e = best_threshold(pos, neg, confidence=0.95)
    assert 0.5 < t < 1.0 and e == pytest.approx(closed_form.perfect_test_epsilon(30, 0.95))
    assert perfect_test_epsilon(30, 0.95) == pytest.approx(closed_form.perfect_test_epsilon(30, 0.95))
    assert best_threshold(np.zeros(5), np.zeros(5)) == (None, -math.inf)


def _trials(s_in, s_out, claimed=1.0, delta=1e-5, mu=1.0):
    return CanaryTrials(
        scores={s: (np.asarray(s_in, float), np.asarray(s_out, float)) for s in canary_mod.STATISTICS},
        claimed_epsilon=claimed,
        delta=delta,
        noise="secret",
        sigma_scale=1.0,
        noise_multiplier=1.0,
        sensitivity=1.0,
        sigma=1.0,
        releases=1,
        canary=(0.0,),
        partner=(0.0,),
        replaced=0,
        canary_site=0,
        canary_mu=mu,
        sensitivity_attained=1.0,
        sensitivity_max=1.0,
        seconds=0.0,
    )


def test_audit_decision_from_scores_split_fixed_threshold_and_verdict(closed_form):
    n = 200
    sep = _trials(np.ones(n), np.zeros(n))
    r = sep.audit("release", confidence=0.95)  # threshold chosen on the first 100 pairs, bound on the last 100
    assert r.test_trials == 100 and r.trials == 200 and 0 < r.threshold < 1
    assert r.epsilon_lower_bound == pytest.approx(closed_form.perfect_test_epsilon(100, 0.95, 1e-5))
    assert r.verdict == "claim violated" and r.violated and r.tpr == 1 and r.fpr == 0
    r = sep.audit("release", confidence=0.95, threshold=0.5, trials=50)  # a priori threshold: every pair tests
    assert r.test_trials == 50 and r.epsilon_lower_bound == pytest.approx(2.5696, abs=1e-3)
    # a Gaussian-shift test with μ = 1 whose claim is generous: consistent; the attainable ε is that of μ
    g = np.random.default_rng(0)
    mixed = _trials(g.normal(1, 1, n), g.normal(0, 1, n), claimed=4.0)
    r = mixed.audit("release", confidence=0.95)
    assert r.verdict == "consistent" and r.epsilon_lower_bound < 4.0
    assert r.attainable_epsilon == pytest.approx(closed_form.gdp_epsilon(1.0, 1e-5))
    with pytest.raises(ConfigError):
        sep.audit("nearest")
    with pytest.raises(ConfigError):
        sep.audit(trials=500)


def test_choose_canary_attains_the_kernel_shape_bound_where_it_is_attainable():
    # all landmarks at the origin: Δ_shape is attained by x = −x' at distance 1/√(2γ) (sensitivity.py docstring)
    n, ny, m, gamma = 12, 4, 3, 1.0 / 9
    gp = GradientPerturbation(noise_multiplier=1.0, tau_x=TAU, secure_mode=True)
    gp.calibrate([n], gamma=gamma, n_landmarks=ny, rounds=1, local_steps=1, rule="gradient")
    X = np.random.default_rng(0).normal(size=(n, m))
    c, cp, r, pull = choose_canary(X, np.zeros((ny, m)), gamma, TAU)
    assert 4 * gamma / (n * ny) * pull == pytest.approx(gp.sens[0].kernel_shape, rel=1e-9)
    assert np.linalg.norm(c) == pytest.approx(1 / math.sqrt(2 * gamma)) and np.allclose(c, -cp)
    assert 0 <= r < n and np.linalg.norm(c) <= TAU + 1e-12
    c2, _, _, pull2 = choose_canary(X, np.zeros((ny, m)), gamma, TAU, "sphere")
    assert np.linalg.norm(c2) == pytest.approx(TAU) and pull2 <= pull + 1e-12


# ------------------------------------------------------------------------------------------ the audit on real runs


def test_canary_audit_flags_the_sigma_over_100_run(tiny_sites, closed_form):
    tr = run(tiny_sites, noise="secret", sigma_scale=0.01, trials=PAIRS)
    assert tr.canary_mu > 15  # the claimed μ is √3/z ≈ 0.27; σ/100 makes it ≈ 27 × (Δ attained ≈ 0.84)
    for statistic in ("release", "landmarks"):
        r = tr.audit(statistic, confidence=LEAKY_CONF, threshold=0.5)
        assert r.verdict == "claim violated", r
        assert r.epsilon_lower_bound > 1.5 and r.tpr == 1.0 and r.fpr == 0.0
        assert r.epsilon_lower_bound == pytest.approx(closed_form.perfect_test_epsilon(PAIRS, LEAKY_CONF, 1e-5))


def test_canary_audit_flags_the_run_without_noise(tiny_sites):
    tr = run(tiny_sites, noise="none", trials=PAIRS)
    assert tr.canary_mu == math.inf
    s_in, s_out = tr.scores["release"]
    assert np.allclose(s_in, 1.0, atol=1e-9) and np.allclose(s_out, 0.0, atol=1e-9)
    r = tr.audit("release", confidence=LEAKY_CONF, threshold=0.5)
    assert r.verdict == "claim violated" and r.epsilon_lower_bound > 1.5


def test_canary_audit_does_not_flag_an_honest_epsilon_1_run(tiny_sites):
    tr = run(tiny_sites, noise="secret", trials=PAIRS)
    claimed_mu = math.sqrt(tr.releases) / tr.noise_multiplier
    # Δ holds for the canary at every release, so no test on these runs can beat the claim
    assert tr.sensitivity_max <= 1 + 1e-9 and tr.sensitivity_attained > 0.6
    assert tr.canary_mu <= claimed_mu * (1 + 1e-9)
    r = tr.audit("release", confidence=CONF, threshold=0.5)
    assert r.verdict == "consistent" and r.epsilon_lower_bound <= 1.0, r
    assert r.attainable_epsilon <= 1.0


def test_the_seed_knowing_attacker_flags_seeded_noise(tiny_sites):
    r = distinguishing_game(
        tiny_sites,
        epsilon=1.0,
        tau_x=TAU,
        noise="seeded",
        trials=PAIRS,
        confidence=LEAKY_CONF,
        n_landmarks=4,
        rounds=3,
        random_state=1,
    )
    assert r.statistic == "seeded" and r.tpr == 1.0 and r.fpr == 0.0
    assert r.verdict == "claim violated" and r.epsilon_lower_bound > 1.5


def test_bad_options_are_refused(tiny_sites):
    with pytest.raises(ConfigError):
        run(tiny_sites, noise="loud", trials=2)
    with pytest.raises(ConfigError):
        run(tiny_sites, sigma_scale=0.0, trials=2)
    with pytest.raises(ConfigError):
        run(tiny_sites, trials=1)
    with pytest.raises(ConfigError):
        run(tiny_sites, canary_site=3, trials=2)


# ------------------------------------------------------------------------------------------ the distinguishing game


@pytest.mark.slow
def test_distinguishing_game_seeded_noise_is_flagged(tiny_sites):
    """Issue 14 item 1: knowing the seed, the attacker distinguishes the neighbours in every one of 150 pairs."""
    tr = run(tiny_sites, noise="seeded", trials=150, random_state=2)
    s_in, s_out = tr.scores["seeded"]
    assert np.allclose(s_in, 1.0, atol=1e-9) and np.allclose(s_out, 0.0, atol=1e-9)  # the noise is removed exactly
    r = tr.audit("seeded", confidence=CONF, threshold=0.5)
    assert r.verdict == "claim violated" and r.epsilon_lower_bound > 2.5
    # the figure: 50 pairs at 95 % show 2.57 against the claimed 1
    r50 = tr.audit("seeded", confidence=0.95, threshold=0.5, trials=50)
    assert r50.epsilon_lower_bound == pytest.approx(2.57, abs=5e-3)
    # the same runs without the seed: the canary test alone does not beat the claim
    assert tr.audit("release", confidence=CONF, threshold=0.5).verdict == "consistent"


@pytest.mark.slow
def test_distinguishing_game_secret_noise_stays_under_the_claim(tiny_sites):
    """With CSPRNG noise the seed-knowing attacker subtracts noise that is not there: no better than the canary
    test, and neither beats ε = 1 (two statements at 1 − 5e-4 each: spurious failure ≤ 1e-3)."""
    tr = run(tiny_sites, noise="secret", trials=150, random_state=3)
    for statistic in ("seeded", "release"):
        r = tr.audit(statistic, confidence=1 - 5e-4)  # threshold chosen on 75 pairs, bound on 75
        assert r.verdict == "consistent" and r.epsilon_lower_bound <= 1.0, r
    assert tr.canary_mu <= math.sqrt(tr.releases) / tr.noise_multiplier * (1 + 1e-9)
