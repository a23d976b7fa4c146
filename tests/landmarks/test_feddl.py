"""FedDL (Qiao et al. Algorithm 1): MMD (Eq. 9/10), its gradient (Eq. 13), the server rules (Eqs. 15, 16),
weights, checkpoint resume, the default step size and every bad input."""

import math
import os
import warnings

import numpy as np
import pytest

from securefed.data import load_dataset, partition
from securefed.errors import ConfigError, DataError, SecureFedError
from securefed.landmarks import (
    default_lr,
    fed_dl,
    init_landmarks,
    mmd,
    mmd_grad,
)


def resolve_weights(rule, sizes):
    """The normalised weights of a public rule (each site applies its own: its record count, or 1)."""
    w = np.asarray(sizes, float) if rule == "records" else np.ones(len(sizes))
    return w / w.sum()


pytestmark = pytest.mark.usefixtures("single_blas_thread")


def _rng(seed):
    return np.random.default_rng(seed)


# ----------------------------------------------------------------------------------------------
# Eq. (9): brute-force double loop
# ----------------------------------------------------------------------------------------------


def _mmd_brute(X, Y, gamma):
    """Eq. (9) of Qiao et al. written as the literal double sums, in pure Python."""

    def k(a, b):
        return math.exp(-gamma * sum((ai - bi) ** 2 for ai, bi in zip(a, b)))

    n_p, n_y = len(X), len(Y)
    t1 = sum(k(X[i], X[j]) for i in range(n_p) for j in range(n_p) if j != i) / (n_p * (n_p - 1))
    t2 = sum(k(X[i], Y[j]) for i in range(n_p) for j in range(n_y)) * 2.0 / (n_p * n_y)
    t3 = sum(k(Y[i], Y[j]) for i in range(n_y) for j in range(n_y) if j != i) / (n_y * (n_y - 1))
    return t1 - t2 + t3


@pytest.mark.parametrize(
    "n_p, n_y, m, gamma, seed",
    [(2, 2, 1, 1.0, 0), (7, 3, 2, 0.3, 1), (12, 5, 4, 2.0, 2), (9, 9, 6, 0.05, 3), (15, 4, 3, 10.0, 4)],
)
def test_mmd_equals_bruteforce_double_loop(n_p, n_y, m, gamma, seed):
    rng = _rng(seed)
    X = rng.normal(size=(n_p, m))
    Y = rng.normal(0.5, 1.3, size=(n_y, m))
    expected = _mmd_brute(X.tolist(), Y.tolist(), gamma)
    assert mmd(X, Y, gamma) == pytest.approx(expected, rel=1e-12, abs=1e-14)


def test_mmd_closed_forms_identical_and_far_apart_samples():
    # X against itself: t1 = t3 = (S - n)/(n(n-1)), t2 = 2S/n², so MMD = 2(S - n²)/(n²(n-1)) < 0 (S = 1ᵀK1)
    rng = _rng(5)
    X = rng.normal(size=(10, 2))
    n, S = len(X), float(np.exp(-0.5 * ((X[:, None, :] - X[None, :, :]) ** 2).sum(-1)).sum())
    assert mmd(X, X, 0.5) == pytest.approx(2 * (S - n * n) / (n * n * (n - 1)), rel=1e-12)
    assert mmd(X, X, 0.5) < 0
    # far apart: the cross term vanishes and MMD = t1 + t3 = 2 (S - n)/(n(n-1))
    assert mmd(X, X + 100.0, 0.5) == pytest.approx(2 * (S - n) / (n * (n - 1)), rel=1e-12)


# ----------------------------------------------------------------------------------------------
# Eq. (13): gradient vs central finite differences
# ----------------------------------------------------------------------------------------------


def _fd_grad(X, Y, gamma, h=1e-5):
    G = np.zeros_like(Y)
    for i in range(Y.shape[0]):
        for j in range(Y.shape[1]):
            Yp, Ym = Y.copy(), Y.copy()
            Yp[i, j] += h
            Ym[i, j] -= h
            G[i, j] = (mmd(X, Yp, gamma) - mmd(X, Ym, gamma)) / (2 * h)
    return G


