"""The task digest of a secure sum: one SHA-256 over every field of a request that shapes a site's upload.

A coordinator asks the sites for a secure sum with a request (the task, its scales and bounds, centres or
landmarks, the space or basis, the noise mode, σ, bits, granularity, weight rule, sample rate, the plan's hash,
…). Each of those fields decides what a site's upload reveals, so a coordinator that sends different values
to different sites in one sum could isolate one site's upload (issue 25). The round spec therefore carries a
``task_digest`` (:class:`~.secagg.RoundSpec`, :class:`~.ckks.params.CKKSRoundSpec`), every signature of the
round covers the spec digest and with it the task digest, and every site:

1. computes :func:`task_digest` of the fields of the request *it* received (the same canonical encoding on
   every site, so honest sites shown the same request compute the same bytes);
2. refuses the round — before it computes anything — if the spec's ``task_digest`` differs
   (:func:`check_task_digest`);
3. signs the spec digest at every stage; a site shown another request signs another digest, so its messages
   verify for nobody else and honest sites reveal shares only under a quorum that signed their own digest
   (docs/threat-model-secure-sum.md §2, "one digest per sum").

The encoding is canonical JSON: dict keys sorted (they must be strings), tuples as lists, floats as
``float.hex`` (exact: 0.1 and 0.1000000000000000055 are different requests), bytes and numpy arrays as
tagged hex (an array's dtype and shape enter the digest). Anything else is refused with a typed error —
a field the digest cannot name must not be silently left out.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping

import numpy as np

from ..errors import ConfigError, ProtocolError, bad_value

__all__ = ["NO_TASK", "canonical_task_bytes", "check_task_digest", "task_digest"]

#: the ``task_digest`` of a spec that names no task
NO_TASK = bytes(32)


def _canon(value, where: str):
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, (int, np.integer)):
        return {"i": str(int(value))}
    if isinstance(value, (float, np.floating)):
        v = float(value)
        return {"f": v.hex() if math.isfinite(v) else repr(v)}
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {"b": bytes(value).hex()}
    if isinstance(value, np.ndarray):
        if value.dtype.kind not in "biuf":
            raise ConfigError(
                bad_value(where, value.dtype, "a task field array must hold booleans, integers or floats")
            )
        arr = np.ascontiguousarray(value)
        return {"nd": [arr.dtype.str, list(arr.shape), arr.tobytes().hex()]}
    if isinstance(value, (list, tuple)):
        return [_canon(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, Mapping):
        out = {}
        for k in value:
            if not isinstance(k, str):
                raise ConfigError(bad_value(f"{where} key", k, "task field names must be strings"))
            out[k] = _canon(value[k], f"{where}.{k}")
        return out
    raise ConfigError(
        bad_value(
            where,
            type(value).__name__,
            "a task field must be None, bool, str, int, float, bytes, a numpy array, or a list / dict of those",
        )
    )


def canonical_task_bytes(fields: Mapping) -> bytes:
    """The canonical encoding :func:`task_digest` hashes (module docstring)."""
    if not isinstance(fields, Mapping):
        raise ConfigError(bad_value("fields", type(fields).__name__, "give the request's fields as a mapping"))
    return json.dumps(_canon(fields, "fields"), sort_keys=True, separators=(",", ":")).encode()


def task_digest(fields: Mapping) -> bytes:
    """SHA-256 (domain-separated) of the canonical encoding of ``fields``: the spec's ``task_digest``."""
    return hashlib.sha256(b"securefed/task/v1|" + canonical_task_bytes(fields)).digest()


def check_task_digest(spec, fields: Mapping) -> bytes:
    """Refuse (:class:`ProtocolError`) a spec whose ``task_digest`` is not the digest of this site's own request
    ``fields``; return the digest. Call it before anything is computed for the sum."""
    mine = task_digest(fields)
    theirs = getattr(spec, "task_digest", NO_TASK)
    if theirs != mine:
        raise ProtocolError(
            f"the round spec's task digest {theirs.hex()[:16]}… is not the digest of the request this "
            f"site received ({mine.hex()[:16]}…): the coordinator sent this site another request "
            "than the one the round signs; refusing before anything is computed"
        )
    return mine
