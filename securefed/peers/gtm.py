"""Generative topographic mapping, centralized and from distributed local abstractions (Zhang & Cheung).

Zhang & Cheung (Zhang & Cheung, "Visualizing Global Manifold Based on Distributed Local Data
Abstractions") lets every site summarise its records by a Gaussian mixture read off an agglomerative
hierarchy (§2.1) and learns one global GTM (Bishop, Svensén & Williams 1998) from the pooled
components by a modified EM (§2.2.2, Eqs. 6–9), initialised from global moments assembled from the
local statistics (§2.2.3).

Row convention: data ``T`` is ``N × d``; the latent grid ``Z`` is ``K × 2``; the basis matrix
``Φ`` is ``K × (M + 1)`` (M RBFs and a bias); the weights ``W`` are ``(M + 1) × d``; the mixture centres
are ``Y = Φ W`` (``K × d``), i.e. ``y(z_k; W) = W Ψ(z_k)`` of the paper, transposed.

What leaves a site: for each of its ``c`` groups the count ``N_l``, the mean ``μ_l`` and the
(regularised) covariance ``Σ_l`` — nothing else; projections of a site's own records are computed at
the site from the broadcast global model ``(W, β)``. A group of one record reveals that record
exactly (its mean *is* the record); small groups reveal little-averaged records. There is no formal
privacy guarantee; ``privacy_report()`` states the smallest group size that left each site.
"""

from __future__ import annotations

import time

import numpy as np
from scipy.cluster.hierarchy import cut_tree, linkage
from scipy.special import logsumexp

from ..data import check_sites
from ..errors import ConfigError, DataError, bad_value

__all__ = [
    "WHAT_LEAVES",
    "latent_grid",
    "rbf_basis",
    "global_moments",
    "pca_init_weights",
    "gtm_log_densities",
    "gtm_responsibilities",
    "m_step_weights",
    "m_step_beta",
    "kl_local_gtm",
    "abstraction_responsibilities",
    "m_step_beta_abstraction",
    "local_abstraction",
    "project",
    "CentralizedGTM",
    "DistributedGTM",
]

WHAT_LEAVES = {
    "gtm": (
        "once, from every site: c Gaussian components of its records (count N_l, mean μ_l, "
        "regularised covariance Σ_l; c·(1 + d + d(d+1)/2) numbers), cut from a Ward hierarchy. "
        "No formal privacy: a component of one record is that record. Back to the sites: the "
        "global map (W, β); each site projects its own records locally."
    ),
}


# ---------------------------------------------------------------------------- model pieces
def latent_grid(shape: tuple[int, int]) -> np.ndarray:
    """Regular ``k1 × k2`` lattice of latent points ``z_k`` in ``[−1, 1]²`` (``K × 2``, §2.2.1)."""
    a = np.linspace(-1.0, 1.0, int(shape[0]))
    b = np.linspace(-1.0, 1.0, int(shape[1]))
    A, B = np.meshgrid(a, b, indexing="ij")
    return np.column_stack([A.ravel(), B.ravel()])


def rbf_basis(Z: np.ndarray, n_rbf: tuple[int, int], width: float = 1.0) -> np.ndarray:
    """Basis matrix ``Φ`` of the generalized linear model ``y(z; W) = W Ψ(z)`` (Zhang & Cheung §2.2.1).

    ``M = n_rbf[0] · n_rbf[1]`` Gaussian RBFs centred on a lattice in ``[−1, 1]²`` with common width
    ``width × (centre spacing)`` (Bishop et al. 1998), plus a constant (bias) column.
    """
    C = latent_grid(n_rbf)
    spacing = 2.0 / max(max(n_rbf) - 1, 1)
    s = float(width) * spacing
    d2 = ((Z[:, None, :] - C[None, :, :]) ** 2).sum(axis=2)
    return np.column_stack([np.exp(-d2 / (2.0 * s * s)), np.ones(len(Z))])


