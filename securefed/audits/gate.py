"""The audit gate: after the landmarks and **before** any Nyström row leaves a site, check a policy.

Checks (issue 5, docs/architecture.md):

1. ``auc ≤ max_auc`` — the best membership attack does little better than a coin;
2. ``empirical_epsilon ≤ max_empirical_epsilon`` — a *proven* (95 %) lower bound on the privacy loss stays small;
3. ``empirical_epsilon ≤ claimed_epsilon`` (when ``require_within_claimed`` and a DP claim exists) — an empirical
   lower bound above the accountant's ε means the claim is wrong (a bug, a broken assumption such as unclipped
   records, or a mis-calibrated σ).

Failing raises :class:`~securefed.errors.AuditFailedError` (nothing more leaves the sites) unless the operator passed
``--allow-audit-failure``; the override is then recorded (ledger event and report).
"""

from __future__ import annotations

import datetime as _dt
import math
from dataclasses import asdict, dataclass, field

from ..errors import AuditFailedError, ConfigError, bad_value

__all__ = ["AuditPolicy", "GateDecision", "audit_gate", "OVERRIDE_FLAG"]

OVERRIDE_FLAG = "--allow-audit-failure"


@dataclass(frozen=True)
class AuditPolicy:
    """Limits the landmarks must meet before the Nyström stage.

    Attributes
    ----------
    max_auc : float
        Default 0.6. An AUC of 0.5 is chance; 0.6 is a common "weak attack" line in output checking (SACRO-ML and
        ML Privacy Meter reports flag attacks well above chance). With few records the AUC is noisy (its standard
        error is reported): a few hundred held-out records per run keep false alarms rare.
    max_empirical_epsilon : float
        Default 1.0. The empirical ε is a 95 % *lower* bound, so exceeding 1 means the landmarks demonstrably leak
        membership at a level no DP claim weaker than ε = 1 would permit.
    require_within_claimed : bool
        Default True: when the run claims (ε, δ)-DP, its empirical ε must not exceed the claimed ε.
    """

    max_auc: float = 0.6
    max_empirical_epsilon: float = 1.0
    require_within_claimed: bool = True

    def __post_init__(self):
        if not (0.5 <= float(self.max_auc) <= 1.0):
            raise ConfigError(bad_value("max_auc", self.max_auc, "use a value in [0.5, 1], e.g. 0.6"))
        if not (float(self.max_empirical_epsilon) >= 0) or math.isnan(float(self.max_empirical_epsilon)):
            raise ConfigError(
                bad_value("max_empirical_epsilon", self.max_empirical_epsilon, "use a non-negative number, e.g. 1.0")
            )


@dataclass
class GateDecision:
    """Outcome of :func:`audit_gate`.

    ``passed`` is the policy verdict; ``proceed`` says whether the pipeline may continue (``passed`` or overridden).
    ``ledger_event`` is the override note written to the ledger (or to be written by the caller when
    ``ledger_recorded`` is False).
    """

    passed: bool
    proceed: bool
    overridden: bool
    failures: list
    checks: list
    policy: dict
    auc: float
    empirical_epsilon: float
    claimed_epsilon: float | None
    ledger_event: dict | None = None
    ledger_recorded: bool = False
    time: str = field(default_factory=lambda: _dt.datetime.now(_dt.timezone.utc).isoformat())

    @property
    def verdict(self) -> str:
        return "pass" if self.passed else ("fail (overridden)" if self.overridden else "fail")

    def to_dict(self) -> dict:
        """JSON-ready dict (the ``"audit"`` block of metrics.json)."""
        d = asdict(self)
        d["verdict"] = self.verdict
        return d


def _record_in_ledger(ledger, event: dict) -> bool:
    """Write ``event`` through whichever note method the ledger offers; True when written."""
    for name in ("record_note", "record_override", "record_event", "note", "append"):
        fn = getattr(ledger, name, None)
        if callable(fn):
            try:
                fn(event)
            except TypeError:
                fn(**event)
            return True
    return False


