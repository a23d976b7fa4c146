"""In-process CKKS round over :func:`..machine.drive_round` (the driver SecAgg+ uses too), with fault kinds."""

from __future__ import annotations

import dataclasses
import os

from ...errors import ConfigError, bad_value
from .. import crypto
from ..machine import RoundOutcome, drive_round
from ..messages import (
    AdvertiseKeys,
    ConsistencySignature,
    ContextHandoff,
    DecryptedSum,
    DecryptRequest,
    KeysBroadcast,
    PublicContext,
    SignedInput,
    decode,
    encode,
    peek_header,
)
from .machines import CKKSClient, CKKSServer
from ..task import NO_TASK
from .params import CKKS_STAGES, CKKS_TIMEOUTS, FLOOD_BITS, CKKSParams, CKKSRoundSpec

__all__ = ["CKKS_TAMPER_KINDS", "MESSAGE_STAGE", "run_ckks_round", "ckks_tamper_intercept"]

CKKS_TAMPER_KINDS = ("ciphertext", "signature", "replay", "reorder", "wrong_round", "wrong_session", "truncate")
#: CKKS client message → the client stage it belongs to (dropout schedules)
MESSAGE_STAGE = {
    AdvertiseKeys: "advertise",
    PublicContext: "handoff",
    ContextHandoff: "handoff",
    SignedInput: "input",
    ConsistencySignature: "decrypt",
    DecryptedSum: "decrypt",
}


def ckks_tamper_intercept(kind: str, spec: CKKSRoundSpec):
    """Fault ``kind`` on one server → client message: ``ciphertext`` flips a byte of a ContextHandoff,
    ``signature`` swaps a fallback's key in the broadcast to the key holder, ``wrong_round`` / ``wrong_session``
    / ``truncate`` rewrite a handoff, ``replay`` delivers a handoff twice, ``reorder`` delivers a DecryptRequest
    before a handoff. The client that gets it refuses it (typed error) and is treated as dropped, or leaves the
    peer out; the round completes over the others or aborts with nothing decrypted."""
    if kind not in CKKS_TAMPER_KINDS:
        raise ConfigError(bad_value("tamper", kind, f"use one of {', '.join(CKKS_TAMPER_KINDS)} or None"))
    state = {"done": False}

    def intercept(direction, rid, data):
        if state["done"] or direction != "down":
            return [data]
        cls = peek_header(data)[0]
        if kind == "signature" and cls is KeysBroadcast and rid == spec.key_holder:
            m = decode(data)
            victim = next((k for k, e in enumerate(m.entries) if e.sender != rid), None)
            if victim is None:
                return [data]
            state["done"] = True
            ents = list(m.entries)
            ents[victim] = dataclasses.replace(ents[victim], c_pk=crypto.x25519_keypair()[1])
            return [encode(dataclasses.replace(m, entries=tuple(ents)))]
        if kind != "signature" and cls is ContextHandoff:
            state["done"] = True
            m = decode(data)
            if kind == "ciphertext":
                ct = bytearray(m.ciphertext)
                ct[len(ct) // 2] ^= 1
                return [encode(dataclasses.replace(m, ciphertext=bytes(ct)))]
            if kind == "wrong_round":
                return [encode(dataclasses.replace(m, round_index=spec.round_index + 1))]
            if kind == "wrong_session":
                return [encode(dataclasses.replace(m, session_id=os.urandom(16)))]
            if kind == "truncate":
                return [data[:-1]]
            if kind == "replay":
                return [data, data]
            early = encode(DecryptRequest(spec.session_id, spec.round_index, rid, (), (), (), (), ()))
            return [early, data]  # reorder
        return [data]

    return intercept


def run_ckks_round(
    params: CKKSParams,
    identity_private,
    identity_public,
    updates,
    weights,
    clip: float,
    drop_at: dict | None = None,
    key_holder: int = 0,
    session_id: bytes | None = None,
    round_index: int = 0,
    tamper: str | None = None,
    *,
    min_survivors: int | None = None,
    verify: str = "recompute",
    timeouts: dict | None = None,
    quorum: int | None = None,
    max_abs_sum: float | None = None,
    fallbacks=None,
    flood_bits: int = FLOOD_BITS,
    intercept=None,
    clients=None,
    task_digest: bytes = NO_TASK,
) -> RoundOutcome:
    """One CKKS round in-process: the :class:`CKKSClient` / :class:`CKKSServer` machines over the codec.

    ``drop_at`` maps client → stage in ``CKKS_STAGES`` (from that stage on the client processes and sends
    nothing; a client dropping at ``decrypt`` neither confirms the survivor set nor decrypts). A client that
    raises is dropped. ``min_survivors`` (None: ``min(2, n)``), ``quorum`` (None: majority), ``verify``,
    ``timeouts``, ``max_abs_sum`` (None: Σ weights × clip), ``fallbacks``, ``flood_bits`` and ``task_digest`` go into
    the :class:`CKKSRoundSpec`. ``tamper`` / ``intercept`` inject faults; ``clients`` replaces the client machines.
    Returns a :class:`RoundOutcome` (``result`` / ``total``: the released sum; ``decryptor``).
    """
    n = len(updates)
    tmo = dict(CKKS_TIMEOUTS, **(timeouts or {}))
    if max_abs_sum is None:
        max_abs_sum = max(float(sum(float(w) for w in weights)) * float(clip), float(clip))
    spec = CKKSRoundSpec(
        session_id or os.urandom(16),
        round_index,
        n,
        key_holder,
        params,
        float(clip),
        tuple(identity_public),
        min(2, n) if min_survivors is None else int(min_survivors),
        verify,
        tuple(tmo.items()),
        int(quorum or 0),
        float(max_abs_sum),
        int(flood_bits),
        None if fallbacks is None else tuple(fallbacks),
        task_digest,
    )
    if tamper is not None:
        if intercept is not None:
            raise ConfigError(bad_value("tamper", tamper, "give either tamper or intercept"))
        intercept = ckks_tamper_intercept(tamper, spec)
    if clients is None:
        clients = [CKKSClient(spec, i, identity_private[i], updates[i], float(weights[i])) for i in range(n)]
    server = CKKSServer(spec, 0.0)
    out = drive_round(server, clients, MESSAGE_STAGE, CKKS_STAGES, drop_at=drop_at, intercept=intercept)
    out.timings["server_sum"] = {"clients": 0.0, "server": server.sum_seconds}
    if out.result is not None:
        out.result = out.result.copy()
    return out
