"""The per-site warm worker: one long-lived process per (SuperNode, Flower run) that holds the site in memory.

Flower 1.41 starts a fresh ``flwr-clientapp`` process for every message and keeps nothing but the serialised
``context.state`` between them. With the site option ``warm-worker`` (default true) securefed's ClientApp
(:mod:`securefed.flower.client_app`) stays light — flwr and the standard library — and forwards each request
over a private Unix socket to this worker, which keeps the run's
:class:`~securefed.federation.site.SiteWorker` in memory: the records are loaded once, the caches
(``SiteWorker._live``: the audit split, the kernel terms, the DP calibration) and the protocol machines stay
live, and nothing of the site is re-serialised through Flower between messages.

**Secrets stay in this process.** With the worker on, the site's run identity key (Ed25519), its Generator, the
SecAgg+ client machine and its keys, the CKKS secret context and the DP calibration/state live only in the
worker's memory; they never pass through Flower's ``context.state`` (which the SuperNode keeps and ships to
every ClientApp process). The ClientApp stores one non-secret value there: the id of the worker instance that
served the run (``securefed-warm``), so that it notices when that worker is gone.

Lifecycle
---------
* **Start.** The first message of a run on a SuperNode finds no worker and starts one (``python -m
  securefed.flower.worker``; a new session, stdin closed, output appended to ``<name>.log`` beside the
  socket). It imports the site code, binds its socket, and only then makes it visible (atomic rename), so a
  successful ``connect`` means ready. A second worker for the same socket exits at once (``flock`` on the log).
* **Exit.** After ``warm-worker-idle-minutes`` (default 10) without a request; when the process that started
  the ClientApps (Flower's SuperExec, i.e. the SuperNode) is gone (``pidfd`` on Linux, else polled every
  second); on ``SIGTERM``; and after answering a ``bye`` (the ClientApp forwards ``{"op": "bye"}``, which a
  coordinator may send as a run's last message). The reason is the last line of its log.
* **Crash / kill.** The site's run state is gone, exactly as with a restarted SuperNode: the next message of the
  run gets ``{"error": "ProtocolAbortedError: ..."}`` (the coordinator drops the site) and no new worker
  answers it with a fresh state; a later ``hello`` (a re-admission) starts a new worker with a new identity key.

Where
-----
A private directory (mode 0700, owned by the SuperNode's user; refused otherwise): the site option
``warm-worker-dir``, else ``$XDG_RUNTIME_DIR/securefed-warm``, else ``.securefed-warm`` in the SuperNode's working
directory. The socket's name is a hash of the user, the Flower run id, the node id, the node config and the
SuperExec's pid and start time: a second run, a second site or a restarted SuperNode on the same host never
reaches another's worker. Paths longer than ``sun_path`` allows are reached through ``/proc/self/fd``.

Security
--------
Unix socket only (never TCP); the directory is 0700 and the socket 0600; both ends check the peer's uid with
``SO_PEERCRED`` (Linux) and drop a connection from another user. Frames are length-prefixed JSON with a strict
codec (no pickle): a 4-byte magic ``SFW1``, a 4-byte big-endian length, then a JSON object whose field values are
``str``/``int``/``float``/``bool``/``None``, ``bytes`` as ``{"$b": base64}``, or flat lists of these.

This module imports only the standard library at module level (the ClientApp imports it); the worker's
``main`` imports the site code.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import errno
import hashlib
import json
import math
import os
import select
import signal
import socket
import stat
import struct
import subprocess
import sys
import time
from typing import Any

from . import trace as _trace

__all__ = [
    "WorkerError",
    "FrameError",
    "PeerError",
    "WorkerGone",
    "MAGIC",
    "MAX_FRAME",
    "DEFAULT_IDLE_MINUTES",
    "encode_fields",
    "decode_fields",
    "pack",
    "unpack",
    "send_frame",
    "recv_frame",
    "peer_uid",
    "check_peer",
    "Location",
    "site_location",
    "enabled",
    "idle_minutes",
    "connect",
    "start_worker",
    "call",
    "main",
]

MAGIC = b"SFW1"
_HEADER = struct.Struct("!4sI")
#: largest frame either end accepts (1 GiB: a rows reply of 10⁶ records × 100 landmarks is 0.8 GB as base64)
MAX_FRAME = 1 << 30
VERSION = 1
DEFAULT_IDLE_MINUTES = 10.0
#: sun_path holds 108 bytes on Linux; longer paths go through /proc/self/fd/<dir fd>/<name>
_SUN_PATH_MAX = 100
_ENVELOPE_KEYS = {
    "request": {"v", "type", "options", "fields", "expect"},
    "status": {"v", "type"},
    "bye": {"v", "type"},
    "reply": {"v", "type", "worker", "pid", "calls", "fields", "note"},
    "stale": {"v", "type", "worker"},
    "failure": {"v", "type", "worker", "error"},
    "status-reply": {"v", "type", "worker", "pid", "calls", "live", "site", "idle_minutes", "started"},
    "bye-reply": {"v", "type", "worker"},
}


class WorkerError(Exception):
    """The warm worker cannot be used (framing, codec, peer, location)."""


class FrameError(WorkerError):
    """A frame or its JSON content failed strict decoding."""


class PeerError(WorkerError):
    """The other end of the socket belongs to another user, or the directory is not private."""


class WorkerGone(WorkerError):
    """No worker listens at the location, or it closed the connection before replying."""


# ------------------------------------------------------------------------------------------------ codec


def _encode_scalar(v, key: str):
    if v is None or isinstance(v, (bool, str)):
        return v
    if isinstance(v, int):
        return int(v)
    if isinstance(v, float):
        return float(v)
    if isinstance(v, (bytes, bytearray, memoryview)):
        return {"$b": base64.b64encode(bytes(v)).decode("ascii")}
    raise FrameError(f"field {key!r}: a value of type {type(v).__name__} cannot travel to or from the warm worker")


def encode_fields(fields: dict) -> dict:
    """A securefed request/reply dict as a JSON-ready dict (``bytes`` → ``{"$b": base64}``)."""
    if not isinstance(fields, dict):
        raise FrameError(f"fields must be a dict, not {type(fields).__name__}")
    out = {}
    for k, v in fields.items():
        if not isinstance(k, str):
            raise FrameError(f"field name {k!r} is not a string")
        out[k] = [_encode_scalar(x, k) for x in v] if isinstance(v, (list, tuple)) else _encode_scalar(v, k)
    return out


def _decode_scalar(v, key: str):
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, dict) and set(v) == {"$b"} and isinstance(v["$b"], str):
        try:
            return base64.b64decode(v["$b"].encode("ascii"), validate=True)
        except (binascii.Error, UnicodeEncodeError):
            raise FrameError(f"field {key!r}: malformed base64") from None
    raise FrameError(f"field {key!r}: unexpected value {str(v)[:80]!r}")


def decode_fields(obj) -> dict:
    """Inverse of :func:`encode_fields` (strict: a flat dict of scalars, bytes and flat lists of them)."""
    if not isinstance(obj, dict):
        raise FrameError(f"fields must be a JSON object, not {type(obj).__name__}")
    return {
        k: [_decode_scalar(x, k) for x in v] if isinstance(v, list) else _decode_scalar(v, k) for k, v in obj.items()
    }


def _no_duplicates(pairs):
    d = {}
    for k, v in pairs:
        if k in d:
            raise FrameError(f"duplicate key {k!r} in a frame")
        d[k] = v
    return d


def pack(envelope: dict) -> bytes:
    """One frame: magic, length, JSON of ``envelope`` (its ``fields``/``options`` encoded)."""
    env = dict(envelope, v=VERSION)
    for key in ("fields", "options"):
        if key in env:
            env[key] = encode_fields(env[key])
    body = json.dumps(env, separators=(",", ":"), allow_nan=True).encode("utf-8")
    if len(body) > MAX_FRAME:
        raise FrameError(f"frame of {len(body)} bytes exceeds the limit of {MAX_FRAME}")
    return _HEADER.pack(MAGIC, len(body)) + body


def unpack(body: bytes) -> dict:
    """The envelope of one frame body (strict: known type, known keys, version, typed fields)."""
    try:
        env = json.loads(body.decode("utf-8"), object_pairs_hook=_no_duplicates)
    except (UnicodeDecodeError, ValueError) as exc:
        if isinstance(exc, FrameError):
            raise
        raise FrameError(f"frame is not valid JSON: {exc}") from None
    if not isinstance(env, dict):
        raise FrameError("frame is not a JSON object")
    kind = env.get("type")
    if kind not in _ENVELOPE_KEYS:
        raise FrameError(f"unknown frame type {kind!r}")
    if env.get("v") != VERSION:
        raise FrameError(
            f"frame version {env.get('v')!r}, expected {VERSION} (ClientApp and worker from different installs?)"
        )
    extra = set(env) - _ENVELOPE_KEYS[kind]
    if extra:
        raise FrameError(f"unexpected keys {sorted(extra)} in a {kind!r} frame")
    for key in ("fields", "options"):
        if key in env:
            env[key] = decode_fields(env[key])
    return env


def _recv_exact(sock: socket.socket, n: int) -> bytearray:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise WorkerGone(f"connection closed after {got} of {n} bytes")
        got += k
    return buf


def send_frame(sock: socket.socket, envelope: dict) -> None:
    sock.sendall(pack(envelope))


def recv_frame(sock: socket.socket, max_size: int = MAX_FRAME) -> dict:
    """Read one frame (``WorkerGone`` when the peer closed first; ``FrameError`` when it is malformed)."""
    magic, n = _HEADER.unpack(bytes(_recv_exact(sock, _HEADER.size)))
    if magic != MAGIC:
        raise FrameError(f"bad frame magic {magic!r}")
    if n > max_size:
        raise FrameError(f"frame of {n} bytes exceeds the limit of {max_size}")
    return unpack(bytes(_recv_exact(sock, n)))


# --------------------------------------------------------------------------------------------- peers


def peer_uid(sock: socket.socket) -> int | None:
    """The uid of the process at the other end of a connected Unix socket (``SO_PEERCRED``; None elsewhere)."""
    opt = getattr(socket, "SO_PEERCRED", None)
    if opt is None:
        return None
    _pid, uid, _gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, opt, struct.calcsize("3i")))
    return uid


def check_peer(sock: socket.socket) -> None:
    """Raise :class:`PeerError` unless the peer runs as this process's user (where the OS can tell)."""
    uid = peer_uid(sock)
    if uid is not None and uid != os.getuid():
        raise PeerError(f"peer uid {uid} is not this process's uid {os.getuid()}")


