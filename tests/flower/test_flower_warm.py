"""Over a real Flower deployment (SuperLink + 3 SuperNodes on 127.0.0.1): every site answers through its warm
worker, and a worker killed mid-run makes only that site drop, with the typed reason in result.json."""

import json
import os
import signal
import time

import numpy as np
import pytest

pytest.importorskip("flwr", reason="flwr not installed: pip install 'securefed[flower]' (flwr==1.41.0)")

from securefed.flower import LocalDeployment  # noqa: E402
from securefed.flower import worker as W  # noqa: E402


def _worker_of(directory: str) -> dict:
    """The status of the one worker listening in ``directory``."""
    socks = [f for f in os.listdir(directory) if f.endswith(".sock")]
    assert len(socks) == 1, socks
    s = W.connect(W.Location(directory, socks[0][: -len(".sock")]))
    assert s is not None
    return W.call(s, {"type": "status"})


def test_killed_warm_worker_drops_its_site_with_a_typed_error(tmp_path):
    rng = np.random.default_rng(11)
    paths, dirs = [], []
    for i in range(3):
        p = tmp_path / f"site{i}.npy"
        np.save(p, rng.normal(size=(40, 3)) * 0.4 + 0.3 * i)
        paths.append(str(p))
        dirs.append(str(tmp_path / f"warm{i}"))
    # a plain sum (the sites allow it) goes on with the sites that answer; SecAgg+ with 3 sites, degree 2 and
    # threshold 2 could not lose one (that abort is the killed-SuperNode test's)
    cfg = {
        "landmarks": 8,
        "rounds": 2,
        "local-steps": 2,
        "gamma": 1.0,
        "init": "moments",
        "aggregation": "plain",
        "min-sites": 2,
        "stage-timeout": 60.0,
        "seed": 0,
        "method": "none",
    }
    with LocalDeployment(str(tmp_path / "dep")) as dep:
        dep.start_superlink()
        for i, p in enumerate(paths):
            dep.start_supernode(
                f"site{i}", p, node_config={"warm-worker-dir": dirs[i], "allow-plain": True, "allow-paper-mode": True}
            )
        out = dep.run(cfg)
        prog = os.path.join(out, "progress.jsonl")
        t0 = time.monotonic()
        while not (os.path.exists(prog) and '"hello"' in open(prog).read()):
            # the wait for the sites (wait-sites, 120 s by default) and the hello round trip, at this machine's pace
            assert time.monotonic() - t0 < 120.0 + 3 * dep.round_trip_allowance(), "run never got past hello"
            time.sleep(0.1)
        victim = _worker_of(dirs[2])
        assert victim["site"] == "site2" and victim["calls"] == 1
        os.kill(victim["pid"], signal.SIGKILL)  # the site's worker crashes; its SuperNode lives on
        res = dep.wait_result(out, round_trips=10)
        alive = [_worker_of(d) for d in dirs[:2]]  # the others served the whole run from one process
    assert res["status"] == "completed", res
    assert res["survivors"] == ["site0", "site1"]
    err = res["site_errors"]["site2"]
    assert err.startswith("ProtocolAbortedError:") and "warm worker" in err, err
    assert all(st["calls"] >= 4 and st["site"] == f"site{i}" for i, st in enumerate(alive)), alive
    events = [json.loads(line)["event"] for line in open(prog)]
    assert events.count("hello") == 1
