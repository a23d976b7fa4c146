"""securefed's SuperExec for ``flower-supernode --isolation process``: no interpreter start per message (opt-in).

With ``--isolation subprocess`` (Flower's default) the SuperNode's SuperExec starts a fresh ``flwr-clientapp``
process for every message: a Python interpreter that imports flwr (≈ 1.5 s of CPU; several seconds of wall time on a
loaded machine) before it answers. With ``--isolation process`` the SuperNode starts no SuperExec: Flower documents
that an external one connects to the SuperNode's Runtime API (``--port``, default 9094) and acquires the node's
tasks. This module is such a SuperExec. It imports flwr's ClientApp runtime and securefed's ClientApp **once**, then
for every task it ``fork()``\\ s: the child runs Flower's own ClientApp task loop
(``flwr.supernode.runtime.run_clientapp.run_clientapp`` with the task's token: pull the message, run the app, push
the reply) and exits. Same protocol, same token check, same ClientApp code — minus the interpreter start and the
imports. Start it beside each SuperNode::

    flower-supernode --isolation process --port 9094 ...          # the site's SuperNode, as in the README
    python -m securefed.flower.superexec --runtime-api-address 127.0.0.1:9094 --insecure --parent-pid <its pid>

**Opt-in, not the default: it relies on Flower internals.** Flower 1.41 documents the process-isolation mode and
the ``flower-superexec`` command, not a Python interface for writing a SuperExec: this module calls
``RuntimeHttpClient.AcquireTask`` and ``run_clientapp`` from flwr's private modules (``flwr.supercore``,
``flwr.supernode.runtime``), which may change in any Flower release. It patches nothing and works with the
installed flwr 1.41 only (it refuses another version unless ``--any-flower-version``). Measured gain:
BENCHMARKS.md ("Deployment at the speed of the protocol"); why it exists: docs/deploying-on-flower.md.

A forked child also starts within milliseconds, which keeps it inside Flower's 30 s window between a task's claim
and the ClientApp's first call (a ``flwr-clientapp`` slower than that fails with "Runtime task-token authentication
failed" — see docs/deploying-on-flower.md).

The parent is single-threaded (it forks), reaps its children, exits when ``--parent-pid`` is gone or on SIGTERM
(its running children finish their task), and never handles a message itself.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import signal
import sys
import time

__all__ = ["main", "FLOWER_VERSION"]

#: the flwr release whose private modules this SuperExec was written against
FLOWER_VERSION = "1.41.0"
_POLL_ENV = "FLWR_SUPEREXEC_TASK_POLL_INTERVAL"


def _poll_interval() -> float:
    raw = os.environ.get(_POLL_ENV, "0.1")
    try:
        v = float(raw)
    except ValueError:
        v = float("nan")
    if not 0.01 <= v <= 60.0:
        raise SystemExit(f"securefed superexec: {_POLL_ENV}={raw!r} is invalid: use seconds between 0.01 and 60")
    return v


def _log(msg: str) -> None:
    print(f"{time.strftime('%Y-%m-%d %H:%M:%S')} securefed superexec {os.getpid()}: {msg}", file=sys.stderr, flush=True)


def _alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie — exited, not yet reaped by its parent — counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return True


def _child(run_clientapp, address: str, token: str, insecure: bool, certificates) -> None:
    """In the forked child: run one ClientApp task with Flower's own task loop, then leave (never returns)."""
    code = 1
    try:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD):
            signal.signal(sig, signal.SIG_DFL)
        run_clientapp(
            runtime_api_address=address,
            token=token,
            insecure=insecure,
            certificates=certificates,
            parent_pid=os.getppid(),
        )
        code = 0
    except SystemExit as exc:  # flwr_exit ends the task with sys.exit
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException as exc:  # noqa: BLE001 — the child must never return into the parent's loop
        print(f"securefed superexec child: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def serve(address: str, insecure: bool, root_certificates: str | None, parent_pid: int | None, preload: list) -> str:
    """The SuperExec's loop; returns why it stopped."""
    from flwr.proto.runtime_pb2 import AcquireTaskRequest  # pylint: disable=E0611
    from flwr.supercore.constant import TaskType
    from flwr.supercore.interceptors import RuntimeVersionHttpInterceptor
    from flwr.supercore.runtime import RuntimeHttpClient
    from flwr.supercore.tls import validate_and_resolve_root_certificates
    from flwr.supernode.runtime.run_clientapp import run_clientapp

    for name in preload:  # the ClientApp code, imported once: Flower's loader finds it in sys.modules
        importlib.import_module(name)
    certificates = validate_and_resolve_root_certificates(root_certificates, insecure)
    # no retry invoker: a failed AcquireTask comes back here at once, so the loop keeps watching the SuperNode (the
    # loop itself retries); the forked ClientApps build their own client, with Flower's retries
    client = RuntimeHttpClient.from_server_address(
        server_address=address,
        insecure=insecure,
        root_certificates=certificates,
        interceptors=[RuntimeVersionHttpInterceptor(component_name="SuperExec")],
        retry_invoker=None,
    )
    poll = _poll_interval()
    stopping: list = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append("SIGTERM"))
    signal.signal(signal.SIGINT, lambda *_: stopping.append("SIGINT"))
    children: set = set()
    launched = 0
    failing_since = None
    logged = 0.0
    _log(f"serving {address} (ClientApp tasks; {', '.join(preload)} preloaded; poll {poll:g} s)")
    try:
        while not stopping:
            for pid in list(children):
                with contextlib.suppress(ChildProcessError):
                    if os.waitpid(pid, os.WNOHANG)[0]:
                        children.discard(pid)
            if parent_pid is not None and not _alive(parent_pid):
                return f"the SuperNode (pid {parent_pid}) is gone"
            try:
                res = client.AcquireTask(AcquireTaskRequest(supported_task_types=[str(TaskType.CLIENT_APP)]))
                failing_since = None
            except Exception as exc:  # noqa: BLE001 — the SuperNode restarting or not up yet: try again
                if failing_since is None or time.monotonic() - logged > 30.0:
                    _log(f"AcquireTask failed ({type(exc).__name__}: {exc}); retrying every second")
                    logged = time.monotonic()
                failing_since = failing_since or time.monotonic()
                time.sleep(max(poll, 1.0))
                continue
            if res.HasField("task") and res.token:
                pid = os.fork()
                if pid == 0:
                    _child(run_clientapp, address, res.token, insecure, certificates)
                children.add(pid)
                launched += 1
                continue  # another task may be waiting
            time.sleep(poll)
        return f"stopped by {stopping[0]}"
    finally:
        client.close()
        _log(f"exiting after {launched} task(s)")


