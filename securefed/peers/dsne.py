"""dSNE, F-dSNE and DP-dSNE (Saha et al. 2023: Saha et al., "Federated, Fast, and Private Visualization
of Decentralized Data", 2023; dSNE: Saha et al., IJCAI 2017).

The protocol (Algorithm 5 of Saha et al. 2023, rows = points)
-----------------------------------------------------------
* A **public reference set** ``X_s`` (``N_s × n``) is known to every site and to the server; the server
  keeps its embedding ``Y_s``.
* Site ``ℓ`` computes ``P^ℓ`` on ``[X_ℓ ; X_s]`` once (Eq. 1, Algorithm 1; it never leaves the site) and
  keeps the embedding ``Y_ℓ`` of its own records (never leaves the site during training).
* Each communication round: the server sends ``Y_s``; every site runs ``k`` t-SNE gradient steps with
  momentum and gains on ``[Y_ℓ ; Y_s^ℓ]`` (Algorithm 2, Eq. 4), then sends the change of its reference
  copy ``ΔY_s^ℓ = Y_s^ℓ − Y_s`` — in DP mode after AdaCliP (Algorithms 3–4). The server averages the
  changes, applies them, re-centres ``Y_s`` and broadcasts ``Y_s`` and the shift.
* dSNE: ``k = 1``, no noise. DP-dSNE: ``k = 1``, noise on every release. F-dSNE: ``k > 1`` local steps
  between releases (so ``k`` times fewer releases), noise on every release.

Deviations from Algorithm 5, deliberately
-----------------------------------------
* Re-centring uses the mean of the (noisy, averaged) **reference** embedding only. Algorithm 5 lines
  27–30 have every site send the mean of its *local* embedding too; that is an un-noised function of
  private records, so securefed does not send it (the shift is post-processing of DP releases).
* Noise is added only to what leaves a site (the reference update). Algorithm 5 also perturbs the
  local embedding, which never leaves the site and so buys no privacy.

What the privacy guarantee covers (and what it does not)
--------------------------------------------------------
Each release is the AdaCliP-transformed update, every row clipped to norm 1, plus ``N(0, σ² I)``.
One record of a site can move **every** row (it enters the normalisation of ``P`` and attracts all
reference points through Eq. 4), so the record-level L2 sensitivity is ``2 √N_s`` and the noise
multiplier is ``z = σ / (2 √N_s)``; ``epsilon_`` is the RDP-accounted ε of ``rounds`` such releases at
``delta_`` (record level, per site). ``epsilon_per_row_`` is ε for a change confined to one reference
row (sensitivity 2) — the unit DP-SGD-style accounting of the rows implies, which is **not** a record of
the site; it is reported only to compare with the paper. Finally, the map itself (every record's 2-D
position) is given to the analyst at the end: the DP guarantee covers the traffic to the server during
training, not the published map.
"""

from __future__ import annotations

import os
import time

import numpy as np
import scipy.sparse as sp

from ..securesum.base import Aggregator, make_aggregator
from ..data import check_sites
from ..errors import ConfigError, DataError, bad_value
from .adaclip import AdaCliP, noise_addition
from .affinities import knn_affinities
from .privacy import _epsilon, calibrate_noise_multiplier, record_sensitivity

__all__ = [
    "WHAT_LEAVES",
    "kl_gradient",
    "kl_divergence",
    "gains_momentum_step",
    "pca_init",
    "default_reference",
    "GaussianRows",
    "FedDSNE",
]

#: What each dSNE variant sends off a site (docs/what-leaves-each-site.md style), by method name.
WHAT_LEAVES = {
    "dsne": (
        "every iteration: the site's change of the reference embedding ΔY_s (N_s × 2 floats), in "
        "the clear; no formal privacy. Nothing else leaves the site: not X, not P, not the local "
        "embedding. The final 2-D position of each record is released to the analyst at the end."
    ),
    "fdsne": (
        "every k iterations: the change of the reference embedding after k local steps, "
        "AdaCliP-privatised (rows transformed, clipped to norm 1, Gaussian noise σ, rescaled); "
        "(ε, δ) per site record accounted over the rounds/k releases with sensitivity 2√N_s. "
        "The final map is released un-noised."
    ),
    "dp-dsne": (
        "every iteration: the AdaCliP-privatised change of the reference embedding; (ε, δ) "
        "per site record accounted over every release. The final map is released un-noised."
    ),
}


