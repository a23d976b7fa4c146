"""Δ never exceeded by the empirical sensitivity of random and adversarial neighbouring datasets."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from securefed.accounting import clip_records, gradient_sensitivity, project_spectral
from securefed.accounting.bounds import default_tau_x
from securefed.accounting.sensitivity import kernel_shape_peak
from securefed.errors import ConfigError
from securefed.landmarks import mmd_grad


def _unit(rng, m):
    v = rng.normal(size=m)
    return v / np.linalg.norm(v)


def _setup(rng, n, ny, m, tau_x, tau_y, mode):
    X, _ = clip_records(rng.normal(size=(n, m)) * tau_x, tau_x)
    Y = project_spectral(rng.normal(size=(ny, m)) * tau_y, tau_y)
    return X, Y


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**31),
    n=st.integers(2, 30),
    ny=st.integers(2, 12),
    m=st.integers(1, 6),
    log_gamma=st.floats(-3, 2),
    tau_x=st.floats(0.05, 5),
    tau_y_f=st.floats(0.1, 3),
    mode=st.sampled_from(["random", "boundary", "antipodal", "peak"]),
)
def test_empirical_sensitivity_never_exceeds_delta(seed, n, ny, m, log_gamma, tau_x, tau_y_f, mode):
    rng = np.random.default_rng(seed)
    gamma = 10.0**log_gamma
    tau_y = tau_y_f * tau_x * math.sqrt(ny)
    X, Y = _setup(rng, n, ny, m, tau_x, tau_y, mode)
    d_star = min(1 / math.sqrt(2 * gamma), tau_x)
    if mode == "random":
        x_new = clip_records(rng.normal(size=(1, m)) * 3 * tau_x, tau_x)[0][0]
    elif mode == "boundary":  # both records on the clip sphere
        X[0] = tau_x * _unit(rng, m)
        x_new = tau_x * _unit(rng, m)
    elif mode == "antipodal":  # the kernel-shape worst case: Y = 0, x = −x' at the kernel-maximising distance
        Y = np.zeros_like(Y)
        u = _unit(rng, m)
        X[0], x_new = d_star * u, -d_star * u
    else:  # landmarks placed at the kernel-maximising distance from the removed record
        u = _unit(rng, m)
        X[0] = tau_x * u
        x_new = -tau_x * u
        Y = np.tile(X[0] + (1 / math.sqrt(2 * gamma)) * _unit(rng, m), (ny, 1))
        Y = project_spectral(Y, tau_y)
    X2 = X.copy()
    X2[0] = x_new
    change = np.linalg.norm(mmd_grad(X, Y, gamma) - mmd_grad(X2, Y, gamma))
    s = gradient_sensitivity(n, ny, gamma, tau_x, tau_y)
    for bound in (s.value, s.theorem5, s.kernel_shape, s.lipschitz):
        assert change <= bound * (1 + 1e-9) + 1e-15, (mode, change, s)
    assert s.value <= s.theorem5
    if mode == "antipodal":  # the change is exactly 8γ√n_y d* e^{−γd*²}/(n n_y) ...
        expect = 8 * gamma * math.sqrt(ny) / (n * ny) * d_star * math.exp(-gamma * d_star**2)
        assert math.isclose(change, expect, rel_tol=1e-6)
        if 1 / math.sqrt(2 * gamma) <= tau_x:  # ... so the kernel-shape bound is attained: it is tight
            assert math.isclose(change, s.kernel_shape, rel_tol=1e-6)


@settings(max_examples=30, deadline=None)
@given(
    seed=st.integers(0, 2**31),
    n=st.integers(2, 30),
    ny=st.integers(2, 10),
    m=st.integers(1, 5),
    log_gamma=st.floats(-2, 1.5),
    tau_x=st.floats(0.1, 4),
)
def test_add_remove_sensitivity_with_fixed_normaliser(seed, n, ny, m, log_gamma, tau_x):
    """Subsampled steps: adding one record to a batch with the fixed normaliser q·n."""
    rng = np.random.default_rng(seed)
    gamma = 10.0**log_gamma
    tau_y = math.sqrt(ny) * tau_x
    X, Y = _setup(rng, n, ny, m, tau_x, tau_y, "random")
    u = _unit(rng, m)
    extra = (min(tau_x, 1 / math.sqrt(2 * gamma)) * u)[None, :]
    if seed % 2:
        Y = np.zeros_like(Y)
    n_norm = 0.3 * (n + 1)
    change = np.linalg.norm(
        mmd_grad(X, Y, gamma, n_norm=n_norm) - mmd_grad(np.vstack([X, extra]), Y, gamma, n_norm=n_norm)
    )
    s = gradient_sensitivity(n_norm, ny, gamma, tau_x, tau_y, adjacency="add_remove")
    assert change <= s.value * (1 + 1e-9)


@settings(max_examples=100, deadline=None)
@given(
    n=st.integers(1, 10**6),
    ny=st.integers(1, 1000),
    log_gamma=st.floats(-6, 4),
    tau_x=st.floats(1e-3, 1e3),
    tau_y=st.floats(1e-3, 1e4),
)
def test_bound_relations(n, ny, log_gamma, tau_x, tau_y):
    g = 10.0**log_gamma
    s = gradient_sensitivity(n, ny, g, tau_x, tau_y, y_domain="ball")
    assert s.lipschitz <= s.theorem5 * (1 + 1e-12)
    assert s.value == min(s.lipschitz, s.kernel_shape, s.theorem5)
    assert s.upsilon == tau_x + tau_y
    a = gradient_sensitivity(n, ny, g, tau_x, tau_y)  # y_domain="any": valid at every Y, never below "ball"
    assert a.upsilon == math.inf and a.value >= s.value * (1 - 1e-12)
    assert math.isclose(
        a.kernel_shape, 8 * g * math.sqrt(ny) / (n * ny) * math.exp(-0.5) / math.sqrt(2 * g), rel_tol=1e-12
    )
    if g >= 1 / (2 * (tau_x + tau_y) ** 2):  # the kernel's peak lies inside the ball: no cost for "any"
        assert math.isclose(a.value, s.value, rel_tol=1e-12)
    assert math.isclose(
        s.theorem5,
        8 * math.sqrt(ny) * g * tau_x / (n * ny) * (1 + 2 * g * (tau_x + tau_y) * (2 * tau_x + tau_y)),
        rel_tol=1e-12,
    )


def test_kernel_peak_and_upsilon_cap():
    g = 0.5
    assert math.isclose(kernel_shape_peak(g, 10.0), math.exp(-0.5))  # d* = 1/√(2γ) = 1
    assert math.isclose(kernel_shape_peak(g, 0.5), 0.5 * math.exp(-0.125))
    a = gradient_sensitivity(10, 4, g, 1.0, 2.0, upsilon=100.0, y_domain="ball")
    b = gradient_sensitivity(10, 4, g, 1.0, 2.0, y_domain="ball")
    assert a == b  # Υ above τ_X + τ_Y is reduced to it
    with pytest.raises(ConfigError, match="^upsilon=.*y_domain"):
        gradient_sensitivity(10, 4, g, 1.0, 2.0, upsilon=3.0)  # Υ means nothing when Y may be anywhere
    with pytest.raises(ConfigError, match="^y_domain="):
        gradient_sensitivity(10, 4, g, 1.0, 2.0, y_domain="box")
    assert kernel_shape_peak(g) == kernel_shape_peak(g, 10.0)
    with pytest.raises(ConfigError, match="rule"):
        gradient_sensitivity(10, 4, g, 1.0, 2.0, rule="best")


@pytest.mark.parametrize("arg", ["tau_x", "tau_y", "gamma", "n_records"])
def test_negative_bounds_rejected(arg):
    kw = dict(n_records=10, n_landmarks=4, gamma=1.0, tau_x=1.0, tau_y=1.0)
    kw[arg] = -1.0
    with pytest.raises(ConfigError, match=arg):
        gradient_sensitivity(**kw)


def test_clip_and_project():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(500, 7)) * 2
    Xc, nc = clip_records(X, 3.0)
    norms = np.linalg.norm(X, axis=1)
    assert nc == int((norms > 3.0).sum()) > 0
    assert np.all(np.linalg.norm(Xc, axis=1) <= 3.0)
    keep = norms <= 3.0
    assert np.array_equal(Xc[keep], X[keep])
    with pytest.raises(ConfigError, match="tau_x"):
        clip_records(X, -1.0)
    Y = rng.normal(size=(20, 7)) * 5
    Yp = project_spectral(Y, 4.0)
    U, s, Vt = np.linalg.svd(Y, full_matrices=False)
    assert np.linalg.norm(Yp, 2) <= 4.0
    np.testing.assert_allclose(Yp, (U * np.minimum(s, 4.0)) @ Vt, atol=1e-9)
    small = Y / np.linalg.norm(Y, 2)
    np.testing.assert_array_equal(project_spectral(small, 4.0), small)
    assert default_tau_x(784, (0, 1)) == 28.0
    with pytest.raises(ConfigError, match="tau_x"):
        default_tau_x(784)
