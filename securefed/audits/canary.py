"""Canary audit of DP FedDL and the seed-knowing distinguishing game (issue 14, items 1 and 7).

The membership audit (:mod:`.mia`) scores ordinary records against the landmarks; it passed a run whose σ was
100× too small (AUC 0.595, empirical ε 0). This audit instead plays the strongest adversary the (ε, δ) claim
is about and turns its success into an empirical ε **lower bound**: if the bound exceeds the claimed ε, the
claim is false (with the stated confidence).

Game (Jagielski, Ullman, Oprea 2020; Nasr et al., "Adversary Instantiation", S&P 2021)
-----------------------------------------------------------------------------------------
* Neighbouring data sets (replace adjacency, the adjacency of a full-batch run): ``D_out`` = the sites' records;
  ``D_in`` = the same with one record ``x_r`` of the canary site replaced by a **canary** ``c``. The auditor
  picks ``c`` and ``x_r`` to make them as distinguishable as the mechanism allows (:func:`choose_canary`): ``c``
  sits at the kernel-shape argmax ``d = 1/√(2γ)`` from a landmark of the (public) initial landmarks — where a
  record's pull ``k(x, y)(x − y)``, of norm ``d·e^{−γd²}``, is largest — and ``x_r`` is the site's record whose pull
  differs most from it. Site sizes, γ, τ_X and so σ are the same in both worlds.
* Each trial runs the real DP FedDL (the one coordinator, in process, rule ``"gradient"``, local noise, plain
  aggregation) once on ``D_in`` and once on ``D_out``, each with fresh noise (CSPRNG, or a fresh public seed).
* The adversary knows everything but the bit (the DP threat model): the other records, γ, η, the plan — and
  sees what the coordinator sees.

Statistics (higher = "the canary is in")
---------------------------------------
``release`` (default) — the likelihood-ratio test on the **released quantities**. Under local noise each
    release of the canary site is ``o_t = g_t(D_b; Y_t) + N(0, σ²I)`` at the public landmarks ``Y_t`` the
    coordinator broadcast (the coordinator receives ``o_t``; with a secure sum it would get it summed with other
    sites' noisy releases, which only adds noise). With ``m_t^b = g_t(D_b; Y_t)`` (the adversary computes both)
    and ``d_t = m_t^in − m_t^out``, the log-likelihood ratio of the whole adaptive transcript is
    ``Σ_t (⟨o_t − m_t^out, d_t⟩ − ‖d_t‖²/2)/σ² = (T − ½)·Σ_t‖d_t‖²/σ²`` with ::

        T = Σ_t ⟨o_t − m_t^out, d_t⟩ / Σ_t ‖d_t‖²   (0 without the canary, 1 with it, noise N(·, σ²/Σ‖d_t‖²))

    ``T ≥ ½`` is exactly the likelihood-ratio test at ratio 1, and thresholding ``T`` elsewhere is the
    Neyman–Pearson test of each trial's own ``μ̂ = √Σ‖d_t‖²/σ``. ``T`` needs no σ, so a run without noise is
    audited the same way. This is the most powerful test of the transcript: the bound it gives approaches the
    ε of ``μ̂`` (:attr:`CanaryAuditResult.attainable_epsilon`) as the trials grow, ``μ̂ ≤ √R/z`` when Δ holds.
``seeded`` — the distinguishing game of issue 14 item 1: the same test after the adversary **regenerates the
    noise from the seed** the plan carries (``noise_seed``: the server sends it to every site) or, without one,
    from the run seed the report prints, and subtracts it (``o_t − σ·N_seed(site, round, step, attempt)``). With
    seeded noise the residual is ``m_t^b`` exactly and ``T ∈ {0, 1}``: perfect distinguishing. With secret noise
    the subtraction only adds independent noise (variance 2σ²): the attacker is no better than ``release``.
``landmarks`` — black-box: only the final landmarks ``Y_S``, projected on the canary's direction,
    ``⟨Y_S − Ȳ^out, Ȳ^in − Ȳ^out⟩/‖Ȳ^in − Ȳ^out‖²`` where ``Ȳ^b`` are the noiseless trajectories of the two worlds
    (server step and projection replayed by the auditor). Weaker, but needs only the published landmarks.

Decision and bound
------------------
With ``threshold="select"`` the first ``selection`` share of the trial pairs chooses the threshold
(:func:`~.stats.best_threshold`) and the bound is computed on the remaining pairs only (a valid one-shot test);
a number fixes the threshold a priori (all pairs test it; ``0.5`` is the likelihood-ratio-1 test). The bound is
``max(log((TPR_lo − δ)/FPR_hi), log((1 − FPR_hi − δ)/(1 − TPR_lo)))`` with two-sided Clopper–Pearson ends at
``confidence`` (:func:`~.stats.epsilon_lower_bound`): if the mechanism is (ε, δ)-DP, the bound exceeds ε with
probability at most ``1 − confidence``. It can never exceed :func:`~.stats.perfect_test_epsilon` of the test pairs
(95 %: 50 pairs → 2.57, 200 → 3.98, 500 → 4.90, 1000 → 5.60), so refuting a claim ε needs at least
:func:`~.stats.trials_for_epsilon` test pairs (95 %: ε = 1 → 12, 2 → 30, 4 → 204).

Scope: the runner audits gradient averaging (rule ``"gradient"``) with local noise and full batches
(``sample_rate = 1``), the configuration whose releases are single Gaussian-noised gradients. Model averaging
(uploads are ``Y_p`` after projected noisy local steps), distributed noise (only sums are released) and Poisson
subsampling (each release is a mixture) are not audited here.

Cost: each pair is two complete in-process runs (≈ 60 ms each for 3 sites × 12 records, 4 landmarks, 3 rounds on
one loaded core), so 200 pairs take ≈ 25 s and 1000 pairs ≈ 2 min.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field

import numpy as np

from ..errors import ConfigError, bad_value
from .stats import best_threshold, epsilon_lower_bound, gdp_mu_lower_bound, perfect_test_epsilon

__all__ = [
    "STATISTICS",
    "NOISES",
    "VERDICTS",
    "CanaryAuditResult",
    "CanaryTrials",
    "choose_canary",
    "run_canary_trials",
    "canary_audit",
    "distinguishing_game",
]

STATISTICS = ("release", "seeded", "landmarks")
NOISES = ("secret", "seeded", "none")
VERDICTS = ("consistent", "claim violated")


# ------------------------------------------------------------------------------------------------ results


@dataclass(frozen=True)
class CanaryAuditResult:
    """One audit's decision.

    Attributes
    ----------
    epsilon_lower_bound : float
        Empirical ε lower bound (≥ 0), valid with probability ≥ ``confidence`` if the claim holds.
    confidence : float
    trials, test_trials : int
        Trial pairs run (each: one run with the canary, one without) and pairs the bound is computed on.
    statistic : str
        ``"release"``, ``"seeded"`` or ``"landmarks"`` (module docstring).
    threshold : float
    direction : str
        Which side of the threshold the bound's decision set is.
    tpr, fpr : float
        Point estimates on the test pairs (canary-in runs scored ≥ threshold, canary-out runs scored ≥ threshold).
    claimed_epsilon, delta : float
        The claim being tested (``inf`` for "no claim").
    verdict : str
        ``"claim violated"`` when ``epsilon_lower_bound > claimed_epsilon``, else ``"consistent"``.
    max_showable_epsilon : float
        The bound a perfect test on ``test_trials`` pairs would give: no claim above it can be refuted.
    mu_lower_bound : float
        GDP μ lower bound at the same threshold (Nasr et al. 2023), ≥ 0.
    attainable_epsilon : float
        ε of the canary's mean ``μ̂ = √Σ‖d_t‖²/σ`` (``inf`` without noise): what the likelihood-ratio test tends to
        with unlimited trials. Well below the claim means the canary does not attain Δ (a loose audit).
    noise, sigma_scale : str, float
        How the audited runs drew their noise and the factor applied to the calibrated σ (0.01 = "σ/100").
    seconds : float
        Wall time of the trials.
    """

    epsilon_lower_bound: float
    confidence: float
    trials: int
    test_trials: int
    statistic: str
    threshold: float
    direction: str
    tpr: float
    fpr: float
    claimed_epsilon: float
    delta: float
    verdict: str
    max_showable_epsilon: float
    mu_lower_bound: float
    attainable_epsilon: float
    noise: str
    sigma_scale: float
    seconds: float

    @property
    def violated(self) -> bool:
        return self.verdict == "claim violated"

    def as_dict(self) -> dict:
        from dataclasses import asdict

        return asdict(self)


@dataclass(frozen=True)
class CanaryTrials:
    """The scores of every statistic over the trial pairs (one run set serves all three statistics).

    ``scores[statistic]`` is ``(in_scores, out_scores)``, one entry per pair, in run order. ``canary_mu`` and
    ``sensitivity_attained`` / ``sensitivity_max`` (RMS / largest ``‖d_t‖/Δ`` over the releases) describe how much
    of the claimed worst case the canary reaches; ``sensitivity_max > 1`` would mean Δ is exceeded.
    """

    scores: dict
    claimed_epsilon: float
    delta: float
    noise: str
    sigma_scale: float
    noise_multiplier: float
    sensitivity: float
    sigma: float
    releases: int
    canary: tuple
    partner: tuple
    replaced: int
    canary_site: int
    canary_mu: float
    sensitivity_attained: float
    sensitivity_max: float
    seconds: float
    config: dict = field(default_factory=dict)

    @property
    def trials(self) -> int:
        return len(self.scores["release"][0])

    def audit(
        self,
        statistic: str = "release",
        *,
        confidence: float = 0.95,
        threshold="select",
        selection: float = 0.5,
        trials: int | None = None,
    ) -> CanaryAuditResult:
        """The empirical ε lower bound of ``statistic`` on the first ``trials`` pairs (default: all).

        ``threshold="select"``: chosen on the first ``selection`` share of the pairs, bound on the rest;
        a number: fixed a priori, bound on all pairs.
        """
        if statistic not in STATISTICS:
            raise ConfigError(bad_value("statistic", statistic, f"use one of {', '.join(STATISTICS)}"))
        s_in, s_out = (np.asarray(a, dtype=np.float64) for a in self.scores[statistic])
        n = len(s_in) if trials is None else int(trials)
        if not 1 <= n <= len(s_in):
            raise ConfigError(bad_value("trials", trials, f"use 1..{len(s_in)} (the pairs that were run)"))
        s_in, s_out = s_in[:n], s_out[:n]
        if isinstance(threshold, str):
            if threshold != "select":
                raise ConfigError(bad_value("threshold", threshold, "use 'select' or a number"))
            if not 0 < selection < 1:
                raise ConfigError(bad_value("selection", selection, "use a share in (0, 1), e.g. 0.5"))
            k = int(math.floor(selection * n))
            if k < 1 or k >= n:
                raise ConfigError(bad_value("trials", n, f"too few pairs to split {selection:g} / {1 - selection:g}"))
            thr, _ = best_threshold(s_in[:k], s_out[:k], delta=self.delta, confidence=confidence)
            thr = 0.5 if thr is None else thr
            t_in, t_out = s_in[k:], s_out[k:]
        else:
            thr = float(threshold)
            if not math.isfinite(thr):
                raise ConfigError(bad_value("threshold", threshold, "use a finite number or 'select'"))
            t_in, t_out = s_in, s_out
        m = len(t_in)
        tp, fp = int(np.sum(t_in >= thr)), int(np.sum(t_out >= thr))
        eps, direction = epsilon_lower_bound(tp, fp, m, m, delta=self.delta, confidence=confidence)
        eps = max(0.0, float(eps))
        mu = max(
            float(gdp_mu_lower_bound(tp, fp, m, m, confidence)),
            float(gdp_mu_lower_bound(m - fp, m - tp, m, m, confidence)),
            0.0,
        )
        if self.canary_mu == math.inf:
            attainable = math.inf
        else:
            from ..accounting import gdp_epsilon

            attainable = gdp_epsilon(self.delta, self.canary_mu) if self.canary_mu > 0 else 0.0
        return CanaryAuditResult(
            epsilon_lower_bound=eps,
            confidence=float(confidence),
            trials=n,
            test_trials=m,
            statistic=statistic,
            threshold=float(thr),
            direction=(
                "canary in when statistic >= threshold"
                if int(direction) == 0
                else "canary out when statistic < threshold"
            ),
            tpr=tp / m,
            fpr=fp / m,
            claimed_epsilon=float(self.claimed_epsilon),
            delta=float(self.delta),
            verdict=VERDICTS[1] if eps > self.claimed_epsilon else VERDICTS[0],
            max_showable_epsilon=perfect_test_epsilon(m, confidence, self.delta),
            mu_lower_bound=mu,
            attainable_epsilon=float(attainable),
            noise=self.noise,
            sigma_scale=float(self.sigma_scale),
            seconds=float(self.seconds),
        )


# ------------------------------------------------------------------------------------------------ canary


def _pull(P: np.ndarray, Y: np.ndarray, gamma: float) -> np.ndarray:
    """``k(p, y_i)(p − y_i)`` for every point ``p`` and landmark ``y_i``: shape (len(P), n_y, m). A record's share of
    the attraction term of Eq. (13) is ``−4γ/(n n_y)`` times this (the repulsion term does not involve records)."""
    diff = P[:, None, :] - Y[None, :, :]
    return np.exp(-gamma * np.sum(diff * diff, axis=2))[:, :, None] * diff


def _unit_directions(m: int, n: int, rng: np.random.Generator) -> np.ndarray:
    U = np.concatenate([np.eye(m), -np.eye(m), rng.standard_normal((n, m))])
    return U / np.linalg.norm(U, axis=1, keepdims=True)


def choose_canary(
    X: np.ndarray,
    Y0: np.ndarray,
    gamma: float,
    tau_x: float,
    kind="kernel_shape",
    *,
    random_state=0,
    n_directions: int = 64,
) -> tuple[np.ndarray, np.ndarray, int, float]:
    """The canary pair: the record ``c`` the canary world holds and the record ``c'`` the other world holds in its
    place, at index ``r`` of the site's records, maximising ``‖pull(c) − pull(c')‖_F`` at the landmarks ``Y0``
    (:func:`_pull`) — the change of the site's gradient (Eq. 13) between the two neighbours.

    ``kind``:

    * ``"kernel_shape"`` (default) — the worst case of the kernel-shape bound made concrete: the best pair among
      the points ``y_i ± u/√(2γ)`` (at the argmax distance of ``d·e^{−γd²}`` from a landmark, over every landmark,
      the axes and ``n_directions`` random directions ``u``) and ``τ_X·u``; the site's own records are also tried
      as ``c'``. ``c'`` is a second inserted record (replace adjacency lets the auditor choose both).
    * ``"sphere"`` — ``c`` on the τ_X sphere opposite the site's mean (far from the data), ``c'`` the site's
      record whose pull differs most.
    * a point — ``c`` given, ``c'`` the site's record whose pull differs most.

    Points are clipped to the τ_X ball (the site would clip them). Returns ``(c, c', r, ‖pull(c) − pull(c')‖_F)``;
    multiply the last by ``4γ/(n_p n_y)`` for the gradient change.
    """
    from ..accounting import clip_records

    X = clip_records(np.asarray(X, dtype=np.float64), tau_x)[0]
    Y0 = np.asarray(Y0, dtype=np.float64)
    m = X.shape[1]
    rng = np.random.default_rng(random_state)
    GX = _pull(X, Y0, gamma).reshape(len(X), -1)
    if isinstance(kind, str) and kind == "kernel_shape":
        U = _unit_directions(m, n_directions, rng)
        step = U[None, :, :] / math.sqrt(2.0 * gamma)
        C = clip_records(
            np.concatenate([(Y0[:, None, :] + step).reshape(-1, m), (Y0[:, None, :] - step).reshape(-1, m), tau_x * U]),
            tau_x,
        )[0]
        GC = _pull(C, Y0, gamma).reshape(len(C), -1)
        D2 = np.sum(GC * GC, axis=1)[:, None] + np.sum(GC * GC, axis=1)[None, :] - 2.0 * GC @ GC.T
        i, j = map(int, np.unravel_index(int(np.argmax(D2)), D2.shape))
        # c' overwrites the site's record whose pull differs most from c's (it is in both worlds' place)
        DX = np.sum((GX - GC[i]) ** 2, axis=1)
        r = int(np.argmax(DX))
        c, cp, best = C[i].copy(), C[j].copy(), float(D2[i, j])
        if DX[r] > best:  # a real record is the better partner
            cp, best = X[r].copy(), float(DX[r])
        return c, cp, r, float(math.sqrt(max(best, 0.0)))
    if isinstance(kind, str) and kind == "sphere":
        mu = X.mean(axis=0)
        u = -mu / np.linalg.norm(mu) if np.linalg.norm(mu) > 1e-12 else _unit_directions(m, 1, rng)[-1]
        C = tau_x * u[None, :]
    elif isinstance(kind, str):
        raise ConfigError(bad_value("canary", kind, "use 'kernel_shape', 'sphere' or a point (array of n_features)"))
    else:
        C = np.asarray(kind, dtype=np.float64).reshape(1, -1)
        if C.shape[1] != m or not np.all(np.isfinite(C)):
            raise ConfigError(bad_value("canary", f"array{C.shape}", f"give a finite point with {m} features"))
    C = clip_records(C, tau_x)[0]
    GC = _pull(C, Y0, gamma).reshape(len(C), -1)
    D2 = np.sum(GC * GC, axis=1)[:, None] + np.sum(GX * GX, axis=1)[None, :] - 2.0 * GC @ GX.T
    i, r = map(int, np.unravel_index(int(np.argmax(D2)), D2.shape))
    c, cp, best = C[i].copy(), X[r].copy(), float(D2[i, r])
    return c, cp, int(r), float(math.sqrt(max(best, 0.0)))


# ------------------------------------------------------------------------------------------------ runs


def _noise_options(seed) -> dict:
    """:class:`~securefed.accounting.GradientPerturbation` options for secret (``seed=None``) or seeded noise."""
    return {} if seed is None else {"insecure_noise_seed_for_testing": int(seed)}


class _Tap:
    """``after_reply`` hook of the in-memory exchange: keeps what the coordinator receives from the canary site
    for every gradient release — the landmarks it sent (``Y_t``), the noisy upload (``o_t``), the plan it sent and
    the site's ledger event (σ, round, step, attempt)."""

    def __init__(self, site: int):
        self.site = site
        self.releases: list = []

    def __call__(self, address, request: dict, reply: dict) -> None:
        from ..federation.wire import get_array

        if address != self.site or request.get("task") != "gradient" or "update" not in reply:
            return
        events = reply.get("dp_events") or []
        self.releases.append(
            {
                "Y": get_array(request, "Y"),
                "o": get_array(reply, "update"),
                "gamma": float(request["gamma"]),
                "seed": int(request.get("seed", 0)),
                "plan": request.get("dp"),
                "event": json.loads(events[-1]) if events else None,
            }
        )


