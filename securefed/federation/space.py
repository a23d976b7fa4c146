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
from .wire import get_array, put_array

__all__ = ["LandmarkSpace"]


@dataclass(frozen=True)
class LandmarkSpace:
    kind: str = "raw"
    mu: np.ndarray | None = None
    V: np.ndarray | None = None
    dim: int = 0
    scale: float = 1.0
    seed: int = 0

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
        fields["space"] = self.kind
        if self.kind == "pca":
            put_array(fields, "space_mu", self.mu)
            put_array(fields, "space_V", self.V)
        elif self.kind == "public":
            fields.update(space_dim=int(self.dim), space_scale=float(self.scale), space_seed=int(self.seed))
        return fields

    @classmethod
    def get(cls, fields: dict) -> "LandmarkSpace":
        kind = fields.get("space", "raw")
        if kind == "raw":
            return cls()
        if kind == "pca":
            return cls("pca", get_array(fields, "space_mu"), get_array(fields, "space_V"))
        if kind == "public":
            try:
                return cls("public", dim=int(fields["space_dim"]), scale=float(fields["space_scale"]),
                           seed=int(fields["space_seed"]))
            except (KeyError, TypeError, ValueError) as exc:
                raise DecodeError(f"malformed public landmark space: {exc}") from None
        raise DecodeError(f"unknown landmark space {kind!r}")
