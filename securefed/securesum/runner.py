"""In-process driver of the SecAgg+ state machines: routes messages, injects dropouts and faults.

Used by :class:`securefed.securesum.SecAggAggregator` (honest runs, optional simulated dropouts) and by
:func:`securefed.securesum.simulate`. It passes **encoded bytes** between the real state machines, so
byte counts are what a network transport would carry, and it drives time with a simulated clock: when
a stage is missing answers the clock jumps to the server's deadline and ``tick`` closes the stage —
no real sleeping.

A client "dropping at stage S" sends nothing from stage S on (``STAGES`` order). Fault kinds
(``TAMPER_KINDS``) act on one server → client message of the lowest-numbered live client:

=================  ==========================================================================  ======================
kind               what happens                                                                error
=================  ==========================================================================  ======================
``ciphertext``     one byte of a share ciphertext flipped in ForwardedShares                    AuthenticationError
``signature``      the server swaps a neighbour's mask key in KeysBroadcast (forged signature)  AuthenticationError
``replay``         KeysBroadcast delivered a second time                                        ProtocolError
``reorder``        a later-stage message (ConsistencyRequest) arrives before KeysBroadcast      ProtocolError
``wrong_round``    KeysBroadcast re-encoded for round + 1                                       DecodeError
``wrong_session``  KeysBroadcast re-encoded for another session                                 DecodeError
``truncate``       KeysBroadcast with its last byte cut                                         DecodeError
=================  ==========================================================================  ======================
"""

from __future__ import annotations

import dataclasses
import os
import time
from dataclasses import dataclass, field

import numpy as np

from ..errors import ConfigError, SecureFedError, bad_value
from . import crypto
from .messages import ConsistencyRequest, ForwardedShares, KeysBroadcast, ShareCipher, UnmaskResponse, decode, encode, peek_header
from .secagg import STAGES, RoundSpec, SecAggClient, SecAggServer

__all__ = ["TAMPER_KINDS", "RoundOutcome", "run_secagg_round", "dropout_schedule"]

TAMPER_KINDS = ("ciphertext", "signature", "replay", "reorder", "wrong_round", "wrong_session", "truncate")
_STAGE_IDX = {s: i for i, s in enumerate(STAGES)}


@dataclass
class RoundOutcome:
    """Everything one in-process round produced (``words`` is None when it aborted)."""

    words: np.ndarray | None
    survivors: tuple
    error: Exception | None
    timings: dict
    bytes_up: dict
    bytes_down: dict
    clipped: dict
    dropped_at: dict
    revealed: int = 0
    rejected: list = field(default_factory=list)

    @property
    def aborted(self) -> bool:
        return self.error is not None


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
            raise ConfigError(bad_value("dropout", dropout, "use a probability in [0, 1], a list of client indices or {client: stage}"))
        hit = np.flatnonzero(rng.random(n) < float(dropout))
        sched = {int(i): None for i in hit}
    else:
        try:
            sched = {int(i): None for i in dropout}
        except TypeError:
            raise ConfigError(bad_value("dropout", dropout, "use a probability, a list of client indices or {client: stage}")) from None
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
    msg = decode(data)
    return encode(dataclasses.replace(msg, **changes))


