"""Every script in benchmarks/ still starts: its imports resolve and its command line parses (``--help``).

Each script runs in this process as ``__main__`` with ``sys.argv = [script, "--help"]`` and benchmarks/ on the path (argparse prints the usage
and exits 0 before any work), so a benchmark whose imports went stale fails here. Stale *calls* into the package
(e.g. ``fed_dl(aggregator=...)`` after the keyword was renamed) are caught by mypy, which checks benchmarks/ with
the bodies of unannotated functions (pyproject.toml, run by the README's test command)."""

import contextlib
import io
import pathlib
import runpy
import sys
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
#: Flower apps that benchmarks/flower_path.py submits to a deployment: modules, not scripts (no command line)
APPS = {"flower_echo_app.py"}
SCRIPTS = sorted(p.name for p in (ROOT / "benchmarks").glob("*.py") if p.name not in APPS)


@pytest.mark.parametrize("name", sorted(APPS))
def test_flower_app_modules_import(name):
    ns = runpy.run_path(str(ROOT / "benchmarks" / name), run_name="echo_app")
    assert "client" in ns and "server" in ns


def test_there_are_benchmarks():
    assert len(SCRIPTS) >= 20


@pytest.mark.parametrize("name", SCRIPTS)
def test_benchmark_imports_and_parses_help(name, monkeypatch):
    path = ROOT / "benchmarks" / name
    monkeypatch.setattr(sys, "argv", [str(path), "--help"])
    monkeypatch.syspath_prepend(str(path.parent))  # as `python benchmarks/x.py` does (a benchmark may import another)
    out = io.StringIO()
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as info:
        runpy.run_path(str(path), run_name="__main__")
    assert info.value.code in (0, None), out.getvalue()
    assert "usage:" in out.getvalue(), f"{name} does not parse its command line with argparse"
    assert time.perf_counter() - t0 < 60, f"{name} works before it parses --help"


@pytest.mark.slow
def test_secagg_proof_flower_rows_sum_the_survivors():
    """``protocols_secagg_proof.py --flower`` (issue 26 item 1): a tiny run with two adjacent nodes dropping after
    Flower's share-keys stage. Flower's unmasked sum must be the survivors' sum within its quantisation, and
    visibly not the sum over everyone (the dropouts happened)."""
    import json
    import os
    import subprocess

    pytest.importorskip("flwr")
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    cmd = [
        sys.executable,
        str(ROOT / "benchmarks" / "protocols_secagg_proof.py"),
        "--clients",
        "8",
        "--lengths",
        "50",
        "--dropouts",
        "0.25",
        "--repeats",
        "1",
        "--flower",
    ]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True, timeout=300)
    rows = {r["schedule"]: r for r in json.loads(out.stdout.strip().splitlines()[-1])["rows"]}
    fl = rows["flower"]
    assert fl["survivors"] == rows["late"]["survivors"] == 6
    assert fl["delivered"] == {"setup": 8, "share_keys": 8, "collect_masked_vectors": 6, "unmask": 6}
    assert fl["max_abs_error"] <= fl["error_bound"] < 0.01 < fl["error_vs_all_n"]