def _gate_checks(auc: float, eps: float, policy: AuditPolicy, claimed_epsilon: float | None) -> list[dict]:
    """The gate's checks of an audit's AUC and empirical ε against ``policy`` (and the claimed ε, when the policy
    requires it and there is one), each with its value, limit, verdict and sentence."""
    checks: list[dict] = [
        {
            "check": "auc",
            "value": auc,
            "limit": float(policy.max_auc),
            "ok": auc <= policy.max_auc,
            "text": f"membership AUC {auc:.3f} <= max_auc {policy.max_auc:.3f}",
        },
        {
            "check": "empirical_epsilon",
            "value": eps,
            "limit": float(policy.max_empirical_epsilon),
            "ok": eps <= policy.max_empirical_epsilon,
            "text": f"empirical epsilon lower bound {eps:.3f} <= max_empirical_epsilon "
            f"{policy.max_empirical_epsilon:.3f}",
        },
    ]
    if policy.require_within_claimed and claimed_epsilon is not None:
        checks.append(
            {
                "check": "within_claimed",
                "value": eps,
                "limit": claimed_epsilon,
                "ok": eps <= claimed_epsilon,
                "text": f"empirical epsilon lower bound {eps:.3f} <= accountant's epsilon {claimed_epsilon:.3f} "
                "(a higher empirical bound means the DP claim is wrong)",
            }
        )
    return checks


def audit_gate(
    result,
    policy: AuditPolicy | None = None,
    claimed_epsilon: float | None = None,
    allow_failure: bool = False,
    ledger=None,
) -> GateDecision:
    """Check an MIA result against ``policy``; raise :class:`AuditFailedError` on failure unless overridden.

    Parameters
    ----------
    result : MIAResult or dict
        Output of :func:`~securefed.audits.membership_audit` (or its ``to_dict()``).
    policy : AuditPolicy, optional
        Default ``AuditPolicy()``.
    claimed_epsilon : float, optional
        The accountant's ε for the landmarks (None for a run without DP).
    allow_failure : bool
        The ``--allow-audit-failure`` override: return a failing decision instead of raising, and record it.
    ledger : object, optional
        A privacy ledger; the override is written with its ``record_note`` (or ``record_override`` /
        ``record_event``) method. Without one, ``decision.ledger_event`` holds the event for the caller to record.

    Returns
    -------
    GateDecision
    """
    policy = policy or AuditPolicy()
    d = result.to_dict() if hasattr(result, "to_dict") else dict(result)
    try:
        auc = float(d["auc"])
        eps = float(d["empirical_epsilon"])
    except (KeyError, TypeError, ValueError):
        raise ConfigError(
            bad_value("result", type(result).__name__, "pass the MIAResult returned by membership_audit")
        ) from None
    if claimed_epsilon is not None:
        claimed_epsilon = float(claimed_epsilon)
        if not claimed_epsilon > 0:
            raise ConfigError(
                bad_value(
                    "claimed_epsilon", claimed_epsilon, "pass the accountant's positive epsilon, or None without DP"
                )
            )
    checks = _gate_checks(auc, eps, policy, claimed_epsilon)
    failures = [c["text"].replace("<=", ">") for c in checks if not c["ok"]]
    passed = not failures
    decision = GateDecision(
        passed=passed,
        proceed=passed or bool(allow_failure),
        overridden=(not passed) and bool(allow_failure),
        failures=failures,
        checks=checks,
        policy=asdict(policy),
        auc=auc,
        empirical_epsilon=eps,
        claimed_epsilon=claimed_epsilon,
    )
    if passed:
        return decision
    summary = "; ".join(failures)
    if not allow_failure:
        raise AuditFailedError(
            f"privacy audit failed: {summary}. Nothing more leaves the sites. Reduce leakage (add DP noise, fewer "
            f"landmarks, more records per site) or, knowingly, rerun with {OVERRIDE_FLAG} (recorded in the ledger and report)."
        )
    event = {
        "kind": "audit_override",
        "flag": OVERRIDE_FLAG,
        "failures": failures,
        "auc": auc,
        "empirical_epsilon": eps,
        "claimed_epsilon": claimed_epsilon,
        "policy": asdict(policy),
        "time": decision.time,
    }
    decision.ledger_event = event
    if ledger is not None:
        decision.ledger_recorded = _record_in_ledger(ledger, event)
    return decision
