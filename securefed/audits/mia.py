"""Federated membership inference on the FedDL landmarks.

Threat model
------------
The attacker holds the released landmarks ``Y`` (the server, or anyone the landmarks are shown to), the
kernel bandwidth ``γ`` and the FedDL hyper-parameters, and has records **from the same population** but not
the target records: in the simulation, each site's held-out records. It wants to tell whether a given record
was used to fit ``Y`` (a member) or not. The audit plays this attacker honestly and measures how well it does.

Protocol (what leaves a site)
-----------------------------
Each site keeps a held-out part of its records out of FedDL (non-members). Locally it scores its members and
its non-members against ``Y`` with several scores (:data:`SCORES`), assigns each record at random to a
*selection* or a *test* split, and counts, for each threshold ``t`` of a **public grid** fixed per score,
how many members / non-members have score ≥ ``t``. Only these counts leave the site, summed over sites
(through the secure aggregator when one is given). The server then computes the ROC, the AUC, TPR at small
FPR, and — choosing score, threshold and direction on the selection split only — an empirical ε lower bound
and a GDP μ lower bound on the test split (Clopper–Pearson, 95 %), so the bound is a valid one-shot test.

Scores (higher = "more likely a member")
----------------------------------------
``nearest``  ``−γ min_j ‖x − y_j‖²`` — FedDL pulls landmarks towards the records it sees.
``kde``      ``log (1/n_y) Σ_j exp(−γ ‖x − y_j‖²)`` — the kernel density of ``x`` under ``Y`` (the MMD witness
             term of Qiao et al. Eq. (10) evaluated at ``x``).
``lira``     offline likelihood-ratio score (Carlini et al., "Membership Inference Attacks From First
             Principles", S&P 2022, §IV-C, fixed-variance variant): the attacker runs ``K`` **shadow FedDL**
             fits on its own data (a share of each site's held-out records, never a target member nor an evaluated
             non-member), so every evaluated record is *out* of every shadow run; the score is
             ``(s(x; Y) − mean_k s(x; Y_k)) / σ_out`` (``s`` = the nearest score) with ``σ_out`` the pooled out-spread. It removes
             per-record difficulty (records in dense regions are close to any landmark set).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Callable, Sequence

import numpy as np

from ..errors import ConfigError, DataError, ProtocolError, bad_value
from ..kernels import check_gamma, sq_dists
from .stats import (
    auc_from_roc,
    clopper_pearson,
    auc_standard_error,
    epsilon_lower_bound,
    gdp_mu_lower_bound,
    roc_from_counts,
    tpr_at_fpr,
)

__all__ = [
    "SCORES",
    "ShadowConfig",
    "MIAResult",
    "score_grid",
    "nearest_landmark_score",
    "kde_score",
    "lira_score",
    "site_roc_counts",
    "shadow_landmarks",
    "membership_audit",
    "mia_from_counts",
]

SCORES = ("nearest", "kde", "lira")
GRID_SIZE = 2049
THREAT_MODEL = (
    "Attacker: holds the released landmarks Y, the kernel bandwidth gamma and the FedDL hyper-parameters, and has "
    "records from the same population (in this audit: a share of each site's held-out records, used for shadow FedDL "
    "runs); it does not have the target records. Question: was record x used to fit Y? Each site scores its own members "
    "and held-out non-members locally; only per-threshold counts on a public grid leave a site (summed, through the "
    "secure aggregator when configured). Empirical epsilon: score, threshold and direction chosen on a selection split, "
    "Clopper-Pearson 95% bounds on a disjoint test split, delta subtracted (Jagielski et al. 2020; Nasr et al. 2023)."
)


def score_grid(kind: str, size: int = GRID_SIZE) -> np.ndarray:
    """The public threshold grid of a score (ascending), fixed before any data are seen.

    ``nearest`` and ``kde`` are ≤ 0 in units of ``γ·distance²``: the grid is ``−10^u`` for ``u`` from 4 down to
    −8 (170 thresholds per decade) plus 0. ``lira`` is a z-score: ``sinh`` spacing on ``[−10⁴, 10⁴]`` (step ≈ 0.01
    near 0).
    """
    if size < 16:
        raise ConfigError(bad_value("grid_size", size, "use at least 16 thresholds (default 2049)"))
    if kind in ("nearest", "kde"):
        return np.concatenate([-np.logspace(4, -8, size - 1), [0.0]])
    if kind == "lira":
        v = math.asinh(1e4)
        return np.sinh(np.linspace(-v, v, size))
    raise ConfigError(bad_value("scores", kind, f"choose from {', '.join(SCORES)}"))


def nearest_landmark_score(X: np.ndarray, Y: np.ndarray, gamma: float) -> np.ndarray:
    """``−γ min_j ‖x − y_j‖²`` per record (higher = closer to a landmark = more likely a member)."""
    return -gamma * sq_dists(X, Y).min(axis=1)


def kde_score(X: np.ndarray, Y: np.ndarray, gamma: float) -> np.ndarray:
    """``log (1/n_y) Σ_j exp(−γ ‖x − y_j‖²)``: the Gaussian-kernel density of ``x`` under the landmarks.

    This is the witness term ``(1/n_y) Σ_j k(x, y_j)`` of the MMD estimate (Qiao et al. Eq. (10)), in logs
    (computed stably with log-sum-exp).
    """
    L = -gamma * sq_dists(X, Y)
    mx = L.max(axis=1, keepdims=True)
    return (mx + np.log(np.exp(L - mx).mean(axis=1, keepdims=True)))[:, 0]


def lira_score(
    X: np.ndarray, Y: np.ndarray, shadow_Ys: Sequence[np.ndarray], gamma: float, sigma_out: float
) -> np.ndarray:
    """Offline LiRA z-score ``(s(x; Y) − mean_k s(x; Y_k)) / σ_out`` (Carlini et al. 2022, §IV-C).

    ``s`` is the nearest-landmark score (:func:`nearest_landmark_score`). Every shadow fit ``Y_k`` excluded ``x``,
    so ``s(x; Y_k)`` samples the *out* distribution of the score of ``x``; a large positive z means a landmark of
    ``Y`` sits closer to ``x`` than landmark sets that never saw ``x`` put one.
    """
    if not shadow_Ys:
        raise ConfigError(bad_value("shadow", "no shadow landmark sets", "run at least one shadow FedDL fit"))
    s_t = nearest_landmark_score(X, Y, gamma)
    s_out = np.stack([nearest_landmark_score(X, Yk, gamma) for Yk in shadow_Ys])
    return (s_t - s_out.mean(axis=0)) / sigma_out


def _pooled_out_sigma(X_sites: Sequence[np.ndarray], shadow_Ys, gamma) -> float:
    """Pooled standard deviation of the out-scores around each record's own mean (fixed-variance LiRA)."""
    if len(shadow_Ys) < 2:
        # with a single shadow fit the per-record spread is unobservable: use the spread across records instead
        s = np.concatenate([nearest_landmark_score(X, shadow_Ys[0], gamma) for X in X_sites if len(X)])
        return float(max(np.std(s), 1e-12))
    num, den = 0.0, 0
    for X in X_sites:
        if not len(X):
            continue
        s = np.stack([nearest_landmark_score(X, Yk, gamma) for Yk in shadow_Ys])
        num += float(((s - s.mean(axis=0)) ** 2).sum())
        den += s.shape[1] * (s.shape[0] - 1)
    return float(max(math.sqrt(num / max(den, 1)), 1e-12))


