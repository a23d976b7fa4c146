"""Checkpoints of the coordinator's landmark rounds, written atomically by a driver and resumed only by the
same run (same options that shape the landmarks, same sites)."""

from __future__ import annotations

import json
import os

import numpy as np

from ..errors import ConfigError, bad_value

__all__ = ["fingerprint", "write_checkpoint", "read_checkpoint"]

_LANDMARK_OPTIONS = (
    "landmarks",
    "landmark_method",
    "local_steps",
    "rule",
    "lr",
    "gamma",
    "weights",
    "init",
    "aggregation",
    "value_bound",
    "epsilon",
    "noise_multiplier",
    "delta",
    "accountant",
    "noise",
    "clip_norm",
    "sample_rate",
    "sensitivity_rule",
    "min_survivors",
    "seed",
    "audit_holdout",
)


def fingerprint(plan, site_sizes, n_features: int) -> dict:
    """What a checkpoint must match to be resumed: the options that shape the landmarks and the sites' data."""
    opts = plan.as_dict()
    return {
        "options": {k: opts[k] for k in _LANDMARK_OPTIONS},
        "site_sizes": [int(n) for n in site_sizes],
        "n_features": int(n_features),
    }


def write_checkpoint(path: str, state: dict, fp: dict) -> None:
    """Write ``state`` (the coordinator's ``checkpoint`` event) atomically: temp file, fsync, rename, fsync dir."""
    doc = {k: v for k, v in state.items() if k != "Y"}
    doc["fingerprint"] = fp
    tmp = path + ".tmp"
    with open(tmp, "wb") as fh:
        np.savez(
            fh, Y=np.asarray(state["Y"]), state=np.frombuffer(json.dumps(doc, default=float).encode(), dtype=np.uint8)
        )
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    dfd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def read_checkpoint(path: str, fp: dict, rounds: int, option: str = "checkpoint") -> dict | None:
    """The state saved at ``path`` (None when there is none); :class:`ConfigError` when it belongs to another run."""
    if not path or not os.path.exists(path):
        return None
    try:
        with np.load(path) as z:
            Y, doc = z["Y"].copy(), json.loads(bytes(z["state"]).decode())
    except (OSError, ValueError, KeyError) as exc:
        raise ConfigError(bad_value(option, path, f"is not a readable checkpoint ({exc}); delete it")) from None
    if doc.get("fingerprint") != json.loads(json.dumps(fp, default=float)):
        raise ConfigError(
            bad_value(
                option,
                path,
                "was written by a run with other parameters or data; delete it or use "
                "another path (a checkpoint resumes only the same run)",
            )
        )
    if int(doc["round"]) > rounds:
        raise ConfigError(
            bad_value(
                "rounds",
                rounds,
                f"the checkpoint already holds {doc['round']} rounds; ask for at "
                "least that many or use another checkpoint path",
            )
        )
    doc["Y"] = Y
    return doc
