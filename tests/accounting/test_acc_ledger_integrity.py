"""Ledger integrity (issue 14 §8): one writer (OS lock), typed errors for every malformed line, duplicate ids
refused, the remaining plan re-checked on resume, and two properties — the ledger's ε is the accountant's ε
of its events, and a torn write never loses a counted release."""

import json
import math
import multiprocessing as mp
import os
import tempfile

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from securefed.accounting import PrivacyLedger, gdp_epsilon
from securefed.errors import BudgetExceededError, LedgerError

DELTA = 1e-5
# every append is fsync'd; on tmpfs that is cheap, which keeps the property tests fast
_FAST_DIR = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None


def _release(led, site, k, z=2.0, **kw):
    return led.record_release(
        site=site,
        round=k,
        step=0,
        attempt=0,
        mechanism="gaussian-gradient",
        sensitivity=1.0,
        sigma=z,
        noise_multiplier=z,
        **kw,
    )


# ---------------------------------------------------------------------------------------------- one writer


def _racer(path, barrier, go_home, out):
    """Open the ledger as a writer, spend up to the budget, hold the ledger until told to stop."""
    barrier.wait()
    try:
        led = PrivacyLedger(path, "race", budget_epsilon=1.0, delta=DELTA)
    except LedgerError as exc:
        out.put(("refused", os.getpid(), str(exc)))
        return
    n = 0
    try:
        while True:
            _release(led, 0, n, z=8.0)
            n += 1
    except BudgetExceededError:
        pass
    out.put(("wrote", os.getpid(), n))
    go_home.wait(30)
    led.close()


def test_two_writers_racing_exactly_one_proceeds(tmp_path):
    """Two processes open the same ledger at the same moment. Before the lock both loaded the same (empty)
    history, both passed the budget check and together spent twice the budget (issue 14: ε 1.42 against 1,
    with duplicated ids). Now the second gets LedgerError naming the path and the holder's pid."""
    path = str(tmp_path / "race.jsonl")
    ctx = mp.get_context("fork")
    barrier, go_home, out = ctx.Barrier(2), ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_racer, args=(path, barrier, go_home, out)) for _ in range(2)]
    for p in procs:
        p.start()
    results = [out.get(timeout=60) for _ in procs]
    go_home.set()
    for p in procs:
        p.join(30)
    kinds = sorted(r[0] for r in results)
    assert kinds == ["refused", "wrote"], results
    winner = next(r for r in results if r[0] == "wrote")
    refusal = next(r for r in results if r[0] == "refused")
    assert path in refusal[2] and f"pid {winner[1]}" in refusal[2]
    led = PrivacyLedger(path, "race", delta=DELTA)  # the lock was released: a later writer may open it
    ids = [e["id"] for e in led.events("release")]
    assert len(ids) == len(set(ids)) == winner[2] > 0
    assert led.spent()[0] <= 1.0 * (1 + 1e-9)
    led.close()


def test_lock_is_released_by_close_and_context_manager(tmp_path):
    path = tmp_path / "l.jsonl"
    with PrivacyLedger(path, "r", delta=DELTA) as led:
        _release(led, 0, 0)
        with pytest.raises(
            LedgerError, match=f"^path='{path}' is invalid: is held by another writer \\(pid {os.getpid()}"
        ):
            PrivacyLedger(path, "r", delta=DELTA)
    with pytest.raises(LedgerError, match="closed"):
        _release(led, 0, 1)
    again = PrivacyLedger(path, "r", delta=DELTA)
    assert len(again.events("release")) == 1
    again.close()
    assert open(str(path) + ".lock").read().strip() == str(os.getpid())


# ---------------------------------------------------------------------------------------------- malformed lines


def _good_ledger(tmp_path):
    path = tmp_path / "m.jsonl"
    with PrivacyLedger(path, "m", delta=DELTA) as led:
        r0 = _release(led, 0, 0)
        _release(led, 1, 0)
        led.record_settlement(round=0, step=0, survivors=[0, 1], releases={r0["id"]: 3.0})
    return path, open(path).read().splitlines()


def _variant(lines, i, obj):
    out = list(lines)
    out[i] = obj if isinstance(obj, str) else json.dumps(obj)
    return "\n".join(out) + "\n"