@dataclass
class ShadowConfig:
    """How the attacker's shadow FedDL fits are run (for the ``lira`` score).

    Attributes
    ----------
    n_runs : int
        Number of shadow FedDL fits ``K`` (each one costs a FedDL run; 4 is enough for the fixed-variance score).
    pool_fraction : float
        Share of each site's held-out records given to the attacker for shadow fits; the rest are the evaluated
        non-members. The two sets are disjoint, so every evaluated record is *out* of every shadow fit.
    run_fraction : float
        Each shadow fit uses a random subset of this share of the pool (so the fits differ, as in LiRA).
    fed_dl_kwargs : dict
        Extra keyword arguments for :func:`securefed.landmarks.feddl.fed_dl` — pass the target run's ``rounds``,
        ``local_steps``, ``rule``, ``lr`` (and a ``privacy`` object when the target was DP) so the shadows
        mimic it. ``n_landmarks`` and ``gamma`` are taken from the audited landmarks.
    runner : callable, optional
        ``runner(sites, n_landmarks, gamma, rng) -> Y`` replacing ``fed_dl`` (e.g. to run shadows through the
        same secure aggregator as the target).
    """

    n_runs: int = 4
    pool_fraction: float = 0.5
    run_fraction: float = 0.5
    fed_dl_kwargs: dict = field(default_factory=dict)
    runner: Callable | None = None

    def validate(self):
        if int(self.n_runs) < 1:
            raise ConfigError(bad_value("shadow.n_runs", self.n_runs, "use at least 1 shadow run, e.g. 4"))
        for name in ("pool_fraction", "run_fraction"):
            v = getattr(self, name)
            if not 0 < v < 1 and not (name == "run_fraction" and v == 1):
                raise ConfigError(bad_value(f"shadow.{name}", v, "use a fraction in (0, 1)"))
        return self


