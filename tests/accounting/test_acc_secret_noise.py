"""Secret noise by default; seeded noise only behind ``insecure_noise_seed_for_testing``, and then flagged void.

The distinguishing game of issue 14: an adversary who knows both neighbouring data sets and the landmarks
guesses which one produced a release. With the seed known it subtracts the noise and is always right; with
secret noise its best (likelihood-ratio) test is right with probability at most Φ(μ/2), μ = Δ/σ = 1/z
(Dong, Roth & Su 2022, the Gaussian trade-off function at the equal-error point).
"""

import math

import numpy as np
import pytest
from scipy.stats import norm

from securefed.accounting import DataPerturbation, GradientPerturbation, PrivacyLedger, perturb_data
from securefed.errors import ConfigError
from securefed.landmarks import mmd_grad

N_TRIALS = 400


def _game_setup():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(6, 2)) * 0.3
    X2 = X.copy()
    X2[0] = -X[0] / np.linalg.norm(X[0])  # replace-one neighbour, on the τ_X = 1 sphere
    Y = rng.normal(size=(3, 2)) * 0.3
    return X, X2, Y


def _mech(**kw):
    m = GradientPerturbation(noise_multiplier=1.0, tau_x=1.0, **kw)
    m.prepare(
        [np.zeros((6, 2))], gamma=1.0, n_landmarks=3, rounds=N_TRIALS, local_steps=1, rule="gradient", n_clients=1
    )
    return m


def _play(m, adversary_noise=None):
    """Return the adversary's accuracy over N_TRIALS rounds (one release each)."""
    X, X2, Y = _game_setup()
    g0, g1 = mmd_grad(X, Y, 1.0), mmd_grad(X2, Y, 1.0)
    coins = np.random.default_rng(1).integers(0, 2, size=N_TRIALS)  # the challenger's coins (test randomness)
    right = 0
    for r, b in enumerate(coins):
        out = m.perturb(g1 if b else g0, site=0, round=r, step=0)
        if adversary_noise is not None:  # knows the seed: subtracts the noise exactly
            clean = out - adversary_noise.perturb(np.zeros_like(out), site=0, round=r, step=0)
            guess = int(np.linalg.norm(clean - g1) < np.linalg.norm(clean - g0))
        else:  # likelihood-ratio test of N(g0, σ²I) against N(g1, σ²I): the nearer mean
            guess = int(np.linalg.norm(out - g1) < np.linalg.norm(out - g0))
        right += guess == b
    return right / N_TRIALS, np.linalg.norm(g1 - g0) / m.sigma[0]


def test_distinguishing_game_seeded_noise_is_flagged_secret_noise_stays_under_the_claim():
    seeded = _mech(insecure_noise_seed_for_testing=0)
    acc_seeded, _ = _play(seeded, adversary_noise=_mech(insecure_noise_seed_for_testing=0))
    assert acc_seeded == 1.0  # the seed holder always wins: the claimed ε means nothing ...
    rep = seeded.report()
    assert rep["epsilon_void"] is True and "subtract" in rep["epsilon_void_reason"]  # ... and the report says so
    assert {e["noise_source"] for e in seeded.ledger.events("release")} == {"seeded-testing"}

    secret = _mech()
    acc, mu_pair = _play(secret)
    assert mu_pair <= 1.0 + 1e-12  # the pair's shift is within Δ: μ ≤ 1/z = 1
    claim = norm.cdf(1.0 / 2)  # best possible accuracy at μ = 1: Φ(1/2) = 0.691
    # 5 binomial standard deviations: the chance a correct implementation fails this is < 3e-7
    assert acc <= claim + 5 * math.sqrt(claim * (1 - claim) / N_TRIALS)
    assert acc >= norm.cdf(mu_pair / 2) - 5 * 0.5 / math.sqrt(N_TRIALS)  # and the game is not vacuous
    rep = secret.report()
    assert rep["epsilon_void"] is False and rep["epsilon_void_reason"] is None
    assert {e["noise_source"] for e in secret.ledger.events("release")} == {"secure"}
    assert "seed_tag" not in secret.ledger.events("release")[0]


def test_default_noise_is_secret_whatever_the_random_state():
    a, b = _mech(random_state=3), _mech(random_state=3)  # random_state seeds subsampling only
    g = np.zeros((3, 2))
    assert not np.array_equal(a.perturb(g, site=0, round=0, step=0), b.perturb(g, site=0, round=0, step=0))
    c, d = _mech(insecure_noise_seed_for_testing=9), _mech(insecure_noise_seed_for_testing=9)
    np.testing.assert_array_equal(c.perturb(g, site=0, round=0, step=0), d.perturb(g, site=0, round=0, step=0))
    assert a.secure_mode and not c.secure_mode


@pytest.mark.parametrize("bad", [-1, 1.5, "7", True])
def test_testing_seed_must_be_a_non_negative_int(bad):
    with pytest.raises(ConfigError, match="^insecure_noise_seed_for_testing="):
        GradientPerturbation(noise_multiplier=1.0, tau_x=1.0, insecure_noise_seed_for_testing=bad)


def test_secure_mode_is_removed_with_a_typed_error():
    with pytest.raises(ConfigError, match="^secure_mode=False is invalid: .*insecure_noise_seed_for_testing"):
        GradientPerturbation(noise_multiplier=1.0, tau_x=1.0, secure_mode=False)
    GradientPerturbation(noise_multiplier=1.0, tau_x=1.0, secure_mode=True)  # a no-op for old callers


def test_data_perturbation_seeded_release_is_void_in_event_and_ledger():
    led = PrivacyLedger(None, "rows", delta=1e-5)
    X = np.ones((4, 2))
    _, ev = perturb_data(X, 1.0, 1e-5, 2.0, ledger=led, insecure_noise_seed_for_testing=1)
    assert ev.epsilon_void and ev.noise_source == "seeded-testing"
    assert led.events("release")[0]["noise_source"] == "seeded-testing"
    assert led.summary()["epsilon_void"] is True and led.summary()["seeded_testing_releases"] == 1
    dp = DataPerturbation(1.0, 1e-5, tau_x=2.0)
    dp.perturb_site(X, site=0)
    assert dp.events[0].noise_source == "secure" and not dp.report()["epsilon_void"]
