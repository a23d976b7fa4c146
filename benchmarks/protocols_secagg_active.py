"""The cost of active security (issue 13): SecAgg+ round time and bytes before and after, and the ratio to Flower.

    git archive af4c1d0 | tar -x -C /tmp/before      # the tree before issue 13 (a commit of this repository)
    OMP_NUM_THREADS=1 python3 benchmarks/protocols_secagg_active.py --before-src /tmp/before   # N = 10, 50, 100; d = 1e5
    OMP_NUM_THREADS=1 python3 benchmarks/protocols_secagg_active.py --before-src /tmp/before --clients 10 --length 10000

Each configuration runs one complete SecAgg+ round in-process (every client and the server on this machine, so
the round time is the CPU work of all parties, serialised) with 10 % of the clients dropping after the share
stage (``drop_stage="masked"``: the server must recover their pairwise masks), default parameters of each
version:

* **before** — the pre-issue-13 machine (honest-but-curious parameter choice, unsigned masked inputs and
  unmask responses, a neighbour-local consistency check), imported from a source tree of commit af4c1d0 of
  this repository (``--before-src DIR``, made with ``git archive af4c1d0 | tar -x -C DIR``; package
  ``securefed.protocols``);
* **after** — this tree (malicious-server parameters: complete graph with 2t > k + c and the quorum
  2q > n + c up to 128 sites; signatures on every message, share hashes, seed commitments, signed peer sets).

Each version runs in its own subprocess (both are the package ``securefed``). Flower's own SecAgg+
(``flwr`` 1.41, its real ``SecAggPlusWorkflow`` and ``secaggplus_mod``, driven in memory as in
``benchmarks/protocols_flower.py``, no dropouts) runs at N = 50 with the same degree and threshold as the
"after" default (``num_shares = k + 1``, Flower counts the client itself), against "after" without dropouts.
Prints one table and the JSON rows.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def worker(version: str, n: int, d: int, dropout: float, seed: int) -> dict:
    """One round in this process (the right ``securefed`` is on sys.path)."""
    if version == "before":
        from securefed.protocols import SecAggAggregator
    else:
        from securefed.securesum import SecAggAggregator
    rng = np.random.default_rng(seed)
    ups = [rng.uniform(-1, 1, d) for _ in range(n)]
    agg = SecAggAggregator(
        clip_range=1.0, dropout=dropout or None, drop_stage="masked" if dropout else None, random_state=seed
    )
    t0 = time.perf_counter()
    res = agg.aggregate(ups)
    wall = time.perf_counter() - t0
    err = float(np.max(np.abs(res.total - np.sum([ups[i] for i in res.survivors], axis=0))))
    tm = res.details["timings"]
    return {
        "version": version,
        "clients": n,
        "length": d,
        "dropout": dropout,
        "degree": res.details["degree"],
        "threshold": res.details["threshold"],
        "quorum": res.details.get("quorum"),
        "survivors": len(res.survivors),
        "round_seconds": round(wall, 3),
        "client_seconds_mean": round(sum(v["clients"] for v in tm.values() if isinstance(v, dict)) / n, 4),
        "server_seconds": round(sum(v["server"] for v in tm.values() if isinstance(v, dict)), 3),
        "bytes_up_per_client": int(res.bytes_up),
        "bytes_down_per_client": int(res.details["bytes_to_clients"] // n),
        "max_abs_error": err,
    }


def flower(n: int, d: int, shares: int, threshold: int, seed: int) -> dict:
    sys.path.insert(0, HERE)
    from protocols_flower import run_flower

    return run_flower(n, d, shares, threshold, seed)


def _run(version: str, args, n: int, dropout: float, src: str) -> dict:
    env = dict(os.environ, PYTHONPATH=src, OMP_NUM_THREADS="1")
    cmd = [
        sys.executable,
        os.path.abspath(__file__),
        "--worker",
        version,
        "--clients",
        str(n),
        "--length",
        str(args.length),
        "--dropout",
        str(dropout),
        "--seed",
        str(args.seed),
    ]
    if version == "flower":
        cmd += ["--shares", str(args._shares), "--threshold", str(args._threshold)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def machine() -> dict:
    try:
        model = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        model = platform.processor()
    commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout
    return {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "cpu": model,
        "cores": os.cpu_count(),
        "load_average": [round(x, 1) for x in os.getloadavg()],
        "python": platform.python_version(),
        "commit": commit.strip(),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--clients", type=int, nargs="*", default=[10, 50, 100])
    ap.add_argument("--length", type=int, default=100_000)
    ap.add_argument("--dropout", type=float, default=0.1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--flower-clients", type=int, default=50)
    ap.add_argument(
        "--before-src",
        help="source tree of commit af4c1d0 (git archive af4c1d0 | tar -x -C DIR); required unless --worker",
    )
    ap.add_argument("--worker", choices=("before", "after", "flower"))
    ap.add_argument("--shares", type=int)
    ap.add_argument("--threshold", type=int)
    args = ap.parse_args()
    if args.worker:
        n = args.clients[0]
        row = (
            flower(n, args.length, args.shares, args.threshold, args.seed)
            if args.worker == "flower"
            else worker(args.worker, n, args.length, args.dropout, args.seed)
        )
        print(json.dumps(row))
        return
    if not args.before_src:
        ap.error("--before-src DIR is required: git archive af4c1d0 | tar -x -C DIR")
    info = machine()
    print(
        f"# {info['date']}  {info['cpu']} ({info['cores']} cores, load {info['load_average']})  Python "
        f"{info['python']}  commit {info['commit']}"
    )
    print(f"# {' '.join([os.path.basename(sys.executable)] + sys.argv)}")
    rows = []
    head = ("N", "version", "k", "t", "q", "surv", "round s", "client s", "server s", "up B/client", "down B/client")
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for n in args.clients:
        pair = {}
        for version, src in (("before", args.before_src), ("after", ROOT)):
            r = _run(version, args, n, args.dropout, src)
            pair[version] = r
            rows.append(r)
            print(
                f"| {n} | {version} | {r['degree']} | {r['threshold']} | {r['quorum'] or '-'} | {r['survivors']} | "
                f"{r['round_seconds']} | {r['client_seconds_mean']} | {r['server_seconds']} | "
                f"{r['bytes_up_per_client']} | {r['bytes_down_per_client']} |"
            )
        print(
            f"| {n} | after / before | | | | | {pair['after']['round_seconds'] / pair['before']['round_seconds']:.2f}x | | | "
            f"{pair['after']['bytes_up_per_client'] / pair['before']['bytes_up_per_client']:.3f}x | "
            f"{pair['after']['bytes_down_per_client'] / pair['before']['bytes_down_per_client']:.2f}x |"
        )
    nf = args.flower_clients
    if nf:
        ours = _run("after", args, nf, 0.0, ROOT)
        args._shares, args._threshold = ours["degree"] + 1, ours["threshold"]
        fl = _run("flower", args, nf, 0.0, ROOT)
        rows += [dict(ours, note="no dropout, vs Flower"), fl]
        print(
            f"\nFlower SecAgg+ at N = {nf}, d = {args.length}, no dropout, num_shares = {args._shares}, "
            f"threshold = {args._threshold}: Flower {fl['seconds']:.3f} s, securefed (after) {ours['round_seconds']} s "
            f"-> securefed is {fl['seconds'] / ours['round_seconds']:.2f}x faster"
        )
    print(json.dumps({"machine": info, "rows": rows}))


if __name__ == "__main__":
    main()