def shadow_landmarks(
    pool_sites: Sequence[np.ndarray], n_landmarks: int, gamma: float, shadow: ShadowConfig, rng
) -> list[np.ndarray]:
    """Run the attacker's ``K`` shadow FedDL fits on the shadow pools (one pool per site) and return their landmarks."""
    Ys = []
    for _ in range(int(shadow.n_runs)):
        sites = []
        for P in pool_sites:
            n = len(P)
            take = max(1, int(round(shadow.run_fraction * n)))
            sites.append(P[rng.choice(n, take, replace=False)] if take < n else P)
        sites = [S for S in sites if len(S)]
        if not sites:
            raise DataError(bad_value("nonmember_sites", "empty shadow pools", "hold out more records per site"))
        seed = int(rng.integers(2**63 - 1))
        if shadow.runner is not None:
            Yk = shadow.runner(sites, n_landmarks, gamma, np.random.default_rng(seed))
        else:
            try:
                from ..landmarks import fed_dl
            except ImportError as exc:
                raise ConfigError(
                    bad_value(
                        "scores",
                        "lira",
                        f"shadow runs need securefed.landmarks.feddl.fed_dl ({exc}); drop 'lira' or pass shadow.runner",
                    )
                ) from None
            kw = dict(shadow.fed_dl_kwargs)
            kw.setdefault("gamma", gamma)
            res = fed_dl(sites, n_landmarks, random_state=seed, **kw)
            Yk = res.landmarks
        Ys.append(np.asarray(Yk, dtype=np.float64))
    return Ys


def _counts_ge(scores: np.ndarray, grid: np.ndarray) -> np.ndarray:
    s = np.sort(scores)
    return (len(s) - np.searchsorted(s, grid, side="left")).astype(np.float64)


def site_roc_counts(
    members,
    nonmembers,
    Y,
    gamma,
    *,
    scores=("nearest", "kde"),
    shadow_Ys=None,
    sigma_out=None,
    grid_size: int = GRID_SIZE,
    select_fraction: float = 0.5,
    rng=None,
) -> np.ndarray:
    """What one site computes and sends: per-threshold member / non-member counts, flattened.

    Layout (one block per score, in ``scores`` order): ``[TP_sel, FP_sel, TP_test, FP_test]`` (each of length
    ``grid_size``: counts of scores ≥ each public threshold) followed by ``[P_sel, N_sel, P_test, N_test]`` (the
    totals, so dropouts in the sum stay consistent). Records are assigned to the selection split with probability
    ``select_fraction`` using ``rng``.
    """
    rng = np.random.default_rng(rng)
    out = []
    sel_m = rng.random(len(members)) < select_fraction
    sel_n = rng.random(len(nonmembers)) < select_fraction
    for kind in scores:
        grid = score_grid(kind, grid_size)
        if kind == "nearest":
            sm, sn = nearest_landmark_score(members, Y, gamma), nearest_landmark_score(nonmembers, Y, gamma)
        elif kind == "kde":
            sm, sn = kde_score(members, Y, gamma), kde_score(nonmembers, Y, gamma)
        else:
            sm = lira_score(members, Y, shadow_Ys, gamma, sigma_out)
            sn = lira_score(nonmembers, Y, shadow_Ys, gamma, sigma_out)
        out += [
            _counts_ge(sm[sel_m], grid),
            _counts_ge(sn[sel_n], grid),
            _counts_ge(sm[~sel_m], grid),
            _counts_ge(sn[~sel_n], grid),
            np.array([sel_m.sum(), sel_n.sum(), (~sel_m).sum(), (~sel_n).sum()], dtype=np.float64),
        ]
    return np.concatenate(out)