@pytest.mark.parametrize(
    "n_p, n_y, m, gamma, seed",
    [(5, 2, 1, 1.0, 10), (20, 7, 3, 0.5, 11), (13, 4, 10, 0.05, 12), (30, 6, 2, 3.0, 13), (8, 12, 5, 0.2, 14)],
)
def test_mmd_grad_matches_central_finite_differences(n_p, n_y, m, gamma, seed):
    rng = _rng(seed)
    X = rng.normal(size=(n_p, m))
    Y = rng.normal(0.3, 1.0, size=(n_y, m))
    g = mmd_grad(X, Y, gamma)
    fd = _fd_grad(X, Y, gamma)
    assert g.shape == Y.shape and g.dtype == np.float64
    scale = max(np.abs(fd).max(), 1e-3)
    np.testing.assert_allclose(g, fd, rtol=1e-6, atol=1e-7 * scale)


def test_mmd_grad_n_norm_is_the_record_count_normaliser():
    rng = _rng(20)
    X = rng.normal(size=(11, 3))
    Y = rng.normal(size=(5, 3))
    g = mmd_grad(X, Y, 0.4)
    np.testing.assert_array_equal(mmd_grad(X, Y, 0.4, n_norm=len(X)), g)
    # duplicating every record and normalising by the doubled count leaves the gradient unchanged
    np.testing.assert_allclose(mmd_grad(np.vstack([X, X]), Y, 0.4, n_norm=2 * len(X)), g, rtol=1e-12, atol=1e-15)
    # the gradient is affine in 1/n_norm: check three normalisers are collinear
    g2, g3 = mmd_grad(X, Y, 0.4, n_norm=22.0), mmd_grad(X, Y, 0.4, n_norm=44.0)
    # g(n) = A/n + R  =>  g(11) - g(22) = 2 (g(22) - g(44))
    np.testing.assert_allclose(g - g2, 2.0 * (g2 - g3), rtol=1e-10, atol=1e-14)


# ----------------------------------------------------------------------------------------------
# Algorithm 1: server rules
# ----------------------------------------------------------------------------------------------


def test_one_site_model_averaging_q1_equals_centralized_gradient_descent():
    rng = _rng(30)
    X = rng.normal(size=(40, 3))
    Y0 = rng.normal(size=(6, 3))
    gamma, lr, S = 0.7, 0.9, 12
    seen = []
    res = fed_dl(
        [X],
        6,
        rounds=S,
        local_steps=1,
        rule="model",
        lr=lr,
        gamma=gamma,
        init=Y0,
        random_state=0,
        callback=lambda s, Y, v: seen.append((s, Y.copy(), v)),
    )
    Y = Y0.copy()
    assert [s for s, _, _ in seen] == list(range(1, S + 1))
    for s, Yfed, val in seen:
        # the callback's MMD is that of the landmarks the round started from (the sites report it with their upload)
        assert val == pytest.approx(mmd(X, Y, gamma), rel=1e-12, abs=1e-15)
        Y = Y - lr * mmd_grad(X, Y, gamma)
        np.testing.assert_allclose(Yfed, Y, rtol=1e-13, atol=1e-14, err_msg=f"round {s}")
    assert res.mmd_history == pytest.approx([v for _, _, v in seen], rel=1e-15)
    np.testing.assert_allclose(res.landmarks, Y, rtol=1e-13, atol=1e-14)
    assert res.rounds_done == S and res.gamma == gamma and res.lr == lr and len(res.mmd_history) == S


@pytest.mark.parametrize("weights", ["records", "uniform"])
def test_model_averaging_q1_equals_gradient_averaging_same_lr(blob_sites, weights):
    Y0 = _rng(31).normal(size=(7, 3))
    kw = dict(rounds=9, local_steps=1, lr=1.3, gamma=0.4, init=Y0, weights=weights, random_state=0)
    a = fed_dl(blob_sites, 7, rule="model", **kw)
    b = fed_dl(blob_sites, 7, rule="gradient", **kw)
    np.testing.assert_allclose(a.landmarks, b.landmarks, rtol=1e-11, atol=1e-12)
    np.testing.assert_allclose(a.mmd_history, b.mmd_history, rtol=1e-10, atol=1e-13)
    # and a hand-written weighted step, Eq. (16): Y ← Y − η Σ ω_p ∇f_p / Σ ω_p
    w = resolve_weights(weights, [len(X) for X in blob_sites])
    Y = Y0.copy()
    for _ in range(9):
        Y = Y - 1.3 * sum(wp * mmd_grad(X, Y, 0.4) for wp, X in zip(w, blob_sites))
    np.testing.assert_allclose(a.landmarks, Y, rtol=1e-11, atol=1e-12)


