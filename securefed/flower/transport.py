"""Flower transport for securefed: the payload record and the coordinator's exchange over a Flower ``Grid``.

securefed's request and reply dicts (:mod:`securefed.federation.wire`; protocol messages inside are the bytes
of their own strict codec) travel **unchanged** as the values of a Flower ``ConfigRecord`` named
``"securefed"`` inside the ``RecordDict`` of a ``query.securefed`` message. Flower is only the carrier
(SuperLink / SuperNode, TLS, node authentication); Flower's own SecAgg+ is not used.

* :func:`make_content` / :func:`read_content` — securefed's payload dict in and out of a Flower message;
* :class:`FlowerExchange` — the transport the coordinator's driver uses (:func:`securefed.federation.drive`):
  it pushes one request's messages, polls for replies until every reply is in or the deadline passes (never
  longer), and checks that each reply comes from the node the request went to.
"""

from __future__ import annotations

import time

from ..errors import DecodeError
from . import trace as _trace

__all__ = ["RECORD", "MESSAGE_TYPE", "make_content", "read_content", "FlowerExchange"]

RECORD = "securefed"
MESSAGE_TYPE = "query.securefed"


# ------------------------------------------------------------------------------------------- payloads


def make_content(**fields):
    """A Flower ``RecordDict`` with one ``ConfigRecord`` ``"securefed"`` holding ``fields``.

    Values must be what a Flower ConfigRecord accepts (str, int, float, bool, bytes or lists of one
    of these). ``None`` values are dropped.
    """
    from flwr.app import ConfigRecord, RecordDict

    return RecordDict({RECORD: ConfigRecord({k: v for k, v in fields.items() if v is not None})})


def read_content(message) -> dict:
    """The ``"securefed"`` record of a Flower message as a dict (DecodeError when absent)."""
    if not message.has_content():
        raise DecodeError(f"Flower message carries an error, not a securefed payload: {message.error}")
    content = message.content
    if RECORD not in content.config_records:
        raise DecodeError(f"Flower message has no {RECORD!r} config record")
    return dict(content.config_records[RECORD])


# ------------------------------------------------------------------------------------- server exchange


class FlowerExchange:
    """The coordinator's transport over a Flower ``Grid`` (real clock; see the module docstring).

    Parameters
    ----------
    grid : flwr.serverapp.Grid
    poll : float
        Seconds between polls once the first reply of a request is in (the others usually follow within a second,
        and the round trip ends with the last one).
    poll_first : float
        Seconds between polls until then. Every poll costs ≈ 2 ms of the ServerApp's CPU and ≈ 6 ms of the
        SuperLink's (BENCHMARKS.md, "Deployment at the speed of the protocol"); a reply takes Flower at least a
        ClientApp start and the SuperNode's 0.5 s reply poll, so polling that phase every 0.05 s only burns the CPU
        the ClientApps need on a small machine.
    first_wait : float
        The run's first request (the coordinator's ``hello``) waits for answers at least this long from the
        exchange's start (the ServerApp's ``wait-sites``): a SuperNode is connected before its first ClientApp has
        started, which on a loaded machine takes long (docs/deploying-on-flower.md §2). :attr:`first` records what it
        saw.
    """

    def __init__(self, grid, poll: float = 0.05, poll_first: float = 0.25, first_wait: float = 0.0):
        self.grid, self.poll, self.poll_first = grid, poll, poll_first
        self.polls = 0
        self.t0 = time.monotonic()
        self.first_wait = float(first_wait)
        self.first: dict | None = None  # what the run's first request saw: asked, answered, seconds

    def now(self) -> float:
        """Seconds since the exchange started (the clock the coordinator and its state machines run on)."""
        return time.monotonic() - self.t0

    def addresses(self) -> list:
        """Flower node ids connected to the SuperLink now."""
        return sorted(int(n) for n in self.grid.get_node_ids())

    def request(self, payloads: dict, deadline: float) -> dict:
        """Send ``payloads[node] = fields``; collect replies until all arrive or ``deadline`` (``now()``).

        A reply carrying a Flower error (the site's process crashed) comes back as ``{"error": reason}``; a
        reply from another node than the one asked is discarded (it cannot stand in for that site)."""
        from flwr.app import Message

        first = self.first is None
        if first:
            deadline = max(deadline, self.first_wait)
        msgs = [
            Message(
                make_content(**fields),
                dst_node_id=int(node),
                message_type=MESSAGE_TYPE,
                ttl=max(deadline - self.now(), 1.0) + 30.0,
            )
            for node, fields in payloads.items()
        ]
        t_push = time.time()
        ids = list(self.grid.push_messages(msgs))
        owner = {mid: node for mid, node in zip(ids, payloads) if mid}
        replies: dict = {}
        arrived: dict = {}
        t_pushed = time.time()
        while owner and self.now() < deadline:
            self.polls += 1
            for rep in self.grid.pull_messages(list(owner)):
                mid = rep.metadata.reply_to_message_id
                node = owner.get(mid)
                if node is None or int(rep.metadata.src_node_id) != int(node):
                    continue
                del owner[mid]
                arrived[mid] = time.time()
                if not rep.has_content():
                    replies[node] = {
                        "error": f"FlowerError: {rep.error.reason if rep.error is not None else 'error reply'}"
                    }
                    continue
                try:
                    replies[node] = read_content(rep)
                except DecodeError as exc:
                    replies[node] = {"error": f"DecodeError: {exc}"}
            if owner:
                time.sleep(min(self.poll if arrived else self.poll_first, max(deadline - self.now(), 0.0)))
        if first:
            self.first = {
                "asked": len(payloads),
                "replied": len(replies),
                "answered": sum(1 for r in replies.values() if "error" not in r),
                "seconds": round(time.time() - t_push, 2),
                "reply_seconds": sorted(round(t - t_push, 2) for t in arrived.values()),
            }
        if _trace.enabled():
            _trace.emit(
                "server",
                push0=t_push,
                push1=t_pushed,
                end=time.time(),
                msgs=dict(zip(ids, payloads)),
                arrived=arrived,
                ops=sorted({str(f.get("op")) for f in payloads.values()}),
                polls=self.polls,
            )
        return replies
