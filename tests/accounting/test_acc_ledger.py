"""Ledger: write-ahead, budget refusal before release, torn lines, resume, idempotent redo."""

import json
import math
import os

import numpy as np
import pytest

from securefed.accounting import GradientPerturbation, PrivacyLedger
from securefed.errors import BudgetExceededError, ConfigError, LedgerError


def _mech(tmp_path, *, budget=None, epsilon=None, z=None, secure=False, seed=7, name="l.jsonl", noise="local", P=2):
    led = PrivacyLedger(tmp_path / name, "run", budget_epsilon=budget if budget is not None else epsilon, delta=1e-5)
    m = GradientPerturbation(
        epsilon=epsilon,
        noise_multiplier=z,
        tau_x=1.0,
        ledger=led,
        noise=noise,
        insecure_noise_seed_for_testing=None if secure else seed,
    )
    rng = np.random.default_rng(0)
    sites = [rng.normal(size=(30, 3)) for _ in range(P)]
    m.prepare(sites, gamma=1.0, n_landmarks=4, rounds=3, local_steps=2, rule="gradient", n_clients=P)
    return m, led


def _lines(path):
    return [json.loads(line) for line in open(path).read().splitlines()]


def test_event_on_disk_before_release_returns(tmp_path):
    m, led = _mech(tmp_path, epsilon=1.0)
    g = np.zeros((4, 3))
    seen = []
    real = led._append

    def spy(ev):
        real(ev)
        seen.append(any(e.get("id") == ev["id"] for e in _lines(led.path)))  # fsync'd line is there

    led._append = spy
    out = m.perturb(g, site=0, round=0, step=0)
    assert seen == [True]
    ev = _lines(led.path)[-1]
    assert ev["type"] == "release" and ev["site"] == 0 and ev["round"] == 0 and ev["step"] == 0
    assert ev["sigma"] == pytest.approx(m.sigma[0]) and ev["sensitivity"] == pytest.approx(m.sens[0].value)
    assert ev["accountant_state"]["history"]
    assert not np.array_equal(out, g)


def test_budget_refusal_writes_and_sends_nothing(tmp_path, closed_form):
    z = 2.0
    one = closed_form.gdp_epsilon(math.sqrt(1) / z, 1e-5)
    two = closed_form.gdp_epsilon(math.sqrt(2) / z, 1e-5)
    led = PrivacyLedger(tmp_path / "b.jsonl", "run", budget_epsilon=(one + two) / 2, delta=1e-5)
    m = GradientPerturbation(noise_multiplier=z, tau_x=1.0, ledger=led)
    sites = [np.ones((5, 2)) * 0.1]
    # the whole plan (6 releases) does not fit: refused at prepare, nothing written
    with pytest.raises(BudgetExceededError, match="budget"):
        m.prepare(sites, gamma=1.0, n_landmarks=3, rounds=3, local_steps=2, rule="model", n_clients=1)
    assert len(_lines(led.path)) == 1  # header only
    # bypass the plan: per-release refusal
    m.prepare(sites, gamma=1.0, n_landmarks=3, rounds=1, local_steps=1, rule="model", n_clients=1)
    m.perturb(np.zeros((3, 2)), site=0, round=0, step=0)
    before = open(led.path, "rb").read()
    with pytest.raises(BudgetExceededError, match="nothing was sent"):
        m.perturb(np.zeros((3, 2)), site=0, round=0, step=1)
    assert open(led.path, "rb").read() == before
    assert led.spent(0)[0] == pytest.approx(one)


def test_resume_restores_spent_and_checks_identity(tmp_path):
    m, led = _mech(tmp_path, epsilon=2.0)
    for t in range(2):
        for p in range(2):
            m.perturb(np.zeros((4, 3)), site=p, round=0, step=t)
    spent = led.spent()
    with pytest.raises(LedgerError, match=f"another writer \\(pid {os.getpid()}"):  # the writer holds its lock
        PrivacyLedger(led.path, "run", delta=1e-5)
    peek = PrivacyLedger(led.path, "run", delta=1e-5, read_only=True)  # readers need no lock
    assert peek.spent() == spent
    with pytest.raises(LedgerError, match="read_only"):
        peek.record_release(
            site=0, round=9, step=0, attempt=0, mechanism="x", sensitivity=1.0, sigma=1.0, noise_multiplier=1.0
        )
    led.close()
    again = PrivacyLedger(led.path, "run", delta=1e-5)
    assert again.spent() == spent and again.budget_epsilon == led.budget_epsilon
    assert [e["id"] for e in again.events()] == [e["id"] for e in led.events()]
    again.close()
    with pytest.raises(LedgerError, match="belongs to run"):
        PrivacyLedger(led.path, "other", delta=1e-5)
    with pytest.raises(LedgerError, match="delta"):
        PrivacyLedger(led.path, "run", delta=1e-6)
    with pytest.raises(LedgerError, match="budget"):
        PrivacyLedger(led.path, "run", delta=1e-5, budget_epsilon=9.0)


