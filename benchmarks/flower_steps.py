"""Where a Flower request/reply step goes, with and without the sites' warm worker (issue 17).

Runs securefed jobs on a 3-site loopback deployment (``LocalDeployment``: SuperLink + 3 SuperNodes on 127.0.0.1,
``FLWR_SUPEREXEC_TASK_POLL_INTERVAL=0.1``, telemetry off) with the site option ``warm-worker`` false (cold: the
ClientApp process builds the site from ``context.state`` for every message) and true (warm: the ClientApp forwards
to the run's per-site worker), interleaved (the order alternates per repeat), plus the same job in process
(``run_in_process``, same plan, same coordinator and site code) in the same repeat.

Measured per run:

* **ClientApp CPU per message**: user+system CPU of every ``flwr-clientapp`` process the SuperNodes' SuperExecs
  start, read from ``/proc`` (a 50 ms sampler; a finished ClientApp stays readable as a zombie until its
  SuperExec reaps it at the next start), median over the run's messages;
* **wall per step**: for each site, the time between the starts of its successive ClientApp processes (one
  request/reply step of the whole deployment), median over sites and steps; also the run's wall time divided by
  its round trips;
* **worker CPU** (warm): each site's worker process (imports once, then all the site's computation);
* the run's wall time (``flwr run`` → ``result.json``), ServerApp seconds, round trips, messages; in-process seconds.

Jobs: ``step`` (digits in 3 sites, 50 landmarks, SecAgg+, 1 FedDL round, no embedding: a short run of
request/reply steps), ``plain`` and ``secagg`` (``benchmarks/flower_loopback.py``'s defaults: 50 landmarks, 2
rounds, 5 local steps, the no-rows t-SNE stage). Plain runs set the site option ``allow-plain``.

    python benchmarks/flower_steps.py --jobs step --repeats 3
    python benchmarks/flower_steps.py --jobs plain secagg --repeats 1 [--json out.json]

Prints one JSON line per run, then the tables (markdown).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import sys
import tempfile
import threading
import time

import numpy as np

from securefed.data import load_dataset
from securefed.flower import LocalDeployment
from securefed.flower.launch import write_site_files
from securefed.flower import worker as W

TICK = os.sysconf("SC_CLK_TCK")
JOBS = {
    "step": {"landmarks": 50, "rounds": 1, "local-steps": 5, "aggregation": "secagg", "method": "none"},
    "plain": {
        "landmarks": 50,
        "rounds": 2,
        "local-steps": 5,
        "aggregation": "plain",
        "method": "tsne",
        "nystrom": "local",
    },
    "secagg": {
        "landmarks": 50,
        "rounds": 2,
        "local-steps": 5,
        "aggregation": "secagg",
        "method": "tsne",
        "nystrom": "local",
    },
}


def _stat(pid: int):
    """(start time in s since boot, CPU seconds, state) of a process, or None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            rest = fh.read().rsplit(b")", 1)[1].split()
    except OSError:
        return None
    return int(rest[19]) / TICK, (int(rest[11]) + int(rest[12])) / TICK, rest[0].decode()


def _children(pid: int) -> list:
    out = []
    for f in glob.glob(f"/proc/{pid}/task/*/children"):
        try:
            with open(f) as fh:
                out += [int(x) for x in fh.read().split()]
        except OSError:
            pass
    return out


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode("utf-8", "replace")
    except OSError:
        return ""


class ClientAppSampler(threading.Thread):
    """Samples the ``flwr-clientapp`` processes under the given SuperNode pids (site name → pid)."""

    def __init__(self, supernodes: dict, interval: float = 0.05):
        super().__init__(daemon=True)
        self.supernodes, self.interval = supernodes, interval
        self.procs: dict = {}  # (pid, start) -> [site, start, cpu]
        self.stop = threading.Event()
        self._superexec: dict = {}
        self._known: dict = {}  # pid -> is a ClientApp

    def run(self):
        while not self.stop.is_set():
            self.sample()
            self.stop.wait(self.interval)
        self.sample()

    def sample(self):
        for site, sn in self.supernodes.items():
            if site not in self._superexec:
                se = [c for c in _children(sn) if "flower-superexec" in _cmdline(c)]
                if not se:
                    continue
                self._superexec[site] = se[0]
            for c in _children(self._superexec[site]):
                st = _stat(c)
                if st is None:
                    continue
                key = (c, st[0])
                if key not in self._known:
                    self._known[key] = "flwr-clientapp" in _cmdline(c)
                if self._known[key]:
                    self.procs[key] = [site, st[0], st[1]]


def _worker_cpu(dirs: list) -> list:
    """CPU seconds of the worker in each site's warm-worker directory (None when none listens)."""
    out = []
    for d in dirs:
        cpu = None
        for sock in glob.glob(os.path.join(d, "*.sock")):
            s = W.connect(W.Location(d, os.path.basename(sock)[:-5]))
            if s is not None:
                st = _stat(W.call(s, {"type": "status"})["pid"])
                cpu = None if st is None else round(st[1], 2)
        out.append(cpu)
    return out


