"""What travels between the coordinator and a site: flat dicts of str / int / float / bool / bytes / lists.

The same dicts cross the in-memory exchange and Flower (where they are the values of one ``ConfigRecord``),
so a run behaves the same in process and over the network. Arrays travel as little-endian float64 bytes
with their shape beside them; securefed's protocol messages travel as the ``bytes`` of their own strict
codec (:mod:`securefed.securesum.messages`).
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import numpy as np

from ..errors import DecodeError

__all__ = [
    "array_to_bytes",
    "array_from_bytes",
    "put_array",
    "get_array",
    "payload_size",
    "dumps",
    "loads",
    "check_fields",
    "truthy",
    "Array",
    "Json",
]


def array_to_bytes(a) -> bytes:
    """Little-endian float64 bytes of an array (its shape travels separately)."""
    return np.ascontiguousarray(a, dtype="<f8").tobytes()


def array_from_bytes(data: bytes, shape) -> np.ndarray:
    """Inverse of :func:`array_to_bytes`; the byte length must match ``shape`` exactly (:class:`DecodeError`)."""
    try:
        shape = tuple(int(s) for s in shape)
    except (TypeError, ValueError):
        raise DecodeError(f"array shape {shape!r} is not a list of integers") from None
    if any(s < 0 for s in shape) or not isinstance(data, (bytes, bytearray)) or len(data) != 8 * int(np.prod(shape)):
        raise DecodeError(
            f"array payload has {len(data) if isinstance(data, (bytes, bytearray)) else '?'} bytes, "
            f"expected {8 * int(np.prod(shape))} for shape {shape}"
        )
    return np.frombuffer(bytes(data), dtype="<f8").reshape(shape).copy()


#: a message field holding a float64 array (travels as ``name`` = bytes and ``name_shape`` = shape;
#: :mod:`.messages`)
Array = Annotated[np.ndarray, "array"]
#: a message field holding a structured value (travels as canonical JSON text; :mod:`.messages`)
Json = Annotated[Any, "json"]

_SCALARS = (bool, int, float, str, bytes)


def check_fields(fields: dict, what: str = "message") -> dict:
    """Refuse what a Flower ``ConfigRecord`` would refuse: a value that is not one of str / int / float / bool /
    bytes or a list of one of those types (no nesting, no mixing, no None inside a list). The in-memory exchange
    checks every request and reply with it, so a stage that would fail over Flower fails in process too."""
    for k, v in fields.items():
        if v is None or isinstance(v, _SCALARS):
            continue
        if isinstance(v, list):
            kinds = {bool if isinstance(x, bool) else int if isinstance(x, int) else type(x) for x in v}
            if all(isinstance(x, _SCALARS) for x in v) and len(kinds) <= 1:
                continue
        raise DecodeError(
            f"{what} field {k!r} = {v!r:.80} cannot travel: use str, int, float, bool, bytes or a flat list "
            "of one of them (arrays: put_array)"
        )
    return fields


def put_array(fields: dict, key: str, a) -> dict:
    """``fields[key] = bytes``, ``fields[key + "_shape"] = shape`` (returns ``fields``)."""
    a = np.asarray(a, dtype=np.float64)
    fields[key] = array_to_bytes(a)
    fields[key + "_shape"] = [int(s) for s in a.shape]
    return fields


def get_array(fields: dict, key: str) -> np.ndarray:
    """The array :func:`put_array` stored under ``key`` (:class:`DecodeError` when missing or malformed)."""
    if key not in fields or key + "_shape" not in fields:
        raise DecodeError(f"message has no array {key!r}")
    return array_from_bytes(fields[key], fields[key + "_shape"])


def payload_size(fields: dict) -> int:
    """Bytes of the payload values (securefed messages, arrays, strings) — what a site sends or receives."""
    total = 0
    for v in fields.values():
        if isinstance(v, (bytes, str)):
            total += len(v)
        elif isinstance(v, list):
            total += sum(len(x) if isinstance(x, (bytes, str)) else 8 for x in v)
        else:
            total += 8
    return total


def dumps(obj) -> str:
    """Canonical JSON (sorted keys) for structured fields (a DP plan, ledger events)."""
    return json.dumps(obj, sort_keys=True)


def loads(text, what: str):
    """Parse a JSON field; :class:`DecodeError` naming ``what`` when it is malformed."""
    try:
        return json.loads(text)
    except (TypeError, ValueError) as exc:
        raise DecodeError(f"malformed {what}: {exc}") from None


def truthy(v) -> bool:
    """A yes/no site option as it arrives (a Flower ``node_config`` value is a string): 1, true, yes, on."""
    return str(v).strip().lower() in ("1", "true", "yes", "on")
