"""FedDL — federated distribution learning of landmarks (Algorithm 1 of ``papers/000``).

The server keeps ``n_y`` synthetic points ``Y`` (rows = points). For ``S`` rounds each site runs
``Q`` local gradient steps on ``f_p(Y) = MMD(X_p, Y)`` (Eq. 10, gradient Eq. 13) and uploads its
new ``Y_p`` (model averaging, Eq. 15) — or, under gradient averaging (Eq. 16), every local step is
an upload of ``∇f_p`` at the current global ``Y`` and a server step. The only thing the server ever
needs is a weighted **sum** of uploads, which goes through an :class:`~securefed.securesum.base.Aggregator`
(plain, SecAgg+ or CKKS), so the server learns only the sum under the secure aggregators.

Everything here is a pure function on arrays except :func:`fed_dl`, which runs the rounds in process
(the protocol state machines in :mod:`securefed.securesum` do the secure summing).

What the rounds release, by mode, is stated in DESIGN §2 and in every run's report: under plain
aggregation the server sees each site's ``Y_p`` every round. Two scalars/vectors are released once
before round 1 unless given: the sites' local median squared distance (for γ) and the sites' feature
sums/sums of squares (for the initial ``Y``); both go through the same aggregator. Under differential
privacy neither is used: γ and the initial ``Y`` then come from public quantities only (the clip norm
τ_X) so that the (ε, δ) claim covers everything the landmarks depend on.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from typing import Callable, Protocol, Sequence

import numpy as np

from ..securesum.base import AggregateResult, Aggregator, PlainAggregator
from ..data import check_sites
from ..errors import ConfigError, DataError, bad_value
from threadpoolctl import threadpool_limits

from ..kernels import check_gamma, gaussian_kernel, local_median_sq_dist, median_gamma, sq_dists

__all__ = [
    "mmd",
    "mmd_grad",
    "default_lr",
    "local_step",
    "client_update",
    "server_model_average",
    "server_gradient_step",
    "init_landmarks",
    "resolve_weights",
    "release_bounds",
    "with_range",
    "LandmarkPrivacy",
    "FedDLResult",
    "fed_dl",
    "lloyd_refine",
    "check_sites",
]


# ----------------------------------------------------------------------------------------------
# Eq. (10) and Eq. (13)
# ----------------------------------------------------------------------------------------------


def _kxx_term(X: np.ndarray, gamma: float, chunk: int = 2048) -> float:
    """``(1ᵀ K_XX 1 − n) / (n(n−1))``, the Y-independent first term of Eq. (10), in row chunks."""
    n = len(X)
    if n < 2:
        raise DataError(bad_value("n_records", n, "MMD needs at least 2 records per site"))
    total = 0.0
    for s in range(0, n, chunk):
        total += float(gaussian_kernel(X[s : s + chunk], X, gamma).sum())
    return (total - n) / (n * (n - 1))


def mmd(X: np.ndarray, Y: np.ndarray, gamma: float, *, kxx_term: float | None = None) -> float:
    """Unbiased-style MMD estimate between the rows of ``X`` and ``Y`` (``papers/000`` Eq. 10).

    ``MMD = (1ᵀK_XX1 − n_p)/(n_p(n_p−1)) − 2·1ᵀK_XY1/(n_p n_y) + (1ᵀK_YY1 − n_y)/(n_y(n_y−1))``.

    Parameters
    ----------
    X : ndarray, shape (n_p, m)
        One site's records.
    Y : ndarray, shape (n_y, m)
        Landmarks.
    gamma : float
        Gaussian kernel bandwidth, ``k(x, y) = exp(−γ‖x − y‖²)``.
    kxx_term : float, optional
        The precomputed first term (it does not depend on ``Y``).
    """
    gamma = check_gamma(gamma)
    n_p, n_y = len(X), len(Y)
    if n_y < 2:
        raise ConfigError(bad_value("n_landmarks", n_y, "use at least 2 landmarks"))
    t1 = _kxx_term(X, gamma) if kxx_term is None else kxx_term
    t2 = 2.0 * float(gaussian_kernel(X, Y, gamma).sum()) / (n_p * n_y)
    t3 = (float(gaussian_kernel(Y, None, gamma).sum()) - n_y) / (n_y * (n_y - 1))
    return t1 - t2 + t3


def mmd_grad(X: np.ndarray, Y: np.ndarray, gamma: float, *, n_norm: float | None = None) -> np.ndarray:
    """Gradient of ``f_p(Y) = MMD(X_p, Y)`` with respect to the landmark matrix (``papers/000`` Eq. 13).

    Row convention (DESIGN §3), with ``K_xy = K(X_p, Y)`` and ``K_yy = K(Y, Y)``::

        ∇ = −4γ/(n_p n_y) · (K_xyᵀ X_p − diag(K_xyᵀ 1) Y)
            + 4γ/(n_y(n_y−1)) · (K_yy Y − diag(K_yy 1) Y)

    Parameters
    ----------
    X : ndarray, shape (n_p, m)
    Y : ndarray, shape (n_y, m)
    gamma : float
    n_norm : float, optional
        The ``n_p`` of the normaliser. Defaults to ``len(X)``; a subsampled batch passes the expected
        batch size so that one record's influence (the DP sensitivity) stays fixed.

    Returns
    -------
    ndarray, shape (n_y, m)
    """
    n_y = len(Y)
    if n_y < 2:
        raise ConfigError(bad_value("n_landmarks", n_y, "use at least 2 landmarks"))
    n_p = float(len(X) if n_norm is None else n_norm)
    Kxy = gaussian_kernel(X, Y, gamma)
    Kyy = gaussian_kernel(Y, None, gamma)
    attract = Kxy.T @ X - Kxy.sum(axis=0)[:, None] * Y
    repel = Kyy @ Y - Kyy.sum(axis=1)[:, None] * Y
    return (-4.0 * gamma / (n_p * n_y)) * attract + (4.0 * gamma / (n_y * (n_y - 1))) * repel


def default_lr(n_landmarks: int, gamma: float, scale: float = 0.5) -> float:
    """The default step size ``η = c · n_y / (4γ)`` with ``c = scale``.

    Why: with this η the attraction part of one gradient step moves landmark ``y_i`` by
    ``c · m_i · (x̄_i − y_i)`` where ``m_i = mean_j k(x_j, y_i) ∈ (0, 1]`` is its kernel mass and
    ``x̄_i`` the kernel-weighted mean of the data — a damped mean-shift step, so a landmark never
    overshoots the data whatever the data's scale, dimension, ``γ`` or ``n_y``. The curvature of the
    Gaussian kernel adds at most ``2/e`` to the local Lipschitz constant of that step, so ``c = 0.5``
    keeps every step contractive. The repulsion part moves ``y_i`` by at most
    ``c · max_k ‖y_k − y_i‖ · k(y_i, y_k)`` away from crowded landmarks. No tuning is needed on the
    bundled data sets (tested on digits, wine, iris, breast_cancer and MNIST-5k).
    """
    return float(scale) * n_landmarks / (4.0 * check_gamma(gamma))


# ----------------------------------------------------------------------------------------------
# Client (Algorithm 1 lines 5–11, Eq. 14) and server (Eqs. 15–16)
# ----------------------------------------------------------------------------------------------


class LandmarkPrivacy(Protocol):
    """The differential-privacy hook FedDL calls (implemented in :mod:`securefed.accounting`)."""

    def prepare(self, sites, *, gamma, n_landmarks, rounds, local_steps, rule, n_clients): ...

    def batch(self, site, round, step, X, rng): ...

    def project(self, Y): ...

    def perturb(self, grad, *, site, round, step): ...

    def after_aggregate(self, *, round, step, survivors): ...

    def report(self) -> dict: ...


def local_step(
    X: np.ndarray,
    Y: np.ndarray,
    gamma: float,
    lr: float,
    *,
    privacy: LandmarkPrivacy | None = None,
    site: int = 0,
    round: int = 0,
    step: int = 0,
    rng: np.random.Generator | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """One local gradient step ``Y ← Y − η ∇f_p(Y)`` (``papers/000`` Eq. 14, Algorithm 1 line 8).

    With a privacy hook the gradient is computed on the hook's batch, perturbed (the hook records the
    release in its ledger first) and the new ``Y`` projected onto the hook's spectral ball.

    Returns
    -------
    (Y_new, grad) : the updated landmarks and the (possibly noisy) gradient that was applied.
    """
    if privacy is None:
        g = mmd_grad(X, Y, gamma)
        return Y - lr * g, g
    Xb, n_norm = privacy.batch(site, round, step, X, rng)
    g = privacy.perturb(mmd_grad(Xb, Y, gamma, n_norm=n_norm), site=site, round=round, step=step)
    return privacy.project(Y - lr * g), g


def client_update(
    X: np.ndarray,
    Y: np.ndarray,
    gamma: float,
    lr: float,
    local_steps: int,
    *,
    privacy: LandmarkPrivacy | None = None,
    site: int = 0,
    round: int = 0,
    rng: np.random.Generator | None = None,
) -> np.ndarray:
    """Client side of a model-averaging round: ``Q`` local steps from the broadcast ``Y``.

    ``papers/000`` Algorithm 1, lines 5–10: ``Y_p^{s,0} = Y^{s−1}``, then
    ``Y_p^{s,t} = Y_p^{s,t−1} − η_s ∇f_p(Y_p^{s,t−1})`` for ``t = 1..Q``; returns ``Y_p^s``.
    """
    Yp = np.array(Y, dtype=np.float64, copy=True)
    for t in range(local_steps):
        Yp, _ = local_step(X, Yp, gamma, lr, privacy=privacy, site=site, round=round, step=t, rng=rng)
    return Yp


def server_model_average(agg: AggregateResult) -> np.ndarray:
    """Model averaging, ``Y^s = Σ_p ω_p Y_p^s / Σ_p ω_p`` over the surviving sites (``papers/000`` Eq. 15)."""
    if agg.weight_sum <= 0:
        raise ConfigError(bad_value("weight_sum", agg.weight_sum, "at least one site with positive weight must survive"))
    return agg.total / agg.weight_sum


def server_gradient_step(Y: np.ndarray, agg: AggregateResult, lr: float) -> np.ndarray:
    """Gradient averaging, ``Y^s = Y^{s−1} − η' Σ_p ω_p ∇f_p / Σ_p ω_p`` (``papers/000`` Eq. 16)."""
    if agg.weight_sum <= 0:
        raise ConfigError(bad_value("weight_sum", agg.weight_sum, "at least one site with positive weight must survive"))
    return Y - lr * (agg.total / agg.weight_sum)


