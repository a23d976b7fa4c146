"""The cost of a site's budget over all its runs (issue 25 item 3): a FedDL run with file ledgers, each release checked and
booked under the site's lock against its hash-chained index and every other run's ledger.

Prints the wall time of one DP run (3 sites, gradient averaging, ``--rounds`` × 2 local steps, file ledgers) at a site
folder that already holds ``--earlier`` finished runs, and the index's size. Run it on two checkouts side by side to
compare (the older code keeps no index; pass ``--earlier 0`` there if its budget check refuses).

    python benchmarks/accounting_site_budget.py --rounds 20 --earlier 5
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import numpy as np


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--earlier", type=int, default=5, help="finished runs already in each site's ledger folder")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)

    from threadpoolctl import threadpool_limits

    from securefed.federation import Coordinator, InMemoryExchange, SiteWorker, drive
    from securefed.federation.privacy import open_server_ledger
    from securefed.plan import RunPlan

    rng = np.random.default_rng(5)
    sites = [rng.normal(size=(60, 4)) * 0.5 + 0.3 * i for i in range(3)]

    def run(folder, run_id, rounds):
        plan = RunPlan.build(
            "api",
            method="none",
            landmark_method="feddl",
            landmarks=8,
            rounds=rounds,
            local_steps=2,
            rule="gradient",
            aggregation="plain",
            value_bound=3.0,
            min_sites=3,
            seed=3,
            audit_holdout=0.0,
            epsilon=1.0,
            clip_norm=2.0,
            run_id=run_id,
        )
        workers = {
            i: SiteWorker(
                {
                    "site-name": f"s{i}",
                    "allow-plain": True,
                    "epsilon-budget": 1e6,
                    "ledger-path": os.path.join(folder, f"s{i}"),
                },
                X,
            )
            for i, X in enumerate(sites)
        }
        t0 = time.perf_counter()
        drive(Coordinator(plan, ledger=open_server_ledger(plan, run_id, None)), InMemoryExchange(workers))
        return time.perf_counter() - t0

    times = []
    with threadpool_limits(limits=1, user_api="blas"):
        for _ in range(args.repeats):
            with tempfile.TemporaryDirectory() as tmp:
                for k in range(args.earlier):
                    run(tmp, f"earlier-{k}", args.rounds)
                times.append(run(tmp, "measured", args.rounds))
                index = os.path.join(tmp, "s0", "site-index.jsonl")
                lines = sum(1 for _ in open(index)) if os.path.exists(index) else 0
    print(
        f"rounds {args.rounds} × 2 steps, {args.earlier} earlier runs per site: run {np.median(times):.2f} s "
        f"(min {min(times):.2f}, max {max(times):.2f}); site index {lines} lines"
    )


if __name__ == "__main__":
    main()
