"""Tests for securefed.embedding.nystrom: exactness claims, feature maps, kNN layouts for openTSNE / umap-learn."""

import os
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from securefed.errors import ConfigError, DataError
from securefed.kernels import gaussian_kernel, sq_dists
from securefed.embedding.nystrom import (
    choose_reconstruction,
    distance_feature_map,
    kernel_feature_map,
    knn_graph,
    nystrom_distance,
    nystrom_kernel,
)

RNG = np.random.default_rng(42)
X = RNG.normal(size=(120, 5))
D_TRUE = np.sqrt(sq_dists(X))


# ----------------------------------------------------------------------------- kernel form (Alg. 3)


def test_kernel_form_exact_when_landmarks_are_data():
    K = gaussian_kernel(X, X, 0.2)
    np.testing.assert_allclose(nystrom_kernel(K, K), K, atol=1e-10)


def test_kernel_form_matches_formula_and_rank():
    Y = RNG.normal(size=(15, 5))
    C, W = gaussian_kernel(X, Y, 0.3), gaussian_kernel(Y, Y, 0.3)
    np.testing.assert_allclose(
        nystrom_kernel(C, W), C @ np.linalg.pinv(W, rcond=1e-10, hermitian=True) @ C.T, atol=1e-9
    )
    # rank-k: the best rank-k approximation of W, then its pseudo-inverse
    ev, U = np.linalg.eigh(W)
    Wk = (U[:, -4:] * ev[-4:]) @ U[:, -4:].T
    np.testing.assert_allclose(
        nystrom_kernel(C, W, rank=4), C @ np.linalg.pinv(Wk, rcond=1e-12, hermitian=True) @ C.T, atol=1e-9
    )
    # W + λI
    lam = 0.05
    np.testing.assert_allclose(nystrom_kernel(C, W, reg=lam), C @ np.linalg.inv(W + lam * np.eye(15)) @ C.T, atol=1e-9)


# ----------------------------------------------------------------------------- feature map


@settings(max_examples=15, deadline=None)
@given(n_y=st.integers(2, 40), gamma=st.floats(0.05, 2.0), seed=st.integers(0, 2**31))
def test_feature_map_distances_equal_nystrom_kernel_distances(n_y, gamma, seed):
    rng = np.random.default_rng(seed)
    Xs = rng.normal(size=(50, 4))
    Y = rng.normal(size=(n_y, 4))
    C, W = gaussian_kernel(Xs, Y, gamma), gaussian_kernel(Y, Y, gamma)
    Phi = kernel_feature_map(C, W)
    Kh = nystrom_kernel(C, W)
    np.testing.assert_allclose(Phi @ Phi.T, Kh, atol=1e-8)
    d = np.diag(Kh)
    np.testing.assert_allclose(sq_dists(Phi), np.maximum(d[:, None] + d[None, :] - 2 * Kh, 0), atol=1e-8)
    assert Phi.shape[0] == 50 and Phi.shape[1] <= n_y


def test_feature_map_exact_kernel_distances_when_landmarks_are_data():
    gamma = 0.2
    K = gaussian_kernel(X, X, gamma)
    Phi = kernel_feature_map(K, K)
    # kernel-induced distance k(x,x) + k(x',x') − 2k(x,x') = 2 − 2k for the Gaussian kernel
    np.testing.assert_allclose(sq_dists(Phi), 2 - 2 * K, atol=1e-8)


# ----------------------------------------------------------------------------- distance form (Alg. 2, Eq. 21)


def test_distance_form_exact_with_squared_distances_and_m_plus_2_landmarks():
    # rank of a squared-distance matrix in R^5 is ≤ 7: 7 landmarks in general position suffice
    Y = RNG.normal(size=(7, 5))
    D_hat = nystrom_distance(sq_dists(X, Y), sq_dists(Y))
    np.testing.assert_allclose(D_hat, D_TRUE, atol=1e-8)
    assert np.all(np.diag(D_hat) == 0) and np.all(D_hat >= 0) and np.array_equal(D_hat, D_hat.T)


def test_distance_form_not_exact_below_rank_or_with_plain_distances():
    Y = RNG.normal(size=(20, 5))
    err_plain = np.abs(nystrom_distance(np.sqrt(sq_dists(X, Y)), np.sqrt(sq_dists(Y)), squared=False) - D_TRUE).max()
    assert err_plain > 1e-3  # plain distances are not low-rank: approximation only
    Y6 = RNG.normal(size=(6, 5))
    assert np.abs(nystrom_distance(sq_dists(X, Y6), sq_dists(Y6)) - D_TRUE).max() > 1e-3


