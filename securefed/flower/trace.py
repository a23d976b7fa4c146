"""A timing trace of securefed's own path over Flower, for maintainers (off unless asked for).

Set ``SECUREFED_FLOWER_TRACE`` to a directory in the environment of the SuperLink and SuperNodes (the ServerApp,
the ClientApps and the sites' warm workers inherit it) and each of them appends one JSON line per event to
``<dir>/trace.jsonl``: wall-clock stamps (``time.time()``, one machine) of where a request/reply round trip
spends its time —

* ``server``  (the ServerApp's :class:`~securefed.flower.transport.FlowerExchange`): push started / done, every
  reply's arrival, the round trip's end, bytes out and in;
* ``clientapp`` (one per message): the process's start (``/proc``), the handler's entry and exit, the time spent
  forwarding to the warm worker, the request's op;
* ``worker``: receipt, answer and the site's compute seconds of every request.

``benchmarks/flower_path.py`` reads the file and splits each round trip into Flower's part and securefed's. Nothing
secret is written (ops, sizes, times, pids, Flower message ids). Standard library only (the ClientApp imports it).
"""

from __future__ import annotations

import json
import os
import time

__all__ = ["ENV", "enabled", "emit", "process_start_time"]

ENV = "SECUREFED_FLOWER_TRACE"


def enabled() -> bool:
    """True when ``SECUREFED_FLOWER_TRACE`` names a directory."""
    return bool(os.environ.get(ENV))


def process_start_time(pid: int | None = None) -> float | None:
    """Wall-clock time a process started (Linux ``/proc``, 10 ms resolution; None elsewhere)."""
    try:
        with open(f"/proc/{pid or os.getpid()}/stat", "rb") as fh:
            ticks = int(fh.read().rsplit(b")", 1)[1].split()[19])
        with open("/proc/uptime", "rb") as fh:
            uptime = float(fh.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return time.time() - (uptime - ticks / os.sysconf("SC_CLK_TCK"))


def emit(kind: str, **fields) -> None:
    """Append one event to the trace (no-op when the trace is off; never raises)."""
    where = os.environ.get(ENV)
    if not where:
        return
    line = json.dumps({"kind": kind, "pid": os.getpid(), **fields}, default=str) + "\n"
    try:
        os.makedirs(where, exist_ok=True)
        fd = os.open(os.path.join(where, "trace.jsonl"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)
    except OSError:
        pass


def now() -> float:
    return time.time()
