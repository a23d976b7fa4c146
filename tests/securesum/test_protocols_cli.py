"""``securefed simulate`` subcommand (registered into a plain argparse parser)."""

import argparse
import json

from securefed.cli.simulate import register


def run(argv, capsys):
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    args = parser.parse_args(argv)
    code = args.func(args)
    return code, capsys.readouterr().out


def test_simulate_json_has_required_keys(capsys):
    code, out = run("simulate --protocol secagg --clients 6 --length 200 --dropout 0.2 --drop-stage masked "
                    "--seed 4 --degree 5 --threshold 3 --json".split(), capsys)
    res = json.loads(out)
    assert code == 0
    for key in ("protocol", "clients", "survivors", "length", "max_abs_error", "aborted", "abort_reason", "timings", "bytes"):
        assert key in res
    assert set(res["bytes"]) >= {"client_upload", "server_download"}
    if not res["aborted"]:
        assert res["max_abs_error"] <= res["error_bound"]


def test_simulate_tamper_text_output(capsys):
    """A replayed message costs the client that got it (dropped), never the sum: the round completes."""
    code, out = run("simulate --clients 6 --length 10 --tamper replay".split(), capsys)
    assert code == 0 and "6 clients, 5 survivors" in out and "completed" in out
    code, out = run("simulate --clients 3 --length 10 --tamper replay".split(), capsys)
    assert code == 0 and "ABORTED (ProtocolTimeoutError" in out  # 3 sites with c = 1 tolerate no dropout
