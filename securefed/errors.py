"""One exception hierarchy for securefed.

Every error securefed raises on purpose derives from :class:`SecureFedError`, and every message
names the parameter, the bad value and the fix, so the CLI can print it on one line.

Use :func:`bad_value` to build a message in the house style::

    raise ConfigError(bad_value("n_landmarks", 1, "use at least 2 landmarks"))
"""

from __future__ import annotations

__all__ = [
    "SecureFedError",
    "ConfigError",
    "DataError",
    "OverflowRiskError",
    "ProtocolError",
    "DecodeError",
    "AuthenticationError",
    "ProtocolAbortedError",
    "ProtocolTimeoutError",
    "BudgetExceededError",
    "AuditFailedError",
    "LedgerError",
    "bad_value",
]


def bad_value(parameter: str, value: object, fix: str) -> str:
    """Format ``parameter=value is invalid: fix`` — the one message style securefed uses."""
    shown = repr(value)
    if len(shown) > 120:
        shown = shown[:117] + "..."
    return f"{parameter}={shown} is invalid: {fix}"


class SecureFedError(Exception):
    """Base class of every error securefed raises deliberately."""


class ConfigError(SecureFedError, ValueError):
    """A parameter has a value securefed cannot use (names the parameter, the value and the fix)."""


class DataError(ConfigError):
    """Input data are unusable: NaN/inf, mismatched feature counts, too few records, missing columns."""


class OverflowRiskError(ConfigError):
    """A fixed-point / modular configuration could overflow for the number of active clients."""


class ProtocolError(SecureFedError):
    """A secure-aggregation protocol rule was violated; the state machine is aborted."""


class DecodeError(ProtocolError):
    """A message failed strict decoding (version, length, trailing bytes, session or round)."""


class AuthenticationError(ProtocolError):
    """A signature or an authenticated ciphertext did not verify (tampering, forgery, key swap)."""


class ProtocolAbortedError(ProtocolError):
    """A round cannot complete (too few live neighbours, too many dropouts); nothing is revealed."""


class ProtocolTimeoutError(ProtocolAbortedError):
    """A stage did not receive enough messages before its deadline."""


class BudgetExceededError(SecureFedError):
    """A noisy release would exceed the privacy budget; it is refused before anything is sent."""


class AuditFailedError(SecureFedError):
    """A privacy audit failed its policy; the next stage does not run unless explicitly overridden."""


class LedgerError(SecureFedError):
    """The privacy ledger is missing, corrupt or belongs to another run."""
