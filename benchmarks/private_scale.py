"""The default private job at the size hospitals have (issue 27): Fashion-MNIST from 5 000 to 70 000 records.

Usage::

    OMP_NUM_THREADS=1 nice -n 5 python benchmarks/private_scale.py [--sizes 5000 10000 20000 40000 70000]
        [--sites 10] [--partition iid] [--seed 0] [--eps E ...] [--no-central] [--n-jobs 1] [--log FILE]

For every size n (a seeded subset of the 70 000 Fashion-MNIST records — ``securefed.data.fashion_mnist_subset``, the
same records as ``--dataset fashion-mnist-5k`` / ``-20k`` at those sizes — split over ``--sites`` sites the way
``securefed run`` splits them), each in a fresh process so that peak RSS is the job's own:

* ``fed``: the default private job as ``securefed run --dataset fashion-mnist`` plans it (cells, SecAgg+ with the
  public pixel bound 255, audit hold-out 0.2, the t-SNE placement on every site), in process, one site after the
  other; with ``--eps E`` the DP billboard at ε = E (δ = 1e-5 for the whole run; ``inf`` = ε 1e6) instead — as
  ``securefed run --epsilon E``;
* ``central``: centralized openTSNE (``CentralizedTSNE``, the baseline ``securefed run`` compares with) on the same
  records, same ``--n-jobs``.

Prints one JSON line per process (wall and CPU seconds, peak RSS, the stages' wall times from the run's events,
cells, audit AUC and verdict, CA-10NN) and a markdown table at the end. Needs the Debian package
``dataset-fashion-mnist``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import subprocess
import sys
import time
import warnings

import numpy as np

warnings.filterwarnings("ignore")


def _records(n: int, sites: int, scheme: str, seed: int):
    from securefed.data import fashion_mnist_subset, load_dataset, partition

    ds = load_dataset("fashion-mnist")
    if n < len(ds.X):
        keep = fashion_mnist_subset(len(ds.X), n)
        X, y = ds.X[keep], ds.y[keep]
    else:
        X, y = ds.X, ds.y
    parts = partition(X, y, sites, scheme, random_state=np.random.default_rng(seed))  # as securefed run splits
    return [X[i] for i in parts], np.concatenate([y[i] for i in parts])


def _usage() -> tuple[float, float]:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime, r.ru_maxrss / 1024**2


def one(a) -> dict:
    from securefed.metrics import classification_accuracy

    sites, y = _records(a.n, a.sites, a.partition, a.seed)
    X = np.vstack(sites)
    out = {"part": a.one, "n": a.n, "sites": a.sites, "partition": a.partition, "seed": a.seed}
    cpu0, _ = _usage()
    t0 = time.perf_counter()
    if a.one == "central":
        from securefed.estimators import CentralizedTSNE

        emb = CentralizedTSNE(random_state=a.seed, n_jobs=a.n_jobs).fit_transform(X)
    else:
        from securefed.federation import run_in_process
        from securefed.federation.inprocess import site_names
        from securefed.plan import RunPlan

        opts = {"value_bound": 255.0, "n_clusters": 10, "seed": a.seed, "n_jobs": a.n_jobs}
        if a.eps is not None:
            opts = {
                "epsilon": 1e6 if math.isinf(a.eps) else a.eps,
                "clip_norm": 255.0 * math.sqrt(X.shape[1]),
                "n_clusters": 10,
                "seed": a.seed,
                "n_jobs": a.n_jobs,
            }  # securefed run's public clip norm
            out["epsilon"] = a.eps
        if a.landmarks is not None:
            opts["landmarks"] = a.landmarks
            out["landmarks"] = a.landmarks
        if a.placement_perplexity is not None:
            opts["placement_perplexity"] = a.placement_perplexity
            out["placement_perplexity"] = a.placement_perplexity
        plan = RunPlan.build("cli", method="tsne", keep_rows=True, min_sites=1, **opts)
        events = []

        def on_event(ev):
            ev = dict(ev, t=ev.get("t", time.perf_counter() - t0))  # the sites' placement events carry no clock
            events.append(ev)
            if a.progress:
                info = {k: v for k, v in ev.items() if k in ("round", "cells", "site", "done", "total")}
                print(f"  [{ev['event']}] {ev.get('t', 0):.1f} s {info}", file=sys.stderr, flush=True)

        res = run_in_process(plan, sites, names=site_names(len(sites)), on_event=on_event)
        emb = res.stacked("coordinates")
        t = {ev["event"]: ev["t"] for ev in events}  # the last time each event was seen
        first: dict = {}
        for ev in events:
            first.setdefault(ev["event"], ev["t"])
        out.update(
            cells=len(res.landmarks),
            auc=None if res.audit is None else float(res.audit["auc"]),
            verdict=None if res.audit is None else res.audit.get("verdict"),
            stages={
                "landmarks": first.get("audit", first.get("embedding", 0.0)),
                "audit": (first.get("embedding", 0.0) - first["audit"]) if "audit" in first else 0.0,
                "placement": t.get("embedded", 0.0) - first.get("embedding", 0.0),
            },
            epsilon_spent=None if res.privacy is None else float(res.privacy["epsilon"]),
        )
    wall = time.perf_counter() - t0
    cpu1, rss = _usage()
    out.update(
        wall=round(wall, 1),
        cpu=round(cpu1 - cpu0, 1),
        peak_rss_gb=round(rss, 3),
        ca10=round(float(classification_accuracy(emb, y, ks=(10,), random_state=0)[10]), 4),
    )
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", nargs="+", type=int, default=[5_000, 10_000, 20_000, 40_000, 70_000])
    ap.add_argument("--sites", type=int, default=10)
    ap.add_argument("--partition", default="iid")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--eps", nargs="+", type=float, default=None, help="the DP billboard at these ε instead")
    ap.add_argument("--no-central", action="store_true")
    ap.add_argument("--no-default", action="store_true", help="with --eps: skip the no-DP default run")
    ap.add_argument("--n-jobs", type=int, default=1)
    ap.add_argument("--placement-perplexity", type=float, default=None, help="instead of the plan's default")
    ap.add_argument(
        "--landmarks",
        type=int,
        default=None,
        help="instead of the plan's default (auto: the cells as many as the records allow)",
    )
    ap.add_argument("--log", default=None, help="append the JSON lines to this file too")
    ap.add_argument("--progress", action="store_true", help="print the run's events")
    ap.add_argument("--one", choices=["fed", "central"], help=argparse.SUPPRESS)
    ap.add_argument("--n", type=int, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.one:
        if a.eps is not None:
            a.eps = a.eps[0]
        print(json.dumps(one(a)), flush=True)
        return
    rows = []
    for n in a.sizes:
        jobs = [] if (a.eps and a.no_default) else [("fed", None)]
        jobs += [("fed", e) for e in (a.eps or [])]
        jobs += [] if a.no_central else [("central", None)]
        for part, e in jobs:
            cmd = [
                sys.executable,
                __file__,
                "--one",
                part,
                "--n",
                str(n),
                "--sites",
                str(a.sites),
                "--partition",
                a.partition,
                "--seed",
                str(a.seed),
                "--n-jobs",
                str(a.n_jobs),
            ]
            cmd += ["--progress"] if a.progress else []
            if a.placement_perplexity is not None:
                cmd += ["--placement-perplexity", str(a.placement_perplexity)]
            if a.landmarks is not None:
                cmd += ["--landmarks", str(a.landmarks)]
            if e is not None:
                cmd += ["--eps", str(e)]
            p = subprocess.run(cmd, check=False, capture_output=True, text=True, env=dict(os.environ))
            line = p.stdout.strip().splitlines()[-1] if p.returncode == 0 and p.stdout.strip() else None
            if line is None:
                r = {"part": part, "n": n, "epsilon": e, "error": (p.stderr.strip().splitlines() or ["?"])[-1]}
            else:
                r = json.loads(line)
            rows.append(r)
            print(json.dumps(r), flush=True)
            if a.log:
                with open(a.log, "a") as fh:
                    fh.write(json.dumps(r) + "\n")
    print(
        "\n| records | sites | job | ε | wall s | CPU s | peak RSS GB | cells | audit AUC (verdict) | CA-10NN | "
        "stages: landmarks / audit / placement s | wall / central |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        if "error" in r:
            print(f"| {r['n']} | {a.sites} | {r['part']} | {r.get('epsilon') or ''} | failed: {r['error']} |||||||")
            continue
        cen = next((c for c in rows if c["n"] == r["n"] and c["part"] == "central" and "wall" in c), None)
        st = r.get("stages")
        eps = "" if r.get("epsilon") is None else r["epsilon"]
        if r.get("placement_perplexity") is not None:
            eps = f"{eps} (placement perplexity {r['placement_perplexity']:g})"
        if r.get("landmarks") is not None:
            eps = f"{eps} (landmarks {r['landmarks']})"
        audit = "" if r.get("auc") is None else f"{r['auc']:.3f} ({r['verdict']})"
        stages = "" if not st else " / ".join(f"{st[k]:.0f}" for k in ("landmarks", "audit", "placement"))
        ratio = "" if cen is None or r["part"] == "central" else f"{r['wall'] / cen['wall']:.2f}"
        print(
            f"| {r['n']} | {r['sites']} | {r['part']} | {eps} | {r['wall']} | {r['cpu']} | {r['peak_rss_gb']:.2f} | "
            f"{r.get('cells', '')} | {audit} | {r['ca10']:.4f} | {stages} | {ratio} |"
        )


if __name__ == "__main__":
    main()
