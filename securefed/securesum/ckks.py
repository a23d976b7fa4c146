"""CKKS secure sum with TenSEAL: the server adds ciphertexts it cannot decrypt.

Scheme: Cheon, Kim, Kim, Song, "Homomorphic Encryption for Arithmetic of Approximate Numbers",
ASIACRYPT 2017 (CKKS), via TenSEAL / Microsoft SEAL.

The protocol runs as two sans-I/O state machines, :class:`CKKSClient` and :class:`CKKSServer`
(feed bytes with ``receive(data, now)``, close overdue stages with ``tick(now)``, as
:mod:`.secagg`); every message is a :mod:`.messages` dataclass through the strict codec. The
in-process driver :func:`run_ckks_round` (used by :class:`CKKSAggregator` and the simulator) and the
Flower transport (:mod:`.flower.ckks_flow`) drive the **same** machines. Stages (``CKKS_STAGES``)::

    advertise  client → server   AdvertiseKeys: a fresh X25519 key c_pk, Ed25519-signed
               server → holder   KeysBroadcast: every live client's signed advertisement
    handoff    holder → server   PublicContext (public key only; ``is_private() is False``, checked)
                                 ContextHandoff per client: the secret context under AES-256-GCM with
                                 key HKDF(X25519(c_holder, c_j)), AAD = session, round, sender, recipient
                                 (the holder verifies each recipient's signed key first)
                                 SignedInput: the holder's own input (see below)
               server → client   KeysBroadcast(the holder's signed advertisement) + ContextHandoff;
                                 the client verifies the holder's signature before deriving the channel
                                 key — else a server could hand it a context of its own and read its input
    input      client → server   SignedInput: clip to [−c, c], weight, batch over ⌈d / slots⌉
                                 ciphertexts; Ed25519 signature over SHA-256 of the chunks, bound to
                                 session, round and sender. The server verifies it and adds the
                                 ciphertexts slot-wise as they arrive (public context only).
    decrypt    server → survivor  ConsistencyRequest(U = clients whose upload arrived)   (server stage
               survivor → server  ConsistencySignature: Ed25519 over (session, round, U);  ``confirm``)
                                 a client signs one U per round, and only a U containing itself
               server → decryptor DecryptRequest: U, a quorum of survivor-set signatures, the signed
                                 upload digests, the uploads (default ``verify="recompute"``), the sum
               decryptor → server DecryptedSum: the sum **randomised-rounded to the stated precision**

The decryptor is the key holder or, when it does not answer before the ``decrypt`` deadline, the next
survivor (in id order) that confirmed U — every survivor holds the key. Randomised rounding
``⌊x/step + V⌋·step`` uses V ~ U[0,1) from an AES-CTR keystream under an ``os.urandom`` key. Releasing raw CKKS decryptions
leaks the secret key: Li & Micciancio, "On the Security of Homomorphic Encryption on Approximate
Numbers", EUROCRYPT 2021, recover the key from the decryption noise. Rounding to a step ≥ 2^6 × the
CKKS error floods that noise (statistical distance ≤ error/step per coordinate) and makes the release
unbiased; its distance to the exact sum is < step from the rounding plus ≤ step/64 of CKKS error
(:func:`release_error_bound`: < step·(1 + 2^−6); a value that lies on the grid can come out one step off).

Threat model (honest-but-curious server): the server alone learns only the sum. **The key holder and
every client that received the secret key can decrypt any single client's ciphertext**, so the server
colluding with any one of them learns every input — strictly weaker than SecAgg+'s "fewer than t
colluders" guarantee. There is no dropout recovery cost: dropped clients simply contribute no
ciphertext.

What the decryptor checks before it decrypts (against a *malicious* server). It decrypts only for
the survivor set U it confirmed itself, only with ≥ ``quorum`` valid survivor-set signatures from
distinct members of U (default ``quorum`` = ⌊n/2⌋ + 1 of all n clients of the round), only if
|U| ≥ ``min_survivors``, and only if each survivor's digest carries that client's Ed25519 signature for
this session and round (its own digest must be the one it signed). With ``verify="recompute"``
(default) it also receives every survivor's upload, checks it against the signed digest, re-adds the
uploads homomorphically and refuses (:class:`AuthenticationError`) unless the server's claimed sum is
byte-identical to that sum; it decrypts only the recomputed sum. Together this **prevents** the server
from getting decrypted a single client's ciphertext, a sum over fewer than ``min_survivors`` clients,
any other combination of uploads (e.g. ``2·ct_a − ct_b``), a ciphertext of another round or session or
one it encrypted itself, and — since honest clients sign one U per round and two majorities intersect —
**two different survivor sets in one round** (the differencing attack Dec(U) − Dec(U∖{i}) = x_i via the
fallback decryptors). It **does not prevent**: (i) collusion with any key holder (above); (ii)
differencing when ``quorum`` is set at or below n/2, or when c colluding clients sign two sets and
2·quorum − n ≤ c; (iii) clients colluding with the server that upload known vectors (e.g. zeros) so the
sum exposes the one honest input — ``min_survivors`` counts identities, not honest ones; (iv) a server
that controls the identity keys (the PKI); (v) combining sums of *different* rounds (each round has
fresh keys and inputs; a caller that re-sends identical inputs in two rounds with different survivors
gives the difference away, as under SecAgg+). The recompute check costs the decryptor a download of all
|U| uploads and their re-summation. With ``verify="signatures"`` the decryptor makes every check but
the recomputation and decrypts the server's sum as sent: cheaper, but a malicious server can then
substitute any ciphertext (e.g. one client's upload), so this mode is sound only for an
honest-but-curious server. The majority quorum also means a round needs more than half of all n
clients alive through the confirmation; lower ``quorum`` explicitly to trade this protection for
dropout tolerance.

**Identity keys are an assumption, not something this protocol establishes.** Every check above is
an Ed25519 signature check against ``CKKSRoundSpec.identity_keys``. Over Flower
(:mod:`.flower.ckks_flow`) the **server relays those keys**: it collects each site's public key at
``hello`` and sends the list inside the round spec, i.e. the server is the key directory, exactly as
for SecAgg+ over Flower. A malicious server that substitutes keys (or invents sites) can sign for the
clients it invented and defeat every malicious-server protection of this section — case (iv). The
protections therefore hold only if the identity keys are authentic, which is the operator's job:
Flower node authentication plus out-of-band pinning / comparison of the sites' public keys. A site
additionally refuses (over Flower) any round spec weaker than its own node-config floors
(``ckks-min-survivors``, a majority quorum, ``verify="recompute"``, the DP ``t`` under distributed
noise; :func:`.flower.ckks_flow.site_handle_ckks`), so a server cannot simply *announce* weak
parameters — but it can still lie about who the other n − 1 clients are.

Parameters (:func:`choose_ckks_parameters`) target 128-bit security using the
HomomorphicEncryption.org standard's maximal coefficient-modulus sizes for ternary secrets:
N = 4096 → 109 bits, 8192 → 218, 16384 → 438, 32768 → 881. The scale 2^s gives ``s = f + guard``
bits where step = 2^−f and guard covers the encoding/encryption noise of n summed ciphertexts; the data
modulus adds ⌈log2(max|sum|)⌉ + 2 bits so the sum cannot wrap (else :class:`OverflowRiskError`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import struct
import time
from dataclasses import dataclass

import numpy as np
import tenseal as ts

from .base import AggregateResult
from ..errors import (AuthenticationError, ConfigError, DecodeError, OverflowRiskError, ProtocolAbortedError,
                      ProtocolError, ProtocolTimeoutError, SecureFedError, bad_value)
from . import crypto
from .messages import (AdvertiseKeys, ConsistencyRequest, ConsistencySignature, ContextHandoff, DecryptedSum,
                       DecryptRequest, InputDigest, InputEntry, KeyEntry, KeysBroadcast, PublicContext, SignatureEntry,
                       SignedInput, decode, decode_expected, encode, peek_header)
from .quantize import check_random_state, warn_clipped
from .secagg import advert_payload, channel_key, share_aad

__all__ = ["CKKS_STAGES", "CKKS_TIMEOUTS", "VERIFY_MODES", "CKKSParams", "CKKSRoundSpec", "CKKSClient", "CKKSServer",
           "choose_ckks_parameters", "CKKSAggregator", "run_ckks_round", "randomized_round", "encode_ckks_spec",
           "decode_ckks_spec", "upload_digest", "input_payload", "CKKS_TAMPER_KINDS", "release_error_bound",
           "UnexpectedMessageError"]

CKKS_STAGES = ("advertise", "handoff", "input", "decrypt")
CKKS_TIMEOUTS = {"advertise": 30.0, "handoff": 60.0, "input": 120.0, "decrypt": 120.0}
VERIFY_MODES = ("recompute", "signatures")
MAX_COEFF_BITS = {4096: 109, 8192: 218, 16384: 438, 32768: 881}


class UnexpectedMessageError(ProtocolError):
    """A well-formed message of this session and round, but of a type the machine does not expect now.

    What a replayed or reordered message looks like (e.g. a second ContextHandoff after the upload, a
    DecryptRequest before the key handoff). Malformed bytes, another session or another round stay
    :class:`DecodeError`.
    """


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
        return dict(poly_modulus_degree=self.poly_modulus_degree, coeff_mod_bit_sizes=list(self.coeff_mod_bit_sizes),
                    scale_bits=self.scale_bits, step=self.step, slots=self.slots, n_ciphertexts=self.n_ciphertexts,
                    security_bits=128)


def choose_ckks_parameters(length: int, precision: float, max_abs_sum: float, n_clients: int) -> CKKSParams:
    """Smallest 128-bit-secure CKKS parameters that sum ``n_clients`` vectors to ``precision``.

    step = 2^−f with f = ⌈−log2(precision)⌉; scale bits s = f + 14 + ⌈log2(n)/2⌉ + 6 (fresh-encryption
    noise ≈ 2^13 in scaled units, growing as √n over n additions, plus 6 bits so the CKKS error is
    ≤ step/64); data modulus ``s + ⌈log2(max_abs_sum)⌉ + 2`` bits split into primes of ≤ 60 bits, plus a
    60-bit special prime (fewer if N's budget is tight, never below 20).
    """
    if not (precision > 0 and np.isfinite(precision)):
        raise ConfigError(bad_value("precision", precision, "use a positive absolute precision, e.g. 1e-6"))
    if not (max_abs_sum > 0 and np.isfinite(max_abs_sum)):
        raise ConfigError(bad_value("clip_range", max_abs_sum, "use a positive finite bound"))
    f = max(0, math.ceil(-math.log2(precision)))
    s = f + 14 + math.ceil(math.log2(max(n_clients, 1)) / 2) + 6
    data_bits = s + max(0, math.ceil(math.log2(max_abs_sum))) + 2
    nprimes = math.ceil(data_bits / 60)
    per = math.ceil(data_bits / nprimes)
    data = [per] * nprimes
    for degree, budget in MAX_COEFF_BITS.items():
        special = min(60, budget - per * nprimes)
        if special >= max(20, min(per, 40)):
            return CKKSParams(degree, tuple(data + [special]), s, 2.0 ** -f, degree // 2, int(length))
    raise OverflowRiskError(bad_value(
        "precision", precision, f"a sum bounded by {max_abs_sum:g} at this precision needs {data_bits} modulus bits, "
        "beyond 128-bit-secure CKKS; lower the precision or the clip range"))


def randomized_round(x: np.ndarray, step: float) -> np.ndarray:
    """``⌊x/step + U⌋·step`` with U ~ U[0,1) from a secret AES-CTR keystream (unbiased, |x − out| < step).

    Floods the CKKS decryption noise before release (Li & Micciancio 2021). U is secret randomness:
    53-bit uniforms from AES-256-CTR under a fresh ``os.urandom`` key.
    """
    words = crypto.keystream_words(os.urandom(32), x.size, np.uint64)
    u = (words >> np.uint64(11)).astype(np.float64) * 2.0 ** -53
    return np.floor(x / step + u) * step


def release_error_bound(step: float) -> float:
    """Bound on |released − exact sum|: randomised rounding (< step) plus the CKKS error (≤ step/64).

    The parameters of :func:`choose_ckks_parameters` keep the encryption + summation error below
    2^−6·step (tested by decrypting without rounding); the rounding adds < step.
    """
    return float(step) * (1.0 + 2.0 ** -6)


def _make_context(p: CKKSParams):
    ctx = ts.context(ts.SCHEME_TYPE.CKKS, poly_modulus_degree=p.poly_modulus_degree,
                     coeff_mod_bit_sizes=list(p.coeff_mod_bit_sizes))
    ctx.global_scale = 2.0 ** p.scale_bits
    return ctx


def _public_bytes(ctx) -> bytes:
    return ctx.serialize(save_public_key=True, save_secret_key=False, save_galois_keys=False, save_relin_keys=False)


def _secret_bytes(ctx) -> bytes:
    return ctx.serialize(save_public_key=True, save_secret_key=True, save_galois_keys=False, save_relin_keys=False)


def load_public_context(data: bytes):
    """Load the server's context and refuse it if it carries a secret key."""
    ctx = ts.context_from(data)
    if ctx.is_private():
        raise AuthenticationError("the server was handed a context holding the CKKS secret key; refused")
    return ctx


def can_decrypt(ctx, ciphertext: bytes) -> bool:
    """True if ``ctx`` decrypts ``ciphertext`` (the server's context must never do so)."""
    try:
        ts.ckks_vector_from(ctx, ciphertext).decrypt()
    except ValueError:
        return False
    return True


def encrypt_vector(ctx, x: np.ndarray, slots: int) -> tuple:
    """Batch ``x`` over ⌈len/slots⌉ CKKS ciphertexts (serialised)."""
    return tuple(ts.ckks_vector(ctx, x[i:i + slots].tolist()).serialize() for i in range(0, x.size, slots))


def sum_ciphertexts(pub_ctx, uploads: list) -> tuple:
    """Slot-wise homomorphic sum of several clients' chunk lists (server side, public context only)."""
    sums = None
    for chunks in uploads:
        vecs = [ts.ckks_vector_from(pub_ctx, c) for c in chunks]
        if sums is None:
            sums = vecs
        else:
            if len(vecs) != len(sums):
                raise ProtocolError("clients uploaded different numbers of ciphertexts")
            for a, b in zip(sums, vecs):
                a.add_(b)
    return tuple(v.serialize() for v in sums)


def decrypt_sum(priv_ctx, chunks, length: int, step: float) -> np.ndarray:
    """Key-holder side: decrypt the summed chunks and randomised-round to ``step``."""
    parts = [np.asarray(ts.ckks_vector_from(priv_ctx, c).decrypt(), dtype=np.float64) for c in chunks]
    x = np.concatenate(parts)[:length]
    return randomized_round(x, step)


_pack = crypto.pack_ids


def upload_digest(chunks) -> bytes:
    """SHA-256 over a ciphertext upload (domain-separated, each chunk length-prefixed): what a client signs."""
    h = hashlib.sha256(b"securefed/ckks-chunks/v1|" + _pack(len(chunks)))
    for c in chunks:
        h.update(_pack(len(c)))
        h.update(c)
    return h.digest()


def input_payload(session: bytes, rnd: int, sender: int, digest: bytes) -> bytes:
    """Bytes a SignedInput signature covers: session, round, sender and the upload digest."""
    return b"securefed/ckks-input/v1|" + session + _pack(rnd, sender) + digest


def survivors_payload(session: bytes, rnd: int, survivors) -> bytes:
    """Bytes a CKKS survivor-set signature covers: session, round and the exact set U."""
    ids = tuple(survivors)
    return b"securefed/ckks-survivors/v1|" + session + _pack(rnd, len(ids), *ids)


def _vectors(ctx, chunks, what: str) -> list:
    """Deserialise ciphertext chunks under ``ctx``; a malformed chunk is a :class:`DecodeError`."""
    try:
        return [ts.ckks_vector_from(ctx, bytes(c)) for c in chunks]
    except (ValueError, RuntimeError, TypeError) as exc:
        raise DecodeError(f"{what}: not a CKKS ciphertext for this context ({exc})") from None


def _add_into(sums: list | None, vecs: list, what: str) -> list:
    if sums is None:
        return vecs
    if len(vecs) != len(sums):
        raise ProtocolError(f"{what}: {len(vecs)} ciphertexts, expected {len(sums)}")
    try:
        for a, b in zip(sums, vecs):
            a.add_(b)
    except (ValueError, RuntimeError, TypeError) as exc:
        raise DecodeError(f"{what}: ciphertexts cannot be added ({exc})") from None
    return sums


# ============================================================================================= round spec


@dataclass(frozen=True)
class CKKSRoundSpec:
    """Public parameters of one CKKS round, known to every party (the server announces them).

    Parameters
    ----------
    session_id : bytes
        16 random bytes; every message and every signature is bound to it.
    round_index : int
    n_clients : int
    key_holder : int
        The client that generates the CKKS key pair and hands the secret context to the others.
    params : CKKSParams
        TenSEAL parameters (:func:`choose_ckks_parameters`); ``params.length`` is the vector length.
    clip : float
        Public bound c: every coordinate is clipped to [−c, c] (counted) before weighting.
    identity_keys : tuple of bytes
        Each client's long-term Ed25519 public key.
    min_survivors : int
        A decryptor refuses sums over fewer distinct signed uploads than this.
    verify : {"recompute", "signatures"}
        What the decryptor checks before it decrypts (module docstring).
    timeouts : tuple of (stage, seconds)
        Per stage of ``CKKS_STAGES``; the survivor-set confirmation uses the ``decrypt`` timeout.
    quorum : int
        Signatures over the survivor set a decryptor requires; 0 → ⌊n/2⌋ + 1 (a majority of all
        ``n_clients``, so no two different survivor sets can both be confirmed by honest clients).
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

    def __post_init__(self):
        if not isinstance(self.session_id, bytes) or len(self.session_id) != 16:
            raise ConfigError(bad_value("session_id", self.session_id, "use 16 random bytes"))
        if not 0 <= self.round_index < 2**32:
            raise ConfigError(bad_value("round_index", self.round_index, "use an integer in [0, 2^32)"))
        if self.n_clients < 1 or len(self.identity_keys) != self.n_clients:
            raise ConfigError(bad_value("identity_keys", len(self.identity_keys), f"give {self.n_clients} Ed25519 public keys"))
        if not 0 <= self.key_holder < self.n_clients:
            raise ConfigError(bad_value("key_holder", self.key_holder, f"use a client index in [0, {self.n_clients})"))
        if not 1 <= self.min_survivors <= self.n_clients:
            raise ConfigError(bad_value("min_survivors", self.min_survivors,
                                        f"use 1 <= min_survivors <= n_clients = {self.n_clients} (2 or more hides inputs)"))
        if not (np.isfinite(self.clip) and self.clip > 0):
            raise ConfigError(bad_value("clip", self.clip, "use a positive public bound on |coordinates|"))
        if not 0 <= self.quorum <= self.n_clients:
            raise ConfigError(bad_value("quorum", self.quorum, f"use 0 (majority) or 1..{self.n_clients}; below a "
                                        "majority a malicious server can get two survivor sets decrypted"))
        if self.verify not in VERIFY_MODES:
            raise ConfigError(bad_value("verify", self.verify, f"use one of {', '.join(VERIFY_MODES)}"))
        tmo = dict(self.timeouts)
        if set(tmo) != set(CKKS_STAGES) or any(not (v > 0) for v in tmo.values()):
            raise ConfigError(bad_value("timeouts", tmo, f"give a positive number of seconds for each of {CKKS_STAGES}"))

    def timeout(self, stage: str) -> float:
        return dict(self.timeouts)["decrypt" if stage == "confirm" else stage]

    @property
    def signatures_needed(self) -> int:
        """Distinct survivor-set signatures a decryptor requires (``quorum`` or a majority of n)."""
        return self.quorum or self.n_clients // 2 + 1


def encode_ckks_spec(spec: CKKSRoundSpec) -> bytes:
    """The public round parameters as JSON bytes (byte strings hex-encoded)."""
    p = spec.params
    doc = {"v": 1, "session_id": spec.session_id.hex(), "round_index": spec.round_index, "n_clients": spec.n_clients,
           "key_holder": spec.key_holder, "clip": spec.clip, "min_survivors": spec.min_survivors, "verify": spec.verify,
           "quorum": spec.quorum,
           "params": [p.poly_modulus_degree, list(p.coeff_mod_bit_sizes), p.scale_bits, p.step, p.slots, p.length],
           "identity_keys": [k.hex() for k in spec.identity_keys], "timeouts": [[k, v] for k, v in spec.timeouts]}
    return json.dumps(doc, sort_keys=True).encode()


def decode_ckks_spec(data: bytes) -> CKKSRoundSpec:
    """Strict inverse of :func:`encode_ckks_spec` (DecodeError on any unknown version or malformed field)."""
    try:
        doc = json.loads(bytes(data).decode())
        if doc.get("v") != 1:
            raise DecodeError(f"CKKS round spec version {doc.get('v')!r} is not 1")
        deg, mods, sbits, step, slots, length = doc["params"]
        if int(deg) not in MAX_COEFF_BITS or sum(int(m) for m in mods) > MAX_COEFF_BITS[int(deg)]:
            raise DecodeError(f"CKKS round spec: N={deg} with modulus {mods} is not a 128-bit-secure parameter set")
        params = CKKSParams(int(deg), tuple(int(m) for m in mods), int(sbits), float(step), int(slots), int(length))
        keys = tuple(bytes.fromhex(h) for h in doc["identity_keys"])
        if any(len(k) != 32 for k in keys):
            raise DecodeError("CKKS round spec: identity keys must be 32 bytes")
        return CKKSRoundSpec(bytes.fromhex(doc["session_id"]), int(doc["round_index"]), int(doc["n_clients"]),
                             int(doc["key_holder"]), params, float(doc["clip"]), keys, int(doc["min_survivors"]),
                             str(doc["verify"]), tuple((str(a), float(b)) for a, b in doc["timeouts"]), int(doc["quorum"]))
    except DecodeError:
        raise
    except (ValueError, KeyError, TypeError) as exc:
        raise DecodeError(f"malformed CKKS round spec: {exc}") from None


# ================================================================================================ client


_STATE_MAGIC = b"SFCKKS"
_STATE_VERSION = 1
_CLIENT_STATES = ("init", "advertised", "keyed", "uploaded", "confirmed", "done", "aborted")


class CKKSClient:
    """One client's CKKS state machine. No I/O: ``start`` and ``receive`` return encoded messages.

    States: ``init`` → ``advertised`` → (``keyed``, non-holders: the holder's key is verified, the
    handoff awaited) → ``uploaded`` → ``confirmed`` (signed the survivor set, once) → ``done`` (the
    decryptor only); any violation → ``aborted`` (sends nothing further).

    Parameters
    ----------
    spec : CKKSRoundSpec
    client_id : int
    identity_key : Ed25519PrivateKey
        The client's long-term signing key (public half ``spec.identity_keys[client_id]``).
    update : array_like
        The client's input (``spec.params.length`` values after ``ravel``).
    weight : float
        Public non-negative weight, applied after clipping.
    """

    def __init__(self, spec: CKKSRoundSpec, client_id: int, identity_key, update, weight: float = 1.0):
        if not 0 <= client_id < spec.n_clients:
            raise ConfigError(bad_value("client_id", client_id, f"use 0 <= client_id < {spec.n_clients}"))
        if np.size(update) != spec.params.length:
            raise ConfigError(bad_value("update.size", np.size(update), f"expected {spec.params.length} values"))
        if not (np.isfinite(weight) and weight >= 0):
            raise ConfigError(bad_value("weight", weight, "use a finite non-negative weight"))
        self.spec, self.id = spec, int(client_id)
        self._identity = identity_key
        self._update = np.asarray(update, dtype=np.float64).ravel().copy()
        if not np.all(np.isfinite(self._update)):
            raise ConfigError(bad_value("update", "non-finite values", "clients must upload finite numbers"))
        self._weight = float(weight)
        self.state = "init"
        self.clipped = 0
        self._c_sk = None
        self._c_pk: bytes | None = None
        self._holder_pk: bytes | None = None
        self._ctx = None
        self._digest: bytes | None = None
        self._survivors: tuple | None = None

    @property
    def is_key_holder(self) -> bool:
        return self.id == self.spec.key_holder

    # -- helpers
    def _abort(self):
        self.state = "aborted"
        self._c_sk = self._ctx = self._update = None

    def start(self, now: float = 0.0) -> list[bytes]:
        """Stage ``advertise``: a fresh X25519 key pair, signed with the identity key."""
        if self.state != "init":
            self._abort()
            raise ProtocolError(f"client {self.id}: start() called twice; aborted")
        spec = self.spec
        self._c_sk, c_pk = crypto.x25519_keypair()
        _, s_pk = crypto.x25519_keypair()  # the advertisement format carries two keys; CKKS uses only c_pk
        self._c_pk = c_pk
        sig = crypto.sign(self._identity, advert_payload(spec.session_id, spec.round_index, self.id, c_pk, s_pk))
        self.state = "advertised"
        return [encode(AdvertiseKeys(spec.session_id, spec.round_index, self.id, c_pk, s_pk, sig))]

    def receive(self, data: bytes, now: float = 0.0) -> list[bytes]:
        """Consume one server message; return the reply (possibly empty). Any violation aborts."""
        if self.state in ("aborted", "done"):
            raise ProtocolAbortedError(f"client {self.id} is {self.state} and accepts no further messages")
        handlers = {"advertised": (KeysBroadcast, self._on_keys), "keyed": (ContextHandoff, self._on_handoff),
                    "uploaded": (ConsistencyRequest, self._on_confirm), "confirmed": (DecryptRequest, self._on_decrypt)}
        expected, handler = handlers.get(self.state, (None, None))
        try:
            if expected is None:
                raise ProtocolError(f"client {self.id}: no message expected in state {self.state!r}")
            msg = decode_expected(data, self.spec, (expected,), f"client {self.id} in state {self.state!r}",
                                  "replayed or reordered message", UnexpectedMessageError)
            if msg.recipient != self.id:
                raise ProtocolError(f"client {self.id} received a message addressed to client {msg.recipient}")
            return handler(msg)
        except Exception:
            self._abort()
            raise

    def _verify_entry(self, e: KeyEntry) -> None:
        spec = self.spec
        if not 0 <= e.sender < spec.n_clients:
            raise ProtocolError(f"client {self.id}: key advertisement of unknown client {e.sender}")
        crypto.verify(spec.identity_keys[e.sender], e.signature,
                      advert_payload(spec.session_id, spec.round_index, e.sender, e.c_pk, e.s_pk),
                      what=f"client {e.sender}'s advertised key")

    # -- stage handlers
    def _on_keys(self, msg: KeysBroadcast) -> list[bytes]:
        spec, kh = self.spec, self.spec.key_holder
        senders = [e.sender for e in msg.entries]
        if len(set(senders)) != len(senders):
            raise ProtocolError(f"client {self.id}: duplicate key advertisement in broadcast")
        if not self.is_key_holder:
            if senders != [kh]:
                raise ProtocolError(f"client {self.id}: expected the key holder's ({kh}) advertisement only, got {senders}")
            self._verify_entry(msg.entries[0])
            self._holder_pk = msg.entries[0].c_pk
            self.state = "keyed"
            return []
        out = []
        ctx = _make_context(spec.params)
        out.append(encode(PublicContext(spec.session_id, spec.round_index, self.id, _public_bytes(ctx))))
        secret = _secret_bytes(ctx)
        for e in msg.entries:
            if e.sender == self.id:
                if e.c_pk != self._c_pk:
                    raise AuthenticationError(f"client {self.id}: the broadcast carries a key it never advertised")
                continue
            self._verify_entry(e)
            if e.c_pk == self._c_pk:
                raise AuthenticationError(f"client {self.id}: client {e.sender} advertised the key holder's own key")
            key = channel_key(crypto.x25519_shared(self._c_sk, e.c_pk), spec.session_id, spec.round_index, self.id, e.sender)
            ct = crypto.aead_encrypt(key, secret, share_aad(spec.session_id, spec.round_index, self.id, e.sender))
            out.append(encode(ContextHandoff(spec.session_id, spec.round_index, self.id, e.sender, ct)))
        self._c_sk = None
        self._ctx = ctx
        out.append(self._upload())
        return out

    def _on_handoff(self, msg: ContextHandoff) -> list[bytes]:
        spec, kh = self.spec, self.spec.key_holder
        if msg.sender != kh:
            raise ProtocolError(f"client {self.id}: key handoff from client {msg.sender}, not the key holder {kh}")
        key = channel_key(crypto.x25519_shared(self._c_sk, self._holder_pk), spec.session_id, spec.round_index, kh, self.id)
        secret = crypto.aead_decrypt(key, msg.ciphertext, share_aad(spec.session_id, spec.round_index, kh, self.id),
                                     what=f"client {self.id}: CKKS key handoff")
        try:
            ctx = ts.context_from(secret)
        except (ValueError, RuntimeError, TypeError) as exc:
            raise DecodeError(f"client {self.id}: the handed-off CKKS context does not load ({exc})") from None
        if not ctx.is_private() or ctx.global_scale != 2.0 ** spec.params.scale_bits:
            raise ProtocolError(f"client {self.id}: the handed-off context lacks the secret key or has the wrong scale")
        self._c_sk = None
        self._ctx = ctx
        return [self._upload()]

    def _upload(self) -> bytes:
        spec = self.spec
        c = spec.clip
        x = self._update
        self.clipped = int(np.count_nonzero(np.abs(x) > c))
        x = np.clip(x, -c, c) * self._weight
        chunks = encrypt_vector(self._ctx, x, spec.params.slots)
        self._digest = upload_digest(chunks)
        sig = crypto.sign(self._identity, input_payload(spec.session_id, spec.round_index, self.id, self._digest))
        self._update = None
        self.state = "uploaded"
        return encode(SignedInput(spec.session_id, spec.round_index, self.id, chunks, sig))

    def _on_confirm(self, msg: ConsistencyRequest) -> list[bytes]:
        """Sign the survivor set U — once per round, and only a U that contains this client's input."""
        spec = self.spec
        surv = tuple(msg.survivors)
        if any(not 0 <= u < spec.n_clients for u in surv):
            raise ProtocolError(f"client {self.id}: survivor list names unknown clients")
        if self.id not in surv:
            raise ProtocolAbortedError(f"client {self.id} is declared dropped; it confirms no survivor set")
        if len(surv) < spec.min_survivors:
            raise AuthenticationError(f"client {self.id}: survivor set of {len(surv)} clients is below "
                                      f"min_survivors = {spec.min_survivors}; refused")
        self._survivors = surv
        self.state = "confirmed"
        sig = crypto.sign(self._identity, survivors_payload(spec.session_id, spec.round_index, surv))
        return [encode(ConsistencySignature(spec.session_id, spec.round_index, self.id, sig))]

    def _on_decrypt(self, msg: DecryptRequest) -> list[bytes]:
        spec, p = self.spec, self.spec.params
        surv = tuple(msg.survivors)
        if surv != self._survivors:
            raise AuthenticationError(f"client {self.id}: asked to decrypt over a survivor set other than the one it "
                                      "confirmed; refused")
        signers = [e.signer for e in msg.signatures]
        if len(set(signers)) != len(signers) or not set(signers) <= set(surv):
            raise ProtocolError(f"client {self.id}: survivor-set signatures are duplicated or from non-survivors")
        payload = survivors_payload(spec.session_id, spec.round_index, surv)
        for e in msg.signatures:
            crypto.verify(spec.identity_keys[e.signer], e.signature, payload, what=f"client {e.signer}'s survivor set")
        if len(signers) < spec.signatures_needed:
            raise AuthenticationError(f"client {self.id}: only {len(signers)} clients confirmed the survivor set, "
                                      f"{spec.signatures_needed} required; refused")
        if tuple(d.sender for d in msg.digests) != surv:
            raise AuthenticationError(f"client {self.id}: signed digests do not match the survivor list; refused")
        digests = {}
        for d in msg.digests:
            crypto.verify(spec.identity_keys[d.sender], d.signature,
                          input_payload(spec.session_id, spec.round_index, d.sender, d.digest),
                          what=f"client {d.sender}'s CKKS upload")
            digests[d.sender] = d.digest
        if digests[self.id] != self._digest:
            raise AuthenticationError(f"client {self.id}: the digest of its own upload was replaced; refused")
        if spec.verify == "recompute":
            if tuple(e.sender for e in msg.uploads) != surv:
                raise AuthenticationError(f"client {self.id}: relayed uploads do not match the survivor list; refused")
            sums = None
            for e in msg.uploads:
                if len(e.chunks) != p.n_ciphertexts or upload_digest(e.chunks) != digests[e.sender]:
                    raise AuthenticationError(f"client {self.id}: client {e.sender}'s relayed upload does not match "
                                              "its signed digest; refused")
                sums = _add_into(sums, _vectors(self._ctx, e.chunks, f"upload of client {e.sender}"),
                                 f"upload of client {e.sender}")
            mine = tuple(v.serialize() for v in sums)
            if mine != tuple(msg.chunks):
                raise AuthenticationError(f"client {self.id}: the server's claimed sum is not the homomorphic sum of "
                                          "the signed uploads; refused to decrypt")
            vecs = sums
        else:
            if msg.uploads:
                raise ProtocolError(f"client {self.id}: uploads relayed in verify='signatures' mode")
            if len(msg.chunks) != p.n_ciphertexts:
                raise ProtocolError(f"client {self.id}: {len(msg.chunks)} sum ciphertexts, expected {p.n_ciphertexts}")
            vecs = _vectors(self._ctx, msg.chunks, "encrypted sum")
        parts = [np.asarray(v.decrypt(), dtype=np.float64) for v in vecs]
        out = randomized_round(np.concatenate(parts)[:p.length], p.step)
        self._ctx = None
        self.state = "done"
        return [encode(DecryptedSum(spec.session_id, spec.round_index, self.id, p.step, out.astype("<f8").tobytes()))]

    # -- persistence between messages (a fresh process per message, e.g. a Flower ClientApp)
    def dump(self) -> bytes:
        """Serialise the live state (everything but spec and identity key) to bytes.

        The X25519 key is stored raw and the CKKS context **with its secret key**: the bytes must stay
        on the client (Flower keeps them in the SuperNode's per-run state on the site).
        """
        blobs = {}
        if self._c_sk is not None:
            blobs["c_sk"] = crypto.x25519_private_bytes(self._c_sk)
        if self._ctx is not None:
            blobs["ctx"] = _secret_bytes(self._ctx)
        if self._update is not None:
            blobs["update"] = self._update.astype("<f8").tobytes()
        for k in ("_c_pk", "_holder_pk", "_digest"):
            if getattr(self, k, None) is not None:
                blobs[k] = getattr(self, k)
        head = json.dumps({"v": _STATE_VERSION, "id": self.id, "state": self.state, "weight": self._weight,
                           "clipped": self.clipped, "survivors": self._survivors,
                           "blobs": [[k, len(b)] for k, b in blobs.items()]}).encode()
        return _STATE_MAGIC + struct.pack("<I", len(head)) + head + b"".join(blobs.values())

    @classmethod
    def load(cls, blob: bytes, spec: CKKSRoundSpec, identity_key) -> "CKKSClient":
        """Rebuild the client saved by :meth:`dump` for ``spec`` with its identity key (strict)."""
        blob = bytes(blob)
        try:
            if not blob.startswith(_STATE_MAGIC):
                raise DecodeError("stored CKKS client state has a bad magic")
            n = struct.unpack_from("<I", blob, len(_STATE_MAGIC))[0]
            pos = len(_STATE_MAGIC) + 4
            head = json.loads(blob[pos:pos + n].decode())
            pos += n
            if head.get("v") != _STATE_VERSION:
                raise DecodeError(f"stored CKKS client state version {head.get('v')!r} is not {_STATE_VERSION}")
            blobs = {}
            for k, ln in head["blobs"]:
                if pos + ln > len(blob):
                    raise DecodeError("stored CKKS client state is truncated")
                blobs[k] = blob[pos:pos + ln]
                pos += ln
            if pos != len(blob):
                raise DecodeError("stored CKKS client state has trailing bytes")
        except (ValueError, KeyError, TypeError, struct.error) as exc:
            raise DecodeError(f"malformed stored CKKS client state: {exc}") from None
        c = cls.__new__(cls)
        c.spec, c._identity = spec, identity_key
        try:
            c.id, c.state, c._weight = int(head["id"]), str(head["state"]), float(head["weight"])
            c.clipped = int(head["clipped"])
            c._survivors = None if head.get("survivors") is None else tuple(int(u) for u in head["survivors"])
            c._c_sk = crypto.x25519_private_from_bytes(blobs["c_sk"]) if "c_sk" in blobs else None
            c._update = np.frombuffer(blobs["update"], dtype="<f8").astype(np.float64) if "update" in blobs else None
        except (ValueError, KeyError, TypeError) as exc:
            raise DecodeError(f"malformed stored CKKS client state: {exc}") from None
        if c.state not in _CLIENT_STATES or not 0 <= c.id < spec.n_clients:
            raise DecodeError(f"stored CKKS client state is for client {c.id} in state {c.state!r}, not a client of "
                              f"this round's {spec.n_clients} in one of {', '.join(_CLIENT_STATES)}")
        if "ctx" in blobs:
            try:  # TenSEAL raises ValueError / RuntimeError (SEAL's std::exception) on corrupt or foreign bytes
                c._ctx = ts.context_from(blobs["ctx"])
            except (ValueError, RuntimeError, TypeError) as exc:
                raise DecodeError(f"stored CKKS client state: the TenSEAL context does not load ({exc}); the site's "
                                  "stored round state is corrupt — the round cannot continue on this site") from None
        else:
            c._ctx = None
        for k in ("_c_pk", "_holder_pk", "_digest"):
            setattr(c, k, blobs.get(k))
        return c


# ================================================================================================ server


class CKKSServer:
    """The CKKS server state machine. No I/O and no sleeping: the caller passes ``now``.

    ``receive(data, now)`` and ``tick(now)`` return ``[(recipient, bytes), …]``. A stage closes when
    every expected message has arrived or, on ``tick``, when its deadline passed. Messages the server
    rejects (malformed, bad signature, duplicate, stale, from an unexpected client) raise a
    :class:`ProtocolError` / :class:`DecodeError` / :class:`AuthenticationError` and are discarded
    without aborting the round. A round that cannot complete raises :class:`ProtocolAbortedError`
    (:class:`ProtocolTimeoutError` when a deadline caused it). The server only ever holds the public
    context (:func:`load_public_context` refuses a private one).
    """

    def __init__(self, spec: CKKSRoundSpec, now: float = 0.0):
        self.spec = spec
        self.stage = "advertise"
        self.deadline = now + spec.timeout("advertise")
        self.expected = set(range(spec.n_clients))
        self.received: dict = {}
        self.bytes_in: dict[int, int] = {}
        self.bytes_out: dict[int, int] = {}
        self.dropped_at: dict[str, tuple] = {}
        self.result: np.ndarray | None = None
        self.survivors: tuple = ()
        self.decryptor: int | None = None
        self.error: Exception | None = None
        self.sum_seconds = 0.0
        self._adverts: dict[int, AdvertiseKeys] = {}
        self._ctx = None
        self._handoffs: dict[int, ContextHandoff] = {}
        self._inputs: dict[int, SignedInput] = {}
        self._digests: dict[int, bytes] = {}
        self._sum: list | None = None
        self._candidates: list = []
        self._confirmations: dict[int, bytes] = {}

    @property
    def done(self) -> bool:
        return self.stage in ("done", "aborted")

    def receive(self, data: bytes, now: float = 0.0) -> list[tuple[int, bytes]]:
        if self.done:
            raise ProtocolError(f"server is {self.stage}; message discarded")
        allowed = {"advertise": (AdvertiseKeys,), "handoff": (PublicContext, ContextHandoff, SignedInput),
                   "input": (SignedInput,), "confirm": (ConsistencySignature,), "decrypt": (DecryptedSum,)}[self.stage]
        msg = decode_expected(data, self.spec, allowed, f"server in stage {self.stage!r}",
                              "stale, replayed or reordered; discarded", UnexpectedMessageError)
        u = msg.sender
        if not 0 <= u < self.spec.n_clients:
            raise ProtocolError(f"server: message from unknown client {u}; discarded")
        getattr(self, "_on_" + type(msg).__name__)(msg)
        self.bytes_in[u] = self.bytes_in.get(u, 0) + len(data)
        if self._stage_complete():
            return self._close(now, timed_out=False)
        return []

    def tick(self, now: float) -> list[tuple[int, bytes]]:
        """Close the current stage if its deadline has passed."""
        if self.done or now < self.deadline:
            return []
        return self._close(now, timed_out=True)

    # -- message validation (reject without aborting)
    def _on_AdvertiseKeys(self, msg):
        spec = self.spec
        if msg.sender in self._adverts:
            raise ProtocolError(f"server: duplicate AdvertiseKeys from client {msg.sender} (replay); discarded")
        crypto.verify(spec.identity_keys[msg.sender], msg.signature,
                      advert_payload(spec.session_id, spec.round_index, msg.sender, msg.c_pk, msg.s_pk),
                      what=f"client {msg.sender}'s advertised key")
        self._adverts[msg.sender] = msg

    def _on_PublicContext(self, msg):
        if msg.sender != self.spec.key_holder or self._ctx is not None:
            raise ProtocolError(f"server: unexpected PublicContext from client {msg.sender}; discarded")
        try:
            ctx = load_public_context(msg.context)
        except AuthenticationError:
            self._fail("the key holder sent a context holding the secret key; the server discarded it", False)
        except (ValueError, RuntimeError, TypeError) as exc:
            raise DecodeError(f"server: public context does not load ({exc}); discarded") from None
        if ctx.global_scale != 2.0 ** self.spec.params.scale_bits:
            raise ProtocolError("server: public context has the wrong scale; discarded")
        self._ctx = ctx

    def _on_ContextHandoff(self, msg):
        kh = self.spec.key_holder
        if msg.sender != kh or msg.recipient == kh or msg.recipient not in self._adverts:
            raise ProtocolError(f"server: key handoff {msg.sender} → {msg.recipient} is not expected; discarded")
        if msg.recipient in self._handoffs:
            raise ProtocolError(f"server: duplicate key handoff for client {msg.recipient}; discarded")
        self._handoffs[msg.recipient] = msg

    def _on_SignedInput(self, msg):
        spec, u = self.spec, msg.sender
        holders = {spec.key_holder} | (set(self._handoffs) if self.stage == "input" else set())
        if u not in holders:
            raise ProtocolError(f"server: client {u} holds no key in stage {self.stage!r}; upload discarded")
        if u in self._inputs:
            raise ProtocolError(f"server: duplicate upload from client {u} (replay); discarded")
        if self._ctx is None:
            raise ProtocolError(f"server: upload from client {u} before the public context; discarded")
        if len(msg.chunks) != spec.params.n_ciphertexts:
            raise DecodeError(f"server: client {u} uploaded {len(msg.chunks)} ciphertexts, expected "
                              f"{spec.params.n_ciphertexts}; discarded")
        digest = upload_digest(msg.chunks)
        crypto.verify(spec.identity_keys[u], msg.signature, input_payload(spec.session_id, spec.round_index, u, digest),
                      what=f"client {u}'s CKKS upload")
        t0 = time.perf_counter()
        vecs = _vectors(self._ctx, msg.chunks, f"server: upload of client {u}")
        self._sum = _add_into(self._sum, vecs, f"server: upload of client {u}")
        self.sum_seconds += time.perf_counter() - t0
        self._inputs[u] = msg
        self._digests[u] = digest

    def _on_ConsistencySignature(self, msg):
        spec, u = self.spec, msg.sender
        if u not in self.expected:
            raise ProtocolError(f"server: survivor-set signature from client {u}, not a survivor; discarded")
        if u in self._confirmations:
            raise ProtocolError(f"server: duplicate survivor-set signature from client {u} (replay); discarded")
        crypto.verify(spec.identity_keys[u], msg.signature, survivors_payload(spec.session_id, spec.round_index,
                                                                               self.survivors),
                      what=f"client {u}'s survivor set")
        self._confirmations[u] = msg.signature

    def _on_DecryptedSum(self, msg):
        p = self.spec.params
        if msg.sender != self.decryptor:
            raise ProtocolError(f"server: DecryptedSum from client {msg.sender}, asked client {self.decryptor}; discarded")
        if msg.step != p.step or len(msg.data) != 8 * p.length:
            raise DecodeError(f"server: decrypted sum of client {msg.sender} has the wrong step or size; discarded")
        out = np.frombuffer(msg.data, dtype="<f8").astype(np.float64)
        if not np.all(np.isfinite(out)):
            raise DecodeError(f"server: decrypted sum of client {msg.sender} is not finite; discarded")
        self.result = out

    def _stage_complete(self) -> bool:
        kh = self.spec.key_holder
        if self.stage == "advertise":
            return set(self._adverts) >= self.expected
        if self.stage == "handoff":
            return self._ctx is not None and set(self._handoffs) >= set(self._adverts) - {kh} and kh in self._inputs
        if self.stage == "input":
            return set(self._inputs) >= self.expected
        if self.stage == "confirm":
            return set(self._confirmations) >= self.expected
        return self.result is not None

    # -- stage transitions
    def _fail(self, reason: str, timed_out: bool):
        self.stage = "aborted"
        self._inputs, self._sum, self._handoffs = {}, None, {}
        err = (ProtocolTimeoutError if timed_out else ProtocolAbortedError)(
            f"CKKS round {self.spec.round_index} aborted, nothing decrypted: {reason}")
        self.error = err
        raise err

    def _send(self, out: list, rid: int, msg) -> None:
        data = encode(msg)
        self.bytes_out[rid] = self.bytes_out.get(rid, 0) + len(data)
        out.append((rid, data))

    def _advance(self, stage: str, now: float, expected: set, got: set) -> None:
        self.dropped_at[self.stage] = tuple(sorted(self.expected - got))
        self.stage = stage
        self.deadline = now + self.spec.timeout(stage)
        self.expected = set(expected)

    def _decrypt_request(self, out: list, now: float) -> None:
        spec = self.spec
        d = self._candidates.pop(0)
        self.decryptor = d
        surv = self.survivors
        sigs = tuple(SignatureEntry(u, s) for u, s in sorted(self._confirmations.items()))
        digests = tuple(InputDigest(u, self._digests[u], self._inputs[u].signature) for u in surv)
        uploads = tuple(InputEntry(u, self._inputs[u].chunks) for u in surv) if spec.verify == "recompute" else ()
        self.expected = {d}
        self.deadline = now + spec.timeout("decrypt")
        self._send(out, d, DecryptRequest(spec.session_id, spec.round_index, d, surv, sigs, digests, uploads,
                                          self._sum_chunks))

    def _close(self, now: float, timed_out: bool) -> list[tuple[int, bytes]]:
        spec, sid, rnd, kh = self.spec, self.spec.session_id, self.spec.round_index, self.spec.key_holder
        out: list = []
        if self.stage == "advertise":
            if kh not in self._adverts:
                self._fail(f"the key holder (client {kh}) dropped before generating the key; nothing was encrypted",
                           False)
            if len(self._adverts) < spec.min_survivors:
                self._fail(f"only {len(self._adverts)} clients advertised keys, min_survivors is {spec.min_survivors}",
                           timed_out)
            entries = tuple(KeyEntry(v, a.c_pk, a.s_pk, a.signature) for v, a in sorted(self._adverts.items()))
            self._advance("handoff", now, {kh}, set(self._adverts))
            self._send(out, kh, KeysBroadcast(sid, rnd, kh, entries))
        elif self.stage == "handoff":
            if self._ctx is None:
                self._fail(f"the key holder (client {kh}) dropped before handing off the key", False)
            a = self._adverts[kh]
            holder = (KeyEntry(kh, a.c_pk, a.s_pk, a.signature),)
            self._advance("input", now, ({kh} | set(self._handoffs)) - set(self._inputs), {kh} & set(self._adverts))
            for j, h in sorted(self._handoffs.items()):
                self._send(out, j, KeysBroadcast(sid, rnd, j, holder))
                self._send(out, j, h)
            if not self.expected:
                return out + self._close(now, timed_out=False)
        elif self.stage == "input":
            surv = tuple(sorted(self._inputs))
            if len(surv) < spec.min_survivors:
                self._fail(f"only {len(surv)} encrypted inputs arrived, min_survivors is {spec.min_survivors}", timed_out)
            t0 = time.perf_counter()
            self._sum_chunks = tuple(v.serialize() for v in self._sum)
            self.sum_seconds += time.perf_counter() - t0
            if can_decrypt(self._ctx, self._sum_chunks[0]):  # pragma: no cover - would mean the server holds the key
                self._fail("the server context decrypted a ciphertext", False)
            self.survivors = surv
            self._advance("confirm", now, set(surv), set(self._inputs))
            for u in surv:
                self._send(out, u, ConsistencyRequest(sid, rnd, u, surv))
        elif self.stage == "confirm":
            signers = sorted(self._confirmations)
            self.dropped_at["confirm"] = tuple(sorted(self.expected - set(signers)))
            if len(signers) < spec.signatures_needed:
                self._fail(f"only {len(signers)} survivors confirmed the survivor set, {spec.signatures_needed} "
                           "required (quorum)", timed_out)
            self._candidates = ([kh] if kh in self._confirmations else []) + [u for u in signers if u != kh]
            self.stage = "decrypt"
            self._decrypt_request(out, now)
        elif self.stage == "decrypt":
            if self.result is not None:
                self.dropped_at["decrypt"] = tuple(sorted(self.dropped_at.get("decrypt", ())))
                self.stage = "done"
                self._inputs, self._sum, self._handoffs = {}, None, {}
            else:
                self.dropped_at["decrypt"] = tuple(sorted(set(self.dropped_at.get("decrypt", ())) | {self.decryptor}))
                if not self._candidates:
                    self._fail("no client holding the CKKS key survived to decrypt the sum", timed_out)
                self._decrypt_request(out, now)
        return out


# ================================================================================================ driver

_MSG_STAGE = {AdvertiseKeys: "advertise", PublicContext: "handoff", ContextHandoff: "handoff", SignedInput: "input",
              ConsistencySignature: "decrypt", DecryptedSum: "decrypt"}
CKKS_TAMPER_KINDS = ("ciphertext", "signature", "replay", "reorder", "wrong_round", "wrong_session", "truncate")


def _tamper(kind: str, outgoing: list, spec: CKKSRoundSpec) -> tuple[list, bool]:
    """Rewrite one server → client message according to fault ``kind``; returns (messages, applied)."""
    for k, (rid, data) in enumerate(outgoing):
        cls = peek_header(data)[0]
        new = list(outgoing)
        if kind == "signature" and cls is KeysBroadcast and rid == spec.key_holder:
            m = decode(data)
            victim = next((n for n, e in enumerate(m.entries) if e.sender != rid), None)
            if victim is None:
                continue
            ents = list(m.entries)
            ents[victim] = dataclasses.replace(ents[victim], c_pk=crypto.x25519_keypair()[1])
            new[k] = (rid, encode(dataclasses.replace(m, entries=tuple(ents))))
            return new, True
        if kind != "signature" and cls is ContextHandoff:
            m = decode(data)
            if kind == "ciphertext":
                ct = bytearray(m.ciphertext)
                ct[len(ct) // 2] ^= 1
                new[k] = (rid, encode(dataclasses.replace(m, ciphertext=bytes(ct))))
            elif kind == "wrong_round":
                new[k] = (rid, encode(dataclasses.replace(m, round_index=spec.round_index + 1)))
            elif kind == "wrong_session":
                new[k] = (rid, encode(dataclasses.replace(m, session_id=os.urandom(16))))
            elif kind == "truncate":
                new[k] = (rid, data[:-1])
            elif kind == "replay":
                new.insert(k + 1, (rid, data))
            elif kind == "reorder":  # a decrypt-stage message before the recipient's handoff
                first = next(n for n, (r, _) in enumerate(outgoing) if r == rid)
                new.insert(first, (rid, encode(DecryptRequest(spec.session_id, spec.round_index, rid, (), (), (), (), ()))))
            return new, True
    return outgoing, False


def run_ckks_round(params: CKKSParams, identity_private, identity_public, updates, weights, clip: float,
                   drop_at: dict | None = None, key_holder: int = 0, session_id: bytes | None = None,
                   round_index: int = 0, tamper: str | None = None, *, min_survivors: int | None = None,
                   verify: str = "recompute", timeouts: dict | None = None, quorum: int | None = None) -> dict:
    """One CKKS round in-process: the :class:`CKKSClient` / :class:`CKKSServer` machines over the codec.

    A thin driver: it routes encoded messages, drives a simulated clock (a stage that misses answers
    closes at its deadline via ``tick``) and injects dropouts and faults. ``drop_at`` maps client →
    stage in ``CKKS_STAGES``: from that stage on the client processes and sends nothing. Faults
    (``tamper``, one server → client message): ``ciphertext`` flips a byte of a ContextHandoff,
    ``signature`` swaps a client's key in the broadcast to the key holder, ``wrong_round`` /
    ``wrong_session`` / ``truncate`` rewrite a handoff, ``replay`` delivers a handoff twice,
    ``reorder`` delivers a DecryptRequest before a handoff. Any party's error ends the round. A client
    dropping at ``decrypt`` neither confirms the survivor set nor decrypts. ``min_survivors`` (None:
    ``min(2, n)``), ``quorum`` (None: majority), ``verify`` and ``timeouts`` go into the
    :class:`CKKSRoundSpec`.

    Returns a dict: ``total`` (None if aborted), ``survivors``, ``decryptor``, ``error``, ``timings``
    (seconds per stage, all parties, plus ``server_sum``), ``bytes_up``, ``bytes_down``, ``clipped``,
    ``dropped_at``, ``rejected``.
    """
    n = len(updates)
    if tamper is not None and tamper not in CKKS_TAMPER_KINDS:
        raise ConfigError(bad_value("tamper", tamper, f"use one of {', '.join(CKKS_TAMPER_KINDS)} or None"))
    drop_at = dict(drop_at or {})
    idx = {s: i for i, s in enumerate(CKKS_STAGES)}
    tmo = dict(CKKS_TIMEOUTS, **(timeouts or {}))
    spec = CKKSRoundSpec(session_id or os.urandom(16), round_index, n, key_holder, params, float(clip),
                         tuple(identity_public), min(2, n) if min_survivors is None else int(min_survivors), verify,
                         tuple(tmo.items()), int(quorum or 0))

    def alive(i, stage):
        s = drop_at.get(i)
        return s is None or idx[s] > idx[stage]

    timings = {s: 0.0 for s in CKKS_STAGES}
    bytes_up = {i: 0 for i in range(n)}
    bytes_down = {i: 0 for i in range(n)}
    result = dict(total=None, survivors=(), decryptor=None, error=None, timings=timings, bytes_up=bytes_up,
                  bytes_down=bytes_down, clipped={i: 0 for i in range(n)}, dropped_at={}, rejected=[])
    now = 0.0
    clients = [CKKSClient(spec, i, identity_private[i], updates[i], float(weights[i])) for i in range(n)]
    server = CKKSServer(spec, now)
    outgoing: list = []

    def upload(i, msgs):
        for data in msgs:
            if not alive(i, _MSG_STAGE[peek_header(data)[0]]):
                continue  # dropped: the message never leaves the client
            bytes_up[i] += len(data)
            try:
                outgoing.extend(server.receive(data, now))
            except SecureFedError as exc:
                if server.stage == "aborted":
                    raise
                result["rejected"].append(f"{type(exc).__name__}: {exc}")

    tampered = tamper is None
    try:
        t0 = time.perf_counter()
        for i in range(n):
            if alive(i, "advertise"):
                upload(i, clients[i].start(now))
        timings["advertise"] += time.perf_counter() - t0
        while not server.done:
            stage = "decrypt" if server.stage == "confirm" else server.stage  # confirming is part of decrypting
            t0 = time.perf_counter()
            if not outgoing:
                now = max(now, server.deadline)
                outgoing.extend(server.tick(now))
            else:
                batch, outgoing[:] = list(outgoing), []
                if not tampered:
                    batch, tampered = _tamper(tamper, batch, spec)
                for rid, data in batch:
                    bytes_down[rid] += len(data)
                    if alive(rid, server.stage if server.stage in idx else "decrypt"):  # confirm, done: decrypt
                        upload(rid, clients[rid].receive(data, now))
            timings[stage] += time.perf_counter() - t0
    except SecureFedError as exc:
        result["error"] = exc
    timings["server_sum"] = server.sum_seconds
    result["clipped"] = {i: c.clipped for i, c in enumerate(clients)}
    result["dropped_at"] = dict(server.dropped_at)
    if result["error"] is None:
        result.update(total=server.result.copy(), survivors=server.survivors, decryptor=server.decryptor)
    return result


class CKKSAggregator:
    """Secure sum under CKKS (TenSEAL): the server adds ciphertexts; a client key holder decrypts.

    Parameters
    ----------
    clip_range : float
        Required public bound c on |coordinate| (clipped, counted, warned), as for SecAgg.
    precision : float, default 1e-6
        Stated absolute precision of the released sum: the decryption is randomised-rounded to
        step = 2^⌊log2 precision⌋ (|error| < step·(1 + 2^−6), :func:`release_error_bound`).
    key_holder : int, default 0
        Index of the client that generates the key pair and hands the secret to the other clients.
    min_survivors : int or None, default None
        A decryptor refuses sums over fewer signed uploads (None: ``min(2, n)``).
    quorum : int or None, default None
        Survivor-set signatures a decryptor requires (None: a majority ⌊n/2⌋ + 1, which stops a
        malicious server from getting two different survivor sets decrypted in one round).
    verify : {"recompute", "signatures"}, default "recompute"
        What the decryptor checks before decrypting (see the module docstring): ``"recompute"``
        re-adds the signed uploads and refuses anything but their sum (sound against a malicious
        server, costs the decryptor one download of every upload); ``"signatures"`` checks only
        signatures and count (sound only against an honest-but-curious server).
    dropout, drop_stage, random_state
        Simulator hooks as for :class:`SecAggAggregator` (stages: ``advertise, handoff, input, decrypt``).
    """

    name = "ckks"

    def __init__(self, clip_range=None, *, precision: float = 1e-6, key_holder: int = 0, min_survivors=None,
                 quorum=None, verify: str = "recompute", dropout=None, drop_stage: str | None = None,
                 random_state=None):
        if clip_range is None or not np.isfinite(clip_range) or clip_range <= 0:
            raise ConfigError(bad_value("clip_range", clip_range, "CKKS needs a positive public bound on |update| "
                                        "coordinates, e.g. clip_range=1.0 for data scaled to [0, 1]"))
        if drop_stage is not None and drop_stage not in CKKS_STAGES:
            raise ConfigError(bad_value("drop_stage", drop_stage, f"use one of {', '.join(CKKS_STAGES)} or None"))
        if not (precision > 0):
            raise ConfigError(bad_value("precision", precision, "use a positive absolute precision, e.g. 1e-6"))
        if verify not in VERIFY_MODES:
            raise ConfigError(bad_value("verify", verify, f"use one of {', '.join(VERIFY_MODES)}"))
        self.clip_range, self.precision, self.key_holder = float(clip_range), float(precision), int(key_holder)
        self.min_survivors, self.quorum, self.verify = min_survivors, quorum, verify
        self.dropout, self.drop_stage, self.random_state = dropout, drop_stage, random_state
        self._rng = check_random_state(random_state)
        self.session_id = os.urandom(16)
        self._round = 0
        self._identity: dict[int, tuple] = {}

    def _identities(self, n: int):
        if n not in self._identity:
            keys = [crypto.ed25519_keypair() for _ in range(n)]
            self._identity[n] = (tuple(k for k, _ in keys), tuple(p for _, p in keys))
        return self._identity[n]

    def aggregate(self, updates, weights=None, *, round_index: int = 0) -> AggregateResult:
        """One CKKS round: the weighted sum over surviving clients, rounded to ``precision``."""
        from .aggregators import check_updates
        from .runner import dropout_schedule

        t0 = time.perf_counter()
        flat, w, shape = check_updates(updates, weights)
        n = len(flat)
        if not 0 <= self.key_holder < n:
            raise ConfigError(bad_value("key_holder", self.key_holder, f"use a client index in [0, {n})"))
        params = choose_ckks_parameters(flat[0].size, self.precision, float(w.sum()) * self.clip_range, n)
        sched = dropout_schedule(n, self.dropout, self.drop_stage, self._rng, CKKS_STAGES)
        priv, pub = self._identities(n)
        out = run_ckks_round(params, priv, pub, flat, w, self.clip_range, drop_at=sched, key_holder=self.key_holder,
                             session_id=self.session_id, round_index=self._round, verify=self.verify,
                             min_survivors=self.min_survivors, quorum=self.quorum)
        self._round += 1
        if out["error"] is not None:
            raise out["error"]
        surv = out["survivors"]
        clipped = int(sum(out["clipped"][i] for i in surv))
        warn_clipped(clipped, self.clip_range, "CKKSAggregator")
        up = [out["bytes_up"][i] for i in surv]
        return AggregateResult(
            total=out["total"].reshape(shape), survivors=tuple(int(i) for i in surv), weight_sum=float(w[list(surv)].sum()),
            protocol="ckks", clipped=clipped, bytes_up=int(np.mean(up)), bytes_down=int(sum(out["bytes_up"].values())),
            seconds=time.perf_counter() - t0,
            details=dict(round_index=round_index, params=params.as_dict(), precision=params.step,
                         decryptor=out.get("decryptor"), timings=out["timings"], scheduled_dropouts=sched,
                         verify=self.verify, dropped_at={k: list(v) for k, v in out["dropped_at"].items()},
                         bytes_to_clients=int(sum(out["bytes_down"].values()))))