def kl_divergence(P: sp.csr_matrix, Y: np.ndarray) -> float:
    """Eq. (3) of Saha et al. 2023: ``J(Y) = Σ_{i≠j} p_ij ln(p_ij / q_ij)`` with ``q`` from Eq. (2).

    Exact (O(N²) memory for the normaliser ``Σ_{k≠l} (1 + ‖y_k − y_l‖²)^{-1}``).
    """
    Y = np.asarray(Y, dtype=np.float64)
    W, Z = _student_t_kernel(Y, np.float64)
    del W
    rows, cols = _coo_index(P)
    d2 = ((Y[rows] - Y[cols]) ** 2).sum(axis=1)
    p = P.data
    return float(np.sum(p * np.log(p)) + np.sum(p * np.log1p(d2)) + np.log(Z))


def _student_t_kernel(Y: np.ndarray, dtype=np.float32) -> tuple[np.ndarray, float]:
    """``w_ij = (1 + ‖y_i − y_j‖²)^{-1}`` (``w_ii = 0``) and ``Z = Σ_{k≠l} w_kl`` (Eq. 2).

    float32 by default (the gradient's repulsion: twice as fast, 1e-7 relative error); the
    objective uses float64.
    """
    Y32 = np.ascontiguousarray(Y, dtype=dtype)
    W = np.ones((len(Y32), len(Y32)), dtype=dtype)
    for c in range(Y32.shape[1]):
        diff = Y32[:, c][:, None] - Y32[:, c][None, :]
        np.multiply(diff, diff, out=diff)
        W += diff
    np.reciprocal(W, out=W)
    np.fill_diagonal(W, 0.0)
    return W, float(W.sum(dtype=np.float64))


def _coo_index(P: sp.csr_matrix) -> tuple[np.ndarray, np.ndarray]:
    rows = np.repeat(np.arange(P.shape[0]), np.diff(P.indptr))
    return rows, P.indices


def kl_gradient(
    P: sp.csr_matrix, Y: np.ndarray, exaggeration: float = 1.0, index: tuple[np.ndarray, np.ndarray] | None = None
) -> np.ndarray:
    """Eq. (4) of Saha et al. 2023: ``∂J/∂y_i = 4 Σ_j (α p_ij − q_ij)(y_i − y_j)(1 + ‖y_i − y_j‖²)^{-1}``.

    ``α`` is the early-exaggeration factor (1 = the plain gradient). The attractive part runs over the
    sparse support of ``P``; the repulsive part is exact (``Σ_j q_ij w_ij (y_i − y_j)`` with
    ``q_ij = w_ij / Z``), computed in float32.

    Parameters
    ----------
    P : csr_matrix of shape (N, N)
        Joint affinities (symmetric, sum one).
    Y : ndarray of shape (N, d)
        Current embedding.
    exaggeration : float
        Multiplier of ``P`` (early exaggeration).
    index : (rows, cols), optional
        Precomputed COO index of ``P`` (saves work in loops).

    Returns
    -------
    ndarray of shape (N, d)
    """
    Y = np.asarray(Y, dtype=np.float64)
    n, d = Y.shape
    rows, cols = index if index is not None else _coo_index(P)
    diff = Y[rows] - Y[cols]
    pw = P.data / (1.0 + np.einsum("ij,ij->i", diff, diff))
    attr = np.empty_like(Y)
    for c in range(d):
        attr[:, c] = np.bincount(rows, weights=pw * diff[:, c], minlength=n)
    W, Z = _student_t_kernel(Y)
    np.multiply(W, W, out=W)
    Y32 = Y.astype(np.float32)
    rep = (W.sum(axis=1, dtype=np.float64)[:, None] * Y - (W @ Y32).astype(np.float64)) / Z
    return 4.0 * (exaggeration * attr - rep)