@dataclass
class MIAResult:
    """Result of :func:`membership_audit` (all figures from summed counts).

    Attributes
    ----------
    auc : float
        Largest AUC over the scores (all records).
    auc_se : float
        Hanley–McNeil standard error of that AUC.
    tpr_at_fpr_1e2, tpr_at_fpr_1e3 : float
        Largest TPR at FPR ≤ 10⁻² / 10⁻³ over the scores (with fewer than 1000 non-members the 10⁻³ figure is the
        TPR at FPR = 0).
    empirical_epsilon : float
        ε lower bound (≥ 0) at 95 % confidence on the test split, at the score/threshold/direction chosen on the
        selection split.
    empirical_mu : float
        GDP μ lower bound (≥ 0), chosen the same way.
    delta : float
        δ subtracted in the ε bound.
    best_score, threshold, direction :
        Where ``empirical_epsilon`` was measured (direction 0: flag members; 1: the complement).
    n_members, n_nonmembers, n_sites : int
        Records scored (evaluated non-members exclude the attacker's shadow pool) and sites in the sum.
    per_score : dict
        For each score: ``auc``, ``auc_se``, ``tpr_at_fpr_1e2``, ``tpr_at_fpr_1e3``, ``epsilon_lb``, ``mu_lb`` and the
        ROC curve ``roc = {"fpr": [...], "tpr": [...]}``.
    """

    auc: float
    auc_se: float
    tpr_at_fpr_1e2: float
    tpr_at_fpr_1e3: float
    empirical_epsilon: float
    empirical_mu: float
    delta: float
    confidence: float
    best_score: str
    threshold: float
    direction: int
    n_members: int
    n_nonmembers: int
    n_sites: int
    per_score: dict
    scores: tuple
    aggregation: str = "plain"
    shadow: dict | None = None
    threat_model: str = THREAT_MODEL

    def to_dict(self) -> dict:
        """A JSON-ready dict (the ``audit/mia.json`` format of the run folder)."""
        d = asdict(self)
        d["scores"] = list(self.scores)
        d["format"] = "securefed.audits.mia/1"
        return d


def _roc_summary(tp, fp, P, N):
    fpr, tpr = roc_from_counts(tp, fp, P, N)
    pts = np.unique(np.stack([fpr, tpr], axis=1), axis=0)
    return fpr, tpr, {"fpr": pts[:, 0].tolist(), "tpr": pts[:, 1].tolist()}


def _check_sites(name, sites, m=None):
    if not isinstance(sites, (list, tuple)) or len(sites) == 0:
        raise DataError(bad_value(name, type(sites).__name__, "pass a list with one (n_p, m) array per site"))
    out = []
    for i, S in enumerate(sites):
        S = np.asarray(S, dtype=np.float64)
        if S.ndim != 2 or (m is not None and S.shape[1] != m) or not np.all(np.isfinite(S)):
            raise DataError(bad_value(f"{name}[{i}]", getattr(S, "shape", None), f"pass a finite (n_p, {m}) array"))
        out.append(S)
    return out


def _check_scores(scores) -> tuple:
    """``scores`` as a tuple, checked: distinct names from :data:`SCORES`, at least one."""
    scores = tuple(scores)
    if not scores or any(s not in SCORES for s in scores) or len(set(scores)) != len(scores):
        raise ConfigError(bad_value("scores", scores, f"choose distinct scores from {', '.join(SCORES)}"))
    return scores


