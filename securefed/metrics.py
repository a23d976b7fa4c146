"""Embedding and clustering quality metrics (definitions: Qiao et al. (arXiv:2412.13495) App. A.2).

* **CA k-NN** — accuracy of a k-NN classifier trained on 70 % of the embedded points and tested on
  the other 30 % (stratified, seeded split), k ∈ {1, 10, 50}.
* **NPA k-NN** — neighbour preservation: the mean over points of
  ``|kNN_high(i) ∩ kNN_low(i)| / k`` (self excluded from both neighbour sets).
* **NMI, ARI, SC of k-means** — k-means with k = number of classes on the embedding; NMI and ARI
  against the true labels, silhouette coefficient of the k-means partition in the embedding.
* **Trustworthiness** — Venna & Kaski 2001, as ``sklearn.manifold.trustworthiness``, computed in
  row blocks so memory stays O(block · n).

Large inputs: NPA queries a seeded subsample of at most ``max_queries`` (10 000) points, whose
neighbours are still searched among **all** points; trustworthiness and the silhouette run on a
seeded subsample of at most 10 000 points (both are O(n²) in time).
"""

from __future__ import annotations

import numpy as np

from .data import as_float_matrix
from .errors import ConfigError, DataError, bad_value

__all__ = [
    "METRIC_KEYS",
    "classification_accuracy",
    "neighbor_preservation",
    "kmeans_metrics",
    "clustering_metrics",
    "trustworthiness",
    "embedding_metrics",
]

METRIC_KEYS = ("ca_1nn", "ca_10nn", "ca_50nn", "npa_1nn", "npa_10nn", "npa_50nn", "nmi", "sc", "ari", "trustworthiness")
_KS = (1, 10, 50)


def _seed(rng: np.random.Generator) -> int:
    """An int seed for scikit-learn (which does not accept a Generator), drawn from ``rng``."""
    return int(rng.integers(0, 2**31 - 1))


def _check_points(A, name: str) -> np.ndarray:
    return as_float_matrix(A, name, min_rows=2)


def _check_labels(y, n: int, name: str = "y") -> np.ndarray:
    y = np.asarray(y)
    if y.ndim != 1 or len(y) != n:
        raise DataError(bad_value(name, f"<array of shape {y.shape}>", f"give one label per point ({n})"))
    return y


def classification_accuracy(emb, y, ks=_KS, test_size: float = 0.3, random_state=None) -> dict[int, float]:
    """CA k-NN (Qiao et al. (arXiv:2412.13495) App. A.2): k-NN accuracy on a 70/30 stratified split of the embedding.

    One seeded split is shared by all ``ks``. ``k`` is capped at the training-set size. If some
    class has fewer than 2 points a stratified split is impossible; the split is then unstratified.

    Returns
    -------
    dict mapping k → accuracy on the 30 % test part.
    """
    from sklearn.model_selection import train_test_split
    from sklearn.neighbors import KNeighborsClassifier

    E = _check_points(emb, "emb")
    y = _check_labels(y, len(E))
    rng = np.random.default_rng(random_state)
    idx = np.arange(len(E))
    _, counts = np.unique(y, return_counts=True)
    strat = y if counts.min() >= 2 else None
    n_test = max(1, int(round(test_size * len(E))))
    if strat is not None and n_test < len(counts):
        strat = None  # too few test points to hold every class
    tr, te = train_test_split(idx, test_size=n_test, stratify=strat, random_state=_seed(rng))
    out = {}
    for k in ks:
        clf = KNeighborsClassifier(n_neighbors=min(int(k), len(tr)))
        clf.fit(E[tr], y[tr])
        out[int(k)] = float(np.mean(clf.predict(E[te]) == y[te]))
    return out


