"""The federated job, written once: a sans-I/O :class:`Coordinator`, a :class:`SiteWorker` per site, and the
in-process driver; Flower (:mod:`securefed.flower`) is the other driver of the same coordinator.

Names load on first use, so a site process that needs only :mod:`.site` imports nothing else."""

from __future__ import annotations

import importlib

_WHERE = {
    "Coordinator": "coordinator",
    "Request": "coordinator",
    "ListNodes": "coordinator",
    "InMemoryExchange": "inprocess",
    "drive": "inprocess",
    "run_in_process": "inprocess",
    "RunResult": "result",
    "SiteWorker": "site",
}

__all__ = list(_WHERE)


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
    globals()[name] = value
    return value