def test_distance_form_exact_when_landmarks_contain_data_both_readings():
    Y = np.vstack([X, RNG.normal(size=(3, 5))])
    np.testing.assert_allclose(nystrom_distance(sq_dists(X, Y), sq_dists(Y)), D_TRUE, atol=1e-6)
    np.testing.assert_allclose(
        nystrom_distance(np.sqrt(sq_dists(X, X)), np.sqrt(sq_dists(X)), squared=False), D_TRUE, atol=1e-8
    )


def test_distance_form_usable_as_precomputed_metric():
    from sklearn.manifold import TSNE

    Y = RNG.normal(size=(10, 5))
    D_hat = nystrom_distance(sq_dists(X, Y), sq_dists(Y), rank=5, reg=1e-6)  # truncated: approximate
    assert np.all(D_hat >= 0) and np.all(np.diag(D_hat) == 0)
    emb = TSNE(metric="precomputed", init="random", perplexity=10, max_iter=250, random_state=0).fit_transform(D_hat)
    assert emb.shape == (120, 2) and np.isfinite(emb).all()


def test_landmark_mds_exact_with_affinely_spanning_landmarks():
    Y = RNG.normal(size=(6, 5))  # m + 1 points affinely span R^5
    Z = distance_feature_map(sq_dists(X, Y), sq_dists(Y))
    np.testing.assert_allclose(np.sqrt(sq_dists(Z)), D_TRUE, atol=1e-8)
    # fewer landmarks: distances of the projections onto the landmarks' affine hull
    Y3 = RNG.normal(size=(3, 5))
    Z = distance_feature_map(sq_dists(X, Y3), sq_dists(Y3))
    Q, _ = np.linalg.qr((Y3[1:] - Y3[0]).T)
    P = (X - Y3[0]) @ Q
    np.testing.assert_allclose(sq_dists(Z), sq_dists(P), atol=1e-8)


# ----------------------------------------------------------------------------- kNN graph


def _brute_knn(A, k):
    D = sq_dists(A)
    np.fill_diagonal(D, np.inf)
    idx = np.argsort(D, axis=1)[:, :k]
    return idx, np.sqrt(np.take_along_axis(D, idx, axis=1))


def test_knn_graph_exact_layouts():
    idx, dist = knn_graph(X, 6, method="exact")
    assert idx.shape == dist.shape == (120, 6) and idx.dtype == np.int64
    np.testing.assert_array_equal(idx[:, 0], np.arange(120))
    assert np.all(dist[:, 0] == 0)
    bi, bd = _brute_knn(X, 5)
    np.testing.assert_array_equal(idx[:, 1:], bi)
    np.testing.assert_allclose(dist[:, 1:], bd, atol=1e-10)
    idx2, dist2 = knn_graph(X, 5, method="exact", include_self=False)
    np.testing.assert_array_equal(idx2, bi)


def test_knn_graph_duplicates_keep_self_first():
    A = np.vstack([X[:10], X[:10], X[10:30]])
    idx, dist = knn_graph(A, 4, method="exact")
    np.testing.assert_array_equal(idx[:, 0], np.arange(40))
    assert not np.any(idx[:, 1:] == np.arange(40)[:, None])
    idx, _ = knn_graph(A, 3, method="exact", include_self=False)
    assert not np.any(idx == np.arange(40)[:, None])


@pytest.mark.skipif(
    not os.environ.get("SECUREFED_SLOW_TESTS"),
    reason="pynndescent JIT-compiles for ~30 s per process; set SECUREFED_SLOW_TESTS=1",
)
def test_knn_graph_nndescent_recall():
    A = np.random.default_rng(3).normal(size=(2000, 10))
    idx, dist = knn_graph(A, 11, method="nndescent", random_state=0)
    np.testing.assert_array_equal(idx[:, 0], np.arange(2000))
    bi, _ = _brute_knn(A, 10)
    recall = np.mean([len(np.intersect1d(a, b)) for a, b in zip(idx[:, 1:], bi)]) / 10
    assert recall > 0.95
    assert np.all(np.diff(dist, axis=1) >= -1e-6)


