"""The audit gate blocks leaky landmarks, names the failed check and the override, records overrides."""

import numpy as np
import pytest

from securefed.audits.gate import AuditPolicy, audit_gate
from securefed.audits.mia import membership_audit
from securefed.errors import AuditFailedError, ConfigError


class _ListLedger:
    """Minimal object with the ``record_note`` method the gate looks for (used when no PrivacyLedger is available)."""

    def __init__(self):
        self.notes = []

    def record_note(self, event):
        self.notes.append(event)


def _leaky_result():
    rng = np.random.default_rng(0)
    members = [rng.normal(size=(50, 6)) for _ in range(3)]
    nonmembers = [rng.normal(size=(50, 6)) for _ in range(3)]
    return membership_audit(members, nonmembers, np.vstack(members), 0.2, scores=("nearest",), random_state=0)


def test_gate_blocks_leaky_landmarks_with_actionable_message():
    res = _leaky_result()
    with pytest.raises(AuditFailedError) as exc:
        audit_gate(res, AuditPolicy())
    msg = str(exc.value)
    assert "--allow-audit-failure" in msg and "max_auc" in msg and "max_empirical_epsilon" in msg
    assert f"{res.auc:.3f}" in msg and f"{res.empirical_epsilon:.3f}" in msg


def test_gate_override_is_recorded():
    res = _leaky_result()
    ledger = _ListLedger()
    dec = audit_gate(res, AuditPolicy(), allow_failure=True, ledger=ledger)
    assert not dec.passed and dec.proceed and dec.overridden and dec.verdict == "fail (overridden)"
    assert dec.ledger_recorded and ledger.notes[0]["kind"] == "audit_override"
    assert ledger.notes[0]["flag"] == "--allow-audit-failure" and ledger.notes[0]["auc"] == res.auc
    dec2 = audit_gate(res, AuditPolicy(), allow_failure=True)
    assert dec2.ledger_event is not None and not dec2.ledger_recorded  # the caller records it
    assert dec2.to_dict()["verdict"] == "fail (overridden)"


def test_within_claimed_check():
    res = {"auc": 0.55, "empirical_epsilon": 0.8}
    assert audit_gate(res, AuditPolicy(), claimed_epsilon=2.0).passed
    with pytest.raises(AuditFailedError, match="accountant's epsilon 0.500"):
        audit_gate(res, AuditPolicy(), claimed_epsilon=0.5)
    assert audit_gate(res, AuditPolicy(require_within_claimed=False), claimed_epsilon=0.5).passed
    with pytest.raises(AuditFailedError, match="max_auc"):
        audit_gate({"auc": 0.61, "empirical_epsilon": 0.0}, AuditPolicy())
    dec = audit_gate({"auc": 0.6, "empirical_epsilon": 1.0}, AuditPolicy())
    assert dec.passed and dec.verdict == "pass" and len(dec.checks) == 2


def test_policy_validation():
    with pytest.raises(ConfigError, match="max_auc"):
        AuditPolicy(max_auc=0.3)
    with pytest.raises(ConfigError, match="max_empirical_epsilon"):
        AuditPolicy(max_empirical_epsilon=-1)
    with pytest.raises(ConfigError, match="claimed_epsilon"):
        audit_gate({"auc": 0.5, "empirical_epsilon": 0.0}, claimed_epsilon=0)