def _run(sites, site: int, *, n_landmarks, rounds, local_steps, gamma, lr, seed, gp):
    """One DP FedDL run (gradient averaging, plain sum) through the one coordinator, as :func:`fed_dl` runs it,
    with the canary site's releases tapped. ``gp=None`` runs without DP (no noise, no clipping, no projection)."""
    from ..landmarks import fed_dl

    tap = _Tap(site)
    res = fed_dl(
        sites,
        n_landmarks,
        rounds=rounds,
        local_steps=local_steps,
        rule="gradient",
        lr=lr,
        gamma=gamma,
        init="public",
        monitor=False,
        random_state=seed,
        privacy=gp,
        exchange={"after_reply": tap},
    )
    if len(tap.releases) != rounds * local_steps:
        raise ConfigError(
            bad_value(
                "canary site",
                site,
                f"released {len(tap.releases)} gradients, expected {rounds * local_steps} (did it drop out?)",
            )
        )
    return res.landmarks, tap.releases


def _noiseless(sites, Y0, gamma, lr, steps, project):
    """The auditor's replay of the run without noise: ``Y ← Π(Y − η Σ_p n_p ∇f_p(Y) / Σ_p n_p)``."""
    from ..landmarks.feddl import mmd_grad

    n = np.array([len(X) for X in sites], dtype=np.float64)
    Y = np.array(Y0, dtype=np.float64)
    for _ in range(steps):
        G = sum(w * mmd_grad(X, Y, gamma) for w, X in zip(n, sites)) / n.sum()
        Y = project(Y - lr * G)
    return Y


