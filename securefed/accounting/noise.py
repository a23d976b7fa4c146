"""Gaussian noise sources: secure (CSPRNG — the default everywhere) and seeded (tests only, ε void).

Secure noise (the default of every mechanism)
    A ChaCha20 keystream (``cryptography``) under a fresh 256-bit key from ``os.urandom`` per draw
    is turned into 53-bit uniforms and then into standard normals by the Box–Muller transform.
    The key is discarded after the draw; nothing about the noise is stored.

Seeded noise (``insecure_noise_seed_for_testing=<int>`` only)
    ``numpy`` PCG64 keyed by a 128-bit ``SeedSequence`` entropy and the release coordinates
    ``(site, round, step, attempt)``. Anyone who knows the seed can recompute the noise and subtract
    it: seeded noise gives **no** privacy against the holder of the seed, so every report of a
    mechanism using it says ``"epsilon_void": True`` and its ledger events ``noise_source:
    "seeded-testing"``. It exists for reproducible tests and idempotent crash recovery in tests (a
    redone release with the same seed is bit-identical, so it costs nothing extra — see the ledger).
    A run's own seed never seeds DP noise.

Floating-point caveat (stated honestly)
    Both sources produce IEEE-754 doubles. Mironov (CCS 2012) showed that textbook floating-point
    Laplace sampling leaks through the irregular set of representable outputs (some outputs are
    possible only for some inputs), and Jin et al. (IEEE S&P 2022) extended such attacks to
    floating-point Gaussian samplers. securefed's Box–Muller sampler is subject to the same class of
    attack in principle: the (ε, δ) figures are exact for *real-valued* Gaussian noise, not for its
    double-precision rendering. The remedy — a discrete Gaussian on a fixed grid (Canonne–Kamath–Steinke
    2020) combined with integer secure aggregation — is :mod:`securefed.accounting.distributed`
    (with the exact sampler in :mod:`securefed.accounting.samplers`); this module's float noise remains
    for local noise. Mitigation in practice: the released quantity is further post-processed
    (averaged, projected), but that is not a proof.
"""

from __future__ import annotations

import hashlib
import os
import typing

import numpy as np

__all__ = ["secure_standard_normal", "secure_uniform", "seeded_standard_normal", "seed_entropy", "seed_tag"]

_TWO_PI = 2.0 * np.pi


def secure_standard_normal(shape, *, _key: bytes | None = None, _nonce: bytes | None = None) -> np.ndarray:
    """Standard normal samples from a ChaCha20 keystream keyed by ``os.urandom(32)`` (Box–Muller).

    ``u1 = (k + 1)·2⁻⁵³ ∈ (0, 1]`` and ``u2 = k'·2⁻⁵³ ∈ [0, 1)`` from two 53-bit integers ``k, k'``;
    ``z = √(−2 ln u1) · (cos 2πu2, sin 2πu2)``. (``_key``/``_nonce`` exist only for the known-answer test.)
    """
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms

    shape = tuple(int(s) for s in np.atleast_1d(shape)) if not isinstance(shape, tuple) else shape
    n = int(np.prod(shape)) if shape else 1
    pairs = (n + 1) // 2
    key = os.urandom(32) if _key is None else _key
    nonce = os.urandom(16) if _nonce is None else _nonce
    enc = Cipher(algorithms.ChaCha20(key, nonce), mode=None).encryptor()
    raw = enc.update(b"\x00" * (16 * pairs)) + enc.finalize()
    words = np.frombuffer(raw, dtype="<u8").reshape(pairs, 2) >> np.uint64(11)
    u1 = (words[:, 0].astype(np.float64) + 1.0) * 2.0**-53
    u2 = words[:, 1].astype(np.float64) * 2.0**-53
    r = np.sqrt(-2.0 * np.log(u1))
    z = np.empty(2 * pairs)
    z[0::2] = r * np.cos(_TWO_PI * u2)
    z[1::2] = r * np.sin(_TWO_PI * u2)
    return z[:n].reshape(shape)


def secure_uniform(n: int) -> np.ndarray:
    """``n`` uniforms ``k·2⁻⁵³ ∈ [0, 1)`` from 53-bit integers read from ``os.urandom`` — for the random choices the
    accounting assumes hidden (the Poisson sample of a subsampled step), as secret as the noise."""
    n = int(n)
    words = np.frombuffer(os.urandom(8 * n), dtype="<u8") >> np.uint64(11)
    return words.astype(np.float64) * 2.0**-53


def seed_entropy(random_state) -> int:
    """A 128-bit entropy for seeded noise from ``None | int | Generator`` (scikit-learn style).

    ``None`` draws fresh OS entropy; an ``int`` is used as the ``SeedSequence`` seed; a ``Generator``
    contributes two 64-bit draws (deterministic given its state).
    """
    if random_state is None:
        return int(typing.cast(int, np.random.SeedSequence().entropy))
    if isinstance(random_state, np.random.Generator):
        a, b = (int(v) for v in random_state.integers(0, 2**63, size=2))
        return (a << 64) | b
    if isinstance(random_state, (int, np.integer)) and not isinstance(random_state, bool) and random_state >= 0:
        return int(random_state)
    from ..errors import ConfigError, bad_value

    raise ConfigError(bad_value("random_state", random_state, "use None, a non-negative int or a numpy Generator"))


def seed_tag(entropy: int) -> str:
    """Short public fingerprint of a seed (to tell same-seed redos from fresh noise in the ledger)."""
    return hashlib.sha256(f"securefed-dp-seed:{entropy}".encode()).hexdigest()[:16]


def seeded_standard_normal(entropy: int, key: tuple[int, ...], shape) -> np.ndarray:
    """Standard normals from PCG64 seeded by ``SeedSequence(entropy, spawn_key=key)`` (reproducible)."""
    ss = np.random.SeedSequence(entropy, spawn_key=tuple(int(k) for k in key))
    return np.random.Generator(np.random.PCG64(ss)).standard_normal(shape)
