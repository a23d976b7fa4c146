"""The Flower ``ClientApp`` of securefed: one per site (hospital), run by the site's SuperNode.

Start the SuperNode with the site's data path in its node config::

    flower-supernode --superlink LINK:9093 --root-certificates ca.pem \\
        --node-config 'data-path="/data/site.csv" site-name="hospital-a"'

Every message is answered by the site's :class:`~securefed.federation.site.SiteWorker` (the same object the
in-process run uses). Flower 1.41 starts a fresh ClientApp process for every message, so this module imports
only flwr and the standard library (and securefed's light :mod:`.transport` and :mod:`.worker`), never the site
code, and hands the request to where the site lives:

* **warm worker** (site option ``warm-worker``, default true): the request goes over a private Unix socket to the
  site's long-lived worker for this run (:mod:`securefed.flower.worker`, started by the run's first message),
  which keeps the ``SiteWorker`` in memory — records loaded once, caches and protocol machines live. The site's
  secrets (identity key, Generator, SecAgg+ keys, CKKS secret context, DP state) stay in that process and do
  **not** pass through Flower's ``context.state``; the ClientApp stores only the worker instance's id there
  (``securefed-warm``). If that worker is gone (killed, crashed, idle for ``warm-worker-idle-minutes``), the
  run's next request gets ``{"error": "ProtocolAbortedError: ..."}`` and the coordinator drops the site, as
  after a SuperNode restart.
* ``warm-worker = false``: the ClientApp process builds the ``SiteWorker`` itself from ``context.node_config``
  and the site's state kept in the SuperNode's per-run ``context.state`` (``securefed-site``: the identity key,
  the Generator, a live protocol machine, the DP calibration — serialised there after every message).

Site options of the worker (``--node-config``): ``warm-worker`` (true), ``warm-worker-idle-minutes`` (10),
``warm-worker-dir`` (default ``$XDG_RUNTIME_DIR/securefed-warm`` or ``.securefed-warm`` in the SuperNode's working
directory; must be private, 0700). A request ``{"op": "bye"}`` (a run's last message, if the coordinator sends
one) lets the run's worker exit at once.
"""

from __future__ import annotations

import sys
import time

_T_IMPORT = time.time()  # for the maintainers' trace (securefed.flower.trace): what importing this module costs

from flwr.app import ConfigRecord, Context, Message  # noqa: E402 (after the import clock starts)
from flwr.clientapp import ClientApp  # noqa: E402

from . import trace as _trace  # noqa: E402
from . import worker as _warm  # noqa: E402
from .transport import make_content, read_content  # noqa: E402

__all__ = ["app", "forward_request", "answer_in_process"]

_STATE = "securefed-site"
_WARM = "securefed-warm"

app = ClientApp()


def _fingerprint_line(name, fingerprint: str, run_id) -> str:
    return (
        f"securefed site {name}: identity key fingerprint {fingerprint} (run {run_id}); "
        "compare with identity_fingerprints in the coordinator's result.json"
    )


def answer_in_process(request: dict, options: dict, state: dict | None, run_id=None) -> tuple[dict, dict]:
    """``warm-worker = false``: answer with a ``SiteWorker`` built in this process; returns (reply, new state)."""
    from ..federation.site import SiteWorker

    worker = SiteWorker(dict(options), state=state)
    reply = worker.handle(request)
    if request.get("op") == "hello" and "error" not in reply:  # for the operator's out-of-band key comparison
        print(_fingerprint_line(worker.name, worker.fingerprint(), run_id), file=sys.stderr, flush=True)
    return reply, worker.state


def _gone(op, why: str) -> dict:
    return {
        "error": f"ProtocolAbortedError: this site's warm worker for the run is gone ({why}); its run state "
        f"(identity key, protocol machines, DP state) is lost as after a SuperNode restart, so it cannot "
        f"answer {op!r} and leaves the run"
    }


