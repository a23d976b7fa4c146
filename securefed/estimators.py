"""Fed-tSNE, Fed-UMAP and Fed-SpeClust (Qiao et al. Algorithms 2–3) as scikit-learn estimators.

``fit(sites)`` takes one record array per site, turns the estimator's parameters into a
:class:`~securefed.plan.RunPlan` and runs the federated job in this process
(:func:`securefed.federation.run_in_process`): the same coordinator and site code as a Flower deployment.
The job's stages:

1. **Landmarks** — FedDL (Algorithm 1) through the chosen secure sum (plain / SecAgg+ / CKKS), optionally with
   differential privacy (``privacy``) — or, in the no-rows mode, the cell tree (the default), or the DP
   billboard under DP.
2. **Audit gate** — with ``audit_holdout > 0`` every site keeps that share of its records out of FedDL and a
   membership attack on the landmarks runs from summed ROC counts before anything per record leaves a site;
   a failing audit raises :class:`~securefed.errors.AuditFailedError` unless ``allow_audit_failure``.
3. **Embedding** — ``nystrom="rows"`` (the paper: every site sends one row per record — squared distances or
   kernel values to the landmarks — and **these rows give the records back**), or ``nystrom="local"`` (the
   server embeds only the landmarks; each site places its own records and returns only their coordinates).

Centralized counterparts (:class:`CentralizedTSNE`, :class:`CentralizedUMAP`,
:class:`CentralizedSpectralClustering`) run the same libraries on pooled data for comparison.
"""

from __future__ import annotations

import dataclasses
import inspect
import time
import warnings

import numpy as np
from sklearn.base import BaseEstimator

from .data import check_sites
from .errors import ConfigError, bad_value
from .embedding.stages import seed_from
from .kernels import local_median_sq_dist, median_gamma
from .plan import NYSTROM_MODES

__all__ = [
    "FedTSNE",
    "FedUMAP",
    "FedSpectralClustering",
    "CentralizedTSNE",
    "CentralizedUMAP",
    "CentralizedSpectralClustering",
    "FederatedParams",
    "NYSTROM_MODES",
    "plan_options",
]


