"""``securefed simulate`` subcommand (registered into a plain argparse parser)."""

import argparse
import json

import pytest

from securefed.cli.simulate import register


def run(argv, capsys):
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    args = parser.parse_args(argv)
    code = args.func(args)
    return code, capsys.readouterr().out


@pytest.mark.parametrize("protocol, options", [("secagg", "--degree 5 --threshold 3"), ("ckks", "")])
def test_simulate_json_has_required_keys(capsys, protocol, options):
    """Seed 6 drops one client (4) at the masked / input stage: the round completes over the other five and
    its error is within the stated bound (checked always: the run is arranged not to abort)."""
    stage = "masked" if protocol == "secagg" else "input"
    code, out = run(
        f"simulate --protocol {protocol} --clients 6 --length 200 --dropout 0.2 --drop-stage {stage} "
        f"--seed 6 {options} --json".split(),
        capsys,
    )
    res = json.loads(out)
    assert code == 0
    for key in (
        "protocol",
        "clients",
        "survivors",
        "length",
        "max_abs_error",
        "aborted",
        "abort_reason",
        "timings",
        "bytes",
    ):
        assert key in res
    assert set(res["bytes"]) >= {"client_upload", "server_download"}
    assert res["scheduled_dropouts"] == {"4": stage}
    assert res["aborted"] is False and res["abort_reason"] is None and res["survivors"] == [0, 1, 2, 3, 5]
    assert 0 <= res["max_abs_error"] <= res["error_bound"]


def test_simulate_tamper_text_output(capsys):
    """A replayed message costs the client that got it (dropped), never the sum: the round completes."""
    code, out = run("simulate --clients 6 --length 10 --tamper replay".split(), capsys)
    assert code == 0 and "6 clients, 5 survivors" in out and "completed" in out
    code, out = run("simulate --clients 3 --length 10 --tamper replay".split(), capsys)
    assert code == 0 and "ABORTED (ProtocolTimeoutError" in out  # 3 sites with c = 1 tolerate no dropout
