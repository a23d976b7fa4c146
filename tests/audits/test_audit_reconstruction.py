"""Reconstruction audit: trilateration, kernel-row inversion, affine-span projection, coordinate attack."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from securefed.audits.reconstruction import (
    reconstruct_from_coordinates,
    reconstruct_from_distance_rows,
    reconstruct_from_kernel_rows,
    reconstruction_risk,
)
from securefed.errors import DataError
from securefed.kernels import gaussian_kernel, sq_dists


def _records(seed, n=60, m=20, ny=30):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, m)) * 2.0 + rng.normal(size=m)
    Y = rng.normal(size=(ny, m)) * 2.0
    return X, Y


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), m=st.integers(2, 40), extra=st.integers(1, 30), scale=st.floats(0.01, 100.0))
def test_trilateration_exact_when_more_landmarks_than_dims(seed, m, extra, scale):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(15, m)) * scale + scale
    Y = rng.normal(size=(m + extra, m)) * scale
    D = np.sqrt(sq_dists(X, Y))
    X_hat, rank = reconstruct_from_distance_rows(D, Y, return_rank=True)
    assert rank == m
    rel = np.linalg.norm(X_hat - X, axis=1) / np.linalg.norm(X, axis=1)
    assert rel.max() < 1e-6
    risk = reconstruction_risk(X, X_hat)
    assert risk["median_relative_error"] < 1e-6 and risk["fraction_within_5pct"] == 1.0


def test_squared_rows_equal_distance_rows():
    X, Y = _records(1)
    D2 = sq_dists(X, Y)
    a = reconstruct_from_distance_rows(D2, Y, squared=True)
    b = reconstruct_from_distance_rows(np.sqrt(D2), Y)
    assert np.allclose(a, b, atol=1e-9) and np.allclose(a, X, atol=1e-8)


def test_few_landmarks_recover_projection_onto_affine_span():
    X, Y = _records(2, m=30, ny=12)
    X_hat, rank = reconstruct_from_distance_rows(np.sqrt(sq_dists(X, Y)), Y, return_rank=True)
    assert rank == 11
    c = Y.mean(axis=0)
    _, _, Vt = np.linalg.svd(Y - c, full_matrices=False)
    V = Vt[:rank]
    assert np.allclose(X_hat, c + (X - c) @ V.T @ V, atol=1e-9)
    # and it is not the record: the orthogonal part is lost
    assert reconstruction_risk(X, X_hat)["median_relative_error"] > 0.3


def test_kernel_rows_inverted_exactly():
    X, Y = _records(3, m=15, ny=25)
    gamma = 1.0 / np.median(sq_dists(X, Y))
    X_hat = reconstruct_from_kernel_rows(gaussian_kernel(X, Y, gamma), Y, gamma)
    assert reconstruction_risk(X, X_hat)["median_relative_error"] < 1e-6
    assert np.max(np.linalg.norm(X_hat - X, axis=1) / np.linalg.norm(X, axis=1)) < 1e-6


def test_kernel_rows_with_underflowed_entries_still_recovered():
    X, Y = _records(4, m=5, ny=40)
    gamma = 5.0 / np.median(sq_dists(X, Y))
    K = gaussian_kernel(X, Y, gamma)
    K[0, :3] = 0.0  # underflow: no distance information in those entries
    K[1, 5:9] = 0.0
    X_hat = reconstruct_from_kernel_rows(K, Y, gamma)
    assert np.allclose(X_hat[:2], X[:2], rtol=0, atol=1e-6 * np.linalg.norm(X[:2], axis=1).max())


def test_noisy_rows_give_least_squares_estimate_and_perturbed_records():
    X, Y = _records(5, m=10, ny=60)
    rng = np.random.default_rng(0)
    E = rng.normal(scale=0.3, size=X.shape)  # Qiao et al. Sec. 5.1: rows of X + E
    X_hat = reconstruct_from_distance_rows(np.sqrt(sq_dists(X + E, Y)), Y)
    assert np.allclose(X_hat, X + E, atol=1e-8)  # the server gets x + e exactly
    err = np.linalg.norm(X_hat - X, axis=1)
    assert np.isclose(np.median(err), np.median(np.linalg.norm(E, axis=1)))
    # noise on the distances themselves: least squares = the linear LS solution
    D2 = sq_dists(X, Y) + rng.normal(scale=0.1, size=(len(X), len(Y)))
    A = np.hstack([-2 * Y, np.ones((len(Y), 1))])
    z, *_ = np.linalg.lstsq(A, (D2 - (Y * Y).sum(1)).T, rcond=None)
    assert np.allclose(reconstruct_from_distance_rows(D2, Y, squared=True), z[:-1].T, atol=1e-8)


def test_bad_rows_rejected():
    X, Y = _records(6)
    with pytest.raises(DataError, match="D_rows"):
        reconstruct_from_distance_rows(-np.ones((3, len(Y))), Y)
    with pytest.raises(DataError, match="K_rows"):
        reconstruct_from_kernel_rows(2 * np.ones((3, len(Y))), Y, 1.0)
    with pytest.raises(DataError, match="shape"):
        reconstruct_from_distance_rows(np.ones((3, len(Y) + 1)), Y)


def test_coordinate_attack_uses_landmarks_and_beats_no_information():
    # records on a 1-D curve in 20-D; the 2-D "embedding" is the curve parameter: the attack should follow it
    rng = np.random.default_rng(7)
    t_y = np.sort(rng.uniform(0, 1, 80))
    t_x = rng.uniform(0, 1, 200)
    basis = rng.normal(size=(3, 20))

    def curve(t):
        return np.stack([np.cos(3 * t), np.sin(3 * t), t], axis=1) @ basis + 5.0

    Y, X = curve(t_y), curve(t_x)
    Zy = np.stack([t_y, np.zeros_like(t_y)], 1)
    Zx = [np.stack([t_x[:100], np.zeros(100)], 1), np.stack([t_x[100:], np.zeros(100)], 1)]
    parts, info = reconstruct_from_coordinates(Zx, Zy, Y, return_info=True)
    assert len(parts) == 2 and info["bandwidth"] > 0
    risk = reconstruction_risk(X, np.vstack(parts), reference=Y.mean(0))
    assert risk["median_relative_error"] < 0.2 * risk["baseline_median_relative_error"]