@dataclasses.dataclass(frozen=True)
class FederatedParams:
    """The parameters every federated estimator shares — one definition, one set of defaults.

    n_landmarks : int or "auto", default "auto"
        ``n_y``, the number of landmarks FedDL or the billboard learns (auto: 300); for cells the most cells (auto:
        as many as the floors allow, at most N / ``cell_floor`` and 4 000 — ≈ 60 on digits, ≈ 175 on MNIST-5k,
        ≈ 1 000 on 20 000 Fashion-MNIST records, ≈ 3 500 on 70 000; a number caps them instead).
    rounds, local_steps : int, default 60 and 5
        ``S`` and ``Q`` of Algorithm 1.
    rule : {"model", "gradient"}
        Model averaging (Eq. 15) or gradient averaging (Eq. 16).
    lr : float or "auto"
        Step size; ``"auto"`` is :func:`securefed.landmarks.feddl.default_lr`.
    gamma : float, optional
        FedDL kernel bandwidth (federated median heuristic when None; ``1/τ_X²`` under DP).
    weights : {"records", "uniform"}
        Client weights of Eq. (8): each site weighs its own upload by its record count, or by 1.
    init : "auto", "moments", "public" or array
        Initial landmarks (federated moments; the public radius under DP; or given).
    aggregation : {"auto", "secagg", "ckks", "plain"}
        The secure sum (``"auto"``: SecAgg+, which needs ``value_bound`` or the DP clip norm — without either,
        ``fit`` raises a :class:`~securefed.errors.ConfigError` naming ``value_bound`` rather than fall back to plain
        sums; ``"plain"`` only when asked for, with a ``UserWarning``: the coordinator then sees each site's own
        uploads); ``aggregation_options`` holds its options (``modulus_bits``, ``fractional_bits``,
        ``degree``, ``threshold``, ``stage_timeout``, ``ckks_precision``, ``key_holder``, ``ckks_min_survivors``,
        ``ckks_quorum``, ``ckks_verify``).
    value_bound : float, optional
        Public bound on |feature values|, agreed by the sites beforehand (never read off the records); required by
        the default secure sum (``"auto"``, ``"secagg"``, ``"ckks"``) unless ``privacy`` gives a clip norm.
    privacy : GradientPerturbation, optional
        Differential privacy of the landmark stage (:class:`securefed.accounting.GradientPerturbation`): its
        options become the run's, its ledger the coordinator's aggregate ledger.
    rows_privacy : DataPerturbation, optional
        Data perturbation of the rows (Qiao et al. §5.1): its ε becomes the run's ``rows_epsilon``.
    nystrom : {"local", "rows"}, default "local"
        ``"local"``: no per-record rows leave a site; each places its own records on the landmark map and only the
        final coordinates / labels leave (or none, with ``coordinates="keep"``). ``"rows"``: the paper — one row
        per record leaves each site (it gives the records back).
    reconstruction : {"auto", "paper", "features"}
        Server-side path for ``nystrom="rows"``: dense Eq. (21) or feature map + k-NN (no n × n)
        (:func:`securefed.embedding.nystrom.choose_reconstruction`).
    landmark_method : {"auto", "cells", "billboard", "feddl"}
        ``"cells"``: the cell tree in a federated PCA basis, each released cell over ≥ ``cell_floor`` records (the
        no-rows default); ``"billboard"``: the DP landmarks (two noisy releases; the default under DP);
        ``"feddl"``: the paper's FedDL (the default of the rows mode).
    cell_floor : int, default 15
        Cells: a cell's mean is revealed only over at least this many records.
    cell_rounds, basis_dim : int, default 12, 50
        Cells: most rounds of cell growth; dimensions of the federated PCA basis.
    cell_axes : int, default 0
        Cells: every cell is also represented by μ ± √λ·v along this many of its principal axes (its count shared
        among its 1 + 2·cell_axes points; the last sum pass then carries second moments); 0: the cell means only.
        The points leak more than the means: pair them with a larger ``cell_floor`` (measured: floor 25 with one
        axis passes the audit as floor 15 without; ``docs/what-leaves-each-site.md`` §4).
    public_basis_dim, count_share : int, float, default 64, 0.2
        Billboard: dimensions of the public basis; share of the privacy budget (μ²) spent on the landmark counts.
    density_share, density_grid : float, int, default 0.0, 16
        Billboard with ``coordinates="keep"``: share of the budget spent on a noisy density of every record on the
        map (a third release; 0: none) and the cells per side of its grid (``result_.embedding["density"]``).
    standardize : bool, default False
        Cells: scale every feature to unit variance with the federated means and variances (from the basis secure
        sum; nothing more leaves a site).
    coordinates : {"send", "keep"}
        No-rows mode: each record's final coordinate goes to the coordinator, or stays on its site.
    audit_holdout : float, default 0.2
        Share of each site's records kept out of the landmarks as audit non-members (placed afterwards like every
        other record); 0 = no membership audit.
    max_auc, max_empirical_epsilon, allow_audit_failure
        The audit policy (0.6, 1.0) and whether a failing audit lets the run go on (recorded).
    checkpoint : str, optional
        Path of a checkpoint of the landmark rounds (resume after a crash).
    random_state : None, int or Generator
    callback : callable, optional
        ``callback(round, Y, mmd)`` after each FedDL round (``mmd``: of the landmarks the round started from).
    n_jobs : int, default 1
    keep_sent : bool, default False
        Keep the rows the sites sent (``sent_rows_``) for the reconstruction audit.
    verbose : "auto", int, default "auto"
        Progress on standard error: ``"auto"`` draws a progress bar when standard error is a terminal and prints
        nothing otherwise (logs, pipes, tests); ``1`` prints a line per stage (for logs); ``0`` nothing.
    """

    n_landmarks: object = "auto"
    rounds: int = 60
    local_steps: int = 5
    rule: str = "model"
    lr: object = "auto"
    gamma: float | None = None
    weights: str = "records"
    init: object = "auto"
    aggregation: str = "auto"
    aggregation_options: dict | None = None
    value_bound: float | None = None
    privacy: object = None
    rows_privacy: object = None
    nystrom: str = "local"
    reconstruction: str = "auto"
    landmark_method: str = "auto"
    cell_floor: int = 15
    cell_rounds: int = 12
    cell_axes: int = 0
    basis_dim: int = 50
    public_basis_dim: int = 64
    count_share: float = 0.2
    density_share: float = 0.0
    density_grid: int = 16
    standardize: bool = False
    coordinates: str = "send"
    audit_holdout: float = 0.2
    max_auc: float = 0.6
    max_empirical_epsilon: float = 1.0
    allow_audit_failure: bool = False
    checkpoint: str | None = None
    random_state: object = None
    callback: object = None
    n_jobs: int = 1
    keep_sent: bool = False
    verbose: object = "auto"


