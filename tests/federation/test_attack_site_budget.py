"""Attacks on a site's privacy budget, its Poisson sample and its noise mode (issue 25 items 2, 3 and 4), played against
the real :class:`SiteWorker` through the in-process driver; each fails on commit 9fe16f9.

* interleaved run ids: release of run A, both of run B, second of run A — every site's ledgers together must stay
  within its ``epsilon-budget`` (9fe16f9: 1.2 against 1);
* an earlier run's ledger emptied, renamed, its header's type changed or replaced by garbage: the site refuses with
  a typed ``LedgerError`` naming the file (9fe16f9: the run's spending forgotten, the full budget granted again;
  garbage → an untyped ``JSONDecodeError``);
* a run killed mid-way with secret noise and resumed: the user sees the sites' own reason
  (9fe16f9: a ``ProtocolTimeoutError`` about keys);
* the Poisson sample: two runs with the same printed seed draw different samples, and a run on other records of the
  same sizes (what anyone who knows the seed can replay) draws another sample (9fe16f9: identical);
* a coordinator forces ``noise distributed`` on a site that did not allow it: refused, nothing booked at σ/√t
  (9fe16f9: the victim's release carries σ/√t).

Spending is read back from the ledger files with :class:`PrivacyLedger` (read-only), one run at a time, and added
up here — not with the site-wide index under test.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from securefed.accounting import PrivacyLedger
from securefed.errors import ProtocolTimeoutError, SecureFedError
from securefed.federation import Coordinator, InMemoryExchange, SiteWorker, drive
from securefed.federation.privacy import open_server_ledger
from securefed.plan import RunPlan

pytestmark = pytest.mark.usefixtures("single_blas_thread")

NAMES = ["s0", "s1", "s2"]
BUDGET = 1.0


@pytest.fixture(scope="module")
def sites():
    rng = np.random.default_rng(5)
    return [rng.normal(size=(40 + 5 * i, 3)) * 0.4 + 0.3 * i for i in range(3)]


def _plan(run_id, epsilon=0.6, **kw):
    base = dict(
        method="none",
        landmark_method="feddl",
        landmarks=6,
        rounds=1,
        local_steps=2,
        rule="gradient",
        aggregation="plain",
        value_bound=3.0,
        min_sites=1,
        seed=3,
        audit_holdout=0.0,
        epsilon=epsilon,
        clip_norm=2.0,
        run_id=run_id,
    )
    base.update(kw)
    return RunPlan.build("api", **base)


def _workers(sites, tmp_path, **extra):
    return {
        1000 + i: SiteWorker(
            {
                "site-name": NAMES[i],
                "allow-plain": True,
                "epsilon-budget": BUDGET,
                "ledger-path": str(tmp_path / "sites" / NAMES[i]),
                **extra,
            },
            X,
        )
        for i, X in enumerate(sites)
    }


def _drive(plan, workers, tmp_path, **kw):
    return drive(Coordinator(plan, ledger=open_server_ledger(plan, plan.run_id, None)), InMemoryExchange(workers, **kw))


def _spent_by_file(tmp_path, name) -> dict:
    """ε each run ledger of site ``name`` holds (read-only, one file at a time)."""
    d = tmp_path / "sites" / name
    out = {}
    for f in sorted(os.listdir(d)):
        if not f.endswith(".jsonl") or f.startswith("site-"):
            continue
        head = json.loads((d / f).read_text().splitlines()[0])
        led = PrivacyLedger(
            str(d / f), head["run_id"], delta=head["delta"], accountant=head["accountant"], read_only=True
        )
        out[f] = led.spent()[0]
    return out


# ------------------------------------------------------------------------------------ budgets across runs


def test_interleaved_run_ids_never_exceed_the_sites_budget(sites, tmp_path):
    """Release of run A, both releases of run B, then A's second: each run alone fits, both together do not."""
    workers = _workers(sites, tmp_path)
    done = {}

    def interleave(address, fields):
        if fields.get("step") == 1 and "b" not in done:  # A's second release is next: run B whole first
            done["b"] = _drive(_plan("run-b", epsilon=0.55), workers, tmp_path)
        return fields

    with pytest.raises(SecureFedError) as err:
        _drive(_plan("run-a"), workers, tmp_path, before_request=interleave)
    assert done["b"].survivors == [0, 1, 2]  # B fitted in what A had left
    assert "BudgetExceededError" in str(err.value)  # A's second release is refused, with the sites' reason
    for name in NAMES:
        spent = _spent_by_file(tmp_path, name)
        assert set(spent) == {"run-a.jsonl", "run-b.jsonl"}
        assert sum(spent.values()) <= BUDGET * (1 + 1e-9), (name, spent)


