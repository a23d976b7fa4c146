"""The one shape of every securefed protocol machine: stage servers, stage clients, one round driver.

Both protocols (SecAgg+ in :mod:`.secagg_client` / :mod:`.secagg_server`, CKKS in :mod:`.ckks.machines`) are
sans-I/O state machines built on the two base classes here:

* :class:`StageServer` — ``receive(data, now)`` and ``tick(now)`` return ``[(recipient, bytes), …]``. Its
  transitions are one table, ``TRANSITIONS = {stage: {MessageClass: "handler"}}``: a message is decoded
  strictly against the current stage's classes and handed to its handler. **Fail closed** (as h11's ERROR
  state): the machine never raises for one client's bad message — a message it refuses (malformed, stale,
  bad signature, duplicate, from a client not expected now) is *discarded and recorded* in
  :attr:`StageServer.rejected` (``(sender or None, error)``), with the machine's state unchanged, and the
  round goes on without it. Any exception that does escape ``receive`` or ``tick`` — a round that cannot
  complete, a check that fails while a stage closes, or an error of any other origin (a bug, a library
  failure) — first moves the machine to ``"aborted"``: ``exception raised ⇒ stage == "aborted"``, and an
  aborted machine holds nothing and answers nothing.
* :class:`StageClient` — ``start(now)`` and ``receive(data, now)`` return encoded messages;
  ``TRANSITIONS = {state: {MessageClass: "handler"}}``; any exception aborts the client (it sends nothing
  further) and propagates.

:func:`drive_round` is the one in-process round driver (SecAgg+ and CKKS): it passes encoded bytes between a
server machine and its clients, drives a simulated clock (a stage missing answers closes at its deadline
through ``tick``), applies scheduled dropouts, treats a client that raises as dropped from then on (what a
deployment does with a site that returns an error), checks that every message's sender field names the
client it came from (as the coordinator's relay does), and lets tests rewrite any message (``intercept``).
Both runners return a :class:`RoundOutcome`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import ConfigError, ProtocolAbortedError, ProtocolError, SecureFedError, bad_value
from .messages import decode_expected, peek_header, sender_of

__all__ = ["StageServer", "StageClient", "UnexpectedMessageError", "RoundOutcome", "drive_round"]


class UnexpectedMessageError(ProtocolError):
    """A well-formed message of this session and round, but of a type the machine does not expect now.

    What a replayed or reordered message looks like. Malformed bytes, another session or another round
    stay :class:`~securefed.errors.DecodeError`.
    """


class StageServer:
    """Base of the SecAgg+ and CKKS server machines (module docstring).

    Subclasses set ``TRANSITIONS``, ``FIRST_STAGE``, ``NAME`` and implement ``_stage_complete()``,
    ``_close(now, timed_out)`` and ``_clear()``; handlers validate a message completely *before* they change
    anything (raise a :class:`SecureFedError` to refuse it) and then record it.
    """

    TRANSITIONS: dict = {}
    FIRST_STAGE = ""
    NAME = "server"
    #: server stage → the client stage whose messages it waits for (dropout schedules use client stages)
    CLIENT_STAGE: dict = {}

    def __init__(self, spec, now: float = 0.0):
        self.spec = spec
        self.stage = self.FIRST_STAGE
        self.deadline = now + spec.timeout(self.FIRST_STAGE)
        self.expected: set = set(range(spec.n_clients))
        self.bytes_in: dict[int, int] = {}
        self.bytes_out: dict[int, int] = {}
        self.dropped_at: dict[str, tuple] = {}
        self.rejected: list = []
        self.blame: tuple = ()
        self.result: np.ndarray | None = None
        self.survivors: tuple = ()
        self.error: Exception | None = None

    @property
    def done(self) -> bool:
        return self.stage in ("done", "aborted")

    def client_stage(self) -> str:
        return self.CLIENT_STAGE.get(self.stage, self.stage)

    # ---------------------------------------------------------------------------------- entry points
    def receive(self, data: bytes, now: float = 0.0) -> list[tuple[int, bytes]]:
        """Feed one client message. Returns the messages to send; a refused message returns ``[]`` and is
        recorded in :attr:`rejected`. Raises only when the round cannot go on (the machine is aborted)."""
        if self.done:
            self._reject(sender_of(data), ProtocolError(f"{self.NAME} is {self.stage}; message discarded"))
            return []
        try:
            handlers = self.TRANSITIONS[self.stage]
            msg = decode_expected(
                data,
                self.spec,
                tuple(handlers),
                f"{self.NAME} in stage {self.stage!r}",
                "stale, replayed or reordered; discarded",
                UnexpectedMessageError,
            )
            if not 0 <= msg.sender < self.spec.n_clients:
                raise ProtocolError(f"{self.NAME}: message from unknown client {msg.sender}; discarded")
            getattr(self, handlers[type(msg)])(msg)
        except SecureFedError as exc:
            if self.stage == "aborted":  # a handler found that the round cannot go on
                raise
            self._reject(sender_of(data), exc)
            return []
        except Exception as exc:  # not a refusal of this message: fail closed
            self._abort_on(exc)
            raise
        self.bytes_in[msg.sender] = self.bytes_in.get(msg.sender, 0) + len(data)
        if self._stage_complete():
            return self._guarded(now, False)
        return []

    def tick(self, now: float) -> list[tuple[int, bytes]]:
        """Close the current stage if its deadline has passed."""
        if self.done or now < self.deadline:
            return []
        return self._guarded(now, True)

    # ---------------------------------------------------------------------------------- helpers
    def _guarded(self, now: float, timed_out: bool) -> list:
        try:
            return self._close(now, timed_out)
        except Exception as exc:
            self._abort_on(exc)
            raise

    def _reject(self, sender, exc: Exception) -> None:
        self.rejected.append((sender, exc))

    def _abort_on(self, exc: Exception) -> None:
        if self.stage != "aborted":
            self.stage = "aborted"
            self._clear()
            self.result = None
            self.survivors = ()
        if self.error is None:
            self.error = exc

    def _fail(self, reason: str, timed_out: bool, what: str = "nothing revealed"):
        from ..errors import ProtocolTimeoutError

        err = (ProtocolTimeoutError if timed_out else ProtocolAbortedError)(
            f"{self.ROUND_NAME} {self.spec.round_index} aborted, {what}: {reason}"
        )
        self._abort_on(err)
        raise err

    ROUND_NAME = "round"

    def _send(self, out: list, rid: int, msg) -> None:
        from .messages import encode

        data = encode(msg)
        self.bytes_out[rid] = self.bytes_out.get(rid, 0) + len(data)
        out.append((rid, data))

    def _clear(self) -> None:  # pragma: no cover - subclasses drop their secrets / uploads
        pass

    def _stage_complete(self) -> bool:  # pragma: no cover
        raise NotImplementedError

    def _close(self, now: float, timed_out: bool) -> list:  # pragma: no cover
        raise NotImplementedError


class StageClient:
    """Base of the SecAgg+ and CKKS client machines: ``TRANSITIONS = {state: {MessageClass: "handler"}}``.

    Every message is decoded strictly for the client's spec, must be addressed to this client, and goes to
    the handler of its class in the current state; any exception aborts the client (``_abort``) and
    propagates. ``done`` and ``aborted`` accept nothing further.
    """

    TRANSITIONS: dict = {}
    # set by every subclass's __init__
    spec: Any
    id: int
    state: str
    _identity: Any

    def _abort(self) -> None:  # pragma: no cover - subclasses drop their secrets
        self.state = "aborted"

    def _begin(self) -> None:
        """Stage ``advertise`` may start once: a second ``start()`` aborts the client."""
        if self.state != "init":
            self._abort()
            raise ProtocolError(f"client {self.id}: start() called twice; aborted")

    def _advertise(self, c_pk: bytes, s_pk: bytes, commit: bytes) -> list[bytes]:
        """The advertisement both protocols send: the two public keys and the commitment, signed with the
        identity key over the round's spec digest; the client moves to ``advertised``."""
        from . import crypto
        from .messages import AdvertiseKeys, encode
        from .secagg import advert_payload

        spec = self.spec
        sig = crypto.sign(
            self._identity, advert_payload(spec.session_id, spec.round_index, self.id, spec.digest, c_pk, s_pk, commit)
        )
        self.state = "advertised"
        return [encode(AdvertiseKeys(spec.session_id, spec.round_index, self.id, c_pk, s_pk, commit, sig))]

    def _survivor_set(self, survivors, floor: int, error=ProtocolAbortedError) -> tuple:
        """The survivor set U a server announces: known clients, this client among them, at least ``floor``."""
        surv = tuple(survivors)
        if any(not 0 <= u < self.spec.n_clients for u in surv):
            raise ProtocolError(f"client {self.id}: survivor list names unknown clients")
        if self.id not in surv:
            raise ProtocolAbortedError(
                f"client {self.id} is declared dropped; it confirms no survivor set and "
                "takes no part in the rest of the round"
            )
        if len(surv) < floor:
            raise error(
                f"client {self.id} refuses a survivor set of {len(surv)} clients: it confirms only sets of "
                f"at least {floor} (min_survivors / quorum)"
            )
        return surv

    def receive(self, data: bytes, now: float = 0.0) -> list[bytes]:
        """Consume one server message; return the reply (possibly empty). Any violation aborts."""
        if self.state in ("aborted", "done"):
            raise ProtocolAbortedError(f"client {self.id} is {self.state} and accepts no further messages")
        try:
            handlers = self.TRANSITIONS.get(self.state)
            if not handlers:
                raise ProtocolError(f"client {self.id}: no message expected in state {self.state!r}")
            msg = decode_expected(
                data,
                self.spec,
                tuple(handlers),
                f"client {self.id} in state {self.state!r}",
                "replayed or reordered message",
                UnexpectedMessageError,
            )
            to = getattr(msg, "recipient", self.id)  # a forwarded PublicContext is for every client (holder-signed)
            if to != self.id:
                raise ProtocolError(f"client {self.id} received a message addressed to client {to}")
            return getattr(self, handlers[type(msg)])(msg)
        except Exception:
            self._abort()
            raise


