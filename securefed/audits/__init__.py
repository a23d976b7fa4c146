"""Audits: membership inference on the landmarks, the audit gate, reconstruction risk.

The pipeline calls these as pure functions on arrays:

* :func:`membership_audit` → :class:`MIAResult` (federated: only ROC counts leave a site);
* :func:`audit_gate` with an :class:`AuditPolicy` → :class:`GateDecision` or :class:`~securefed.errors.AuditFailedError`;
* ``reconstruct_from_*`` + :func:`reconstruction_risk` / :func:`reconstruction_record` (play the server);
* :func:`canary_audit` / :func:`run_canary_trials` → :class:`CanaryAuditResult` (inserted canaries, likelihood-ratio
  test on the releases, empirical ε lower bound) and :func:`distinguishing_game` (the seed-knowing attacker).
"""

from .canary import CanaryAuditResult, CanaryTrials, canary_audit, choose_canary, distinguishing_game, run_canary_trials
from .gate import OVERRIDE_FLAG, AuditPolicy, GateDecision, audit_gate
from .mia import SCORES, MIAResult, ShadowConfig, membership_audit, mia_from_counts
from .reconstruction import (
    reconstruct_from_coordinates,
    reconstruct_from_distance_rows,
    reconstruct_from_kernel_rows,
    reconstruction_record,
    reconstruction_risk,
)
from .stats import clopper_pearson, epsilon_lower_bound, gdp_mu_lower_bound, perfect_test_epsilon, trials_for_epsilon

__all__ = [
    "SCORES",
    "MIAResult",
    "ShadowConfig",
    "membership_audit",
    "mia_from_counts",
    "AuditPolicy",
    "GateDecision",
    "audit_gate",
    "OVERRIDE_FLAG",
    "reconstruct_from_distance_rows",
    "reconstruct_from_kernel_rows",
    "reconstruct_from_coordinates",
    "reconstruction_risk",
    "reconstruction_record",
    "clopper_pearson",
    "epsilon_lower_bound",
    "gdp_mu_lower_bound",
    "perfect_test_epsilon",
    "trials_for_epsilon",
    "CanaryAuditResult",
    "CanaryTrials",
    "canary_audit",
    "choose_canary",
    "distinguishing_game",
    "run_canary_trials",
]
