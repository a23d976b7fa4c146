"""Real Flower deployment on 127.0.0.1: a SuperLink and 3 SuperNodes as subprocesses (free ports).

Skipped when ``flwr`` (securefed[flower]) is not importable. Every process group is killed in
``finally`` (LocalDeployment.__exit__). To stay within the time budget on 2 cores, the killed-site TLS
scenario and the DP + rows scenario run in background threads (each with its own SuperLink and
SuperNodes) while the main test runs; the later tests collect their outcomes. Flower's cost is its
per-message latency (a fresh ClientApp process per message, 3 s polling), not CPU, so they overlap well.
No wait has a fixed number of seconds: each is derived from the work (the job's round trips, the machine's
pace — :meth:`LocalDeployment.wait_result`), so a loaded machine is slow, not failing.
"""

import json
import os
import shutil
import subprocess
import threading
import time

import numpy as np
import pytest

pytest.importorskip("flwr", reason="flwr not installed: pip install 'securefed[flower]' (flwr==1.41.0)")

from securefed.flower import LocalDeployment  # noqa: E402
from securefed.flower.launch import write_site_files  # noqa: E402
from securefed.landmarks import fed_dl  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _data(tmp_path):
    rng = np.random.default_rng(11)
    arrays = [rng.normal(size=(40, 3)) * 0.4 + 0.3 * i for i in range(3)]
    paths = write_site_files(str(tmp_path), arrays)
    Y0 = rng.normal(size=(8, 3)) * 0.4
    np.save(tmp_path / "init.npy", Y0)
    return arrays, paths, Y0


def _killed_site_scenario(tmp_path) -> tuple[dict, float]:
    """TLS + node authentication; an unregistered SuperNode tries to join; SIGKILL one registered
    SuperNode once the run is past hello. Returns (result, seconds waited, sites that said hello)."""
    _, paths, _ = _data(tmp_path)
    certs = tmp_path / "certs"
    subprocess.run(
        ["bash", os.path.join(ROOT, "scripts", "make_certs.sh"), str(certs)], check=True, capture_output=True
    )
    # request-timeout is an hour: the run must end through the stage deadlines (3 s each), never by waiting it out
    cfg = {
        "landmarks": 8,
        "rounds": 1,
        "local-steps": 2,
        "gamma": 1.0,
        "init": "moments",
        "aggregation": "secagg",
        "value-bound": 3.0,
        "degree": 2,
        "threshold": 2,
        "min-sites": 3,
        "stage-timeout": 3.0,
        "request-timeout": 3600.0,
        "seed": 0,
        "method": "none",
    }
    with LocalDeployment(str(tmp_path / "dep"), certs=str(certs), node_auth=True) as dep:
        dep.start_superlink()
        for i, p in enumerate(paths):
            dep.start_supernode(f"site{i}", p)
        dep.start_supernode("intruder", paths[0], register=False)
        out = dep.run(cfg)
        prog = os.path.join(out, "progress.jsonl")
        t0 = time.monotonic()
        while not (os.path.exists(prog) and '"hello"' in open(prog).read()):
            # the wait for the sites (wait-sites, 120 s by default) and the hello round trip
            if time.monotonic() - t0 > 120.0 + 3 * dep.round_trip_allowance():
                raise AssertionError("run never got past hello")
            time.sleep(0.1)
        dep.kill_site("site2")  # crash one hospital after the run started
        t1 = time.monotonic()
        res = dep.wait_result(out, round_trips=6, extra=5 * 3.0)
        waited = time.monotonic() - t1
        hello = [json.loads(line) for line in open(prog) if '"hello"' in line][0]
        return res, waited, hello["sites"], 5 * (3.0 + dep.round_trip_allowance())


def _in_background(scenario, tmp_dir, what: str):
    """Run ``scenario(tmp_dir)`` in a daemon thread; returns (thread, outcome) — ``outcome()`` waits for it (every
    wait inside a scenario has a deadline derived from the work) and returns its value or raises its exception."""
    box: dict = {}

    def work():
        try:
            box["out"] = scenario(tmp_dir)
        except BaseException as exc:  # handed to the test that reports it
            box["exc"] = exc

    th = threading.Thread(target=work, daemon=True, name=what)
    th.start()

    def outcome():
        th.join()
        if "exc" in box:
            raise box["exc"]
        return box["out"]

    return th, outcome


