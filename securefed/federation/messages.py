"""Typed requests and replies between the coordinator and a site, each field stated once.

Every message is a frozen dataclass; its annotations are its schema. :func:`encode` turns a message into the
flat dict that travels (in memory, and over Flower as the values of one ``ConfigRecord``: str, int, float,
bool, bytes and flat lists of one of them — :func:`securefed.federation.wire.check_fields`), and
:func:`decode_request` / :func:`decode_reply` validate a received dict back into its dataclass at the boundary,
strictly: a missing field, a field of the wrong type, an array whose bytes do not match its shape, or a field
the message does not have is a :class:`~securefed.errors.DecodeError` naming the field. Both drivers use the
same encoding (:mod:`.inprocess`, :mod:`securefed.flower.transport`), so a message that would fail over Flower
fails in process too.

Field kinds (by annotation):

* ``int``, ``float``, ``bool``, ``str``, ``bytes`` and ``list[...]`` of one of them travel as they are;
* :data:`Array` — a float64 array: ``name`` holds its little-endian bytes, ``name_shape`` its shape;
* :data:`Json` — a structured value (a public DP plan, ledger events): canonical JSON text (sorted keys);
* a nested message dataclass (:class:`Space`) — flattened under a prefix;
* ``X | None`` — optional: ``None`` is not sent.

The upload a sum asks of a site is a :class:`SumRequest` (ops ``plain``, ``secagg-start``, ``ckks-start``)
carrying one *task* (:data:`TASKS`: one dataclass per kind of upload). :func:`upload_digest` is the SHA-256 of
everything in a sum request that shapes the site's upload — every field but the site's own index, the
operation and the protocol spec — in one canonical encoding (:func:`canonical_bytes`): the digest the sites
bind into the secure sum's round spec, so that a coordinator that shows two sites different parameters
cannot complete the sum (docs/threat-model.md §2).
"""

from __future__ import annotations

import dataclasses
import json
import typing
from dataclasses import dataclass
from typing import Annotated, ClassVar

import numpy as np

from ..errors import DecodeError
from .space import LandmarkSpace
from .wire import Array, Json, array_from_bytes, array_to_bytes, check_fields, dumps

__all__ = [
    "Array",
    "Json",
    "Space",
    "Hello",
    "HelloReply",
    "SumRequest",
    "ProtocolMessages",
    "CkksEnd",
    "Rows",
    "Place",
    "UploadReply",
    "ProtocolReply",
    "RowsReply",
    "PlaceReply",
    "Task",
    "TASKS",
    "REQUESTS",
    "encode",
    "decode",
    "decode_request",
    "decode_reply",
    "upload_digest",
    "canonical_bytes",
    "encode_task",
    "Stats",
    "Model",
    "Gradient",
    "Mmd",
    "Cells",
    "Audit",
    "Rff",
    "BillboardCounts",
    "BillboardDensity",
    "SecAggSetup",
    "TRANSPORT_FIELDS",
    "upload_fields",
    "request_digest",
]


_SCALARS = {int: "int", float: "float", bool: "bool", str: "str", bytes: "bytes"}


# ================================================================================== the generic codec


@dataclass(frozen=True)
class _Kind:
    base: str  # int float bool str bytes list array json nested
    optional: bool
    item: str | None = None  # list item kind
    nested: type | None = None  # nested message class


def _kind_of(tp) -> _Kind:
    optional = False
    origin = typing.get_origin(tp)
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) != len(typing.get_args(tp)) - 1 or len(args) != 1:
            raise TypeError(f"unsupported union {tp!r}")
        optional, tp, origin = True, args[0], typing.get_origin(args[0])
    if origin is Annotated:
        tag = typing.get_args(tp)[1]
        return _Kind(tag, optional)
    if origin is list:
        (item,) = typing.get_args(tp)
        return _Kind("list", optional, _SCALARS[item])
    if tp in _SCALARS:
        return _Kind(_SCALARS[tp], optional)
    if dataclasses.is_dataclass(tp):
        return _Kind("nested", optional, nested=typing.cast(type, tp))
    raise TypeError(f"unsupported message field type {tp!r}")


