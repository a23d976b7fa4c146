"""The secure-sum seam of FedDL: how the server obtains the (weighted) sum of client updates.

FedDL (Algorithm 1 of Qiao et al., lines 11–14; docs/papers.md) needs only the *sum* of the clients' uploads
(``Y_p`` for model averaging, Eq. 15; ``∇f_p`` for gradient averaging, Eq. 16). An
:class:`Aggregator` is the one place that sum is formed. ``PlainAggregator`` sums in the clear (the
server sees every upload); ``securefed.securesum`` provides SecAgg+ and CKKS aggregators with the same
interface, under which the server learns only the sum.

An aggregator may lose clients (dropouts). It says which inputs made it into the sum in
``AggregateResult.survivors``; callers divide by the surviving weight, never by the original count.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, Sequence, runtime_checkable

import numpy as np

from ..errors import ConfigError, bad_value

__all__ = ["AggregateResult", "Aggregator", "PlainAggregator", "make_aggregator", "AGGREGATIONS"]


@dataclass(frozen=True)
class AggregateResult:
    """What the server obtains from one aggregation.

    Attributes
    ----------
    total : ndarray
        ``Σ_{p ∈ survivors} w_p · u_p`` in float64, same shape as each update.
    survivors : tuple of int
        Indices (into the ``updates`` list) of the clients whose input is in ``total``.
    weight_sum : float
        ``Σ_{p ∈ survivors} w_p``; divide ``total`` by it for the weighted mean.
    protocol : str
        ``"plain"``, ``"secagg"`` or ``"ckks"``.
    clipped : int
        Number of coordinates clipped to the protocol's range (0 for plain). Never silent.
    bytes_up : int
        Bytes uploaded per client (mean over survivors), as the protocol counts them.
    bytes_down : int
        Bytes the server received in total.
    seconds : float
        Wall time of the aggregation.
    details : dict
        Protocol-specific figures (stages, thresholds, precision).
    """

    total: np.ndarray
    survivors: tuple[int, ...]
    weight_sum: float
    protocol: str
    clipped: int = 0
    bytes_up: int = 0
    bytes_down: int = 0
    seconds: float = 0.0
    details: dict = field(default_factory=dict)


@runtime_checkable
class Aggregator(Protocol):
    """Anything that turns per-client updates into their weighted sum."""

    name: str

    def aggregate(
        self,
        updates: Sequence[np.ndarray],
        weights: Sequence[float] | None = None,
        *,
        round_index: int = 0,
    ) -> AggregateResult:
        """Return the weighted sum of ``updates`` (weights default to 1)."""
        ...


def _check_updates(updates: Sequence[np.ndarray], weights: Sequence[float] | None):
    if len(updates) == 0:
        raise ConfigError(bad_value("updates", [], "pass at least one client update"))
    shape = np.shape(updates[0])
    for i, u in enumerate(updates):
        if np.shape(u) != shape:
            raise ConfigError(bad_value(f"updates[{i}].shape", np.shape(u), f"all updates must have shape {shape}"))
    if weights is None:
        weights = [1.0] * len(updates)
    w = np.asarray(weights, dtype=float)
    if w.shape != (len(updates),) or not np.all(np.isfinite(w)) or np.any(w < 0):
        raise ConfigError(bad_value("weights", weights, "give one finite non-negative weight per update"))
    return w


class PlainAggregator:
    """Sum in the clear: the server sees every client's update (docs/threat-model-secure-sum.md)."""

    name = "plain"

    def aggregate(self, updates, weights=None, *, round_index=0):
        import time

        t0 = time.perf_counter()
        w = _check_updates(updates, weights)
        total = np.zeros(np.shape(updates[0]), dtype=np.float64)
        for wi, u in zip(w, updates):
            total += wi * np.asarray(u, dtype=np.float64)
        nbytes = int(np.asarray(updates[0], dtype=np.float64).nbytes)
        return AggregateResult(
            total=total,
            survivors=tuple(range(len(updates))),
            weight_sum=float(w.sum()),
            protocol="plain",
            bytes_up=nbytes,
            bytes_down=nbytes * len(updates),
            seconds=time.perf_counter() - t0,
        )


AGGREGATIONS = ("plain", "secagg", "ckks")


def make_aggregator(name: str, **options) -> Aggregator:
    """Build an aggregator by name: ``"plain"``, ``"secagg"`` (SecAgg+) or ``"ckks"`` (TenSEAL CKKS)."""
    if name == "plain":
        if options:
            raise ConfigError(bad_value("aggregation options", options, "plain aggregation takes no options"))
        return PlainAggregator()
    if name == "secagg":
        from . import SecAggAggregator

        return SecAggAggregator(**options)
    if name == "ckks":
        from . import CKKSAggregator

        return CKKSAggregator(**options)
    raise ConfigError(bad_value("aggregation", name, f"choose one of {', '.join(AGGREGATIONS)}"))
