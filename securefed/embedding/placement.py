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

__all__ = ["landmark_perplexity", "fit_landmark_tsne", "place_records", "place_records_umap", "place_weighted",
           "place_refine", "conditional_affinities", "gradient_descent", "weighted_tsne"]


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


# ------------------------------------------------------------------------------------------------------------
# The no-rows map with cell masses: one objective for the coordinator and the sites. It is the t-SNE of all N
# records in which the records of landmark cell L are collapsed onto one point of mass c_L: the coordinator
# optimises the cells' positions (:func:`weighted_tsne`); each site then optimises its own records (free, mass 1)
# against the cell map held fixed, the other sites' records represented by the cells' masses (:func:`place_refine`).


def _student(A, B):
    from ..kernels import sq_dists

    return 1.0 / (1.0 + sq_dists(A, B))


def conditional_affinities(D2: np.ndarray, logmass: np.ndarray, perplexity: float, iters: int = 60) -> np.ndarray:
    """Rows ``p_{j|i} ∝ m_j exp(−β_i d²_ij)`` with entropy ``log(perplexity)`` (``D2`` may hold +inf: excluded)."""
    n = D2.shape[0]
    target = np.log(perplexity)
    fin = np.isfinite(D2)
    scale = np.array([np.median(r[f]) if f.any() else 1.0 for r, f in zip(D2, fin)])
    Dn = np.where(fin, D2 / np.maximum(scale[:, None], 1e-12), np.inf)
    lo, hi, beta = np.full(n, 1e-6), np.full(n, 1e6), np.ones(n)
    P = None
    for _ in range(iters):
        L = logmass[None, :] - beta[:, None] * Dn
        L -= L.max(axis=1, keepdims=True)
        E = np.exp(L)
        P = E / E.sum(axis=1, keepdims=True)
        H = -(P * np.log(np.maximum(P, 1e-300))).sum(axis=1)
        big = H > target  # too flat: sharpen
        lo = np.where(big, beta, lo)
        hi = np.where(big, hi, beta)
        beta = np.sqrt(lo * hi)
    return P


def gradient_descent(y0, grad, n_iter: int, lr: float, momentum: float):
    """t-SNE's optimiser: momentum with per-coordinate gains (as openTSNE)."""
    y = np.array(y0, dtype=np.float64, copy=True)
    upd = np.zeros_like(y)
    gains = np.ones_like(y)
    for _ in range(n_iter):
        g = grad(y)
        inc = np.sign(g) != np.sign(upd)
        gains = np.where(inc, gains + 0.2, gains * 0.8).clip(0.01)
        upd = momentum * upd - lr * gains * g
        y = y + upd
    return y


def weighted_tsne(Y: np.ndarray, c: np.ndarray, *, perplexity: float = 30.0, seed: int = 0, n_iter: int = 750,
                  early_iter: int = 250, exaggeration: float = 12.0, n_components: int = 2):
    """The coordinator's map of the landmarks: exact t-SNE in which landmark L stands for ``c_L`` collapsed
    records (mass-weighted affinities; repulsion ∝ c_I c_J; openTSNE's schedule). Returns ``(Z, Zn)``: the 2-D
    coordinates and the normalisation ``Zn = Σ_{I≠J} c_I c_J w_IJ`` of the final map (both broadcast)."""
    from ..kernels import sq_dists

    k = len(Y)
    c = np.asarray(c, dtype=np.float64)
    N = c.sum()
    D2 = sq_dists(Y)
    np.fill_diagonal(D2, np.inf)
    pc = conditional_affinities(D2, np.log(c), min(perplexity, (k - 1) / 3.0))
    P = (c[:, None] * pc + (c[:, None] * pc).T) / (2 * N)
    rng = np.random.default_rng(seed)
    Yc = Y - (c[:, None] * Y).sum(axis=0) / N
    U, S, _ = np.linalg.svd(Yc, full_matrices=False)
    z0 = U[:, :n_components] * S[:n_components]
    if z0.shape[1] < n_components:  # fewer landmark dimensions than map dimensions: pad with small noise
        z0 = np.hstack([z0, rng.standard_normal((k, n_components - z0.shape[1]))])
    z0 = z0 / np.std(z0[:, 0]) * 1e-4 + 1e-6 * rng.standard_normal(z0.shape)
    cc = np.outer(c, c)
    np.fill_diagonal(cc, 0.0)

    def grad(z, exag):
        W = _student(z, z)
        np.fill_diagonal(W, 0.0)
        A = exag * P / c[:, None] * W - (c[None, :] * W * W) / (cc * W).sum()
        return 4 * (A.sum(axis=1)[:, None] * z - A @ z)

    z = gradient_descent(z0, lambda z: grad(z, exaggeration), early_iter, max(N / exaggeration, 50), 0.5)
    z = gradient_descent(z, lambda z: grad(z, 1.0), n_iter - early_iter, max(N, 50), 0.8)
    W = _student(z, z)
    np.fill_diagonal(W, 0.0)
    return z, float((cc * W).sum())


