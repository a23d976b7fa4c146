"""The embedding stage's computations, as plain functions both sides of the federation call.

Server side (the coordinator): the paper's "rows → result" steps (Fed-tSNE / Fed-UMAP on squared-distance
rows, Algorithm 2; Fed-SpeClust on kernel rows, Algorithm 3) and, in the no-rows mode, the models of the
landmarks alone. Site side: :func:`spectral_assign` (the t-SNE / UMAP placements are in :mod:`.placement`).
"""

from __future__ import annotations

import numpy as np

from ..kernels import gaussian_kernel, sq_dists
from . import nystrom as _ny

__all__ = [
    "knn_from_distance_rows",
    "tsne_from_distance_rows",
    "umap_from_distance_rows",
    "spectral_from_kernel_rows",
    "tsne_landmark_model",
    "umap_landmark_model",
    "spectral_landmark_labels",
    "spectral_assign",
    "seed_from",
]


def seed_from(rng: np.random.Generator) -> int:
    """A 31-bit seed for a library that takes an int, drawn from the run's statistical Generator."""
    return int(rng.integers(0, 2**31 - 1))


_seed = seed_from


# The server's "rows → result" step of each estimator (rows mode) and the landmark-model steps of the
# local mode, as plain functions: the estimators call them, and so does the Flower coordinator
# (securefed.flower), so both give the same result for the same rows, landmarks and Generator.


def knn_from_distance_rows(B, landmarks, k, *, reconstruction="auto", noisy_landmarks=False, n_jobs=1, rng):
    """k-NN graph (each point itself first) from the sites' squared-distance rows ``B = D²(X, Y)``.

    ``"paper"``: Eq. (21) of Qiao et al. (:func:`securefed.embedding.nystrom.nystrom_distance`, dense n × n);
    ``"features"``: the landmark-MDS feature map + approximate k-NN (no n × n). The path is chosen by
    :func:`securefed.embedding.nystrom.choose_reconstruction`.

    Returns
    -------
    (idx, dist, D_or_Z, path)
    """
    n = len(B)
    path = _ny.choose_reconstruction(n, reconstruction, noisy_landmarks=noisy_landmarks)
    W = sq_dists(landmarks)
    if path == "paper":
        D = _ny.nystrom_distance(B, W)  # Eq. (21)
        idx = np.argpartition(D, k - 1, axis=1)[:, :k]
        idx = np.take_along_axis(idx, np.argsort(np.take_along_axis(D, idx, axis=1), axis=1), axis=1)
        # the point itself first (ties with duplicates never displace it)
        rows = np.arange(n)
        idx = np.where(idx[:, :1] == rows[:, None], idx, np.hstack([rows[:, None], idx[:, :-1]]))
        dist = np.take_along_axis(D, idx, axis=1)
        return idx, dist, D, path
    Z = _ny.distance_feature_map(B, W)
    idx, dist = _ny.knn_graph(Z, k, random_state=_seed(rng), n_jobs=n_jobs)
    return idx, dist, Z, path


def tsne_from_distance_rows(
    B,
    landmarks,
    *,
    perplexity=30.0,
    n_components=2,
    n_iter=750,
    reconstruction="auto",
    noisy_landmarks=False,
    n_jobs=1,
    rng,
):
    """Fed-tSNE's server step (Qiao et al. Algorithm 2, rows mode): the t-SNE embedding of all records
    from their distance rows ``B`` (k-NN by :func:`knn_from_distance_rows`, then openTSNE).

    Returns
    -------
    (embedding (n, n_components), reconstruction path)
    """
    from openTSNE import TSNEEmbedding, affinity, initialization
    from openTSNE.nearest_neighbors import PrecomputedNeighbors

    n = len(B)
    k = int(min(n - 1, max(3 * perplexity + 1, 10)))
    idx, dist, _, path = knn_from_distance_rows(
        B, landmarks, k + 1, reconstruction=reconstruction, noisy_landmarks=noisy_landmarks, n_jobs=n_jobs, rng=rng
    )
    nn = PrecomputedNeighbors(idx[:, 1:], dist[:, 1:])
    P = affinity.PerplexityBasedNN(
        knn_index=nn, perplexity=float(min(perplexity, (k) / 3.0)), n_jobs=n_jobs, random_state=_seed(rng)
    )
    init = initialization.spectral(P.P, n_components=n_components, random_state=_seed(rng))
    E = TSNEEmbedding(init, P, n_jobs=n_jobs, random_state=_seed(rng))
    E = E.optimize(250, exaggeration=12, momentum=0.5)
    E = E.optimize(max(n_iter - 250, 1), momentum=0.8)
    return np.asarray(E), path


