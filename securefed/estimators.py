"""Fed-tSNE, Fed-UMAP and Fed-SpeClust (``papers/000`` Algorithms 2–3) as scikit-learn-style estimators.

A federated fit has three stages, each a method of :class:`_FederatedEmbedding`:

1. **Landmarks** — FedDL (:func:`securefed.landmarks.feddl.fed_dl`, Algorithm 1) through the chosen secure sum
   (plain / SecAgg+ / CKKS) and, optionally, the DP hook.
2. **Audit gate** — an optional ``auditor`` callable runs on the landmarks *before* anything per-record
   leaves a site; it raises :class:`~securefed.errors.AuditFailedError` to stop the fit.
3. **Embedding** — one of two site-to-server modes (``nystrom=``):

   * ``"rows"`` (the paper): every site sends one row per record — squared distances ``D²(X_p, Y)``
     (t-SNE, UMAP) or kernel values ``K(X_p, Y)`` (spectral clustering). The server reconstructs either
     densely (``reconstruction="paper"``, Eq. 21 / Alg. 3, n × n) or with a feature map and a k-NN
     graph (``"features"``, no n × n). **These rows give every record back** when ``n_y > m``
     (trilateration, DESIGN §2); with DP the rows are computed from perturbed records (Sec. 5.1).
   * ``"local"`` (no rows): the server embeds only the landmarks and sends that model to the sites; each
     site places its own records against it (openTSNE ``transform`` / UMAP ``transform`` / nearest
     kernel cluster) and only final coordinates or labels leave the site.

Centralized counterparts (:class:`CentralizedTSNE`, :class:`CentralizedUMAP`,
:class:`CentralizedSpectralClustering`) run the same libraries on pooled data for comparison.
"""

from __future__ import annotations

import time

import numpy as np

from .securesum.base import make_aggregator
from .errors import ConfigError, bad_value
from .kernels import gaussian_kernel, median_gamma, local_median_sq_dist, sq_dists
from .landmarks import FedDLResult, check_sites, fed_dl, lloyd_refine
from .embedding import nystrom as _ny

__all__ = [
    "FedTSNE",
    "FedUMAP",
    "FedSpectralClustering",
    "CentralizedTSNE",
    "CentralizedUMAP",
    "CentralizedSpectralClustering",
    "NYSTROM_MODES",
    "knn_from_distance_rows",
    "tsne_from_distance_rows",
    "umap_from_distance_rows",
    "spectral_from_kernel_rows",
    "tsne_landmark_model",
    "umap_landmark_model",
    "spectral_landmark_labels",
    "spectral_assign",
]

NYSTROM_MODES = ("rows", "local")


# -------------------------------------------------------------------------------- server-side stages
# The server's "rows → result" step of each estimator (rows mode) and the landmark-model steps of the
# local mode, as plain functions: the estimators call them, and so does the Flower coordinator
# (securefed.flower), so both give the same result for the same rows, landmarks and Generator.