def _checked_audit_args(member_sites, nonmember_sites, landmarks, gamma, scores, select_fraction):
    """The arguments of :func:`membership_audit`, checked; returns (Y, γ, scores, members, non-members)."""
    Y = np.asarray(landmarks, dtype=np.float64)
    if Y.ndim != 2 or not np.all(np.isfinite(Y)):
        raise DataError(bad_value("landmarks", getattr(Y, "shape", None), "pass the finite (n_y, m) landmark matrix"))
    g = check_gamma(gamma)
    scores = _check_scores(scores)
    if not 0 < select_fraction < 1:
        raise ConfigError(bad_value("select_fraction", select_fraction, "use a fraction in (0, 1), e.g. 0.5"))
    members = _check_sites("member_sites", member_sites, Y.shape[1])
    nonmembers = _check_sites("nonmember_sites", nonmember_sites, Y.shape[1])
    if len(members) != len(nonmembers):
        raise DataError(
            bad_value("nonmember_sites", len(nonmembers), f"give one held-out array per site ({len(members)})")
        )
    return Y, g, scores, members, nonmembers


def _lira_shadow(members, nonmembers, Y, g: float, shadow: ShadowConfig | None, rng):
    """The attacker's shadow runs for ``lira``: each site's held-out records split into the shadow pool and the
    evaluated non-members; returns (the evaluated non-members, the shadow landmarks, the pooled out-σ, the shadow
    settings reported)."""
    shadow = (shadow or ShadowConfig()).validate()
    pools, evals = [], []
    for H in nonmembers:
        perm = rng.permutation(len(H))
        k = int(round(shadow.pool_fraction * len(H)))
        pools.append(H[perm[:k]])
        evals.append(H[perm[k:]])
    nonmembers = evals
    shadow_Ys = shadow_landmarks(pools, Y.shape[0], g, shadow, rng)
    sigma_out = _pooled_out_sigma(members + nonmembers, shadow_Ys, g)
    shadow_info = {
        "n_runs": int(shadow.n_runs),
        "pool_fraction": shadow.pool_fraction,
        "run_fraction": shadow.run_fraction,
        "pool_records": int(sum(len(p) for p in pools)),
        "sigma_out": sigma_out,
        "fed_dl_kwargs": {k: v for k, v in shadow.fed_dl_kwargs.items() if isinstance(v, (int, float, str, bool))},
    }
    return nonmembers, shadow_Ys, sigma_out, shadow_info


def membership_audit(
    member_sites,
    nonmember_sites,
    landmarks,
    gamma,
    *,
    scores=SCORES,
    aggregator=None,
    shadow: ShadowConfig | None = None,
    delta: float = 0.0,
    confidence: float = 0.95,
    select_fraction: float = 0.5,
    grid_size: int = GRID_SIZE,
    random_state=None,
) -> MIAResult:
    """Federated membership-inference audit of the landmarks (see the module docstring for the threat model).

    Parameters
    ----------
    member_sites : list of arrays (n_p, m)
        Each site's records that were used to fit the landmarks (after any clipping the run applied).
    nonmember_sites : list of arrays (h_p, m)
        Each site's held-out records (never seen by FedDL). With ``lira`` a ``shadow.pool_fraction`` share becomes the
        attacker's shadow pool and the rest the evaluated non-members.
    landmarks : array (n_y, m)
        The released ``Y``.
    gamma : float
        Kernel bandwidth used by FedDL.
    scores : tuple of str
        Any of ``"nearest"``, ``"kde"``, ``"lira"``.
    aggregator : Aggregator, optional
        Sums the sites' count vectors (``aggregator.aggregate([...]).total``); ``None`` sums in the clear.
    shadow : ShadowConfig, optional
        Shadow-run settings for ``lira`` (default ``ShadowConfig()``).
    delta : float
        δ of the privacy claim under test (the accountant's δ; 0 for a run without DP).
    confidence : float
        Clopper–Pearson level (0.95).
    select_fraction : float
        Share of records used to choose score / threshold / direction.
    grid_size : int
        Thresholds per public grid.
    random_state : None | int | Generator
        Splits and shadow subsets.

    Returns
    -------
    MIAResult
    """
    rng = np.random.default_rng(random_state)
    Y, g, scores, members, nonmembers = _checked_audit_args(
        member_sites, nonmember_sites, landmarks, gamma, scores, select_fraction
    )

    shadow_Ys, sigma_out, shadow_info = None, None, None
    if "lira" in scores:
        nonmembers, shadow_Ys, sigma_out, shadow_info = _lira_shadow(members, nonmembers, Y, g, shadow, rng)
    if sum(len(M) for M in members) == 0 or sum(len(N) for N in nonmembers) == 0:
        raise DataError(
            bad_value("member_sites/nonmember_sites", "no records", "each audit needs members and held-out non-members")
        )

    site_counts = [
        site_roc_counts(
            M,
            N,
            Y,
            g,
            scores=scores,
            shadow_Ys=shadow_Ys,
            sigma_out=sigma_out,
            grid_size=grid_size,
            select_fraction=select_fraction,
            rng=np.random.default_rng(int(rng.integers(2**63 - 1))),
        )
        for M, N in zip(members, nonmembers)
    ]
    if aggregator is None:
        total, agg_name, n_sites = np.sum(site_counts, axis=0), "plain", len(site_counts)
    else:
        res = aggregator.aggregate(site_counts)
        total, agg_name, n_sites = np.asarray(res.total, dtype=np.float64), res.protocol, len(res.survivors)
    return mia_from_counts(
        total,
        scores,
        n_sites=n_sites,
        aggregation=agg_name,
        delta=delta,
        confidence=confidence,
        grid_size=grid_size,
        shadow_info=shadow_info,
    )


