"""The event model (issue 22 item 3): every accountant says what it supports, then composes it; figures checked against
Google's dp-accounting (which shares no code with securefed) and closed forms; the ledger stores and reads events."""

import json
import math

import pytest

from securefed.accounting import PrivacyLedger, get_accountant
from securefed.accounting.events import ComposedEvent, ReleaseEvent, gaussian_release, history_of
from securefed.errors import ConfigError, LedgerError

dp_accounting = pytest.importorskip("dp_accounting")


def _tree():
    return ComposedEvent(
        (
            gaussian_release("gaussian-rff", sigma=4.0, sensitivity=2.0),
            gaussian_release("gaussian-counts", sigma=3.0, sensitivity=math.sqrt(2.0)),
            gaussian_release("gaussian-gradient", sigma=5.0, sensitivity=1.5, count=7),
        )
    )


def _dp_event(event):
    if isinstance(event, ComposedEvent):
        return dp_accounting.ComposedDpEvent([_dp_event(e) for e in event.events])
    g = dp_accounting.GaussianDpEvent(event.noise_multiplier)
    if event.sample_rate < 1:
        g = dp_accounting.PoissonSampledDpEvent(event.sample_rate, g)
    return dp_accounting.SelfComposedDpEvent(g, event.count)


def test_exact_composition_of_a_heterogeneous_tree_is_the_pld_figure():
    tree = _tree()
    mu = math.sqrt((2.0 / 4.0) ** 2 + (math.sqrt(2.0) / 3.0) ** 2 + 7 * (1.5 / 5.0) ** 2)  # μ-GDP composition
    acc = get_accountant("exact")
    assert acc.supports(tree)
    eps = acc.compose(tree).get_epsilon(1e-5)
    pld = dp_accounting.pld.PLDAccountant()
    pld.compose(_dp_event(tree))
    assert eps == pytest.approx(pld.get_epsilon(1e-5), rel=2e-3)
    assert get_accountant("exact").epsilon(1.0 / mu, 1, 1e-5) == pytest.approx(eps, rel=1e-9)


@pytest.mark.slow
def test_subsampled_events_need_an_accountant_that_supports_them():
    ev = gaussian_release("gaussian-gradient", sigma=1.2, sensitivity=1.0, sample_rate=0.1, count=50)
    assert not get_accountant("exact").supports(ev)
    with pytest.raises(ConfigError, match="sample_rate"):
        get_accountant("exact").compose(ev)
    assert get_accountant("rdp").supports(ev) and get_accountant("prv").supports(ev)
    rdp = dp_accounting.rdp.RdpAccountant()
    rdp.compose(_dp_event(ev))
    assert get_accountant("rdp").epsilon_of_event(ev, 1e-5) <= rdp.get_epsilon(1e-5) * (1 + 1e-6)
    assert get_accountant("rdp").epsilon_of_event(ev, 1e-5) == pytest.approx(rdp.get_epsilon(1e-5), rel=0.05)


@pytest.mark.parametrize("mech", ["distributed-discrete-gaussian", "distributed-skellam"])
def test_integer_noise_is_composed_by_rdp_only(mech):
    ev = gaussian_release(mech, sigma=40.0, sensitivity=10.0)
    assert ev.noise.kind in ("discrete-gaussian", "skellam")
    assert get_accountant("rdp").supports(ev)
    for name in ("exact", "prv", "paper"):
        assert not get_accountant(name).supports(ev)
    led = PrivacyLedger(None, "r", delta=1e-5, accountant="exact")
    with pytest.raises(ConfigError, match="rdp"):
        led.record(ev, site=0, round=0, step=0, attempt=0)


def test_history_merges_equal_releases_and_keeps_counts():
    a = gaussian_release("gaussian-gradient", sigma=2.0, sensitivity=1.0)
    assert history_of(
        ComposedEvent((a, a.times(3), gaussian_release("gaussian-data", sigma=1.0, sensitivity=1.0)))
    ) == [(1.0, 1.0, 1), (2.0, 1.0, 4)]


def test_the_ledger_stores_events_and_reads_old_lines(tmp_path):
    path = tmp_path / "l.jsonl"
    ev = gaussian_release("gaussian-counts", sigma=3.0, sensitivity=math.sqrt(2.0), share=3.0 / math.sqrt(3))
    with PrivacyLedger(str(path), "r", budget_epsilon=10.0) as led:
        line = led.record(ev, site=0, round=0, step=1, attempt=0)
        assert ReleaseEvent.from_dict(line["event"]) == ev
    lines = path.read_text().splitlines()
    old = json.loads(lines[1])
    del old["event"]  # as an older securefed wrote it
    old["noise_share"] = ev.noise.share
    path.write_text(lines[0] + "\n" + json.dumps(old) + "\n")
    back = PrivacyLedger(str(path), "r", read_only=True)
    assert back.release_events(0) == ComposedEvent((ev,))
    bad = dict(old, event=dict(ev.as_dict(), sensitivity=1.0))  # an event that disagrees with the line
    path.write_text(lines[0] + "\n" + json.dumps(bad) + "\n")
    with pytest.raises(LedgerError, match="disagrees"):
        PrivacyLedger(str(path), "r", read_only=True)


def test_frozen_and_validated():
    ev = gaussian_release("gaussian-rff", sigma=1.0, sensitivity=2.0)
    with pytest.raises(Exception):  # noqa: B017 - a frozen dataclass raises FrozenInstanceError
        ev.count = 3
    with pytest.raises(ConfigError):
        gaussian_release("gaussian-rff", sigma=-1.0, sensitivity=2.0)
    with pytest.raises(ConfigError):
        gaussian_release("gaussian-rff", sigma=1.0, sensitivity=2.0, sample_rate=1.5)