def knn_from_distance_rows(B, landmarks, k, *, reconstruction="auto", noisy_landmarks=False, n_jobs=1, rng):
    """k-NN graph (each point itself first) from the sites' squared-distance rows ``B = D²(X, Y)``.

    ``"paper"``: Eq. (21) of ``papers/000`` (:func:`securefed.embedding.nystrom.nystrom_distance`, dense n × n);
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


def tsne_from_distance_rows(B, landmarks, *, perplexity=30.0, n_components=2, n_iter=750, reconstruction="auto",
                            noisy_landmarks=False, n_jobs=1, rng):
    """Fed-tSNE's server step (``papers/000`` Algorithm 2, rows mode): the t-SNE embedding of all records
    from their distance rows ``B`` (k-NN by :func:`knn_from_distance_rows`, then openTSNE).

    Returns
    -------
    (embedding (n, n_components), reconstruction path)
    """
    from openTSNE import TSNEEmbedding, affinity, initialization
    from openTSNE.nearest_neighbors import PrecomputedNeighbors

    n = len(B)
    k = int(min(n - 1, max(3 * perplexity + 1, 10)))
    idx, dist, _, path = knn_from_distance_rows(B, landmarks, k + 1, reconstruction=reconstruction,
                                                noisy_landmarks=noisy_landmarks, n_jobs=n_jobs, rng=rng)
    nn = PrecomputedNeighbors(idx[:, 1:], dist[:, 1:])
    P = affinity.PerplexityBasedNN(knn_index=nn, perplexity=float(min(perplexity, (k) / 3.0)),
                                   n_jobs=n_jobs, random_state=_seed(rng))
    init = initialization.spectral(P.P, n_components=n_components, random_state=_seed(rng))
    E = TSNEEmbedding(init, P, n_jobs=n_jobs, random_state=_seed(rng))
    E = E.optimize(250, exaggeration=12, momentum=0.5)
    E = E.optimize(max(n_iter - 250, 1), momentum=0.8)
    return np.asarray(E), path


def umap_from_distance_rows(B, landmarks, *, n_neighbors=15, min_dist=0.1, n_components=2, reconstruction="auto",
                            noisy_landmarks=False, n_jobs=1, rng):
    """Fed-UMAP's server step (``papers/000`` Algorithm 2, rows mode): UMAP of all records from ``B``.

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
        idx, dist, Z, path = knn_from_distance_rows(B, landmarks, k, reconstruction=reconstruction,
                                                    noisy_landmarks=noisy_landmarks, n_jobs=n_jobs, rng=rng)
        if path == "paper":
            model = umap.UMAP(n_components=n_components, n_neighbors=k, min_dist=min_dist,
                              metric="precomputed", random_state=_seed(rng))
        else:
            model = umap.UMAP(n_components=n_components, n_neighbors=k, min_dist=min_dist,
                              precomputed_knn=(idx, dist, None), random_state=_seed(rng))
        return model.fit_transform(Z), path


