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

from ...errors import ConfigError, ProtocolError, bad_value

__all__ = ["landmark_perplexity", "fit_landmark_tsne", "place_records"]


def landmark_perplexity(perplexity: float, n_landmarks: int) -> float:
    """The perplexity used on ``n_landmarks`` points: ``min(perplexity, (n_y − 1) / 3)`` (as FedTSNE)."""
    if not perplexity > 0:
        raise ConfigError(bad_value("perplexity", perplexity, "use a positive number, e.g. 30"))
    return float(min(perplexity, (n_landmarks - 1) / 3.0))


def fit_landmark_tsne(Y: np.ndarray, perplexity: float, seed: int, n_components: int = 2):
    """openTSNE model of the landmarks (deterministic for a given seed with ``n_jobs=1``)."""
    from openTSNE import TSNE

    perp = landmark_perplexity(perplexity, len(Y))
    return TSNE(n_components=n_components, perplexity=perp, random_state=int(seed), n_jobs=1).fit(Y)


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