def _tamper(path, how):
    text = path.read_text()
    if how == "emptied":
        path.write_text("")
    elif how == "renamed":
        os.rename(path, str(path) + ".old")
    elif how == "header-type":
        lines = text.splitlines()
        head = json.loads(lines[0])
        head["type"] = "note"
        path.write_text("\n".join([json.dumps(head, sort_keys=True)] + lines[1:]) + "\n")
    elif how == "garbage-header":
        path.write_text("#!garbage\n" + "\n".join(text.splitlines()[1:]) + "\n")
    elif how == "deleted":
        os.remove(path)
    elif how == "release-dropped":
        lines = text.splitlines()
        path.write_text("\n".join(lines[:-1]) + "\n")
    elif how == "release-altered":  # a valid event claiming 100× the noise: ε of that release nearly 0
        lines = text.splitlines()
        ev = json.loads(lines[-1])
        ev["noise_multiplier"] *= 100
        ev["sigma"] *= 100
        path.write_text("\n".join(lines[:-1] + [json.dumps(ev, sort_keys=True)]) + "\n")


@pytest.mark.parametrize(
    "how", ["emptied", "renamed", "header-type", "garbage-header", "deleted", "release-dropped", "release-altered"]
)
def test_a_tampered_earlier_ledger_is_refused_never_forgotten(sites, tmp_path, how):
    workers = _workers(sites, tmp_path)
    first = _drive(_plan("run-a"), workers, tmp_path)
    assert first.privacy["epsilon"] == pytest.approx(0.6, rel=1e-9)
    for name in NAMES:  # the same tampering at every site: each would otherwise grant run B the full budget again
        _tamper(tmp_path / "sites" / name / "run-a.jsonl", how)
    with pytest.raises(SecureFedError) as err:
        _drive(_plan("run-b"), _workers(sites, tmp_path), tmp_path)
    msg = str(err.value)
    assert "LedgerError" in msg and "JSONDecodeError" not in msg, msg
    for name in NAMES:
        assert str(tmp_path / "sites" / name / "run-a.jsonl") in msg, msg  # each site names its file
        b = tmp_path / "sites" / name / "run-b.jsonl"
        assert not b.exists() or not any(json.loads(x).get("type") == "release" for x in b.read_text().splitlines())


def test_a_site_budget_still_spans_runs_and_is_reused_exactly_once(sites, tmp_path):
    """Sequential runs at one site: the second gets what the first left (basic composition over runs), a third that
    does not fit is refused with the site's reason; the ledgers hold no more than the budget."""
    workers = _workers(sites, tmp_path)
    _drive(_plan("seq-1", epsilon=0.5), workers, tmp_path)
    _drive(_plan("seq-2", epsilon=0.45), _workers(sites, tmp_path), tmp_path)
    with pytest.raises(SecureFedError, match="BudgetExceededError"):
        _drive(_plan("seq-3", epsilon=0.2), _workers(sites, tmp_path), tmp_path)
    for name in NAMES:
        assert sum(_spent_by_file(tmp_path, name).values()) <= BUDGET * (1 + 1e-9)


def test_a_killed_run_with_secret_noise_refuses_with_the_sites_reason(sites, tmp_path):
    """The coordinator dies after round 2's releases were made (secret noise) and before its checkpoint; resuming from
    the round-1 checkpoint would redo releases already sent. The sites refuse, and the user reads why."""
    plan = _plan(
        "killed", epsilon=BUDGET, rounds=3, local_steps=1, aggregation="secagg", degree=2, threshold=2, min_sites=3
    )
    state = {}

    class Kill(Exception):
        pass

    def on_event(ev):
        if ev["event"] == "round" and ev["round"] == 2:
            raise Kill()
        if ev["event"] == "checkpoint":
            state["ck"] = ev["state"]

    with pytest.raises(Kill):
        drive(
            Coordinator(plan, ledger=open_server_ledger(plan, plan.run_id, None), on_event=on_event),
            InMemoryExchange(_workers(sites, tmp_path)),
        )
    with pytest.raises(SecureFedError) as err:
        drive(
            Coordinator(plan, ledger=open_server_ledger(plan, plan.run_id, None), resume=state["ck"]),
            InMemoryExchange(_workers(sites, tmp_path)),
        )
    assert not isinstance(err.value, ProtocolTimeoutError), err.value
    assert "BudgetExceededError" in str(err.value) and "redoes releases" in str(err.value)


# ------------------------------------------------------------------------------------ the Poisson sample


@pytest.fixture
def samples(monkeypatch):
    """Record which of its records each site's Poisson sample kept (indices into the records it was given)."""
    from securefed.accounting import GradientPerturbation

    seen = []
    orig = GradientPerturbation.batch

    def batch(self, site, round, step, X, rng):
        Xb, n_norm = orig(self, site, round, step, X, rng)
        idx = np.flatnonzero((X[:, None, :] == Xb[None, :, :]).all(-1).any(1))
        seen.append((int(site), int(round), int(step), tuple(idx.tolist())))
        return Xb, n_norm

    monkeypatch.setattr(GradientPerturbation, "batch", batch)
    return seen


def _sampled_run(arrays, tmp_path, folder, samples):
    samples.clear()
    plan = _plan("sampled", epsilon=5.0, rounds=2, local_steps=2, sample_rate=0.3, accountant="rdp")
    (tmp_path / folder).mkdir()
    _drive(plan, _workers(arrays, tmp_path / folder, **{"epsilon-budget": 10.0}), tmp_path / folder)
    return sorted(samples)


