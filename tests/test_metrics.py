"""Tests for securefed.metrics against brute-force re-implementations and known answers."""

import numpy as np
import pytest
from sklearn.manifold import trustworthiness as sk_trustworthiness

from securefed.errors import ConfigError, DataError
from securefed.metrics import (
    METRIC_KEYS,
    classification_accuracy,
    clustering_metrics,
    embedding_metrics,
    kmeans_metrics,
    neighbor_preservation,
    trustworthiness,
)


def npa_brute(X, E, k):
    """Double loop: for every i, overlap of its k nearest others in X and in E."""
    n = len(X)
    total = 0.0
    for i in range(n):
        dx = [(np.sum((X[i] - X[j]) ** 2), j) for j in range(n) if j != i]
        de = [(np.sum((E[i] - E[j]) ** 2), j) for j in range(n) if j != i]
        a = {j for _, j in sorted(dx)[:k]}
        b = {j for _, j in sorted(de)[:k]}
        total += len(a & b) / k
    return total / n


def test_npa_matches_double_loop():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(60, 8))
    E = X[:, :2] + 0.3 * rng.normal(size=(60, 2))
    got = neighbor_preservation(X, E, ks=(1, 5, 10))
    for k in (1, 5, 10):
        assert got[k] == pytest.approx(npa_brute(X, E, k), abs=1e-12)


def test_npa_identity_and_subsample():
    rng = np.random.default_rng(1)
    X = rng.normal(size=(200, 3))
    assert neighbor_preservation(X, X, ks=(1, 10))[10] == 1.0
    # subsampled queries: still 1 for an isometric copy, and bounded in [0, 1] otherwise
    Q = np.linalg.qr(rng.normal(size=(3, 3)))[0]
    assert neighbor_preservation(X, X @ Q + 5, ks=(5,), max_queries=50, random_state=0)[5] == pytest.approx(1.0)
    v = neighbor_preservation(X, rng.normal(size=(200, 2)), ks=(5,), max_queries=50, random_state=0)[5]
    assert 0 <= v < 0.3


def test_npa_duplicates_do_not_count_self():
    X = np.array([[0.0], [0.0], [1.0], [5.0]])
    # point 0 and 1 coincide: each one's nearest other is the other one
    assert neighbor_preservation(X, X, ks=(1,))[1] == 1.0


def test_ca_known_answer():
    # two well-separated classes → 1.0; labels independent of a 1-D embedding ordering → chance
    rng = np.random.default_rng(0)
    E = np.vstack([rng.normal(0, 0.1, (50, 2)), rng.normal(10, 0.1, (50, 2))])
    y = np.repeat([0, 1], 50)
    ca = classification_accuracy(E, y, ks=(1, 10, 50), random_state=0)
    assert ca == {1: 1.0, 10: 1.0, 50: 1.0}
    # alternating labels on a line: 1-NN is always the other class → 0 accuracy
    E = np.arange(40.0)[:, None]
    y = np.arange(40) % 2
    assert classification_accuracy(E, y, ks=(1,), random_state=0)[1] <= 0.35


def test_ca_split_is_stratified_70_30():
    E = np.arange(100.0)[:, None]
    y = np.repeat([0, 1], 50)
    # 1-NN on a line with two contiguous classes: only the boundary can fail
    assert classification_accuracy(E, y, ks=(1,), random_state=3)[1] >= 0.96
    assert classification_accuracy(E, y, ks=(1,), random_state=3) == classification_accuracy(
        E, y, ks=(1,), random_state=3
    )


def test_clustering_metrics_known():
    y = np.array([0, 0, 1, 1, 2, 2])
    assert clustering_metrics(np.array([5, 5, 7, 7, 9, 9]), y) == {"nmi": 1.0, "ari": 1.0}
    F = np.array([[0.0], [0.1], [5], [5.1], [10], [10.1]])
    out = clustering_metrics(y, y, features=F)
    assert out["sc"] > 0.9


def test_kmeans_metrics_separated_blobs():
    rng = np.random.default_rng(0)
    E = np.vstack([rng.normal(c, 0.2, (30, 2)) for c in (0, 10, 20)])
    y = np.repeat([0, 1, 2], 30)
    out = kmeans_metrics(E, y, random_state=0)
    assert out["nmi"] == pytest.approx(1.0) and out["ari"] == pytest.approx(1.0) and out["sc"] > 0.9


@pytest.mark.parametrize("k", [1, 5, 12])
def test_trustworthiness_matches_sklearn(k):
    rng = np.random.default_rng(k)
    X = rng.normal(size=(150, 6))
    E = X[:, :2] + 0.5 * rng.normal(size=(150, 2))
    assert trustworthiness(X, E, n_neighbors=k, block=37) == pytest.approx(
        sk_trustworthiness(X, E, n_neighbors=k), abs=1e-12
    )


def test_trustworthiness_subsample():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(400, 4))
    assert trustworthiness(X, X.copy(), max_points=100, random_state=0) == pytest.approx(1.0)


def test_embedding_metrics_keys_and_none():
    rng = np.random.default_rng(0)
    X = np.vstack([rng.normal(c, 1.0, (60, 5)) for c in (0, 8)])
    y = np.repeat([0, 1], 60)
    E = X[:, :2]
    out = embedding_metrics(X, E, y, random_state=0)
    assert tuple(out) == METRIC_KEYS and all(isinstance(v, float) for v in out.values())
    assert out["ca_10nn"] > 0.95 and out["nmi"] > 0.8 and 0 < out["trustworthiness"] <= 1
    assert out == embedding_metrics(X, E, y, random_state=0)  # seeded
    out = embedding_metrics(X, E, None)
    assert all(out[k] is None for k in ("ca_1nn", "ca_10nn", "ca_50nn", "nmi", "sc", "ari"))
    assert isinstance(out["npa_10nn"], float) and isinstance(out["trustworthiness"], float)


def test_metric_errors_name_parameter():
    X = np.ones((10, 3))
    with pytest.raises(DataError, match="^emb="):
        embedding_metrics(X, np.ones((9, 2)), None)
    with pytest.raises(DataError, match="^emb="):
        embedding_metrics(X, np.full((10, 2), np.nan), None)
    with pytest.raises(DataError, match="^y="):
        classification_accuracy(np.ones((10, 2)), np.zeros(8))
    with pytest.raises(ConfigError, match="^n_neighbors="):
        trustworthiness(np.random.rand(10, 2), np.random.rand(10, 2), n_neighbors=5)
    with pytest.raises(DataError, match="^X_high="):
        neighbor_preservation(np.ones(5), np.ones((5, 2)))