# ----------------------------------------------------------------------------------------------
# Validation, weights, initialisation
# ----------------------------------------------------------------------------------------------


def resolve_weights(weights, sizes: Sequence[int]) -> np.ndarray:
    """Client weights ``ω_p`` of Eq. (8): ``"records"`` (∝ n_p, the pooled objective), ``"uniform"``
    (1/P, the paper's choice), or an explicit sequence of non-negative numbers."""
    P = len(sizes)
    if weights is None or (isinstance(weights, str) and weights == "records"):
        w = np.asarray(sizes, dtype=float)
    elif isinstance(weights, str) and weights == "uniform":
        w = np.ones(P)
    elif isinstance(weights, str):
        raise ConfigError(bad_value("weights", weights, "use 'records', 'uniform' or one number per site"))
    else:
        w = np.asarray(weights, dtype=float)
        if w.shape != (P,) or not np.all(np.isfinite(w)) or np.any(w < 0) or w.sum() <= 0:
            raise ConfigError(bad_value("weights", weights, f"give {P} finite non-negative numbers, not all zero"))
    return w / w.sum()


def init_landmarks(
    n_landmarks: int,
    n_features: int,
    *,
    mean: np.ndarray | None = None,
    std: np.ndarray | None = None,
    radius: float | None = None,
    rng: np.random.Generator,
) -> np.ndarray:
    """The server's initial ``Y^0`` (Algorithm 1 line 1).

    With the federated first moments (``mean``, ``std`` per feature, obtained through the secure sum)
    the landmarks are drawn from ``N(mean, (std/2)²)`` — inside the data's bulk so every landmark starts
    with kernel mass. With only a public radius (DP mode: the clip norm τ_X) they are drawn from
    ``N(0, (radius / (2√m))² I)``, which depends on nothing private.
    """
    if mean is not None:
        s = np.ones(n_features) if std is None else std
        return mean[None, :] + 0.5 * s[None, :] * rng.standard_normal((n_landmarks, n_features))
    if radius is None:
        raise ConfigError(bad_value("init", None, "give data moments or a public radius"))
    return (radius / (2.0 * np.sqrt(n_features))) * rng.standard_normal((n_landmarks, n_features))