def spectral_from_kernel_rows(C, landmarks, gamma, *, n_clusters=8, n_neighbors=15, reconstruction="auto", n_jobs=1,
                              rng):
    """Fed-SpeClust's server step (``papers/000`` Algorithm 3, rows mode): cluster labels of all records
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
    labels = SpectralClustering(n_clusters, affinity="precomputed_nearest_neighbors",
                                n_neighbors=k, random_state=_seed(rng)).fit_predict(G)
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
        return umap.UMAP(n_components=n_components, n_neighbors=nn, min_dist=min_dist, random_state=int(seed)).fit(landmarks)


def spectral_landmark_labels(landmarks, gamma, *, n_clusters=8, seed=0):
    """Local mode, server: spectral clustering of the landmarks with the Gaussian kernel ``K(Y, Y)``."""
    from sklearn.cluster import SpectralClustering

    W = gaussian_kernel(landmarks, None, gamma)
    return SpectralClustering(n_clusters, affinity="precomputed", random_state=int(seed)).fit_predict(W)


def spectral_assign(X, landmarks, gamma, landmark_labels, n_clusters):
    """Local mode, site: each record goes to the cluster of highest mean kernel affinity to its landmarks."""
    onehot = np.eye(n_clusters)[landmark_labels]
    onehot /= np.maximum(onehot.sum(axis=0), 1)
    return np.argmax(gaussian_kernel(X, landmarks, gamma) @ onehot, axis=1)


class _Params:
    """Minimal scikit-learn parameter protocol (``get_params`` / ``set_params`` / ``repr``)."""

    _param_names: tuple[str, ...] = ()

    def get_params(self, deep: bool = True) -> dict:
        return {k: getattr(self, k) for k in self._param_names}

    def set_params(self, **params):
        for k, v in params.items():
            if k not in self._param_names:
                raise ConfigError(bad_value(k, v, f"{type(self).__name__} has no such parameter; valid: {', '.join(self._param_names)}"))
            setattr(self, k, v)
        return self

    def __repr__(self) -> str:
        body = ", ".join(f"{k}={getattr(self, k)!r}" for k in self._param_names)
        return f"{type(self).__name__}({body})"


def _rng(random_state) -> np.random.Generator:
    return np.random.default_rng(random_state)


def _seed(rng: np.random.Generator) -> int:
    return int(rng.integers(0, 2**31 - 1))


class _FederatedEmbedding(_Params):
    """Shared machinery of the three federated estimators (landmarks → gate → Nyström stage)."""

    _common = (
        "n_landmarks", "rounds", "local_steps", "rule", "lr", "gamma", "weights", "aggregation",
        "aggregation_options", "privacy", "nystrom", "reconstruction", "rows_privacy", "auditor",
        "audit_holdout", "checkpoint", "random_state", "callback", "n_jobs", "keep_sent", "value_bound",
        "refine_rounds", "refine_min_cluster",
    )

    def _init_common(self, n_landmarks, rounds, local_steps, rule, lr, gamma, weights, aggregation,
                     aggregation_options, privacy, nystrom, reconstruction, rows_privacy, auditor,
                     audit_holdout, checkpoint, random_state, callback, n_jobs, keep_sent, value_bound,
                     refine_rounds, refine_min_cluster):
        self.refine_min_cluster = refine_min_cluster
        self.keep_sent = keep_sent
        self.value_bound = value_bound
        self.refine_rounds = refine_rounds
        self.n_landmarks = n_landmarks
        self.rounds = rounds
        self.local_steps = local_steps
        self.rule = rule
        self.lr = lr
        self.gamma = gamma
        self.weights = weights
        self.aggregation = aggregation
        self.aggregation_options = aggregation_options
        self.privacy = privacy
        self.nystrom = nystrom
        self.reconstruction = reconstruction
        self.rows_privacy = rows_privacy
        self.auditor = auditor
        self.audit_holdout = audit_holdout
        self.checkpoint = checkpoint
        self.random_state = random_state
        self.callback = callback
        self.n_jobs = n_jobs

    # ---------------------------------------------------------------- stage 1: landmarks
    def _validate(self, sites):
        sites = check_sites(sites)
        if self.nystrom not in NYSTROM_MODES:
            raise ConfigError(bad_value("nystrom", self.nystrom, "use 'rows' (the paper: one row per record leaves each site) or 'local' (no rows leave)"))
        if not (0.0 <= float(self.audit_holdout) < 0.9):
            raise ConfigError(bad_value("audit_holdout", self.audit_holdout, "use a fraction in [0, 0.9), e.g. 0.2"))
        return sites

    def _split_holdout(self, sites, rng):
        """Each site keeps ``audit_holdout`` of its records out of FedDL (non-members for the audit)."""
        if not self.audit_holdout:
            return sites, None, None
        members, holdout, member_idx = [], [], []
        for X in sites:
            n_out = int(round(self.audit_holdout * len(X)))
            n_out = min(max(n_out, 1), len(X) - 2)
            perm = rng.permutation(len(X))
            member_idx.append(np.sort(perm[n_out:]))
            members.append(X[member_idx[-1]])
            holdout.append(X[np.sort(perm[:n_out])])
        return members, holdout, member_idx

    def _fit_landmarks(self, sites, rng) -> FedDLResult:
        from .securesum.base import AGGREGATIONS

        if self.aggregation not in AGGREGATIONS:
            raise ConfigError(bad_value("aggregation", self.aggregation, f"choose one of {', '.join(AGGREGATIONS)}"))
        opts = dict(self.aggregation_options or {})
        vb = self.value_bound
        if vb is None and self.privacy is not None:
            vb = getattr(self.privacy, "tau_x", None)
        if self.aggregation != "plain" and "clip_range" not in opts:
            if vb is None:
                raise ConfigError(bad_value("value_bound", None, f"{self.aggregation} aggregation quantises into a public "
                                            "range: give a public bound on |feature values| (e.g. 16 for digits, 255 for pixels)"))
            opts["clip_range"] = float(vb)  # replaced per release by fed_dl (release_bounds)
        self.aggregator_ = make_aggregator(self.aggregation, **opts)
        return fed_dl(
            sites,
            self.n_landmarks,
            rounds=self.rounds,
            local_steps=self.local_steps,
            rule=self.rule,
            lr=self.lr,
            gamma=self.gamma,
            weights=self.weights,
            aggregator=self.aggregator_,
            privacy=self.privacy,
            checkpoint=self.checkpoint,
            value_bound=vb,
            random_state=rng,
            callback=self.callback,
        )

    def _stages(self, sites):
        """Run stages 1–2 and prepare what stage 3 needs; returns validated sites and the rng."""
        t0 = time.perf_counter()
        sites = self._validate(sites)
        rng = _rng(self.random_state)
        members, holdout, member_idx = self._split_holdout(sites, rng)
        res = self._fit_landmarks(members, rng)
        refine = self.refine_rounds
        if refine == "auto":
            refine = 10 if (self.nystrom == "local" and self.privacy is None) else 0
        if refine and self.privacy is not None:
            raise ConfigError(bad_value("refine_rounds", refine, "Lloyd refinement is not covered by differential privacy; use 0"))
        self.refinement_ = None
        if refine:
            vb = self.value_bound if self.value_bound is not None else None
            res.landmarks, self.refinement_ = lloyd_refine(members, res.landmarks, refine, aggregator=self.aggregator_,
                                                           min_cluster_size=self.refine_min_cluster,
                                                           value_bound=vb, random_state=rng)
            res.released.append(f"{refine} Lloyd rounds: per-landmark record-weighted sums and counts (one secure sum each)")
        self.timings_ = {"landmarks": time.perf_counter() - t0}
        self.feddl_ = res
        self.landmarks_ = res.landmarks
        self.gamma_ = res.gamma
        self.mmd_history_ = list(res.mmd_history)
        self.privacy_ = res.privacy
        self.member_index_ = member_idx
        self.n_sites_ = len(sites)
        self.site_sizes_ = [len(X) for X in sites]
        self.rows_sent_ = 0
        self.audit_ = None
        if self.auditor is not None:
            t1 = time.perf_counter()
            self.audit_ = self.auditor(members, holdout, res)  # raises AuditFailedError to stop here
            self.timings_["audit"] = time.perf_counter() - t1
        return sites, rng

    # ---------------------------------------------------------------- stage 3 helpers
    def _site_data_for_rows(self, sites, rng):
        """The records each site computes its rows from: raw, or perturbed (Sec. 5.1) under ``rows_privacy``."""
        if self.rows_privacy is None:
            self.rows_privacy_ = None
            return sites
        out = [self.rows_privacy.perturb_site(X, site=p, rng=rng) for p, X in enumerate(sites)]
        self.rows_privacy_ = self.rows_privacy.report()
        return out

    def _distance_rows(self, sites, rng):
        """Algorithm 2 line 2: each site sends ``D²(X_p, Y)`` (one row per record)."""
        Y = self.landmarks_
        data = self._site_data_for_rows(sites, rng)
        rows = [sq_dists(X, Y) for X in data]
        self.rows_sent_ = sum(len(r) for r in rows)
        self.sent_rows_ = np.vstack(rows) if self.keep_sent else None
        self.sent_kind_ = "squared distances to the landmarks, one row of n_y per record"
        return np.vstack(rows)

    def _kernel_rows(self, sites, rng, gamma):
        """Algorithm 3 line 2: each site sends ``K(X_p, Y)`` (one row per record)."""
        Y = self.landmarks_
        data = self._site_data_for_rows(sites, rng)
        rows = [gaussian_kernel(X, Y, gamma) for X in data]
        self.rows_sent_ = sum(len(r) for r in rows)
        self.sent_rows_ = np.vstack(rows) if self.keep_sent else None
        self.sent_kind_ = "Gaussian-kernel values to the landmarks, one row of n_y per record"
        return np.vstack(rows)

    def _site_slices(self):
        bounds = np.cumsum([0] + list(self.site_sizes_))
        return [slice(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])]

    def fit_transform(self, sites, y=None):
        """Fit and return :attr:`embedding_` (records of all sites, concatenated in site order)."""
        return self.fit(sites, y).embedding_


_COMMON_PARAMS_DOC = """
    n_landmarks : int, default 300
        ``n_y``, the number of landmarks FedDL learns.
    rounds, local_steps : int, default 60 and 5
        ``S`` and ``Q`` of Algorithm 1.
    rule : {"model", "gradient"}
        Model averaging (Eq. 15) or gradient averaging (Eq. 16).
    lr : float or "auto"
        Step size; ``"auto"`` is :func:`securefed.landmarks.feddl.default_lr`.
    gamma : float, optional
        FedDL kernel bandwidth (median heuristic when None).
    weights : "records", "uniform" or sequence
        Client weights of Eq. (8).
    aggregation : {"plain", "secagg", "ckks"}
        The secure sum FedDL uses; ``aggregation_options`` go to its constructor.
    privacy : LandmarkPrivacy, optional
        DP hook for the landmark stage (:class:`securefed.accounting.GradientPerturbation`).
    nystrom : {"rows", "local"}
        ``"rows"``: the paper — one row per record leaves each site (leaks records, DESIGN §2);
        ``"local"``: only final coordinates / labels leave.
    reconstruction : {"auto", "paper", "features"}
        Server-side path for ``nystrom="rows"``: dense Eq. (21) or feature map + k-NN (no n × n).
        ``"auto"``: Eq. (21) up to 10 000 records, the feature map above — and, for t-SNE and UMAP, the
        feature map whenever ``privacy`` is set, because Eq. (21) breaks down on noisy landmarks
        (:func:`securefed.embedding.nystrom.choose_reconstruction`). Spectral clustering's kernel rows keep the
        size rule (not measured under DP).
    rows_privacy : object, optional
        Data perturbation of the rows (Sec. 5.1): an object with ``perturb_site(X, site, rng)`` and
        ``report()`` (:class:`securefed.accounting.DataPerturbation`).
    auditor : callable, optional
        ``auditor(member_sites, holdout_sites, feddl_result) -> dict``, run after the landmarks and
        before any row leaves a site; raises :class:`~securefed.errors.AuditFailedError` to stop.
    audit_holdout : float, default 0
        Fraction of each site's records kept out of FedDL as audit non-members (they are still
        embedded afterwards).
    checkpoint : str, optional
        FedDL checkpoint path (resume after a crash).
    random_state : None, int or Generator
    callback : callable, optional
        ``callback(round, Y, mmd)`` after each FedDL round.
    n_jobs : int, default 1
    value_bound : float, optional
        Public bound on |feature values|; required by ``"secagg"`` / ``"ckks"`` (their public
        quantisation range); defaults to the DP clip norm.
    refine_rounds : int or "auto"
        Federated Lloyd refinement rounds after FedDL (:func:`securefed.landmarks.feddl.lloyd_refine`,
        beyond the paper). ``"auto"``: 10 with ``nystrom="local"`` and no DP, else 0.
    refine_min_cluster : int, default 10
        A landmark moves only to the mean of at least this many records (privacy/utility trade-off,
        measured by the membership audit).
    keep_sent : bool, default False
        Keep what the sites sent in the Nyström stage as ``sent_rows_`` (for the reconstruction audit).
