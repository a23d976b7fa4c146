"""The per-site warm worker (securefed.flower.worker) without Flower: the frame codec, the uid check, the private
directory, and the ClientApp's forwarding path (client_app.forward_request) against a real worker process."""

import os
import signal
import socket
import struct
import subprocess
import sys
import time

import numpy as np
import pytest

from securefed.flower import worker as W

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# ---------------------------------------------------------------------------------------------- codec


def test_frames_round_trip_every_value_type_exactly():
    fields = {
        "op": "secagg",
        "site": 3,
        "weight": 0.1,
        "big": 1e300,
        "neg0": -0.0,
        "inf": float("inf"),
        "flag": True,
        "off": False,
        "none": None,
        "spec": b"\x00\xff" * 9,
        "msgs": [b"a", b"", bytes(range(256))],
        "shape": [40, 3],
        "names": ["x", "y"],
        "empty": [],
        "text": "é\u2603",
    }
    env = W.unpack(
        W.pack(
            {"type": "request", "options": {"site-name": "A", "warm-worker": True}, "fields": fields, "expect": None}
        )[8:]
    )
    got = env["fields"]
    assert got == fields and env["options"] == {"site-name": "A", "warm-worker": True} and env["expect"] is None
    for k, v in fields.items():  # bool stays bool, int stays int, float stays float, bytes stay bytes
        assert type(got[k]) is type(v), k
        if isinstance(v, list):
            assert [type(x) for x in got[k]] == [type(x) for x in v], k
    assert np.signbit(got["neg0"])


def test_frames_are_decoded_strictly():
    good = W.pack({"type": "status"})
    header, body = good[:8], good[8:]
    assert W.unpack(body) == {"type": "status", "v": 1}
    bad_bodies = [
        b"\xff\xfe",  # not UTF-8
        b"[1, 2]",  # not an object
        b'{"type": "status", "v": 1, "v": 1}',  # duplicate key
        b'{"type": "pickle", "v": 1}',  # unknown type
        b'{"type": "status", "v": 2}',  # other version
        b'{"type": "status", "v": 1, "x": 0}',  # unexpected key
        b'{"type": "request", "v": 1, "options": {}, "expect": null, "fields": {"a": {"b": 1}}}',  # nested object
        b'{"type": "request", "v": 1, "options": {}, "expect": null, "fields": {"a": {"$b": "!!"}}}',  # bad base64
        b'{"type": "request", "v": 1, "options": {}, "expect": null, "fields": {"a": [[1]]}}',  # nested list
        b'{"type": "request", "v": 1, "options": [], "expect": null, "fields": {}}',  # options not a dict
    ]
    for b in bad_bodies:
        with pytest.raises(W.FrameError):
            W.unpack(b)
    with pytest.raises(W.FrameError):  # a value that cannot travel is refused when encoding
        W.pack({"type": "reply", "fields": {"n": np.int64(3)}})
    with pytest.raises(W.FrameError):
        W.pack({"type": "reply", "fields": {"x": {"nested": 1}}})

    for frame, kw, match in [
        (b"XXXX" + header[4:] + body, {}, "magic"),  # bad magic
        (struct.pack("!4sI", W.MAGIC, 1000), {"max_size": 999}, "exceeds"),
    ]:  # too long
        a, b = socket.socketpair()
        with a, b:
            a.sendall(frame)
            with pytest.raises(W.FrameError, match=match):
                W.recv_frame(b, **kw)
    a, b = socket.socketpair()
    with b:
        a.sendall(good[:-3])  # peer closes mid-frame
        a.close()
        with pytest.raises(W.WorkerGone):
            W.recv_frame(b)


# --------------------------------------------------------------------------------------- peer and dir


def test_peer_uid_check(monkeypatch):
    a, b = socket.socketpair()
    with a, b:
        if W.peer_uid(a) is None:
            pytest.skip("no SO_PEERCRED on this platform")
        assert W.peer_uid(a) == os.getuid()
        W.check_peer(a)
        real = os.getuid()
        monkeypatch.setattr(W.os, "getuid", lambda: real + 1)  # as seen by a process of another user
        with pytest.raises(W.PeerError, match="uid"):
            W.check_peer(a)