_SUM_OPTIONS = (
    "modulus_bits",
    "fractional_bits",
    "degree",
    "threshold",
    "stage_timeout",
    "ckks_precision",
    "key_holder",
    "ckks_min_survivors",
    "ckks_quorum",
    "ckks_verify",
)


def privacy_options(privacy, rows_privacy=None) -> dict:
    """The run-plan options of a :class:`~securefed.accounting.GradientPerturbation` (and a DataPerturbation)."""
    if privacy is None:
        if rows_privacy is not None:
            raise ConfigError(
                bad_value(
                    "rows_privacy",
                    type(rows_privacy).__name__,
                    "perturbed rows are part of a DP run: give privacy=GradientPerturbation(...) too",
                )
            )
        return {}
    seed = getattr(privacy, "insecure_noise_seed_for_testing", None)
    out = {
        "epsilon": privacy.epsilon_target,
        "noise_multiplier": privacy.noise_multiplier_given,
        "delta": privacy.delta,
        "accountant": privacy.accountant,
        "noise": privacy.noise,
        "clip_norm": privacy.tau_x,
        "sample_rate": privacy.sample_rate,
        "sensitivity_rule": privacy.sensitivity_rule,
        "min_survivors": privacy.min_survivors_given,
        "noise_seed_for_testing": seed,
        "run_id": privacy.ledger.run_id,
    }
    if privacy.noise == "distributed":  # a GradientPerturbation is the Gaussian mechanism: its continuous shares
        out["distributed_mechanism"] = "gaussian"
    if rows_privacy is not None:
        out["rows_epsilon"] = float(rows_privacy.epsilon)
    return out


def plan_options(params: dict, method: str, method_options: dict, n_sites: int) -> dict:
    """Turn estimator parameters into :class:`~securefed.plan.RunPlan` options (no validation here)."""
    from .plan import seed_of

    p = params
    seed = seed_of(p["random_state"])
    weights = p["weights"]
    if not isinstance(weights, str):
        raise ConfigError(
            bad_value(
                "weights",
                weights,
                "use 'records' or 'uniform': each site weighs its own upload by a "
                "public rule (a weight chosen by the coordinator could single out one site)",
            )
        )
    opts = dict(
        landmarks=p["n_landmarks"],
        rounds=p["rounds"],
        local_steps=p["local_steps"],
        rule=p["rule"],
        lr=p["lr"],
        gamma=p["gamma"],
        weights=weights,
        init=p["init"],
        aggregation=p["aggregation"],
        value_bound=p["value_bound"],
        nystrom=p["nystrom"],
        reconstruction=p["reconstruction"],
        landmark_method=p["landmark_method"],
        cell_floor=p["cell_floor"],
        cell_rounds=p["cell_rounds"],
        cell_axes=p["cell_axes"],
        basis_dim=p["basis_dim"],
        public_basis_dim=p["public_basis_dim"],
        count_share=p["count_share"],
        density_share=p["density_share"],
        density_grid=p["density_grid"],
        standardize=bool(p["standardize"]),
        coordinates=p["coordinates"],
        audit_holdout=float(p["audit_holdout"]),
        max_auc=p["max_auc"],
        max_empirical_epsilon=p["max_empirical_epsilon"],
        allow_audit_failure=bool(p["allow_audit_failure"]),
        method=method,
        seed=seed,
        n_jobs=p["n_jobs"],
        keep_rows=bool(p["keep_sent"]),
        min_sites=1,
        **method_options,
    )
    for k, v in (p["aggregation_options"] or {}).items():
        if k not in _SUM_OPTIONS:
            raise ConfigError(bad_value("aggregation_options", k, f"use keys among {', '.join(_SUM_OPTIONS)}"))
        opts[k] = v
    opts.update(privacy_options(p["privacy"], p["rows_privacy"]))
    return opts