# ------------------------------------------------------------------------------------------ location


def enabled(options: dict) -> bool:
    """The site option ``warm-worker`` (default true)."""
    from ..federation.wire import truthy

    return truthy(options.get("warm-worker", True))


def idle_minutes(options: dict) -> float:
    """The site option ``warm-worker-idle-minutes`` (default 10; a positive number)."""
    raw = options.get("warm-worker-idle-minutes", DEFAULT_IDLE_MINUTES)
    try:
        v = float(raw)
    except (TypeError, ValueError):
        v = float("nan")
    if not (math.isfinite(v) and v > 0):
        raise WorkerError(f"site option warm-worker-idle-minutes={raw!r} is invalid: use a positive number of minutes")
    return v


def _private_dir(path: str) -> str:
    path = os.path.abspath(path)
    os.makedirs(path, mode=0o700, exist_ok=True)
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise PeerError(f"warm-worker directory {path} is not a directory")
    if st.st_uid != os.getuid():
        raise PeerError(f"warm-worker directory {path} belongs to uid {st.st_uid}, not to this user ({os.getuid()})")
    if st.st_mode & 0o077:
        raise PeerError(
            f"warm-worker directory {path} has mode {oct(stat.S_IMODE(st.st_mode))}; it must be 0700 "
            "(private to the SuperNode's user)"
        )
    return path


