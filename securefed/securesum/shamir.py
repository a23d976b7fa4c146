"""Shamir secret sharing over a prime field (Shamir 1979), used for SecAgg+'s dropout recovery.

A secret ``s ∈ F_p`` is shared t-of-k by drawing a random polynomial
``f(x) = s + a_1 x + … + a_{t-1} x^{t-1}`` over ``F_p`` (coefficients from the ``secrets`` module)
and handing party ``j`` the point ``(x_j, f(x_j))`` with ``x_j ≠ 0``. Any t points determine ``f`` and
``s = f(0)`` by Lagrange interpolation; any t−1 points are uniformly distributed and independent of
``s`` (perfect secrecy). The default field is ``p = 2^256 + 297``, the smallest prime above ``2^256``,
so a 256-bit seed or an X25519 private scalar is shared without loss.
"""

from __future__ import annotations

import functools
import secrets
from typing import Iterable, Sequence

from ..errors import ConfigError, ProtocolAbortedError, bad_value

__all__ = [
    "PRIME",
    "SHARE_BYTES",
    "share",
    "share_with_coefficients",
    "reconstruct",
    "lagrange_at_zero",
    "secret_to_int",
    "int_to_secret",
]

PRIME = 2**256 + 297
SHARE_BYTES = 33


def share_with_coefficients(
    secret: int, coefficients: Sequence[int], xs: Sequence[int], prime: int = PRIME
) -> list[int]:
    """Evaluate ``f(x) = secret + Σ_i coefficients[i] x^{i+1}`` at each ``x`` (Horner's rule, mod ``prime``).

    Shamir 1979, Eq. (1). Deterministic core of :func:`share`, exposed so tests can enumerate every
    polynomial of a small field.
    """
    coeffs = [secret % prime, *[c % prime for c in coefficients]]
    out = []
    for x in xs:
        if x % prime == 0:
            raise ConfigError(bad_value("x", x, "share abscissae must be non-zero mod p"))
        acc = 0
        for c in reversed(coeffs):
            acc = (acc * x + c) % prime
        out.append(acc)
    return out


def share(secret: int, xs: Sequence[int], threshold: int, prime: int = PRIME) -> list[int]:
    """Split ``secret`` into ``len(xs)`` shares, any ``threshold`` of which reconstruct it (Shamir 1979)."""
    if not 1 <= threshold <= len(xs):
        raise ConfigError(bad_value("threshold", threshold, f"use 1 <= threshold <= number of shares ({len(xs)})"))
    if len(set(x % prime for x in xs)) != len(xs):
        raise ConfigError(bad_value("xs", list(xs), "share abscissae must be distinct mod p"))
    if not 0 <= secret < prime:
        raise ConfigError(bad_value("secret", secret, "the secret must lie in [0, p)"))
    coeffs = [secrets.randbelow(prime) for _ in range(threshold - 1)]
    return share_with_coefficients(secret, coeffs, xs, prime)


def lagrange_at_zero(xs: Sequence[int], prime: int = PRIME) -> list[int]:
    """Lagrange basis values ``λ_j = Π_{m≠j} x_m / (x_m − x_j)`` at 0, so ``f(0) = Σ_j λ_j f(x_j)``.

    Cached per abscissa set: a SecAgg+ server reconstructs many secrets from the same revealers."""
    return list(_lagrange(tuple(int(x) for x in xs), int(prime)))


@functools.lru_cache(maxsize=256)
def _lagrange(xs: tuple, prime: int) -> tuple:
    lams = []
    for j, xj in enumerate(xs):
        num, den = 1, 1
        for m, xm in enumerate(xs):
            if m != j:
                num = num * xm % prime
                den = den * (xm - xj) % prime
        lams.append(num * pow(den, -1, prime) % prime)
    return tuple(lams)


def reconstruct(points: Iterable[tuple[int, int]], threshold: int, prime: int = PRIME) -> int:
    """Recover ``f(0)`` from at least ``threshold`` points ``(x, y)`` (the first ``threshold`` are used).

    Raises :class:`ProtocolAbortedError` when fewer than ``threshold`` points are given.
    """
    pts = list(points)
    if len(pts) < threshold:
        raise ProtocolAbortedError(f"only {len(pts)} shares for a {threshold}-of-k secret; it cannot be recovered")
    pts = pts[:threshold]
    xs = [x for x, _ in pts]
    if len(set(xs)) != len(xs):
        raise ProtocolAbortedError("duplicate share abscissae; reconstruction refused")
    lams = lagrange_at_zero(xs, prime)
    return sum(lam * y for lam, (_, y) in zip(lams, pts)) % prime


def secret_to_int(raw: bytes) -> int:
    """Big-endian integer of a 32-byte secret (always < 2^256 < p)."""
    return int.from_bytes(raw, "big")


def int_to_secret(value: int, strict: bool = True) -> bytes | None:
    """Inverse of :func:`secret_to_int`; a value that is not a 256-bit secret (inconsistent shares) raises
    ProtocolAbortedError, or returns None with ``strict=False``."""
    if not 0 <= value < 2**256:
        if not strict:
            return None
        raise ProtocolAbortedError("a reconstructed secret is out of range: shares are inconsistent")
    return value.to_bytes(32, "big")