def test_two_runs_with_the_same_seed_draw_different_poisson_samples(sites, tmp_path, samples):
    a = _sampled_run(sites, tmp_path, "a", samples)
    b = _sampled_run(sites, tmp_path, "b", samples)
    assert len(a) == len(b) == 12  # 3 sites × 2 rounds × 2 steps
    assert [k[:3] for k in a] == [k[:3] for k in b]
    same = sum(x[3] == y[3] for x, y in zip(a, b))
    assert same == 0, f"{same} of {len(a)} samples repeated with the same printed seed"


def test_the_poisson_sample_is_not_predictable_from_the_seed(sites, tmp_path, samples):
    """Anyone who knows the printed seed replays the run on records of their own with the sites' public sizes: with
    samples drawn from the seed they get every site's sample; from the OS source, none."""
    victim = _sampled_run(sites, tmp_path, "victim", samples)
    rng = np.random.default_rng(99)
    mine = [rng.normal(size=X.shape) for X in sites]
    replay = _sampled_run(mine, tmp_path, "replay", samples)
    predicted = sum(x == y for x, y in zip(victim, replay))
    assert predicted == 0, f"{predicted} of {len(victim)} samples predicted from the seed"


# ------------------------------------------------------------------------------------ distributed noise, forced


def test_a_coordinator_cannot_force_distributed_noise_on_a_site(tmp_path):
    """The plan says local noise; the coordinator tells the victim its billboard release is a σ/√t share inside the
    secure sum. A site that did not set allow-distributed-noise refuses; nothing is booked below its full σ."""
    rng = np.random.default_rng(0)
    centres = rng.normal(size=(4, 10)) * 3
    arrays = [np.clip(centres[rng.integers(0, 4, 80)] + rng.normal(size=(80, 10)), -8, 8) for _ in range(3)]
    plan = RunPlan.build(
        "api",
        method="tsne",
        epsilon=2.0,
        delta=1e-5,
        clip_norm=8.0 * 10**0.5,
        value_bound=8.0,
        audit_holdout=0.0,
        landmarks=30,
        n_iter=250,
        seed=5,
        aggregation="secagg",
        run_id="forced",
        min_sites=2,
    )
    assert plan.landmark_method == "billboard" and plan.noise == "local"
    replies = []

    def lie(address, fields):  # told to the victim alone, and signed in the round spec (sign_lies)
        if address == 1001 and "billboard" in fields:
            bp = json.loads(fields["billboard"])
            fields["billboard"] = json.dumps(dict(bp, noise="distributed", t=3))
        return fields

    def watch(address, fields, reply):
        if address == 1001 and "billboard" in fields:
            replies.append(reply)

    workers = _workers(arrays, tmp_path)
    try:
        _drive(plan, workers, tmp_path, before_request=lie, after_reply=watch, sign_lies=True)
    except SecureFedError:
        pass  # without the victim the run may or may not finish: what matters is what the victim sent and booked
    assert replies and all("error" in r for r in replies), replies
    assert all("allow-distributed-noise" in r["error"] for r in replies)
    led = tmp_path / "sites" / "s1" / "forced.jsonl"
    booked = [json.loads(x) for x in led.read_text().splitlines()[1:]] if led.exists() else []
    assert not any(
        ev.get("noise_share", ev.get("sigma")) < ev.get("sigma") for ev in booked if ev.get("type") == "release"
    )


def test_a_site_that_allows_distributed_noise_adds_its_share(tmp_path):
    from securefed.federation.wire import dumps
    from securefed.landmarks.merf import billboard_noise

    X = np.random.default_rng(0).normal(size=(30, 4))
    bp = {
        "run_id": "r",
        "epsilon": 1.0,
        "delta": 1e-5,
        "accountant": "exact",
        "count_share": 0.2,
        "density_share": 0.0,
        "density_grid": 8,
        "noise": "distributed",
        "t": 3,
        "sizes": [30, 30, 30],
        "noise_seed": None,
    }
    req = {
        "op": "secagg-start",
        "site": 0,
        "task": "rff",
        "billboard": dumps(bp),
        "release": 0,
        "n_freq": 10,
        "lengthscales": [3.0],
        "space": "raw",
        "out_shape": [20],
        "seed": 0,
        "weights": "uniform",
    }
    from securefed.federation.privacy import site_billboard_release

    opts = {"epsilon-budget": 5.0, "ledger-path": ":memory:"}
    with pytest.raises(SecureFedError, match="allow-distributed-noise"):
        site_billboard_release(req, X, opts, 0, {}, 30, "secagg-start")
    _, events = site_billboard_release(
        req, X, dict(opts, **{"allow-distributed-noise": True}), 0, {}, 30, "secagg-start"
    )
    ev = json.loads(events[0])
    assert ev["sigma"] == pytest.approx(ev["sensitivity"] / billboard_noise(1.0, 1e-5, 0.2)["mu1"], rel=1e-12)
    assert ev["noise_share"] == pytest.approx(ev["sigma"] / 3**0.5, rel=1e-12)
