"""Flower transport for securefed's protocol messages: payload records, state codecs and the server clock.

securefed's own messages (:mod:`securefed.securesum.messages`, the strict versioned byte codec) travel
**unchanged** as ``bytes`` values of a Flower ``ConfigRecord`` named ``"securefed"`` inside the
``RecordDict`` of a ``query.securefed`` message. Flower is only the carrier (SuperLink / SuperNode,
TLS, node authentication); Flower's own SecAgg+ is not used.

Three codecs live here, none of them ``pickle``:

* :func:`encode_spec` / :func:`decode_spec` — the public :class:`~securefed.securesum.secagg.RoundSpec`
  that the server announces at the start of a SecAgg+ round (JSON + raw bytes; strictly checked).
* :func:`dump_client` / :func:`load_client` — a site's :class:`~securefed.securesum.secagg.SecAggClient`
  between two Flower messages. Flower starts a fresh ``ClientApp`` process for every message, so the
  state machine is written to the SuperNode's per-run ``context.state`` (memory of the site's own
  SuperNode process; it never leaves the site) and read back by the next message's process. The
  X25519 private keys are stored as raw bytes, the Generator as its bit-generator state.
* :class:`Exchange` — the server side of one request/reply step over a Flower ``Grid`` with a
  real clock: it pushes the messages, polls for replies until every reply is in or the stage's
  deadline passes (never longer), and counts payload bytes per site in each direction.
"""

from __future__ import annotations

import json
import time

import numpy as np

from ..errors import DecodeError, ProtocolError
from ..securesum import crypto
from ..securesum.quantize import FixedPoint
from ..securesum.secagg import RoundSpec, SecAggClient

__all__ = ["RECORD", "MESSAGE_TYPE", "make_content", "read_content", "encode_spec", "decode_spec", "dump_client",
           "load_client", "Exchange", "array_to_bytes", "array_from_bytes"]

RECORD = "securefed"
MESSAGE_TYPE = "query.securefed"
SPEC_VERSION = 1
STATE_VERSION = 1


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


def payload_size(fields: dict) -> int:
    """Bytes of the payload values (securefed messages, arrays, strings) — what a site sends or gets."""
    total = 0
    for v in fields.values():
        if isinstance(v, (bytes, str)):
            total += len(v)
        elif isinstance(v, list):
            total += sum(len(x) if isinstance(x, (bytes, str)) else 8 for x in v)
        else:
            total += 8
    return total


def array_to_bytes(a) -> bytes:
    """Little-endian float64 bytes of an array (shape travels separately)."""
    return np.ascontiguousarray(a, dtype="<f8").tobytes()


def array_from_bytes(data: bytes, shape) -> np.ndarray:
    """Inverse of :func:`array_to_bytes`; the byte length must match ``shape`` exactly."""
    shape = tuple(int(s) for s in shape)
    if len(data) != 8 * int(np.prod(shape)):
        raise DecodeError(f"array payload has {len(data)} bytes, expected {8 * int(np.prod(shape))} for shape {shape}")
    return np.frombuffer(data, dtype="<f8").reshape(shape).copy()


# ------------------------------------------------------------------------------------------ RoundSpec


def encode_spec(spec: RoundSpec) -> bytes:
    """The public round parameters as JSON bytes (byte strings hex-encoded)."""
    fp = spec.fixed_point
    doc = {"v": SPEC_VERSION, "session_id": spec.session_id.hex(), "round_index": spec.round_index,
           "n_clients": spec.n_clients, "degree": spec.degree, "threshold": spec.threshold,
           "graph_seed": spec.graph_seed.hex(), "length": spec.length,
           "fixed_point": [fp.clip, fp.fractional_bits, fp.modulus_bits, fp.active_clients, fp.weight_total],
           "identity_keys": [k.hex() for k in spec.identity_keys], "timeouts": [[k, v] for k, v in spec.timeouts]}
    return json.dumps(doc, sort_keys=True).encode()


def decode_spec(data: bytes) -> RoundSpec:
    """Strict inverse of :func:`encode_spec` (DecodeError on any unknown version or malformed field)."""
    try:
        doc = json.loads(bytes(data).decode())
        if doc.get("v") != SPEC_VERSION:
            raise DecodeError(f"round spec version {doc.get('v')!r} is not {SPEC_VERSION}")
        clip, f, k, active, wt = doc["fixed_point"]
        fp = FixedPoint(float(clip), int(f), int(k), int(active), float(wt))
        keys = tuple(bytes.fromhex(h) for h in doc["identity_keys"])
        if any(len(x) != 32 for x in keys):
            raise DecodeError("round spec: identity keys must be 32 bytes")
        return RoundSpec(bytes.fromhex(doc["session_id"]), int(doc["round_index"]), int(doc["n_clients"]),
                         int(doc["degree"]), int(doc["threshold"]), bytes.fromhex(doc["graph_seed"]),
                         int(doc["length"]), fp, keys, tuple((str(a), float(b)) for a, b in doc["timeouts"]))
    except DecodeError:
        raise
    except (ValueError, KeyError, TypeError) as exc:
        raise DecodeError(f"malformed round spec: {exc}") from None


# --------------------------------------------------------------------------------- client state codec

_SKIP = ("spec", "_identity", "_rng")


