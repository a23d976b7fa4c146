"""CKKS parameters, decryption hygiene and the public round spec (no TenSEAL import here).

Decryption hygiene (docs/threat-model-secure-sum.md). Releasing raw CKKS decryptions leaks the
secret key (Li & Micciancio, EUROCRYPT 2021), so a decryptor releases ``Y = round_step(decode(m + e) + η)``,
η ~ N(0, σ²) per slot from a CSPRNG, then unbiased randomised rounding to the stated step. Every party checks
the parameters before it uses them (:func:`check_ckks_params`, also run by :class:`CKKSRoundSpec`) and refuses,
with the reason:

1. a step below the CKKS error: ``step ≥ 64 · e_max`` where ``e_max = 2^(14 + ⌈½ log2 n⌉ − s)`` is the error
   model of a sum of n fresh ciphertexts at scale 2^s (fresh error ≈ 2^14 scaled units, growing as √n);
2. a step finer than float64 can carry at the largest sum: ``step ≥ 2^(⌈log2 M⌉ − 51)`` (two ulps of M);
3. a data modulus too small for M plus the flood, and anything outside the 128-bit-security table.

**The flood.** A statistical distance of 2^−40 for the whole released vector is not achievable with a
float64 release (with E ≥ ulp(M) it needs σ ≥ 2^39·√(R·d)·E, noise as large as the sum). What is
implemented is the bit-security flood of Li, Micciancio, Schultz & Sorrell (2022), the notion behind
OpenFHE's ``NOISE_FLOODING_DECRYPT``: ``σ = 8·√R·2^(λ/2)·E`` keeps λ bits of security against key recovery
and any other search attack over R decryptions of one ciphertext, with E the per-slot shift between the real
and the simulatable release, ``E = e_max + 2·ulp(M)`` (CKKS error plus float64 encoding/decoding, measured
≤ 1.0 ulp at the scales chosen here). The scale is raised until e_max ≤ ulp(M), so E ≤ 3·ulp(M):
λ = 40 and R = 2 (key holder + one fallback) give σ ≈ 6.3e-8 at n = M = 10 (6.5e-5 at M = 10⁴). The per-coordinate total-variation
distance this achieves is ``E/(2σ) = 1/(16·√R·2^(λ/2)) ≈ 2^−24.5`` (R = 2), stated next to the 40-bit figure.
The spec carries λ (``flood_bits``) and R (the decryptors, ``1 + len(fallbacks)``); each decryptor computes σ
itself (:func:`flood_sigma`) and each site refuses λ below its floor ``ckks-flood-bits`` (:mod:`..threat`).
The released error is ``|Y − exact| ≤ step·(1 + 2^−6) + z·σ`` with ``z = √(2 ln(2·d·2^40))`` except with
probability 2^−40 (:func:`release_error_bound`), and the coordinator refuses a release outside
``M + release_error_bound`` (the range check).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import dataclass

import numpy as np

from ...errors import ConfigError, DecodeError, OverflowRiskError, bad_value
from .. import crypto
from ..task import NO_TASK

__all__ = [
    "CKKS_STAGES",
    "CKKS_TIMEOUTS",
    "VERIFY_MODES",
    "MAX_COEFF_BITS",
    "CKKSParams",
    "CKKSRoundSpec",
    "choose_ckks_parameters",
    "check_ckks_params",
    "ckks_error_bound",
    "flood_sigma",
    "flood_shift",
    "randomized_round",
    "gaussian_noise",
    "release_error_bound",
    "encode_ckks_spec",
    "decode_ckks_spec",
    "FLOOD_BITS",
    "TAIL_BITS",
]

CKKS_STAGES = ("advertise", "handoff", "input", "decrypt")
CKKS_TIMEOUTS = {"advertise": 30.0, "handoff": 60.0, "input": 120.0, "decrypt": 120.0}
VERIFY_MODES = ("recompute", "signatures")
MAX_COEFF_BITS = {4096: 109, 8192: 218, 16384: 438, 32768: 881}
#: default λ of the decryption flood (bits of security against search attacks on the secret key)
FLOOD_BITS = 40
#: the release error bound holds except with probability 2^−TAIL_BITS
TAIL_BITS = 40
SPEC_VERSION = 2


@dataclass(frozen=True)
class CKKSParams:
    """A TenSEAL CKKS parameter set for a secure sum."""

    poly_modulus_degree: int
    coeff_mod_bit_sizes: tuple
    scale_bits: int
    step: float
    slots: int
    length: int

    @property
    def n_ciphertexts(self) -> int:
        return math.ceil(self.length / self.slots)

    def as_dict(self) -> dict:
        return dict(
            poly_modulus_degree=self.poly_modulus_degree,
            coeff_mod_bit_sizes=list(self.coeff_mod_bit_sizes),
            scale_bits=self.scale_bits,
            step=self.step,
            slots=self.slots,
            n_ciphertexts=self.n_ciphertexts,
            security_bits=128,
        )


def _half_log2(n: int) -> int:
    return math.ceil(math.log2(max(int(n), 1)) / 2)


def ckks_error_bound(scale_bits: int, n_clients: int) -> float:
    """e_max: the CKKS error of a decrypted sum of ``n_clients`` fresh ciphertexts at scale 2^s."""
    return 2.0 ** (14 + _half_log2(n_clients) - int(scale_bits))


def flood_shift(scale_bits: int, n_clients: int, max_abs_sum: float) -> float:
    """E = e_max + 2·ulp(M): the largest per-slot gap between a real release and a simulated one."""
    return ckks_error_bound(scale_bits, n_clients) + 2.0 * float(np.spacing(float(max_abs_sum)))


def flood_sigma(scale_bits: int, n_clients: int, max_abs_sum: float, bits: int = FLOOD_BITS, queries: int = 2) -> float:
    """σ = 8·√R·2^(λ/2)·E (Li, Micciancio, Schultz & Sorrell 2022: λ bits of security over R decryptions)."""
    return 8.0 * math.sqrt(max(1, int(queries))) * 2.0 ** (bits / 2) * flood_shift(scale_bits, n_clients, max_abs_sum)


def _tail_z(length: int) -> float:
    return math.sqrt(2.0 * math.log(2.0 * max(1, int(length)) * 2.0**TAIL_BITS))


def release_error_bound(step: float, sigma: float = 0.0, length: int = 1) -> float:
    """Bound on |released − exact sum| per coordinate: randomised rounding (< step), the CKKS error
    (≤ step/64) and the flood (≤ z·σ for all ``length`` coordinates, except with probability 2^−40)."""
    return float(step) * (1.0 + 2.0**-6) + _tail_z(length) * float(sigma)


def _float64_min_step(max_abs_sum: float) -> float:
    return 2.0 ** (math.ceil(math.log2(max(float(max_abs_sum), 2.0**-1000))) - 51)


def check_ckks_params(
    p: CKKSParams, n_clients: int, max_abs_sum: float, flood_bits: int = FLOOD_BITS, queries: int = 2
) -> list[str]:
    """What makes ``p`` unsafe or dishonest for a sum of ``n_clients`` values bounded by ``max_abs_sum``.

    Returns the reasons (empty: fine): the step must lie above the CKKS error (no raw decryption noise
    released) and above float64's resolution at M (the stated bound must hold); the data modulus must hold
    M plus the flood; the parameter set must be in the 128-bit table.
    """
    out = []
    if p.poly_modulus_degree not in MAX_COEFF_BITS or p.slots != p.poly_modulus_degree // 2:
        out.append(f"N = {p.poly_modulus_degree} with {p.slots} slots is not a supported CKKS ring")
        return out
    if (
        sum(p.coeff_mod_bit_sizes) > MAX_COEFF_BITS[p.poly_modulus_degree]
        or len(p.coeff_mod_bit_sizes) < 2
        or any(not 20 <= b <= 60 for b in p.coeff_mod_bit_sizes)
    ):
        out.append(
            f"N = {p.poly_modulus_degree} with modulus {list(p.coeff_mod_bit_sizes)} is not a 128-bit-secure "
            "parameter set (HomomorphicEncryption.org table, primes of 20..60 bits)"
        )
    if not (np.isfinite(p.step) and p.step > 0) or not (np.isfinite(max_abs_sum) and max_abs_sum > 0):
        out.append(f"step {p.step!r} and max |sum| {max_abs_sum!r} must be positive and finite")
        return out
    e_max = ckks_error_bound(p.scale_bits, n_clients)
    if p.step < 64.0 * e_max:
        out.append(
            f"step {p.step:.3g} is below 2^6 x the CKKS error {e_max:.3g} of a sum of {n_clients} ciphertexts "
            f"at scale 2^{p.scale_bits}: the release would carry raw decryption noise (key-recovery risk); "
            f"use step >= {64.0 * e_max:.3g} or a larger scale"
        )
    fmin = _float64_min_step(max_abs_sum)
    if p.step < fmin:
        out.append(
            f"step {p.step:.3g} is finer than float64 can carry at |sum| up to {max_abs_sum:g} (two ulps = "
            f"{fmin:.3g}): the stated error bound would be broken; use step >= {fmin:.3g} or a smaller clip"
        )
    sigma = flood_sigma(p.scale_bits, n_clients, max_abs_sum, flood_bits, queries)
    top = max_abs_sum + release_error_bound(p.step, sigma, p.length)
    need = p.scale_bits + max(0, math.ceil(math.log2(top))) + 2
    if sum(p.coeff_mod_bit_sizes[:-1]) < need:
        out.append(
            f"data modulus of {sum(p.coeff_mod_bit_sizes[:-1])} bits cannot hold |sum| up to {top:.3g} at "
            f"scale 2^{p.scale_bits} (needs {need})"
        )
    return out


def choose_ckks_parameters(
    length: int, precision: float, max_abs_sum: float, n_clients: int, flood_bits: int = FLOOD_BITS, queries: int = 2
) -> CKKSParams:
    """Smallest 128-bit-secure CKKS parameters that sum ``n_clients`` vectors to ``precision``, flooded.

    step = 2^−f with f = ⌈−log2(precision)⌉ (refused when finer than float64 carries at M = ``max_abs_sum``);
    scale bits s = max(f + 20 + ⌈½ log2 n⌉, the smallest s with e_max ≤ ulp(M)) — the first keeps the CKKS
    error ≤ step/64, the second makes the flood E (module docstring) a float64 quantity; data modulus
    ``s + ⌈log2(M + z·σ)⌉ + 2`` bits split into primes of ≤ 60 bits, plus a 60-bit special prime (fewer if N's
    budget is tight, never below 20).
    """
    if not (precision > 0 and np.isfinite(precision)):
        raise ConfigError(bad_value("precision", precision, "use a positive absolute precision, e.g. 1e-6"))
    if not (max_abs_sum > 0 and np.isfinite(max_abs_sum)):
        raise ConfigError(bad_value("clip_range", max_abs_sum, "use a positive finite bound"))
    f = max(0, math.ceil(-math.log2(precision)))
    step = 2.0**-f
    fmin = _float64_min_step(max_abs_sum)
    if step < fmin:
        raise OverflowRiskError(
            bad_value(
                "precision",
                precision,
                f"a sum bounded by {max_abs_sum:g} cannot be released to {step:.3g} in float64 "
                f"(two ulps are {fmin:.3g}); use precision >= {fmin:.3g} or a smaller clip range / fewer sites",
            )
        )
    h = _half_log2(n_clients)
    s = max(f + 20 + h, math.ceil(14 + h - math.log2(float(np.spacing(float(max_abs_sum))))))
    sigma = flood_sigma(s, n_clients, max_abs_sum, flood_bits, queries)
    top = max_abs_sum + release_error_bound(step, sigma, length)
    data_bits = s + max(0, math.ceil(math.log2(top))) + 2
    nprimes = math.ceil(data_bits / 60)
    per = math.ceil(data_bits / nprimes)
    data = [max(per, 20)] * nprimes
    for degree, budget in MAX_COEFF_BITS.items():
        special = min(60, budget - sum(data))
        if special >= max(20, min(per, 40)):
            return CKKSParams(degree, tuple(data + [special]), s, step, degree // 2, int(length))
    raise OverflowRiskError(
        bad_value(
            "precision",
            precision,
            f"a sum bounded by {max_abs_sum:g} at this precision needs {data_bits} modulus bits, "
            "beyond 128-bit-secure CKKS; lower the precision or the clip range",
        )
    )


# ------------------------------------------------------------------------------------ secret randomness


def _uniforms(size: int) -> np.ndarray:
    """53-bit uniforms in [0, 1) from AES-256-CTR under a fresh ``os.urandom`` key (secret randomness)."""
    words = crypto.keystream_words(os.urandom(32), size, np.uint64)
    return (words >> np.uint64(11)).astype(np.float64) * 2.0**-53


def randomized_round(x: np.ndarray, step: float) -> np.ndarray:
    """``⌊x/step + U⌋·step`` with U ~ U[0,1) from a secret AES-CTR keystream (unbiased, |x − out| < step)."""
    return np.floor(x / step + _uniforms(x.size)) * step


def gaussian_noise(size: int, sigma: float) -> np.ndarray:
    """N(0, σ²) per slot by Box–Muller from a CSPRNG (the flood η)."""
    if sigma <= 0:
        return np.zeros(size)
    m = (size + 1) // 2
    u1 = 1.0 - _uniforms(m)  # (0, 1]
    u2 = _uniforms(m)
    r = np.sqrt(-2.0 * np.log(u1))
    z = np.concatenate([r * np.cos(2 * np.pi * u2), r * np.sin(2 * np.pi * u2)])[:size]
    return sigma * z


# ================================================================================================ spec


@dataclass(frozen=True)
class CKKSRoundSpec:
    """Public parameters of one CKKS round, known to every party (the server announces them).

    Parameters
    ----------
    session_id : bytes
        16 random bytes; every message and every signature is bound to it (and to :attr:`digest`).
    round_index : int
    n_clients : int
    key_holder : int
        The client that generates the CKKS key pair.
    params : CKKSParams
        TenSEAL parameters (:func:`choose_ckks_parameters`); ``params.length`` is the vector length.
    clip : float
        Public bound c: every coordinate is clipped to [−c, c] (counted) before weighting.
    identity_keys : tuple of bytes
        Each client's Ed25519 public key.
    min_survivors : int
        A decryptor refuses sums over fewer distinct signed uploads than this.
    verify : {"recompute", "signatures"}
        What the decryptor checks before it decrypts (:mod:`.machines`).
    timeouts : tuple of (stage, seconds)
        Per stage of ``CKKS_STAGES``; the survivor-set confirmation uses the ``decrypt`` timeout.
    quorum : int
        Survivor-set signatures a decryptor requires; 0 → ⌊n/2⌋ + 1 (a majority of all ``n_clients``).
    max_abs_sum : float
        M, the public bound on |sum| per coordinate (Σ weights × clip; 0 → ``n_clients × clip``): the
        coordinator refuses a release beyond ``M + release_error_bound``.
    flood_bits : int
        λ of the decryption flood (module docstring); sites refuse values below ``ckks-flood-bits``.
    fallbacks : tuple of int or None
        The only clients besides the key holder that receive the secret key (fallback decryptors); every
        other client gets the public context only. None: the lowest id other than the key holder.
    task_digest : bytes
        32 bytes naming what the sites sum (:func:`securefed.securesum.task.task_digest` of the request's fields;
        32 zero bytes, the default, mean "none" and encode exactly as a spec without the field). It enters
        :attr:`digest`, so every signature of the round covers it (docs/threat-model-secure-sum.md §3).
    """

    session_id: bytes
    round_index: int
    n_clients: int
    key_holder: int
    params: CKKSParams
    clip: float
    identity_keys: tuple
    min_survivors: int = 2
    verify: str = "recompute"
    timeouts: tuple = tuple(CKKS_TIMEOUTS.items())
    quorum: int = 0
    max_abs_sum: float = 0.0
    flood_bits: int = FLOOD_BITS
    fallbacks: tuple | None = None
    task_digest: bytes = NO_TASK

    def __post_init__(self):
        if not isinstance(self.session_id, bytes) or len(self.session_id) != 16:
            raise ConfigError(bad_value("session_id", self.session_id, "use 16 random bytes"))
        if not 0 <= self.round_index < 2**32:
            raise ConfigError(bad_value("round_index", self.round_index, "use an integer in [0, 2^32)"))
        if self.n_clients < 1 or len(self.identity_keys) != self.n_clients:
            raise ConfigError(
                bad_value("identity_keys", len(self.identity_keys), f"give {self.n_clients} Ed25519 public keys")
            )
        if not 0 <= self.key_holder < self.n_clients:
            raise ConfigError(bad_value("key_holder", self.key_holder, f"use a client index in [0, {self.n_clients})"))
        if not 1 <= self.min_survivors <= self.n_clients:
            raise ConfigError(
                bad_value(
                    "min_survivors",
                    self.min_survivors,
                    f"use 1 <= min_survivors <= n_clients = {self.n_clients} (2 or more hides inputs)",
                )
            )
        if not (np.isfinite(self.clip) and self.clip > 0):
            raise ConfigError(bad_value("clip", self.clip, "use a positive public bound on |coordinates|"))
        if not 0 <= self.quorum <= self.n_clients:
            raise ConfigError(
                bad_value(
                    "quorum",
                    self.quorum,
                    f"use 0 (majority) or 1..{self.n_clients}; below a "
                    "majority a malicious server can get two survivor sets decrypted",
                )
            )
        if self.verify not in VERIFY_MODES:
            raise ConfigError(bad_value("verify", self.verify, f"use one of {', '.join(VERIFY_MODES)}"))
        tmo = dict(self.timeouts)
        if set(tmo) != set(CKKS_STAGES) or any(not (v > 0) for v in tmo.values()):
            raise ConfigError(
                bad_value("timeouts", tmo, f"give a positive number of seconds for each of {CKKS_STAGES}")
            )
        if not self.max_abs_sum:
            object.__setattr__(self, "max_abs_sum", float(self.n_clients * self.clip))
        if not (np.isfinite(self.max_abs_sum) and self.max_abs_sum >= self.clip):
            raise ConfigError(bad_value("max_abs_sum", self.max_abs_sum, "use Σ weights × clip (at least clip)"))
        if self.fallbacks is None:
            fb = tuple(i for i in range(self.n_clients) if i != self.key_holder)[:1]
            object.__setattr__(self, "fallbacks", fb)
        fb = tuple(int(i) for i in self.fallbacks)
        object.__setattr__(self, "fallbacks", fb)
        if len(set(fb)) != len(fb) or self.key_holder in fb or any(not 0 <= i < self.n_clients for i in fb):
            raise ConfigError(bad_value("fallbacks", fb, "give distinct client ids other than the key holder"))
        if not isinstance(self.task_digest, bytes) or len(self.task_digest) != 32:
            raise ConfigError(
                bad_value(
                    "task_digest",
                    self.task_digest,
                    "use 32 bytes (SHA-256 of the request's fields, securefed.securesum.task.task_digest) or NO_TASK",
                )
            )
        if not 1 <= int(self.flood_bits) <= 256:
            raise ConfigError(bad_value("flood_bits", self.flood_bits, "use λ in [1, 256], e.g. 40"))
        problems = check_ckks_params(self.params, self.n_clients, self.max_abs_sum, self.flood_bits, self.queries)
        if problems:
            raise ConfigError(bad_value("CKKS parameters", self.params.as_dict(), "; ".join(problems)))

    def timeout(self, stage: str) -> float:
        return dict(self.timeouts)["decrypt" if stage == "confirm" else stage]

    @property
    def signatures_needed(self) -> int:
        """Distinct survivor-set signatures a decryptor requires (``quorum`` or a majority of n)."""
        return self.quorum or self.n_clients // 2 + 1

    @property
    def decryptors(self) -> tuple:
        """The clients that hold the secret key: the key holder, then the fallbacks."""
        return (self.key_holder,) + tuple(self.fallbacks)

    @property
    def queries(self) -> int:
        """R: the decryptions of one ciphertext a round can make (one per key-holding client)."""
        return 1 + len(self.fallbacks)

    @property
    def flood_sigma(self) -> float:
        """σ of the decryption flood for this round (module docstring)."""
        return flood_sigma(self.params.scale_bits, self.n_clients, self.max_abs_sum, self.flood_bits, self.queries)

    @property
    def release_bound(self) -> float:
        """The stated bound on |released − exact| per coordinate (except with probability 2^−40)."""
        return release_error_bound(self.params.step, self.flood_sigma, self.params.length)

    @property
    def digest(self) -> bytes:
        """SHA-256 of the encoded spec; every signature of the round covers it."""
        return hashlib.sha256(b"securefed/ckks-spec/v2|" + encode_ckks_spec(self)).digest()


def encode_ckks_spec(spec: CKKSRoundSpec) -> bytes:
    """The public round parameters as JSON bytes (byte strings hex-encoded)."""
    p = spec.params
    doc = {
        "v": SPEC_VERSION,
        "session_id": spec.session_id.hex(),
        "round_index": spec.round_index,
        "n_clients": spec.n_clients,
        "key_holder": spec.key_holder,
        "clip": spec.clip,
        "min_survivors": spec.min_survivors,
        "verify": spec.verify,
        "quorum": spec.quorum,
        "max_abs_sum": spec.max_abs_sum,
        "flood_bits": spec.flood_bits,
        "fallbacks": list(spec.fallbacks),
        "params": [p.poly_modulus_degree, list(p.coeff_mod_bit_sizes), p.scale_bits, p.step, p.slots, p.length],
        "identity_keys": [k.hex() for k in spec.identity_keys],
        "timeouts": [[k, v] for k, v in spec.timeouts],
    }
    if spec.task_digest != NO_TASK:  # only then: a spec without a task digest encodes (and digests) as before
        doc["task"] = spec.task_digest.hex()
    return json.dumps(doc, sort_keys=True).encode()


def decode_ckks_spec(data: bytes) -> CKKSRoundSpec:
    """Strict inverse of :func:`encode_ckks_spec` (DecodeError on any unknown version or malformed field;
    ConfigError, with the reason, on parameters no party may use — e.g. a step below the CKKS error)."""
    try:
        doc = json.loads(bytes(data).decode())
        if not isinstance(doc, dict) or doc.get("v") != SPEC_VERSION:
            raise DecodeError(
                f"CKKS round spec version {doc.get('v') if isinstance(doc, dict) else None!r} is not {SPEC_VERSION}"
            )
        deg, mods, sbits, step, slots, length = doc["params"]
        if int(deg) not in MAX_COEFF_BITS or sum(int(m) for m in mods) > MAX_COEFF_BITS[int(deg)]:
            raise DecodeError(f"CKKS round spec: N={deg} with modulus {mods} is not a 128-bit-secure parameter set")
        params = CKKSParams(int(deg), tuple(int(m) for m in mods), int(sbits), float(step), int(slots), int(length))
        keys = tuple(bytes.fromhex(h) for h in doc["identity_keys"])
        if any(len(k) != 32 for k in keys):
            raise DecodeError("CKKS round spec: identity keys must be 32 bytes")
        task = NO_TASK
        if "task" in doc:
            task = bytes.fromhex(doc["task"]) if isinstance(doc["task"], str) else b""
            if len(task) != 32 or task == NO_TASK:
                raise DecodeError(f"CKKS round spec: task digest {doc['task']!r} is not 32 non-zero bytes in hex")
        fields = (
            bytes.fromhex(doc["session_id"]),
            int(doc["round_index"]),
            int(doc["n_clients"]),
            int(doc["key_holder"]),
            params,
            float(doc["clip"]),
            keys,
            int(doc["min_survivors"]),
            str(doc["verify"]),
            tuple((str(a), float(b)) for a, b in doc["timeouts"]),
            int(doc["quorum"]),
            float(doc["max_abs_sum"]),
            int(doc["flood_bits"]),
            tuple(int(i) for i in doc["fallbacks"]),
            task,
        )
    except DecodeError:
        raise
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise DecodeError(f"malformed CKKS round spec: {exc}") from None
    return CKKSRoundSpec(*fields)