def forward_request(
    request: dict,
    options: dict,
    run_id,
    node_id,
    marker: dict | None = None,
    *,
    parent_pid: int | None = None,
    cwd: str | None = None,
) -> tuple[dict, dict]:
    """Answer ``request`` through the run's warm worker (started if this run has none yet).

    ``marker`` is what an earlier message of the run stored (``{"worker": id}``; the ClientApp keeps it in
    ``context.state``); returns ``(reply fields, new marker)``. A worker that answered an earlier message and is
    gone now yields a ``ProtocolAbortedError`` reply (only a ``hello`` starts a new one). An unexpected exception
    in the worker is raised here as ``RuntimeError`` (Flower then replies with an error, as when a ClientApp
    process fails). ``parent_pid`` (default: this process's parent, the SuperExec) and ``cwd`` are for tests.
    """
    op = request.get("op")
    marker = dict(marker or {})
    expected = marker.get("worker") or None
    try:
        loc = _warm.site_location(options, run_id, node_id, parent_pid, cwd)
        sock = _warm.connect(loc)
        if op == "bye":  # the run's last message: let its worker go (never start one for it)
            if sock is not None:
                _warm.call(sock, {"type": "bye"})
            return {}, marker
        if sock is None:
            if expected is not None and op != "hello":
                return _gone(op, loc.last_log_line() or "no worker listens"), marker
            sock = _warm.start_worker(loc, options, parent_pid, cwd)
        try:
            env = _warm.call(
                sock,
                {
                    "type": "request",
                    "options": dict(options),
                    "fields": dict(request),
                    "expect": None if op == "hello" else expected,
                },
            )
        except _warm.WorkerGone as exc:
            return _gone(op, f"it stopped while answering: {exc}; {loc.last_log_line()}"), marker
    except _warm.FrameError as exc:
        return {"error": f"DecodeError: warm worker frame: {exc}"}, marker
    except (_warm.WorkerError, OSError) as exc:
        return {
            "error": f"ConfigError: the site's warm worker cannot be used ({type(exc).__name__}: {exc}); fix it or "
            "set the site option warm-worker=false"
        }, marker
    kind = env["type"]
    if kind == "stale":
        return _gone(op, "another worker instance listens in its place"), marker
    if kind == "failure":
        raise RuntimeError(f"securefed site worker: {env['error']}")
    if kind != "reply":
        return {"error": f"DecodeError: the warm worker answered with a {kind!r} frame"}, marker
    reply = env["fields"]
    if env.get("note") and op == "hello":
        fp = str(env["note"]).rsplit(" ", 1)[-1]
        print(_fingerprint_line(reply.get("site_name"), fp, run_id), file=sys.stderr, flush=True)
    marker["worker"] = str(env["worker"])
    return reply, marker


_T_IMPORTED = time.time()


@app.query("securefed")
def securefed_query(msg: Message, context: Context) -> Message:
    """Answer one securefed request (through the site's warm worker, or in this process)."""
    t_enter = time.time()
    request = read_content(msg)
    options = dict(context.node_config)
    t_fwd = time.time()
    if _warm.enabled(options):
        stored = context.state.config_records.get(_WARM)
        reply, marker = forward_request(
            request, options, context.run_id, context.node_id, dict(stored) if stored is not None else None
        )
        context.state[_WARM] = ConfigRecord(marker)
    else:
        if request.get("op") == "bye":
            return Message(make_content(), reply_to=msg)
        stored = context.state.config_records.get(_STATE)
        reply, state = answer_in_process(request, options, dict(stored) if stored is not None else None, context.run_id)
        context.state[_STATE] = ConfigRecord(state)
    t_answered = time.time()
    out = Message(make_content(**reply), reply_to=msg)
    if _trace.enabled():
        _trace.emit(
            "clientapp",
            node=context.node_id,
            msg=msg.metadata.message_id,
            op=request.get("op"),
            proc_start=_trace.process_start_time(),
            import0=_T_IMPORT,
            import1=_T_IMPORTED,
            enter=t_enter,
            fwd0=t_fwd,
            fwd1=t_answered,
            exit=time.time(),
        )
    return out