# ================================================================================================ driver


@dataclass
class RoundOutcome:
    """What one in-process round produced — the same type for SecAgg+ and CKKS.

    ``result`` is the server's output (SecAgg+: the sum's words mod 2^k; CKKS: the released float sum) or
    None when the round aborted; ``timings`` is ``{stage: {"clients": s, "server": s}}``; ``client_errors``
    names the clients that raised (treated as dropped from then on); ``rejected`` lists the messages a
    machine refused or the relay dropped (``"client i: Type: message"``); ``blame`` the clients a machine
    proved to have cheated (e.g. inconsistent shares, a signed masked input no honest encoder produces);
    ``suspects`` the clients any of which could have caused an un-identifiable failure (SecAgg+: a sum outside
    its range).
    """

    result: np.ndarray | None
    survivors: tuple
    error: Exception | None
    timings: dict
    bytes_up: dict
    bytes_down: dict
    clipped: dict
    dropped_at: dict
    revealed: int = 0
    rejected: list = field(default_factory=list)
    client_errors: dict = field(default_factory=dict)
    decryptor: int | None = None
    blame: tuple = ()
    suspects: tuple = ()

    @property
    def aborted(self) -> bool:
        return self.error is not None

    @property
    def words(self):
        """SecAgg+: the sum's words mod 2^k (alias of ``result``)."""
        return self.result

    @property
    def total(self):
        """CKKS: the released sum (alias of ``result``)."""
        return self.result


