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