def _checked_sites(sites, *, noise, trials, sigma_scale, canary_site, tau_x) -> list:
    """The arguments of :func:`run_canary_trials`, checked before any run; returns the sites clipped to τ_X."""
    from ..accounting import clip_records
    from ..landmarks.feddl import check_sites

    if noise not in NOISES:
        raise ConfigError(bad_value("noise", noise, f"use one of {', '.join(NOISES)}"))
    if not (isinstance(trials, (int, np.integer)) and trials >= 2):
        raise ConfigError(bad_value("trials", trials, "use at least 2 trial pairs (hundreds for a useful bound)"))
    if not (sigma_scale > 0 or (noise == "none")):
        raise ConfigError(bad_value("sigma_scale", sigma_scale, "use a positive factor (noise='none' for no noise)"))
    sites = [clip_records(X, tau_x)[0] for X in check_sites(sites)]
    if not 0 <= canary_site < len(sites):
        raise ConfigError(bad_value("canary_site", canary_site, f"use 0..{len(sites) - 1}"))
    return sites


def _neighbours(sites, canary_site: int, r: int, c, cp):
    """The two neighbouring datasets: record ``r`` of the canary site is ``cp`` (out) or the canary ``c`` (in);
    returns (X_out, X_in, [sites with X_out, sites with X_in])."""
    X_out = sites[canary_site].copy()
    X_out[r] = cp
    X_in = X_out.copy()
    X_in[r] = c
    worlds = [list(sites), list(sites)]
    worlds[0][canary_site] = X_out
    worlds[1][canary_site] = X_in
    return X_out, X_in, worlds