BAD_RELEASE_EDITS = [
    ({"site": "0"}, "site"),
    ({"site": True}, "site"),
    ({"sigma": -1.0}, "sigma"),
    ({"noise_multiplier": 0}, "noise_multiplier"),
    ({"sample_rate": 1.5}, "sample_rate"),
    ({"round": -2}, "round"),
    ({"attempt": 0.5}, "attempt"),
    ({"id": "m/site0/round7/step0/attempt0"}, "does not match its coordinates"),
    ({"run_id": "other"}, "another run"),
    ({"type": "bogus"}, "unknown ledger event type"),
    ({"type": "header"}, "unknown ledger event type"),
]


@pytest.mark.parametrize("edit,what", BAD_RELEASE_EDITS)
def test_malformed_release_line_is_a_typed_error_naming_the_line(tmp_path, edit, what):
    path, lines = _good_ledger(tmp_path)
    ev = dict(json.loads(lines[1]), **edit)
    open(path, "w").write(_variant(lines, 1, ev))
    with pytest.raises(LedgerError, match=f"^{path}:line 2.*{what}.*restore the ledger from its backup"):
        PrivacyLedger(path, "m", delta=DELTA)


@pytest.mark.parametrize(
    "field",
    ["id", "site", "round", "step", "attempt", "mechanism", "sensitivity", "sigma", "noise_multiplier", "sample_rate"],
)
def test_missing_field(tmp_path, field):
    path, lines = _good_ledger(tmp_path)
    ev = json.loads(lines[1])
    del ev[field]
    open(path, "w").write(_variant(lines, 1, ev))
    with pytest.raises(LedgerError, match=f"line 2 {field}=None is invalid: a release event needs the field '{field}'"):
        PrivacyLedger(path, "m", delta=DELTA)


@pytest.mark.parametrize(
    "raw,what",
    [
        ("[1, 2]", "not a ledger event"),
        ("42", "not a ledger event"),
        ('"release"', "not a ledger event"),
        ("{}", "unknown ledger event type"),
        ("{not json", "not valid JSON"),
    ],
)
def test_valid_json_that_is_not_an_event(tmp_path, raw, what):
    path, lines = _good_ledger(tmp_path)
    open(path, "w").write(_variant(lines, 2, raw))
    with pytest.raises(LedgerError, match=f"line 3.*{what}"):
        PrivacyLedger(path, "m", delta=DELTA)


def test_bad_settlement_and_complete_last_line_are_refused_not_dropped(tmp_path):
    path, lines = _good_ledger(tmp_path)
    settle = json.loads(lines[3])
    bad = dict(settle, releases={"m/site5/round0/step0/attempt0": 2.0})
    open(path, "w").write(_variant(lines, 3, bad))
    with pytest.raises(LedgerError, match="line 4 releases.*not earlier in the ledger"):
        PrivacyLedger(path, "m", delta=DELTA)
    # a complete (parseable) but malformed last line without its newline is not a torn write: refused
    open(path, "w").write(_variant(lines, 3, dict(settle, survivors="all")).rstrip("\n"))
    with pytest.raises(LedgerError, match="line 4 survivors"):
        PrivacyLedger(path, "m", delta=DELTA)
    assert not open(path).read().endswith("\n")  # nothing repaired before the whole file validated


def test_duplicate_ids_are_refused_on_load_and_on_write(tmp_path):
    path, lines = _good_ledger(tmp_path)
    open(path, "w").write("\n".join(lines + [lines[1]]) + "\n")  # a release line written twice
    with pytest.raises(LedgerError, match="line 5.*duplicates the event id of line 2"):
        PrivacyLedger(path, "m", delta=DELTA)
    open(path, "w").write("\n".join(lines) + "\n")
    with PrivacyLedger(path, "m", delta=DELTA) as led:
        with pytest.raises(LedgerError, match="already in the ledger"):
            _release(led, 0, 0)
        with pytest.raises(LedgerError, match="already in the ledger"):
            led._append(json.loads(lines[2]))
        assert len(led.events("release")) == 2


# ---------------------------------------------------------------------------------------------- resume