@pytest.fixture(scope="module")
def killed_run(tmp_path_factory):
    """Start the killed-site scenario in the background; yields a function returning its outcome."""
    if shutil.which("openssl") is None or shutil.which("ssh-keygen") is None:
        yield None
        return
    th, outcome = _in_background(_killed_site_scenario, tmp_path_factory.mktemp("killed"), "killed-site scenario")
    yield outcome
    th.join()


def _dp_rows_scenario(tmp_path) -> tuple:
    """DP (seeded noise, local mode, plain sum) + the spectral rows stage with data-perturbed rows; each site
    keeps its own ledger (node config). Returns (result, out_dir, arrays, ledger dirs)."""
    arrays, paths, _ = _data(tmp_path)
    cfg = {
        "landmarks": 6,
        "rounds": 1,
        "local-steps": 2,
        "aggregation": "plain",
        "min-sites": 3,
        "seed": 5,
        "epsilon": 2.0,
        "clip-norm": 2.0,
        "rows-epsilon": 1.0,
        "method": "spectral",
        "nystrom": "rows",
        "n-clusters": 3,
        "noise-seed-for-testing": 5,
        "audit-holdout": 0.0,
    }
    ledgers = [str(tmp_path / f"ledgers-site{i}") for i in range(3)]
    with LocalDeployment(str(tmp_path / "dep")) as dep:
        dep.start_superlink()
        for i, p in enumerate(paths):
            dep.start_supernode(
                f"site{i}",
                p,
                node_config={
                    "epsilon-budget": 3.5,
                    "allow-seeded-noise": True,
                    "ledger-path": ledgers[i],
                    "allow-plain": True,
                    "allow-paper-mode": True,
                },
            )
        out = dep.run(cfg)
        return dep.wait_result(out, round_trips=6), out, arrays, ledgers


@pytest.fixture(scope="module")
def dp_rows_run(tmp_path_factory):
    """Start the DP + rows scenario in the background (it waits on Flower's message latency, not the CPU)."""
    th, outcome = _in_background(_dp_rows_scenario, tmp_path_factory.mktemp("dprows"), "DP + rows scenario")
    yield outcome
    th.join()


def test_fed_tsne_landmarks_secagg_over_flower_match_in_process(tmp_path, killed_run, dp_rows_run):
    arrays, paths, Y0 = _data(tmp_path)
    cfg = {
        "landmarks": 8,
        "rounds": 1,
        "local-steps": 2,
        "gamma": 1.0,
        "init": str(tmp_path / "init.npy"),
        "aggregation": "secagg",
        "value-bound": 3.0,
        "degree": 2,
        "threshold": 2,
        "min-sites": 3,
        "stage-timeout": 60.0,
        "seed": 0,
        "method": "tsne",
        "nystrom": "local",
        "perplexity": 30.0,
        "landmark-method": "feddl",
        "audit-holdout": 0.0,
    }
    with LocalDeployment(str(tmp_path / "dep")) as dep:
        dep.start_superlink()
        for i, p in enumerate(paths):
            dep.start_supernode(f"site{i}", p, node_config={"allow-paper-mode": True})  # the paper's FedDL
        out = dep.run(cfg)
        res = dep.wait_result(out, round_trips=12)
    assert res["status"] == "completed", res
    assert res["sites"] == ["site0", "site1", "site2"] and res["survivors"] == res["sites"]
    Y = np.load(os.path.join(out, "landmarks.npy"))
    ref = fed_dl(
        arrays,
        8,
        rounds=1,
        local_steps=2,
        gamma=1.0,
        init=Y0,
        value_bound=3.0,
        random_state=0,
        aggregation="secagg",
        aggregation_options={"degree": 2, "threshold": 2},
    )
    # the same coordinator and site code with the same seeds: the SecAgg+ sum is exact integer arithmetic,
    # so the landmarks over Flower are the in-process ones bit for bit
    np.testing.assert_array_equal(Y, ref.landmarks)
    assert not np.allclose(Y, Y0)
    st = res["steps"][0]
    assert all(v > 0 for v in st["bytes_from_site"].values())
    # no-rows Fed-tSNE: the coordinator mapped the landmarks, each site placed its own records against that map and
    # sent only its coordinates — the same coordinator and site code in process gives the same map and coordinates
    from securefed.federation import Coordinator, InMemoryExchange, SiteWorker, drive
    from securefed.plan import from_run_config

    ex = InMemoryExchange(
        {1000 + i: SiteWorker({"site-name": f"site{i}", "allow-paper-mode": True}, X) for i, X in enumerate(arrays)},
        fresh_process=True,
    )
    ref_run = drive(Coordinator(from_run_config(cfg)), ex)
    np.testing.assert_array_equal(Y, ref_run.landmarks)
    np.testing.assert_allclose(
        np.load(os.path.join(out, "landmark_embedding.npy")), ref_run.embedding["landmark_embedding"], rtol=0, atol=1e-9
    )
    with np.load(os.path.join(out, "embedding.npz")) as z:
        for i, X in enumerate(arrays):
            assert z[f"site{i}"].shape == (len(X), 2)
        np.testing.assert_allclose(
            np.vstack([z[f"site{i}"] for i in range(3)]), ref_run.stacked("coordinates"), rtol=0, atol=1e-9
        )