_SCHEMA: dict[type, list[tuple[str, str, _Kind, dataclasses.Field]]] = {}


def _schema(cls) -> list:
    """``[(attribute, wire name, kind, field)]`` of a message class (computed once from its annotations)."""
    if cls not in _SCHEMA:
        hints = typing.get_type_hints(cls, include_extras=True)
        _SCHEMA[cls] = [
            (f.name, f.metadata.get("wire", f.name), _kind_of(hints[f.name]), f)
            for f in dataclasses.fields(cls)
            if f.init
        ]
    return _SCHEMA[cls]


def _check_scalar(kind: str, v, where: str):
    if kind == "int":
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
            if isinstance(v, float) and v.is_integer():
                return int(v)
            raise DecodeError(f"{where} must be an integer, not {type(v).__name__} {v!r:.40}")
        return int(v)
    if kind == "float":
        if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
            raise DecodeError(f"{where} must be a number, not {type(v).__name__} {v!r:.40}")
        return float(v)
    if kind == "bool":
        if not isinstance(v, (bool, np.bool_)):
            raise DecodeError(f"{where} must be true or false, not {type(v).__name__} {v!r:.40}")
        return bool(v)
    if kind == "str":
        if not isinstance(v, str):
            raise DecodeError(f"{where} must be text, not {type(v).__name__}")
        return v
    if not isinstance(v, (bytes, bytearray, memoryview)):
        raise DecodeError(f"{where} must be bytes, not {type(v).__name__}")
    return bytes(v)


def _put(out: dict, name: str, kind: _Kind, v) -> None:
    if v is None:
        return
    if kind.base == "array":
        a = np.asarray(v, dtype=np.float64)
        out[name] = array_to_bytes(a)
        out[name + "_shape"] = [int(s) for s in a.shape]
    elif kind.base == "json":
        out[name] = dumps(v)
    elif kind.base == "nested":
        out.update(_encode_fields(v, prefix=name))
    elif kind.base == "list":
        out[name] = [_check_scalar(kind.item, x, name) for x in v]
    else:
        out[name] = _check_scalar(kind.base, v, name)


def _encode_fields(msg, prefix: str = "") -> dict:
    out: dict = {}
    for attr, wire, kind, _ in _schema(type(msg)):
        name = wire if not prefix else (prefix if wire == "kind" else f"{prefix}_{wire}")
        _put(out, name, kind, getattr(msg, attr))
    return out


def _get(fields: dict, used: set, name: str, kind: _Kind, what: str):
    """The value of one field from a received dict, validated (``_MISSING`` when absent)."""
    if kind.base == "nested":
        if name in fields:  # a nested message is present when its prefix field (its kind) is
            return _decode_fields(kind.nested, fields, used, prefix=name, what=what)
        return _MISSING
    if name not in fields or fields[name] is None:
        return _MISSING
    used.add(name)
    v = fields[name]
    where = f"{what} field {name!r}"
    if kind.base == "array":
        used.add(name + "_shape")
        if name + "_shape" not in fields:
            raise DecodeError(f"{where}: array without its shape ({name}_shape)")
        return array_from_bytes(v, fields[name + "_shape"])
    if kind.base == "json":
        if isinstance(v, (str, bytes, bytearray)):
            try:
                return json.loads(v)
            except ValueError as exc:
                raise DecodeError(f"{where}: malformed JSON: {exc}") from None
        raise DecodeError(f"{where} must be JSON text, not {type(v).__name__}")
    if kind.base == "list":
        if not isinstance(v, (list, tuple)):
            raise DecodeError(f"{where} must be a list, not {type(v).__name__}")
        return [_check_scalar(kind.item, x, where) for x in v]
    return _check_scalar(kind.base, v, where)


class _Missing:
    pass


_MISSING = _Missing()