def _check_protection(params: dict, plan) -> None:
    """No silent loss of protection: without a public bound the default secure sum cannot run, and the estimators
    refuse to fall back to plain aggregation (the coordinator would see every site's own uploads); plain is used
    only when asked for (``aggregation="plain"``), with a warning."""
    if plan.aggregation != "plain":
        return
    if params["aggregation"] == "auto":
        raise ConfigError(
            bad_value(
                "value_bound",
                None,
                "the default secure sum (SecAgg+) needs a public bound B ≥ |every feature value| that "
                "the sites agree on beforehand — from the data dictionary or the instruments' ranges, never read off the "
                "records (e.g. value_bound=16 for digits' pixel counts, 255 for 8-bit pixels); with "
                "privacy=GradientPerturbation(..., tau_x=...) the clip norm bounds the sums instead. Only "
                "aggregation='plain' runs without one, and then the coordinator sees every site's own uploads",
            )
        )
    warnings.warn(
        "aggregation='plain': the coordinator sees every site's own uploads, not only their sum; give a "
        "public value_bound for the default secure sum (SecAgg+)",
        UserWarning,
        stacklevel=4,
    )


def _with_init(cls):
    """Give ``cls`` an ``__init__`` taking its own ``_own`` parameters then every :class:`FederatedParams` field,
    all keyword arguments with their defaults (scikit-learn reads the signature for ``get_params``)."""
    own = list(cls._own)
    common = [(f.name, f.default) for f in dataclasses.fields(FederatedParams)]
    names = [n for n, _ in own + common]

    def __init__(self, **kwargs):
        unknown = set(kwargs) - set(names)
        if unknown:
            raise TypeError(f"{cls.__name__} got unexpected parameters {sorted(unknown)}")
        for name, default in own + common:
            setattr(self, name, kwargs.get(name, default))

    __init__.__signature__ = inspect.Signature(
        [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
        + [inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, default=d) for n, d in own + common]
    )
    cls.__init__ = __init__
    return cls


class _Estimator(BaseEstimator):
    """scikit-learn's parameter protocol, with securefed's typed error for an unknown parameter."""

    def set_params(self, **params):
        valid = set(self._get_param_names())
        for k, v in params.items():
            if k not in valid:
                raise ConfigError(
                    bad_value(k, v, f"{type(self).__name__} has no such parameter; valid: {', '.join(sorted(valid))}")
                )
        return super().set_params(**params)


