"""The Flower ``ServerApp`` of securefed: the one coordinator (:mod:`securefed.federation.coordinator`) driven
over Flower.

It waits for ``min-sites`` SuperNodes, runs the job the run configuration describes (the plan's options,
:func:`securefed.plan.from_run_config`, plus the driver's ``out-dir`` and ``wait-sites``) and writes the run
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

from ..errors import ProtocolTimeoutError, SecureFedError
from .transport import FlowerExchange

__all__ = ["app", "main", "DRIVER_DEFAULTS", "run_over_flower"]

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
    try:
        extra = {} if rc.get("run-id") or flower_run_id is None else {"run_id": f"flower-run-{flower_run_id}"}
        plan = from_run_config(rc, **extra)
        t0 = time.monotonic()
        while len(grid.get_node_ids()) < plan.min_sites:
            if time.monotonic() - t0 > wait:
                raise ProtocolTimeoutError(f"only {len(grid.get_node_ids())} SuperNodes connected within {wait:g} s "
                                           f"(min-sites = {plan.min_sites})")
            time.sleep(0.2)
        os.makedirs(out_dir, exist_ok=True)
        from ..federation.privacy import derive_run_id

        ledger = open_server_ledger(plan, plan.run_id or derive_run_id(plan), os.path.join(out_dir, "ledger.jsonl")) \
            if plan.dp else None
        co = Coordinator(plan, ledger=ledger, on_event=_progress(out_dir))
        res = drive(co, FlowerExchange(grid))
        doc = write_run_result(out_dir, res, plan)
    except SecureFedError as exc:
        doc = {"status": "aborted", "error_type": type(exc).__name__, "reason": str(exc)}
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
