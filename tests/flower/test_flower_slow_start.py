"""A ClientApp that starts slower than Flower allows — what a new user met on a loaded machine ("only 0 site(s)
answered hello" while every flwr-clientapp logged "Runtime task-token authentication failed").

Flower 1.41 gives a launched ClientApp 30 s between the SuperExec's claim of its task and its first call to the
SuperNode; after that the SuperNode revokes the task's token and hands the task out again. Here every
``flwr-clientapp`` process is made to start 35 s late (a ``sitecustomize`` on the deployment's PYTHONPATH sleeps
before anything else runs — what a machine at load 30 does to flwr's imports):

* with Flower's SuperExec (the default) no ClientApp can ever answer: the ServerApp stops after ``wait-sites``
  (not after ``request-timeout``) with a reason that names the 30 s window, and the SuperNodes log the token
  failure;
* with securefed's SuperExec (opt-in, ``--isolation process``) no interpreter starts per message — a
  pre-imported process forks — so the same job completes, and its result is the in-process one bit for bit.
"""

import os
import threading

import numpy as np
import pytest

pytest.importorskip("flwr", reason="flwr not installed: pip install 'securefed[flower]' (flwr==1.41.0)")

from securefed.flower import LocalDeployment  # noqa: E402
from securefed.flower.launch import write_site_files  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DELAY = 35.0      # > Flower 1.41's 30 s between a task's claim and the ClientApp's first call
WAIT_SITES = 70.0   # a late ClientApp reports its failure ~35–45 s after its launch
CFG = {"landmarks": 6, "rounds": 1, "local-steps": 2, "gamma": 1.0, "init": "moments", "aggregation": "plain",
       "landmark-method": "feddl", "audit-holdout": 0.0, "min-sites": 3, "seed": 3, "method": "none",
       "wait-sites": WAIT_SITES}


def _scenario(tmp_path, superexec: str):
    rng = np.random.default_rng(5)
    arrays = [rng.normal(size=(30, 3)) + 0.5 * i for i in range(3)]
    paths = write_site_files(str(tmp_path / "data"), arrays)
    slow = tmp_path / "slow"
    slow.mkdir()
    (slow / "sitecustomize.py").write_text(
        "import os, sys, time\n"
        "if os.path.basename(sys.argv[0] if sys.argv else '') == 'flwr-clientapp':\n"
        f"    time.sleep({DELAY})\n")
    env = {"PYTHONPATH": os.pathsep.join([str(slow), ROOT, os.environ.get("PYTHONPATH", "")])}
    with LocalDeployment(str(tmp_path / "dep"), superexec=superexec, env=env) as dep:
        dep.start_superlink()
        for i, p in enumerate(paths):
            dep.start_supernode(f"site{i}", p, node_config={"allow-plain": True})
        out = dep.run(CFG)
        res = dep.wait_result(out, round_trips=3, extra=WAIT_SITES)
        logs = "".join(open(os.path.join(dep.workdir, f"site-site{i}.log"), errors="replace").read() for i in range(3))
    return res, logs, arrays, out


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    """Both deployments at once (they wait on Flower and on the 35 s sleeps, not on the CPU)."""
    box = {}

    def work(kind):
        try:
            box[kind] = _scenario(tmp_path_factory.mktemp(kind), kind)
        except BaseException as exc:  # handed to the test that reports it
            box[kind] = exc

    threads = [threading.Thread(target=work, args=(k,), daemon=True) for k in ("flower", "securefed")]
    for th in threads:
        th.start()
    for th in threads:
        th.join()  # every wait inside has a deadline derived from the work (LocalDeployment.wait_result)
    return box


def _get(box, kind):
    if isinstance(box[kind], BaseException):
        raise box[kind]
    return box[kind]


@pytest.mark.slow
def test_clientapps_slower_than_flowers_window_stop_the_run_at_wait_sites_with_the_cause(outcomes):
    res, logs, _, _ = _get(outcomes, "flower")
    assert "Runtime task-token authentication failed" in logs  # Flower revoked the late ClientApps' tokens
    assert res["status"] == "aborted" and res["error_type"] == "ProtocolTimeoutError", res
    reason = res["reason"]
    assert "connected but only 0 answered within wait-sites = 70 s" in reason, reason
    assert "Runtime task-token authentication failed" in reason and "30 s" in reason


@pytest.mark.slow
def test_securefeds_superexec_forks_instead_of_starting_an_interpreter_and_the_run_matches(outcomes):
    from securefed.federation import Coordinator, InMemoryExchange, SiteWorker, drive
    from securefed.plan import from_run_config

    res, logs, arrays, out = _get(outcomes, "securefed")
    assert res["status"] == "completed", res
    assert res["round_trips"] == 3  # hello, the statistics, one FedDL round
    assert "task-token authentication failed" not in logs
    assert res["sites"] == ["site0", "site1", "site2"] and res["survivors"] == res["sites"]
    ref = drive(Coordinator(from_run_config({k: v for k, v in CFG.items() if k != "wait-sites"})),
                InMemoryExchange({1000 + i: SiteWorker({"site-name": f"site{i}", "allow-plain": True}, X)
                                  for i, X in enumerate(arrays)}, fresh_process=True))
    # the same coordinator and site code with the same seeds and plain sums: the landmarks bit for bit
    np.testing.assert_array_equal(np.load(os.path.join(out, "landmarks.npy")), ref.landmarks)