class _FederatedEmbedding(_Estimator):
    """Shared machinery of the three federated estimators (plan → in-process run → fitted attributes)."""

    _own: tuple = ()
    _method = ""

    def _run(self, sites):
        from .federation import run_in_process
        from .federation.checkpoint import fingerprint, read_checkpoint, write_checkpoint
        from .plan import RunPlan

        t0 = time.perf_counter()
        sites = check_sites(sites)
        params = self.get_params(deep=False)
        plan = RunPlan.build("api", **plan_options(params, self._method, self._method_options(), len(sites)))
        _check_protection(params, plan)
        fp = fingerprint(plan, [len(X) for X in sites], sites[0].shape[1])
        resume = read_checkpoint(self.checkpoint, fp, plan.rounds) if self.checkpoint else None
        callback = self.callback

        def on_event(ev):
            if ev["event"] == "checkpoint":
                if self.checkpoint:
                    write_checkpoint(self.checkpoint, ev["state"], fp)
                if callback is not None:
                    callback(ev["state"]["round"], ev["state"]["Y"], self._pending_mmd)
            elif ev["event"] == "round":
                self._pending_mmd = ev.get("mmd_at_start")
            if printer is not None:
                printer(ev)

        from .progress import progress_for

        printer = progress_for(self.verbose)
        self._pending_mmd = None
        ledger = self.privacy.ledger if self.privacy is not None else None
        try:
            res = run_in_process(plan, sites, ledger=ledger, resume=resume, on_event=on_event)
        finally:
            if hasattr(printer, "close"):
                printer.close()  # the bar's line ends, also when the run stopped (e.g. at its audit gate)
        del self._pending_mmd
        self._set_fitted(res, plan, sites, time.perf_counter() - t0)
        return res

    def _set_fitted(self, res, plan, sites, seconds: float) -> None:
        self.result_ = res
        self.plan_ = plan
        self.landmarks_ = res.landmarks
        self.gamma_ = res.gamma
        self.mmd_history_ = list(res.mmd_history)
        self.privacy_ = res.privacy
        self.rows_privacy_ = (res.privacy or {}).get("rows")
        self.audit_ = res.audit
        self.landmark_info_ = res.landmark_info
        self.landmark_space_ = res.landmark_space
        self.landmark_masses_ = res.masses
        self.n_sites_ = len(sites)
        self.site_sizes_ = [len(X) for X in sites]
        self.n_features_in_ = int(sites[0].shape[1])
        emb = res.embedding or {}
        self.reconstruction_ = emb.get("reconstruction")
        self.sent_kind_ = emb.get("sent_kind")
        self.rows_sent_ = int(sum(emb.get("rows_per_site", {}).values())) if emb.get("nystrom") == "rows" else 0
        self.sent_rows_ = res.stacked("rows") if plan.keep_rows else None
        if "landmark_embedding" in emb:
            self.landmark_embedding_ = emb["landmark_embedding"]
        if "landmark_labels" in emb:
            self.landmark_labels_ = emb["landmark_labels"]
        if "kernel_gamma" in emb:
            self.kernel_gamma_ = emb["kernel_gamma"]
        self.landmark_map_zn_ = emb.get("Zn")
        if emb.get("missing"):
            raise ConfigError(
                bad_value(
                    "sites",
                    sorted(emb["missing"]),
                    f"these sites did not return their part of the embedding: {emb['missing']}",
                )
            )
        self.timings_ = {"total": seconds, "coordinator": res.seconds}

    def _place_new(self, X_new):
        """Place new records of one site against the fitted landmark map — on the caller's machine, from the
        broadcast alone (nothing leaves): the no-rows mode's site step with every cell's whole mass."""
        from sklearn.utils.validation import check_is_fitted

        from .embedding import placement

        check_is_fitted(self, "landmarks_")
        if getattr(self, "landmark_embedding_", None) is None and not hasattr(self, "landmark_labels_"):
            raise ConfigError(
                bad_value(
                    "nystrom",
                    self.plan_.nystrom,
                    "transform places new records against the "
                    "landmark map of the no-rows mode; fit with nystrom='local'",
                )
            )
        X_new = check_sites([X_new])[0]
        if X_new.shape[1] != self.n_features_in_:
            raise ConfigError(bad_value("X_new.shape", X_new.shape, f"give {self.n_features_in_} features, as in fit"))
        F = self.landmark_space_.features(X_new)
        if self._method == "spectral":
            from .embedding.stages import spectral_assign

            return spectral_assign(
                F, self.landmarks_, float(self.kernel_gamma_), self.landmark_labels_, int(self.n_clusters)
            )
        if self._method == "tsne":
            return placement.place_refine(
                F,
                self.landmarks_,
                self.landmark_embedding_,
                self.landmark_masses_,
                self.landmark_map_zn_,
                perplexity=float(self.plan_.placement_perplexity),
                counted=False,
            )
        return placement.place_weighted(F, self.landmarks_, self.landmark_embedding_, perplexity=2.0)

    def transform(self, X_new):
        """Coordinates of a site's new records on the fitted map (no-rows mode; computed locally, nothing leaves)."""
        return self._place_new(X_new)

    def fit_transform(self, sites, y=None):
        """Fit and return :attr:`embedding_` (records of all sites, concatenated in site order)."""
        return self.fit(sites, y).embedding_


@_with_init
class FedTSNE(_FederatedEmbedding):
    """Federated t-SNE (Fed-tSNE, Qiao et al. Algorithm 2) on openTSNE.

    Parameters: ``n_components`` (2), ``perplexity`` (30), ``placement_perplexity`` (each site's placement of its
    records against the landmark map, no-rows mode; None: 5 under differential privacy, 10 otherwise), ``n_iter`` (750: openTSNE's 250 early-exaggeration
    iterations + the rest) and every :class:`FederatedParams` field.

    Attributes: ``embedding_`` (n, n_components), ``landmarks_``, ``gamma_``, ``mmd_history_``, ``privacy_``,
    ``audit_``, ``rows_sent_``, ``reconstruction_``, ``timings_``, ``result_`` (the run's RunResult), ``plan_``.
    """

    _own = (("n_components", 2), ("perplexity", 30.0), ("n_iter", 750), ("placement_perplexity", None))
    _method = "tsne"

    def _method_options(self):
        return {
            "n_components": self.n_components,
            "perplexity": self.perplexity,
            "n_iter": self.n_iter,
            "placement_perplexity": self.placement_perplexity,
        }

    def fit(self, sites, y=None):
        res = self._run(sites)
        self.embedding_ = res.stacked("coordinates")
        return self


@_with_init
class FedUMAP(_FederatedEmbedding):
    """Federated UMAP (Fed-UMAP, Qiao et al. Algorithm 2) on umap-learn.

    Parameters: ``n_components`` (2), ``n_neighbors`` (15), ``min_dist`` (0.1) and every :class:`FederatedParams`
    field. Attributes as :class:`FedTSNE`.
    """

    _own = (("n_components", 2), ("n_neighbors", 15), ("min_dist", 0.1))
    _method = "umap"

    def _method_options(self):
        return {"n_components": self.n_components, "n_neighbors": self.n_neighbors, "min_dist": self.min_dist}

    def fit(self, sites, y=None):
        res = self._run(sites)
        self.embedding_ = res.stacked("coordinates")
        return self


