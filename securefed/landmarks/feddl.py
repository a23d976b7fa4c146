"""FedDL — federated distribution learning of landmarks (Algorithm 1 of Qiao et al.).

The server keeps ``n_y`` synthetic points ``Y`` (rows = points). For ``S`` rounds each site runs
``Q`` local gradient steps on ``f_p(Y) = MMD(X_p, Y)`` (Eq. 10, gradient Eq. 13) and uploads its
new ``Y_p`` (model averaging, Eq. 15) — or, under gradient averaging (Eq. 16), every local step is
an upload of ``∇f_p`` at the current global ``Y`` and a server step. The only thing the server ever
needs is a weighted **sum** of uploads, which goes through an :class:`~securefed.securesum.base.Aggregator`
(plain, SecAgg+ or CKKS), so the server learns only the sum under the secure aggregators.

Everything here is a pure function on arrays — one per equation — except :func:`fed_dl`, which runs the
rounds in process through the one coordinator (:mod:`securefed.federation`), whose loop is the only FedDL
loop in securefed.

What the rounds release, by mode, is stated in ``docs/threat-model.md`` and in every run's report: under plain
aggregation the server sees each site's ``Y_p`` every round. Two scalars/vectors are released once
before round 1 unless given: the sites' local median squared distance (for γ) and the sites' feature
sums/sums of squares (for the initial ``Y``); both go through the same aggregator. Under differential
privacy neither is used: γ and the initial ``Y`` then come from public quantities only (the clip norm
τ_X) so that the (ε, δ) claim covers everything the landmarks depend on.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Protocol

import numpy as np

from ..data import check_sites
from ..errors import ConfigError, DataError, bad_value
from ..kernels import check_gamma, gaussian_kernel
from ..securesum.base import AggregateResult

__all__ = [
    "mmd",
    "mmd_grad",
    "default_lr",
    "local_step",
    "client_update",
    "server_model_average",
    "server_gradient_step",
    "init_landmarks",
    "release_bounds",
    "LandmarkPrivacy",
    "FedDLResult",
    "fed_dl",
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
    """Unbiased-style MMD estimate between the rows of ``X`` and ``Y`` (Qiao et al. Eq. 10).

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
    """Gradient of ``f_p(Y) = MMD(X_p, Y)`` with respect to the landmark matrix (Qiao et al. Eq. 13).

    Row convention (docs/maths.md), with ``K_xy = K(X_p, Y)`` and ``K_yy = K(Y, Y)``::

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
    """One local gradient step ``Y ← Y − η ∇f_p(Y)`` (Qiao et al. Eq. 14, Algorithm 1 line 8).

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

    Qiao et al. Algorithm 1, lines 5–10: ``Y_p^{s,0} = Y^{s−1}``, then
    ``Y_p^{s,t} = Y_p^{s,t−1} − η_s ∇f_p(Y_p^{s,t−1})`` for ``t = 1..Q``; returns ``Y_p^s``.
    """
    Yp = np.array(Y, dtype=np.float64, copy=True)
    for t in range(local_steps):
        Yp, _ = local_step(X, Yp, gamma, lr, privacy=privacy, site=site, round=round, step=t, rng=rng)
    return Yp


def server_model_average(agg: AggregateResult) -> np.ndarray:
    """Model averaging, ``Y^s = Σ_p ω_p Y_p^s / Σ_p ω_p`` over the surviving sites (Qiao et al. Eq. 15)."""
    if agg.weight_sum <= 0:
        raise ConfigError(
            bad_value("weight_sum", agg.weight_sum, "at least one site with positive weight must survive")
        )
    return agg.total / agg.weight_sum


def server_gradient_step(Y: np.ndarray, agg: AggregateResult, lr: float) -> np.ndarray:
    """Gradient averaging, ``Y^s = Y^{s−1} − η' Σ_p ω_p ∇f_p / Σ_p ω_p`` (Qiao et al. Eq. 16)."""
    if agg.weight_sum <= 0:
        raise ConfigError(
            bad_value("weight_sum", agg.weight_sum, "at least one site with positive weight must survive")
        )
    return Y - lr * (agg.total / agg.weight_sum)


# ----------------------------------------------------------------------------------------------
# Validation, weights, initialisation
# ----------------------------------------------------------------------------------------------


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


# ----------------------------------------------------------------------------------------------
# Algorithm 1, run in this process through the one coordinator
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
        Weighted mean of the sites' MMD of the landmarks each round started from (``[]`` when monitoring is off).
    rounds_done : int
    seconds : float
    aggregation : dict
        Totals over all secure sums: protocol, count, clipped values, smallest survivor count, bytes.
    privacy : dict or None
        The DP block.
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


def _check_weights(weights) -> None:
    """Refuse site weights other than a public rule's name (``"records"``, ``"uniform"``)."""
    if not isinstance(weights, str):
        raise ConfigError(
            bad_value(
                "weights",
                weights,
                "use 'records' or 'uniform': each site weighs its own "
                "upload by a public rule (a weight chosen by the coordinator could single out one "
                "site)",
            )
        )


