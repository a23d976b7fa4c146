"""The Flower ``ServerApp`` of securefed: FedDL landmarks (plain / SecAgg+ / CKKS, optional DP), the
membership-audit gate, then the embedding (no-rows local placement or the paper's rows mode).

It waits for ``min-sites`` SuperNodes, runs :func:`securefed.flower.coordinator.run_feddl` and
writes ``<out-dir>/result.json`` (status, figures, bytes per site per step, privacy, audit, what was
released) and ``<out-dir>/landmarks.npy``, the embedding files (:func:`save_outputs`) and, under DP,
the aggregate ledger ``<out-dir>/ledger.jsonl``. A run that cannot complete (too few sites, a SecAgg+ round the protocol
cannot finish, a timeout) writes ``status: "aborted"`` with the typed error's class and message.
"""

from __future__ import annotations

import json
import os
import time
import traceback

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from ..errors import ProtocolTimeoutError, SecureFedError
from .coordinator import FlowerRunConfig, run_feddl, save_outputs
from .transport import Exchange

__all__ = ["app", "main"]

app = ServerApp()


def _write(out_dir: str, doc: dict) -> None:
    os.makedirs(out_dir, exist_ok=True)
    tmp = os.path.join(out_dir, "result.json.tmp")
    with open(tmp, "w") as fh:
        json.dump(doc, fh, indent=1, default=float)
    os.replace(tmp, os.path.join(out_dir, "result.json"))


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Run FedDL over the connected SuperNodes; never raises past here (the outcome goes to result.json)."""
    cfg = FlowerRunConfig.from_run_config(dict(context.run_config))
    t0 = time.monotonic()
    try:
        while True:
            nodes = sorted(grid.get_node_ids())
            if len(nodes) >= cfg.min_sites:
                break
            if time.monotonic() - t0 > cfg.wait_sites:
                raise ProtocolTimeoutError(f"only {len(nodes)} SuperNodes connected within {cfg.wait_sites:g} s "
                                           f"(min-sites = {cfg.min_sites})")
            time.sleep(0.2)
        if not cfg.run_id:
            cfg.run_id = f"flower-run-{context.run_id}"  # ledger run id: one ledger file per Flower run
        ex = Exchange(grid, dict(enumerate(nodes)))
        res = run_feddl(ex, cfg)
        _write(cfg.out_dir, {"status": "completed", **save_outputs(cfg.out_dir, res)})
    except SecureFedError as exc:
        _write(cfg.out_dir, {"status": "aborted", "error_type": type(exc).__name__, "reason": str(exc)})
    except Exception as exc:  # an unexpected failure is still reported, with its traceback
        _write(cfg.out_dir, {"status": "failed", "error_type": type(exc).__name__, "reason": str(exc),
                             "traceback": traceback.format_exc()})
