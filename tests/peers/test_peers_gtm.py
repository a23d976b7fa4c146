"""Centralized and distributed GTM (Zhang & Cheung)."""

import numpy as np
import pytest
from sklearn.datasets import make_s_curve

from securefed.errors import ConfigError, DataError
from securefed.peers import PEER_METHODS, CentralizedGTM, DistributedGTM
from securefed.peers.gtm import abstraction_responsibilities, global_moments, kl_local_gtm, local_abstraction

KW = dict(grid=(10, 10), n_rbf=(4, 4), iters=30)


@pytest.fixture(scope="module")
def scurve_sites():
    X, t = make_s_curve(360, noise=0.05, random_state=0)
    parts = np.array_split(np.random.default_rng(0).permutation(len(X)), 3)
    return [X[p] for p in parts], [t[p] for p in parts]


@pytest.mark.parametrize("alpha", [0.0, 1e-2])
def test_em_monotone_on_raw_data(scurve_sites, alpha):
    sites, _ = scurve_sites
    g = CentralizedGTM(alpha=alpha, **KW).fit(sites)
    obj = np.array([h["objective"] for h in g.history_])
    assert np.all(np.diff(obj) >= -1e-8 * np.abs(obj[1:])), np.diff(obj).min()
    assert obj[-1] > obj[0] + 100  # it actually learns
    if alpha == 0.0:
        ll = np.array([h["log_likelihood"] for h in g.history_])
        assert np.all(np.diff(ll) >= -1e-8 * np.abs(ll[1:]))


def test_one_component_per_record_reproduces_centralized(scurve_sites):
    sites, _ = scurve_sites
    c = CentralizedGTM(**KW)
    Ec = c.fit_transform(sites)
    d = DistributedGTM("all", reg_covar=0.0, **KW)
    Ed = d.fit_transform(sites)
    np.testing.assert_allclose(d.beta_, c.beta_, rtol=1e-8)
    np.testing.assert_allclose(d.centres_, c.centres_, rtol=1e-7, atol=1e-9)
    np.testing.assert_allclose(Ed, Ec, atol=1e-8)
    # objective of the modified EM equals the raw log-likelihood objective in this limit
    assert d.history_[-1]["objective"] == pytest.approx(c.history_[-1]["objective"], rel=1e-9)


def test_global_moments_exact():
    rng = np.random.default_rng(2)
    X = rng.normal(size=(200, 4)) @ rng.normal(size=(4, 4))
    parts = [local_abstraction(X[:90], 7, reg_covar=0.0), local_abstraction(X[90:], 11, reg_covar=0.0)]
    counts = np.concatenate([p["counts"] for p in parts])
    mu, cov = global_moments(counts, np.vstack([p["means"] for p in parts]), np.concatenate([p["covs"] for p in parts]))
    np.testing.assert_allclose(mu, X.mean(0), atol=1e-12)
    np.testing.assert_allclose(cov, np.cov(X.T, bias=True), atol=1e-10)
    assert counts.sum() == 200 and len(counts) == 18


def test_kl_eq7_closed_form_and_eq6_invariance():
    rng = np.random.default_rng(3)
    d = 3
    A = rng.normal(size=(d, d))
    S = A @ A.T + 0.1 * np.eye(d)
    mu = rng.normal(size=d)
    y = rng.normal(size=(4, d))
    beta = 2.5
    D = kl_local_gtm(mu[None], S[None], y, beta)
    # generic KL(N(μ0,Σ0) || N(μ1,Σ1))
    S1 = np.eye(d) / beta
    S1i = np.linalg.inv(S1)
    for k in range(4):
        diff = y[k] - mu
        ref = 0.5 * (np.trace(S1i @ S) + diff @ S1i @ diff - d + np.log(np.linalg.det(S1) / np.linalg.det(S)))
        assert D[0, k] == pytest.approx(ref, rel=1e-10)
    R_full = abstraction_responsibilities(D, np.array([5.0]))
    R_quad = abstraction_responsibilities(kl_local_gtm(mu[None], S[None], y, beta, include_constant=False), [5.0])
    np.testing.assert_allclose(R_full, R_quad, rtol=1e-12)
    assert R_full.sum() == pytest.approx(5.0)


def test_granularity_and_report(scurve_sites):
    sites, _ = scurve_sites
    g = PEER_METHODS["gtm"](n_components_per_site=10, **KW).fit(sites)
    rep = g.privacy_report()
    assert [s["components"] for s in rep["sites"]] == [10, 10, 10]
    assert g.embedding_.shape == (360, 2)
    assert np.all(np.abs(g.embedding_) <= 1.0 + 1e-12)
    obj = np.array([h["objective"] for h in g.history_])
    assert np.all(np.diff(obj) >= -1e-8 * np.abs(obj[1:]))
    mode = DistributedGTM(10, projection="mode", **KW).fit(sites).embedding_
    grid = g.latent_grid_
    assert all(any(np.allclose(p, q) for q in grid) for p in mode[:20])


def test_bad_inputs_typed_errors(scurve_sites):
    sites, _ = scurve_sites
    with pytest.raises(ConfigError, match="n_components_per_site"):
        DistributedGTM(500, **KW).fit(sites)
    with pytest.raises(ConfigError, match="n_components_per_site"):
        DistributedGTM(0, **KW).fit(sites)
    with pytest.raises(ConfigError, match="grid"):
        DistributedGTM(10, grid=(1, 5)).fit(sites)
    with pytest.raises(ConfigError, match="projection"):
        CentralizedGTM(projection="median").fit(sites)
    with pytest.raises(DataError):
        DistributedGTM(10, **KW).fit([sites[0], sites[1][:, :2]])
    with pytest.raises(DataError):
        CentralizedGTM(**KW).fit(np.full((10, 3), np.inf))
    with pytest.raises(ConfigError, match="unfitted"):
        CentralizedGTM().transform(sites[0])
