"""Perplexity calibration (Eq. 1 / Algorithm 1 of Saha et al. 2023)."""

import numpy as np
import pytest

from securefed.errors import ConfigError, DataError
from securefed.peers.affinities import calibrate_perplexity, knn_affinities, row_entropies


@pytest.mark.parametrize("perplexity", [2.5, 10.0, 30.0, 60.0])
def test_calibration_hits_target_entropy(perplexity):
    rng = np.random.default_rng(int(perplexity * 10))
    X = rng.normal(size=(400, 8)) * rng.uniform(0.1, 5.0, size=8)
    d2 = ((X[:, None, :] - X[None, :, :]) ** 2).sum(-1)
    d2 = d2[~np.eye(len(X), dtype=bool)].reshape(len(X), -1)
    P, beta = calibrate_perplexity(d2, perplexity)
    H = row_entropies(P)
    assert np.max(np.abs(H - np.log(perplexity))) < 1e-5
    assert np.allclose(P.sum(axis=1), 1.0)
    # Eq. (1) by hand for one row with the returned precision.
    i = 7
    w = np.exp(-beta[i] * d2[i])
    assert np.allclose(P[i], w / w.sum(), rtol=1e-9, atol=1e-15)


def test_knn_affinities_joint_properties():
    rng = np.random.default_rng(1)
    X = np.vstack([rng.normal(size=(150, 5)), rng.normal(size=(150, 5)) + 6])
    P = knn_affinities(X, perplexity=20)
    assert abs(P.sum() - 1.0) < 1e-12
    assert abs(P - P.T).max() < 1e-15
    assert P.diagonal().max() == 0
    # Each point's mass stays almost entirely within its own cluster.
    within = P[:150, :150].sum() + P[150:, 150:].sum()
    assert within > 0.999


def test_bad_perplexity_and_data():
    X = np.random.default_rng(0).normal(size=(50, 3))
    with pytest.raises(ConfigError, match="perplexity"):
        knn_affinities(X, perplexity=60)
    with pytest.raises(DataError):
        knn_affinities(X[:2], perplexity=1.5)
    with pytest.raises(ConfigError, match="perplexity"):
        calibrate_perplexity(np.ones((5, 4)), 4.0)