def _fmt(exc: Exception) -> str:
    return f"{type(exc).__name__}: {exc}"


class _Relay:
    """The in-process wire of :func:`drive_round`: who is alive at which stage, the interception hook, byte counts,
    timings per stage, what the server rejected and the messages it has yet to deliver."""

    def __init__(
        self, server, clients, message_stage: dict, stages: tuple, drop_at: dict | None, intercept, now: float
    ):
        self.server, self.clients, self.message_stage, self.stages = server, clients, message_stage, stages
        self.drop_at = dict(drop_at or {})
        self.idx = {s: i for i, s in enumerate(stages)}
        for s in self.drop_at.values():
            if s not in self.idx:
                raise ConfigError(bad_value("drop stage", s, f"use one of {', '.join(stages)}"))
        n = len(clients)
        self.intercept, self.now = intercept, now
        self.timings = {s: {"clients": 0.0, "server": 0.0} for s in stages}
        self.bytes_up = {i: 0 for i in range(n)}
        self.bytes_down = {i: 0 for i in range(n)}
        self.rejected: list = []
        self.client_errors: dict = {}
        self.dead: set = set()
        self.revealed = 0
        self.outgoing: list = []

    def alive(self, i: int, stage: str) -> bool:
        s = self.drop_at.get(i)
        return i not in self.dead and (s is None or self.idx[s] > self.idx[stage])

    def wire(self, direction, who, data):
        return [data] if self.intercept is None else list(self.intercept(direction, who, data))

    def stage(self) -> str:
        """The client stage the server is in (its timings bucket)."""
        stage = self.server.client_stage()
        return stage if stage in self.timings else self.stages[-1]

    def upload(self, i: int, msgs: list) -> None:
        """Client ``i``'s messages to the server (a dropped client's never leave it)."""
        server = self.server
        for data in msgs:
            for d in self.wire("up", i, data):
                try:
                    cls = peek_header(d)[0]
                except SecureFedError:
                    cls = None
                if cls is not None and cls in self.message_stage and not self.alive(i, self.message_stage[cls]):
                    continue  # dropped: the message never leaves the client
                self.bytes_up[i] += len(d)
                claimed = sender_of(d)
                if claimed != i:
                    self.rejected.append(f"client {i}: message claims sender {claimed}; dropped by the relay")
                    continue
                stage = self.stage()
                before = len(server.rejected)
                t0 = time.perf_counter()
                try:
                    self.outgoing.extend(server.receive(d, self.now))
                finally:  # also when the message ended the round
                    self.timings[stage]["server"] += time.perf_counter() - t0
                    self.rejected.extend(f"client {i}: {_fmt(e)}" for _, e in server.rejected[before:])
                if len(server.rejected) == before and cls is not None and cls.__name__ == "UnmaskResponse":
                    self.revealed += 1

    def deliver(self) -> None:
        """The server's pending messages to their live recipients; their replies go back up."""
        batch, self.outgoing[:] = list(self.outgoing), []
        stage = self.stage()
        for rid, data in batch:
            for d in self.wire("down", rid, data):
                self.bytes_down[rid] += len(d)
                if not self.alive(rid, stage):
                    continue
                t0 = time.perf_counter()
                try:
                    replies = self.clients[rid].receive(d, self.now)
                except SecureFedError as exc:
                    self.client_errors[rid] = _fmt(exc)
                    self.dead.add(rid)
                    continue
                finally:
                    self.timings[stage]["clients"] += time.perf_counter() - t0
                self.upload(rid, replies)

    def run(self, max_steps: int) -> None:
        """Start every live client, then deliver (or let the server's deadline pass) until the round is over."""
        server = self.server
        t0 = time.perf_counter()
        for i, c in enumerate(self.clients):
            if self.alive(i, self.stages[0]):
                self.upload(i, c.start(self.now))
        self.timings[self.stages[0]]["clients"] += time.perf_counter() - t0
        steps = 0
        while not server.done:
            steps += 1
            if steps > max_steps:  # pragma: no cover - a machine that neither advances nor times out
                raise ProtocolAbortedError("the round made no progress")
            if self.outgoing:
                self.deliver()
                continue
            self.now = max(self.now, server.deadline)
            stage = self.stage()
            t0 = time.perf_counter()
            self.outgoing.extend(server.tick(self.now))
            self.timings[stage]["server"] += time.perf_counter() - t0