def test_gradient_averaging_q_steps_per_round_equal_q1_rounds(blob_sites):
    Y0 = _rng(32).normal(size=(5, 3))
    kw = dict(lr=0.8, gamma=0.6, init=Y0, random_state=0, rule="gradient")
    a = fed_dl(blob_sites, 5, rounds=4, local_steps=3, **kw)
    b = fed_dl(blob_sites, 5, rounds=12, local_steps=1, **kw)
    np.testing.assert_allclose(a.landmarks, b.landmarks, rtol=1e-12, atol=1e-13)
    assert a.aggregation["aggregations"] == 12  # every step of gradient averaging is an upload


def test_model_averaging_with_local_steps_matches_hand_computation(blob_sites):
    Y0 = _rng(33).normal(size=(5, 3))
    Q, lr, g = 3, 0.5, 0.3
    res = fed_dl(blob_sites, 5, rounds=2, local_steps=Q, lr=lr, gamma=g, init=Y0, weights="uniform", random_state=0)
    Y = Y0.copy()
    for _ in range(2):
        ups = []
        for X in blob_sites:
            Yp = Y.copy()
            for _ in range(Q):
                Yp = Yp - lr * mmd_grad(X, Yp, g)
            ups.append(Yp)
        Y = np.mean(ups, axis=0)  # Eq. (15), ω_p = 1/P
    np.testing.assert_allclose(res.landmarks, Y, rtol=1e-12, atol=1e-13)
    assert res.aggregation["aggregations"] == 2  # model averaging: one upload per round


# ----------------------------------------------------------------------------------------------
# weights
# ----------------------------------------------------------------------------------------------


def test_weights_are_a_public_rule_never_numbers_the_coordinator_chose(blob_sites):
    """Each site weighs its own upload by its record count or by 1; numeric weights would let the coordinator
    weigh every site but one by 0 and read that site's update from the "sum" (refused)."""
    Y0 = _rng(34).normal(size=(6, 3))
    kw = dict(rounds=5, local_steps=2, lr=0.7, gamma=0.5, init=Y0, random_state=0)
    a = fed_dl(blob_sites, 6, weights="records", **kw)
    u = fed_dl(blob_sites, 6, weights="uniform", **kw)
    assert not np.allclose(a.landmarks, u.landmarks)  # the sites differ in size, so the rule matters
    for bad in ([1.0, 0.0, 0.0], [len(X) for X in blob_sites]):
        with pytest.raises(ConfigError, match="^weights=.*public rule"):
            fed_dl(blob_sites, 6, weights=bad, **kw)


# ----------------------------------------------------------------------------------------------
# checkpoint resume
# ----------------------------------------------------------------------------------------------


def test_checkpoint_resume_equals_uninterrupted_run(tmp_path):
    ds = load_dataset("wine")
    sites = [ds.X[i] for i in partition(ds.X, ds.y, 3, "iid", random_state=0)]
    ck = str(tmp_path / "ck.npz")
    kw = dict(local_steps=3, random_state=0)
    first = fed_dl(sites, 20, rounds=10, checkpoint=ck, **kw)
    assert os.path.exists(ck) and first.rounds_done == 10 and len(first.mmd_history) == 10
    rounds_seen = []
    resumed = fed_dl(sites, 20, rounds=20, checkpoint=ck, callback=lambda s, Y, v: rounds_seen.append(s), **kw)
    assert rounds_seen == list(range(11, 21))  # only the missing rounds ran
    full = fed_dl(sites, 20, rounds=20, **kw)
    np.testing.assert_array_equal(resumed.landmarks, full.landmarks)
    assert resumed.mmd_history == full.mmd_history
    assert resumed.gamma == full.gamma and resumed.lr == full.lr and resumed.rounds_done == 20
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]  # atomic write left no temp file


