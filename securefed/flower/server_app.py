"""The Flower ``ServerApp`` of securefed: the one coordinator (:mod:`securefed.federation.coordinator`) driven
over Flower.

It waits (``wait-sites`` seconds at most) until ``min-sites`` SuperNodes are connected and their ClientApps answer
(:func:`wait_for_sites`, then the run's first request, which waits for answers up to what is left of
``wait-sites``; when too few answer, the reason names the likely causes), runs the job the run configuration
describes (the plan's options, :func:`securefed.plan.from_run_config`, plus the
driver's ``out-dir`` and ``wait-sites``) and writes the run
folder (:func:`securefed.report.layout.write_run_result`): ``result.json`` (status, figures, bytes per site
per sum, privacy, audit, what was released), ``landmarks.npy``, the embedding files and, under DP, the
aggregate ledger ``ledger.jsonl``; ``progress.jsonl`` gets one line per event as the run goes. A run that
cannot complete writes ``status: "aborted"`` with the typed error's class and message (and, when the audit
gate stopped it, ``audit.json``).
"""

from __future__ import annotations

import json
import os
import time
import traceback

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from ..errors import ProtocolAbortedError, ProtocolTimeoutError, SecureFedError
from .transport import FlowerExchange

__all__ = ["app", "main", "DRIVER_DEFAULTS", "run_over_flower", "wait_for_sites", "write_join_table"]

#: run-configuration keys of the Flower driver itself (the rest are the plan's options)
DRIVER_DEFAULTS = {"out-dir": "securefed-flower-run", "wait-sites": 120.0}

app = ServerApp()


def _progress(out_dir: str):
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "progress.jsonl")

    def write(ev: dict) -> None:
        if ev.get("event") == "checkpoint":
            return
        with open(path, "a") as fh:
            fh.write(json.dumps(ev, default=str) + "\n")

    return write


#: what a connected SuperNode that does not answer usually means (the ServerApp's reason names it)
NOT_ANSWERING = (
    'a SuperNode that is connected but does not answer cannot run its ClientApp: look in its log. "Runtime task-token '
    "authentication failed\" means flwr-clientapp took longer than Flower's 30 s between the task's claim and its "
    "first call (an overloaded machine: fewer processes per core, or securefed's SuperExec, which starts a ClientApp "
    'in milliseconds — docs/deploying-on-flower.md); "Address already in use" means two SuperNodes on one machine '
    "share a Runtime API port (give each its own --port)"
)


def wait_for_sites(grid, min_sites: int, wait: float, poll: float = 0.2) -> float:
    """Wait (at most ``wait`` seconds) until ``min_sites`` SuperNodes are connected; returns the seconds it took.
    Raises :class:`~securefed.errors.ProtocolTimeoutError` naming what to check otherwise. (That they also answer
    is the run's first request's business: :class:`~securefed.flower.transport.FlowerExchange` gives it what is
    left of ``wait-sites``.)"""
    t0 = time.monotonic()
    while len(list(grid.get_node_ids())) < min_sites:
        if time.monotonic() - t0 > wait:
            raise ProtocolTimeoutError(
                f"only {len(list(grid.get_node_ids()))} SuperNodes connected within "
                f"wait-sites = {wait:g} s (min-sites = {min_sites}); start the missing "
                "SuperNodes, or check that each was registered (node authentication) and "
                "reaches the SuperLink"
            )
        time.sleep(poll)
    return time.monotonic() - t0


def write_join_table(out_dir: str, embedding: dict, ids: dict | None) -> str | None:
    """``embedding.csv`` beside ``embedding.npz`` / ``labels.npz``, as ``securefed run`` writes it: one row per record,
    ``site, record_id, x1 … xk`` (or ``cluster``); ``record_id`` is the site's own id when the site sent its ids
    (site options ``id-column`` and ``send-record-ids``), else the record's row number in the site's file."""
    from ..report.exports import write_embedding_table

    values = embedding.get("coordinates") or embedding.get("labels")
    if not values:
        return None
    return write_embedding_table(os.path.join(out_dir, "embedding.csv"), values, ids=ids)


def run_over_flower(grid, run_config: dict, flower_run_id=None) -> dict:
    """Run the job over ``grid``; returns the document written to ``result.json`` (never raises)."""
    from ..federation import Coordinator, drive
    from ..federation.privacy import open_server_ledger
    from ..plan import from_run_config
    from ..report.layout import write_run_result, write_json

    rc = dict(run_config)
    out_dir = str(rc.pop("out-dir", DRIVER_DEFAULTS["out-dir"]))
    wait = float(rc.pop("wait-sites", DRIVER_DEFAULTS["wait-sites"]))
    co = exchange = plan = None
    try:
        extra = {} if rc.get("run-id") or flower_run_id is None else {"run_id": f"flower-run-{flower_run_id}"}
        plan = from_run_config(rc, **extra)
        progress = _progress(out_dir)
        connected = wait_for_sites(grid, plan.min_sites, wait)
        # the run's first request (hello) waits for answers up to what is left of wait-sites (at least its own
        # deadline): a SuperNode is connected before its first ClientApp has started
        exchange = FlowerExchange(grid, first_wait=max(wait - connected, 0.0))
        os.makedirs(out_dir, exist_ok=True)
        from ..federation.privacy import derive_run_id

        ledger = (
            open_server_ledger(plan, plan.run_id or derive_run_id(plan), os.path.join(out_dir, "ledger.jsonl"))
            if plan.dp
            else None
        )
        co = Coordinator(plan, ledger=ledger, on_event=progress)
        res = drive(co, exchange)
        progress({"event": "first-request", **(exchange.first or {})})
        ids = (res.embedding or {}).pop("record_ids", None)
        doc = write_run_result(out_dir, res, plan)
        write_join_table(out_dir, res.embedding or {}, ids)
    except SecureFedError as exc:
        doc = {"status": "aborted", "error_type": type(exc).__name__, "reason": str(exc)}
        first = (exchange.first if exchange is not None else None) or {}
        if first and plan is not None and first["replied"] < plan.min_sites:
            doc["reason"] += (
                f" — {first['asked']} SuperNode(s) connected but {first['replied']} answered the "
                f"first request within wait-sites = {wait:g} s: {NOT_ANSWERING}"
            )
        elif (
            max(first.get("reply_seconds") or [0.0]) > 10.0
            and not rc.get("stage-timeout")
            and isinstance(exc, (ProtocolAbortedError, ProtocolTimeoutError))
        ):
            doc["hint"] = (
                f"the sites took up to {max(first['reply_seconds']):.0f} s to answer the first request; "
                "SecAgg+ stages wait 30 s (advertise, share, consistency) by default — on a deployment this "
                "slow set stage-timeout (seconds per stage) in the run configuration "
                "(docs/deploying-on-flower.md §2)"
            )
        if co is not None and "audit" in co.partial:
            audit = {k: v for k, v in co.partial["audit"].items() if k != "mia_result"}
            write_json(os.path.join(out_dir, "audit.json"), audit)
            doc["audit"] = audit
        write_json(os.path.join(out_dir, "result.json"), doc)
    except Exception as exc:  # an unexpected failure is still reported, with its traceback
        doc = {
            "status": "failed",
            "error_type": type(exc).__name__,
            "reason": str(exc),
            "traceback": traceback.format_exc(),
        }
        write_json(os.path.join(out_dir, "result.json"), doc)
    return doc


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Run the job over the connected SuperNodes; the outcome goes to ``<out-dir>/result.json``."""
    run_over_flower(grid, dict(context.run_config), context.run_id)