# Four clusters in 8-D, 40 of the records as landmarks: the Nyström feature map Φ of the Gaussian kernel and its
# kNN graph drive openTSNE / umap-learn; the reference is the same library on the exact kernel's neighbours (for a
# Gaussian kernel ‖φ(x) − φ(x')‖² = 2 − 2k(x, x') is monotone in ‖x − x'‖, so they are the Euclidean neighbours,
# found here by scikit-learn). Quality is scored by scikit-learn's trustworthiness and a 10-NN classifier.
_RC = np.random.default_rng(7)
YC = np.repeat(np.arange(4), 60)
XC = (_RC.normal(size=(4, 8)) * 4)[YC] + _RC.normal(size=(240, 8))
LC = XC[_RC.choice(240, 40, replace=False)]


def _phi_clusters():
    gamma = 1.0 / float(np.median(sq_dists(XC)))
    return kernel_feature_map(gaussian_kernel(XC, LC, gamma), gaussian_kernel(LC, LC, gamma))


def _exact_knn(k):
    from sklearn.neighbors import NearestNeighbors

    dist, idx = NearestNeighbors(n_neighbors=k + 1).fit(XC).kneighbors(XC)
    return idx[:, 1:], dist[:, 1:]


def _quality(emb):
    from sklearn.manifold import trustworthiness
    from sklearn.model_selection import cross_val_score
    from sklearn.neighbors import KNeighborsClassifier

    assert emb.shape == (240, 2) and np.isfinite(emb).all()
    return (
        trustworthiness(XC, emb, n_neighbors=10),
        float(cross_val_score(KNeighborsClassifier(10), emb, YC, cv=5).mean()),
    )


def test_knn_plugs_into_opentsne():
    from openTSNE import TSNEEmbedding
    from openTSNE.affinity import PerplexityBasedNN
    from openTSNE.initialization import pca as pca_init
    from openTSNE.nearest_neighbors import PrecomputedNeighbors

    def tsne(idx, dist):
        aff = PerplexityBasedNN(perplexity=15, knn_index=PrecomputedNeighbors(idx, dist))
        emb = TSNEEmbedding(pca_init(XC, random_state=0), aff, random_state=0, n_jobs=1)
        return np.asarray(emb.optimize(n_iter=250, exaggeration=12).optimize(n_iter=250))

    idx, dist = knn_graph(_phi_clusters(), 45, method="exact", include_self=False)
    P = PerplexityBasedNN(perplexity=15, knn_index=PrecomputedNeighbors(idx, dist)).P
    assert P.shape == (240, 240) and P.diagonal().sum() == 0 and abs(P.sum() - 1) < 1e-8
    trust, acc = _quality(tsne(idx, dist))
    ref_trust, ref_acc = _quality(tsne(*_exact_knn(45)))
    assert trust >= ref_trust - 0.02 and trust > 0.93 and acc >= 0.95, (trust, ref_trust, acc)
    # the floors bite: the same graph with its neighbours shuffled maps far worse
    shuffled = np.random.default_rng(0).permutation(240)[idx]
    bad_trust, bad_acc = _quality(tsne(shuffled, dist))
    assert bad_trust < 0.8 and bad_acc < 0.8, (bad_trust, bad_acc)


def test_knn_plugs_into_umap():
    import umap

    idx, dist = knn_graph(_phi_clusters(), 15, method="exact")  # umap-learn expects each point first
    ei, ed = _exact_knn(14)
    ei, ed = np.hstack([np.arange(240)[:, None], ei]), np.hstack([np.zeros((240, 1)), ed])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # umap warns that no NNDescent index is attached (no transform())
        emb, ref = (
            umap.UMAP(
                n_neighbors=15, precomputed_knn=(i, d, None), n_epochs=200, random_state=0, init="random"
            ).fit_transform(XC)
            for i, d in ((idx, dist), (ei, ed))
        )
    (trust, acc), (ref_trust, _) = _quality(emb), _quality(ref)
    assert trust >= ref_trust - 0.02 and trust > 0.93 and acc >= 0.95, (trust, ref_trust, acc)


# ----------------------------------------------------------------------------- choose / bad input


