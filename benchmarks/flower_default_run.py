"""The default private job over Flower vs in process, per Flower setting (issue 26's targets).

Splits the built-in digits into 3 sites by label (as ``securefed run --clients 3`` does), writes one ``.npy`` per
site and runs the plan ``securefed run`` uses by default — cells landmarks through SecAgg+, the membership-audit
gate, the no-rows t-SNE placement — in process (the in-memory exchange) and then over a 3-site loopback deployment
(real ``flower-superlink`` / ``flower-supernode`` processes, securefed's Flower settings, warm workers) for every
setting of ``benchmarks/flower_path.py``, back to back in the same run:

* ``stock``: flwr 1.41 as installed, ``--isolation subprocess`` (Flower's SuperExec: one ``flwr-clientapp``
  interpreter per message) — the default;
* ``fork``: ``--isolation process`` with securefed's SuperExec (opt-in; uses Flower internals);
* the same with every ``--flower-build`` (a throw-away virtualenv with a patched COPY of flwr, never shipped —
  docs/flower-upstream-request.md).

For each Flower run: wall seconds, round trips (total and per stage, from ``result.json``), seconds per round trip,
the median round trip split into Flower's and securefed's parts (the maintainers' trace), the echo app's round trip
on the same deployment (Flower's floor), CPU seconds by role, CA-10NN and the audit verdict. One JSON line per run.

    OMP_NUM_THREADS=1 python benchmarks/flower_default_run.py [--settings stock fork] [--repeats 1]
        [--flower-build 'LABEL|BIN_DIR|K=V,K=V' ...] [--stage-timeout S] [--echo-trips 8] [--json out.json]
"""

import argparse
import json
import os
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from flower_path import add_build_args, one_setting, parse_builds  # noqa: E402

from securefed.data import load_dataset, partition  # noqa: E402
from securefed.federation import run_in_process  # noqa: E402
from securefed.flower.launch import write_site_files  # noqa: E402
from securefed.metrics import embedding_metrics  # noqa: E402
from securefed.plan import RunPlan, to_run_config  # noqa: E402


def _metrics(X, y, idx, coords):
    order = np.concatenate(idx)
    return embedding_metrics(X[order], np.vstack(coords), y[order], random_state=0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--method", default="tsne")
    ap.add_argument("--settings", nargs="+", default=["stock", "fork"], choices=["stock", "fork"])
    ap.add_argument("--echo-trips", type=int, default=8)
    ap.add_argument(
        "--stage-timeout",
        type=float,
        default=None,
        help="SecAgg+ stage deadline (unset: the protocol's 30–120 s); a loaded 2-core machine may need more",
    )
    ap.add_argument("--json", help="also write every row here")
    add_build_args(ap)
    a = ap.parse_args()
    ds = load_dataset("digits")
    X, y = ds.X, ds.y
    idx = partition(X, y, 3, "label", random_state=0)
    sites = [X[i] for i in idx]
    plan = RunPlan.build("flower", method=a.method, value_bound=16.0, min_sites=3, seed=0)
    cfg = to_run_config(plan)
    if a.stage_timeout:
        cfg["stage-timeout"] = a.stage_timeout
    builds = parse_builds(a)
    rows = []
    with tempfile.TemporaryDirectory(prefix="sf-default-") as tmp:
        paths = write_site_files(os.path.join(tmp, "data"), sites)
        for rep in range(a.repeats):
            t0 = time.perf_counter()
            res = run_in_process(plan, sites)
            t_in = time.perf_counter() - t0
            m = _metrics(X, y, idx, [res.stacked("coordinates")])
            rows.append(
                {
                    "run": "in process",
                    "repeat": rep,
                    "seconds": round(t_in, 2),
                    "round_trips": res.round_trips,
                    "round_trips_per_stage": res.round_trips_per_stage(),
                    "ca_10nn": round(m["ca_10nn"], 4),
                    "cells": len(res.landmarks),
                }
            )
            print(json.dumps(rows[-1]), flush=True)
            order = [(b, s, None) for b in builds for s in a.settings]
            order += [(builds[0], "stock", c) for c in a.code]
            if rep % 2:
                order.reverse()
            for (bname, bdir, benv), launcher, code in order:
                tag = f"{rep}-{len(rows)}"
                name = f"{bname}, {launcher}" + (f", code {code.split('=', 1)[0]}" if code else "")
                row = one_setting(
                    name,
                    bdir,
                    launcher,
                    benv,
                    paths,
                    cfg,
                    a.echo_trips,
                    tmp,
                    tag,
                    code_root=code.split("=", 1)[1] if code else None,
                )
                out = os.path.join(tmp, "dep-" + tag, "run")
                if row["status"] == "completed":
                    with np.load(os.path.join(out, "embedding.npz")) as z:
                        row["ca_10nn"] = round(_metrics(X, y, idx, [z[f"site{i}"] for i in range(3)])["ca_10nn"], 4)
                    with open(os.path.join(out, "result.json")) as fh:
                        row["audit"] = (json.load(fh).get("audit") or {}).get("verdict")
                row.update(repeat=rep, in_process_s=round(t_in, 2), ratio_to_in_process=round(row["wall_s"] / t_in, 1))
                rows.append(row)
                print(json.dumps(row), flush=True)
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(rows, fh, indent=1)
    return rows


if __name__ == "__main__":
    main()