def _checkpointing(checkpoint: str | None, plan, sites, callback):
    """The state to resume from (the checkpoint file's, when it is of this run) and the coordinator's event hook,
    which writes the checkpoint after every round and calls ``callback(round, Y, mmd at the round's start)``."""
    from ..federation.checkpoint import fingerprint, read_checkpoint, write_checkpoint

    fp = fingerprint(plan, [len(X) for X in sites], sites[0].shape[1])
    resume = read_checkpoint(checkpoint, fp, plan.rounds) if checkpoint else None
    pending = [None]

    def on_event(ev):
        if ev["event"] == "round":
            pending[0] = ev.get("mmd_at_start")
        elif ev["event"] == "checkpoint":
            if checkpoint:
                write_checkpoint(checkpoint, ev["state"], fp)
            if callback is not None:
                callback(ev["state"]["round"], ev["state"]["Y"], pending[0])

    return resume, on_event


def _result_of(res) -> FedDLResult:
    """The landmark stage's part of an in-process run's result, as :func:`fed_dl` returns it."""
    return FedDLResult(
        landmarks=res.landmarks,
        gamma=res.gamma,
        lr=res.lr,
        rule=res.rule,
        mmd_history=res.mmd_history,
        rounds_done=res.rounds_done,
        seconds=res.seconds,
        aggregation=res.aggregation,
        privacy=res.privacy,
        released=res.released,
    )


def fed_dl(
    sites,
    n_landmarks: int = 100,
    *,
    rounds: int = 50,
    local_steps: int = 5,
    rule: str = "model",
    lr: float | str = "auto",
    gamma: float | None = None,
    weights: str = "records",
    aggregation: str = "plain",
    aggregation_options: dict | None = None,
    privacy=None,
    init="auto",
    value_bound: float | None = None,
    monitor: bool | None = None,
    checkpoint: str | None = None,
    random_state=None,
    callback: Callable[[int, np.ndarray, float | None], None] | None = None,
    exchange: dict | None = None,
) -> FedDLResult:
    """FedDL (Qiao et al. Algorithm 1) alone, run in this process by the one coordinator.

    The same job as a federated estimator's first stage (``method="none"``): γ and the start from one secure
    sum of statistics, then ``rounds`` rounds of model averaging (Eq. 15) or gradient averaging (Eq. 16)
    through the secure sum, each site computing its own update (:class:`securefed.federation.SiteWorker`).

    Parameters
    ----------
    sites : list of ndarray, each (n_p, m)
        The sites' records (rows = records).
    n_landmarks : int
        ``n_y`` (≥ 2).
    rounds, local_steps : int
        ``S`` and ``Q``. Gradient averaging releases every local step's gradient (``Q`` server steps a round).
    rule : {"model", "gradient"}
    lr : float or "auto"
        ``η`` (and ``η'`` for gradient averaging); ``"auto"`` is :func:`default_lr`.
    gamma : float, optional
        Kernel bandwidth; None → federated median heuristic (``1/τ_X²`` under DP).
    weights : {"records", "uniform"}
        Each site weighs its own upload by its record count or by 1 (Eq. 8) — never by a number the
        coordinator chose.
    aggregation, aggregation_options, value_bound
        The secure sum (``"plain"``, ``"secagg"``, ``"ckks"``), its options and the public bound on |feature
        values| it quantises into (as the estimators).
    privacy : GradientPerturbation, optional
        Differential privacy (its options become the run's; its ledger the aggregate ledger).
    init : "auto", "moments", "public" or ndarray
    monitor : bool, optional
        Sites report their MMD each round (default: on without DP; the MMD is not covered by DP).
    checkpoint : str, optional
        Checkpoint file written atomically after every round; an existing one of the same run is resumed.
    random_state : None, int or Generator
    callback : callable, optional
        ``callback(round, Y, mmd)`` after each round; ``mmd`` is that of the landmarks the round started from.
    exchange : dict, optional
        Options of the in-memory exchange (:class:`securefed.federation.InMemoryExchange`: simulated faults, an
        ``after_reply`` tap that sees what the coordinator receives — the audits use it).
    """
    from ..estimators import privacy_options
    from ..federation import run_in_process
    from ..plan import RunPlan, seed_of

    sites = check_sites(sites)
    _check_weights(weights)
    seed = seed_of(random_state)
    opts = dict(
        landmarks=n_landmarks,
        rounds=rounds,
        local_steps=local_steps,
        rule=rule,
        lr=lr,
        gamma=gamma,
        weights=weights,
        aggregation=aggregation,
        value_bound=value_bound,
        init=init,
        monitor=monitor,
        method="none",
        audit_holdout=0.0,
        seed=seed,
        **(aggregation_options or {}),
        **privacy_options(privacy),
    )
    plan = RunPlan.build("api", **{("landmarks" if k == "n_landmarks" else k): v for k, v in opts.items()})
    resume, on_event = _checkpointing(checkpoint, plan, sites, callback)
    ledger = privacy.ledger if privacy is not None else None
    res = run_in_process(plan, sites, ledger=ledger, resume=resume, on_event=on_event, exchange=exchange)
    if res.aggregation.get("clipped"):
        import warnings

        warnings.warn(
            f"secure aggregation clipped {res.aggregation['clipped']} values to its range over the run", stacklevel=2
        )
    return _result_of(res)
