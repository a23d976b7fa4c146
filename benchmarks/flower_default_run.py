"""The default private job over Flower vs in process (issue 17's target: ≤ 2 minutes on digits with 3 sites).

Splits the built-in digits into 3 sites by label (as ``securefed run --clients 3`` does), writes one ``.npy`` per
site, starts a SuperLink and 3 SuperNodes on 127.0.0.1 (real ``flower-superlink`` / ``flower-supernode``
processes, securefed's Flower settings: ``FLWR_SUPEREXEC_TASK_POLL_INTERVAL=0.1``, warm workers), and runs the
plan ``securefed run`` uses by default — cells landmarks through SecAgg+, the membership-audit gate, the
no-rows t-SNE placement — then the same plan in process with the in-memory exchange, back to back. Prints one
JSON line per run (wall seconds, round trips, request/reply steps per stage, CA-10NN) and the ratio.

    OMP_NUM_THREADS=1 python benchmarks/flower_default_run.py [--repeats 1] [--method tsne]
"""

import argparse
import json
import os
import tempfile
import time

import numpy as np

from securefed.data import load_dataset, partition
from securefed.federation import run_in_process
from securefed.flower import LocalDeployment
from securefed.flower.launch import write_site_files
from securefed.metrics import embedding_metrics
from securefed.plan import RunPlan, to_run_config


def _metrics(X, y, idx, coords):
    order = np.concatenate(idx)
    return embedding_metrics(X[order], np.vstack(coords), y[order], random_state=0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--method", default="tsne")
    a = ap.parse_args()
    ds = load_dataset("digits")
    X, y = ds.X, ds.y
    idx = partition(X, y, 3, "label", random_state=0)
    sites = [X[i] for i in idx]
    plan = RunPlan.build("flower", method=a.method, value_bound=16.0, min_sites=3, seed=0)
    cfg = to_run_config(plan)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        paths = write_site_files(tmp, sites)
        for rep in range(a.repeats):
            t0 = time.perf_counter()
            res = run_in_process(plan, sites)
            t_in = time.perf_counter() - t0
            m = _metrics(X, y, idx, [res.stacked("coordinates")])
            rows.append({"run": "in process", "repeat": rep, "seconds": round(t_in, 2), "round_trips": res.round_trips,
                         "round_trips_per_stage": res.round_trips_per_stage(),
                         "ca_10nn": round(m["ca_10nn"], 4), "cells": len(res.landmarks)})
            print(json.dumps(rows[-1]), flush=True)
            with LocalDeployment(os.path.join(tmp, f"dep{rep}")) as dep:
                t0 = time.perf_counter()
                dep.start_superlink()
                for i, p in enumerate(paths):
                    dep.start_supernode(f"site{i}", p)
                t_up = time.perf_counter() - t0
                t0 = time.perf_counter()
                out = dep.run(dict(cfg))
                doc = dep.wait_result(out, 900)
                t_fl = time.perf_counter() - t0
            assert doc["status"] == "completed", doc
            with np.load(os.path.join(out, "embedding.npz")) as z:
                coords = [z[f"site{i}"] for i in range(3)]
            m = _metrics(X, y, idx, coords)
            per_stage = doc.get("round_trips_per_stage")
            rows.append({"run": "flower", "repeat": rep, "seconds": round(t_fl, 2), "startup_seconds": round(t_up, 2),
                         "round_trips": doc.get("round_trips"), "round_trips_per_stage": per_stage,
                         "ca_10nn": round(m["ca_10nn"], 4), "audit": (doc.get("audit") or {}).get("verdict"),
                         "seconds_per_round_trip": round(t_fl / max(1, doc.get("round_trips") or 1), 2),
                         "ratio_to_in_process": round(t_fl / t_in, 1)})
            print(json.dumps(rows[-1]), flush=True)
    return rows


if __name__ == "__main__":
    main()