def drive_round(
    server,
    clients,
    message_stage: dict,
    stages: tuple,
    drop_at: dict | None = None,
    intercept=None,
    now: float = 0.0,
    max_steps: int = 10_000,
) -> RoundOutcome:
    """Run one round between ``server`` and ``clients`` in this process (module docstring).

    Parameters
    ----------
    server : StageServer
    clients : list of StageClient
        Client ``i`` is the machine of client id ``i``.
    message_stage : dict
        Client message class → the client stage it belongs to (a client dropping at stage S sends nothing of
        stage S or later and processes nothing from then on).
    stages : tuple
        The client stages in order.
    drop_at : dict, optional
        ``{client: stage}`` scheduled dropouts.
    intercept : callable, optional
        ``intercept(direction, who, data) -> list[bytes]`` rewrites every message on the wire
        (``direction`` ``"up"``: ``who`` sent it; ``"down"``: ``who`` is the recipient). Tests and fault
        injection only.
    """
    relay = _Relay(server, clients, message_stage, stages, drop_at, intercept, now)
    error = None
    try:
        relay.run(max_steps)
    except SecureFedError as exc:
        error = exc
    if error is None and server.error is not None:  # pragma: no cover - defensive
        error = server.error
    return RoundOutcome(
        result=None if error is not None else server.result,
        survivors=() if error is not None else tuple(server.survivors),
        error=error,
        timings=relay.timings,
        bytes_up=relay.bytes_up,
        bytes_down=relay.bytes_down,
        clipped={i: int(getattr(c, "clipped", 0)) for i, c in enumerate(clients)},
        dropped_at=dict(server.dropped_at),
        revealed=relay.revealed,
        rejected=relay.rejected,
        client_errors=relay.client_errors,
        decryptor=getattr(server, "decryptor", None),
        blame=tuple(getattr(server, "blame", ())),
        suspects=tuple(getattr(server, "suspects", ())),
    )
