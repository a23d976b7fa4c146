"""The Flower ``ClientApp`` of securefed: one per site (hospital), run by the site's SuperNode.

Start the SuperNode with the site's data path in its node config::

    flower-supernode --superlink LINK:9093 --root-certificates ca.pem \\
        --node-config 'data-path="/data/site.csv" site-name="hospital-a"'

Every message is answered by the site's :class:`~securefed.federation.site.SiteWorker` (the same object the
in-process run uses); the site's state between messages (its run identity key, its Generator, a live
protocol machine, its DP calibration) is kept in the SuperNode's per-run ``context.state`` on the site.
"""

from __future__ import annotations

import sys

from flwr.app import ConfigRecord, Context, Message
from flwr.clientapp import ClientApp

from ..federation.site import SiteWorker
from .transport import make_content, read_content

__all__ = ["app"]

_STATE = "securefed-site"

app = ClientApp()


@app.query("securefed")
def securefed_query(msg: Message, context: Context) -> Message:
    """Answer one securefed request and persist the site's state."""
    stored = context.state.config_records.get(_STATE)
    worker = SiteWorker(dict(context.node_config), state=dict(stored) if stored is not None else None)
    request = read_content(msg)
    reply = worker.handle(request)
    if request.get("op") == "hello" and "error" not in reply:  # for the operator's out-of-band key comparison
        print(f"securefed site {worker.name}: identity key fingerprint {worker.fingerprint()} (run {context.run_id}); "
              "compare with identity_fingerprints in the coordinator's result.json", file=sys.stderr, flush=True)
    context.state[_STATE] = ConfigRecord(worker.state)
    return Message(make_content(**reply), reply_to=msg)
