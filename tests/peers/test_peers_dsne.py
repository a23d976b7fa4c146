"""dSNE / F-dSNE / DP-dSNE (Saha et al. 2023)."""

import dp_accounting
import numpy as np
import openTSNE
import pytest
import scipy.sparse as sp
from sklearn.datasets import load_digits

from securefed.errors import ConfigError, DataError
from securefed.metrics import classification_accuracy
from securefed.peers import PEER_METHODS, FedDSNE, default_reference
from securefed.peers.dsne import kl_divergence, kl_gradient
from securefed.peers.privacy import calibrate_noise_multiplier


@pytest.fixture(scope="module")
def digits_split():
    X, y = load_digits(return_X_y=True)
    idx = np.random.default_rng(0).permutation(len(X))[:540]
    return X, y, idx[:360], idx[360:]


def test_gradient_matches_finite_differences():
    rng = np.random.default_rng(5)
    n = 30
    A = rng.uniform(size=(n, n))
    A = A + A.T
    np.fill_diagonal(A, 0)
    P = sp.csr_matrix(A / A.sum())
    Y = rng.normal(size=(n, 2))
    g = kl_gradient(P, Y)
    eps = 1e-5
    num = np.zeros_like(Y)
    for i in range(n):
        for c in range(2):
            Yp, Ym = Y.copy(), Y.copy()
            Yp[i, c] += eps
            Ym[i, c] -= eps
            num[i, c] = (kl_divergence(P, Yp) - kl_divergence(P, Ym)) / (2 * eps)
    # float32 repulsion: agreement to ~1e-5 relative
    np.testing.assert_allclose(g, num, rtol=2e-3, atol=2e-5)


def test_one_site_no_noise_matches_plain_tsne(digits_split):
    X, y, loc, ref = digits_split
    m = FedDSNE(rounds=450, early_exaggeration_iter=150, reference=X[ref], random_state=0).fit([X[loc]])
    E = np.vstack([m.embedding_, m.reference_embedding_])
    yy = np.r_[y[loc], y[ref]]
    ca = classification_accuracy(E, yy, ks=(10,), random_state=0)[10]
    E_ot = np.asarray(
        openTSNE.TSNE(random_state=0, n_jobs=1, n_iter=300, early_exaggeration_iter=150).fit(
            np.vstack([X[loc], X[ref]])
        )
    )
    ca_ot = classification_accuracy(E_ot, yy, ks=(10,), random_state=0)[10]
    assert ca > 0.9
    assert ca >= ca_ot - 0.03, (ca, ca_ot)
    assert m.epsilon_ is None and m.releases_ == 450
    # KL decreases over the run
    assert m.history_[-1]["kl"] < m.history_[0]["kl"]


def test_private_variants_account_epsilon(digits_split):
    X, y, loc, ref = digits_split
    sites = [X[loc[:180]], X[loc[180:]]]
    dp = PEER_METHODS["dp-dsne"](random_state=0, rounds=40, reference=X[ref], noise_seed=1).fit(sites)
    fd = PEER_METHODS["fdsne"](random_state=0, rounds=4, local_iters=10, reference=X[ref], noise_seed=1).fit(sites)
    assert dp.releases_ == 40 and fd.releases_ == 4
    assert np.all(np.isfinite(dp.embedding_)) and np.all(np.isfinite(fd.embedding_))
    assert dp.embedding_.shape == (360, 2)
    n_s = len(ref)
    assert dp.record_noise_multiplier_ == pytest.approx(1.0 / (2 * np.sqrt(n_s)))
    assert dp.epsilon_ == pytest.approx(_rdp_epsilon(1.0 / (2 * np.sqrt(n_s)), 40, 1e-5), rel=1e-3)
    assert fd.epsilon_ < dp.epsilon_  # 10x fewer releases, same noise
    assert fd.epsilon_per_row_ < fd.epsilon_  # row-level unit is far weaker than a record
    assert fd.delta_ == 1e-5


