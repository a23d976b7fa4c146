"""A run whose membership audit failed and went on with --allow-audit-failure never reads "pass".

The gate block is the real one (:func:`securefed.audits.audit_gate` with ``allow_failure=True`` on an AUC above the
policy), written into otherwise passing run folders (the reconstruction audit passes, with and without DP), so
that nothing but the override can decide the verdict. Neither report.json, nor the HTML page, nor the exit code
of ``securefed audit`` may say pass."""

import json
import re

import pytest

from securefed.audits import AuditPolicy, audit_gate
from securefed.cli import main


def _overridden_gate() -> dict:
    dec = audit_gate({"auc": 0.66, "empirical_epsilon": 0.0}, AuditPolicy(max_auc=0.6), allow_failure=True)
    assert not dec.passed and dec.overridden and dec.proceed  # the decision the test is about
    return dec.to_dict()


def _with_override(run_folder, d, kind):
    run_folder(d, kind)
    gate = _overridden_gate()
    for name in ("metrics.json", "result.json"):
        doc = json.loads((d / name).read_text())
        doc["audit"] = gate
        (d / name).write_text(json.dumps(doc))
    return d


@pytest.mark.parametrize("kind", ["norows_pass", "dp"])
def test_an_overridden_audit_failure_never_reads_pass(run_folder, tmp_path, capsys, kind):
    d = _with_override(run_folder, tmp_path / kind, kind)
    rc = main(["audit", str(d)])
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert rc != 0 and printed["verdict"] != "pass"
    report = json.loads((d / "report.json").read_text())
    v = report["verdict"]
    assert v["status"] == "fail (overridden)" and v["overridden"] is True and v["landmark_gate"] != "pass"
    assert v["reconstruction"] == "pass"  # the override alone decides: the rest of the folder passes
    assert any("membership AUC" in r for r in v["reasons"])
    assert not report["summary"]["headline"].upper().startswith("PASS")
    assert "OVERRIDDEN" in report["summary"]["headline"]
    html = (d / "report.html").read_text()
    summary = re.search(r"<section class='([^']*)' id='summary'><div class='headline'>(.*?)</div>", html)
    assert summary is not None, "the report's summary box was not found"
    classes = summary.group(1).split()
    assert "summary" in classes and "override" in classes and "pass" not in classes, classes
    assert not summary.group(2).upper().startswith("PASS")


def test_the_same_folders_pass_without_the_override(run_folder, tmp_path, capsys):
    """The control: the folders above do pass when their audit passed (so the override is what fails them)."""
    for kind in ("norows_pass", "dp"):
        d = tmp_path / kind
        run_folder(d, kind)
        assert main(["audit", str(d)]) == 0
        capsys.readouterr()
        assert json.loads((d / "report.json").read_text())["verdict"]["status"] == "pass"
