"""Statistics of a membership-inference audit: ROC from counts, Clopper–Pearson bounds, empirical ε and μ.

Everything here works on **counts** (true/false positives per threshold of a public grid), which is all
that leaves a site in the federated audit (:mod:`securefed.audits.mia`).

References
----------
* Jagielski, Ullman, Oprea, "Auditing Differentially Private Machine Learning: How Private is Private SGD?",
  NeurIPS 2020 — ε lower bound from Clopper–Pearson bounds on FPR/FNR, both directions, δ subtracted.
* Nasr, Hayes, Steinke, Balle, Tramèr, Jagielski, Carlini, Terzis, "Tight Auditing of Differentially Private
  Machine Learning", USENIX Security 2023 — the same bound, and the GDP μ bound from a single (FPR, TPR) point.
* TensorFlow Privacy ``privacy_tests/epsilon_lower_bound.py`` (same two-direction formula).
* Dong, Roth, Su, "Gaussian Differential Privacy", JRSS-B 2022 — trade-off ``T(α) = Φ(Φ⁻¹(1−α) − μ)``.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import stats

from ..errors import ConfigError, bad_value

__all__ = [
    "clopper_pearson",
    "epsilon_lower_bound",
    "gdp_mu_lower_bound",
    "roc_from_counts",
    "auc_from_roc",
    "auc_standard_error",
    "tpr_at_fpr",
    "perfect_test_epsilon",
    "trials_for_epsilon",
    "best_threshold",
]


def clopper_pearson(k, n, confidence: float = 0.95):
    """Two-sided Clopper–Pearson (exact binomial) interval for a proportion ``k / n``.

    ``lo = Beta⁻¹(α/2; k, n−k+1)``, ``hi = Beta⁻¹(1−α/2; k+1, n−k)`` with ``α = 1 − confidence``
    (``lo = 0`` when ``k = 0``, ``hi = 1`` when ``k = n``). Vectorised over ``k`` (and ``n``).
    Each one-sided end holds with probability ≥ 1 − α/2, so a lower bound on one proportion and an upper bound on
    another hold *together* with probability ≥ ``confidence`` (union bound) — the convention of Jagielski et al. 2020.
    """
    if not 0 < confidence < 1:
        raise ConfigError(bad_value("confidence", confidence, "use a level in (0, 1), e.g. 0.95"))
    k = np.asarray(k, dtype=np.float64)
    n = np.broadcast_to(np.asarray(n, dtype=np.float64), k.shape)
    if np.any(n <= 0) or np.any(k < 0) or np.any(k > n):
        raise ConfigError(bad_value("counts", "k outside [0, n] or n <= 0", "pass 0 <= k <= n with n >= 1"))
    a = (1.0 - confidence) / 2.0
    with np.errstate(invalid="ignore", divide="ignore"):
        lo = np.where(k > 0, stats.beta.ppf(a, np.maximum(k, 1e-300), n - k + 1), 0.0)
        hi = np.where(k < n, stats.beta.ppf(1 - a, k + 1, np.maximum(n - k, 1e-300)), 1.0)
    return lo, hi


def epsilon_lower_bound(tp, fp, n_pos, n_neg, delta: float = 0.0, confidence: float = 0.95):
    """Empirical ε lower bound from one attack threshold (Jagielski et al. 2020, Nasr et al. 2023).

    (ε, δ)-DP implies, for the attack's decision set and its complement,
    ``TPR ≤ e^ε FPR + δ`` and ``1 − FPR ≤ e^ε (1 − TPR) + δ``. With Clopper–Pearson bounds
    ``TPR_lo``, ``FPR_hi`` (two-sided ``confidence`` intervals) this gives, with probability ≥ ``confidence``::

        ε ≥ max( log((TPR_lo − δ) / FPR_hi),  log((1 − FPR_hi − δ) / (1 − TPR_lo)) )

    Parameters
    ----------
    tp, fp : int or array
        Members / non-members flagged as members at the threshold.
    n_pos, n_neg : int
        Numbers of members / non-members scored.
    delta : float
        The δ of the claim being tested (0 for a pure-ε statement).

    Returns
    -------
    eps : ndarray
        The bound per threshold (``-inf`` where a direction is vacuous).
    direction : ndarray of int
        0 for the first direction (flagging members), 1 for the complement.
    """
    if not 0 <= delta < 1:
        raise ConfigError(bad_value("delta", delta, "use 0 <= delta < 1"))
    tpr_lo, _ = clopper_pearson(tp, n_pos, confidence)
    _, fpr_hi = clopper_pearson(fp, n_neg, confidence)
    with np.errstate(divide="ignore", invalid="ignore"):
        num1 = tpr_lo - delta
        e1 = np.where(num1 > 0, np.log(np.maximum(num1, 1e-300) / fpr_hi), -np.inf)
        num2 = 1.0 - fpr_hi - delta
        den2 = 1.0 - tpr_lo
        e2 = np.where(num2 > 0, np.log(np.maximum(num2, 1e-300) / den2), -np.inf)
    e1 = np.where(np.isnan(e1), -np.inf, e1)
    e2 = np.where(np.isnan(e2), -np.inf, e2)
    return np.maximum(e1, e2), (e2 > e1).astype(int)


def gdp_mu_lower_bound(tp, fp, n_pos, n_neg, confidence: float = 0.95):
    """GDP μ lower bound from one threshold: ``μ ≥ Φ⁻¹(1 − FPR_hi) − Φ⁻¹(1 − TPR_lo)``.

    μ-GDP means the attack's type-II error is at least ``Φ(Φ⁻¹(1 − FPR) − μ)`` (Dong, Roth & Su 2022, Def. 2.7);
    solving for μ at the Clopper–Pearson corners gives the bound (Nasr et al. 2023). The trade-off function is
    symmetric, so the complement direction gives the same expression.
    """
    tpr_lo, _ = clopper_pearson(tp, n_pos, confidence)
    _, fpr_hi = clopper_pearson(fp, n_neg, confidence)
    with np.errstate(divide="ignore", invalid="ignore"):
        mu = stats.norm.isf(fpr_hi) - stats.norm.isf(tpr_lo)
    return np.where(np.isnan(mu), -np.inf, mu)


def roc_from_counts(tp, fp, n_pos, n_neg):
    """ROC points from per-threshold counts (``score ≥ t``), with the (0, 0) and (1, 1) corners added.

    Returns ``(fpr, tpr)`` sorted by increasing FPR (then TPR).
    """
    tp = np.asarray(tp, dtype=np.float64)
    fp = np.asarray(fp, dtype=np.float64)
    if n_pos <= 0 or n_neg <= 0:
        raise ConfigError(
            bad_value("n_members/n_nonmembers", (n_pos, n_neg), "score at least one member and one non-member")
        )
    fpr = np.concatenate([[0.0], fp / n_neg, [1.0]])
    tpr = np.concatenate([[0.0], tp / n_pos, [1.0]])
    order = np.lexsort((tpr, fpr))
    return fpr[order], tpr[order]


def auc_from_roc(fpr, tpr) -> float:
    """Area under the ROC polyline (trapezoid rule; ties inside a grid cell count half, as Mann–Whitney does)."""
    return float(np.trapezoid(tpr, fpr))


def auc_standard_error(auc: float, n_pos: int, n_neg: int) -> float:
    """Hanley & McNeil (1982) standard error of an AUC estimate from ``n_pos`` positives and ``n_neg`` negatives."""
    a = min(max(auc, 1e-12), 1 - 1e-12)
    q1 = a / (2 - a)
    q2 = 2 * a * a / (1 + a)
    var = (a * (1 - a) + (n_pos - 1) * (q1 - a * a) + (n_neg - 1) * (q2 - a * a)) / (n_pos * n_neg)
    return float(math.sqrt(max(var, 0.0)))


def tpr_at_fpr(fpr, tpr, target: float) -> float:
    """Largest TPR among ROC points with ``FPR ≤ target`` (0 when only the origin qualifies)."""
    ok = np.asarray(fpr) <= target
    return float(np.max(np.asarray(tpr)[ok])) if np.any(ok) else 0.0


def perfect_test_epsilon(n: int, confidence: float = 0.95, delta: float = 0.0) -> float:
    """The largest ε lower bound ``n`` trials per class can show: that of a perfect test (``tp = n``, ``fp = 0``).

    Closed form of :func:`epsilon_lower_bound` at ``k = n`` / ``k = 0``: with ``a = (1 − confidence)/2`` the
    Clopper–Pearson ends are ``TPR_lo = a^{1/n}`` and ``FPR_hi = 1 − a^{1/n}``, so
    ``ε = log((a^{1/n} − δ) / (1 − a^{1/n}))`` (both directions give this). E.g. at 95 %: 50 trials 2.57 (the
    figure of issue 14), 200 trials 3.98, 1000 trials 5.60; at 99.9 %: 50 → 1.81, 200 → 3.25 (``δ = 0``). A claim ``ε`` can be refuted only with ``n`` such that
    this exceeds ``ε`` (:func:`trials_for_epsilon`).
    """
    if not (isinstance(n, (int, np.integer)) and n >= 1):
        raise ConfigError(bad_value("n", n, "use a positive number of trials"))
    if not 0 < confidence < 1:
        raise ConfigError(bad_value("confidence", confidence, "use a level in (0, 1), e.g. 0.95"))
    if not 0 <= delta < 1:
        raise ConfigError(bad_value("delta", delta, "use 0 <= delta < 1"))
    p = ((1.0 - confidence) / 2.0) ** (1.0 / int(n))
    if p - delta <= 0:
        return -math.inf
    return float(math.log((p - delta) / (1.0 - p)))  # both directions give the same expression


def trials_for_epsilon(epsilon: float, confidence: float = 0.95, delta: float = 0.0, max_trials: int = 10**9) -> int:
    """Smallest ``n`` (trials per class) whose perfect test shows an ε lower bound **above** ``epsilon``.

    Fewer trials cannot refute a claim ``epsilon`` whatever the attack: e.g. at 95 % a claim ε = 1 needs 12 trials
    per class, ε = 2 needs 30, ε = 4 needs 204 and ε = 8 needs 10 999 (99.9 %: 25, 60, 419, 22 662; δ = 0): the
    count grows like ``e^ε``.
    """
    if not (epsilon >= 0 and math.isfinite(epsilon)):
        raise ConfigError(bad_value("epsilon", epsilon, "use a finite epsilon >= 0"))
    lo, hi = 1, 1
    while perfect_test_epsilon(hi, confidence, delta) <= epsilon:
        lo, hi = hi + 1, hi * 2
        if hi > max_trials:
            raise ConfigError(bad_value("epsilon", epsilon, f"needs more than {max_trials} trials per class"))
    while lo < hi:
        mid = (lo + hi) // 2
        if perfect_test_epsilon(mid, confidence, delta) > epsilon:
            hi = mid
        else:
            lo = mid + 1
    return int(lo)


def best_threshold(pos, neg, delta: float = 0.0, confidence: float = 0.95):
    """The threshold on a score (``score ≥ t`` ⇒ "positive") whose :func:`epsilon_lower_bound` is largest on the
    given scores — to be chosen on a *selection* split and evaluated on a disjoint test split.

    Candidates are the midpoints between consecutive distinct scores. Returns ``(threshold, eps)``; ``(None,
    -inf)`` when no candidate gives a finite bound.
    """
    pos = np.sort(np.asarray(pos, dtype=np.float64).ravel())
    neg = np.sort(np.asarray(neg, dtype=np.float64).ravel())
    if len(pos) == 0 or len(neg) == 0:
        raise ConfigError(bad_value("scores", (len(pos), len(neg)), "give at least one score per class"))
    u = np.unique(np.concatenate([pos, neg]))
    if len(u) < 2:
        return None, -math.inf
    cand = (u[:-1] + u[1:]) / 2.0
    tp = len(pos) - np.searchsorted(pos, cand, side="left")
    fp = len(neg) - np.searchsorted(neg, cand, side="left")
    eps, _ = epsilon_lower_bound(tp, fp, len(pos), len(neg), delta=delta, confidence=confidence)
    i = int(np.argmax(eps))
    if not np.isfinite(eps[i]):
        return None, -math.inf
    return float(cand[i]), float(eps[i])