def test_check_plan_refuses_a_resume_that_cannot_finish(tmp_path):
    path = tmp_path / "p.jsonl"
    z = 4.0
    budget = gdp_epsilon(DELTA, math.sqrt(10) / z)  # exactly 10 releases at z
    with PrivacyLedger(path, "p", budget_epsilon=budget, delta=DELTA) as led:
        led.set_plan(0, z, 1.0, 10)
        for k in range(7):
            _release(led, 0, k, z=z)
    before = open(path, "rb").read()
    led = PrivacyLedger(path, "p", delta=DELTA)
    assert led.check_plan(0, z, 1.0, 3) == pytest.approx(budget, rel=1e-9)  # 7 spent + 3 planned: fits
    with pytest.raises(
        BudgetExceededError, match="^remaining plan=.*site 0: 7 release.*4 planned.*nothing was released"
    ):
        led.check_plan(0, z, 1.0, 4)
    led.close()
    assert open(path, "rb").read() == before


# ---------------------------------------------------------------------------------------------- properties


@settings(max_examples=30, deadline=None)
@given(
    events=st.lists(st.tuples(st.integers(0, 2), st.floats(0.5, 20.0)), min_size=1, max_size=25),
    settle=st.lists(st.tuples(st.integers(0, 24), st.floats(0.5, 40.0)), max_size=5),
)
def test_ledger_epsilon_equals_the_accountant_epsilon_of_its_events(events, settle):
    with tempfile.TemporaryDirectory(dir=_FAST_DIR) as d:
        path = os.path.join(d, "e.jsonl")
        with PrivacyLedger(path, "e", delta=DELTA) as led:
            ids = [_release(led, p, k, z=z)["id"] for k, (p, z) in enumerate(events)]
            zeff = {rid: z for rid, (_, z) in zip(ids, events)}
            for j, (i, z) in enumerate(settle):
                rid = ids[i % len(ids)]
                led.record_settlement(round=100 + j, step=0, survivors=[0], releases={rid: z})
                zeff[rid] = z
            for p in range(3):
                mine = [zeff[rid] for rid, (q, _) in zip(ids, events) if q == p]
                closed = gdp_epsilon(DELTA, math.sqrt(sum(1 / z**2 for z in mine))) if mine else 0.0
                assert math.isclose(led.spent(p)[0], closed, rel_tol=1e-9, abs_tol=1e-12)
            spent = led.spent()
        again = PrivacyLedger(path, "e", delta=DELTA, read_only=True)
        assert again.spent() == spent
        assert spent[0] == max(again.spent(p)[0] for p in range(3))


@settings(max_examples=40, deadline=None)
@given(k=st.integers(0, 6), cut=st.floats(0.0, 1.0), with_full_line=st.booleans())
def test_torn_write_never_loses_a_counted_release(k, cut, with_full_line):
    """A crash while writing event k+1: the file holds k complete lines and a prefix of the next. Every one of
    the k releases (they were returned, hence counted) survives the reopening; the torn one counts only if
    it was written completely; appending afterwards gives a consistent ledger."""
    with tempfile.TemporaryDirectory(dir=_FAST_DIR) as d:
        path = os.path.join(d, "t.jsonl")
        with PrivacyLedger(path, "t", delta=DELTA) as led:
            for j in range(k + 1):
                _release(led, 0, j)
        raw = open(path, "rb").read().split(b"\n")[:-1]  # header + k+1 event lines
        last = raw[-1]
        prefix = last if with_full_line else last[: int(cut * (len(last) - 1))]
        open(path, "wb").write(b"\n".join(raw[:-1]) + b"\n" + prefix)
        led = PrivacyLedger(path, "t", delta=DELTA)
        expected = k + 1 if with_full_line else k
        got = [e["round"] for e in led.events("release")]
        assert got == list(range(expected))
        _release(led, 0, 99)
        led.close()
        again = PrivacyLedger(path, "t", delta=DELTA, read_only=True)
        assert [e["round"] for e in again.events("release")] == list(range(expected)) + [99]
        assert math.isclose(again.spent(0)[0], gdp_epsilon(DELTA, math.sqrt(expected + 1) / 2.0), rel_tol=1e-12)