def _rdp_epsilon(z, releases, delta):
    acc = dp_accounting.rdp.RdpAccountant()  # not the Opacus RDP code securefed.peers uses
    acc.compose(dp_accounting.GaussianDpEvent(z), releases)
    return acc.get_epsilon(delta)


def test_epsilon_target_calibration():
    z = calibrate_noise_multiplier(1.0, 75, 1e-5)
    assert _rdp_epsilon(z, 75, 1e-5) == pytest.approx(1.0, rel=1e-3)  # tight: no more noise than needed
    assert _rdp_epsilon(z * 0.99, 75, 1e-5) > 1.0
    # Gaussian mechanism closed-form sanity: one release needs z ≈ sqrt(2 ln(1.25/δ))/ε up to RDP slack.
    z1 = calibrate_noise_multiplier(1.0, 1, 1e-5)
    assert 3.0 < z1 < np.sqrt(2 * np.log(1.25 / 1e-5)) + 0.5


def test_default_reference_is_held_out():
    X, _ = load_digits(return_X_y=True)
    sites = [X[:300], X[300:600]]
    R = default_reference(sites, "digits", n_reference=200, random_state=0)
    used = {r.tobytes() for r in X[:600]}
    assert R.shape == (200, 64)
    assert not any(r.tobytes() in used for r in R)
    with pytest.raises(DataError, match="features"):
        default_reference(sites, "iris")


def test_bad_inputs_typed_errors(digits_split):
    X, y, loc, ref = digits_split
    with pytest.raises(ConfigError, match="reference"):
        FedDSNE().fit([X[loc]])
    with pytest.raises(DataError):
        FedDSNE(reference=X[ref][:, :10]).fit([X[loc]])
    bad = X[loc].copy()
    bad[3, 3] = np.nan
    with pytest.raises(DataError):
        FedDSNE(reference=X[ref]).fit([bad])
    with pytest.raises(ConfigError, match="noise_multiplier"):
        FedDSNE(reference=X[ref], noise="adaclip").fit([X[loc]])
    with pytest.raises(ConfigError, match="noise"):
        FedDSNE(reference=X[ref], noise="laplace", noise_multiplier=1.0).fit([X[loc]])
    with pytest.raises(ConfigError, match="local_iters"):
        FedDSNE(reference=X[ref], local_iters=0).fit([X[loc]])
    with pytest.raises(ConfigError, match="adaclip_params"):
        FedDSNE(reference=X[ref], noise="adaclip", noise_multiplier=1.0, adaclip_params={"gamma": 1}).fit([X[loc]])
    with pytest.raises(ConfigError, match="perplexity"):
        FedDSNE(reference=X[ref][:5], perplexity=30).fit([X[loc][:5]])


def test_ledger_records_each_release_and_enforces_budget(digits_split, tmp_path):
    from securefed.accounting import PrivacyLedger
    from securefed.errors import BudgetExceededError

    X, y, loc, ref = digits_split
    sites = [X[loc[:180]], X[loc[180:]]]
    led = PrivacyLedger(tmp_path / "l.jsonl", "peers-test", accountant="rdp")
    m = FedDSNE(rounds=3, noise="adaclip", noise_multiplier=50.0, reference=X[ref], ledger=led, noise_seed=0).fit(sites)
    ev = led.events("release")
    assert len(ev) == 6 and sorted(led.sites()) == [0, 1]
    assert led.spent(0)[0] == pytest.approx(m.epsilon_, rel=1e-6)
    tight = PrivacyLedger(tmp_path / "t.jsonl", "peers-tight", budget_epsilon=m.epsilon_ * 0.5, accountant="rdp")
    with pytest.raises(BudgetExceededError):
        FedDSNE(rounds=3, noise="adaclip", noise_multiplier=50.0, reference=X[ref], ledger=tight, noise_seed=0).fit(
            sites
        )