def flower_run(job: str, warm: bool, paths: list, tmp: str, bound: float, tag: str) -> dict:
    cfg = dict(JOBS[job], **{"min-sites": 3, "seed": 0})
    if cfg["aggregation"] == "secagg":
        cfg.update({"value-bound": bound, "degree": 2, "threshold": 2})
    dirs = [os.path.join(tmp, f"w{tag}{i}") for i in range(3)]
    with LocalDeployment(os.path.join(tmp, "dep-" + tag)) as dep:
        dep.start_superlink()
        for i, p in enumerate(paths):
            nc = {"warm-worker": warm, "warm-worker-dir": dirs[i]}
            if cfg["aggregation"] == "plain":
                nc["allow-plain"] = True
            dep.start_supernode(f"site{i}", p, node_config=nc)
        sampler = ClientAppSampler({f"site{i}": dep.procs[f"site-site{i}"].pid for i in range(3)})
        sampler.start()
        t0 = time.perf_counter()
        out = dep.run(cfg)
        res = dep.wait_result(out, 3600)
        wall = time.perf_counter() - t0
        time.sleep(0.3)
        wcpu = _worker_cpu(dirs) if warm else [None] * 3
        sampler.stop.set()
        sampler.join()
    procs = list(sampler.procs.values())
    cpu = [c for _, _, c in procs]
    steps = []
    for i in range(3):
        starts = sorted(s for site, s, _ in procs if site == f"site{i}")
        steps += [b - a for a, b in zip(starts, starts[1:])]
    rt = res.get("round_trips") or 0
    return {
        "job": job,
        "mode": "warm" if warm else "cold",
        "status": res["status"],
        "wall_s": round(wall, 2),
        "server_app_s": round(res.get("seconds", float("nan")), 2),
        "round_trips": rt,
        "messages": res.get("messages"),
        "clientapps": len(procs),
        "clientapp_cpu_median_s": round(statistics.median(cpu), 3) if cpu else None,
        "clientapp_cpu_total_s": round(sum(cpu), 1),
        "step_wall_median_s": round(statistics.median(steps), 2) if steps else None,
        "wall_per_round_trip_s": round(wall / rt, 2) if rt else None,
        "worker_cpu_s": wcpu,
        "error": res.get("reason"),
    }


def in_process(job: str, sites: list, bound: float) -> float:
    from securefed.federation import run_in_process
    from securefed.plan import from_run_config

    cfg = dict(JOBS[job], **{"min-sites": 3, "seed": 0})
    if cfg["aggregation"] == "secagg":
        cfg.update({"value-bound": bound, "degree": 2, "threshold": 2})
    plan = from_run_config(cfg)
    t0 = time.perf_counter()
    run_in_process(plan, sites, names=["site0", "site1", "site2"])
    return time.perf_counter() - t0


def _med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else float("nan")


def tables(runs: list, inproc: dict) -> str:
    lines = [
        "| job | mode | runs | ClientApp CPU / message (s) | wall / step (s) | wall / round trip (s) | round trips | "
        "ClientApp processes | worker CPU / site (s) | run wall (s) | status |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for job in dict.fromkeys(r["job"] for r in runs):
        for mode in ("cold", "warm"):
            rs = [r for r in runs if r["job"] == job and r["mode"] == mode]
            if not rs:
                continue
            wc = [c for r in rs for c in r["worker_cpu_s"] if c is not None]
            lines.append(
                f"| {job} | {mode} | {len(rs)} | {_med([r['clientapp_cpu_median_s'] for r in rs]):.2f} | "
                f"{_med([r['step_wall_median_s'] for r in rs]):.2f} | {_med([r['wall_per_round_trip_s'] for r in rs]):.2f} | "
                f"{rs[0]['round_trips']} | {rs[0]['clientapps']} | {(f'{_med(wc):.1f}' if wc else '–')} | "
                f"{_med([r['wall_s'] for r in rs]):.1f} ({min(r['wall_s'] for r in rs):.1f}–{max(r['wall_s'] for r in rs):.1f}) | "
                f"{','.join(sorted({r['status'] for r in rs}))} |"
            )
    lines += [
        "",
        "| job | in process (s) | cold (s) | warm (s) | cold / in process | warm / in process | warm / cold |",
        "|---|---|---|---|---|---|---|",
    ]
    for job in dict.fromkeys(r["job"] for r in runs):
        ip = _med(inproc.get(job, []))
        c = _med([r["wall_s"] for r in runs if r["job"] == job and r["mode"] == "cold"])
        w = _med([r["wall_s"] for r in runs if r["job"] == job and r["mode"] == "warm"])
        lines.append(f"| {job} | {ip:.2f} | {c:.1f} | {w:.1f} | {c / ip:.0f}× | {w / ip:.0f}× | {w / c:.2f} |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", nargs="+", default=["step"], choices=sorted(JOBS))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", help="also write every run's figures here")
    a = ap.parse_args()
    X = load_dataset("digits").X
    sites = np.array_split(X, 3)
    bound = float(np.max(np.abs(X)))
    runs: list = []
    inproc: dict = {}
    with tempfile.TemporaryDirectory(prefix="sf-steps-") as tmp:
        paths = write_site_files(tmp, sites)
        for rep in range(a.repeats):
            for job in a.jobs:
                inproc.setdefault(job, []).append(in_process(job, sites, bound))
                print(
                    json.dumps({"job": job, "mode": "in-process", "repeat": rep, "seconds": round(inproc[job][-1], 3)}),
                    flush=True,
                )
                for warm in (False, True) if rep % 2 == 0 else (True, False):
                    r = flower_run(job, warm, paths, tmp, bound, f"{job}{rep}{int(warm)}")
                    r.update(repeat=rep, load1=round(os.getloadavg()[0], 1))
                    runs.append(r)
                    print(json.dumps(r), flush=True)
    if a.json:
        with open(a.json, "w") as fh:
            json.dump({"runs": runs, "in_process": inproc}, fh, indent=1)
    print(tables(runs, inproc))


if __name__ == "__main__":
    sys.exit(main())
