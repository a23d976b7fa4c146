"""The space the landmarks live in, and how a site maps its records into it.

* ``raw`` — the records' own features (FedDL, the paper's rows mode);
* ``pca`` — ``(x − μ)V`` with μ and V from one secure sum of moments (cell landmarks; broadcast to the sites);
* ``public`` — ``(x / scale)B`` clipped to a public norm, B a data-independent basis (the DP billboard: nothing
  data-dependent shapes the space).

Every request that carries landmarks carries the space (:meth:`LandmarkSpace.put`), and the site rebuilds it
(:meth:`LandmarkSpace.get`): for ``public`` it recomputes the basis from public numbers itself.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import DecodeError
from .wire import Array

__all__ = ["LandmarkSpace"]


@dataclass(frozen=True)
class LandmarkSpace:
    """The space of a request's landmarks; a message field of :mod:`.messages` (wire: ``space`` = the kind,
    ``space_mu`` / ``space_V`` for ``pca``, ``space_dim`` / ``space_scale`` / ``space_seed`` for ``public``)."""

    kind: str = "raw"
    mu: Array | None = None
    V: Array | None = None
    dim: int | None = None
    scale: float | None = None
    seed: int | None = None

    def __post_init__(self):
        if self.kind not in ("raw", "pca", "public"):
            raise DecodeError(f"unknown landmark space {self.kind!r}")
        if self.kind == "pca" and (self.mu is None or self.V is None):
            raise DecodeError("malformed pca landmark space: it needs space_mu and space_V")
        if self.kind == "public":
            if self.dim is None or self.scale is None or self.seed is None:
                raise DecodeError("malformed public landmark space: it needs space_dim, space_scale and space_seed")
            object.__setattr__(self, "dim", int(self.dim))
            object.__setattr__(self, "scale", float(self.scale))
            object.__setattr__(self, "seed", int(self.seed))
        elif self.kind == "raw" and any(v is not None for v in (self.mu, self.V, self.dim, self.scale, self.seed)):
            raise DecodeError("a raw landmark space carries no parameters")

    def features(self, X: np.ndarray) -> np.ndarray:
        """A site's records in this space."""
        if self.kind == "raw":
            return np.asarray(X, dtype=np.float64)
        if self.kind == "pca":
            from ..landmarks.cells import features

            return features(X, self.mu, self.V)
        from ..landmarks.merf import scaled_features

        return scaled_features(X, self.basis(np.shape(X)[1]), self.scale)

    def basis(self, m: int) -> np.ndarray:
        from ..landmarks.merf import public_basis

        return public_basis(m, self.dim, self.seed)[0]

    def basis_name(self, m: int) -> str:
        from ..landmarks.merf import public_basis

        return public_basis(m, self.dim, self.seed)[1] if self.kind == "public" else self.kind

    def to_original(self, Y: np.ndarray, m: int) -> np.ndarray:
        """Landmarks mapped back to the records' features (the coordinator's best reading of them)."""
        if self.kind == "raw":
            return np.asarray(Y)
        if self.kind == "pca":
            return self.mu + np.asarray(Y) @ self.V.T
        return (np.asarray(Y) @ self.basis(m).T) * self.scale

    def put(self, fields: dict) -> dict:
        """``fields`` with this space's wire fields added (returns ``fields``)."""
        from .messages import _encode_fields

        fields.update(_encode_fields(self, prefix="space"))
        return fields

    @classmethod
    def get(cls, fields: dict) -> "LandmarkSpace":
        """The space a flat request dict carries (``raw`` when it names none)."""
        from .messages import _decode_fields

        if "space" not in fields:
            return cls()
        return _decode_fields(cls, fields, set(), prefix="space", what="landmark space")