"""


class FedTSNE(_FederatedEmbedding):
    """Federated t-SNE (Fed-tSNE, ``papers/000`` Algorithm 2) on openTSNE.

    Parameters
    ----------
    n_components : int, default 2
    perplexity : float, default 30
    n_iter : int, default 750
        Total openTSNE iterations (250 early-exaggeration + the rest), openTSNE's defaults.
    """ + _COMMON_PARAMS_DOC + """
    Attributes
    ----------
    embedding_ : ndarray (n, n_components)
    landmarks_, gamma_, mmd_history_, privacy_, feddl_, audit_, rows_sent_, reconstruction_, timings_
    """

    _param_names = ("n_components", "perplexity", "n_iter") + _FederatedEmbedding._common

    def __init__(self, n_components=2, perplexity=30.0, n_iter=750, n_landmarks=300, rounds=60, local_steps=5,
                 rule="model", lr="auto", gamma=None, weights="records", aggregation="plain",
                 aggregation_options=None, privacy=None, nystrom="rows", reconstruction="auto",
                 rows_privacy=None, auditor=None, audit_holdout=0.0, checkpoint=None, random_state=None,
                 callback=None, n_jobs=1, keep_sent=False, value_bound=None, refine_rounds="auto",
                 refine_min_cluster=10):
        self.n_components = n_components
        self.perplexity = perplexity
        self.n_iter = n_iter
        self._init_common(n_landmarks, rounds, local_steps, rule, lr, gamma, weights, aggregation,
                          aggregation_options, privacy, nystrom, reconstruction, rows_privacy, auditor,
                          audit_holdout, checkpoint, random_state, callback, n_jobs, keep_sent, value_bound,
                          refine_rounds, refine_min_cluster)

    def fit(self, sites, y=None):
        sites, rng = self._stages(sites)
        t0 = time.perf_counter()
        if self.nystrom == "local":
            Y = self.landmarks_
            model, perp = tsne_landmark_model(Y, perplexity=self.perplexity, n_components=self.n_components,
                                              seed=_seed(rng), n_jobs=self.n_jobs)
            self.landmark_embedding_ = np.asarray(model)
            # what crosses: the server sends the landmark embedding (public to all sites); each site
            # places its own records locally and returns only their coordinates.
            emb = [np.asarray(model.transform(X, perplexity=perp)) for X in sites]
            self.embedding_ = np.vstack(emb)
            self.sent_kind_ = f"final {self.n_components}-D coordinates, one per record"
            self.reconstruction_ = "local"
        else:
            B = self._distance_rows(sites, rng)
            self.embedding_, self.reconstruction_ = tsne_from_distance_rows(
                B, self.landmarks_, perplexity=self.perplexity, n_components=self.n_components, n_iter=self.n_iter,
                reconstruction=self.reconstruction, noisy_landmarks=self.privacy is not None, n_jobs=self.n_jobs,
                rng=rng)
        self.timings_["embedding"] = time.perf_counter() - t0
        return self


class FedUMAP(_FederatedEmbedding):
    """Federated UMAP (Fed-UMAP, ``papers/000`` Algorithm 2) on umap-learn.

    Parameters
    ----------
    n_components : int, default 2
    n_neighbors : int, default 15
    min_dist : float, default 0.1
    """ + _COMMON_PARAMS_DOC

    _param_names = ("n_components", "n_neighbors", "min_dist") + _FederatedEmbedding._common

    def __init__(self, n_components=2, n_neighbors=15, min_dist=0.1, n_landmarks=300, rounds=60, local_steps=5,
                 rule="model", lr="auto", gamma=None, weights="records", aggregation="plain",
                 aggregation_options=None, privacy=None, nystrom="rows", reconstruction="auto",
                 rows_privacy=None, auditor=None, audit_holdout=0.0, checkpoint=None, random_state=None,
                 callback=None, n_jobs=1, keep_sent=False, value_bound=None, refine_rounds="auto",
                 refine_min_cluster=10):
        self.n_components = n_components
        self.n_neighbors = n_neighbors
        self.min_dist = min_dist
        self._init_common(n_landmarks, rounds, local_steps, rule, lr, gamma, weights, aggregation,
                          aggregation_options, privacy, nystrom, reconstruction, rows_privacy, auditor,
                          audit_holdout, checkpoint, random_state, callback, n_jobs, keep_sent, value_bound,
                          refine_rounds, refine_min_cluster)

    def fit(self, sites, y=None):
        import warnings

        sites, rng = self._stages(sites)
        t0 = time.perf_counter()
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*n_jobs value.*")
            warnings.filterwarnings("ignore", message=".*precomputed_knn.*")
            if self.nystrom == "local":
                Y = self.landmarks_
                model = umap_landmark_model(Y, n_neighbors=self.n_neighbors, min_dist=self.min_dist,
                                            n_components=self.n_components, seed=_seed(rng))
                self.landmark_embedding_ = model.embedding_
                self.embedding_ = np.vstack([model.transform(X) for X in sites])
                self.sent_kind_ = f"final {self.n_components}-D coordinates, one per record"
                self.reconstruction_ = "local"
            else:
                B = self._distance_rows(sites, rng)
                self.embedding_, self.reconstruction_ = umap_from_distance_rows(
                    B, self.landmarks_, n_neighbors=self.n_neighbors, min_dist=self.min_dist,
                    n_components=self.n_components, reconstruction=self.reconstruction,
                    noisy_landmarks=self.privacy is not None, n_jobs=self.n_jobs, rng=rng)
        self.timings_["embedding"] = time.perf_counter() - t0
        return self


class FedSpectralClustering(_FederatedEmbedding):
    """Federated spectral clustering (Fed-SpeClust, ``papers/000`` Algorithm 3) on scikit-learn.

    Parameters
    ----------
    n_clusters : int, default 8
    kernel_gamma : float, optional
        Bandwidth of the kernel rows ``K(X_p, Y)`` (default: FedDL's γ).
    n_neighbors : int, default 15
        k of the sparse affinity graph on the scalable path.
    """ + _COMMON_PARAMS_DOC + """
    Attributes
    ----------
    labels_ : ndarray (n,)
    """

    _param_names = ("n_clusters", "kernel_gamma", "n_neighbors") + _FederatedEmbedding._common

    def __init__(self, n_clusters=8, kernel_gamma=None, n_neighbors=15, n_landmarks=300, rounds=60, local_steps=5,
                 rule="model", lr="auto", gamma=None, weights="records", aggregation="plain",
                 aggregation_options=None, privacy=None, nystrom="rows", reconstruction="auto",
                 rows_privacy=None, auditor=None, audit_holdout=0.0, checkpoint=None, random_state=None,
                 callback=None, n_jobs=1, keep_sent=False, value_bound=None, refine_rounds="auto",
                 refine_min_cluster=10):
        self.n_clusters = n_clusters
        self.kernel_gamma = kernel_gamma
        self.n_neighbors = n_neighbors
        self._init_common(n_landmarks, rounds, local_steps, rule, lr, gamma, weights, aggregation,
                          aggregation_options, privacy, nystrom, reconstruction, rows_privacy, auditor,
                          audit_holdout, checkpoint, random_state, callback, n_jobs, keep_sent, value_bound,
                          refine_rounds, refine_min_cluster)

    def fit(self, sites, y=None):
        if isinstance(self.n_clusters, bool) or not isinstance(self.n_clusters, (int, np.integer)) or self.n_clusters < 2:
            raise ConfigError(bad_value("n_clusters", self.n_clusters, "use an integer ≥ 2"))
        sites, rng = self._stages(sites)
        t0 = time.perf_counter()
        g = self.gamma_ if self.kernel_gamma is None else float(self.kernel_gamma)
        self.kernel_gamma_ = g
        if self.nystrom == "local":
            lab_y = spectral_landmark_labels(self.landmarks_, g, n_clusters=self.n_clusters, seed=_seed(rng))
            self.landmark_labels_ = lab_y
            # each site assigns its records to the cluster of highest mean kernel affinity (out-of-sample)
            self.labels_ = np.concatenate([spectral_assign(X, self.landmarks_, g, lab_y, self.n_clusters) for X in sites])
            self.sent_kind_ = "one cluster label per record"
            self.reconstruction_ = "local"
        else:
            C = self._kernel_rows(sites, rng, g)
            self.labels_, self.reconstruction_ = spectral_from_kernel_rows(
                C, self.landmarks_, g, n_clusters=self.n_clusters, n_neighbors=self.n_neighbors,
                reconstruction=self.reconstruction, n_jobs=self.n_jobs, rng=rng)
        self.embedding_ = None
        self.timings_["embedding"] = time.perf_counter() - t0
        return self

    def fit_predict(self, sites, y=None):
        """Fit and return :attr:`labels_`."""
        return self.fit(sites, y).labels_


# -------------------------------------------------------------------------------- centralized


class CentralizedTSNE(_Params):
    """openTSNE on pooled data, with the same t-SNE parameters as :class:`FedTSNE` (for comparison)."""

    _param_names = ("n_components", "perplexity", "n_iter", "random_state", "n_jobs")

    def __init__(self, n_components=2, perplexity=30.0, n_iter=750, random_state=None, n_jobs=1):
        self.n_components = n_components
        self.perplexity = perplexity
        self.n_iter = n_iter
        self.random_state = random_state
        self.n_jobs = n_jobs

    def fit(self, X, y=None):
        from openTSNE import TSNE

        X = check_sites([X])[0]
        rng = _rng(self.random_state)
        self.embedding_ = np.asarray(TSNE(n_components=self.n_components, perplexity=self.perplexity,
                                          n_iter=max(self.n_iter - 250, 1), random_state=_seed(rng),
                                          n_jobs=self.n_jobs).fit(X))
        return self

    def fit_transform(self, X, y=None):
        return self.fit(X, y).embedding_


class CentralizedUMAP(_Params):
    """umap-learn on pooled data with the same parameters as :class:`FedUMAP`."""

    _param_names = ("n_components", "n_neighbors", "min_dist", "random_state")

    def __init__(self, n_components=2, n_neighbors=15, min_dist=0.1, random_state=None):
        self.n_components = n_components
        self.n_neighbors = n_neighbors
        self.min_dist = min_dist
        self.random_state = random_state

    def fit(self, X, y=None):
        import umap

        X = check_sites([X])[0]
        rng = _rng(self.random_state)
        self.embedding_ = umap.UMAP(n_components=self.n_components, n_neighbors=self.n_neighbors,
                                    min_dist=self.min_dist, random_state=_seed(rng)).fit_transform(X)
        return self

    def fit_transform(self, X, y=None):
        return self.fit(X, y).embedding_


class CentralizedSpectralClustering(_Params):
    """scikit-learn spectral clustering on pooled data with the Gaussian kernel (median-heuristic γ)."""

    _param_names = ("n_clusters", "gamma", "random_state")

    def __init__(self, n_clusters=8, gamma=None, random_state=None):
        self.n_clusters = n_clusters
        self.gamma = gamma
        self.random_state = random_state

    def fit(self, X, y=None):
        from sklearn.cluster import SpectralClustering

        X = check_sites([X])[0]
        rng = _rng(self.random_state)
        g = median_gamma([local_median_sq_dist(X, random_state=rng)]) if self.gamma is None else float(self.gamma)
        self.gamma_ = g
        self.labels_ = SpectralClustering(self.n_clusters, affinity="rbf", gamma=g, random_state=_seed(rng)).fit_predict(X)
        return self

    def fit_predict(self, X, y=None):
        return self.fit(X, y).labels_
