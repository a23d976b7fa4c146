"""Flower's own floor per round trip: an echo ServerApp / ClientApp pair with nothing of securefed in it.

``benchmarks/flower_path.py`` submits it to the same loopback deployment as the securefed job, so the difference
between a securefed round trip and an echo round trip is securefed's own path. The ServerApp sends one small
message to every connected SuperNode, waits for all replies (polling every 0.05 s, as securefed's exchange does),
repeats ``trips`` times and writes the round trips' seconds to ``<out>/echo.json``. The ClientApp replies with
the request's content. This module imports flwr and the standard library only.
"""

import json
import os
import time

from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

client = ClientApp()
server = ServerApp()


@client.query("echo")
def echo(msg: Message, context: Context) -> Message:
    return Message(RecordDict({"echo": ConfigRecord(dict(msg.content.config_records["echo"]))}), reply_to=msg)


@server.main()
def main(grid: Grid, context: Context) -> None:
    cfg = context.run_config
    out, trips, sites = str(cfg["out"]), int(cfg["trips"]), int(cfg["sites"])  # trips may be 0 (poll cost only)
    t0 = time.monotonic()
    while len(list(grid.get_node_ids())) < sites and time.monotonic() - t0 < 300:
        time.sleep(0.2)
    nodes = sorted(grid.get_node_ids())
    seconds = []
    for k in range(trips):
        t = time.monotonic()
        msgs = [
            Message(
                RecordDict({"echo": ConfigRecord({"k": k, "pad": b"x" * 64})}),
                dst_node_id=n,
                message_type="query.echo",
                ttl=600.0,
            )
            for n in nodes
        ]
        left = {m for m in grid.push_messages(msgs) if m}
        while left:
            for rep in grid.pull_messages(list(left)):
                left.discard(rep.metadata.reply_to_message_id)
            if left:
                time.sleep(0.05)
        seconds.append(time.monotonic() - t)
    polls = _poll_cost(grid, float(cfg.get("poll-seconds", 0.0)), float(cfg.get("poll-interval", 0.05)))
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "echo.json"), "w") as fh:
        json.dump({"nodes": len(nodes), "seconds": seconds, "polls": polls}, fh)


def _cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat", "rb") as fh:
        rest = fh.read().rsplit(b")", 1)[1].split()
    return (int(rest[11]) + int(rest[12])) / os.sysconf("SC_CLK_TCK")


def _poll_cost(grid, seconds: float, interval: float) -> dict | None:
    """What polling for replies costs: ``pull_messages`` with nothing to pull every ``interval`` s for ``seconds`` s —
    CPU of this ServerApp and of the SuperLink (on a loopback: this process's grandparent) per poll."""
    if seconds <= 0:
        return None
    with open(f"/proc/{os.getppid()}/stat", "rb") as fh:
        link = int(fh.read().rsplit(b")", 1)[1].split()[1])
    l0, t0 = _cpu(link), time.monotonic()
    time.sleep(seconds)  # the SuperLink's own background work (the SuperNodes' pulls), to subtract
    idle_rate = (_cpu(link) - l0) / (time.monotonic() - t0)
    c0, l0, t0, n = time.process_time(), _cpu(link), time.monotonic(), 0
    while time.monotonic() - t0 < seconds:
        grid.pull_messages([])
        n += 1
        time.sleep(interval)
    wall = time.monotonic() - t0
    link_cpu = _cpu(link) - l0 - idle_rate * wall
    return {
        "polls": n,
        "wall_s": round(wall, 2),
        "interval": interval,
        "serverapp_cpu_per_poll_ms": round(1e3 * (time.process_time() - c0) / n, 2),
        "superlink_cpu_per_poll_ms": round(1e3 * link_cpu / n, 2),
        "superlink_idle_cpu_per_s_ms": round(1e3 * idle_rate, 1),
    }