def test_checkpoint_from_other_parameters_is_refused(tmp_path, blob_sites):
    ck = str(tmp_path / "ck.npz")
    fed_dl(blob_sites, 5, rounds=4, local_steps=2, gamma=0.5, checkpoint=ck, random_state=0)
    with pytest.raises(ConfigError, match="checkpoint"):
        fed_dl(blob_sites, 5, rounds=4, local_steps=2, gamma=3.0, checkpoint=ck, random_state=1)


def test_checkpoint_with_more_rounds_than_asked_is_not_mislabelled(tmp_path, blob_sites):
    ck = str(tmp_path / "ck.npz")
    fed_dl(blob_sites, 5, rounds=8, local_steps=1, gamma=0.5, checkpoint=ck, random_state=0)
    try:
        res = fed_dl(blob_sites, 5, rounds=3, local_steps=1, gamma=0.5, checkpoint=ck, random_state=0)
    except ConfigError:
        return  # refusing is an acceptable fix
    assert res.rounds_done == len(res.mmd_history)


# ----------------------------------------------------------------------------------------------
# default step size: converges without tuning on the bundled data (raw scales)
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["iris", "wine", "breast_cancer", "digits"])
def test_default_lr_decreases_weighted_mmd_on_bundled_data(name):
    ds = load_dataset(name)  # raw feature scales: no standardization
    parts = partition(ds.X, ds.y, 5, "label", random_state=0)
    sites = [ds.X[i] for i in parts]
    n_y, X = 40, ds.X
    rng = _rng(0)
    Y0 = init_landmarks(n_y, X.shape[1], mean=X.mean(axis=0), std=X.std(axis=0), rng=rng)
    res = fed_dl(sites, n_y, rounds=30, local_steps=5, init=Y0, random_state=0)  # lr="auto", γ by the median rule
    assert res.lr == pytest.approx(default_lr(n_y, res.gamma))
    w = resolve_weights("records", [len(S) for S in sites])

    def f(Y):
        return sum(wp * mmd(S, Y, res.gamma) for wp, S in zip(w, sites))

    # floor: landmarks drawn from the pooled data itself (what a perfect fit achieves, roughly)
    floor = float(np.mean([f(X[_rng(s).choice(len(X), n_y, replace=False)]) for s in range(3)]))
    h = np.asarray(res.mmd_history)
    initial_excess = f(Y0) - floor
    assert initial_excess > 0
    final_excess = h[-1] - floor
    assert final_excess < 0.5 * initial_excess, (name, f(Y0), h[-1], floor)
    # monotone-ish: at most 10 % of rounds go up, and never by more than 1 % of the initial excess
    ups = np.diff(np.concatenate([[f(Y0)], h]))
    assert (ups > 0).sum() <= 0.1 * len(h), (name, ups)
    assert ups.max() <= 0.01 * initial_excess, (name, ups.max())


def test_default_lr_formula():
    assert default_lr(100, 0.5) == pytest.approx(0.5 * 100 / (4 * 0.5))
    assert default_lr(10, 2.0, scale=1.0) == pytest.approx(10 / 8)
    with pytest.raises(ConfigError, match="gamma"):
        default_lr(10, 0.0)


# ----------------------------------------------------------------------------------------------
# divergence and bad input
# ----------------------------------------------------------------------------------------------


def test_divergence_with_huge_lr_raises_config_error(blob_sites):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        with pytest.raises(ConfigError, match=r"^lr=.*diverged"):
            fed_dl(blob_sites, 5, rounds=5, local_steps=2, lr=1e300, gamma=0.5, random_state=0)


def test_finite_divergence_with_large_lr_is_detected():
    rng = _rng(40)
    sites = [rng.normal(size=(40, 3)), rng.normal(size=(30, 3)) + 1.0]
    with pytest.raises(ConfigError, match="lr"):
        fed_dl(sites, 10, rounds=10, local_steps=2, lr=1000 * default_lr(10, 0.5), gamma=0.5, random_state=0)


def _sites(rng, sizes=(10, 12), m=3):
    return [rng.normal(size=(n, m)) for n in sizes]