def _decode_fields(cls, fields: dict, used: set, prefix: str = "", what: str = ""):
    what = what or getattr(cls, "OP", None) or cls.__name__
    kw = {}
    for attr, wire, kind, f in _schema(cls):
        name = wire if not prefix else (prefix if wire == "kind" else f"{prefix}_{wire}")
        v = _get(fields, used, name, kind, what)
        if v is _MISSING:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                if kind.optional:
                    v = None
                else:
                    raise DecodeError(f"malformed {what!r} message: missing field {name!r}")
            else:
                continue
        kw[attr] = v
    try:
        return cls(**kw)
    except (TypeError, ValueError) as exc:
        raise DecodeError(f"malformed {what!r} message: {exc}") from None


def encode(msg) -> dict:
    """The flat dict of a message (what travels); checked against what a Flower ``ConfigRecord`` carries."""
    if isinstance(msg, (SumRequest, ProtocolMessages)):
        return encode_request(msg)
    out = _encode_fields(msg)
    op = getattr(type(msg), "OP", None)
    if op is not None and "op" not in out:
        out = {"op": op, **out}
    return check_fields(out, type(msg).__name__)


def decode(cls, fields: dict, *, strict: bool = True):
    """Validate ``fields`` into ``cls`` (:class:`DecodeError` naming the field); ``strict``: unknown fields refused."""
    if not isinstance(fields, dict):
        raise DecodeError(f"a {cls.__name__} must be a dict of fields, not {type(fields).__name__}")
    used = {"op"} if hasattr(cls, "OP") else set()
    msg = _decode_fields(cls, fields, used)
    extra = sorted(set(fields) - used - set(getattr(cls, "EXTRA_OK", ())))
    if strict and extra:
        raise DecodeError(f"malformed {getattr(cls, 'OP', cls.__name__)!r} message: unknown field(s) {extra}")
    return msg


def canonical_bytes(msg, exclude=()) -> bytes:
    """One canonical byte encoding of a message's fields (sorted wire names; arrays as shape and float64 bytes)."""
    fields = {k: v for k, v in _encode_fields(msg).items() if k not in set(exclude)}
    h = []
    for k in sorted(fields):
        v = fields[k]
        if isinstance(v, bytes):
            val = "b:" + v.hex()
        elif isinstance(v, list):
            val = "l:" + json.dumps([x.hex() if isinstance(x, bytes) else x for x in v])
        else:
            val = f"{type(v).__name__}:{json.dumps(v)}"
        h.append(f"{k}={val}")
    return "\n".join(h).encode()


# ================================================================================== the landmark space

Space = LandmarkSpace  # the space a request's landmarks live in (wire: ``space``, ``space_mu``, ``space_V``, ...)


# ================================================================================== tasks (what a sum uploads)


@dataclass(frozen=True)
class Task:
    """Base of the tasks: ``NAME`` is the wire value of ``task``."""

    NAME: ClassVar[str] = ""


@dataclass(frozen=True)
class Stats(Task):
    """``[median_p ‖x − x'‖²/(4mB), mean_p(x), mean_p(x²)/B]``, the parts in ``want`` (B = ``scale``)."""

    NAME: ClassVar[str] = "stats"
    want: list[str]
    scale: float


@dataclass(frozen=True)
class _FedDL(Task):
    Y: Array
    gamma: float = 1.0
    monitor: bool = False
    clip: float | None = None
    dp: Json | None = None  # the public DP plan (FedDL's gradient perturbation)
    dp_settle: Json | None = None  # settlements of earlier releases
    round: int | None = None
    step: int | None = None


@dataclass(frozen=True)
class Model(_FedDL):
    """``Y_p`` after ``local_steps`` local steps from the broadcast Y (Qiao et al. Algorithm 1 lines 5–10)."""

    NAME: ClassVar[str] = "model"
    lr: float = 0.0
    local_steps: int = 1


@dataclass(frozen=True)
class Gradient(_FedDL):
    """``∇f_p(Y)`` at the broadcast Y (Eq. 13)."""

    NAME: ClassVar[str] = "gradient"


@dataclass(frozen=True)
class Mmd(Task):
    """``[MMD(X_p, Y)]`` (Eq. 10)."""

    NAME: ClassVar[str] = "mmd"
    Y: Array
    gamma: float


