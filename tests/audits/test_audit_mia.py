"""Membership inference on the landmarks: statistics, the leaky configuration, the null case, DP runs."""

import math

import numpy as np
import pytest
from scipy import stats
from sklearn.metrics import roc_auc_score

from securefed.securesum.base import PlainAggregator
from securefed.audits.mia import ShadowConfig, membership_audit, nearest_landmark_score, kde_score
from securefed.audits.stats import (
    auc_from_roc,
    clopper_pearson,
    epsilon_lower_bound,
    gdp_mu_lower_bound,
    roc_from_counts,
)
from securefed.errors import ConfigError, DataError
from securefed.kernels import local_median_sq_dist
from securefed.landmarks import default_lr, fed_dl


# ---------------------------------------------------------------- statistics (closed forms / scipy)


@pytest.mark.parametrize("k,n", [(0, 10), (3, 10), (10, 10), (17, 250), (250, 250)])
def test_clopper_pearson_matches_scipy_exact(k, n):
    lo, hi = clopper_pearson(k, n, 0.95)
    ci = stats.binomtest(k, n).proportion_ci(confidence_level=0.95, method="exact")
    assert math.isclose(float(lo), ci.low, abs_tol=1e-10) and math.isclose(float(hi), ci.high, abs_tol=1e-10)


def test_epsilon_bound_closed_form_for_perfect_attack():
    n = 100
    a = 0.025 ** (1 / n)  # CP lower bound of TPR when tp = n; 1 - a is the upper bound of FPR when fp = 0
    eps, direction = epsilon_lower_bound(n, 0, n, n, delta=0.0)
    assert math.isclose(float(eps), math.log(a / (1 - a)), rel_tol=1e-9)
    eps_d, _ = epsilon_lower_bound(n, 0, n, n, delta=0.1)
    assert math.isclose(float(eps_d), math.log((a - 0.1) / (1 - a)), rel_tol=1e-9)
    mu = gdp_mu_lower_bound(n, 0, n, n)
    assert math.isclose(float(mu), stats.norm.isf(1 - a) - stats.norm.isf(a), rel_tol=1e-9)
    # chance-level attack: no evidence at all
    assert float(epsilon_lower_bound(50, 50, 100, 100)[0]) < 0
    # second direction: an attack that flags almost everyone except members it misses
    e, d = epsilon_lower_bound(np.array([100]), np.array([60]), 100, 100)
    assert d[0] == 1 and e[0] > 0


def test_auc_from_grid_counts_matches_sklearn():
    rng = np.random.default_rng(0)
    sm, sn = -rng.gamma(2.0, 0.5, 300), -rng.gamma(2.5, 0.5, 400)
    grid = np.concatenate([-np.logspace(4, -8, 2048), [0.0]])
    tp = len(sm) - np.searchsorted(np.sort(sm), grid, side="left")
    fp = len(sn) - np.searchsorted(np.sort(sn), grid, side="left")
    auc = auc_from_roc(*roc_from_counts(tp, fp, len(sm), len(sn)))
    ref = roc_auc_score(np.r_[np.ones(300), np.zeros(400)], np.r_[sm, sn])
    assert abs(auc - ref) < 3e-3


def test_scores_closed_forms():
    Y = np.array([[0.0, 0.0], [3.0, 0.0]])
    X = np.array([[1.0, 0.0]])
    assert np.isclose(nearest_landmark_score(X, Y, 0.5)[0], -0.5)
    assert np.isclose(kde_score(X, Y, 0.5)[0], np.log(0.5 * (np.exp(-0.5) + np.exp(-2.0))))


# ---------------------------------------------------------------- the attack on real FedDL landmarks


def _leaky(seed=0, sites=4, n=25, held=50, m=10, n_y=100):
    """No noise, n_y ≥ records per site (here ≥ all members), small sites, a sharp kernel."""
    rng = np.random.default_rng(seed)
    data = [rng.normal(size=(n + held, m)) for _ in range(sites)]
    members, nonmembers = [d[:n] for d in data], [d[n:] for d in data]
    gamma = 4.0 / np.mean([local_median_sq_dist(x) for x in members])
    kw = dict(rounds=100, local_steps=10, lr=default_lr(n_y, gamma, 2.0))
    return members, nonmembers, n_y, gamma, kw


def test_attack_finds_leaky_configuration():
    members, nonmembers, n_y, gamma, kw = _leaky()
    Y = fed_dl(members, n_y, gamma=gamma, random_state=1, **kw).landmarks
    res = membership_audit(
        members,
        nonmembers,
        Y,
        gamma,
        shadow=ShadowConfig(n_runs=2, fed_dl_kwargs=kw),
        aggregator=PlainAggregator(),
        random_state=0,
    )
    assert res.auc >= 0.9
    assert res.empirical_epsilon > 1.0
    assert res.empirical_mu > 0.5
    assert res.n_sites == 4 and res.aggregation == "plain"
    assert set(res.per_score) == {"nearest", "kde", "lira"}
    assert res.shadow["n_runs"] == 2 and res.n_nonmembers < 200  # half the held-out records were the shadow pool
    d = res.to_dict()
    assert d["format"] == "securefed.audits.mia/1" and d["per_score"]["nearest"]["roc"]["fpr"][0] == 0.0