def _score_summary(c, kind: str, G: int, delta: float, confidence: float) -> tuple[dict, float, float]:
    """One score's block ``c`` of the summed counts (:func:`site_roc_counts`) summarised: ROC, AUC and the ε / μ
    lower bounds on the test split at the thresholds the selection split chose; returns (the summary, the best ε and
    the best μ on the selection split)."""
    tp_s, fp_s, tp_t, fp_t = (c[j * G : (j + 1) * G] for j in range(4))
    P_s, N_s, P_t, N_t = (int(v) for v in c[4 * G :])
    if min(P_s, N_s, P_t, N_t) < 1:
        raise DataError(
            bad_value(
                "records per split",
                (P_s, N_s, P_t, N_t),
                "too few records: hold out more non-members or score more members",
            )
        )
    P, N = P_s + P_t, N_s + N_t
    fpr, tpr, roc = _roc_summary(tp_s + tp_t, fp_s + fp_t, P, N)
    auc = auc_from_roc(fpr, tpr)
    eps_sel, dir_sel = epsilon_lower_bound(tp_s, fp_s, P_s, N_s, delta, confidence)
    mu_sel = gdp_mu_lower_bound(tp_s, fp_s, P_s, N_s, confidence)
    j_eps, j_mu = int(np.argmax(eps_sel)), int(np.argmax(mu_sel))
    eps_t = _direction_pair(tp_t[j_eps], fp_t[j_eps], P_t, N_t, delta, confidence)[int(dir_sel[j_eps])]
    mu_t = gdp_mu_lower_bound(tp_t[j_mu], fp_t[j_mu], P_t, N_t, confidence)
    grid = score_grid(kind, G)
    summary = {
        "auc": auc,
        "auc_se": auc_standard_error(auc, P, N),
        "tpr_at_fpr_1e2": tpr_at_fpr(fpr, tpr, 1e-2),
        "tpr_at_fpr_1e3": tpr_at_fpr(fpr, tpr, 1e-3),
        "epsilon_lb": float(max(0.0, float(eps_t))),
        "mu_lb": float(max(0.0, float(mu_t))),
        "epsilon_threshold": float(grid[j_eps]),
        "epsilon_direction": int(dir_sel[j_eps]),
        "n_members": P,
        "n_nonmembers": N,
        "roc": roc,
    }
    return summary, float(eps_sel[j_eps]), float(mu_sel[j_mu])