@_with_init
class FedSpectralClustering(_FederatedEmbedding):
    """Federated spectral clustering (Fed-SpeClust, Qiao et al. Algorithm 3) on scikit-learn.

    Parameters: ``n_clusters`` (8), ``kernel_gamma`` (the kernel rows' bandwidth; default FedDL's γ),
    ``n_neighbors`` (15: k of the sparse affinity graph on the scalable path) and every
    :class:`FederatedParams` field. Attributes: ``labels_`` (n,) and as :class:`FedTSNE`.
    """

    _own = (("n_clusters", 8), ("kernel_gamma", None), ("n_neighbors", 15))
    _method = "spectral"

    def _method_options(self):
        return {"n_clusters": self.n_clusters, "kernel_gamma": self.kernel_gamma, "n_neighbors": self.n_neighbors}

    def fit(self, sites, y=None):
        res = self._run(sites)
        self.labels_ = res.stacked("labels")
        self.embedding_ = None
        return self

    def fit_predict(self, sites, y=None):
        """Fit and return :attr:`labels_`."""
        return self.fit(sites, y).labels_

    def predict(self, X_new):
        """Cluster labels of a site's new records (no-rows mode; computed locally, nothing leaves)."""
        return self._place_new(X_new)

    def transform(self, X_new):
        raise AttributeError("FedSpectralClustering has no transform; use predict(X_new) for new records' clusters")


# -------------------------------------------------------------------------------- centralized


class CentralizedTSNE(_Estimator):
    """openTSNE on pooled data, with the same t-SNE parameters as :class:`FedTSNE` (for comparison)."""

    def __init__(self, n_components=2, perplexity=30.0, n_iter=750, random_state=None, n_jobs=1):
        self.n_components = n_components
        self.perplexity = perplexity
        self.n_iter = n_iter
        self.random_state = random_state
        self.n_jobs = n_jobs

    def fit(self, X, y=None):
        from openTSNE import TSNE

        X = check_sites([X])[0]
        rng = np.random.default_rng(self.random_state)
        self.embedding_ = np.asarray(
            TSNE(
                n_components=self.n_components,
                perplexity=self.perplexity,
                n_iter=max(self.n_iter - 250, 1),
                random_state=seed_from(rng),
                n_jobs=self.n_jobs,
            ).fit(X)
        )
        return self

    def fit_transform(self, X, y=None):
        return self.fit(X, y).embedding_


class CentralizedUMAP(_Estimator):
    """umap-learn on pooled data with the same parameters as :class:`FedUMAP`."""

    def __init__(self, n_components=2, n_neighbors=15, min_dist=0.1, random_state=None):
        self.n_components = n_components
        self.n_neighbors = n_neighbors
        self.min_dist = min_dist
        self.random_state = random_state

    def fit(self, X, y=None):
        import umap

        X = check_sites([X])[0]
        rng = np.random.default_rng(self.random_state)
        self.embedding_ = umap.UMAP(
            n_components=self.n_components,
            n_neighbors=self.n_neighbors,
            min_dist=self.min_dist,
            random_state=seed_from(rng),
        ).fit_transform(X)
        return self

    def fit_transform(self, X, y=None):
        return self.fit(X, y).embedding_


class CentralizedSpectralClustering(_Estimator):
    """scikit-learn spectral clustering on pooled data with the Gaussian kernel (median-heuristic γ)."""

    def __init__(self, n_clusters=8, gamma=None, random_state=None):
        self.n_clusters = n_clusters
        self.gamma = gamma
        self.random_state = random_state

    def fit(self, X, y=None):
        from sklearn.cluster import SpectralClustering

        X = check_sites([X])[0]
        rng = np.random.default_rng(self.random_state)
        g = median_gamma([local_median_sq_dist(X, random_state=rng)]) if self.gamma is None else float(self.gamma)
        self.gamma_ = g
        self.labels_ = SpectralClustering(
            self.n_clusters, affinity="rbf", gamma=g, random_state=seed_from(rng)
        ).fit_predict(X)
        return self

    def fit_predict(self, X, y=None):
        return self.fit(X, y).labels_