def test_killed_supernode_with_tls_and_node_auth_aborts_with_typed_reason(killed_run):
    if killed_run is None:
        pytest.skip("openssl / ssh-keygen not installed (needed for TLS certificates and node keys)")
    res, waited, hello_sites, bound = killed_run()
    assert hello_sites == ["site0", "site1", "site2"]  # the unregistered SuperNode never joined
    assert res["status"] == "aborted", res
    assert res["error_type"] in ("ProtocolTimeoutError", "ProtocolAbortedError"), res
    assert "nothing revealed" in res["reason"] or "answered" in res["reason"]
    # bounded by the stage deadlines (3 s each, plus the round trips of the live sites), never by the hour of
    # request-timeout: the run does not hang on the dead site
    assert waited < bound < 3600, (waited, bound)


def test_dp_and_rows_over_flower_match_in_process_with_site_ledgers(dp_rows_run):
    from securefed.accounting import GradientPerturbation, PrivacyLedger

    res, out, arrays, ledgers = dp_rows_run()
    assert res["status"] == "completed", res
    gp = GradientPerturbation(epsilon=2.0, tau_x=2.0, insecure_noise_seed_for_testing=5)
    ref = fed_dl(arrays, 6, rounds=1, local_steps=2, privacy=gp, random_state=5)
    np.testing.assert_array_equal(np.load(os.path.join(out, "landmarks.npy")), ref.landmarks)  # same noise streams
    assert res["privacy"]["epsilon"] == pytest.approx(ref.privacy["epsilon"], rel=1e-12)
    assert res["privacy"]["rows"]["epsilon"] == 1.0 and res["privacy"]["epsilon_total"] > res["privacy"]["epsilon"]
    assert any("give every record back" in w for w in res["warnings"])
    with np.load(os.path.join(out, "labels.npz")) as z:
        assert [len(z[f"site{i}"]) for i in range(3)] == [len(X) for X in arrays]
    run_id = res["run_id"]
    for i, d in enumerate(ledgers):  # each site's own ledger: 2 gradient releases + 1 data release, its site only
        led = PrivacyLedger(os.path.join(d, run_id + ".jsonl"), run_id, accountant="exact")
        kinds = sorted(e["mechanism"] for e in led.events("release"))
        assert kinds == ["gaussian-data", "gaussian-gradient", "gaussian-gradient"] and led.sites() == [i]
    server = PrivacyLedger(os.path.join(out, "ledger.jsonl"), run_id, accountant="exact")
    assert len(server.events("release")) == 9
