"""AdaCliP (Algorithms 3-4 of Saha et al. 2023)."""

import numpy as np
import pytest

from securefed.errors import ConfigError, DataError
from securefed.peers.adaclip import AdaCliP, adaclip_scale, noise_addition


def test_zero_noise_no_clip_returns_input():
    rng = np.random.default_rng(0)
    mech = AdaCliP((40, 2), sigma=0.0, clip=False, random_state=1)
    for _ in range(20):  # the estimates m, s move; the output must still be the input
        G = rng.normal(scale=rng.uniform(0.01, 100), size=(40, 2))
        out = mech(G)
        np.testing.assert_allclose(out, G, rtol=1e-12, atol=1e-12)
    assert mech.releases == 20
    assert not np.allclose(mech.m, 0.0)


def test_clipping_bounds_transformed_rows():
    rng = np.random.default_rng(3)
    G = rng.normal(scale=50.0, size=(100, 2))
    m = rng.normal(size=(100, 2))
    s = rng.uniform(0.1, 2.0, size=(100, 2))
    b = adaclip_scale(s)
    np.testing.assert_allclose(b[:, 0], np.sqrt(s[:, 0]) * np.sqrt(s.sum(1)))
    out = noise_addition(G, m, b, 0.0, rng)
    norms = np.linalg.norm((out - m) / b, axis=1)
    assert norms.max() <= 1.0 + 1e-12
    assert np.isclose(norms.max(), 1.0)


def test_noise_scale_in_transformed_space():
    rng = np.random.default_rng(4)
    m = np.zeros((5000, 2))
    b = np.full((5000, 2), 3.0)
    G = np.zeros((5000, 2))
    out = noise_addition(G, m, b, 0.7, rng)
    w = (out - m) / b
    # std of 10000 N(0, 0.49) draws: within 4% of 0.7 (~6 standard errors)
    assert abs(w.std() - 0.7) < 0.03
    assert abs(w.mean()) < 0.03


def test_bad_parameters():
    with pytest.raises(ConfigError, match="sigma"):
        AdaCliP((3, 2), sigma=-1.0)
    with pytest.raises(ConfigError, match="beta1"):
        AdaCliP((3, 2), sigma=1.0, beta1=1.0)
    with pytest.raises(ConfigError, match="h1"):
        AdaCliP((3, 2), sigma=1.0, h1=2.0, h2=1.0)
    mech = AdaCliP((3, 2), sigma=1.0)
    with pytest.raises(DataError, match="shape"):
        mech(np.zeros((4, 2)))
    with pytest.raises(DataError):
        mech(np.full((3, 2), np.nan))
