"""The default job's request/reply round trips (issue 26): at most 50, counted per stage in result.json.

Closed form of the schedule: hello and the placement are one round trip each; every secure sum costs 3 (masked
input, consistency, unmask), and the set-up of up to 8 prepared rounds (advertise, share keys) 2 more on the sum that
starts it. A schedule that fell back to one full SecAgg+ session per sum (5 each) would give 62 here."""

import json

import pytest

from securefed.cli.main import main

PREPARED = 8  # rounds one set-up prepares (federation.sums.PREPARED_ROUNDS)


@pytest.mark.slow
@pytest.mark.parametrize("clients", [3, 10])
def test_the_default_job_needs_at_most_50_round_trips(tmp_path, clients):
    out = tmp_path / "run"
    assert main(["run", "--clients", str(clients), "--no-compare-centralized", "--quiet", "--out", str(out)]) == 0
    res = json.loads((out / "result.json").read_text())
    steps = res["steps"]
    sums = len(steps)
    setups = -(-sums // PREPARED)
    assert res["round_trips"] == 2 + 3 * sums + 2 * setups, [(s["label"], s["round_trips"]) for s in steps]
    assert res["round_trips"] <= 50
    assert sorted({s["round_trips"] for s in steps}) == [3, 5] and sum(s["round_trips"] == 5 for s in steps) == setups
    per_stage = res["round_trips_per_stage"]
    assert sum(per_stage.values()) == res["round_trips"] and per_stage["hello, embedding and the rest"] == 2
    assert per_stage["basis"] == 5 and per_stage["audit"] == 3