def _enc(v):
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

    if v is None or isinstance(v, (bool, str, float)):
        return v
    if isinstance(v, (int, np.integer)):
        return {"i": str(int(v))}
    if isinstance(v, (bytes, bytearray)):
        return {"b": bytes(v).hex()}
    if isinstance(v, X25519PrivateKey):
        return {"x": crypto.x25519_private_bytes(v).hex()}
    if isinstance(v, np.ndarray):
        return {"nd": [v.dtype.str, list(v.shape), np.ascontiguousarray(v).tobytes().hex()]}
    if isinstance(v, tuple):
        return {"t": [_enc(x) for x in v]}
    if isinstance(v, list):
        return {"l": [_enc(x) for x in v]}
    if isinstance(v, (set, frozenset)):
        return {"s": [_enc(x) for x in sorted(v)]}
    if isinstance(v, dict):
        return {"d": [[_enc(k), _enc(x)] for k, x in v.items()]}
    raise ProtocolError(f"cannot store a {type(v).__name__} of the SecAgg client state between Flower messages")


def _dec(v):
    if v is None or isinstance(v, (bool, str, float)):
        return v
    (tag, x), = v.items()
    if tag == "i":
        return int(x)
    if tag == "b":
        return bytes.fromhex(x)
    if tag == "x":
        return crypto.x25519_private_from_bytes(bytes.fromhex(x))
    if tag == "nd":
        dt, shape, hx = x
        return np.frombuffer(bytes.fromhex(hx), dtype=np.dtype(dt)).reshape(shape).copy()
    if tag == "t":
        return tuple(_dec(y) for y in x)
    if tag == "l":
        return [_dec(y) for y in x]
    if tag == "s":
        return {_dec(y) for y in x}
    if tag == "d":
        return {_dec(k): _dec(y) for k, y in x}
    raise DecodeError(f"unknown tag {tag!r} in stored SecAgg client state")


def dump_client(client: SecAggClient) -> bytes:
    """Serialise a live client state machine (everything but its spec, identity key and Generator)."""
    attrs = {k: _enc(v) for k, v in vars(client).items() if k not in _SKIP}
    return json.dumps({"v": STATE_VERSION, "attrs": attrs, "rng": client._rng.bit_generator.state}).encode()


def load_client(blob: bytes, spec: RoundSpec, identity_key) -> SecAggClient:
    """Rebuild the client saved by :func:`dump_client` for ``spec`` with its identity key."""
    doc = json.loads(bytes(blob).decode())
    if doc.get("v") != STATE_VERSION:
        raise DecodeError(f"stored client state version {doc.get('v')!r} is not {STATE_VERSION}")
    client = SecAggClient.__new__(SecAggClient)
    client.spec, client._identity = spec, identity_key
    rng = np.random.default_rng()
    rng.bit_generator.state = doc["rng"]
    client._rng = rng
    for k, v in doc["attrs"].items():
        setattr(client, k, _dec(v))
    return client


# ------------------------------------------------------------------------------------- server exchange


class Exchange:
    """Request/reply steps over a Flower ``Grid`` with deadlines and per-site payload byte counts.

    Parameters
    ----------
    grid : flwr.serverapp.Grid
    nodes : dict
        ``{client_id: flower_node_id}`` of the sites in this run.
    poll : float
        Seconds between polls for replies.
    """

    def __init__(self, grid, nodes: dict, poll: float = 0.05):
        self.grid, self.nodes, self.poll = grid, dict(nodes), poll
        self.t0 = time.monotonic()
        self.bytes_to = {i: 0 for i in nodes}
        self.bytes_from = {i: 0 for i in nodes}
        self.messages = 0
        self.silent: dict[int, str] = {}

    def now(self) -> float:
        """Seconds since the exchange started (the clock the state machines are driven with)."""
        return time.monotonic() - self.t0

    def available_nodes(self) -> list:
        """Flower node ids currently connected to the SuperLink (for re-admitting restarted sites)."""
        return sorted(int(n) for n in self.grid.get_node_ids())

    def request(self, payloads: dict, deadline: float, on_reply=None) -> dict:
        """Send ``payloads[client] = fields`` and collect replies until all arrive or ``deadline`` (``now()``).

        ``on_reply(client, fields)`` is called as each reply arrives (so a state machine can close a
        stage early); returns ``{client: fields}`` of the replies that arrived. A reply carrying a
        Flower error (site crashed, ClientApp raised) is recorded in ``self.silent`` and not returned.
        """
        from flwr.app import Message

        msgs, owner = [], {}
        for cid, fields in payloads.items():
            self.bytes_to[cid] += payload_size(fields)
            msgs.append(Message(make_content(**fields), dst_node_id=int(self.nodes[cid]), message_type=MESSAGE_TYPE,
                                ttl=max(deadline - self.now(), 1.0) + 30.0))
        ids = list(self.grid.push_messages(msgs))
        for mid, cid in zip(ids, payloads):
            owner[mid] = cid
        self.messages += len(ids)
        pending = set(i for i in ids if i)
        replies: dict = {}
        while pending and self.now() < deadline:
            for rep in self.grid.pull_messages(list(pending)):
                mid = rep.metadata.reply_to_message_id
                if mid not in pending:
                    continue
                pending.discard(mid)
                cid = owner[mid]
                if not rep.has_content():
                    self.silent[cid] = str(rep.error.reason if rep.error is not None else "error reply")
                    continue
                try:
                    fields = read_content(rep)
                except DecodeError as exc:
                    self.silent[cid] = str(exc)
                    continue
                self.bytes_from[cid] += payload_size(fields)
                replies[cid] = fields
                if on_reply is not None:
                    on_reply(cid, fields)
            if pending:
                time.sleep(self.poll)
        for mid in pending:
            self.silent.setdefault(owner[mid], "no reply before the deadline")
        return replies