def gains_momentum_step(
    Y: np.ndarray,
    grad: np.ndarray,
    update: np.ndarray,
    gains: np.ndarray,
    learning_rate: float,
    momentum: float,
    min_gain: float = 0.01,
) -> None:
    """Algorithm 2, step 3 of Saha et al. 2023 with adaptive gains (in place).

    ``ŷ(t) = α (y(t−1) − y(t−2)) − η · gains ⊙ ∂J/∂y`` — the momentum form of step 3 with the
    delta-bar-delta gains of van der Maaten & Hinton (2008) that dSNE's reference code also uses:
    a gain grows by 0.2 where the gradient's sign disagrees with the last update, shrinks ×0.8 where
    it agrees, and never drops below ``min_gain``.
    """
    flip = np.sign(grad) != np.sign(update)
    gains[flip] += 0.2
    gains[~flip] *= 0.8
    np.maximum(gains, min_gain, out=gains)
    update *= momentum
    update -= learning_rate * gains * grad
    Y += update


def pca_init(X_reference: np.ndarray, n_components: int = 2, std: float = 1e-4):
    """PCA initialisation computed from the **public** reference set only.

    Returns ``(mean, components, scale)``: a point ``x`` starts at ``(x − mean) @ components / scale``,
    with the scale chosen so the reference embedding's first coordinate has standard deviation
    ``std`` (1e-4, the variance of Algorithm 5 line 7 and openTSNE's PCA init). Sites project their own
    records locally with these public quantities, so nothing private is used.
    """
    Xr = np.asarray(X_reference, dtype=np.float64)
    mean = Xr.mean(axis=0)
    _, _, Vt = np.linalg.svd(Xr - mean, full_matrices=False)
    comps = Vt[:n_components].T
    proj = (Xr - mean) @ comps
    scale = proj[:, 0].std() / std if proj[:, 0].std() > 0 else 1.0
    return mean, comps, scale


def default_reference(X_sites, dataset_name: str, n_reference: int = 500, random_state=None) -> np.ndarray:
    """A public reference set for dSNE: a held-out split of the built-in dataset ``dataset_name``.

    The built-in datasets (``securefed.data.BUILTIN_DATASETS``) are public. Every row that occurs in
    any site is excluded (exact match), then ``n_reference`` rows are drawn at random. This is the
    default securefed documents for simulations on built-in data; with real site data pass a public
    cohort of the same features as ``reference=`` instead (FedDSNE raises when none is given).

    Raises
    ------
    DataError
        When the dataset's features do not match the sites', or too few held-out rows remain.
    """
    from ..data import load_dataset

    sites = check_sites(X_sites)
    ds = load_dataset(dataset_name)
    X = np.asarray(ds.X, dtype=np.float64)
    m = sites[0].shape[1]
    if X.shape[1] != m:
        raise DataError(
            bad_value(
                "dataset_name",
                dataset_name,
                f"its records have {X.shape[1]} features, the sites' {m}; pass a "
                "public reference with the sites' features as reference=",
            )
        )
    used = {row.tobytes() for s in sites for row in np.ascontiguousarray(s, dtype=np.float64)}
    free = np.array([i for i in range(len(X)) if X[i].tobytes() not in used], dtype=int)
    if len(free) < n_reference:
        raise DataError(
            bad_value(
                "n_reference",
                n_reference,
                f"only {len(free)} rows of {dataset_name!r} are not held by a site; "
                "use fewer reference points or pass reference=",
            )
        )
    rng = np.random.default_rng(random_state)
    return X[np.sort(rng.choice(free, size=n_reference, replace=False))].copy()


class GaussianRows:
    """Plain Gaussian mechanism with per-row clipping (``noise="gaussian"``).

    Each row is clipped to ``clip_norm`` and ``N(0, (σ·clip_norm)² I)`` is added: Algorithm 3 of
    Saha et al. 2023 with ``m = 0`` and ``b = clip_norm`` fixed (AdaCliP without adaptation).
    """

    def __init__(self, shape, sigma: float, clip_norm: float, random_state=None):
        if not (np.isfinite(clip_norm) and clip_norm > 0):
            raise ConfigError(bad_value("clip_norm", clip_norm, "use a positive clipping norm, e.g. 1.0"))
        self.shape = tuple(shape)
        self.sigma = float(sigma)
        self.clip_norm = float(clip_norm)
        self.rng = np.random.default_rng(random_state)
        self.releases = 0

    def __call__(self, G: np.ndarray) -> np.ndarray:
        G = np.asarray(G, dtype=np.float64)
        if not np.all(np.isfinite(G)):
            raise DataError(bad_value("G", "non-finite values", "the update diverged; lower the learning rate"))
        self.releases += 1
        zero = np.zeros(self.shape)
        return noise_addition(G, zero, np.full(self.shape, self.clip_norm), self.sigma, self.rng)