def global_moments(counts: np.ndarray, means: np.ndarray, covs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """§2.2.3 of Zhang & Cheung: global mean and covariance from local component statistics.

    ``μ = Σ_l N_l μ_l / N`` and ``Σ = Σ_l N_l (Σ_l + μ_l μ_lᵀ) / N − μ μᵀ`` (covariances with the
    ``1/N_l`` normalisation, so the identity is exact).
    """
    counts = np.asarray(counts, dtype=np.float64)
    N = counts.sum()
    mu = counts @ means / N
    second = np.einsum("l,lij->ij", counts, covs) + np.einsum("l,li,lj->ij", counts, means, means)
    return mu, second / N - np.outer(mu, mu)


def pca_init_weights(mu: np.ndarray, cov: np.ndarray, Z: np.ndarray, Phi: np.ndarray) -> tuple[np.ndarray, float]:
    """PCA initialisation of GTM (Bishop et al. 1998 §2.3; Zhang & Cheung §2.2.3).

    ``W`` is the least-squares fit ``Φ W ≈ Ẑ (U_2 Λ_2^{1/2})ᵀ + μ`` where ``Ẑ`` is the latent grid
    standardised per coordinate and ``U_2, Λ_2`` the two leading eigenpairs of ``cov``;
    ``β⁻¹ = max(λ_3, ½ · mean nearest-neighbour squared distance of the initial centres)``.
    """
    evals, evecs = np.linalg.eigh(cov)
    order = np.argsort(evals)[::-1]
    evals, evecs = np.clip(evals[order], 0.0, None), evecs[:, order]
    L = Z.shape[1]
    Zs = (Z - Z.mean(axis=0)) / Z.std(axis=0)
    target = Zs @ (evecs[:, :L] * np.sqrt(evals[:L])).T + mu
    W, *_ = np.linalg.lstsq(Phi, target, rcond=None)
    Y = Phi @ W
    d2 = ((Y[:, None, :] - Y[None, :, :]) ** 2).sum(axis=2)
    np.fill_diagonal(d2, np.inf)
    inv_beta = 0.5 * float(np.mean(d2.min(axis=1)))
    if len(evals) > L:
        inv_beta = max(inv_beta, float(evals[L]))
    return W, 1.0 / max(inv_beta, 1e-12)


def _sq_dists(A: np.ndarray, B: np.ndarray) -> np.ndarray:
    d2 = (A * A).sum(1)[:, None] + (B * B).sum(1)[None, :] - 2.0 * A @ B.T
    return np.maximum(d2, 0.0)


def gtm_log_densities(T: np.ndarray, Y: np.ndarray, beta: float) -> np.ndarray:
    """Eq. (1) of Zhang & Cheung in logs: ``ln p(t_i | z_k) = d/2 ln(β/2π) − β/2 ‖t_i − y_k‖²`` (N × K)."""
    d = T.shape[1]
    return 0.5 * d * np.log(beta / (2.0 * np.pi)) - 0.5 * beta * _sq_dists(T, Y)


def gtm_responsibilities(T: np.ndarray, Y: np.ndarray, beta: float) -> tuple[np.ndarray, float]:
    """E-step of GTM (§2.2.1 of Zhang & Cheung): ``R_ik = p(t_i|z_k) / Σ_j p(t_i|z_j)``.

    Returns ``(R, log_likelihood)`` with ``ln L = Σ_i ln (1/K) Σ_k p(t_i|z_k)`` (uniform prior on the grid).
    """
    logp = gtm_log_densities(T, Y, beta)
    lse = logsumexp(logp, axis=1, keepdims=True)
    return np.exp(logp - lse), float(lse.sum() - len(T) * np.log(Y.shape[0]))


def m_step_weights(Phi: np.ndarray, R: np.ndarray, targets: np.ndarray, beta: float, alpha: float) -> np.ndarray:
    """Eq. (2) / Eq. (8) of Zhang & Cheung: solve ``Σ_i Σ_k R_ik {W Ψ(z_k) − t_i} Ψ(z_k)ᵀ = 0`` for ``W``.

    In rows: ``(Φᵀ G Φ + (α/β) I) W = Φᵀ Rᵀ T`` with ``G = diag(Σ_i R_ik)``; ``targets`` are the data
    ``t_i`` (Eq. 2) or the local means ``μ_l`` with the weighted responsibilities ``R_lk`` (Eq. 8).
    ``α`` is the weight-decay of Bishop et al. (1998) (``α = 0`` is the paper's unregularised step).
    """
    G = R.sum(axis=0)
    A = Phi.T @ (G[:, None] * Phi)
    if alpha > 0:
        A = A + (alpha / beta) * np.eye(A.shape[0])
    b = Phi.T @ (R.T @ targets)
    try:
        return np.linalg.solve(A, b)
    except np.linalg.LinAlgError:
        return np.linalg.lstsq(A, b, rcond=None)[0]


def m_step_beta(T: np.ndarray, R: np.ndarray, Y: np.ndarray) -> float:
    """Eq. (3) of Zhang & Cheung: ``1/β = (1/(N d)) Σ_i Σ_k R_ik ‖W Ψ(z_k) − t_i‖²``."""
    N, d = T.shape
    return float(N * d / np.sum(R * _sq_dists(T, Y)))


def kl_local_gtm(
    means: np.ndarray, covs: np.ndarray, Y: np.ndarray, beta: float, include_constant: bool = True
) -> np.ndarray:
    """Eq. (7) of Zhang & Cheung: ``D(N(μ_l, Σ_l) ‖ N(y_k, β⁻¹ I))`` for every pair (L × K).

    ``D = ln(β^{-d/2} / |Σ_l|^{1/2}) + β/2 tr Σ_l + ½ (β ‖y_k − μ_l‖² − d)``. With
    ``include_constant=False`` only the ``k``-dependent part ``β/2 ‖y_k − μ_l‖²`` is returned — Eq. (6)
    normalises over ``k``, so per-component constants cancel (and a singular ``Σ_l``, e.g. one record,
    has ``ln|Σ_l| = −∞``).
    """
    quad = 0.5 * beta * _sq_dists(means, Y)
    if not include_constant:
        return quad
    d = means.shape[1]
    sign, logdet = np.linalg.slogdet(covs)
    logdet = np.where(sign > 0, logdet, -np.inf)
    tr = np.trace(covs, axis1=1, axis2=2)
    const = -0.5 * d * np.log(beta) - 0.5 * logdet + 0.5 * beta * tr - 0.5 * d
    return const[:, None] + quad


def abstraction_responsibilities(D: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Eqs. (5)–(6) of Zhang & Cheung: ``R_lk = N_l · exp(−D_lk) / Σ_j exp(−D_lj)`` (L × K).

    Eq. (6) gives the normalised indicator of component ``l``; Eq. (5) defines ``R_lk`` as the sum of
    the responsibilities of the ``N_l`` records it stands for, hence the factor ``N_l`` (this is what
    makes Eq. 9's ``1/(N d)`` and the one-record-per-component limit come out right).
    """
    logits = -D
    logits = logits - logsumexp(logits, axis=1, keepdims=True)
    return np.asarray(counts, dtype=np.float64)[:, None] * np.exp(logits)


def m_step_beta_abstraction(R: np.ndarray, means: np.ndarray, covs: np.ndarray, Y: np.ndarray) -> float:
    """Eq. (9) of Zhang & Cheung: ``1/β = (1/(N d)) Σ_k Σ_l R_lk E_{t∼N(μ_l,Σ_l)} ‖t − W Ψ(z_k)‖²``.

    The expectation is ``tr Σ_l + ‖μ_l − y_k‖²``; the paper's printed form is the same sum expanded
    (``Σ_l + μ_l μ_lᵀ`` terms minus the centres' terms) at the stationary point of Eq. (8).
    """
    N = R.sum()
    d = means.shape[1]
    tr = np.trace(covs, axis1=1, axis2=2)
    total = float(np.sum(R * (tr[:, None] + _sq_dists(means, Y))))
    return float(N * d / total)


def _abstraction_objective(means, covs, Y, beta, counts) -> float:
    """Lower bound maximised by the modified EM: ``Σ_l N_l ln (1/K) Σ_k exp E_{N(μ_l,Σ_l)} ln p(t|z_k)``.

    Equals the raw-data log-likelihood when every component is one record with ``Σ_l = 0``.
    """
    d = means.shape[1]
    tr = np.trace(covs, axis1=1, axis2=2)
    e_logp = 0.5 * d * np.log(beta / (2.0 * np.pi)) - 0.5 * beta * (tr[:, None] + _sq_dists(means, Y))
    return float(np.sum(counts * (logsumexp(e_logp, axis=1) - np.log(Y.shape[0]))))


def _log_prior(W: np.ndarray, alpha: float) -> float:
    if alpha <= 0:
        return 0.0
    return float(0.5 * W.size * np.log(alpha / (2.0 * np.pi)) - 0.5 * alpha * np.sum(W * W))


def local_abstraction(X: np.ndarray, n_components: int | str, reg_covar: float = 1e-6) -> dict:
    """§2.1 of Zhang & Cheung: Gaussian components of one site's records from a Ward hierarchy.

    The dendrogram (agglomerative, Ward linkage) is cut at ``n_components`` groups; each group gives
    its count ``N_l``, mean ``μ_l`` and covariance ``Σ_l`` (``1/N_l`` normalisation) with ``reg_covar·I``
    added. ``n_components="all"`` (or ``≥ N``) gives one component per record.

    Returns
    -------
    dict with ``counts`` (c,), ``means`` (c, d), ``covs`` (c, d, d).
    """
    X = np.asarray(X, dtype=np.float64)
    n, d = X.shape
    if n_components == "all" or n_components == n:
        labels = np.arange(n)
    else:
        if n_components > n:
            raise ConfigError(
                bad_value(
                    "n_components_per_site", n_components, f"a site holds only {n} records; use at most {n} or 'all'"
                )
            )
        if n_components == 1:
            labels = np.zeros(n, dtype=int)
        else:
            Zl = linkage(X, method="ward")
            labels = cut_tree(Zl, n_clusters=int(n_components)).ravel()
    groups = np.unique(labels)
    counts = np.array([np.sum(labels == g) for g in groups], dtype=np.float64)
    means = np.array([X[labels == g].mean(axis=0) for g in groups])
    covs = np.empty((len(groups), d, d))
    for i, g in enumerate(groups):
        C = X[labels == g] - means[i]
        covs[i] = C.T @ C / counts[i]
    covs += reg_covar * np.eye(d)
    return {"counts": counts, "means": means, "covs": covs}


def project(X: np.ndarray, Y: np.ndarray, beta: float, Z: np.ndarray, mode: str = "mean") -> np.ndarray:
    """Posterior mean ``Σ_k R_ik z_k`` or mode ``z_{argmax_k R_ik}`` of each record (Bishop et al. 1998).

    Run by each site on its own records with the broadcast ``Y = Φ W`` and ``β``.
    """
    R, _ = gtm_responsibilities(X, Y, beta)
    if mode == "mean":
        return R @ Z
    return Z[np.argmax(R, axis=1)]


# ---------------------------------------------------------------------------- estimators
def _pair(name, value) -> tuple[int, int]:
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        value = (int(value), int(value))
    try:
        a, b = (int(v) for v in value)
    except (TypeError, ValueError):
        raise ConfigError(bad_value(name, value, "use a pair of integers >= 2, e.g. (20, 20)")) from None
    if a < 2 or b < 2:
        raise ConfigError(bad_value(name, value, "use a pair of integers >= 2, e.g. (20, 20)"))
    return a, b


class _GTMBase:
    projection: str  # set by the subclass's __init__

    def _check_common(self):
        grid = _pair("grid", self.grid)
        n_rbf = _pair("n_rbf", self.n_rbf)
        if isinstance(self.iters, bool) or not isinstance(self.iters, (int, np.integer)) or self.iters < 1:
            raise ConfigError(bad_value("iters", self.iters, "use a positive integer, e.g. 100"))
        for name in ("rbf_width",):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and np.isfinite(v) and v > 0):
                raise ConfigError(bad_value(name, v, "use a positive number, e.g. 1.0"))
        if not (isinstance(self.alpha, (int, float)) and np.isfinite(self.alpha) and self.alpha >= 0):
            raise ConfigError(bad_value("alpha", self.alpha, "use a non-negative weight decay, e.g. 1e-3"))
        if self.projection not in ("mean", "mode"):
            raise ConfigError(bad_value("projection", self.projection, "use 'mean' or 'mode'"))
        if not (isinstance(self.tol, (int, float)) and self.tol >= 0):
            raise ConfigError(bad_value("tol", self.tol, "use a non-negative number, e.g. 1e-6"))
        Z = latent_grid(grid)
        Phi = rbf_basis(Z, n_rbf, self.rbf_width)
        return Z, Phi

    def _finish(self, Z, Phi, W, beta, history):
        self.latent_grid_ = Z
        self.basis_ = Phi
        self.W_ = W
        self.beta_ = float(beta)
        self.centres_ = Phi @ W
        self.history_ = history
        self.n_iter_ = len(history) - 1

    def transform(self, X) -> np.ndarray:
        """Project records onto the latent plane (posterior mean or mode, per ``projection``)."""
        if not hasattr(self, "W_"):
            raise ConfigError(bad_value(type(self).__name__, "unfitted", "call fit first"))
        if isinstance(X, (list, tuple)):
            return np.vstack([self.transform(x) for x in check_sites(X)])
        X = check_sites([X])[0]
        if X.shape[1] != self.centres_.shape[1]:
            raise DataError(bad_value("X.shape", X.shape, f"use records with {self.centres_.shape[1]} features"))
        return project(X, self.centres_, self.beta_, self.latent_grid_, self.projection)


class CentralizedGTM(_GTMBase):
    """GTM on pooled raw data: Bishop, Svensén & Williams (1998) EM (Zhang & Cheung Eqs. 1–3).

    Parameters
    ----------
    grid : (int, int)
        Latent lattice (Zhang & Cheung uses 40 × 40 = 1600 points).
    n_rbf : (int, int)
        RBF centres of the mapping.
    rbf_width : float
        RBF width in units of the centre spacing.
    alpha : float
        Weight decay (Gaussian prior on ``W``); 0 = plain maximum likelihood.
    iters : int
        Maximum EM iterations.
    tol : float
        Stop when the objective improves by less than ``tol · |objective|``.
    projection : "mean" or "mode"
    random_state : None, int or Generator
        Unused (PCA initialisation is deterministic); accepted for interface uniformity.

    Attributes
    ----------
    W_, beta_, centres_, latent_grid_, basis_
        The fitted model (``centres_ = basis_ @ W_``).
    history_ : list of dict
        Per iteration (0 = after initialisation): ``log_likelihood`` and ``objective``
        (log-likelihood + log prior of ``W``; EM never decreases it).
    embedding_ : ndarray (fit_transform's output)
    """

    def __init__(
        self,
        grid=(20, 20),
        n_rbf=(5, 5),
        rbf_width=1.0,
        alpha=1e-3,
        iters=100,
        tol=0.0,
        projection="mean",
        random_state=None,
    ):
        self.grid = grid
        self.n_rbf = n_rbf
        self.rbf_width = rbf_width
        self.alpha = alpha
        self.iters = iters
        self.tol = tol
        self.projection = projection
        self.random_state = random_state

    def fit(self, X, y=None):
        """Fit on an ``(N, d)`` array (or a list of site arrays, pooled)."""
        t0 = time.perf_counter()
        Z, Phi = self._check_common()
        T = np.vstack(check_sites(X if isinstance(X, (list, tuple)) else [X], min_records=2))
        mu = T.mean(axis=0)
        C = T - mu
        W, beta = pca_init_weights(mu, C.T @ C / len(T), Z, Phi)
        alpha = float(self.alpha)
        history = []
        R, ll = gtm_responsibilities(T, Phi @ W, beta)
        history.append({"log_likelihood": ll, "objective": ll + _log_prior(W, alpha), "beta": beta})
        for _ in range(int(self.iters)):
            W = m_step_weights(Phi, R, T, beta, alpha)
            beta = m_step_beta(T, R, Phi @ W)
            R, ll = gtm_responsibilities(T, Phi @ W, beta)
            obj = ll + _log_prior(W, alpha)
            history.append({"log_likelihood": ll, "objective": obj, "beta": beta})
            if self.tol > 0 and abs(obj - history[-2]["objective"]) < self.tol * abs(obj):
                break
        self._finish(Z, Phi, W, beta, history)
        self.fit_seconds_ = time.perf_counter() - t0
        return self

    def fit_transform(self, X, y=None) -> np.ndarray:
        """Fit and return the projections of the records (site order when a list is given)."""
        self.fit(X)
        self.embedding_ = self.transform(X)
        return self.embedding_


class DistributedGTM(_GTMBase):
    """Global GTM from local Gaussian abstractions (Zhang & Cheung §2, Eqs. 5–9).

    Parameters
    ----------
    n_components_per_site : int or "all"
        Groups cut from each site's Ward hierarchy (the data granularity); "all" = one per record
        (the paper's extreme case, equivalent to the centralized GTM).
    grid, n_rbf, rbf_width, alpha, iters, tol, projection
        As :class:`CentralizedGTM`.
    reg_covar : float
        Added to the diagonal of every shared covariance (≥ 0).
    random_state : None, int or Generator
        Unused (Ward clustering and PCA initialisation are deterministic).

    Attributes
    ----------
    components_ : dict
        The pooled components the server received (``counts``, ``means``, ``covs``, ``site``).
    site_embeddings_ : list of ndarray
        Each site's projections, computed locally.
    embedding_ : ndarray
        The projections concatenated in site order.
    history_ : list of dict
        Per iteration: ``objective`` (the bound the modified EM maximises, see
        ``_abstraction_objective``, plus the log prior) and ``beta``.
    bytes_up_ : list of int
        Bytes each site sent (float64 statistics).
    """

    def __init__(
        self,
        n_components_per_site=60,
        grid=(20, 20),
        n_rbf=(5, 5),
        rbf_width=1.0,
        alpha=1e-3,
        iters=100,
        tol=0.0,
        projection="mean",
        reg_covar=1e-6,
        random_state=None,
    ):
        self.n_components_per_site = n_components_per_site
        self.grid = grid
        self.n_rbf = n_rbf
        self.rbf_width = rbf_width
        self.alpha = alpha
        self.iters = iters
        self.tol = tol
        self.projection = projection
        self.reg_covar = reg_covar
        self.random_state = random_state

    def _check_components(self):
        c = self.n_components_per_site
        if c == "all":
            return c
        if isinstance(c, bool) or not isinstance(c, (int, np.integer)) or c < 1:
            raise ConfigError(bad_value("n_components_per_site", c, "use a positive integer or 'all'"))
        return int(c)

    def fit(self, sites, y=None):
        """Abstract each site locally, pool the components and run the modified EM; returns ``self``."""
        t0 = time.perf_counter()
        Z, Phi = self._check_common()
        c = self._check_components()
        if not (isinstance(self.reg_covar, (int, float)) and np.isfinite(self.reg_covar) and self.reg_covar >= 0):
            raise ConfigError(bad_value("reg_covar", self.reg_covar, "use a non-negative number, e.g. 1e-6"))
        sites = check_sites(sites, min_records=2)
        # --- at each site: the abstraction (only these statistics leave the site)
        parts = [local_abstraction(X, c, float(self.reg_covar)) for X in sites]
        counts = np.concatenate([p["counts"] for p in parts])
        means = np.vstack([p["means"] for p in parts])
        covs = np.concatenate([p["covs"] for p in parts])
        site_of = np.concatenate([np.full(len(p["counts"]), i) for i, p in enumerate(parts)])
        d = means.shape[1]
        self.bytes_up_ = [int(len(p["counts"]) * (1 + d + d * (d + 1) // 2) * 8) for p in parts]
        # --- at the server: §2.2.3 initialisation, then the modified EM (Eqs. 6–9)
        mu, cov = global_moments(counts, means, covs)
        W, beta = pca_init_weights(mu, cov, Z, Phi)
        alpha = float(self.alpha)
        history = [
            {
                "objective": _abstraction_objective(means, covs, Phi @ W, beta, counts) + _log_prior(W, alpha),
                "beta": beta,
            }
        ]
        for _ in range(int(self.iters)):
            Y = Phi @ W
            R = abstraction_responsibilities(kl_local_gtm(means, covs, Y, beta, include_constant=False), counts)
            W = m_step_weights(Phi, R, means, beta, alpha)
            beta = m_step_beta_abstraction(R, means, covs, Phi @ W)
            obj = _abstraction_objective(means, covs, Phi @ W, beta, counts) + _log_prior(W, alpha)
            history.append({"objective": obj, "beta": beta})
            if self.tol > 0 and abs(obj - history[-2]["objective"]) < self.tol * abs(obj):
                break
        self._finish(Z, Phi, W, beta, history)
        self.components_ = {"counts": counts, "means": means, "covs": covs, "site": site_of}
        # --- back at each site: local projections with the broadcast (W, β)
        self.site_embeddings_ = [project(X, self.centres_, self.beta_, Z, self.projection) for X in sites]
        self.embedding_ = np.vstack(self.site_embeddings_)
        self.fit_seconds_ = time.perf_counter() - t0
        return self

    def fit_transform(self, sites, y=None) -> np.ndarray:
        """Fit and return every site's locally computed projections, concatenated in site order."""
        return self.fit(sites).embedding_

    def privacy_report(self) -> dict:
        """What left each site (after ``fit``)."""
        if not hasattr(self, "components_"):
            raise ConfigError(bad_value("DistributedGTM", "unfitted", "call fit(sites) first"))
        comp = self.components_
        per_site = []
        for s in range(int(comp["site"].max()) + 1):
            cnt = comp["counts"][comp["site"] == s]
            per_site.append(
                {
                    "components": int(len(cnt)),
                    "smallest_group": int(cnt.min()),
                    "singleton_groups": int(np.sum(cnt == 1)),
                    "bytes_up": self.bytes_up_[s],
                }
            )
        return {"method": "gtm", "what_leaves": WHAT_LEAVES["gtm"], "sites": per_site, "formal_guarantee": None}