def test_landmarks_equal_to_members_is_the_extreme_case():
    rng = np.random.default_rng(1)
    members = [rng.normal(size=(60, 8)) for _ in range(3)]
    nonmembers = [rng.normal(size=(60, 8)) for _ in range(3)]
    Y = np.vstack(members)
    res = membership_audit(members, nonmembers, Y, 0.1, scores=("nearest", "kde"), random_state=0)
    assert res.auc == pytest.approx(1.0)
    assert res.tpr_at_fpr_1e3 == pytest.approx(1.0)
    P_t = res.n_members - round(res.n_members / 2)  # roughly half on each split: bound close to the closed form
    assert res.empirical_epsilon > math.log(0.025 ** (1 / P_t) / (1 - 0.025 ** (1 / P_t))) - 0.5


def test_null_case_bound_is_valid():
    """Landmarks independent of the members (true ε = 0): the 95 % bound must be ≤ 0 in ≥ ~95 % of runs."""
    positives, aucs = 0, []
    for seed in range(20):
        rng = np.random.default_rng(100 + seed)
        members = [rng.normal(size=(40, 6)) for _ in range(3)]
        nonmembers = [rng.normal(size=(40, 6)) for _ in range(3)]
        Y = rng.normal(size=(30, 6))
        res = membership_audit(members, nonmembers, Y, 0.2, scores=("nearest", "kde"), random_state=seed)
        positives += res.empirical_epsilon > 0
        aucs.append(res.auc)
    assert positives <= 3  # expected ≤ 1 of 20 at 95 %; 3 leaves room for sampling luck, still fails a biased bound
    assert abs(np.mean(aucs) - 0.5) < 0.06


def test_counts_summed_through_aggregator_equal_plain_sum():
    rng = np.random.default_rng(2)
    members = [rng.normal(size=(30, 5)) for _ in range(3)]
    nonmembers = [rng.normal(size=(30, 5)) for _ in range(3)]
    Y = np.vstack([m[:10] for m in members])
    a = membership_audit(members, nonmembers, Y, 0.3, scores=("nearest",), random_state=5)
    b = membership_audit(members, nonmembers, Y, 0.3, scores=("nearest",), random_state=5, aggregator=PlainAggregator())
    assert a.to_dict() == b.to_dict()


def test_bad_inputs_rejected():
    rng = np.random.default_rng(3)
    M, N, Y = [rng.normal(size=(10, 3))], [rng.normal(size=(10, 3))], rng.normal(size=(5, 3))
    with pytest.raises(ConfigError, match="scores"):
        membership_audit(M, N, Y, 1.0, scores=("oracle",))
    with pytest.raises(DataError, match="nonmember_sites"):
        membership_audit(M, N + N, Y, 1.0, scores=("nearest",))
    with pytest.raises(DataError, match="member_sites"):
        membership_audit([rng.normal(size=(10, 4))], N, Y, 1.0, scores=("nearest",))
    with pytest.raises(ConfigError, match="gamma"):
        membership_audit(M, N, Y, -1.0, scores=("nearest",))


def test_dp_landmarks_never_beat_the_accountant():
    """Strong DP (ε = 1) on the leaky configuration: the empirical ε stays ≤ the accountant's over seeded runs."""
    accounting = pytest.importorskip("securefed.accounting")
    GP = getattr(accounting, "GradientPerturbation", None)
    if GP is None:
        pytest.skip("securefed.accounting.GradientPerturbation is not available yet (accounting helper)")
    members, nonmembers, n_y, gamma, kw = _leaky()
    kw.update(rounds=25, local_steps=4)
    # without noise this configuration leaks (so the DP runs below are a real test, not a vacuous one)
    Y0 = fed_dl(members, n_y, gamma=gamma, random_state=0, **kw).landmarks
    leak = membership_audit(members, nonmembers, Y0, gamma, scores=("nearest", "kde"), random_state=0)
    assert leak.auc > 0.8 and leak.empirical_epsilon > 1.0
    for seed in range(4):
        priv = GP(epsilon=1.0, delta=1e-5, tau_x=5.0, secure_mode=True)
        run = fed_dl(members, n_y, gamma=gamma, privacy=priv, random_state=seed, **kw)
        Y, claimed = run.landmarks, run.privacy["epsilon"]
        assert claimed <= 1.0 + 1e-9
        res = membership_audit(members, nonmembers, Y, gamma, scores=("nearest", "kde"), delta=1e-5, random_state=seed)
        assert res.empirical_epsilon <= claimed