def _claim(
    sites,
    canary_site,
    *,
    epsilon,
    noise_multiplier,
    noise,
    delta,
    tau_x,
    accountant,
    gamma,
    n_landmarks,
    rounds,
    local_steps,
    claimed_epsilon,
):
    """The claim: z, Δ of the canary site and the ε the verdict compares against, from public numbers only (the
    same code the run calibrates with); returns (the calibrated mechanism, z, Δ, claimed ε)."""
    from ..accounting import GradientPerturbation

    claim_eps = epsilon if epsilon is not None and math.isfinite(epsilon) else None
    if claim_eps is None and noise_multiplier is None and noise != "none":
        raise ConfigError(
            bad_value("epsilon", epsilon, "give the claimed ε (or a noise multiplier) of the audited runs")
        )
    gp0 = GradientPerturbation(
        epsilon=claim_eps,
        noise_multiplier=None if claim_eps is not None else (noise_multiplier or 1.0),
        delta=delta,
        tau_x=tau_x,
        accountant=accountant,
        **_noise_options(None),
    )
    gp0.calibrate(
        [len(X) for X in sites],
        gamma=gamma,
        n_landmarks=n_landmarks,
        rounds=rounds,
        local_steps=local_steps,
        rule="gradient",
    )
    if claimed_epsilon is None:
        claimed_epsilon = (
            claim_eps
            if claim_eps is not None
            else (float(gp0.plan_epsilon[canary_site]) if noise_multiplier is not None else math.inf)
        )
    return gp0, float(gp0.z), float(gp0.sens[canary_site].value), claimed_epsilon


