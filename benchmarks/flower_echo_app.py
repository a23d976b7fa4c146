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
    out, trips, sites = str(cfg["out"]), int(cfg["trips"]), int(cfg["sites"])
    t0 = time.monotonic()
    while len(list(grid.get_node_ids())) < sites and time.monotonic() - t0 < 300:
        time.sleep(0.2)
    nodes = sorted(grid.get_node_ids())
    seconds = []
    for k in range(trips):
        t = time.monotonic()
        msgs = [Message(RecordDict({"echo": ConfigRecord({"k": k, "pad": b"x" * 64})}), dst_node_id=n,
                        message_type="query.echo", ttl=600.0) for n in nodes]
        left = {m for m in grid.push_messages(msgs) if m}
        while left:
            for rep in grid.pull_messages(list(left)):
                left.discard(rep.metadata.reply_to_message_id)
            if left:
                time.sleep(0.05)
        seconds.append(time.monotonic() - t)
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "echo.json"), "w") as fh:
        json.dump({"nodes": len(nodes), "seconds": seconds}, fh)