def _knn_without_self(A: np.ndarray, queries: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k nearest neighbours of ``A[queries]`` among all rows of ``A``, self excluded.

    Robust to duplicate points: ``k + 1`` neighbours are retrieved, the query itself is removed
    wherever it appears, or the last one is dropped if it does not appear (a duplicate took its place).
    """
    from sklearn.neighbors import NearestNeighbors

    nn = NearestNeighbors(n_neighbors=k + 1).fit(A)
    ind = nn.kneighbors(A[queries], return_distance=False)
    is_self = ind == queries[:, None]
    order = np.argsort(is_self, axis=1, kind="stable")  # non-self first, original order kept
    return np.take_along_axis(ind, order, axis=1)[:, :k]


def neighbor_preservation(X_high, emb, ks=_KS, max_queries: int = 10_000, random_state=None) -> dict[int, float]:
    """NPA k-NN (Qiao et al. (arXiv:2412.13495) App. A.2): mean over points of ``|kNN_high(i) ∩ kNN_low(i)| / k``.

    Euclidean neighbours, self excluded. Above ``max_queries`` points the mean runs over a seeded
    random subsample of query points; their neighbours are still found among all ``n`` points.
    ``k`` is capped at ``n − 1``.
    """
    X = _check_points(X_high, "X_high")
    E = _check_points(emb, "emb")
    if len(X) != len(E):
        raise DataError(
            bad_value("emb", f"<{len(E)} rows>", f"the embedding needs one row per record of X_high ({len(X)})")
        )
    n = len(X)
    rng = np.random.default_rng(random_state)
    q = np.arange(n) if n <= max_queries else np.sort(rng.choice(n, max_queries, replace=False))
    kmax = min(max(int(k) for k in ks), n - 1)
    Nh = _knn_without_self(X, q, kmax)
    Nl = _knn_without_self(E, q, kmax)
    out = {}
    for k in ks:
        kk = min(int(k), n - 1)
        hits = [len(np.intersect1d(a, b, assume_unique=True)) for a, b in zip(Nh[:, :kk], Nl[:, :kk])]
        out[int(k)] = float(np.mean(hits) / kk)
    return out


def clustering_metrics(labels_pred, y, features=None, max_silhouette_points: int = 10_000, random_state=None) -> dict:
    """NMI and ARI of a predicted partition against true labels (Qiao et al. (arXiv:2412.13495) App. A.2).

    With ``features`` (n × d) also ``sc``: the silhouette coefficient of ``labels_pred`` in that space
    (seeded subsample of ``max_silhouette_points`` above that size; ``nan`` when only one cluster).
    """
    from sklearn.metrics import adjusted_rand_score, normalized_mutual_info_score, silhouette_score

    lp = np.asarray(labels_pred)
    y = _check_labels(y, len(lp))
    out = {"nmi": float(normalized_mutual_info_score(y, lp)), "ari": float(adjusted_rand_score(y, lp))}
    if features is not None:
        F = _check_points(features, "features")
        if len(F) != len(lp):
            raise DataError(bad_value("features", f"<{len(F)} rows>", f"give one row per label ({len(lp)})"))
        n_clusters = len(np.unique(lp))
        if n_clusters < 2 or n_clusters >= len(F):
            out["sc"] = float("nan")
        else:
            rng = np.random.default_rng(random_state)
            size = None if len(F) <= max_silhouette_points else max_silhouette_points
            out["sc"] = float(silhouette_score(F, lp, sample_size=size, random_state=_seed(rng)))
    return out


def kmeans_metrics(emb, y, n_clusters: int | None = None, random_state=None) -> dict:
    """NMI, ARI and SC of k-means on the embedding, k = number of classes (Qiao et al. (arXiv:2412.13495) App. A.2)."""
    from sklearn.cluster import KMeans

    E = _check_points(emb, "emb")
    y = _check_labels(y, len(E))
    k = len(np.unique(y)) if n_clusters is None else int(n_clusters)
    if k < 1 or k > len(E):
        raise ConfigError(bad_value("n_clusters", k, f"use between 1 and {len(E)} clusters"))
    rng = np.random.default_rng(random_state)
    lp = KMeans(n_clusters=k, n_init=10, random_state=_seed(rng)).fit_predict(E)
    return clustering_metrics(lp, y, features=E, random_state=rng)


def trustworthiness(
    X_high, emb, n_neighbors: int = 5, max_points: int = 10_000, block: int = 512, random_state=None
) -> float:
    """Trustworthiness T(k) (Venna & Kaski 2001), the same definition as ``sklearn.manifold.trustworthiness``.

    ``T(k) = 1 − 2/(n k (2n − 3k − 1)) · Σ_i Σ_{j ∈ U_k(i)} (r(i, j) − k)``, where ``U_k(i)`` are the
    embedding's k nearest neighbours of i that are not among its k nearest in the input space and
    ``r(i, j)`` is the rank of j by input-space distance from i. Computed block-wise (memory
    O(block · n) instead of scikit-learn's O(n²)); above ``max_points`` points on a seeded subsample.
    """
    from sklearn.neighbors import NearestNeighbors

    from .kernels import sq_dists

    X = _check_points(X_high, "X_high")
    E = _check_points(emb, "emb")
    if len(X) != len(E):
        raise DataError(
            bad_value("emb", f"<{len(E)} rows>", f"the embedding needs one row per record of X_high ({len(X)})")
        )
    if len(X) > max_points:
        rng = np.random.default_rng(random_state)
        sub = np.sort(rng.choice(len(X), max_points, replace=False))
        X, E = X[sub], E[sub]
    n = len(X)
    k = int(n_neighbors)
    if not 1 <= k < n / 2:
        raise ConfigError(bad_value("n_neighbors", n_neighbors, f"use 1 ≤ n_neighbors < n/2 = {n / 2}"))
    ind_E = NearestNeighbors(n_neighbors=k).fit(E).kneighbors(return_distance=False)
    total = 0.0
    for s in range(0, n, block):
        rows = np.arange(s, min(n, s + block))
        D = sq_dists(X[rows], X)
        D[np.arange(len(rows)), rows] = np.inf
        d_nb = np.take_along_axis(D, ind_E[rows], axis=1)  # distances to embedding neighbours
        # rank r(i, j) = 1 + #points strictly closer to i than j (self excluded via inf)
        ranks = 1 + (D[:, None, :] < d_nb[:, :, None]).sum(axis=2)
        excess = ranks - k
        total += float(excess[excess > 0].sum())
    return float(1.0 - total * (2.0 / (n * k * (2.0 * n - 3.0 * k - 1.0))))


def embedding_metrics(X_high, emb, y=None, random_state=None) -> dict:
    """All metrics of Qiao et al. (arXiv:2412.13495) App. A.2 for one embedding.

    Returns
    -------
    dict with exactly the keys :data:`METRIC_KEYS` (floats). With ``y=None`` the label-based keys
    (``ca_*``, ``nmi``, ``sc``, ``ari``) are None; NPA and trustworthiness need no labels.
    """
    X = _check_points(X_high, "X_high")
    E = _check_points(emb, "emb")
    if len(X) != len(E):
        raise DataError(
            bad_value("emb", f"<{len(E)} rows>", f"the embedding needs one row per record of X_high ({len(X)})")
        )
    rng = np.random.default_rng(random_state)
    out: dict = dict.fromkeys(METRIC_KEYS)
    npa = neighbor_preservation(X, E, random_state=rng)
    for k in _KS:
        out[f"npa_{k}nn"] = npa[k]
    out["trustworthiness"] = trustworthiness(X, E, random_state=rng)
    if y is not None:
        y = _check_labels(y, len(E))
        ca = classification_accuracy(E, y, random_state=rng)
        for k in _KS:
            out[f"ca_{k}nn"] = ca[k]
        out.update(kmeans_metrics(E, y, random_state=rng))
    return out