def _score_releases(rel, X_out, X_in, sens: float, sigma_run: float):
    """The attackers' statistics over one run's releases of the canary site: Σ⟨o − m₀, d⟩ (the release), the same
    with the noise regenerated from a public seed and subtracted (the seed-knowing adversary), Σ‖d‖², the largest
    ‖d‖/Δ attained and the run's σ; d = ∇f(X_in) − ∇f(X_out) at each release's Y."""
    from ..accounting.noise import seed_entropy, seeded_standard_normal
    from ..landmarks.feddl import mmd_grad

    num = num_seed = den = att_max = 0.0
    for e in rel:
        Y, o = e["Y"], e["o"]
        m0 = mmd_grad(X_out, Y, e["gamma"])
        d = mmd_grad(X_in, Y, e["gamma"]) - m0
        dd = float(np.vdot(d, d))
        num += float(np.vdot(o - m0, d))
        den += dd
        att_max = max(att_max, math.sqrt(dd) / sens)
        # the seed-knowing adversary: regenerate the noise from the public seed and subtract it
        ev = e["event"]
        if ev is not None:
            plan = json.loads(e["plan"])
            ent = seed_entropy(int(plan["noise_seed"]) if plan.get("noise_seed") is not None else e["seed"])
            key = (int(ev["site"]), int(ev["round"]), int(ev["step"]), int(ev["attempt"]))
            sigma_run = float(ev["sigma"])
            o = o - sigma_run * seeded_standard_normal(ent, key, o.shape)
        num_seed += float(np.vdot(o - m0, d))
    return num, num_seed, den, att_max, sigma_run


