"""Where a securefed round trip over Flower spends its time: Flower's floor (an echo app) vs securefed's own path.

For each setting (a Flower build × how ClientApps are started) the script starts one loopback deployment
(``LocalDeployment``: a SuperLink and 3 SuperNodes on 127.0.0.1, securefed's Flower settings), runs the echo app
(``benchmarks/flower_echo_app.py``: nothing of securefed in it) for ``--echo-trips`` round trips, then a securefed
job with the maintainers' trace on (``SECUREFED_FLOWER_TRACE``, :mod:`securefed.flower.trace`), and splits each of
the job's round trips (median over round trips; per site, then the slowest site):

* ``wait``        push → the ClientApp process starts: the SuperNode's idle sleep and pull, the SuperExec's poll
                  and its process launch (Flower);
* ``boot``        process start → securefed's ClientApp module starts importing: interpreter, flwr's imports, the
                  task input pulled from the SuperNode (Flower);
* ``import``      importing ``securefed.flower.client_app`` (securefed);
* ``load``        module imported → handler entered: Flower loads the app and the message (Flower);
* ``handler``     the ClientApp handler, of which ``site`` is the warm worker's compute (securefed);
* ``back``        handler returns → the reply reaches the ServerApp: the ClientApp pushes it, the SuperNode's
                  reply poll, its push to the SuperLink, the ServerApp's pull poll (Flower);
* ``coordinator`` the slowest reply → the next request's push starts (securefed's coordinator);
* ``push``        the ServerApp's push of the request's messages (securefed's payloads through Flower).

Settings: ``stock`` (flwr as installed, ``--isolation subprocess``: the SuperNode's SuperExec starts one
``flwr-clientapp`` process per message) and ``fork`` (``--isolation process`` with securefed's SuperExec,
:mod:`securefed.flower.superexec`: one pre-imported process forks per message — an opt-in that uses Flower
internals); ``--flower-bin DIR`` adds the same two settings with the Flower executables in ``DIR`` (a throw-away
virtualenv with a patched COPY of flwr, e.g. the SuperNode's idle sleep and reply poll made configurable — see
docs/flower-upstream-request.md; never shipped) and ``--flower-env K=V`` for its environment.

    OMP_NUM_THREADS=1 python benchmarks/flower_path.py [--job step|default] [--settings stock fork]
        [--echo-trips 10] [--repeats 1] [--flower-bin /tmp/flwr-patched/bin --flower-env K=V ...] [--json out.json]
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

from securefed.data import load_dataset, partition
from securefed.flower import LocalDeployment
from securefed.flower.launch import write_site_files
from securefed.plan import RunPlan, to_run_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
JOBS = {
    # 16 round trips: a SecAgg+ FedDL round on 50 landmarks, no embedding
    "step": {"landmarks": 50, "rounds": 1, "local-steps": 5, "aggregation": "secagg", "method": "none",
             "landmark-method": "feddl", "audit-holdout": 0.0, "degree": 2, "threshold": 2},
}


def job_config(job: str, bound: float) -> dict:
    if job == "default":  # the plan `securefed run` uses by default (benchmarks/flower_default_run.py)
        return to_run_config(RunPlan.build("flower", method="tsne", value_bound=bound, min_sites=3, seed=0))
    return dict(JOBS[job], **{"min-sites": 3, "seed": 0, "value-bound": bound})


def run_echo(dep: LocalDeployment, trips: int, sites: int, tag: str) -> list:
    """Submit the echo app to ``dep``; returns its round trips' seconds."""
    app = os.path.join(dep.workdir, "echo-app-" + tag)
    out = os.path.join(dep.workdir, "echo-" + tag)
    os.makedirs(app, exist_ok=True)
    shutil.copy(os.path.join(ROOT, "benchmarks", "flower_echo_app.py"), app)  # the app's code travels in the FAB
    with open(os.path.join(app, "pyproject.toml"), "w") as fh:
        fh.write("\n".join([
            "[build-system]", 'requires = ["hatchling"]', 'build-backend = "hatchling.build"', "",
            "[project]", 'name = "securefed-echo"', 'version = "1.0.0"', 'license = "Apache-2.0"', "dependencies = []",
            "", "[tool.hatch.build.targets.wheel]", 'packages = ["."]', "", "[tool.flwr.app]",
            'publisher = "securefed"', "", "[tool.flwr.app.components]",
            'serverapp = "flower_echo_app:server"', 'clientapp = "flower_echo_app:client"', "",
            "[tool.flwr.app.config]", f"out = {json.dumps(out)}", f"trips = {trips}", f"sites = {sites}", ""]))
    r = subprocess.run([os.path.join(dep.bin, "flwr"), "run", app, "local"], env=dep._write_cli_config(),
                       cwd=dep.workdir, capture_output=True, text=True, timeout=300)
    if "Successfully started run" not in r.stdout:
        raise RuntimeError(f"flwr run (echo) failed: {r.stdout[-1000:]} {r.stderr[-1000:]}")
    path = os.path.join(out, "echo.json")
    t0 = time.monotonic()
    while not os.path.exists(path):
        if time.monotonic() - t0 > 120 + 60 * trips:
            raise RuntimeError(f"the echo app wrote nothing; logs in {dep.workdir}")
        time.sleep(0.2)
    time.sleep(0.2)
    with open(path) as fh:
        return json.load(fh)["seconds"]