def place_weighted(F: np.ndarray, Y: np.ndarray, Z: np.ndarray, *, perplexity: float = 5.0, k: int | None = None):
    """Each record at the perplexity-weighted mean of its ``k`` nearest landmarks' positions."""
    from ..kernels import sq_dists

    k = int(min(len(Y), k or max(3 * perplexity, 10)))
    D2 = sq_dists(F, Y)
    idx = np.argpartition(D2, k - 1, axis=1)[:, :k] if k < len(Y) else np.tile(np.arange(len(Y)), (len(F), 1))
    d = np.take_along_axis(D2, idx, axis=1)
    P = conditional_affinities(d, np.zeros(k), perplexity)
    return np.einsum("nk,nkc->nc", P, Z[idx])


def place_refine(F: np.ndarray, Y: np.ndarray, Z: np.ndarray, c: np.ndarray, Zn: float, *, perplexity: float = 30.0,
                 n_iter: int = 150, early_iter: int = 100, exaggeration: float = 4.0, init_perplexity: float = 5.0,
                 counted: bool = True, interact: bool = True) -> np.ndarray:
    """A site's step: its records' t-SNE against the fixed cell map (``F`` its records in the landmarks' space).

    The affinities are the N-record t-SNE's restricted to this site's rows: over its own records (mass 1 each) and
    the cells (mass ``c_L``); attraction to a cell uses its whole mass, repulsion only the other sites' mass
    ``M_L = c_L − own_L`` (a site's own records repel each other directly); ``Zn`` is the coordinator's
    normalisation. Starts at :func:`place_weighted`; t-SNE's schedule in miniature: ``early_iter`` iterations with the
    attraction exaggerated ``exaggeration``-fold at momentum 0.5 (records settle into their cells' neighbourhoods
    before repulsion spreads them: +1–2 CA-10NN points on digits and MNIST-5k against none), then ``n_iter`` at
    momentum 0.8; learning rate N/12. Uses
    nothing but the broadcast (Y, Z, c, Zn) and the site's own records. ``counted=False`` places new records that
    the masses do not include (``transform``): every cell then repels with its whole mass. ``interact=False``
    places every record against the cells alone (no affinity to, no repulsion from the site's other records, every
    cell with its whole mass): each coordinate is then a function of its own record and the broadcast — what the DP
    density counts (:func:`securefed.landmarks.merf.density_counts`).
    """
    from ..kernels import sq_dists
    from ..landmarks.cells import cell_counts

    n = len(F)
    c = np.asarray(c, dtype=np.float64)
    N = float(c.sum())
    M = np.maximum(c - cell_counts(F, Y), 0.0) if counted and interact else c
    y0 = place_weighted(F, Y, Z, perplexity=init_perplexity)
    logc = np.log(np.maximum(c, 1e-300))
    if interact:
        D_ff = sq_dists(F)
        np.fill_diagonal(D_ff, np.inf)
        pc = conditional_affinities(np.hstack([D_ff, sq_dists(F, Y)]), np.concatenate([np.zeros(n), logc]),
                                    min(perplexity, (n + len(Y) - 1) / 3.0))
        Pff = (pc[:, :n] + pc[:, :n].T) / (2 * N)
        Pfl = pc[:, n:] / N
    else:  # each record against the cells alone: its row does not depend on any other record
        Pfl = conditional_affinities(sq_dists(F, Y), logc, min(perplexity, (len(Y) - 1) / 3.0)) / N

    def gradient(exag: float):
        def grad(y):
            Wl = _student(y, Z)
            Al = exag * Pfl * Wl - M[None, :] * Wl * Wl / Zn
            if not interact:
                return 4 * (Al.sum(axis=1)[:, None] * y - Al @ Z)
            Wf = _student(y, y)
            np.fill_diagonal(Wf, 0.0)
            Af = exag * Pff * Wf - Wf * Wf / Zn
            return 4 * ((Af.sum(axis=1) + Al.sum(axis=1))[:, None] * y - Af @ y - Al @ Z)

        return grad

    lr = max(N / 12.0, 50.0)
    y = gradient_descent(y0, gradient(float(exaggeration)), int(early_iter), lr, 0.5) if early_iter else y0
    return gradient_descent(y, gradient(1.0), n_iter, lr, 0.8)