def _canary_worlds(
    sites,
    canary_site: int,
    kind,
    gp0,
    gamma: float,
    tau_x: float,
    n_landmarks: int,
    run_seed: int,
    rng: np.random.Generator,
):
    """The canary, chosen at the public initial landmarks (the coordinator draws them from the run seed), and the two
    neighbouring datasets; returns (canary, partner, replaced record, X_out, X_in, worlds) (:func:`_neighbours`)."""
    from ..landmarks.feddl import init_landmarks

    Y0 = gp0.project(
        init_landmarks(n_landmarks, sites[0].shape[1], radius=float(tau_x), rng=np.random.default_rng(run_seed))
    )
    c, cp, r, _ = choose_canary(sites[canary_site], Y0, gamma, tau_x, kind, random_state=rng.integers(2**31))
    return (c, cp, r, *_neighbours(sites, canary_site, r, c, cp))


def _play_trials(
    worlds, canary_site: int, noise: str, noise_seeds, gp_kw: dict, run_kw: dict, X_out, X_in, sens: float, c, project
) -> dict:
    """Every trial's two runs (canary in, then out; a fresh mechanism from ``gp_kw`` each, seeded from
    ``noise_seeds[trial, world]`` when the noise is seeded), scored; returns the measured fields of
    :class:`CanaryTrials` (the read-only scores, σ of the runs, μ, the attained sensitivity, the time taken)."""
    from ..accounting import GradientPerturbation

    trials = len(noise_seeds)
    scores = {s: np.zeros((2, trials)) for s in STATISTICS}
    mus, attained, att_max = [], [], 0.0
    reference = None
    sigma_run = 0.0
    t0 = time.perf_counter()
    for i in range(trials):
        for b in (1, 0):
            if noise == "none":
                gp = None
            else:
                gp = GradientPerturbation(
                    **gp_kw, **_noise_options(None if noise == "secret" else int(noise_seeds[i, b]))
                )
            Y_final, rel = _run(worlds[b], canary_site, **run_kw, gp=gp)
            num, num_seed, den, att, sigma_run = _score_releases(rel, X_out, X_in, sens, sigma_run)
            att_max = max(att_max, att)
            if den <= 0:
                raise ConfigError(
                    bad_value("canary", c.tolist(), "does not change the site's gradient at all; choose another canary")
                )
            scores["release"][b, i] = num / den
            scores["seeded"][b, i] = num_seed / den
            mus.append(math.inf if noise == "none" else math.sqrt(den) / sigma_run)
            attained.append(den / (len(rel) * sens * sens))
            if reference is None:  # the noiseless trajectories of both worlds from the run's own Y0
                Y0_run = rel[0]["Y"]
                steps = run_kw["rounds"] * run_kw["local_steps"]
                reference = [_noiseless(w, Y0_run, run_kw["gamma"], run_kw["lr"], steps, project) for w in worlds]
                ref_d = reference[1] - reference[0]
                ref_dd = float(np.vdot(ref_d, ref_d))
            scores["landmarks"][b, i] = float(np.vdot(Y_final - reference[0], ref_d)) / ref_dd if ref_dd > 0 else 0.0
    seconds = time.perf_counter() - t0
    frozen = {k: (v[1].copy(), v[0].copy()) for k, v in scores.items()}
    for a, bb in frozen.values():
        a.flags.writeable = False
        bb.flags.writeable = False
    return dict(
        scores=frozen,
        sigma=sigma_run,
        canary_mu=float(np.mean(mus)),
        sensitivity_attained=float(math.sqrt(np.mean(attained))),
        sensitivity_max=float(att_max),
        seconds=seconds,
    )