BAD_INPUTS = [
    # (description, sites builder, kwargs, error type, parameter named in the message)
    ("nan", lambda r: [r.normal(size=(10, 3)), np.where(np.eye(12, 3) > 0, np.nan, 0.0)], {}, DataError, r"sites\[1\]"),
    ("inf", lambda r: [np.full((5, 3), np.inf), r.normal(size=(10, 3))], {}, DataError, r"sites\[0\]"),
    ("feature counts", lambda r: [r.normal(size=(10, 3)), r.normal(size=(10, 4))], {}, DataError, r"sites\[1\]"),
    ("one record", lambda r: [r.normal(size=(10, 3)), r.normal(size=(1, 3))], {}, DataError, r"sites\[1\]"),
    ("empty site", lambda r: [r.normal(size=(10, 3)), np.zeros((0, 3))], {}, DataError, r"sites\[1\]"),
    ("empty list", lambda r: [], {}, DataError, r"^sites="),
    ("not a list", lambda r: r.normal(size=(10, 3)), {}, DataError, r"^sites="),
    ("1-D site", lambda r: [r.normal(size=10)], {}, DataError, r"sites\[0\]"),
    ("one landmark", lambda r: _sites(r), {"n_landmarks": 1}, ConfigError, r"^n_landmarks=1"),
    ("zero landmarks", lambda r: _sites(r), {"n_landmarks": 0}, ConfigError, r"^n_landmarks=0"),
    ("float landmarks", lambda r: _sites(r), {"n_landmarks": 2.5}, ConfigError, r"^n_landmarks="),
    ("rounds", lambda r: _sites(r), {"rounds": 0}, ConfigError, r"^rounds=0"),
    ("local steps", lambda r: _sites(r), {"local_steps": -1}, ConfigError, r"^local_steps=-1"),
    ("rule", lambda r: _sites(r), {"rule": "median"}, ConfigError, r"^rule='median'"),
    ("weights string", lambda r: _sites(r), {"weights": "size"}, ConfigError, r"^weights='size'"),
    ("weights numbers", lambda r: _sites(r), {"weights": [1.0, 0.0]}, ConfigError, r"^weights="),
    ("lr string", lambda r: _sites(r), {"lr": "fast"}, ConfigError, r"^lr='fast'"),
    ("lr negative", lambda r: _sites(r), {"lr": -0.1}, ConfigError, r"^lr="),
    ("gamma", lambda r: _sites(r), {"gamma": -1.0}, ConfigError, r"^gamma=-1.0"),
    ("gamma nan", lambda r: _sites(r), {"gamma": float("nan")}, ConfigError, r"^gamma="),
    ("init string", lambda r: _sites(r), {"init": "kmeans"}, ConfigError, r"^init='kmeans'"),
    ("init shape", lambda r: _sites(r), {"init": np.zeros((4, 3))}, ConfigError, r"^init="),
    ("init nan", lambda r: _sites(r), {"init": np.full((5, 3), np.nan)}, ConfigError, r"^init="),
]


@pytest.mark.parametrize("desc, build, kwargs, exc, param", BAD_INPUTS, ids=[b[0] for b in BAD_INPUTS])
def test_bad_input_gives_typed_error_naming_the_parameter(desc, build, kwargs, exc, param):
    sites = build(_rng(50))
    kw = {"n_landmarks": 5, "rounds": 2, "local_steps": 1, "random_state": 0}
    kw.update(kwargs)
    n_y = kw.pop("n_landmarks")
    with pytest.raises(exc, match=param) as info:
        fed_dl(sites, n_y, **kw)
    assert isinstance(info.value, SecureFedError)
    msg = str(info.value)
    assert "is invalid:" in msg and "\n" not in msg  # house style: parameter=value is invalid: fix, one line


def test_constant_data_has_no_median_bandwidth():
    with pytest.raises(ConfigError, match="median squared distance"):
        fed_dl([np.ones((5, 2)), np.ones((4, 2))], 3, rounds=1, random_state=0)


def test_mmd_functions_reject_fewer_than_two_landmarks_or_records():
    X = _rng(60).normal(size=(6, 2))
    with pytest.raises(ConfigError, match="^n_landmarks=1"):
        mmd(X, X[:1], 0.5)
    with pytest.raises(ConfigError, match="^n_landmarks=1"):
        mmd_grad(X, X[:1], 0.5)
    with pytest.raises(DataError, match="^n_records=1"):
        mmd(X[:1], X, 0.5)
    with pytest.raises(ConfigError, match="^gamma="):
        mmd(X, X, 0.0)
