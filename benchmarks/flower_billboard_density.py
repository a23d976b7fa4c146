"""The DP billboard with its density release over a real Flower deployment (3 sites on 127.0.0.1).

Digits split by label into 3 sites (one ``.npy`` each), a SuperLink and 3 SuperNodes (real ``flower-superlink`` /
``flower-supernode`` processes, each site with its own ledger folder and ε budget), and the plan
``securefed run --epsilon 4 --coordinates keep --density-share 0.2`` would run: the billboard's three noisy releases,
the audit gate, the no-rows placement with the coordinates kept on the sites. Then the same plan in process.
Checks that the run completed, that every site's ledger holds the three releases and that ``density.npz`` was
written; prints one JSON line per run (wall seconds, round trips, the ledger's ε, the density's total).

    OMP_NUM_THREADS=1 python benchmarks/flower_billboard_density.py [--epsilon 4]
"""

import argparse
import json
import math
import os
import tempfile
import time

import numpy as np

from securefed.data import load_dataset, partition
from securefed.federation import run_in_process
from securefed.flower import LocalDeployment
from securefed.flower.launch import write_site_files
from securefed.plan import RunPlan, to_run_config


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--epsilon", type=float, default=4.0)
    a = ap.parse_args()
    ds = load_dataset("digits")
    idx = partition(ds.X, ds.y, 3, "label", random_state=0)
    sites = [ds.X[i] for i in idx]
    opts = dict(
        method="tsne",
        epsilon=a.epsilon,
        delta=1e-5,
        clip_norm=16.0 * math.sqrt(64),
        value_bound=16.0,
        coordinates="keep",
        density_share=0.2,
        min_sites=3,
        seed=0,
    )
    rows = []
    t0 = time.perf_counter()
    res = run_in_process(RunPlan.build("api", **opts), sites)
    rows.append(
        {
            "run": "in process",
            "seconds": round(time.perf_counter() - t0, 2),
            "round_trips": res.round_trips,
            "epsilon_spent": res.privacy["epsilon"],
            "releases": res.privacy["releases"],
            "density_total": round(float(res.embedding["density"]["counts"].sum()), 1),
            "records": len(ds.X),
        }
    )
    print(json.dumps(rows[-1]), flush=True)
    cfg = to_run_config(RunPlan.build("flower", **opts))
    with tempfile.TemporaryDirectory() as tmp:
        with LocalDeployment(os.path.join(tmp, "dep")) as dep:
            dep.start_superlink()
            for i, p in enumerate(write_site_files(tmp, sites)):
                dep.start_supernode(
                    f"site{i}", p, node_config={"epsilon-budget": 10.0, "ledger-path": os.path.join(tmp, f"ledgers{i}")}
                )
            t0 = time.perf_counter()
            out = dep.run(dict(cfg))
            doc = dep.wait_result(out, 1800)
            seconds = time.perf_counter() - t0
            assert doc["status"] == "completed", doc
            releases = []
            for i in range(3):
                folder = os.path.join(tmp, f"ledgers{i}")
                for name in os.listdir(folder):
                    if name.endswith(".jsonl"):
                        with open(os.path.join(folder, name)) as fh:
                            releases.append(
                                [json.loads(ln)["mechanism"] for ln in fh if json.loads(ln).get("type") == "release"]
                            )
            with np.load(os.path.join(out, "density.npz")) as z:
                total = float(z["counts"].sum())
        assert all(r == ["gaussian-rff", "gaussian-counts", "gaussian-density"] for r in releases), releases
        rows.append(
            {
                "run": "flower",
                "seconds": round(seconds, 2),
                "round_trips": doc.get("round_trips"),
                "round_trips_per_stage": doc.get("round_trips_per_stage"),
                "epsilon_spent": doc["privacy"]["epsilon"],
                "releases": doc["privacy"]["releases"],
                "site_ledgers": releases,
                "density_total": round(total, 1),
                "records": len(ds.X),
                "coordinates_left_sites": "embedding.npz" in os.listdir(out) if os.path.isdir(out) else None,
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    return rows


if __name__ == "__main__":
    main()