def _run_config(sites, run_kw: dict, tau_x: float, accountant: str, z: float) -> dict:
    """The public configuration of the audited runs (``CanaryTrials.config``), from the arguments of :func:`_run`."""
    return {
        "sizes": [len(X) for X in sites],
        "n_features": int(sites[0].shape[1]),
        "n_landmarks": run_kw["n_landmarks"],
        "rounds": run_kw["rounds"],
        "local_steps": run_kw["local_steps"],
        "gamma": run_kw["gamma"],
        "lr": run_kw["lr"],
        "tau_x": float(tau_x),
        "accountant": accountant,
        "claimed_noise_multiplier": z,
        "run_seed": run_kw["seed"],
    }


def run_canary_trials(
    sites,
    *,
    epsilon: float | None = 1.0,
    delta: float = 1e-5,
    tau_x: float,
    noise_multiplier: float | None = None,
    accountant: str = "exact",
    noise: str = "secret",
    sigma_scale: float = 1.0,
    trials: int = 200,
    n_landmarks: int = 4,
    rounds: int = 3,
    local_steps: int = 1,
    gamma: float | None = None,
    lr="auto",
    canary="kernel_shape",
    canary_site: int = 0,
    claimed_epsilon: float | None = None,
    random_state=0,
) -> CanaryTrials:
    """Run ``trials`` pairs of DP FedDL (canary in / canary out, fresh noise each run) and score every statistic.

    Parameters
    ----------
    sites : list of ndarray
        The sites' records (kept small: each trial is two full runs).
    epsilon, delta, noise_multiplier, accountant, tau_x
        The DP claim, as given to :class:`~securefed.accounting.GradientPerturbation` (``epsilon=math.inf`` with
        ``noise="none"``: no claim).
    noise : {"secret", "seeded", "none"}
        CSPRNG noise; noise seeded from a fresh **public** seed per run (the plan sends it to the sites); or no
        DP at all (a run that claims ε but adds nothing).
    sigma_scale : float
        Factor on the calibrated σ (``0.01``: the deliberately leaky "σ/100" run). The claim stays ``epsilon``.
    claimed_epsilon : float, optional
        The ε the verdict compares against (default: ``epsilon``, or the plan's ε for a given noise multiplier).
    gamma, lr
        Public γ (default ``1/τ_X²``, as a DP run picks) and step (``"auto"``: :func:`default_lr`).
    canary, canary_site
        :func:`choose_canary` ``kind`` and the site that holds the canary.
    random_state : int
        Seeds the run seed (public initial landmarks), the canary search and the public noise seeds.
    """
    from ..landmarks.feddl import default_lr

    sites = _checked_sites(
        sites, noise=noise, trials=trials, sigma_scale=sigma_scale, canary_site=canary_site, tau_x=tau_x
    )
    gamma = float(gamma) if gamma is not None else 1.0 / float(tau_x) ** 2
    lr = default_lr(n_landmarks, gamma) if lr == "auto" else float(lr)
    rng = np.random.default_rng(random_state)
    run_seed = int(rng.integers(0, 2**31 - 1))
    R = rounds * local_steps

    gp0, z, sens, claimed_epsilon = _claim(
        sites,
        canary_site,
        epsilon=epsilon,
        noise_multiplier=noise_multiplier,
        noise=noise,
        delta=delta,
        tau_x=tau_x,
        accountant=accountant,
        gamma=gamma,
        n_landmarks=n_landmarks,
        rounds=rounds,
        local_steps=local_steps,
        claimed_epsilon=claimed_epsilon,
    )

    c, cp, r, X_out, X_in, worlds = _canary_worlds(
        sites, canary_site, canary, gp0, gamma, tau_x, n_landmarks, run_seed, rng
    )
    noise_seeds = rng.integers(0, 2**31 - 1, size=(trials, 2))
    gp_kw = dict(noise_multiplier=z * sigma_scale, delta=delta, tau_x=tau_x, accountant=accountant)
    run_kw = dict(n_landmarks=n_landmarks, rounds=rounds, local_steps=local_steps, gamma=gamma, lr=lr, seed=run_seed)
    played = _play_trials(worlds, canary_site, noise, noise_seeds, gp_kw, run_kw, X_out, X_in, sens, c, gp0.project)
    return CanaryTrials(
        **played,
        claimed_epsilon=float(claimed_epsilon),
        delta=float(delta),
        noise=noise,
        sigma_scale=float(sigma_scale if noise != "none" else 0.0),
        noise_multiplier=z * sigma_scale if noise != "none" else 0.0,
        sensitivity=sens,
        releases=R,
        canary=tuple(float(v) for v in c),
        partner=tuple(float(v) for v in cp),
        replaced=r,
        canary_site=int(canary_site),
        config=_run_config(sites, run_kw, tau_x, accountant, z),
    )