def mia_from_counts(
    total,
    scores,
    *,
    n_sites: int,
    aggregation: str,
    delta: float = 0.0,
    confidence: float = 0.95,
    grid_size: int = GRID_SIZE,
    shadow_info: dict | None = None,
) -> MIAResult:
    """The server half of :func:`membership_audit`: ROC, AUC and the empirical ε / μ lower bounds from the
    **summed** per-threshold counts (:func:`site_roc_counts` of every site, added by any secure sum).

    Used in process by :func:`membership_audit` and over Flower by the coordinator, which receives only
    the summed counts.

    Parameters
    ----------
    total : array
        The sum over sites of ``site_roc_counts`` vectors (``len(scores) · (4·grid_size + 4)`` entries).
    scores : tuple of str
        The score kinds, in the order the sites computed them.
    n_sites, aggregation : int, str
        How many sites' counts are in the sum and by which protocol (reported).
    delta, confidence, grid_size, shadow_info
        As in :func:`membership_audit`.
    """
    scores = _check_scores(scores)
    total = np.asarray(total, dtype=np.float64)
    if total.shape != (len(scores) * (4 * grid_size + 4),) or not np.all(np.isfinite(total)):
        raise DataError(
            bad_value(
                "total",
                f"array{total.shape}",
                f"pass the summed count vector of length "
                f"{len(scores) * (4 * grid_size + 4)} (site_roc_counts per score)",
            )
        )
    agg_name = aggregation
    counts = np.rint(total)
    if np.max(np.abs(counts - total), initial=0.0) > 0.05:
        raise ProtocolError(
            bad_value(
                "aggregated counts",
                "non-integer sum",
                "the aggregator must sum integer counts exactly; check its fixed-point precision",
            )
        )

    G = grid_size
    block = 4 * G + 4
    per_score, best_sel = {}, None
    for i, kind in enumerate(scores):
        per_score[kind], eps_best, mu_best = _score_summary(
            counts[i * block : (i + 1) * block], kind, G, delta, confidence
        )
        cand = (eps_best, mu_best, kind)
        if best_sel is None or cand[0] > best_sel[0]:
            best_sel = cand
    best_mu_kind = max(scores, key=lambda k: _sel_mu(counts, scores, k, G, confidence))
    kind = best_sel[2]
    best = per_score[kind]
    top_auc = max(per_score, key=lambda k: per_score[k]["auc"])
    return MIAResult(
        auc=per_score[top_auc]["auc"],
        auc_se=per_score[top_auc]["auc_se"],
        tpr_at_fpr_1e2=max(v["tpr_at_fpr_1e2"] for v in per_score.values()),
        tpr_at_fpr_1e3=max(v["tpr_at_fpr_1e3"] for v in per_score.values()),
        empirical_epsilon=best["epsilon_lb"],
        empirical_mu=per_score[best_mu_kind]["mu_lb"],
        delta=float(delta),
        confidence=float(confidence),
        best_score=kind,
        threshold=best["epsilon_threshold"],
        direction=best["epsilon_direction"],
        n_members=best["n_members"],
        n_nonmembers=best["n_nonmembers"],
        n_sites=n_sites,
        per_score=per_score,
        scores=scores,
        aggregation=agg_name,
        shadow=shadow_info,
    )


def _direction_pair(tp, fp, P, N, delta, confidence):
    """The two one-direction ε bounds at one threshold (see :func:`epsilon_lower_bound`)."""
    tpr_lo, _ = clopper_pearson(tp, P, confidence)
    _, fpr_hi = clopper_pearson(fp, N, confidence)
    e1 = math.log((tpr_lo - delta) / fpr_hi) if tpr_lo - delta > 0 and fpr_hi > 0 else -math.inf
    e2 = math.log((1 - fpr_hi - delta) / (1 - tpr_lo)) if 1 - fpr_hi - delta > 0 and tpr_lo < 1 else -math.inf
    return e1, e2


def _sel_mu(counts, scores, kind, G, confidence):
    i = scores.index(kind)
    c = counts[i * (4 * G + 4) : (i + 1) * (4 * G + 4)]
    P_s, N_s = int(c[4 * G]), int(c[4 * G + 1])
    return float(np.max(gdp_mu_lower_bound(c[:G], c[G : 2 * G], P_s, N_s, confidence)))
