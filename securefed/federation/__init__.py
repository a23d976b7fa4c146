"""The federated job, written once: a sans-I/O :class:`Coordinator`, a :class:`SiteWorker` per site, and the
in-process driver; Flower (:mod:`securefed.flower`) is the other driver of the same coordinator."""

from .coordinator import Coordinator, ListNodes, Request
from .inprocess import InMemoryExchange, drive, run_in_process
from .result import RunResult
from .site import SiteWorker

__all__ = ["Coordinator", "Request", "ListNodes", "SiteWorker", "InMemoryExchange", "drive", "run_in_process",
           "RunResult"]