def canary_audit(
    sites,
    *,
    statistic: str = "release",
    confidence: float = 0.95,
    threshold="select",
    selection: float = 0.5,
    **run_options,
) -> CanaryAuditResult:
    """Canary audit in one call: :func:`run_canary_trials` (``run_options``) then :meth:`CanaryTrials.audit`.

    Example: ``canary_audit(sites, epsilon=1.0, tau_x=3.0, sigma_scale=0.01, trials=200)`` flags a run whose σ is
    100× too small (bound ≈ 3.3 > 1 on 100 test pairs), while ``sigma_scale=1`` stays under ε = 1.
    """
    return run_canary_trials(sites, **run_options).audit(
        statistic, confidence=confidence, threshold=threshold, selection=selection
    )


def distinguishing_game(
    sites, *, noise: str = "seeded", confidence: float = 0.95, threshold=0.5, **run_options
) -> CanaryAuditResult:
    """Issue 14 item 1: the adversary who knows the noise seed regenerates the noise, subtracts it and decides
    "canary in" when the residual is nearer the canary world (``T ≥ ½``, the a-priori threshold: every pair
    tests). Seeded noise → perfect distinguishing, the bound is :func:`~.stats.perfect_test_epsilon` of the pairs
    (50 pairs at 95 %: 2.57 against a claim of 1); secret noise → no better than the canary test."""
    return run_canary_trials(sites, noise=noise, **run_options).audit(
        "seeded", confidence=confidence, threshold=threshold
    )
