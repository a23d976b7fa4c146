"""CKKS secure sum with TenSEAL: the server adds ciphertexts it cannot decrypt.

Scheme: Cheon, Kim, Kim, Song, "Homomorphic Encryption for Arithmetic of Approximate Numbers",
ASIACRYPT 2017 (CKKS), via TenSEAL / Microsoft SEAL.

Roles and flow (all messages are :mod:`.messages` dataclasses through the strict codec):

1. ``advertise`` — every client advertises an Ed25519-signed X25519 key (``AdvertiseKeys``).
2. ``handoff`` — a designated **key holder** client generates the CKKS key pair. It sends the server a
   ``PublicContext`` (public key only; ``is_private() is False`` — tested) and each other client the full
   secret context in a ``ContextHandoff``: AES-256-GCM under HKDF(X25519) with AAD binding session,
   round, sender and recipient, after verifying the recipient's signed key — the server relays bytes
   it can neither read nor substitute.
3. ``input`` — each client clips, weights, batches its vector over ⌈d / slots⌉ ciphertexts and uploads
   ``EncryptedInput``; the server sums ciphertexts slot-wise.
4. ``decrypt`` — the key holder (or, if it dropped, the lowest-numbered surviving client that received
   the key) decrypts the sum and returns it **randomised-rounded to the stated precision**:
   ``⌊x/step + U⌋·step`` with U ~ U[0,1) from an AES-CTR keystream under an ``os.urandom`` key.
   Releasing raw CKKS decryptions leaks the secret key: Li & Micciancio, "On the Security of
   Homomorphic Encryption on Approximate Numbers", EUROCRYPT 2021, recover the key from the decryption
   noise. Randomised rounding to a step ≥ 2^6 × the CKKS error floods that noise (statistical distance
   ≤ error/step per coordinate) and makes the release unbiased with |error| < step.

Threat model (honest): the server alone learns only the sum. **The key holder and every client that
received the secret key can decrypt any single client's ciphertext**, so the server colluding with any
one of them learns every input — strictly weaker than SecAgg+'s "fewer than t colluders" guarantee.
There is no dropout recovery cost: dropped clients simply contribute no ciphertext.

Parameters (:func:`choose_ckks_parameters`) target 128-bit security using the
HomomorphicEncryption.org standard's maximal coefficient-modulus sizes for ternary secrets:
N = 4096 → 109 bits, 8192 → 218, 16384 → 438, 32768 → 881. The scale 2^s gives ``s = f + guard``
bits where step = 2^−f and guard covers the encoding/encryption noise of n summed ciphertexts; the data
modulus adds ⌈log2(max|sum|)⌉ + 2 bits so the sum cannot wrap (else :class:`OverflowRiskError`).
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass

import numpy as np
import tenseal as ts

from ..aggregation import AggregateResult
from ..errors import (AuthenticationError, ConfigError, OverflowRiskError, ProtocolAbortedError, ProtocolError,
                      SecureFedError, bad_value)
from . import crypto
from .messages import (AdvertiseKeys, ContextHandoff, DecryptedSum, EncryptedInput, EncryptedSum, PublicContext,
                       decode, encode)
from .quantize import check_random_state, warn_clipped
from .secagg import advert_payload, channel_key, share_aad

__all__ = ["CKKS_STAGES", "CKKSParams", "choose_ckks_parameters", "CKKSAggregator", "run_ckks_round",
           "randomized_round"]

CKKS_STAGES = ("advertise", "handoff", "input", "decrypt")
MAX_COEFF_BITS = {4096: 109, 8192: 218, 16384: 438, 32768: 881}


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
    """``⌊x/step + U⌋·step`` with U ~ U[0,1) from a secret AES-CTR keystream (unbiased, |error| < step).

    Floods the CKKS decryption noise before release (Li & Micciancio 2021). U is secret randomness:
    53-bit uniforms from AES-256-CTR under a fresh ``os.urandom`` key.
    """
    words = crypto.keystream_words(os.urandom(32), x.size, np.uint64)
    u = (words >> np.uint64(11)).astype(np.float64) * 2.0 ** -53
    return np.floor(x / step + u) * step


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


def run_ckks_round(params: CKKSParams, identity_private, identity_public, updates, weights, clip: float,
                   drop_at: dict | None = None, key_holder: int = 0, session_id: bytes | None = None,
                   round_index: int = 0, tamper: str | None = None) -> dict:
    """One CKKS secure-sum round in-process over the strict codec; returns a dict of outcomes.

    ``drop_at`` maps client → stage in ``CKKS_STAGES`` (sends nothing from that stage on). Faults
    (``tamper``): ``ciphertext`` flips a byte of a ContextHandoff, ``signature`` swaps a client's
    advertised key, ``wrong_round`` / ``wrong_session`` / ``truncate`` rewrite a handoff,
    ``replay`` delivers a handoff twice, ``reorder`` delivers an EncryptedSum to a client before its
    handoff. Returns keys ``total`` (None if aborted), ``survivors``, ``error``, ``timings``, ``bytes_up``,
    ``bytes_down``, ``clipped``.
    """
    import dataclasses

    n = len(updates)
    drop_at = dict(drop_at or {})
    sid = session_id or os.urandom(16)
    rnd = round_index
    idx = {s: i for i, s in enumerate(CKKS_STAGES)}

    def alive(i, stage):
        s = drop_at.get(i)
        return s is None or idx[s] > idx[stage]

    timings = {s: 0.0 for s in CKKS_STAGES}
    bytes_up = {i: 0 for i in range(n)}
    bytes_down = {i: 0 for i in range(n)}
    clipped = {i: 0 for i in range(n)}
    result = dict(total=None, survivors=(), error=None, timings=timings, bytes_up=bytes_up, bytes_down=bytes_down,
                  clipped=clipped)
    try:
        # advertise
        t0 = time.perf_counter()
        adverts, c_sks = {}, {}
        for i in range(n):
            if not alive(i, "advertise"):
                continue
            c_sk, c_pk = crypto.x25519_keypair()
            _, s_pk = crypto.x25519_keypair()
            c_sks[i] = c_sk
            sig = crypto.sign(identity_private[i], advert_payload(sid, rnd, i, c_pk, s_pk))
            data = encode(AdvertiseKeys(sid, rnd, i, c_pk, s_pk, sig))
            bytes_up[i] += len(data)
            adverts[i] = data
        if key_holder not in adverts:
            raise ProtocolAbortedError("the CKKS key holder dropped before generating the key; nothing was encrypted")
        if tamper == "signature":
            victim = min(j for j in adverts if j != key_holder)
            m = decode(adverts[victim])
            adverts[victim] = encode(dataclasses.replace(m, c_pk=crypto.x25519_keypair()[1]))
        timings["advertise"] += time.perf_counter() - t0
        # handoff (key holder generates the key, verifies adverts, encrypts the secret context per client)
        t0 = time.perf_counter()
        ctx = _make_context(params)
        pub = encode(PublicContext(sid, rnd, key_holder, _public_bytes(ctx)))
        secret = _secret_bytes(ctx)
        bytes_up[key_holder] += len(pub)
        handoffs = {}
        if alive(key_holder, "handoff"):
            for j, data in sorted(adverts.items()):
                if j == key_holder:
                    continue
                m = decode(data, session_id=sid, round_index=rnd, expected=AdvertiseKeys)
                crypto.verify(identity_public[j], m.signature, advert_payload(sid, rnd, j, m.c_pk, m.s_pk),
                              what=f"client {j}'s advertised key")
                key = channel_key(crypto.x25519_shared(c_sks[key_holder], m.c_pk), sid, rnd, key_holder, j)
                ct = crypto.aead_encrypt(key, secret, share_aad(sid, rnd, key_holder, j))
                h = encode(ContextHandoff(sid, rnd, key_holder, j, ct))
                bytes_up[key_holder] += len(h)
                handoffs[j] = h
        else:
            raise ProtocolAbortedError("the CKKS key holder dropped before handing off the key")
        server_ctx = load_public_context(decode(pub, session_id=sid, round_index=rnd, expected=PublicContext).context)
        holder_key = {key_holder: ctx}
        deliveries = sorted(handoffs.items())
        if tamper in ("ciphertext", "wrong_round", "wrong_session", "truncate", "replay", "reorder") and deliveries:
            j, h = deliveries[0]
            m = decode(h)
            if tamper == "ciphertext":
                ct = bytearray(m.ciphertext)
                ct[len(ct) // 2] ^= 1
                deliveries[0] = (j, encode(dataclasses.replace(m, ciphertext=bytes(ct))))
            elif tamper == "wrong_round":
                deliveries[0] = (j, encode(dataclasses.replace(m, round_index=rnd + 1)))
            elif tamper == "wrong_session":
                deliveries[0] = (j, encode(dataclasses.replace(m, session_id=os.urandom(16))))
            elif tamper == "truncate":
                deliveries[0] = (j, h[:-1])
            elif tamper == "replay":
                deliveries.insert(1, (j, h))
            elif tamper == "reorder":
                deliveries.insert(0, (j, encode(EncryptedSum(sid, rnd, j, (), ()))))
        for j, h in deliveries:
            bytes_down[j] += len(h)
            if not alive(j, "handoff"):
                continue
            m = decode(h, session_id=sid, round_index=rnd, expected=(ContextHandoff, EncryptedSum))
            if not isinstance(m, ContextHandoff):
                raise ProtocolError(f"client {j}: got {type(m).__name__} before its key handoff (reordered); aborted")
            if j in holder_key:
                raise ProtocolError(f"client {j}: second key handoff (replay); aborted")
            if m.sender != key_holder or m.recipient != j:
                raise ProtocolError(f"client {j}: handoff names the wrong parties")
            key = channel_key(crypto.x25519_shared(c_sks[j], decode(adverts[key_holder]).c_pk), sid, rnd, key_holder, j)
            holder_key[j] = ts.context_from(crypto.aead_decrypt(key, m.ciphertext, share_aad(sid, rnd, key_holder, j),
                                                                what=f"client {j}: CKKS key handoff"))
        timings["handoff"] += time.perf_counter() - t0
        # input
        t0 = time.perf_counter()
        uploads = {}
        for i in range(n):
            if i not in holder_key or not alive(i, "input"):
                continue
            x = np.asarray(updates[i], dtype=np.float64).ravel()
            over = np.abs(x) > clip
            clipped[i] = int(np.count_nonzero(over))
            x = np.clip(x, -clip, clip) * float(weights[i])
            data = encode(EncryptedInput(sid, rnd, i, encrypt_vector(holder_key[i], x, params.slots)))
            bytes_up[i] += len(data)
            uploads[i] = data
        if not uploads:
            raise ProtocolAbortedError("no encrypted input arrived")
        survivors = tuple(sorted(uploads))
        tin = time.perf_counter()
        total_ct = sum_ciphertexts(server_ctx, [decode(uploads[i], session_id=sid, round_index=rnd,
                                                       expected=EncryptedInput).chunks for i in survivors])
        if can_decrypt(server_ctx, total_ct[0]):  # pragma: no cover - would mean the server holds the key
            raise AuthenticationError("the server context decrypted a ciphertext; refused")
        timings["server_sum"] = time.perf_counter() - tin
        timings["input"] += time.perf_counter() - t0
        # decrypt
        t0 = time.perf_counter()
        decryptors = [i for i in survivors if i in holder_key and alive(i, "decrypt")]
        decryptors.sort(key=lambda i: (i != key_holder, i))
        if not decryptors:
            raise ProtocolAbortedError("no client holding the CKKS key survived to decrypt the sum")
        dec = decryptors[0]
        req = encode(EncryptedSum(sid, rnd, dec, survivors, total_ct))
        bytes_down[dec] += len(req)
        m = decode(req, session_id=sid, round_index=rnd, expected=EncryptedSum)
        out = decrypt_sum(holder_key[dec], m.chunks, params.length, params.step)
        resp = encode(DecryptedSum(sid, rnd, dec, params.step, out.tobytes()))
        bytes_up[dec] += len(resp)
        r = decode(resp, session_id=sid, round_index=rnd, expected=DecryptedSum)
        timings["decrypt"] += time.perf_counter() - t0
        result.update(total=np.frombuffer(r.data, dtype=np.float64).copy(), survivors=survivors, decryptor=dec)
    except SecureFedError as exc:
        result["error"] = exc
    return result


class CKKSAggregator:
    """Secure sum under CKKS (TenSEAL): the server adds ciphertexts; a client key holder decrypts.

    Parameters
    ----------
    clip_range : float
        Required public bound c on |coordinate| (clipped, counted, warned), as for SecAgg.
    precision : float, default 1e-6
        Stated absolute precision of the released sum: the decryption is randomised-rounded to
        step = 2^⌈log2 precision⌉ (|error| < step).
    key_holder : int, default 0
        Index of the client that generates the key pair and hands the secret to the other clients.
    dropout, drop_stage, random_state
        Simulator hooks as for :class:`SecAggAggregator` (stages: ``advertise, handoff, input, decrypt``).
    """

    name = "ckks"

    def __init__(self, clip_range=None, *, precision: float = 1e-6, key_holder: int = 0, dropout=None,
                 drop_stage: str | None = None, random_state=None):
        if clip_range is None or not np.isfinite(clip_range) or clip_range <= 0:
            raise ConfigError(bad_value("clip_range", clip_range, "CKKS needs a positive public bound on |update| "
                                        "coordinates, e.g. clip_range=1.0 for data scaled to [0, 1]"))
        if drop_stage is not None and drop_stage not in CKKS_STAGES:
            raise ConfigError(bad_value("drop_stage", drop_stage, f"use one of {', '.join(CKKS_STAGES)} or None"))
        if not (precision > 0):
            raise ConfigError(bad_value("precision", precision, "use a positive absolute precision, e.g. 1e-6"))
        self.clip_range, self.precision, self.key_holder = float(clip_range), float(precision), int(key_holder)
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
                             session_id=self.session_id, round_index=self._round)
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
                         bytes_to_clients=int(sum(out["bytes_down"].values()))))