def _med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def decompose(trace_file: str) -> dict:
    """Median seconds per round trip of each part (module docstring) from a trace file."""
    events = [json.loads(line) for line in open(trace_file)]
    server = sorted((e for e in events if e["kind"] == "server"), key=lambda e: e["push0"])
    apps = {e["msg"]: e for e in events if e["kind"] == "clientapp"}
    workers = sorted((e for e in events if e["kind"] == "worker"), key=lambda e: e["recv"])
    parts = {k: [] for k in ("wait", "boot", "import", "load", "handler", "site", "back", "push", "coordinator",
                             "round_trip")}
    for k, ev in enumerate(server):
        parts["push"].append(ev["push1"] - ev["push0"])
        if k + 1 < len(server):
            parts["round_trip"].append(server[k + 1]["push0"] - ev["push0"])
            parts["coordinator"].append(server[k + 1]["push0"] - ev["end"])
        per = []
        for mid in ev["msgs"]:
            a, arr = apps.get(mid), ev["arrived"].get(mid)
            if a is None or arr is None or a.get("proc_start") is None:
                continue
            site = [w["done"] - w["recv"] for w in workers if a["fwd0"] <= w["recv"] <= a["fwd1"]]
            if a["import1"] <= a["proc_start"]:  # a forked child: the module was imported once, before the fork
                boot, imp, load = a["enter"] - a["proc_start"], 0.0, 0.0
            else:
                boot, imp, load = a["import0"] - a["proc_start"], a["import1"] - a["import0"], a["enter"] - a["import1"]
            per.append({"wait": a["proc_start"] - ev["push1"], "boot": boot, "import": imp, "load": load,
                        "handler": a["exit"] - a["enter"], "site": sum(site), "back": arr - a["exit"],
                        "total": arr - ev["push1"]})
        if per:
            slow = max(per, key=lambda p: p["total"])  # the round trip waits for the slowest site
            for key in ("wait", "boot", "import", "load", "handler", "site", "back"):
                parts[key].append(slow[key])
    return {k: (round(_med(v), 3) if v else None) for k, v in parts.items()} | {"round_trips_traced": len(server)}


TICK = os.sysconf("SC_CLK_TCK")


def _proc(pid: int):
    """(cmdline, parent pid, CPU seconds) of a live process, or None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            rest = fh.read().rsplit(b")", 1)[1].split()
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            cmd = fh.read().replace(b"\0", b" ").decode("utf-8", "replace")
    except OSError:
        return None
    return cmd, int(rest[1]), (int(rest[11]) + int(rest[12])) / TICK


class CpuSampler(threading.Thread):
    """CPU seconds of every process under the deployment's process groups, by role (sampled every 0.2 s; a
    process's last sample before it exits counts, so short-lived ClientApps lose at most their last 0.2 s)."""

    def __init__(self, roots: list, workdir: str, interval: float = 0.2):
        super().__init__(daemon=True)
        self.roots, self.interval, self.workdir = set(roots), interval, workdir
        self.n = 0
        self.seen: dict = {}  # (pid, first cmd) -> [role, cpu]
        self.stop = threading.Event()

    @staticmethod
    def role(cmd: str, parent_cmd: str) -> str:
        for key, name in (("flwr-serverapp", "ServerApp"), ("flower-superlink", "SuperLink"),
                          ("flower-supernode", "SuperNode"), ("flwr-clientapp", "ClientApp"),
                          ("securefed.flower.worker", "site worker"), ("flower-superexec", "SuperExec")):
            if key in cmd:
                return name
        if "securefed.flower.superexec" in cmd:  # securefed's SuperExec, or one of its forked ClientApps
            return "ClientApp" if "securefed.flower.superexec" in parent_cmd else "SuperExec"
        return "other"

    def sample(self):
        stack = [(r, "") for r in self.roots]
        self.n += 1
        if self.n % 10 == 1:  # the sites' warm workers run detached (new session): find them by their --cwd
            for d in os.listdir("/proc"):
                if d.isdigit() and (p := _proc(int(d))) is not None and "securefed.flower.worker" in p[0] \
                        and self.workdir in p[0]:
                    self.roots.add(int(d))
        while stack:  # the process trees under the roots, through /proc/<pid>/task/*/children
            pid, parent = stack.pop()
            p = _proc(pid)
            if p is None:
                continue
            self.seen.setdefault((pid, p[0]), [self.role(p[0], parent), 0.0])[1] = p[2]
            for f in glob.glob(f"/proc/{pid}/task/*/children"):
                try:
                    with open(f) as fh:
                        stack += [(int(c), p[0]) for c in fh.read().split()]
                except OSError:
                    pass

    def run(self):
        while not self.stop.is_set():
            self.sample()
            self.stop.wait(self.interval)

    def totals(self) -> dict:
        out: dict = {}
        for role, cpu in self.seen.values():
            out[role] = out.get(role, 0.0) + cpu
        return {k: round(v, 1) for k, v in sorted(out.items())}