@dataclass(frozen=True)
class Cells(Task):
    """One sum of the cell tree (:mod:`securefed.landmarks.celltree`): the site recomputes the query of step ``step``
    itself from the pinned plan ``cells`` and the totals of the earlier steps — ``previous`` is the total of step
    ``step − 1`` as the coordinator relays it (unscaled; the site checks it) — and uploads its part of it."""

    NAME: ClassVar[str] = "cells"
    cells: Json
    step: int
    previous: Array | None = None


@dataclass(frozen=True)
class Audit(Task):
    """Membership-audit ROC counts of members vs held-out records on public grids."""

    NAME: ClassVar[str] = "audit"
    space: Space
    Y: Array
    gamma: float
    scores: list[str] = dataclasses.field(default_factory=lambda: ["nearest", "kde"])
    cells: Json | None = None  # cells runs: the pinned plan, and the total of the last cells step …
    previous: Array | None = None  # … so that the site finishes its own tree and checks Y, the space and γ


@dataclass(frozen=True)
class _Billboard(Task):
    space: Space
    billboard: Json  # the public billboard plan (σ, μ split, sizes)
    release: int


@dataclass(frozen=True)
class Rff(_Billboard):
    """Release 1 of the DP billboard: the noisy sum of a random-feature map of every record."""

    NAME: ClassVar[str] = "rff"
    n_freq: int = 0
    lengthscales: list[float] = dataclasses.field(default_factory=list)


@dataclass(frozen=True)
class BillboardCounts(_Billboard):
    """Release 2 of the DP billboard: the noisy landmark counts."""

    NAME: ClassVar[str] = "billboard-counts"
    Y: Array | None = None


@dataclass(frozen=True)
class BillboardDensity(_Billboard):
    """Release 3 of the DP billboard: every record's noisy count per cell of a public grid over the landmark map."""

    NAME: ClassVar[str] = "billboard-density"
    Y: Array | None = None
    landmark_embedding: Array | None = None
    masses: Array | None = None
    Zn: float = 0.0
    perplexity: float = 0.0


#: every task, by its wire name
TASKS: dict[str, type] = {
    c.NAME: c for c in (Stats, Model, Gradient, Mmd, Cells, Audit, Rff, BillboardCounts, BillboardDensity)
}


# ================================================================================== requests


@dataclass(frozen=True)
class Hello:
    """Describe yourself: name, record counts, feature count, this run's identity key."""

    OP: ClassVar[str] = "hello"
    audit_holdout: float = 0.0
    seed: int = 0


@dataclass(frozen=True)
class _SumHead:
    """The fields of a sum request beside its operation and its task (on the wire side by side with the task's)."""

    site: int
    weights: str = "records"
    seed: int = 0
    audit_holdout: float = 0.0
    scale_lengths: list[int] | None = None
    scale_bounds: list[float] | None = None
    spec: bytes | None = None
    round_index: int | None = None  # secagg-input: the prepared SecAgg+ round this sum uses (spec: its input part)
    msgs: list[bytes] | None = None  # … and the round's forwarded shares for this site
    proof: bytes | None = None  # the proof of this site's previous SecAgg+ sum (it checks the total itself)
    proof_round: int | None = None


@dataclass(frozen=True, kw_only=True)
class SumRequest(_SumHead):
    """Compute the upload ``task`` asks for and put it into a sum (``op``: plain, secagg-start or ckks-start).

    ``weights`` is the public weight rule (``records``: the site's own record count; ``uniform``: 1);
    ``scale_lengths`` / ``scale_bounds``: the upload's consecutive parts and each part's public bound (the site
    divides by it so the fixed-point range is used well); ``spec`` the secure sum's round spec (its own codec).
    """

    OPS: ClassVar[tuple] = ("plain", "secagg-start", "secagg-input", "ckks-start")
    op: str
    task: Task

    def __post_init__(self):
        if self.op not in self.OPS:
            raise ValueError(f"unknown sum operation {self.op!r}")
        if self.weights not in ("records", "uniform"):
            raise ValueError(f"unknown weight rule {self.weights!r}; expected 'records' or 'uniform'")


