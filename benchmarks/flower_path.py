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
internals); ``--flower-build 'LABEL|DIR|K=V,…'`` adds the same settings with the Flower executables in ``DIR`` (a
throw-away virtualenv with a patched COPY of flwr, e.g. the SuperNode's idle sleep and reply poll made configurable
— see docs/flower-upstream-request.md; never shipped) and that environment.

    OMP_NUM_THREADS=1 python benchmarks/flower_path.py [--job step|default] [--settings stock fork]
        [--echo-trips 10] [--repeats 1] [--flower-build 'LABEL|BIN_DIR|K=V,K=V' ...] [--stage-timeout S]
        [--keep-traces DIR] [--json out.json]
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
import time


from securefed.data import load_dataset, partition
from securefed.flower import LocalDeployment
from securefed.flower.launch import write_site_files
from securefed.plan import RunPlan, to_run_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
JOBS = {
    # 16 round trips: a SecAgg+ FedDL round on 50 landmarks, no embedding
    "step": {
        "landmarks": 50,
        "rounds": 1,
        "local-steps": 5,
        "aggregation": "secagg",
        "method": "none",
        "landmark-method": "feddl",
        "audit-holdout": 0.0,
        "degree": 2,
        "threshold": 2,
    },
}


def job_config(job: str, bound: float) -> dict:
    if job == "default":  # the plan `securefed run` uses by default (benchmarks/flower_default_run.py)
        return to_run_config(RunPlan.build("flower", method="tsne", value_bound=bound, min_sites=3, seed=0))
    return dict(JOBS[job], **{"min-sites": 3, "seed": 0, "value-bound": bound})


