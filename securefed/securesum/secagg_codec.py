"""Byte codecs of the SecAgg+ round spec and of a live client state machine (no pickle).

* :func:`encode_spec` / :func:`decode_spec` — the public :class:`~securefed.securesum.secagg.RoundSpec`
  the server announces at the start of a round (JSON + hex bytes; strictly checked; defined in
  :mod:`.secagg`, whose spec digest every signature covers).
* :func:`encode_setup` / :func:`decode_setup`, :func:`encode_input` / :func:`decode_input` — the two parts of
  a late-bound round's spec (:class:`~securefed.securesum.secagg.SetupSpec`, announced at the start with the
  advertise stage; :class:`~securefed.securesum.secagg.InputSpec`, announced with the input request).
* :func:`dump_client` / :func:`load_client` — a site's :class:`~securefed.securesum.secagg.SecAggClient`
  between two messages of a deployment that keeps no process alive between them (Flower starts a fresh
  ``ClientApp`` per message): the machine is stored in the site's own state (it never leaves the site).
  X25519 private keys are stored as raw bytes, the Generator as its bit-generator state. Every state
  serialises, the late-bound ``ready`` state included (a site may hold several rounds in ``ready`` at once).

**Which spec to pass to load_client.** The machine's spec is not stored, only the digests it signed with;
``load_client`` checks the spec it is given against them and refuses another one (DecodeError). A
construction-schedule client needs its full RoundSpec. A late-bound client needs its setup part until its input
is bound (a SetupSpec, or any RoundSpec with that setup part — only the setup part is used), and from
``provide_input`` on the full spec it was bound to (``setup.bind(input_spec)``; store it, or store both parts).
"""

from __future__ import annotations

import json

import numpy as np

from ..errors import DecodeError, ProtocolError
from . import crypto
from .secagg import (
    RoundSpec,
    SetupSpec,
    decode_input,
    decode_setup,
    decode_spec,
    encode_input,
    encode_setup,
    encode_spec,
)
from .secagg_client import SecAggClient

__all__ = [
    "encode_spec",
    "decode_spec",
    "encode_setup",
    "decode_setup",
    "encode_input",
    "decode_input",
    "dump_client",
    "load_client",
]

#: 3: the late-bound schedule (schedule, signed digests, pending input); version-2 states still load
STATE_VERSION = 3


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
    ((tag, x),) = v.items()
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


def load_client(blob: bytes, spec: RoundSpec | SetupSpec, identity_key) -> SecAggClient:
    """Rebuild the client saved by :func:`dump_client` with its identity key and ``spec`` (module docstring:
    which spec; another spec than the one the client signed with is refused with DecodeError)."""
    try:
        doc = json.loads(bytes(blob).decode())
    except (ValueError, UnicodeDecodeError) as exc:
        raise DecodeError(f"stored SecAgg client state is not JSON: {exc}") from None
    if not isinstance(doc, dict) or doc.get("v") not in (2, STATE_VERSION):
        raise DecodeError(
            f"stored client state version {doc.get('v') if isinstance(doc, dict) else None!r} is not {STATE_VERSION}"
        )
    client = SecAggClient.__new__(SecAggClient)
    client._identity = identity_key
    rng = np.random.default_rng()
    rng.bit_generator.state = doc["rng"]
    client._rng = rng
    for k, v in doc["attrs"].items():
        setattr(client, k, _dec(v))
    if doc["v"] == 2:  # before the late-bound schedule: every client signed its full spec digest
        if not isinstance(spec, RoundSpec):
            raise DecodeError("a version-2 client state needs its full RoundSpec")
        client.schedule, client._key_digest, client._bound_digest = "construction", spec.digest, spec.digest
        client._pending, client._input_hash = None, None
    client.spec = _spec_for(client, spec)
    return client


def _spec_for(client: SecAggClient, spec):
    """The spec the stored ``client`` holds, given what the site passed (module docstring)."""
    if not isinstance(spec, (RoundSpec, SetupSpec)):
        raise DecodeError(f"load_client needs a RoundSpec or a SetupSpec, not {type(spec).__name__}")
    if client.schedule == "construction":
        if not isinstance(spec, RoundSpec) or spec.digest != client._key_digest:
            raise DecodeError(f"stored SecAgg client {client.id} was built for another round spec; refused")
        return spec
    if spec.setup.digest != client._key_digest:
        raise DecodeError(f"stored SecAgg client {client.id} was set up for another setup part; refused")
    if client._bound_digest is None:
        return spec.setup  # not bound yet: only the setup part is known to the machine
    if not isinstance(spec, RoundSpec) or spec.digest != client._bound_digest:
        raise DecodeError(
            f"stored SecAgg client {client.id} is bound to another input part; pass the full spec it was "
            "bound to (setup.bind(input_spec)); refused"
        )
    return spec