@dataclass(frozen=True)
class ProtocolMessages:
    """The coordinator's relay of protocol messages to a site (``op``: ``secagg`` or ``ckks-msgs``)."""

    OPS: ClassVar[tuple] = ("secagg", "ckks-msgs")
    op: str
    msgs: list[bytes] = dataclasses.field(default_factory=list)


@dataclass(frozen=True)
class CkksEnd:
    """The CKKS round is over: drop its state and secret context."""

    OP: ClassVar[str] = "ckks-end"


@dataclass(frozen=True)
class Rows:
    """The paper's rows: ``D²(X, Y)`` (``kind = distance``) or ``K(X, Y)`` (``kernel``) for every record."""

    OP: ClassVar[str] = "rows"
    kind: str
    Y: Array
    site: int = 0
    gamma: float = 1.0
    rows_dp: Json | None = None
    seed: int = 0
    audit_holdout: float = 0.0


@dataclass(frozen=True)
class Place:
    """No-rows mode: place every record of the site against the coordinator's landmark map."""

    OP: ClassVar[str] = "place"
    method: str
    space: Space
    Y: Array
    site: int = 0
    keep: bool = False
    masses: Array | None = None
    landmark_embedding: Array | None = None
    perplexity: float | None = None
    Zn: float | None = None
    kernel_gamma: float | None = None
    n_clusters: int | None = None
    landmark_labels: list[int] | None = None
    seed: int = 0
    audit_holdout: float = 0.0
    cells: Json | None = None  # cells runs: the pinned plan and the last cells total (when no audit ran) …
    previous: Array | None = None
    audit_total: Array | None = None  # … and the total of the audit sum: the site applies the audit gate itself
    audit_scores: list[str] | None = None
    proof: bytes | None = None  # the proof of this site's last SecAgg+ sum (the audit's)
    proof_round: int | None = None


@dataclass(frozen=True)
class SecAggSetup:
    """Prepare SecAgg+ rounds before their inputs exist (late-bound schedule): one setup part per round (fresh keys
    each); the site checks each against its floors, starts a client per round and returns their AdvertiseKeys."""

    OP: ClassVar[str] = "secagg-setup"
    site: int
    setups: list[bytes]
    seed: int = 0
    audit_holdout: float = 0.0


#: every request class by its operation (a sum request answers three)
REQUESTS: dict[str, type] = {
    "hello": Hello,
    "plain": SumRequest,
    "secagg-start": SumRequest,
    "secagg-input": SumRequest,
    "ckks-start": SumRequest,
    "secagg-setup": SecAggSetup,
    "secagg": ProtocolMessages,
    "ckks-msgs": ProtocolMessages,
    "ckks-end": CkksEnd,
    "rows": Rows,
    "place": Place,
}


def decode_request(fields: dict):
    """The typed request a received dict holds (:class:`DecodeError` on anything malformed or unknown)."""
    if not isinstance(fields, dict):
        raise DecodeError(f"a request must be a dict of fields, not {type(fields).__name__}")
    op = fields.get("op")
    cls = REQUESTS.get(op) if isinstance(op, str) else None
    if cls is None:
        from ..errors import ProtocolError

        raise ProtocolError(f"unknown operation {op!r}")
    if cls is SumRequest:
        return _decode_sum(fields)
    return decode(cls, fields)


def _decode_sum(fields: dict) -> SumRequest:
    name = fields.get("task")
    tcls = TASKS.get(name) if isinstance(name, str) else None
    if tcls is None:
        raise DecodeError(
            f"malformed {fields.get('op')!r} message: unknown task {name!r}; expected one of {sorted(TASKS)}"
        )
    used = {"op", "task"}
    task = _decode_fields(tcls, fields, used, what=f"{name} task")
    rest = {k: v for k, v in fields.items() if k not in used}
    head = _decode_fields(_SumHead, rest, set(), what=str(fields.get("op")))
    extra = sorted(set(rest) - {w for _, w, _, _ in _schema(_SumHead)})
    if extra:
        raise DecodeError(f"malformed {fields.get('op')!r} message: unknown field(s) {extra} for task {name!r}")
    return SumRequest(op=str(fields["op"]), task=task, **{a: getattr(head, a) for a, *_ in _schema(_SumHead)})


