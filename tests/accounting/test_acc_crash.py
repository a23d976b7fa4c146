"""Crash and resume: kill FedDL (SIGKILL) between rounds / mid-round, resume from checkpoint + ledger,
compare with an uninterrupted run."""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from securefed.accounting import PrivacyLedger

SCRIPT = textwrap.dedent(
    """
    import os, signal, sys
    import numpy as np
    from securefed.landmarks import fed_dl
    from securefed.accounting import GradientPerturbation, PrivacyLedger
    mode, out, secure = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
    rng = np.random.default_rng(0)
    sites = [rng.normal(size=(40, 3)) + p for p in range(3)]
    led = PrivacyLedger(os.path.join(out, "ledger.jsonl"), "crash", budget_epsilon=3.0, delta=1e-5)
    priv = GradientPerturbation(epsilon=3.0, tau_x=3.0, ledger=led, random_state=11,
                                insecure_noise_seed_for_testing=None if secure else 11)
    calls = [0]
    real = GradientPerturbation.perturb
    def perturb(self, g, **kw):   # every site's own mechanism (the sites build theirs from the public plan)
        out_ = real(self, g, **kw)
        calls[0] += 1
        if mode == "crash_mid" and calls[0] == 2 * 3 * 2 + 4:   # round 2, after 4 releases (sites 0 and 1)
            os.kill(os.getpid(), signal.SIGKILL)
        return out_
    GradientPerturbation.perturb = perturb
    def cb(r, Y, v):
        if mode == "crash_between" and r == 2:
            os.kill(os.getpid(), signal.SIGKILL)
    res = fed_dl(sites, 5, rounds=4, local_steps=2, rule="model", privacy=priv,
                 checkpoint=os.path.join(out, "ckpt.npz"), random_state=5, callback=cb)
    np.save(os.path.join(out, "Y.npy"), res.landmarks)
    """
)


def _run(tmp_path, mode, out, secure=False):
    script = tmp_path / "run_feddl.py"
    script.write_text(SCRIPT)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # this checkout's package
    env = dict(
        os.environ,
        OMP_NUM_THREADS="1",
        OPENBLAS_NUM_THREADS="1",
        PYTHONPATH=os.pathsep.join([root] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]),
    )
    return subprocess.run(
        [sys.executable, str(script), mode, str(out), "1" if secure else "0"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=os.getcwd(),
    )


def _releases(out, where="ledger.jsonl"):
    led = PrivacyLedger(out / where, "crash", delta=1e-5, read_only=True)
    return led, [(e["id"], e["noise_multiplier"], e["sigma"], e.get("release_digest")) for e in led.events("release")]


def _site_releases(out):
    """Every site's own ledger (written before each release left the site): the record a crash cannot lose."""
    ev = []
    for name in sorted(os.listdir(out / "site-ledgers")):
        ev += _releases(out, os.path.join("site-ledgers", name, "crash.jsonl"))[1]
    return ev


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ref")
    out = tmp / "full"
    out.mkdir()
    r = _run(tmp, "full", out)
    assert r.returncode == 0, r.stderr
    return out


@pytest.mark.parametrize("mode", ["crash_between", "crash_mid"])
def test_seeded_crash_resume_matches_uninterrupted(tmp_path, reference, mode):
    out = tmp_path / mode
    out.mkdir()
    r = _run(tmp_path, mode, out)
    assert r.returncode == -9, r.stderr  # killed
    assert not (out / "Y.npy").exists()
    r = _run(tmp_path, "resume", out)
    assert r.returncode == 0, r.stderr
    np.testing.assert_array_equal(np.load(out / "Y.npy"), np.load(reference / "Y.npy"))
    led_a, ev_a = _releases(reference)
    led_b, ev_b = _releases(out)
    assert ev_a == ev_b  # nothing lost, nothing double-counted
    assert _site_releases(out) == _site_releases(reference)
    assert led_b.spent() == led_a.spent()
    assert led_b.spent()[0] == pytest.approx(3.0, rel=1e-9)


def test_secure_crash_mid_round_resume_rechecks_plan_before_any_release(tmp_path):
    out = tmp_path / "sec"
    out.mkdir()
    assert _run(tmp_path, "crash_mid", out, secure=True).returncode == -9
    assert len(_site_releases(out)) == 16  # the sites' own ledgers hold every release made before the crash
    assert len(_releases(out)[1]) == 12  # the coordinator's mirror holds the completed rounds
    before = {
        name: open(out / "site-ledgers" / name / "crash.jsonl", "rb").read()
        for name in sorted(os.listdir(out / "site-ledgers"))
    }
    # resuming redoes round 2 with fresh noise: the releases sites 0 and 1 already made in round 2 would be counted
    # again (6 spent + 4 planned = 10 > the 8 their ε = 3 budgets were planned for). Each site re-checks its
    # remaining plan before its first release after reopening its ledger, so sites 0 and 1 refuse before releasing
    # anything (typed BudgetExceededError) and the run goes on with site 2 (plain aggregation allows it)
    r = _run(tmp_path, "resume", out, secure=True)
    assert r.returncode == 0, r.stderr
    for name in ("site-00", "site-01"):
        assert open(out / "site-ledgers" / name / "crash.jsonl", "rb").read() == before[name]  # nothing re-released
    ids = [e[0] for e in _site_releases(out)]
    assert len(ids) == len(set(ids)) and not any(i.endswith("attempt1") for i in ids)
    for name in sorted(os.listdir(out / "site-ledgers")):
        led = _releases(out, os.path.join("site-ledgers", name, "crash.jsonl"))[0]
        assert led.spent()[0] <= 3.0 * (1 + 1e-9)
