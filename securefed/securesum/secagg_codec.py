"""Byte codecs of the SecAgg+ round spec and of a live client state machine (no pickle).

* :func:`encode_spec` / :func:`decode_spec` — the public :class:`~securefed.securesum.secagg.RoundSpec`
  the server announces at the start of a round (JSON + hex bytes; strictly checked; defined in
  :mod:`.secagg`, whose spec digest every signature covers).
* :func:`dump_client` / :func:`load_client` — a site's :class:`~securefed.securesum.secagg.SecAggClient`
  between two messages of a deployment that keeps no process alive between them (Flower starts a fresh
  ``ClientApp`` per message): the machine is stored in the site's own state (it never leaves the site).
  X25519 private keys are stored as raw bytes, the Generator as its bit-generator state.
"""

from __future__ import annotations

import json

import numpy as np

from ..errors import DecodeError, ProtocolError
from . import crypto
from .secagg import RoundSpec, decode_spec, encode_spec
from .secagg_client import SecAggClient

__all__ = ["encode_spec", "decode_spec", "dump_client", "load_client"]

STATE_VERSION = 2


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