def _start_time(pid: int) -> str:
    """A process's start time (clock ticks since boot, Linux) — with the pid it names one process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[1].split()[19].decode()
    except (OSError, IndexError):
        return ""


class Location:
    """Where one site's worker listens: a private directory and a socket name in it."""

    def __init__(self, directory: str, name: str):
        self.directory, self.name = directory, name

    @property
    def socket(self) -> str:
        return os.path.join(self.directory, self.name + ".sock")

    @property
    def log(self) -> str:
        return os.path.join(self.directory, self.name + ".log")

    @contextlib.contextmanager
    def address(self):
        """The path to bind or connect to (through ``/proc/self/fd`` when the plain path is too long)."""
        if len(os.fsencode(self.socket)) <= _SUN_PATH_MAX:
            yield self.socket
            return
        if not os.path.isdir("/proc/self/fd"):
            raise WorkerError(
                f"socket path {self.socket} is too long for a Unix socket; set the site option "
                "warm-worker-dir to a shorter directory"
            )
        fd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            yield f"/proc/self/fd/{fd}/{self.name}.sock"
        finally:
            os.close(fd)

    def last_log_line(self) -> str:
        """The worker's last words (its exit reason), or ''."""
        try:
            with open(self.log, "rb") as fh:
                fh.seek(max(0, os.fstat(fh.fileno()).st_size - 4096))
                lines = [ln for ln in fh.read().decode("utf-8", "replace").splitlines() if ln.strip()]
        except OSError:
            return ""
        return lines[-1].strip() if lines else ""


