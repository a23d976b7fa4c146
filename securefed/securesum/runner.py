"""In-process SecAgg+ round: the real state machines over the byte codec, with dropouts and faults.

Used by :class:`securefed.securesum.SecAggAggregator` and :func:`securefed.securesum.simulate`. It is a thin
layer over the one round driver :func:`.machine.drive_round` (shared with CKKS): encoded bytes between the
parties (byte counts are what a transport would carry), a simulated clock (a stage missing answers closes at
its deadline, nothing sleeps), a client that raises is dropped from then on, a message whose sender field
names another client is dropped by the relay.

A client "dropping at stage S" sends nothing from stage S on (``STAGES`` order). Fault kinds
(``TAMPER_KINDS``) rewrite one server → client message of the lowest-numbered client that gets one; the
client refuses it with a typed error and is treated as dropped (or, for a bad entry about a peer, leaves
that peer out) — the round then completes over the others with their exact sum, or aborts with nothing
revealed when too few are left. Never a wrong sum:

=================  ==========================================================================  ======================
kind               what happens                                                                the client's error
=================  ==========================================================================  ======================
``ciphertext``     one byte of a share ciphertext flipped in ForwardedShares                    (dealer left out)
``signature``      the server swaps a neighbour's mask key in KeysBroadcast (forged signature)  (neighbour left out)
``replay``         KeysBroadcast delivered a second time                                        UnexpectedMessageError
``reorder``        a later-stage message (ConsistencyRequest) arrives before KeysBroadcast      UnexpectedMessageError
``wrong_round``    KeysBroadcast re-encoded for round + 1                                       DecodeError
``wrong_session``  KeysBroadcast re-encoded for another session                                 DecodeError
``truncate``       KeysBroadcast with its last byte cut                                         DecodeError
=================  ==========================================================================  ======================
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np

from ..errors import ConfigError, bad_value
from . import crypto
from .machine import RoundOutcome, drive_round
from .messages import (
    AdvertiseKeys,
    ConsistencyRequest,
    ConsistencySignature,
    EncryptedShares,
    ForwardedShares,
    KeysBroadcast,
    MaskedInput,
    UnmaskResponse,
    decode,
    encode,
    peek_header,
)
from .secagg import STAGES, RoundSpec
from .secagg_client import SecAggClient
from .secagg_server import SecAggServer

__all__ = ["TAMPER_KINDS", "RoundOutcome", "run_secagg_round", "dropout_schedule", "tamper_intercept", "MESSAGE_STAGE"]

TAMPER_KINDS = ("ciphertext", "signature", "replay", "reorder", "wrong_round", "wrong_session", "truncate")
#: SecAgg+ client message → the client stage it belongs to (dropout schedules)
MESSAGE_STAGE = {
    AdvertiseKeys: "advertise",
    EncryptedShares: "share",
    MaskedInput: "masked",
    ConsistencySignature: "consistency",
    UnmaskResponse: "unmask",
}


def dropout_schedule(n: int, dropout, drop_stage, rng: np.random.Generator, stages=STAGES) -> dict:
    """Turn the ``dropout`` / ``drop_stage`` options into ``{client: stage}``.

    ``dropout`` is a probability (each client drops independently), a collection of client indices,
    or a ready ``{client: stage}`` mapping. ``drop_stage=None`` draws each dropping client's stage
    uniformly from ``stages`` (SecAgg's ``STAGES`` by default; CKKS passes its own).
    """
    if dropout is None or (isinstance(dropout, (float, int)) and not isinstance(dropout, bool) and dropout == 0):
        return {}
    if isinstance(dropout, dict):
        sched = {int(k): v for k, v in dropout.items()}
    elif isinstance(dropout, (float, int)) and not isinstance(dropout, bool):
        if not 0.0 <= float(dropout) <= 1.0:
            raise ConfigError(
                bad_value(
                    "dropout", dropout, "use a probability in [0, 1], a list of client indices or {client: stage}"
                )
            )
        hit = np.flatnonzero(rng.random(n) < float(dropout))
        sched = {int(i): None for i in hit}
    else:
        try:
            sched = {int(i): None for i in dropout}
        except TypeError:
            raise ConfigError(
                bad_value("dropout", dropout, "use a probability, a list of client indices or {client: stage}")
            ) from None
    if drop_stage is not None and drop_stage not in stages:
        raise ConfigError(bad_value("drop_stage", drop_stage, f"use one of {', '.join(stages)} or None (random stage)"))
    for i in sorted(sched):
        if not 0 <= i < n:
            raise ConfigError(bad_value("dropout", i, f"client indices must lie in [0, {n})"))
        if sched[i] is None:
            sched[i] = drop_stage if drop_stage is not None else stages[int(rng.integers(len(stages)))]
        elif sched[i] not in stages:
            raise ConfigError(bad_value("dropout stage", sched[i], f"use one of {', '.join(stages)}"))
    return sched


def _reencode(data: bytes, **changes) -> bytes:
    return encode(dataclasses.replace(decode(data), **changes))


def tamper_intercept(kind: str, spec: RoundSpec):
    """An ``intercept`` for :func:`.machine.drive_round` that applies fault ``kind`` once (table above)."""
    if kind not in TAMPER_KINDS:
        raise ConfigError(bad_value("tamper", kind, f"use one of {', '.join(TAMPER_KINDS)} or None"))
    state = {"done": False}

    def intercept(direction, rid, data):
        if state["done"] or direction != "down":
            return [data]
        cls = peek_header(data)[0]
        if cls is KeysBroadcast and kind != "ciphertext":
            state["done"] = True
            if kind == "signature":
                msg = decode(data)
                e0 = msg.entries[0]
                swapped = dataclasses.replace(e0, s_pk=crypto.x25519_keypair()[1])
                return [encode(dataclasses.replace(msg, entries=(swapped,) + msg.entries[1:]))]
            if kind == "replay":
                return [data, data]
            if kind == "reorder":
                early = encode(ConsistencyRequest(spec.session_id, spec.round_index, rid, tuple(range(spec.n_clients))))
                return [early, data]
            if kind == "wrong_round":
                return [_reencode(data, round_index=spec.round_index + 1)]
            if kind == "wrong_session":
                return [_reencode(data, session_id=os.urandom(16))]
            return [data[:-1]]  # truncate
        if cls is ForwardedShares and kind == "ciphertext":
            msg = decode(data)
            if not msg.items:
                return [data]
            state["done"] = True
            it = msg.items[0]
            ct = bytearray(it.ciphertext)
            ct[len(ct) // 2] ^= 0x01
            return [
                encode(dataclasses.replace(msg, items=(dataclasses.replace(it, ciphertext=bytes(ct)),) + msg.items[1:]))
            ]
        return [data]

    return intercept


def run_secagg_round(
    spec: RoundSpec,
    identity_private,
    updates,
    weights,
    rng: np.random.Generator,
    drop_at: dict | None = None,
    tamper: str | None = None,
    min_survivors: int = 1,
    colluders: int | None = None,
    intercept=None,
    clients=None,
    schedule: str | None = None,
) -> RoundOutcome:
    """Run one SecAgg+ round in-process over the real state machines and the byte codec.

    ``min_survivors`` and ``colluders`` go to every :class:`SecAggClient` (its floor on the survivor set it
    signs; the c it checks the spec against). ``intercept`` (tests) rewrites messages on the wire, ``tamper``
    applies one of ``TAMPER_KINDS``; ``clients`` replaces the honest client machines (tests of malicious
    clients). ``schedule`` (``"construction"`` or ``"late"``, None: the machines' default) runs the round in that
    schedule; ``"late"`` binds the input part right after the share stage (:mod:`.secagg_client`), so the same
    dropout schedules and faults apply. Returns a :class:`RoundOutcome` whose ``result`` (``words``) is the sum
    mod 2^k.
    """
    if tamper is not None:
        if intercept is not None:
            raise ConfigError(bad_value("tamper", tamper, "give either tamper or intercept"))
        intercept = tamper_intercept(tamper, spec)
    n = spec.n_clients
    server = SecAggServer(spec, 0.0, schedule=schedule)
    if clients is None:
        clients = [
            SecAggClient(
                spec,
                i,
                identity_private[i],
                updates[i],
                weights[i],
                rng,
                min_survivors=min_survivors,
                colluders=colluders,
                schedule=schedule,
            )
            for i in range(n)
        ]
    return drive_round(server, clients, MESSAGE_STAGE, STAGES, drop_at=drop_at, intercept=intercept)