_NOISES = (None, "gaussian", "adaclip")
_ADACLIP_DEFAULTS = {"h1": 1e-12, "h2": 1e4, "beta1": 0.99, "beta2": 0.9, "s0": 1.0}


def _check_positive_int(name: str, value, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ConfigError(bad_value(name, value, f"use an integer >= {minimum}"))
    return int(value)


def _check_positive(name: str, value) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ConfigError(bad_value(name, value, "use a positive number")) from None
    if not (np.isfinite(v) and v > 0):
        raise ConfigError(bad_value(name, value, "use a positive number"))
    return v


class FedDSNE:
    """dSNE / F-dSNE / DP-dSNE of Saha et al. 2023 as a scikit-learn-style estimator.

    Parameters
    ----------
    n_components : int
        Embedding dimension (2 for maps).
    perplexity : float
        ``ρ`` of Eq. (1), calibrated per point on ``[X_ℓ ; X_s]`` (kNN support of ``⌊3ρ⌋``).
    local_iters : int
        ``k``: gradient steps a site runs between two communications (1 = dSNE / DP-dSNE).
    rounds : int
        Number of communications; the total number of gradient steps is ``rounds · local_iters``.
    noise : None, "gaussian" or "adaclip"
        Privatisation of each release (None = dSNE in the clear).
    noise_multiplier : float, optional
        ``σ`` of Algorithm 3: Gaussian noise std in the clipped space (rows clipped to norm 1). The
        record-level noise multiplier is ``σ / (2 √N_s)`` (see the module docstring).
    epsilon : float, optional
        Record-level ε target at ``delta``; calibrates ``σ`` for the planned ``rounds`` releases
        (RDP accountant). Give either ``noise_multiplier`` or ``epsilon`` when ``noise`` is set.
    delta : float
        δ of the reported guarantee (default 1e-5, as the paper).
    reference : array of shape (N_s, n)
        The public reference set. Required (``default_reference`` builds one from a built-in dataset).
    learning_rate : "auto" or float
        ``η``; "auto" is ``max(N_site / exaggeration, 50)`` per site (openTSNE's rule).
    early_exaggeration : float
        ``α`` multiplying ``P`` during the first ``early_exaggeration_iter`` steps.
    early_exaggeration_iter : int
        Steps (counted over all rounds) with exaggeration and momentum ``momentum[0]``.
    momentum : (float, float)
        Momentum during / after early exaggeration (Algorithm 2's ``α``).
    init : "pca" or "random"
        "pca": PCA of the public reference (std 1e-4), sites project their own records locally;
        "random": ``N(0, 10⁻⁴ I)`` as Algorithm 5 line 7.
    adaclip_params : dict, optional
        Overrides of AdaCliP's ``h1, h2, beta1, beta2, s0`` (defaults ``1e-12, 1e4, 0.99, 0.9, 1.0``).
    clip_norm : float
        Row clipping norm of ``noise="gaussian"``.
    aggregation : str or Aggregator
        How the server forms the sum of the site updates (``securefed.securesum.base``): "plain",
        "secagg", "ckks" or an Aggregator instance.
    accountant : str
        Accountant of ``securefed.accounting`` for ``epsilon_`` ("rdp" as the brief, or "exact",
        "prv").
    ledger : securefed.accounting.PrivacyLedger, optional
        When given, every noisy release is recorded (write-ahead, budget-checked) before it leaves
        its site: ``site``, ``round``, ``step=0``, ``mechanism`` ("adaclip"/"gaussian"), sensitivity
        ``2√N_s``, ``σ`` and the record-level noise multiplier. A refused release raises
        ``BudgetExceededError`` and the run stops.
    random_state : None, int or numpy.random.Generator
        Statistics randomness (random init).
    noise_seed : None or int
        Seed of the DP noise generators. ``None`` (default) seeds them from ``os.urandom`` (256 bits);
        an integer makes benchmark runs reproducible and must not be used for real releases.

    Attributes
    ----------
    embedding_ : ndarray of shape (Σ N_ℓ, n_components)
        The sites' records in site order.
    site_embeddings_ : list of ndarray
    reference_embedding_ : ndarray of shape (N_s, n_components)
    noise_multiplier_ : float or None
        ``σ`` used.
    record_noise_multiplier_ : float or None
        ``σ / (2 √N_s)``.
    epsilon_, delta_ : float or None
        Record-level guarantee per site (None without noise; ``inf`` never occurs with noise).
    epsilon_per_row_ : float or None
        ε for a change confined to one reference row (comparison with the paper only).
    releases_ : int
        Noisy releases per site (= ``rounds``).
    history_ : list of dict
        Per round: ``round``, ``iteration``, ``kl`` (mean over sites of Eq. 3 on the site's points,
        without exaggeration; every ``max(1, rounds // 20)`` rounds and the last), ``bytes_up``.
    bytes_up_ : int
        Bytes each site uploaded in total.
    fit_seconds_ : float
    """

    method_name = "dsne"

    def __init__(
        self,
        n_components=2,
        perplexity=30.0,
        local_iters=1,
        rounds=750,
        noise=None,
        noise_multiplier=None,
        epsilon=None,
        delta=1e-5,
        reference=None,
        learning_rate="auto",
        early_exaggeration=12.0,
        early_exaggeration_iter=250,
        momentum=(0.5, 0.8),
        init="pca",
        adaclip_params=None,
        clip_norm=1.0,
        aggregation="plain",
        accountant="rdp",
        ledger=None,
        random_state=None,
        noise_seed=None,
    ):
        self.n_components = n_components
        self.perplexity = perplexity
        self.local_iters = local_iters
        self.rounds = rounds
        self.noise = noise
        self.noise_multiplier = noise_multiplier
        self.epsilon = epsilon
        self.delta = delta
        self.reference = reference
        self.learning_rate = learning_rate
        self.early_exaggeration = early_exaggeration
        self.early_exaggeration_iter = early_exaggeration_iter
        self.momentum = momentum
        self.init = init
        self.adaclip_params = adaclip_params
        self.clip_norm = clip_norm
        self.aggregation = aggregation
        self.accountant = accountant
        self.ledger = ledger
        self.random_state = random_state
        self.noise_seed = noise_seed

    # ------------------------------------------------------------------ validation
    def _validate(self, sites):
        sites = check_sites(sites, min_records=2)
        if self.reference is None:
            raise ConfigError(
                bad_value(
                    "reference",
                    None,
                    "dSNE needs a public reference set shared by all sites: pass reference=X_public "
                    "(same features as the sites), e.g. securefed.peers.default_reference(sites, 'mnist5k')",
                )
            )
        ref = check_sites([self.reference], min_records=2)[0]
        if ref.shape[1] != sites[0].shape[1]:
            raise DataError(
                bad_value("reference.shape", ref.shape, f"the reference needs the sites' {sites[0].shape[1]} features")
            )
        _check_positive_int("n_components", self.n_components)
        _check_positive_int("local_iters", self.local_iters)
        _check_positive_int("rounds", self.rounds)
        _check_positive_int("early_exaggeration_iter", self.early_exaggeration_iter, minimum=0)
        _check_positive("perplexity", self.perplexity)
        _check_positive("early_exaggeration", self.early_exaggeration)
        if self.learning_rate != "auto":
            _check_positive("learning_rate", self.learning_rate)
        mom = tuple(self.momentum) if isinstance(self.momentum, (tuple, list)) else None
        if mom is None or len(mom) != 2 or not all(0 <= float(x) < 1 for x in mom):
            raise ConfigError(bad_value("momentum", self.momentum, "use two values in [0, 1), e.g. (0.5, 0.8)"))
        if self.init not in ("pca", "random"):
            raise ConfigError(bad_value("init", self.init, "use 'pca' or 'random'"))
        if self.noise not in _NOISES:
            raise ConfigError(bad_value("noise", self.noise, "use None, 'gaussian' or 'adaclip'"))
        if not (0 < float(self.delta) < 1):
            raise ConfigError(bad_value("delta", self.delta, "use a value in (0, 1), e.g. 1e-5"))
        if self.noise is not None:
            if (self.noise_multiplier is None) == (self.epsilon is None):
                raise ConfigError(
                    bad_value(
                        "noise_multiplier/epsilon",
                        (self.noise_multiplier, self.epsilon),
                        "with noise set, give exactly one of noise_multiplier (σ of AdaCliP) or epsilon (target)",
                    )
                )
            if self.noise_multiplier is not None:
                _check_positive("noise_multiplier", self.noise_multiplier)
            else:
                _check_positive("epsilon", self.epsilon)
        elif self.noise_multiplier is not None or self.epsilon is not None:
            raise ConfigError(
                bad_value("noise", None, "noise_multiplier/epsilon were given but noise=None; set noise='adaclip'")
            )
        params = dict(_ADACLIP_DEFAULTS)
        if self.adaclip_params is not None:
            unknown = set(self.adaclip_params) - set(params)
            if unknown:
                raise ConfigError(
                    bad_value("adaclip_params", sorted(unknown), f"known keys are {', '.join(sorted(params))}")
                )
            params.update(self.adaclip_params)
        if isinstance(self.aggregation, str):
            aggregator = make_aggregator(self.aggregation)
        elif isinstance(self.aggregation, Aggregator):
            aggregator = self.aggregation
        else:
            raise ConfigError(
                bad_value("aggregation", self.aggregation, "use 'plain', 'secagg', 'ckks' or an Aggregator")
            )
        return sites, ref, mom, params, aggregator

    # ------------------------------------------------------------------ fitting
    def fit(self, sites, y=None):
        """Run the protocol on ``sites`` (list of ``(N_ℓ, n)`` arrays); returns ``self``."""
        t0 = time.perf_counter()
        sites, ref, mom, ada, aggregator = self._validate(sites)
        rng = np.random.default_rng(self.random_state)
        n_s = len(ref)
        d = int(self.n_components)
        k = int(self.local_iters)
        rounds = int(self.rounds)

        # Noise calibration (record level: sensitivity 2√N_s in the clipped space).
        delta_rec = record_sensitivity(n_s)
        if self.noise is None:
            sigma = None
        elif self.noise_multiplier is not None:
            sigma = float(self.noise_multiplier)
        else:
            sigma = (
                calibrate_noise_multiplier(float(self.epsilon), rounds, float(self.delta), str(self.accountant))
                * delta_rec
            )

        Y_s, states = self._init_states(sites, ref, d, sigma, ada, rng)
        history = []
        bytes_up = 0
        log_every = max(1, rounds // 20)
        it = 0
        for r in range(rounds):
            deltas = []
            for sidx, st in enumerate(states):
                Y = st["Y"]
                for j in range(k):
                    g = it + j
                    ee = g < self.early_exaggeration_iter
                    exag = float(self.early_exaggeration) if ee else 1.0
                    mu = float(mom[0]) if ee else float(mom[1])
                    lr = max(len(Y) / exag, 50.0) if self.learning_rate == "auto" else float(self.learning_rate)
                    grad = kl_gradient(st["P"], Y, exag, index=st["index"])
                    gains_momentum_step(Y, grad, st["update"], st["gains"], lr, mu)
                delta_s = Y[st["n"] :] - Y_s
                if st["mech"] is not None:
                    if self.ledger is not None:  # write-ahead: recorded before the release leaves
                        self.ledger.record_release(
                            site=sidx,
                            round=r,
                            step=0,
                            attempt=0,
                            mechanism=str(self.noise),
                            sensitivity=delta_rec,
                            sigma=sigma,
                            noise_multiplier=sigma / delta_rec,
                            method="dsne",
                        )
                    delta_s = st["mech"](delta_s)
                deltas.append(delta_s)
            it += k
            agg = aggregator.aggregate(deltas, round_index=r)
            bytes_up += int(agg.bytes_up)
            Y_s = Y_s + agg.total / agg.weight_sum
            shift = Y_s.mean(axis=0)
            Y_s = Y_s - shift
            for st in states:
                st["Y"][: st["n"]] -= shift
                st["Y"][st["n"] :] = Y_s
            if r % log_every == 0 or r == rounds - 1:
                kl = float(np.mean([kl_divergence(st["P"], st["Y"]) for st in states]))
                history.append({"round": r + 1, "iteration": it, "kl": kl, "bytes_up": bytes_up})
            if not np.all(np.isfinite(Y_s)):
                raise DataError(
                    bad_value(
                        "learning_rate",
                        self.learning_rate,
                        "the embedding diverged; use a smaller learning rate or more noise clipping",
                    )
                )

        self.site_embeddings_ = [st["Y"][: st["n"]].copy() for st in states]
        self.embedding_ = np.vstack(self.site_embeddings_)
        self.reference_embedding_ = Y_s
        self.n_reference_ = n_s
        self.releases_ = rounds
        self.history_ = history
        self.bytes_up_ = bytes_up
        self._set_privacy_attributes(sigma, delta_rec, rounds)
        self.fit_seconds_ = time.perf_counter() - t0
        return self

    def _init_states(self, sites, ref, d: int, sigma, ada: dict, rng):
        """Initial reference embedding (server) and each site's local state (affinities, embedding, mechanism)."""
        n_s = len(ref)
        if self.init == "pca":
            if ref.shape[1] < d:
                raise DataError(
                    bad_value("n_components", d, f"PCA init needs at most {ref.shape[1]} components; use init='random'")
                )
            mean, comps, scale = pca_init(ref, d)
            Y_s = (ref - mean) @ comps / scale
        else:
            Y_s = rng.normal(0.0, 1e-2, size=(n_s, d))
        noise_ss = np.random.SeedSequence(
            self.noise_seed if self.noise_seed is not None else int.from_bytes(os.urandom(32), "big")
        )
        states = []
        for X, nss in zip(sites, noise_ss.spawn(len(sites))):
            n_l = len(X)
            P = knn_affinities(np.vstack([X, ref]), perplexity=float(self.perplexity))
            if self.init == "pca":
                Y_l = (X - mean) @ comps / scale
            else:
                Y_l = rng.normal(0.0, 1e-2, size=(n_l, d))
            Y = np.vstack([Y_l, Y_s])
            mech: AdaCliP | GaussianRows | None = None
            if self.noise == "adaclip":
                mech = AdaCliP((n_s, d), sigma, random_state=np.random.default_rng(nss), **ada)
            elif self.noise == "gaussian":
                mech = GaussianRows((n_s, d), sigma, float(self.clip_norm), random_state=np.random.default_rng(nss))
            states.append(
                {
                    "n": n_l,
                    "P": P,
                    "index": (np.repeat(np.arange(P.shape[0]), np.diff(P.indptr)), P.indices),
                    "Y": Y,
                    "update": np.zeros_like(Y),
                    "gains": np.ones_like(Y),
                    "mech": mech,
                }
            )

        return Y_s, states

    def _set_privacy_attributes(self, sigma, delta_rec: float, rounds: int) -> None:
        self.delta_ = float(self.delta) if sigma is not None else None
        self.noise_multiplier_ = sigma
        if sigma is None:
            self.record_noise_multiplier_ = None
            self.epsilon_ = None
            self.epsilon_per_row_ = None
        else:
            self.record_noise_multiplier_ = sigma / delta_rec
            self.epsilon_ = _epsilon(sigma / delta_rec, rounds, float(self.delta), str(self.accountant))
            self.epsilon_per_row_ = _epsilon(sigma / 2.0, rounds, float(self.delta), str(self.accountant))

    def fit_transform(self, sites, y=None) -> np.ndarray:
        """Fit and return the embedding of the sites' records, concatenated in site order."""
        return self.fit(sites).embedding_

    def privacy_report(self) -> dict:
        """What left each site and the guarantee, as a JSON-ready dict (after ``fit``)."""
        if not hasattr(self, "embedding_"):
            raise ConfigError(bad_value("FedDSNE", "unfitted", "call fit(sites) first"))
        name = "dsne" if self.noise is None else ("fdsne" if int(self.local_iters) > 1 else "dp-dsne")
        return {
            "method": name,
            "what_leaves": WHAT_LEAVES[name],
            "releases_per_site": self.releases_,
            "floats_per_release": int(self.n_reference_ * int(self.n_components)),
            "noise": self.noise,
            "sigma": self.noise_multiplier_,
            "record_noise_multiplier": self.record_noise_multiplier_,
            "epsilon": self.epsilon_,
            "delta": self.delta_,
            "epsilon_per_row": self.epsilon_per_row_,
            "accountant": f"{self.accountant} (securefed.accounting), full-batch Gaussian, record-level sensitivity 2*sqrt(N_s)",
        }