def main(argv: list | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m securefed.flower.superexec",
        description="securefed's SuperExec for flower-supernode --isolation process: forks a "
        "pre-imported process per ClientApp task (opt-in; uses Flower internals)",
    )
    ap.add_argument("--runtime-api-address", required=True, help="the SuperNode's Runtime API, host:port (its --port)")
    tls = ap.add_mutually_exclusive_group()
    tls.add_argument(
        "--insecure",
        action="store_true",
        help="the Runtime API has no TLS (the SuperNode started without --ssl-certfile)",
    )
    tls.add_argument("--root-certificates", help="CA certificate of the Runtime API's TLS certificate")
    ap.add_argument("--parent-pid", type=int, default=None, help="exit when this process (the SuperNode) is gone")
    ap.add_argument(
        "--preload",
        action="append",
        default=None,
        metavar="MODULE",
        help="modules imported once before forking (default: securefed.flower.client_app)",
    )
    ap.add_argument(
        "--any-flower-version",
        action="store_true",
        help=f"run with a flwr other than {FLOWER_VERSION} (its private modules may differ)",
    )
    a = ap.parse_args(argv)
    from importlib.metadata import version

    found = version("flwr")
    if found != FLOWER_VERSION and not a.any_flower_version:
        print(
            f"securefed superexec: flwr {found} is installed; this SuperExec uses private modules of flwr "
            f"{FLOWER_VERSION}. Use Flower's own flower-superexec (or --isolation subprocess), or pass "
            "--any-flower-version to try anyway",
            file=sys.stderr,
        )
        return 2
    reason = serve(
        a.runtime_api_address,
        a.insecure,
        a.root_certificates,
        a.parent_pid,
        a.preload or ["securefed.flower.client_app"],
    )
    _log(reason)
    return 0


if __name__ == "__main__":
    sys.exit(main())