def with_range(aggregator: Aggregator, bound: float | None) -> Aggregator:
    """The aggregator with its public clip range set to ``bound`` for one kind of release.

    Secure aggregators quantise into a fixed public range; each release FedDL makes (moments, γ
    statistic, landmark updates, gradients) has its own public bound derived from the public
    ``value_bound`` (see :func:`release_bounds`). Plain aggregation has no range.
    """
    if bound is None or not hasattr(aggregator, "clip_range"):
        return aggregator
    if hasattr(aggregator, "with_options"):
        return aggregator.with_options(clip_range=float(bound))
    import copy

    other = copy.copy(aggregator)
    other.clip_range = float(bound)
    return other


def release_bounds(value_bound: float | None, n_features: int, n_landmarks: int, gamma: float | None) -> dict:
    """Public bounds on |coordinate| of every FedDL release, from a public bound ``B ≥ |x_ij|``.

    * feature means: ``B``; mean squares scaled by ``1/B``: ``B``;
    * local median squared distance scaled by ``1/(4 m B)``: ``B`` (since ``d² ≤ 4 m B²``);
    * landmark updates ``Y_p`` (model averaging): ``2 B`` — landmarks stay near the data's hull, a
      repelled landmark beyond it is clipped, counted and reported;
    * gradients (Eq. 13): each coordinate is at most ``4γ/n_y · (2B + 2B·1.5) ≤ 20 γ B / n_y``.
    """
    if value_bound is None:
        return {}
    B = float(value_bound)
    out = {"moments": B, "gamma": B, "model": 2.0 * B}
    if gamma is not None:
        out["gradient"] = 20.0 * gamma * B / n_landmarks
    return out


