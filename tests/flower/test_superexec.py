"""securefed's SuperExec process on its own (its ClientApp path over a real deployment is in
test_first_deployment.py): it leaves with the SuperNode it serves, and on SIGTERM."""

import os
import signal
import socket
import subprocess
import sys
import time

import pytest

pytest.importorskip("flwr", reason="flwr not installed: pip install 'securefed[flower]' (flwr==1.41.0)")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(parent: int, tmp_path):
    log = open(tmp_path / "superexec.log", "wb")
    p = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "securefed.flower.superexec",
            "--runtime-api-address",
            f"127.0.0.1:{_free_port()}",
            "--insecure",
            "--parent-pid",
            str(parent),
        ],
        env=dict(os.environ, PYTHONPATH=ROOT, FLWR_SUPEREXEC_TASK_POLL_INTERVAL="0.1"),
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=tmp_path,
    )
    log.close()
    return p


def _wait_log(tmp_path, text: str, proc) -> str:
    """Wait until the log shows ``text`` while the process lives (it imports flwr first: seconds on a loaded
    machine; bounded by the process, which retries a Runtime API that is not there)."""
    path = tmp_path / "superexec.log"
    while text not in path.read_text(errors="replace"):
        assert proc.poll() is None, path.read_text(errors="replace")
        time.sleep(0.1)
    return path.read_text(errors="replace")


@pytest.mark.slow
def test_superexec_leaves_with_its_supernode_and_on_sigterm(tmp_path):
    node = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])  # stands in for the SuperNode
    se = _start(node.pid, tmp_path)
    try:
        _wait_log(tmp_path, "serving 127.0.0.1", se)  # no Runtime API listens there: it keeps retrying
        node.kill()
        node.wait()
        assert se.wait(timeout=120) == 0
        assert f"the SuperNode (pid {node.pid}) is gone" in (tmp_path / "superexec.log").read_text()
    finally:
        for p in (node, se):
            if p.poll() is None:
                p.kill()
                p.wait()
    keeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    (tmp_path / "superexec.log").unlink()
    se = _start(keeper.pid, tmp_path)
    try:
        _wait_log(tmp_path, "serving 127.0.0.1", se)
        se.send_signal(signal.SIGTERM)
        assert se.wait(timeout=120) == 0
        assert "stopped by SIGTERM" in (tmp_path / "superexec.log").read_text()
    finally:
        for p in (keeper, se):
            if p.poll() is None:
                p.kill()
                p.wait()