def test_choose_reconstruction():
    assert choose_reconstruction(5000) == "paper"
    assert choose_reconstruction(70_000) == "features"
    assert choose_reconstruction(5000, "features") == "features"
    assert choose_reconstruction(50_000, "paper", dense_limit=60_000) == "paper"
    with pytest.raises(ConfigError, match=r"^reconstruction='paper'.*GB"):
        choose_reconstruction(70_000, "paper")
    with pytest.raises(ConfigError, match="^reconstruction="):
        choose_reconstruction(100, "dense")
    with pytest.raises(ConfigError, match="^n="):
        choose_reconstruction(1)
    # DP landmarks: 'auto' always takes the feature map; an explicit choice is kept
    assert choose_reconstruction(5000, noisy_landmarks=True) == "features"
    assert choose_reconstruction(5000, "paper", noisy_landmarks=True) == "paper"


def test_feature_map_survives_far_landmarks_where_eq21_collapses():
    """Why 'auto' avoids Eq. (21) for DP landmarks: with landmarks far outside the data (what DP noise
    does) and n_y < m, Eq. (21)'s neighbours are mostly wrong while the landmark-MDS projection keeps
    far more of them (seeded; measured 0.06–0.22 vs 0.43–0.57 recall)."""
    rng = np.random.default_rng(0)
    m, n_y = 60, 40
    centres = rng.normal(size=(5, m)) * 2
    X = np.vstack([c + 0.7 * rng.normal(size=(100, m)) for c in centres])
    T = sq_dists(X, X)
    np.fill_diagonal(T, np.inf)
    truth = np.argsort(T, axis=1)[:, :10]

    def recall(D2):
        D2 = D2.copy()
        np.fill_diagonal(D2, np.inf)
        got = np.argsort(D2, axis=1)[:, :10]
        return np.mean([len(np.intersect1d(a, b)) / 10 for a, b in zip(got, truth)])

    for scale in (5.0, 20.0):
        Y = scale * rng.normal(size=(n_y, m))
        B, W = sq_dists(X, Y), sq_dists(Y, Y)
        eq21 = recall(nystrom_distance(B, W) ** 2)
        Z = distance_feature_map(B, W)
        fmap = recall(sq_dists(Z, Z))
        assert eq21 < 0.3
        assert fmap > eq21 + 0.25


@pytest.mark.parametrize(
    "call,exc,match",
    [
        (lambda: nystrom_distance(np.ones((5, 3)), np.ones((4, 4))), DataError, "^B="),
        (lambda: nystrom_distance(np.ones((5, 3)), np.ones((3, 2))), DataError, "^W=.*square"),
        (lambda: nystrom_distance(np.ones((5, 1)), np.ones((1, 1))), DataError, "^W=.*at least 2 landmarks"),
        (lambda: nystrom_distance(np.ones((5, 2)), np.array([[0.0, 1], [2, 0]])), DataError, "^W=.*symmetric"),
        (lambda: nystrom_distance(np.full((5, 2), np.nan), np.eye(2)), DataError, "^B=.*impute"),
        (lambda: nystrom_distance(np.ones((5, 2)), np.eye(2), rank=3), ConfigError, "^rank=3"),
        (lambda: nystrom_distance(np.ones((5, 2)), np.eye(2), reg=-1), ConfigError, "^reg=-1"),
        (lambda: nystrom_distance(np.ones((50, 2)), np.eye(2), max_records=10), ConfigError, "^n_records=50.*features"),
        (lambda: nystrom_kernel(np.ones((5, 2)), np.eye(2), rank=0), ConfigError, "^rank=0"),
        (lambda: kernel_feature_map(np.ones((5, 2)), -np.eye(2)), DataError, "^W=.*positive semi-definite"),
        (lambda: kernel_feature_map(np.ones((5, 2)), np.eye(2), rtol=0), ConfigError, "^rtol=0"),
        (lambda: distance_feature_map(-np.ones((5, 2)), np.ones((2, 2)) - np.eye(2)), DataError, "squared"),
        (lambda: knn_graph(X, 120), ConfigError, "^k=120"),
        (lambda: knn_graph(X, 1), ConfigError, "^k=1.*include_self"),
        (lambda: knn_graph(X, 5, method="annoy"), ConfigError, "^method='annoy'"),
        (lambda: knn_graph(np.ones(5), 2), DataError, "^Phi="),
    ],
)
def test_bad_input(call, exc, match):
    with pytest.raises(exc, match=match):
        call()