def site_location(options: dict, run_id, node_id, parent_pid: int | None = None, cwd: str | None = None) -> Location:
    """The socket of this (SuperNode, run)'s worker (module docstring, "Where"); creates the private directory."""
    if options.get("warm-worker-dir"):
        directory = str(options["warm-worker-dir"])
    elif os.environ.get("XDG_RUNTIME_DIR") and os.path.isdir(os.environ["XDG_RUNTIME_DIR"]):
        directory = os.path.join(os.environ["XDG_RUNTIME_DIR"], "securefed-warm")
    else:
        directory = os.path.join(cwd or os.getcwd(), ".securefed-warm")
    directory = _private_dir(directory)
    ppid = os.getppid() if parent_pid is None else int(parent_pid)
    key = json.dumps(
        [
            os.getuid(),
            str(run_id),
            str(node_id),
            sorted((str(k), str(v)) for k, v in options.items()),
            ppid,
            _start_time(ppid),
        ]
    )
    return Location(directory, "w-" + hashlib.sha256(key.encode()).hexdigest()[:20])


# ------------------------------------------------------------------------------------ the client side


def connect(loc: Location, timeout: float | None = None) -> socket.socket | None:
    """A connection to the worker at ``loc`` (its uid checked), or None when no worker listens there."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        with loc.address() as addr:
            s.connect(addr)
    except (FileNotFoundError, ConnectionRefusedError):
        s.close()
        return None
    except OSError as exc:
        s.close()
        if exc.errno in (errno.ENOENT, errno.ECONNREFUSED):
            return None
        raise
    try:
        check_peer(s)
    except PeerError:
        s.close()
        raise
    s.settimeout(timeout)
    return s


def _package_root() -> str:
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _worker_env() -> dict:
    """The ClientApp's environment; the securefed it imported first on PYTHONPATH when it is a source tree."""
    env = dict(os.environ)
    root = _package_root()
    if os.path.exists(os.path.join(root, "pyproject.toml")):
        parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        if not parts or os.path.abspath(parts[0]) != root:
            env["PYTHONPATH"] = os.pathsep.join([root, *parts])
    return env