def _federated_moments(sites, aggregator: Aggregator, bound: float | None) -> tuple[np.ndarray, np.ndarray]:
    """Per-feature mean and std of the pooled records, from one secure sum of each site's
    ``[mean_p, mean_p(x²)/B]`` weighted by its record count (so every coordinate is within ``B``)."""
    m = sites[0].shape[1]
    scale = 1.0 if bound is None else float(bound)
    ups = [np.concatenate([X.mean(axis=0), (X * X).mean(axis=0) / scale]) for X in sites]
    n = float(sum(len(X) for X in sites))
    agg = with_range(aggregator, bound).aggregate(ups, [len(X) / n for X in sites], round_index=-2)
    tot = agg.total / agg.weight_sum
    mean = tot[:m]
    var = np.maximum(tot[m:] * scale - mean**2, 0.0)
    return mean, np.sqrt(var)


def _federated_gamma(sites, aggregator: Aggregator, rng, bound: float | None) -> float:
    """γ by the median heuristic (:func:`securefed.kernels.median_gamma`) from one secure sum of the
    sites' local medians of squared distances, weighted by record counts."""
    m = sites[0].shape[1]
    scale = 1.0 if bound is None else 4.0 * m * float(bound)
    ups = [np.array([local_median_sq_dist(X, random_state=rng) / scale]) for X in sites]
    n = float(sum(len(X) for X in sites))
    agg = with_range(aggregator, bound).aggregate(ups, [len(X) / n for X in sites], round_index=-1)
    return median_gamma([agg.total[0] * scale / agg.weight_sum])


# ----------------------------------------------------------------------------------------------
# Algorithm 1
# ----------------------------------------------------------------------------------------------


@dataclass
class FedDLResult:
    """What :func:`fed_dl` returns.

    Attributes
    ----------
    landmarks : ndarray (n_y, m)
    gamma, lr : float
    rule : {"model", "gradient"}
    mmd_history : list of float
        Weighted mean of the sites' MMD after each round (``[]`` when monitoring is off).
    rounds_done : int
    seconds : float
    aggregation : dict
        Totals over all rounds: protocol, bytes per client, seconds in aggregation, clipped values,
        smallest survivor count.
    privacy : dict or None
        The privacy hook's report.
    released : list of str
        What left the sites besides the per-round updates (γ statistics, moments).
    """

    landmarks: np.ndarray
    gamma: float
    lr: float
    rule: str
    mmd_history: list = field(default_factory=list)
    rounds_done: int = 0
    seconds: float = 0.0
    aggregation: dict = field(default_factory=dict)
    privacy: dict | None = None
    released: list = field(default_factory=list)


