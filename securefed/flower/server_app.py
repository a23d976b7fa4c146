"""The Flower ``ServerApp`` of securefed: the one coordinator (:mod:`securefed.federation.coordinator`) driven
over Flower.

It waits (``wait-sites`` seconds at most) until ``min-sites`` SuperNodes are connected and their ClientApps answer
(:func:`wait_for_sites`: a ``ping`` the ClientApp answers without the site; not one of the run's round trips), runs
the job the run configuration describes (the plan's options, :func:`securefed.plan.from_run_config`, plus the
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


#: what a connected SuperNode that does not answer usually means (the ServerApp's error names it)
NOT_ANSWERING = (
    "a SuperNode that is connected but does not answer cannot run its ClientApp: look in its log. \"Runtime task-token "
    "authentication failed\" means flwr-clientapp took longer than Flower's 30 s between the task's claim and its "
    "first call (an overloaded machine: fewer processes per core, or securefed's SuperExec, which starts a ClientApp "
    "in milliseconds — docs/deploying-on-flower.md); \"Address already in use\" means two SuperNodes on one machine "
    "share a Runtime API port (give each its own --port)")


def wait_for_sites(grid, min_sites: int, wait: float, poll: float = 0.2) -> dict:
    """Wait (at most ``wait`` seconds in all) until ``min_sites`` SuperNodes are connected **and** their ClientApps
    answer a ``ping`` (the ClientApp answers it without the site). Returns what it saw (seconds, connected,
    answered); raises :class:`~securefed.errors.ProtocolTimeoutError` naming the likely cause otherwise.

    Once ``min_sites`` have answered, the others get as long again as the answers took (then the run goes on
    without waiting for them here; the coordinator's ``hello`` still asks every connected SuperNode)."""
    from flwr.app import Message

    from .transport import MESSAGE_TYPE, make_content

    t0 = time.monotonic()
    while len(list(grid.get_node_ids())) < min_sites:
        if time.monotonic() - t0 > wait:
            raise ProtocolTimeoutError(f"only {len(list(grid.get_node_ids()))} SuperNodes connected within "
                                       f"wait-sites = {wait:g} s (min-sites = {min_sites}); start the missing "
                                       "SuperNodes, or check that each was registered (node authentication) and "
                                       "reaches the SuperLink")
        time.sleep(poll)
    connected = time.monotonic() - t0
    nodes = sorted(int(n) for n in grid.get_node_ids())
    left = max(wait - connected, 1.0)
    ids = grid.push_messages([Message(make_content(op="ping"), dst_node_id=n, message_type=MESSAGE_TYPE,
                                      ttl=left + 30.0) for n in nodes])
    owner = {mid: n for mid, n in zip(ids, nodes) if mid}
    answered, failed = {}, {}
    t_ping = time.monotonic()
    grace_end = None
    while owner:
        t = time.monotonic()
        if t - t0 > wait or (grace_end is not None and t > grace_end):
            break
        for rep in grid.pull_messages(list(owner)):
            node = owner.pop(rep.metadata.reply_to_message_id, None)
            if node is None:
                continue
            if rep.has_content():
                answered[node] = round(time.monotonic() - t_ping, 2)
            else:
                failed[node] = rep.error.reason if rep.error is not None else "error reply"
        if len(answered) >= min_sites and grace_end is None:
            grace_end = time.monotonic() + (time.monotonic() - t_ping)
        if owner:
            time.sleep(poll / 4)
    seen = {"seconds": round(time.monotonic() - t0, 2), "connected": len(nodes), "answered": len(answered),
            "ping_seconds": sorted(answered.values())}
    if len(answered) < min_sites:
        why = f"; ClientApp errors: {sorted(set(failed.values()))}" if failed else ""
        raise ProtocolTimeoutError(f"{len(nodes)} SuperNode(s) connected but only {len(answered)} answered within "
                                   f"wait-sites = {wait:g} s (min-sites = {min_sites}){why}: {NOT_ANSWERING}")
    return seen


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
    co = None
    ready: dict = {}
    try:
        extra = {} if rc.get("run-id") or flower_run_id is None else {"run_id": f"flower-run-{flower_run_id}"}
        plan = from_run_config(rc, **extra)
        progress = _progress(out_dir)
        ready = wait_for_sites(grid, plan.min_sites, wait)
        progress({"event": "sites-ready", **ready})
        os.makedirs(out_dir, exist_ok=True)
        from ..federation.privacy import derive_run_id

        ledger = open_server_ledger(plan, plan.run_id or derive_run_id(plan), os.path.join(out_dir, "ledger.jsonl")) \
            if plan.dp else None
        co = Coordinator(plan, ledger=ledger, on_event=progress)
        res = drive(co, FlowerExchange(grid))
        ids = (res.embedding or {}).pop("record_ids", None)
        doc = write_run_result(out_dir, res, plan)
        write_join_table(out_dir, res.embedding or {}, ids)
    except SecureFedError as exc:
        doc = {"status": "aborted", "error_type": type(exc).__name__, "reason": str(exc)}
        slow = max(ready.get("ping_seconds") or [0.0])
        slow_stages = isinstance(exc, (ProtocolAbortedError, ProtocolTimeoutError)) and not rc.get("stage-timeout")
        if slow > 10.0 and slow_stages:
            doc["hint"] = (f"the SuperNodes took up to {slow:.0f} s to answer the readiness ping; SecAgg+ stages wait "
                           "30 s (advertise, share, consistency) by default — on a deployment this slow set "
                           "stage-timeout (seconds per stage) in the run configuration "
                           "(docs/deploying-on-flower.md §2)")
        if co is not None and "audit" in co.partial:
            audit = {k: v for k, v in co.partial["audit"].items() if k != "mia_result"}
            write_json(os.path.join(out_dir, "audit.json"), audit)
            doc["audit"] = audit
        write_json(os.path.join(out_dir, "result.json"), doc)
    except Exception as exc:  # an unexpected failure is still reported, with its traceback
        doc = {"status": "failed", "error_type": type(exc).__name__, "reason": str(exc),
               "traceback": traceback.format_exc()}
        write_json(os.path.join(out_dir, "result.json"), doc)
    return doc


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Run the job over the connected SuperNodes; the outcome goes to ``<out-dir>/result.json``."""
    run_over_flower(grid, dict(context.run_config), context.run_id)