def umap_from_distance_rows(
    B,
    landmarks,
    *,
    n_neighbors=15,
    min_dist=0.1,
    n_components=2,
    reconstruction="auto",
    noisy_landmarks=False,
    n_jobs=1,
    rng,
):
    """Fed-UMAP's server step (Qiao et al. Algorithm 2, rows mode): UMAP of all records from ``B``.

    Returns
    -------
    (embedding (n, n_components), reconstruction path)
    """
    import warnings

    import umap

    n = len(B)
    k = int(min(n_neighbors, n - 1))
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*n_jobs value.*")
        warnings.filterwarnings("ignore", message=".*precomputed_knn.*")
        warnings.filterwarnings("ignore", message=".*inverse_transform will be unavailable.*")  # by design: no inverse
        idx, dist, Z, path = knn_from_distance_rows(
            B, landmarks, k, reconstruction=reconstruction, noisy_landmarks=noisy_landmarks, n_jobs=n_jobs, rng=rng
        )
        if path == "paper":
            model = umap.UMAP(
                n_components=n_components,
                n_neighbors=k,
                min_dist=min_dist,
                metric="precomputed",
                random_state=_seed(rng),
            )
        else:
            model = umap.UMAP(
                n_components=n_components,
                n_neighbors=k,
                min_dist=min_dist,
                precomputed_knn=(idx, dist, None),
                random_state=_seed(rng),
            )
        return model.fit_transform(Z), path


def spectral_from_kernel_rows(
    C, landmarks, gamma, *, n_clusters=8, n_neighbors=15, reconstruction="auto", n_jobs=1, rng
):
    """Fed-SpeClust's server step (Qiao et al. Algorithm 3, rows mode): cluster labels of all records
    from their kernel rows ``C = K(X, Y)`` — dense ``C W^† Cᵀ`` (``"paper"``) or the kernel feature map +
    a sparse k-NN affinity graph (``"features"``).

    Returns
    -------
    (labels (n,), reconstruction path)
    """
    from sklearn.cluster import SpectralClustering

    n = len(C)
    W = gaussian_kernel(landmarks, None, gamma)
    path = _ny.choose_reconstruction(n, reconstruction)
    if path == "paper":
        K = _ny.nystrom_kernel(C, W)  # Algorithm 3: C W^† Cᵀ
        np.maximum(K, 0.0, out=K)
        labels = SpectralClustering(n_clusters, affinity="precomputed", random_state=_seed(rng)).fit_predict(K)
        return labels, path
    Phi = _ny.kernel_feature_map(C, W)
    k = int(min(n_neighbors, n - 1))
    idx, dist = _ny.knn_graph(Phi, k + 1, random_state=_seed(rng), n_jobs=n_jobs)
    from scipy.sparse import csr_matrix

    G = csr_matrix((dist[:, 1:].ravel(), idx[:, 1:].ravel(), np.arange(0, n * k + 1, k)), shape=(n, n))
    labels = SpectralClustering(
        n_clusters, affinity="precomputed_nearest_neighbors", n_neighbors=k, random_state=_seed(rng)
    ).fit_predict(G)
    return labels, path


def tsne_landmark_model(landmarks, *, perplexity=30.0, n_components=2, seed=0, n_jobs=1):
    """Local mode, server: openTSNE model of the landmarks alone, perplexity ``min(perplexity, (n_y − 1)/3)``.

    Returns
    -------
    (model, perplexity used) — sites place their records with ``model.transform(X, perplexity=...)``.
    """
    from openTSNE import TSNE

    perp = float(min(perplexity, (len(landmarks) - 1) / 3.0))
    return TSNE(n_components=n_components, perplexity=perp, random_state=int(seed), n_jobs=n_jobs).fit(landmarks), perp


def umap_landmark_model(landmarks, *, n_neighbors=15, min_dist=0.1, n_components=2, seed=0):
    """Local mode, server: UMAP model of the landmarks alone (sites place records with ``model.transform``)."""
    import warnings

    import umap

    nn = int(min(n_neighbors, len(landmarks) - 1))
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*n_jobs value.*")
        return umap.UMAP(n_components=n_components, n_neighbors=nn, min_dist=min_dist, random_state=int(seed)).fit(
            landmarks
        )


def spectral_landmark_labels(landmarks, gamma, *, n_clusters=8, seed=0, masses=None):
    """Local mode, server: spectral clustering of the landmarks with the Gaussian kernel ``K(Y, Y)``, each entry
    weighted by the landmarks' masses ``c_I c_J`` when given (a landmark stands for its records)."""
    from sklearn.cluster import SpectralClustering

    W = gaussian_kernel(landmarks, None, gamma)
    if masses is not None:
        c = np.asarray(masses, dtype=np.float64)
        W = W * np.outer(c, c) / float(np.mean(c)) ** 2
    return SpectralClustering(n_clusters, affinity="precomputed", random_state=int(seed)).fit_predict(W)


def spectral_assign(X, landmarks, gamma, landmark_labels, n_clusters):
    """Local mode, site: each record goes to the cluster of highest mean kernel affinity to its landmarks."""
    onehot = np.eye(n_clusters)[landmark_labels]
    onehot /= np.maximum(onehot.sum(axis=0), 1)
    return np.argmax(gaussian_kernel(X, landmarks, gamma) @ onehot, axis=1)