def run_echo(dep: LocalDeployment, trips: int, sites: int, tag: str, poll_seconds: float = 0.0) -> dict:
    """Submit the echo app to ``dep``; returns its ``echo.json`` (round trips' seconds; with ``poll_seconds``, what
    one poll for replies costs the ServerApp and the SuperLink)."""
    app = os.path.join(dep.workdir, "echo-app-" + tag)
    out = os.path.join(dep.workdir, "echo-" + tag)
    os.makedirs(app, exist_ok=True)
    shutil.copy(os.path.join(ROOT, "benchmarks", "flower_echo_app.py"), app)  # the app's code travels in the FAB
    with open(os.path.join(app, "pyproject.toml"), "w") as fh:
        fh.write(
            "\n".join(
                [
                    "[build-system]",
                    'requires = ["hatchling"]',
                    'build-backend = "hatchling.build"',
                    "",
                    "[project]",
                    'name = "securefed-echo"',
                    'version = "1.0.0"',
                    'license = "Apache-2.0"',
                    "dependencies = []",
                    "",
                    "[tool.hatch.build.targets.wheel]",
                    'packages = ["."]',
                    "",
                    "[tool.flwr.app]",
                    'publisher = "securefed"',
                    "",
                    "[tool.flwr.app.components]",
                    'serverapp = "flower_echo_app:server"',
                    'clientapp = "flower_echo_app:client"',
                    "",
                    "[tool.flwr.app.config]",
                    f"out = {json.dumps(out)}",
                    f"trips = {trips}",
                    f"sites = {sites}",
                    f"poll-seconds = {float(poll_seconds)!r}",
                    "poll-interval = 0.05",
                    "",
                ]
            )
        )
    r = subprocess.run(
        [os.path.join(dep.bin, "flwr"), "run", app, "local"],
        env=dep._write_cli_config(),
        cwd=dep.workdir,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if "Successfully started run" not in r.stdout:
        raise RuntimeError(f"flwr run (echo) failed: {r.stdout[-1000:]} {r.stderr[-1000:]}")
    path = os.path.join(out, "echo.json")
    t0 = time.monotonic()
    while not os.path.exists(path):
        if time.monotonic() - t0 > 120 + 60 * trips + 3 * poll_seconds:
            raise RuntimeError(f"the echo app wrote nothing; logs in {dep.workdir}")
        time.sleep(0.2)
    time.sleep(0.2)
    with open(path) as fh:
        return json.load(fh)


def _med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def decompose(trace_file: str) -> dict:
    """Median seconds per round trip of each part (module docstring) from a trace file."""
    events = [json.loads(line) for line in open(trace_file)]
    server = sorted((e for e in events if e["kind"] == "server"), key=lambda e: e["push0"])
    apps = {e["msg"]: e for e in events if e["kind"] == "clientapp"}
    workers = sorted((e for e in events if e["kind"] == "worker"), key=lambda e: e["recv"])
    parts: dict = {
        k: []
        for k in (
            "wait",
            "boot",
            "import",
            "load",
            "handler",
            "site",
            "back",
            "push",
            "coordinator",
            "round_trip",
            "polls",
        )
    }
    for k, ev in enumerate(server):
        parts["push"].append(ev["push1"] - ev["push0"])
        if "polls" in ev:  # the exchange's cumulative count of polls for replies
            parts["polls"].append(ev["polls"] - (server[k - 1].get("polls", 0) if k else 0))
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
            per.append(
                {
                    "wait": a["proc_start"] - ev["push1"],
                    "boot": boot,
                    "import": imp,
                    "load": load,
                    "handler": a["exit"] - a["enter"],
                    "site": sum(site),
                    "back": arr - a["exit"],
                    "total": arr - ev["push1"],
                }
            )
        if per:
            slow = max(per, key=lambda p: p["total"])  # the round trip waits for the slowest site
            for key in ("wait", "boot", "import", "load", "handler", "site", "back"):
                parts[key].append(slow[key])
    return {k: (round(_med(v), 3) if v else None) for k, v in parts.items()} | {"round_trips_traced": len(server)}


TICK = os.sysconf("SC_CLK_TCK")


def _stat(pid: int):
    """(cmdline, parent pid, start ticks, own CPU s, reaped children's CPU s) of a process, or None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            rest = fh.read().rsplit(b")", 1)[1].split()
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            cmd = fh.read().replace(b"\0", b" ").decode("utf-8", "replace")
    except OSError:
        return None
    return (
        cmd,
        int(rest[1]),
        int(rest[19]),
        (int(rest[11]) + int(rest[12])) / TICK,
        (int(rest[13]) + int(rest[14])) / TICK,
    )


def _role(cmd: str) -> str:
    for key, name in (
        ("flwr-serverapp", "ServerApp"),
        ("flower-superlink", "SuperLink"),
        ("flower-supernode", "SuperNode"),
        ("flwr-clientapp", "ClientApp"),
        ("securefed.flower.worker", "site worker"),
        ("flower-superexec", "SuperExec"),
        ("securefed.flower.superexec", "SuperExec"),
    ):
        if key in cmd:
            return name
    return "other"


class CpuMeter:
    """CPU seconds a run costs each role of the deployment, from two snapshots of /proc (start and end of the run).

    A process's own CPU goes to its role (by its command line); the CPU of its children that have exited and been
    reaped (``cutime``/``cstime``) goes to the role of those children: a SuperExec's reaped children are ClientApps
    (the SuperNodes') or ServerApps (the SuperLink's). ClientApps live well under a second, so sampling them would
    miss most of their CPU; their parent's counters have all of it. The sites' warm workers run detached (their own
    session, re-parented when their ClientApp exits) and are found by their ``--cwd`` (the deployment's directory)."""

    def __init__(self, roots: list, workdir: str):
        self.roots, self.workdir = list(roots), workdir
        self.start = self.snapshot()

    def _tree(self) -> dict:
        procs, stack, seen = {}, list(self.roots), set()
        for d in os.listdir("/proc"):
            if (
                d.isdigit()
                and (p := _stat(int(d))) is not None
                and "securefed.flower.worker" in p[0]
                and self.workdir in p[0]
            ):
                stack.append(int(d))
        while stack:
            pid = stack.pop()
            if pid in seen:
                continue
            seen.add(pid)
            p = _stat(pid)
            if p is None:
                continue
            procs[pid] = p
            for f in glob.glob(f"/proc/{pid}/task/*/children"):
                try:
                    with open(f) as fh:
                        stack += [int(c) for c in fh.read().split()]
                except OSError:
                    pass
        return procs

    def snapshot(self) -> dict:
        out: dict = {}
        procs = self._tree()
        for pid, (cmd, ppid, start, own, kids) in procs.items():
            role = _role(cmd) if cmd else "ClientApp"  # a zombie has no command line: an exited ClientApp
            parent_cmd = procs.get(ppid, ("",))[0]
            kid_role = (
                ("ServerApp" if "flower-superlink" in parent_cmd else "ClientApp")
                if role == "SuperExec"
                else "SuperExec"
                if role in ("SuperLink", "SuperNode")
                else "other"
            )
            out[(pid, start, role)] = own
            out[(pid, start, kid_role + " (reaped)")] = kids
        return out

    def totals(self) -> dict:
        end = self.snapshot()
        tot: dict = {}
        for key, v in end.items():
            role = key[2].replace(" (reaped)", "")
            tot[role] = tot.get(role, 0.0) + v - self.start.get(key, 0.0)
        return {k: round(v, 1) for k, v in sorted(tot.items()) if abs(v) >= 0.05}


def one_setting(
    name: str,
    bin_dir: str | None,
    launcher: str,
    env: dict,
    paths: list,
    cfg: dict,
    echo_trips: int,
    tmp: str,
    tag: str,
    code_root: str | None = None,
    poll_seconds: float = 0.0,
) -> dict:
    trace_dir = os.path.join(tmp, "trace-" + tag)
    old = {k: os.environ.get(k) for k in [*env, "SECUREFED_FLOWER_TRACE"]}
    os.environ.update(env)
    os.environ["SECUREFED_FLOWER_TRACE"] = trace_dir
    try:
        with LocalDeployment(
            os.path.join(tmp, "dep-" + tag),
            bin_dir=bin_dir,
            code_root=code_root,
            superexec={"stock": "flower", "fork": "securefed"}[launcher],
        ) as dep:
            dep.start_superlink()
            for i, p in enumerate(paths):
                dep.start_supernode(f"site{i}", p)
            e = run_echo(dep, echo_trips, len(paths), tag, poll_seconds) if echo_trips or poll_seconds else {}
            echo = e.get("seconds") or []
            cpu = CpuMeter([p.pid for p in dep.procs.values()], dep.workdir)
            t0 = time.perf_counter()
            out = dep.run(dict(cfg))
            doc = dep.wait_result(out, 3600)
            wall = time.perf_counter() - t0
            time.sleep(0.5)  # the last ClientApps exit and are reaped
            cpu_s = cpu.totals()
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    rt = doc.get("round_trips") or 0
    row = {
        "setting": name,
        "status": doc.get("status"),
        "reason": doc.get("reason"),
        "wall_s": round(wall, 1),
        "round_trips": rt,
        "round_trips_per_stage": doc.get("round_trips_per_stage"),
        "s_per_round_trip": round(wall / rt, 2) if rt else None,
        "echo_round_trip_s": round(_med(echo), 2) if echo else None,
        "echo_s": [round(x, 2) for x in echo],
        "load1": round(os.getloadavg()[0], 1),
        "cpu_s": cpu_s,
        "cpu_s_per_round_trip": round(sum(cpu_s.values()) / rt, 2) if rt else None,
        "poll_cost": e.get("polls"),
    }
    tf = os.path.join(trace_dir, "trace.jsonl")
    if os.path.exists(tf):
        row["parts"] = decompose(tf)
    return row


def add_build_args(ap) -> None:
    ap.add_argument(
        "--flower-build",
        action="append",
        default=[],
        metavar="LABEL|BIN_DIR|K=V,K=V",
        help="also run every setting with the Flower executables in BIN_DIR (a throw-away virtualenv "
        "with a patched COPY of flwr) and this environment, e.g. 'idle 0.1 s|/tmp/flwr-patched/bin|"
        "FLWR_SUPERNODE_IDLE_PULL_INTERVAL=0.1,FLWR_SUPERNODE_REPLY_POLL_INTERVAL=0.05'",
    )
    ap.add_argument("--no-stock-flower", action="store_true", help="only the --flower-build builds")
    ap.add_argument(
        "--code",
        action="append",
        default=[],
        metavar="LABEL=ROOT",
        help="also run the stock setting with the securefed source tree ROOT (e.g. an export of an earlier "
        "commit: git archive COMMIT | tar -x -C ROOT) — before/after in the same run",
    )


def parse_builds(a) -> list:
    """[(label, bin dir or None, env)]: the installed flwr first, then every --flower-build."""
    builds: list = [] if a.no_stock_flower else [("flwr 1.41", None, {})]
    for spec in a.flower_build:
        label, bin_dir, env = (spec.split("|") + ["", ""])[:3]
        builds.append((label, bin_dir, dict(kv.split("=", 1) for kv in env.split(",") if kv)))
    return builds


def table(rows: list) -> str:
    """One markdown line per setting: medians over its runs."""
    keys = ("wait", "boot", "import", "handler", "site", "back", "push", "coordinator")
    out = [
        "| setting | runs | echo round trip (s) | job round trip, median (s) | wall / round trip (s) | "
        + " | ".join(keys)
        + " | CPU s / round trip | load |",
        "|---" * (len(keys) + 7) + "|",
    ]
    for name in dict.fromkeys(r["setting"] for r in rows):
        rs = [r for r in rows if r["setting"] == name]
        ok = [r for r in rs if r["status"] == "completed"]
        parts = [r.get("parts") or {} for r in rs]

        def med(xs, fmt="{:.2f}"):
            xs = [x for x in xs if x is not None]
            return fmt.format(statistics.median(xs)) if xs else "–"

        out.append(
            f"| {name} | {len(rs)}"
            + (f" ({len(rs) - len(ok)} aborted)" if len(ok) < len(rs) else "")
            + f" | {med([r['echo_round_trip_s'] for r in rs])} | {med([p.get('round_trip') for p in parts])} | "
            f"{med([r['s_per_round_trip'] for r in ok])} | "
            + " | ".join(med([p.get(k) for p in parts]) for k in keys)
            + f" | {med([r.get('cpu_s_per_round_trip') for r in ok], '{:.1f}')} | "
            f"{med([r['load1'] for r in rs], '{:.0f}')} |"
        )
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--job", default="step", choices=sorted(JOBS) + ["default"])
    ap.add_argument("--settings", nargs="+", default=["stock", "fork"], choices=["stock", "fork"])
    ap.add_argument("--echo-trips", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=1)
    add_build_args(ap)
    ap.add_argument(
        "--stage-timeout",
        type=float,
        default=None,
        help="SecAgg+ stage deadline (unset: the protocol's 30–120 s; a loaded 2-core machine may need more)",
    )
    ap.add_argument("--keep-traces", help="copy each setting's trace.jsonl into this directory")
    ap.add_argument(
        "--poll-cost",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="also let the echo ServerApp poll for replies (every 0.05 s, nothing to pull) this long and "
        "report the ServerApp's and the SuperLink's CPU per poll",
    )
    ap.add_argument("--json", help="also write every row here")
    a = ap.parse_args()
    ds = load_dataset("digits")
    idx = partition(ds.X, ds.y, 3, "label", random_state=0)
    sites = [ds.X[i] for i in idx]
    cfg = job_config(a.job, 16.0)
    if a.stage_timeout:
        cfg["stage-timeout"] = a.stage_timeout
    builds = parse_builds(a)
    rows: list = []
    with tempfile.TemporaryDirectory(prefix="sf-path-") as tmp:
        paths = write_site_files(os.path.join(tmp, "data"), sites)
        for rep in range(a.repeats):
            order = [(b, s, None) for b in builds for s in a.settings]
            order += [(builds[0], "stock", c) for c in a.code]
            if rep % 2:
                order.reverse()
            for (bname, bdir, benv), launcher, code in order:
                name = f"{bname}, {launcher}" + (f", code {code.split('=', 1)[0]}" if code else "")
                tag = f"{rep}-{len(rows)}"
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
                    poll_seconds=a.poll_cost,
                )
                row.update(repeat=rep, job=a.job)
                if a.keep_traces and os.path.exists(os.path.join(tmp, "trace-" + tag, "trace.jsonl")):
                    os.makedirs(a.keep_traces, exist_ok=True)
                    dest = f"{a.job}-{tag}-{launcher}-{bname.replace(' ', '_')}.jsonl"
                    shutil.copy(os.path.join(tmp, "trace-" + tag, "trace.jsonl"), os.path.join(a.keep_traces, dest))
                rows.append(row)
                print(json.dumps(row), flush=True)
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(rows, fh, indent=1)
    print(table(rows))
    return rows


if __name__ == "__main__":
    sys.exit(main() and 0)
