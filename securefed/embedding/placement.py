"""The no-rows embedding stage over Flower: t-SNE of the landmarks, records placed on their own site.

Same computation as ``FedTSNE(nystrom="local")`` (:mod:`securefed.estimators`): the server fits openTSNE
on the landmarks only, ``TSNE(perplexity=min(perplexity, (n_y − 1)/3), random_state=seed).fit(Y)``;
each site places its records against that model with openTSNE's ``transform`` and only the final
coordinates leave the site (one row of ``n_components`` numbers per record).

The model itself (an openTSNE affinity index over ``Y``) is not serialisable in a portable way, so the
server sends ``Y``, the perplexity, the seed and its landmark embedding; each site refits the same
deterministic model (``n_jobs=1``) and refuses to continue (:class:`~securefed.errors.ProtocolError`)
unless its landmark embedding equals the server's — both then place records with the same model.
"""

from __future__ import annotations

import numpy as np

from ..errors import ConfigError, ProtocolError, bad_value

__all__ = ["landmark_perplexity", "fit_landmark_tsne", "place_records", "place_records_umap"]


def landmark_perplexity(perplexity: float, n_landmarks: int) -> float:
    """The perplexity used on ``n_landmarks`` points: ``min(perplexity, (n_y − 1) / 3)`` (as FedTSNE)."""
    if not perplexity > 0:
        raise ConfigError(bad_value("perplexity", perplexity, "use a positive number, e.g. 30"))
    return float(min(perplexity, (n_landmarks - 1) / 3.0))


def fit_landmark_tsne(Y: np.ndarray, perplexity: float, seed: int, n_components: int = 2):
    """openTSNE model of the landmarks (deterministic for a given seed with ``n_jobs=1``): the estimator's
    own step, :func:`securefed.estimators.tsne_landmark_model`."""
    from .stages import tsne_landmark_model

    landmark_perplexity(perplexity, len(Y))
    return tsne_landmark_model(Y, perplexity=perplexity, n_components=n_components, seed=int(seed), n_jobs=1)[0]


def place_records(Y: np.ndarray, X: np.ndarray, perplexity: float, seed: int, expected: np.ndarray | None = None,
                  n_components: int = 2) -> np.ndarray:
    """Site side: refit the landmark model, check it against the server's, place ``X``; returns coordinates."""
    model = fit_landmark_tsne(Y, perplexity, seed, n_components)
    if expected is not None:
        mine = np.asarray(model)
        if mine.shape != expected.shape or not np.allclose(mine, expected, rtol=0, atol=1e-9):
            raise ProtocolError("the landmark t-SNE model rebuilt on this site differs from the server's "
                                "(different openTSNE version?); refusing to place records")
    return np.asarray(model.transform(X, perplexity=landmark_perplexity(perplexity, len(Y))))


def _same(mine: np.ndarray, expected: np.ndarray, what: str) -> None:
    if mine.shape != expected.shape or not np.allclose(mine, expected, rtol=0, atol=1e-9):
        raise ProtocolError(f"the landmark {what} model rebuilt on this site differs from the server's "
                            "(different library version?); refusing to place records")


def place_records_umap(Y: np.ndarray, X: np.ndarray, n_neighbors: int, min_dist: float, seed: int,
                       expected: np.ndarray | None = None, n_components: int = 2) -> np.ndarray:
    """Site side of ``umap-local``: refit the server's landmark UMAP (same seed; checked against the server's
    landmark embedding) and place ``X`` with ``transform``, as ``FedUMAP(nystrom="local")``."""
    import warnings

    from .stages import umap_landmark_model

    model = umap_landmark_model(Y, n_neighbors=n_neighbors, min_dist=min_dist, n_components=n_components, seed=seed)
    if expected is not None:
        _same(np.asarray(model.embedding_, dtype=np.float64), expected, "UMAP")
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*n_jobs value.*")
        return np.asarray(model.transform(X), dtype=np.float64)