def start_worker(
    loc: Location, options: dict, parent_pid: int | None = None, cwd: str | None = None, timeout: float = 180.0
) -> socket.socket:
    """Start the worker for ``loc`` (detached) and return a connection once it listens (``WorkerError`` when it
    exits first or does not listen within ``timeout`` seconds; its log's tail is in the message)."""
    ppid = os.getppid() if parent_pid is None else int(parent_pid)
    argv = [
        sys.executable,
        "-m",
        "securefed.flower.worker",
        "--dir",
        loc.directory,
        "--name",
        loc.name,
        "--watch",
        str(ppid),
        "--idle-minutes",
        repr(idle_minutes(options)),
        "--cwd",
        os.path.abspath(cwd or os.getcwd()),
    ]
    fd = os.open(loc.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        proc = subprocess.Popen(
            argv,
            cwd=loc.directory,
            env=_worker_env(),
            stdin=subprocess.DEVNULL,
            stdout=fd,
            stderr=fd,
            start_new_session=True,
            close_fds=True,
        )
    finally:
        os.close(fd)
    t0 = time.monotonic()
    while True:
        s = connect(loc)
        if s is not None:
            proc.returncode = 0  # detached on purpose: no "still running" warning when this Popen is collected
            return s
        code = proc.poll()
        if code is not None and code != 0:
            raise WorkerError(
                f"the warm worker exited with code {code} before listening: {loc.last_log_line()!r} (log {loc.log})"
            )
        if time.monotonic() - t0 > timeout:
            raise WorkerError(f"the warm worker did not listen within {timeout:g} s (log {loc.log})")
        time.sleep(0.02 if time.monotonic() - t0 < 1.0 else 0.1)


def call(sock: socket.socket, envelope: dict) -> dict:
    """Send one frame on a fresh connection and read the answer; closes the connection."""
    with sock:
        try:
            send_frame(sock, envelope)
            return recv_frame(sock)
        except (ConnectionResetError, BrokenPipeError) as exc:  # the worker died with the connection open
            raise WorkerGone(f"the connection was reset ({type(exc).__name__})") from None


# ---------------------------------------------------------------------------------------- the worker


class _Worker:
    def __init__(self, idle_seconds: float):
        import secrets

        self.token = secrets.token_hex(16)
        self.idle_seconds = idle_seconds
        self.site: Any = None  # the SiteWorker, made on the first request (the site code loads once)
        self.options: dict | None = None
        self.calls = 0
        self.started = time.time()

    def answer(self, env: dict) -> tuple[dict, bool]:
        """(answer envelope, exit after sending)."""
        kind = env["type"]
        if kind == "status":
            live: list = [] if self.site is None else sorted(repr(k) for k in self.site._live)
            return {
                "type": "status-reply",
                "worker": self.token,
                "pid": os.getpid(),
                "calls": self.calls,
                "live": live,
                "site": None if self.site is None else self.site.name,
                "idle_minutes": self.idle_seconds / 60.0,
                "started": self.started,
            }, False
        if kind == "bye":
            return {"type": "bye-reply", "worker": self.token}, True
        if kind != "request":
            raise FrameError(f"a worker does not accept {kind!r} frames")
        expect = env.get("expect")
        if expect is not None and expect != self.token:
            return {"type": "stale", "worker": self.token}, False
        try:
            t0 = time.time()
            fields = self._handle(env["options"], env["fields"])
            _trace.emit("worker", op=env["fields"].get("op"), recv=t0, done=time.time())
            note = None
            if fields.get("error") is None and env["fields"].get("op") == "hello":
                note = f"identity key fingerprint {self.site.fingerprint()}"
            self.calls += 1
            return {
                "type": "reply",
                "worker": self.token,
                "pid": os.getpid(),
                "calls": self.calls,
                "fields": fields,
                "note": note,
            }, False
        except Exception as exc:  # like an exception in the ClientApp: Flower replies with an error
            self.calls += 1
            return {"type": "failure", "worker": self.token, "error": f"{type(exc).__name__}: {exc}"}, False

    def _handle(self, options: dict, fields: dict) -> dict:
        from securefed.federation.site import SiteWorker

        if self.site is None:
            self.site, self.options = SiteWorker(options), dict(options)
        elif options != self.options:
            raise WorkerError("the site options changed within a run (a different SuperNode config?)")
        return self.site.handle(fields)


def _log(msg: str) -> None:
    print(
        f"{time.strftime('%Y-%m-%d %H:%M:%S')} securefed warm worker {os.getpid()}: {msg}", file=sys.stderr, flush=True
    )


def serve(directory: str, name: str, watch_pid: int, idle_seconds: float, cwd: str) -> str:
    """The worker's main loop; returns why it stopped."""
    import fcntl

    loc = Location(directory, name)
    lock = open(loc.log, "ab")
    try:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return "another worker already serves this socket"
    pidfd = None
    try:
        pidfd = os.pidfd_open(watch_pid) if hasattr(os, "pidfd_open") else None
    except ProcessLookupError:
        return f"the SuperExec (pid {watch_pid}) is gone"
    except OSError:
        pidfd = None
    os.chdir(cwd)  # relative data-path / ledger-path resolve as in the ClientApp
    from securefed.federation import site  # noqa: F401  (the site code, once, before announcing readiness)

    worker = _Worker(idle_seconds)
    dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    tmp = f"{name}.{os.getpid()}.tmp"
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp, dir_fd=dfd)
    old_umask = os.umask(0o177)
    try:
        srv.bind(
            f"/proc/self/fd/{dfd}/{tmp}"
            if len(os.fsencode(os.path.join(directory, tmp))) > _SUN_PATH_MAX
            else os.path.join(directory, tmp)
        )
    finally:
        os.umask(old_umask)
    os.chmod(tmp, 0o600, dir_fd=dfd)
    srv.listen(16)
    ino = os.stat(tmp, dir_fd=dfd).st_ino
    os.replace(tmp, name + ".sock", src_dir_fd=dfd, dst_dir_fd=dfd)  # appears atomically, ready
    _log(f"listening (run state in memory; idle exit after {idle_seconds / 60.0:g} min; watching pid {watch_pid})")

    def _terminate(*_):
        raise _Stop("stopped by SIGTERM")

    signal.signal(signal.SIGTERM, _terminate)
    last = time.monotonic()
    reason = ""
    try:
        while not reason:
            left = idle_seconds - (time.monotonic() - last)
            if left <= 0:
                reason = f"idle for {idle_seconds / 60.0:g} min (site option warm-worker-idle-minutes)"
                break
            waits = [srv] + ([pidfd] if pidfd is not None else [])
            try:
                ready, _, _ = select.select(waits, [], [], min(left, 1.0) if pidfd is None else left)
            except InterruptedError:
                continue
            if (pidfd is not None and pidfd in ready) or (pidfd is None and not _alive(watch_pid)):
                reason = f"the SuperExec (pid {watch_pid}) is gone"
                break
            if srv not in ready:
                continue
            conn, _ = srv.accept()
            with conn:
                try:
                    check_peer(conn)
                    conn.settimeout(120.0)  # to receive the request; answering has no deadline here
                    env = recv_frame(conn)
                    answer, leave = worker.answer(env)
                    try:
                        data = pack(answer)
                    except FrameError as exc:  # a reply that cannot travel: like an exception in the ClientApp
                        data = pack({"type": "failure", "worker": worker.token, "error": f"FrameError: {exc}"})
                    conn.sendall(data)
                except (WorkerError, OSError) as exc:  # a bad peer or frame: drop that connection, keep serving
                    _log(f"dropped a connection: {type(exc).__name__}: {exc}")
                    continue
            last = time.monotonic()
            if leave:
                reason = "bye (the run's last message)"
    except _Stop as exc:
        reason = str(exc)
    finally:
        with contextlib.suppress(OSError):
            if os.stat(name + ".sock", dir_fd=dfd).st_ino == ino:  # never remove a successor's socket
                os.unlink(name + ".sock", dir_fd=dfd)
        srv.close()
    _log(f"exiting after {worker.calls} request(s): {reason}")
    return reason


class _Stop(BaseException):  # not caught by the request handler
    pass


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def main(argv: list | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(
        prog="python -m securefed.flower.worker",
        description="securefed's per-site warm worker (started by the ClientApp)",
    )
    ap.add_argument("--dir", required=True)
    ap.add_argument("--name", required=True)
    ap.add_argument("--watch", type=int, required=True, help="exit when this pid (the SuperExec) is gone")
    ap.add_argument("--idle-minutes", type=float, default=DEFAULT_IDLE_MINUTES)
    ap.add_argument("--cwd", default=os.getcwd())
    a = ap.parse_args(argv)
    reason = serve(a.dir, a.name, a.watch, a.idle_minutes * 60.0, a.cwd)
    if reason.startswith("another worker"):
        _log(reason)
    return 0


if __name__ == "__main__":
    sys.exit(main())