#: the fields of a sum request that carry the protocol, not the upload: outside the task digest
TRANSPORT_FIELDS = ("op", "site", "spec", "round_index", "msgs", "proof", "proof_round")


def encode_request(msg) -> dict:
    """The flat dict of a request (a sum request: its head, ``task`` and the task's fields side by side)."""
    if isinstance(msg, SumRequest):
        head = _encode_fields(_SumHead(**{a: getattr(msg, a) for a, *_ in _schema(_SumHead)}))
        out = {"op": msg.op, "task": msg.task.NAME, **_encode_fields(msg.task), **head}
        return check_fields(out, "SumRequest")
    if isinstance(msg, ProtocolMessages):
        return check_fields({"op": msg.op, "msgs": list(msg.msgs)}, "ProtocolMessages")
    return encode(msg)


def encode_task(task: Task) -> dict:
    """The flat dict of a task alone (``task`` and its fields), as a sum request carries it."""
    return check_fields({"task": task.NAME, **_encode_fields(task)}, f"{task.NAME} task")


def upload_fields(req: SumRequest) -> dict:
    """Every field of a sum request that shapes the upload, as it travels: the task and its parameters, the weight
    rule, the scales, the seed and hold-out — not the transport (:data:`TRANSPORT_FIELDS`: the site's own index,
    the operation, the round spec, forwarded messages, proofs)."""
    body = encode_request(req)
    return {k: v for k, v in body.items() if k not in TRANSPORT_FIELDS}


def request_digest(fields: dict, binding: dict | None = None) -> bytes:
    """:func:`upload_digest` of a sum request given as its flat dict (without its spec): what a round spec's
    ``task_digest`` must be for the sites that receive it."""
    return upload_digest(decode_request({k: v for k, v in fields.items() if k != "spec"}), binding)


def upload_digest(req: SumRequest, binding: dict | None = None) -> bytes:
    """The task digest of a sum (:func:`securefed.securesum.task.task_digest`) over :func:`upload_fields` and, for a
    query the site derives itself (the cells), ``binding``: what it derived — so that two sites whose derived
    queries differ cannot complete the sum."""
    from ..securesum.task import task_digest

    return task_digest({"request": upload_fields(req), "binding": binding})


# ================================================================================== replies


@dataclass(frozen=True)
class HelloReply:
    site_name: str
    n_records: int
    n_holdout: int
    n_features: int
    identity: bytes
    guards: Json | None = None  # the site's own conditions the guarantee rests on (site options it enforces)


@dataclass(frozen=True)
class UploadReply:
    """A plain upload: the vector in the clear, the site's own weight, its DP ledger events."""

    update: Array
    weight: float
    dp_events: list[str] | None = None


@dataclass(frozen=True)
class ProtocolReply:
    """Protocol messages from a site's secure-sum machine (and, on the reply that carries its upload, the count of
    coordinates it clipped and its DP ledger events)."""

    msgs: list[bytes] = dataclasses.field(default_factory=list)
    secagg_clipped: int | None = None
    ckks_clipped: int | None = None
    dp_events: list[str] | None = None
    ended: bool | None = None


@dataclass(frozen=True)
class RowsReply:
    rows: Array
    rows_dp_event: Json | None = None
    rows_dp_report: Json | None = None


@dataclass(frozen=True)
class PlaceReply:
    embedding: Array | None = None
    labels: list[int] | None = None
    kept: int | None = None
    record_ids: list[str] | None = None  # the site's own choice (site option send-record-ids): its ids, in order


def decode_reply(cls, fields: dict):
    """A site's reply validated into ``cls`` (an ``{"error": ...}`` reply is the caller's to handle first)."""
    return decode(cls, fields)