def _atomic_write_checkpoint(path: str, state: dict, Y: np.ndarray) -> None:
    tmp = path + ".tmp"
    with open(tmp, "wb") as fh:
        np.savez(fh, Y=Y, state=np.frombuffer(json.dumps(state).encode(), dtype=np.uint8))
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    dfd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def _read_checkpoint(path: str) -> tuple[np.ndarray, dict]:
    with np.load(path) as z:
        return z["Y"].copy(), json.loads(bytes(z["state"]).decode())


def fed_dl(
    sites,
    n_landmarks: int = 100,
    *,
    rounds: int = 50,
    local_steps: int = 5,
    rule: str = "model",
    lr: float | str = "auto",
    gamma: float | None = None,
    weights=None,
    aggregator: Aggregator | None = None,
    privacy: LandmarkPrivacy | None = None,
    init="auto",
    value_bound: float | None = None,
    monitor: bool | None = None,
    checkpoint: str | None = None,
    random_state=None,
    callback: Callable[[int, np.ndarray, float | None], None] | None = None,
) -> FedDLResult:
    """Run FedDL (``papers/000`` Algorithm 1) in process and return the landmarks.

    Parameters
    ----------
    sites : list of ndarray, each (n_p, m)
        The sites' records (rows = records). Validated by :func:`check_sites`.
    n_landmarks : int
        ``n_y`` (≥ 2).
    rounds : int
        ``S``, communication rounds.
    local_steps : int
        ``Q``. Model averaging: local steps per round. Gradient averaging: aggregated steps per round
        (each step's gradients are summed and released, so a round is ``Q`` server steps).
    rule : {"model", "gradient"}
        Model averaging (Eq. 15) or gradient averaging (Eq. 16).
    lr : float or "auto"
        ``η`` (and ``η'`` for gradient averaging). ``"auto"`` is :func:`default_lr`.
    gamma : float, optional
        Kernel bandwidth; ``None`` → federated median heuristic (plain) or ``1/τ_X²`` (DP).
    weights : "records", "uniform" or sequence
        Client weights ``ω_p`` (Eq. 8). Default ``"records"``.
    aggregator : Aggregator, optional
        The secure-sum seam; default :class:`~securefed.securesum.base.PlainAggregator`.
    privacy : LandmarkPrivacy, optional
        Differential-privacy hook (clipping, projection, noise, ledger).
    init : "auto", "moments", "public" or ndarray
        Initial landmarks: federated moments (plain default), public radius (DP default) or given.
    value_bound : float, optional
        Public bound ``B ≥ |x_ij|`` on every feature value. Required by the secure aggregators (they
        quantise into a public range, :func:`release_bounds`); with DP it defaults to the clip norm τ_X.
    monitor : bool, optional
        Compute the MMD per round from the site data (default: on without privacy, off with it — the
        MMD history is computed from private data and is not covered by the privacy accounting).
    checkpoint : str, optional
        Path of a checkpoint file written atomically after every round; if it exists, the run resumes
        from it.
    random_state : None, int or Generator
        Statistical randomness (initialisation, subsampling).
    callback : callable, optional
        ``callback(round, Y, mmd_or_None)`` after each round (progress display).
    """
    t_start = time.perf_counter()
    sites = check_sites(sites)
    P, m = len(sites), sites[0].shape[1]
    n_landmarks = _positive_int("n_landmarks", n_landmarks, minimum=2)
    rounds = _positive_int("rounds", rounds)
    local_steps = _positive_int("local_steps", local_steps)
    if rule not in ("model", "gradient"):
        raise ConfigError(bad_value("rule", rule, "use 'model' (model averaging, Eq. 15) or 'gradient' (Eq. 16)"))
    aggregator = PlainAggregator() if aggregator is None else aggregator
    rng = np.random.default_rng(random_state)
    w = resolve_weights(weights, [len(X) for X in sites])
    released: list[str] = []

    if privacy is not None:
        tau_x = getattr(privacy, "tau_x", None)
        if gamma is None:
            if tau_x is None:
                raise ConfigError(bad_value("gamma", None, "with differential privacy give gamma or a clip norm"))
            gamma = 1.0 / float(tau_x) ** 2  # public: depends only on the clip norm, so DP covers it
        sites = privacy.prepare(sites, gamma=gamma, n_landmarks=n_landmarks, rounds=rounds, local_steps=local_steps,
                                rule=rule, n_clients=P, weights=w, aggregator=aggregator)
    if value_bound is None and privacy is not None:
        value_bound = float(getattr(privacy, "tau_x"))
    if value_bound is not None:
        value_bound = float(value_bound)
        if not np.isfinite(value_bound) or value_bound <= 0:
            raise ConfigError(bad_value("value_bound", value_bound, "give a positive public bound on |feature values|"))
    elif hasattr(aggregator, "clip_range"):
        raise ConfigError(bad_value("value_bound", None, f"{getattr(aggregator, 'name', 'secure')} aggregation quantises into "
                                    "a public range: give a public bound on |feature values| (e.g. 16 for digits, 255 for pixels)"))
    if gamma is None:
        gamma = _federated_gamma(sites, aggregator, rng, release_bounds(value_bound, m, n_landmarks, None).get("gamma"))
        released.append("one scalar per site: its local median squared distance, record-weighted (for γ)")
    gamma = check_gamma(gamma)
    if isinstance(lr, str):
        if lr != "auto":
            raise ConfigError(bad_value("lr", lr, "give a positive number or 'auto'"))
        lr = default_lr(n_landmarks, gamma)
    lr = float(lr)
    if not np.isfinite(lr) or lr <= 0:
        raise ConfigError(bad_value("lr", lr, "give a positive step size or 'auto'"))

    if monitor is None:
        monitor = privacy is None
    kxx = [_kxx_term(X, gamma) for X in sites] if monitor else None

    def weighted_mmd(Y):
        if not monitor:
            return None
        return float(sum(wp * mmd(X, Y, gamma, kxx_term=k) for wp, X, k in zip(w, sites, kxx)))

    start_round = 0
    history: list[float] = []
    Y = None
    fingerprint = {
        "n_landmarks": n_landmarks, "n_features": m, "site_sizes": [len(X) for X in sites], "rule": rule,
        "local_steps": local_steps, "gamma": gamma, "lr": lr, "weights": [float(v) for v in w],
        "aggregation": getattr(aggregator, "name", type(aggregator).__name__), "value_bound": value_bound,
        "privacy": None if privacy is None else {"type": type(privacy).__name__, "tau_x": getattr(privacy, "tau_x", None)},
        "init": "array" if isinstance(init, np.ndarray) else str(init),
    }
    if checkpoint and os.path.exists(checkpoint):
        Y, st = _read_checkpoint(checkpoint)
        if st.get("fingerprint") != json.loads(json.dumps(fingerprint)):
            raise ConfigError(bad_value("checkpoint", checkpoint, "was written by a run with other parameters or data; "
                                        "delete it or use another path (a checkpoint resumes only the same run)"))
        if int(st["round"]) > rounds:
            raise ConfigError(bad_value("rounds", rounds, f"the checkpoint already holds {st['round']} rounds; ask for at "
                                        "least that many or use another checkpoint path"))
        start_round = int(st["round"])
        history = list(st["history"])
        rng.bit_generator.state = st["rng"]
        if privacy is not None and hasattr(privacy, "set_state") and st.get("privacy") is not None:
            privacy.set_state(st["privacy"])
    if Y is None:
        if isinstance(init, np.ndarray):
            Y = np.array(init, dtype=np.float64)
            if Y.shape != (n_landmarks, m) or not np.all(np.isfinite(Y)):
                raise ConfigError(bad_value("init", f"array{Y.shape}", f"give a finite array of shape ({n_landmarks}, {m})"))
        elif init in ("auto", "moments", "public"):
            mode = ("public" if privacy is not None else "moments") if init == "auto" else init
            if mode == "moments":
                if privacy is not None:
                    raise ConfigError(bad_value("init", "moments", "with differential privacy use init='public' (moments are not accounted)"))
                mean, std = _federated_moments(sites, aggregator, release_bounds(value_bound, m, n_landmarks, None).get("moments"))
                released.append("per-feature sums, sums of squares and record counts (one secure sum, for the initial landmarks)")
                Y = init_landmarks(n_landmarks, m, mean=mean, std=std, rng=rng)
            else:
                radius = float(getattr(privacy, "tau_x", None) or np.sqrt(1.0 / gamma))
                Y = init_landmarks(n_landmarks, m, radius=radius, rng=rng)
        else:
            raise ConfigError(bad_value("init", init, "use 'auto', 'moments', 'public' or an (n_landmarks, m) array"))
        if privacy is not None:
            Y = privacy.project(Y)

    agg_stats = {"protocol": getattr(aggregator, "name", "?"), "seconds": 0.0, "bytes_up_per_client": 0,
                 "bytes_down": 0, "clipped": 0, "min_survivors": P, "aggregations": 0}

    bounds = release_bounds(value_bound, m, n_landmarks, gamma)
    round_agg = with_range(aggregator, bounds.get(rule))

    def aggregate(ups, round_index):
        agg = round_agg.aggregate(ups, w, round_index=round_index)
        agg_stats["seconds"] += agg.seconds
        agg_stats["bytes_up_per_client"] += agg.bytes_up
        agg_stats["bytes_down"] += agg.bytes_down
        agg_stats["clipped"] += agg.clipped
        agg_stats["min_survivors"] = min(agg_stats["min_survivors"], len(agg.survivors))
        agg_stats["aggregations"] += 1
        return agg

    spread0 = float(np.sqrt(np.max(np.sum((Y - Y.mean(axis=0)) ** 2, axis=1))))
    # the products here are small: one BLAS thread is 5–10× faster than two on 2 shared cores
    with threadpool_limits(limits=1, user_api="blas"):
        for s in range(start_round, rounds):
            if rule == "model":
                ups = [client_update(X, Y, gamma, lr, local_steps, privacy=privacy, site=p, round=s, rng=rng)
                       for p, X in enumerate(sites)]
                agg = aggregate(ups, s * local_steps)
                if privacy is not None:
                    privacy.after_aggregate(round=s, step=local_steps - 1, survivors=agg.survivors)
                Y = server_model_average(agg)
            else:
                for t in range(local_steps):
                    grads = []
                    for p, X in enumerate(sites):
                        if privacy is None:
                            grads.append(mmd_grad(X, Y, gamma))
                        else:
                            Xb, n_norm = privacy.batch(p, s, t, X, rng)
                            grads.append(privacy.perturb(mmd_grad(Xb, Y, gamma, n_norm=n_norm), site=p, round=s, step=t))
                    agg = aggregate(grads, s * local_steps + t)
                    if privacy is not None:
                        privacy.after_aggregate(round=s, step=t, survivors=agg.survivors)
                    Y = server_gradient_step(Y, agg, lr)
            if privacy is not None:
                Y = privacy.project(Y)
            spread = float(np.sqrt(np.max(np.sum((Y - Y.mean(axis=0)) ** 2, axis=1)))) if np.all(np.isfinite(Y)) else np.inf
            if not np.isfinite(spread) or spread > 20.0 * (spread0 + 1.0 / np.sqrt(gamma)):
                raise ConfigError(bad_value("lr", lr, f"landmarks diverged in round {s + 1} (spread {spread:.3g}, kernel width "
                                            f"{1 / np.sqrt(gamma):.3g}); use lr='auto' or a smaller step"))
            val = weighted_mmd(Y)
            if val is not None:
                history.append(val)
            if checkpoint:
                st = {"round": s + 1, "history": history, "rng": rng.bit_generator.state, "fingerprint": fingerprint,
                      "privacy": privacy.get_state() if privacy is not None and hasattr(privacy, "get_state") else None}
                _atomic_write_checkpoint(checkpoint, st, Y)
            if callback is not None:
                callback(s + 1, Y, val)

    if agg_stats["clipped"]:
        import warnings

        warnings.warn(f"secure aggregation clipped {agg_stats['clipped']} values to its range over the run", stacklevel=2)
    return FedDLResult(
        landmarks=Y,
        gamma=gamma,
        lr=lr,
        rule=rule,
        mmd_history=history,
        rounds_done=rounds,
        seconds=time.perf_counter() - t_start,
        aggregation=agg_stats,
        privacy=privacy.report() if privacy is not None else None,
        released=released,
    )


