"""`securefed audit RUN_DIR`: report.json validates against the packaged schema; report.html renders in Chromium."""

import argparse
import json
import os

import numpy as np
import pytest

from securefed.audits import (
    AuditPolicy,
    audit_gate,
    membership_audit,
    reconstruct_from_distance_rows,
    reconstruction_record,
)
from securefed.report import validate_report, write_audit_files, write_report
from securefed.cli.audit import register
from securefed.report.build import load_schema, what_leaves
from securefed.errors import ConfigError, DataError
from securefed.kernels import sq_dists
from securefed.landmarks import fed_dl


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A real run folder: FedDL on small data, the MIA + gate, trilateration of the rows, a real t-SNE embedding."""
    from openTSNE import TSNE

    d = tmp_path_factory.mktemp("run")
    rng = np.random.default_rng(0)
    centers = rng.normal(scale=4.0, size=(3, 8))
    sites, labels = [], []
    for _ in range(3):
        lab = rng.integers(0, 3, 80)
        sites.append(centers[lab] + rng.normal(size=(80, 8)))
        labels.append(lab)
    members, holdout = [s[:60] for s in sites], [s[60:] for s in sites]
    history = []
    res = fed_dl(members, 20, rounds=8, local_steps=3, random_state=1, callback=lambda s, Y, m: history.append(m))
    mia = membership_audit(members, holdout, res.landmarks, res.gamma, scores=("nearest", "kde"), random_state=0)
    gate = audit_gate(mia, AuditPolicy(), allow_failure=True)
    X = np.vstack(sites)
    X_hat = reconstruct_from_distance_rows(sq_dists(X, res.landmarks), res.landmarks, squared=True)
    rec = reconstruction_record(X, X_hat, mode="rows", attack="trilateration", Y=res.landmarks)
    emb = np.asarray(TSNE(n_iter=250, random_state=0, n_jobs=1).fit(X))
    np.save(d / "embedding.npy", emb)
    np.save(d / "y_true.npy", np.concatenate(labels))
    config = {
        "dataset": {"name": "synthetic blobs", "n_features": 8},
        "n_landmarks": 20,
        "rounds": 8,
        "local_steps": 3,
        "aggregation": "plain",
        "nystrom": "rows",
        "seed": 0,
        "gamma": res.gamma,
    }
    metrics = {"ca_10nn": 0.9, "privacy": None, "audit": gate.to_dict()}
    (d / "config.json").write_text(json.dumps(config))
    (d / "metrics.json").write_text(json.dumps(metrics))
    (d / "history.json").write_text(json.dumps({"mmd": history, "epsilon": [], "rounds": list(range(1, 9))}))
    (d / "ledger.jsonl").write_text(json.dumps(gate.ledger_event) + "\n")
    write_audit_files(d, mia=mia, reconstruction=rec)
    return d


@pytest.fixture(scope="module")
def written(run_dir, tmp_path_factory):
    """The report of ``run_dir``, written once for the tests that only read it."""
    return write_report(run_dir, tmp_path_factory.mktemp("report"))


def test_report_json_validates_and_says_what_leaves(written):
    html_path, json_path = written
    rep = json.loads(open(json_path).read())
    validate_report(rep)
    import jsonschema

    jsonschema.Draft202012Validator(load_schema()).validate(rep)  # also with the library directly
    assert rep["schema_version"] == "2.1"
    applies = [r for r in rep["what_leaves"] if r["applies"]]
    assert {r["mode"] for r in applies} == {"plain aggregation", "distance rows sent in the clear (paper mode)"}
    assert "n_y > m" in applies[1]["server_learns"] and "recoverable exactly" in applies[1]["server_learns"]
    # rows with n_y = 20 > m = 8: trilateration recovers everything → the report fails, and says why
    assert rep["reconstruction"]["fraction_within_5pct"] == 1.0
    assert rep["verdict"]["status"] == "fail" and rep["verdict"]["reconstruction"] == "fail"
    assert any("reconstructible" in r for r in rep["verdict"]["reasons"])
    assert rep["mia"]["available"] and 0 <= rep["mia"]["auc"] <= 1
    assert rep["budget"]["available"] is False and "no differential privacy" in rep["budget"]["reason"]
    assert rep["plots"] == {"epsilon": False, "mmd": True, "roc": True, "embedding": True}
    assert rep["ledger"]["n_events"] == 1
    text = open(html_path).read()
    assert text.count("data:image/png;base64,") == 3 and "not available" in text and "Glossary" in text


def test_schema_rejects_a_broken_report(written):
    _, json_path = written
    rep = json.loads(open(json_path).read())
    rep["verdict"]["status"] = "probably fine"
    with pytest.raises(DataError, match="verdict/status"):
        validate_report(rep)
    del rep["verdict"]
    with pytest.raises(DataError):
        validate_report(rep)


def test_missing_optional_files_say_not_available(tmp_path):
    (tmp_path / "metrics.json").write_text(json.dumps({"ca_10nn": 0.5}))
    html_path, json_path = write_report(tmp_path)
    rep = json.loads(open(json_path).read())
    assert rep["verdict"]["status"] == "not audited"
    assert not rep["mia"]["available"] and "mia.json not found" in rep["mia"]["reason"]
    assert not rep["reconstruction"]["available"] and not rep["ledger"]["available"]
    assert rep["versions"]["source"] == "report environment" and rep["versions"]["libraries"]["numpy"]
    assert "not available" in open(html_path).read()


def test_missing_run_folder_or_metrics_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="no such folder"):
        write_report(tmp_path / "nope")
    with pytest.raises(ConfigError, match="metrics.json not found.*securefed run"):
        write_report(tmp_path)


def test_cli_register_and_exit_code(run_dir, tmp_path, capsys):
    parser = argparse.ArgumentParser(prog="securefed")
    register(parser.add_subparsers(dest="cmd"))
    args = parser.parse_args(["audit", str(run_dir), "--out", str(tmp_path)])
    assert args.func(args) == 1  # verdict "fail" (rows are reconstructible)
    out = json.loads(capsys.readouterr().out)
    assert out["verdict"] == "fail" and os.path.exists(out["html"])


def test_what_leaves_modes():
    # FedDL landmarks (a run folder without landmark_method, or the rows mode) under DP, through CKKS
    rows = what_leaves(
        {"aggregation": "ckks", "dp": True, "nystrom": "local"},
        privacy={"epsilon": 1.0, "delta": 1e-5, "releases": 300},
    )
    applies = {r["mode"]: r["server_learns"] for r in rows if r["applies"]}
    assert set(applies) == {
        "SecAgg+ or CKKS aggregation",
        "a malicious site (no range proofs)",
        "FedDL with differential privacy",
        "no rows, coordinates sent (local placement, the default)",
    }
    assert "secret key never reaches the coordinator" in applies["SecAgg+ or CKKS aggregation"]
    assert (
        "(ε, δ) = (1, 1e-05)" in applies["FedDL with differential privacy"]
        and "300" in applies["FedDL with differential privacy"]
    )
    assert "landmarks only" not in applies["FedDL with differential privacy"]
    # DP landmarks + rows in the clear: the report must say the ε does not cover the rows
    rows = what_leaves(
        {"aggregation": "secagg", "dp": True, "nystrom": "rows", "landmark_method": "feddl"},
        privacy={"epsilon": 1.0, "delta": 1e-5},
    )
    dp_row = next(r for r in rows if r["mode"] == "FedDL with differential privacy")
    assert "covers the landmarks only" in dp_row["server_learns"]
    # the default: cells through SecAgg+; the floor is named and so is who applies it
    rows = what_leaves(
        {"aggregation": "secagg", "dp": False, "nystrom": "local", "landmark_method": "cells", "cell_floor": 15}
    )
    applies = {r["mode"]: r["server_learns"] for r in rows if r["applies"]}
    assert set(applies) == {
        "cells (a cell tree with a floor, no DP)",
        "SecAgg+ or CKKS aggregation",
        "a malicious site (no range proofs)",
        "no rows, coordinates sent (local placement, the default)",
    }
    cells = applies["cells (a cell tree with a floor, no DP)"]
    assert "≥ 15 records" in cells and "Every site recomputes each query" in cells and "fewer than 15" in cells
    # the DP billboard: its ε is named for the whole run; FedDL's row does not apply
    rows = what_leaves(
        {"aggregation": "secagg", "dp": True, "nystrom": "local", "landmark_method": "billboard"},
        privacy={"epsilon": 4.0, "delta": 1e-5},
    )
    applies = {r["mode"]: r["server_learns"] for r in rows if r["applies"]}
    assert "FedDL with differential privacy" not in applies
    assert "(ε, δ) = (4, 1e-05) per record for the whole run" in applies["the DP billboard"]


def test_html_report_renders_in_headless_chromium(written):
    """The report as a person sees it: rendered by Chromium, summary text in the DOM, a screenshot beside report.html."""
    from securefed.report.browser import find_chromium, render_report

    if find_chromium() is None:
        if os.environ.get("SECUREFED_CI") == "1":
            pytest.fail(
                "chromium is not installed but SECUREFED_CI=1 (.ci/run installs it: apt-get install -y chromium)"
            )
        pytest.skip("chromium not installed (apt-get install -y chromium; .ci/run installs it)")
    from matplotlib.image import imread

    html_path, json_path = written
    summary = json.loads(open(json_path).read())["summary"]
    png, dom = render_report(html_path, width=1200, height=1600)
    assert png == os.path.join(os.path.dirname(html_path), "report.png")  # saved next to the report
    assert summary["headline"] in dom and "What left each hospital" in dom and "Who could learn what" in dom
    assert "What ε means here" in dom and "--nystrom local" in dom  # the remedy of a rows-mode fail
    img = imread(png)
    assert img.shape[0] >= 1000 and img.shape[1] >= 1000
    rgb = img[..., :3]
    non_white = np.mean(np.any(rgb < 0.95, axis=-1))
    assert non_white > 0.03, f"screenshot nearly blank: {non_white:.4f} non-white"
    red = np.mean((rgb[..., 0] > 0.7) & (rgb[..., 1] < 0.3) & (rgb[..., 2] < 0.3))
    assert red > 0.001  # the red FAIL headline is drawn