def _apply_tamper(kind: str, stage: str, outgoing: list, spec: RoundSpec, state: dict) -> list:
    """Rewrite the server → client messages delivered at ``stage`` according to fault ``kind``."""
    if state.get("done") or not outgoing:
        return outgoing
    rid, data = outgoing[0]
    cls = peek_header(data)[0]
    new = list(outgoing)
    if cls is KeysBroadcast and kind in ("signature", "replay", "reorder", "wrong_round", "wrong_session", "truncate"):
        if kind == "signature":
            msg = decode(data)
            e0 = msg.entries[0]
            swapped = dataclasses.replace(e0, s_pk=crypto.x25519_keypair()[1])
            new[0] = (rid, encode(dataclasses.replace(msg, entries=(swapped,) + msg.entries[1:])))
        elif kind == "replay":
            new.insert(1, (rid, data))
        elif kind == "reorder":
            early = encode(ConsistencyRequest(spec.session_id, spec.round_index, rid, tuple(range(spec.n_clients))))
            new.insert(0, (rid, early))
        elif kind == "wrong_round":
            new[0] = (rid, _reencode(data, round_index=spec.round_index + 1))
        elif kind == "wrong_session":
            new[0] = (rid, _reencode(data, session_id=os.urandom(16)))
        elif kind == "truncate":
            new[0] = (rid, data[:-1])
        state["done"] = True
    elif cls is ForwardedShares and kind == "ciphertext":
        msg = decode(data)
        it = msg.items[0]
        ct = bytearray(it.ciphertext)
        ct[len(ct) // 2] ^= 0x01
        new[0] = (rid, encode(dataclasses.replace(msg, items=(ShareCipher(it.peer, bytes(ct)),) + msg.items[1:])))
        state["done"] = True
    return new


def run_secagg_round(spec: RoundSpec, identity_private, updates, weights, rng: np.random.Generator,
                     drop_at: dict | None = None, tamper: str | None = None, min_survivors: int = 1) -> RoundOutcome:
    """Run one SecAgg+ round in-process over the real state machines and the byte codec
    (``min_survivors``: every client's :class:`SecAggClient` floor on the survivor set it signs)."""
    if tamper is not None and tamper not in TAMPER_KINDS:
        raise ConfigError(bad_value("tamper", tamper, f"use one of {', '.join(TAMPER_KINDS)} or None"))
    drop_at = dict(drop_at or {})
    n = spec.n_clients
    now = 0.0
    timings = {s: {"clients": 0.0, "server": 0.0} for s in STAGES}
    bytes_up = {i: 0 for i in range(n)}
    bytes_down = {i: 0 for i in range(n)}
    revealed = 0
    rejected: list = []
    tamper_state: dict = {}

    def alive(i: int, stage: str) -> bool:
        s = drop_at.get(i)
        return s is None or _STAGE_IDX[s] > _STAGE_IDX[stage]

    t0 = time.perf_counter()
    server = SecAggServer(spec, now)
    timings["advertise"]["server"] += time.perf_counter() - t0
    clients = [SecAggClient(spec, i, identity_private[i], updates[i], weights[i], rng, min_survivors=min_survivors)
               for i in range(n)]
    outgoing: list = []
    error = None
    try:
        for stage in STAGES:
            t0 = time.perf_counter()
            replies: list = []
            if stage == "advertise":
                for i in range(n):
                    if alive(i, stage):
                        replies += clients[i].start(now)
            else:
                if tamper is not None:
                    outgoing = _apply_tamper(tamper, stage, outgoing, spec, tamper_state)
                for rid, data in outgoing:
                    bytes_down[rid] += len(data)
                    if alive(rid, stage):
                        replies += clients[rid].receive(data, now)
            timings[stage]["clients"] += time.perf_counter() - t0
            t0 = time.perf_counter()
            outgoing = []
            for data in replies:
                if peek_header(data)[0] is UnmaskResponse:
                    revealed += 1
                sender = _sender_of(data)
                bytes_up[sender] += len(data)
                try:
                    outgoing += server.receive(data, now)
                except SecureFedError as exc:
                    if server.stage == "aborted":
                        raise
                    rejected.append(f"{type(exc).__name__}: {exc}")
            if server.stage == stage:
                now = server.deadline
                outgoing += server.tick(now)
            timings[stage]["server"] += time.perf_counter() - t0
            if server.done:
                break
    except SecureFedError as exc:
        error = exc
    clipped = {i: c.clipped for i, c in enumerate(clients)}
    words = server.result if error is None else None
    return RoundOutcome(words, tuple(server.survivors) if error is None else (), error, timings,
                        bytes_up, bytes_down, clipped, dict(server.dropped_at), revealed, rejected)


def _sender_of(data: bytes) -> int:
    """Sender id of a client → server message: the first body field (uint32) of every such message."""
    from .messages import HEADER

    return int.from_bytes(data[HEADER.size:HEADER.size + 4], "little")