@pytest.mark.skipif(not hasattr(os, "setuid") or os.getuid() != 0, reason="needs root to connect as another user")
def test_worker_side_uid_check_refuses_another_users_connection():
    import shutil
    import tempfile

    d = tempfile.mkdtemp(prefix="sfw-uid-", dir="/tmp")  # reachable by the other user (pytest's tmp is 0700)
    try:
        os.chmod(d, 0o777)
        path = os.path.join(d, "s.sock")
        srv = socket.socket(socket.AF_UNIX)
        srv.bind(path)
        os.chmod(path, 0o777)
        srv.listen(1)
        srv.settimeout(60)
        child = subprocess.Popen(
            [
                sys.executable,
                "-c",
                f"import os, socket; os.setgid(65534); os.setuid(65534); "
                f"s = socket.socket(socket.AF_UNIX); s.connect({path!r}); s.recv(1)",
            ]
        )
        try:
            conn, _ = srv.accept()
            with conn, srv:
                assert W.peer_uid(conn) == 65534
                with pytest.raises(W.PeerError):
                    W.check_peer(conn)
        finally:
            child.kill()
            child.wait(timeout=30)
    finally:
        shutil.rmtree(d, ignore_errors=True)


def test_private_directory_is_required(tmp_path):
    d = tmp_path / "open"
    d.mkdir(mode=0o755)
    os.chmod(d, 0o755)
    with pytest.raises(W.PeerError, match="0700"):
        W.site_location({"warm-worker-dir": str(d)}, 1, 2, parent_pid=os.getpid())
    (tmp_path / "real").mkdir(mode=0o700)
    os.symlink(tmp_path / "real", tmp_path / "link")
    with pytest.raises(W.PeerError, match="not a directory"):
        W.site_location({"warm-worker-dir": str(tmp_path / "link")}, 1, 2, parent_pid=os.getpid())
    loc = W.site_location({}, 1, 2, parent_pid=os.getpid(), cwd=str(tmp_path))
    assert os.path.dirname(loc.socket) == str(tmp_path / ".securefed-warm")
    assert os.stat(loc.directory).st_mode & 0o777 == 0o700
    # a second run, another node, other node config: other sockets
    others = {
        W.site_location({}, 2, 2, parent_pid=os.getpid(), cwd=str(tmp_path)).name,
        W.site_location({}, 1, 3, parent_pid=os.getpid(), cwd=str(tmp_path)).name,
        W.site_location({"site-name": "B"}, 1, 2, parent_pid=os.getpid(), cwd=str(tmp_path)).name,
    }
    assert loc.name not in others and len(others) == 3
    with pytest.raises(W.WorkerError, match="idle"):
        W.idle_minutes({"warm-worker-idle-minutes": 0})
    assert not W.enabled({"warm-worker": False}) and W.enabled({}) and not W.enabled({"warm-worker": "false"})