def test_torn_last_line(tmp_path, closed_form):
    m, led = _mech(tmp_path, epsilon=2.0)
    m.perturb(np.zeros((4, 3)), site=0, round=0, step=0)
    m.perturb(np.zeros((4, 3)), site=0, round=0, step=1)
    full = open(led.path, "rb").read()
    spent2 = led.spent(0)[0]
    spent1 = closed_form.gdp_epsilon(math.sqrt(1) / m.z, 1e-5)
    led.close()
    # (a) crash in the middle of writing the last event: dropped (it had not been returned)
    torn = full[: len(full) - 40]
    open(led.path, "wb").write(torn)
    r = PrivacyLedger(led.path, "run", delta=1e-5)
    r.close()
    assert r.recovered["torn_last_line"] == "discarded"
    assert r.spent(0)[0] == pytest.approx(spent1)
    assert os.path.exists(str(led.path) + ".torn")
    assert open(led.path, "rb").read().endswith(b"\n")
    # (b) complete JSON but no newline: kept and counted
    open(led.path, "wb").write(full[:-1])
    r = PrivacyLedger(led.path, "run", delta=1e-5)
    r.close()
    assert r.recovered["torn_last_line"] == "kept_and_counted"
    assert r.spent(0)[0] == pytest.approx(spent2)
    assert open(led.path, "rb").read() == full
    # (c) corruption elsewhere: refused
    lines = full.split(b"\n")
    lines[1] = lines[1][:10]
    open(led.path, "wb").write(b"\n".join(lines))
    with pytest.raises(LedgerError, match="corrupt"):
        PrivacyLedger(led.path, "run", delta=1e-5)


def test_seeded_redo_is_idempotent_secure_redo_counts(tmp_path, closed_form):
    g = np.arange(12.0).reshape(4, 3) * 1e-3
    m, led = _mech(tmp_path, epsilon=2.0, name="s.jsonl")
    a = m.perturb(g, site=0, round=0, step=0)
    led.close()
    m2 = GradientPerturbation(
        epsilon=2.0, tau_x=1.0, ledger=PrivacyLedger(led.path, "run", delta=1e-5), insecure_noise_seed_for_testing=7
    )
    m2.prepare([np.zeros((30, 3))] * 2, gamma=1.0, n_landmarks=4, rounds=3, local_steps=2, rule="gradient", n_clients=2)
    b = m2.perturb(g, site=0, round=0, step=0)
    np.testing.assert_array_equal(a, b)
    assert len(m2.ledger.events("release")) == 1
    # same seed but a different input: new attempt with fresh noise, counted
    c = m2.perturb(g + 1.0, site=0, round=0, step=0)
    assert len(m2.ledger.events("release")) == 2
    assert not np.allclose(c - (g + 1.0), a - g)
    # secure noise: every redo is fresh and counted
    ms, ls = _mech(tmp_path, epsilon=2.0, secure=True, name="sec.jsonl")
    x = ms.perturb(g, site=0, round=0, step=0)
    y = ms.perturb(g, site=0, round=0, step=0)
    assert not np.array_equal(x, y)
    ev = ls.events("release")
    assert [e["attempt"] for e in ev] == [0, 1]
    assert "release_digest" not in ev[0] and ev[0]["noise_source"] == "secure"
    assert all(e["noise_source"] == "seeded-testing" for e in m2.ledger.events("release"))
    assert m2.report()["epsilon_void"] and not ms.report()["epsilon_void"]
    assert ls.spent(0)[0] == pytest.approx(closed_form.gdp_epsilon(math.sqrt(2) / ms.z, 1e-5))


def test_epsilon_by_round_and_global(tmp_path, closed_form):
    m, led = _mech(tmp_path, epsilon=2.0)
    for r in range(3):
        for t in range(2):
            for p in range(2):
                m.perturb(np.zeros((4, 3)), site=p, round=r, step=t)
    curve = led.epsilon_by_round()
    assert [r for r, _ in curve] == [0, 1, 2]
    eps = [e for _, e in curve]
    assert eps == sorted(eps) and eps[-1] == pytest.approx(2.0, rel=1e-9)
    assert eps[0] == pytest.approx(closed_form.gdp_epsilon(math.sqrt(2) / m.z, 1e-5))
    assert led.spent()[0] == max(led.spent(p)[0] for p in (0, 1))


def test_in_memory_ledger_and_bad_ids(tmp_path):
    led = PrivacyLedger(None, "mem", delta=1e-5)
    assert led.spent() == (0.0, 1e-5)
    with pytest.raises(ConfigError, match="run_id"):
        PrivacyLedger(None, "a/b")
    open(tmp_path / "junk", "w").write('{"a": 1}\n')
    with pytest.raises(LedgerError, match="header"):
        PrivacyLedger(tmp_path / "junk", "run")