def lloyd_refine(
    sites,
    Y: np.ndarray,
    rounds: int = 10,
    *,
    aggregator: Aggregator | None = None,
    min_cluster_size: int = 10,
    value_bound: float | None = None,
    random_state=None,
) -> tuple[np.ndarray, dict]:
    """Federated Lloyd (k-means) refinement of the landmarks — beyond the paper, for ``nystrom="local"``.

    MMD landmarks with a wide Gaussian kernel match the data's distribution but sit between the records
    ("blurred"); when the sites place their records against an embedding of the landmarks alone, that
    blurs the map. A few Lloyd steps move each landmark to the mean of the records nearest to it.

    Each round every site assigns its records to their nearest landmark and uploads, per landmark, its
    scaled sum ``Σ_{x→i} x / n_p`` and count ``c_i / n_p`` (both bounded by the public ``value_bound``,
    resp. 1); the server receives only the record-weighted total through the aggregator and sets
    ``y_i`` to the pooled mean of its records. A landmark with fewer than ``min_cluster_size`` records
    keeps its position — the mean of a single record *is* that record — and, except in the last
    round, restarts as a jittered copy of one of the most populated landmarks (k-means splitting), so no
    landmark stays stranded between the records; one still below the floor after the last round goes
    back to its FedDL position (no near-duplicate landmarks are left). What remains of the leak (means
    of ≥ ``min_cluster_size`` records) is what the membership audit measures: on digits (10 sites, one
    class each, 300 landmarks, 10 rounds) a floor of 5 gives CA-10NN 0.92 at attack AUC 0.60 and
    empirical ε 0.47; 10 (the default) gives 0.85 at AUC 0.52, empirical ε 0; 20 gives 0.68 at AUC 0.51
    (``BENCHMARKS.md`` §5, ``benchmarks/audits_refine_tradeoff.py``). Not covered by DP: with a
    privacy hook, refinement is refused.

    Returns
    -------
    Y : ndarray (n_y, m)
    info : dict
        ``rounds``, ``min_cluster_size``, ``frozen`` (landmarks below the size floor in the last round).
    """
    sites = check_sites(sites)
    rng = np.random.default_rng(random_state)
    rounds = _positive_int("refine_rounds", rounds, minimum=0)
    min_cluster_size = _positive_int("min_cluster_size", min_cluster_size, minimum=2)
    aggregator = PlainAggregator() if aggregator is None else aggregator
    Y = np.array(Y, dtype=np.float64, copy=True)
    Y_start = Y.copy()
    n_y, m = Y.shape
    n = float(sum(len(X) for X in sites))
    w = [len(X) / n for X in sites]
    agg_r = with_range(aggregator, None if value_bound is None else max(float(value_bound), 1.0))
    frozen = 0
    for r in range(rounds):
        ups = []
        for X in sites:
            nearest = np.argmin(sq_dists(X, Y), axis=1)
            S = np.zeros((n_y, m))
            np.add.at(S, nearest, X)
            c = np.bincount(nearest, minlength=n_y).astype(float)
            ups.append(np.concatenate([S.ravel(), c]) / len(X))
        tot = agg_r.aggregate(ups, w, round_index=-100 - r).total
        counts = tot[n_y * m :] * n
        ok = counts >= min_cluster_size - 1e-6
        frozen = int(n_y - ok.sum())
        Y[ok] = tot[: n_y * m].reshape(n_y, m)[ok] / tot[n_y * m :][ok, None]
        if frozen and r < rounds - 1:
            # split the most populated clusters: a landmark without enough records restarts as a jittered
            # copy of a big cluster's mean (already public to the server), as in k-means++ splitting
            big = np.argsort(-counts)[: max(1, int(ok.sum()))]
            dead = np.flatnonzero(~ok)
            scale = 1e-2 * float(np.sqrt(np.mean(np.var(Y[ok], axis=0)))) if ok.any() else 1e-2
            Y[dead] = Y[big[np.arange(len(dead)) % len(big)]] + scale * rng.standard_normal((len(dead), m))
    if rounds:
        Y[~ok] = Y_start[~ok]  # a landmark that never gathered enough records keeps its FedDL position
    return Y, {"rounds": rounds, "min_cluster_size": min_cluster_size, "frozen": frozen}


def _positive_int(name: str, value, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ConfigError(bad_value(name, value, f"use an integer ≥ {minimum}"))
    return int(value)