def one_setting(name: str, bin_dir: str | None, launcher: str, env: dict, paths: list, cfg: dict, echo_trips: int,
                tmp: str, tag: str) -> dict:
    trace_dir = os.path.join(tmp, "trace-" + tag)
    old = {k: os.environ.get(k) for k in [*env, "SECUREFED_FLOWER_TRACE"]}
    os.environ.update(env)
    os.environ["SECUREFED_FLOWER_TRACE"] = trace_dir
    try:
        with LocalDeployment(os.path.join(tmp, "dep-" + tag), bin_dir=bin_dir,
                             superexec={"stock": "flower", "fork": "securefed"}[launcher]) as dep:
            dep.start_superlink()
            for i, p in enumerate(paths):
                dep.start_supernode(f"site{i}", p)
            echo = run_echo(dep, echo_trips, len(paths), tag) if echo_trips else []
            cpu = CpuSampler([p.pid for p in dep.procs.values()], dep.workdir)
            cpu.start()
            t0 = time.perf_counter()
            out = dep.run(dict(cfg))
            doc = dep.wait_result(out, 3600)
            wall = time.perf_counter() - t0
            cpu.stop.set()
            cpu.join()
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    rt = doc.get("round_trips") or 0
    row = {"setting": name, "status": doc.get("status"), "reason": doc.get("reason"), "wall_s": round(wall, 1),
           "round_trips": rt, "round_trips_per_stage": doc.get("round_trips_per_stage"),
           "s_per_round_trip": round(wall / rt, 2) if rt else None,
           "echo_round_trip_s": round(_med(echo), 2) if echo else None,
           "echo_s": [round(x, 2) for x in echo], "load1": round(os.getloadavg()[0], 1),
           "cpu_s": cpu.totals(), "cpu_s_per_round_trip": round(sum(cpu.totals().values()) / rt, 2) if rt else None}
    tf = os.path.join(trace_dir, "trace.jsonl")
    if os.path.exists(tf):
        row["parts"] = decompose(tf)
    return row


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--job", default="step", choices=sorted(JOBS) + ["default"])
    ap.add_argument("--settings", nargs="+", default=["stock", "fork"], choices=["stock", "fork"])
    ap.add_argument("--echo-trips", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--flower-bin", help="also run every setting with the Flower executables in this directory")
    ap.add_argument("--flower-env", action="append", default=[], metavar="K=V",
                    help="environment for the --flower-bin settings (e.g. FLWR_SUPERNODE_IDLE_PULL_INTERVAL=0.05)")
    ap.add_argument("--stage-timeout", type=float, default=None,
                    help="SecAgg+ stage deadline (unset: the protocol's 30–120 s; a loaded 2-core machine may need more)")
    ap.add_argument("--keep-traces", help="copy each setting's trace.jsonl into this directory")
    ap.add_argument("--json", help="also write every row here")
    a = ap.parse_args()
    ds = load_dataset("digits")
    idx = partition(ds.X, ds.y, 3, "label", random_state=0)
    sites = [ds.X[i] for i in idx]
    cfg = job_config(a.job, 16.0)
    if a.stage_timeout:
        cfg["stage-timeout"] = a.stage_timeout
    builds = [("flwr 1.41", None, {})]
    if a.flower_bin:
        builds.append(("patched copy", a.flower_bin, dict(kv.split("=", 1) for kv in a.flower_env)))
    rows = []
    with tempfile.TemporaryDirectory(prefix="sf-path-") as tmp:
        paths = write_site_files(os.path.join(tmp, "data"), sites)
        for rep in range(a.repeats):
            order = [(b, s) for b in builds for s in a.settings]
            if rep % 2:
                order.reverse()
            for (bname, bdir, benv), launcher in order:
                name = f"{bname}, {launcher}"
                tag = f"{rep}-{len(rows)}"
                row = one_setting(name, bdir, launcher, benv, paths, cfg, a.echo_trips, tmp, tag)
                row.update(repeat=rep, job=a.job)
                if a.keep_traces and os.path.exists(os.path.join(tmp, "trace-" + tag, "trace.jsonl")):
                    os.makedirs(a.keep_traces, exist_ok=True)
                    shutil.copy(os.path.join(tmp, "trace-" + tag, "trace.jsonl"),
                                os.path.join(a.keep_traces, f"{a.job}-{tag}-{launcher}-{bname.replace(' ', '_')}.jsonl"))
                rows.append(row)
                print(json.dumps(row), flush=True)
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(rows, fh, indent=1)
    return rows


if __name__ == "__main__":
    sys.exit(main() and 0)