def test_client_app_module_does_not_import_the_site_code():
    # nor the launcher and the run plan: a fresh ClientApp process per message pays for flwr and the stdlib only
    code = (
        "import sys, securefed.flower.client_app; "
        "bad = sorted(m for m in sys.modules if m.startswith(('securefed.federation', 'securefed.securesum', "
        "'securefed.plan', 'securefed.flower.launch', 'scipy', 'sklearn', 'pandas'))); assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, env=dict(os.environ, PYTHONPATH=ROOT), timeout=120)


# ------------------------------------------------------------------------------- forwarding to a worker


@pytest.fixture
def site(tmp_path):
    """A site's records, a stand-in SuperExec (the worker watches it) and the forwarding function."""
    pytest.importorskip("flwr", reason="the ClientApp module imports flwr")
    from securefed.flower.client_app import forward_request

    np.save(tmp_path / "site.npy", np.random.default_rng(3).normal(size=(30, 3)))
    superexec = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    opts = {
        "data-path": "site.npy",
        "site-name": "A",
        "allow-plain": True,
        "allow-paper-mode": True,
    }  # relative: resolved in the cwd

    def ask(request, marker, run_id=7, options=None):
        return forward_request(
            request, options or opts, run_id, 11, marker, parent_pid=superexec.pid, cwd=str(tmp_path)
        )

    def location(run_id=7, options=None):
        return W.site_location(options or opts, run_id, 11, parent_pid=superexec.pid, cwd=str(tmp_path))

    yield ask, location, superexec
    superexec.kill()
    superexec.wait()


def _status(loc):
    s = W.connect(loc)
    assert s is not None, "no worker listens"
    return W.call(s, {"type": "status"})


def _wait_gone(pid, timeout=30.0):
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        with open(f"/proc/{pid}/stat") as fh:  # a zombie (its parent has not reaped it) counts as gone
            if fh.read().rsplit(")", 1)[1].split()[0] == "Z":
                return True
        time.sleep(0.05)
    return False


def test_forwarding_keeps_the_site_warm_and_a_killed_worker_drops_the_site(site):
    ask, location, superexec = site
    hello = {"op": "hello", "audit_holdout": 0.2, "seed": 0}
    r1, m1 = ask(hello, None)  # starts the worker
    assert r1["site_name"] == "A" and r1["n_records"] == 24 and r1["n_holdout"] == 6 and set(m1) == {"worker"}
    st = _status(location())
    assert st["site"] == "A" and st["calls"] == 1 and "('split', 0.2, 0)" in st["live"]
    r2, m2 = ask(hello, m1)
    assert r2["identity"] == r1["identity"] and m2 == m1  # the same SiteWorker: same run identity key
    up = {
        "op": "plain",
        "task": "stats",
        "scale": 1.0,
        "want": ["gamma", "moments"],
        "site": 0,
        "seed": 0,
        "audit_holdout": 0.2,
    }
    r3, m3 = ask(up, m2)
    assert "error" not in r3 and r3["weight"] == 24.0 and m3 == m1
    st2 = _status(location())
    assert st2["pid"] == st["pid"] and st2["calls"] == 3 and st2["live"] == st["live"]  # one process, caches kept
    # another run on the same SuperNode: its own worker, its own identity
    r_other, m_other = ask(hello, None, run_id=8)
    assert r_other["identity"] != r1["identity"] and m_other["worker"] != m1["worker"]
    os.kill(_status(location(8))["pid"], signal.SIGTERM)

    os.kill(st["pid"], signal.SIGKILL)  # the worker crashes mid-run
    assert _wait_gone(st["pid"])
    r4, m4 = ask(up, m3)
    assert r4["error"].startswith("ProtocolAbortedError:") and "warm worker" in r4["error"] and m4 == m3
    assert W.connect(location()) is None  # no fresh worker answers with a blank state
    r5, m5 = ask(hello, m4)  # a re-admission hello: a new worker, a new key
    assert "error" not in r5 and r5["identity"] != r1["identity"] and m5["worker"] != m1["worker"]
    pid = _status(location())["pid"]
    assert ask({"op": "bye"}, m5) == ({}, m5)  # the run's last message: the worker leaves
    assert _wait_gone(pid) and W.connect(location()) is None
    assert "bye" in location().last_log_line()


def test_worker_exits_with_its_superexec(site):
    ask, location, superexec = site
    r, _ = ask({"op": "hello"}, None)
    assert "error" not in r
    loc = location()  # (named by the SuperExec's pid and start time)
    pid = _status(loc)["pid"]
    superexec.kill()  # the SuperNode (and its SuperExec) is gone
    superexec.wait()
    assert _wait_gone(pid, 30.0), "the worker outlived its SuperExec"
    assert "is gone" in loc.last_log_line()


def test_worker_exits_after_its_idle_minutes(site):
    ask, location, _ = site
    opts = {"data-path": "site.npy", "site-name": "A", "warm-worker-idle-minutes": 0.02}  # 1.2 s
    r, _ = ask({"op": "hello"}, None, options=opts)
    assert "error" not in r
    pid = _status(location(options=opts))["pid"]
    assert _wait_gone(pid, 60.0)
    assert "idle" in location(options=opts).last_log_line()
