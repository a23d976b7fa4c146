"""The ``securefed`` command: bad input on one line with exit 2, the audit gate, ``securefed audit``, and one
real subprocess of the installed console script."""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from securefed.report.build import validate_report
from securefed.cli import main

pytestmark = pytest.mark.usefixtures("single_blas_thread")

SMALL = [
    "--dataset",
    "iris",
    "--clients",
    "3",
    "--partition",
    "iid",
    "--landmarks",
    "20",
    "--rounds",
    "5",
    "--no-compare-centralized",
    "--quiet",
]
# a leaky configuration: few records per site, cells of 2 records (landmarks close to the members)
LEAKY = [
    "--dataset",
    "wine",
    "--clients",
    "3",
    "--partition",
    "iid",
    "--landmarks",
    "150",
    "--cell-floor",
    "2",
    "--no-compare-centralized",
    "--quiet",
    "--max-auc",
    "0.5",
    "--max-empirical-epsilon",
    "0",
]


def _one_line_error(err: str, *names):
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    line = lines[0]
    assert line.startswith("securefed run: error: ")
    for n in names:
        assert n in line, (n, line)
    return line


@pytest.fixture
def csv_without_label(tmp_path):
    p = tmp_path / "records.csv"
    rng = np.random.default_rng(0)
    rows = ["a,b,c"] + [",".join(f"{v:.4f}" for v in rng.normal(size=3)) for _ in range(30)]
    p.write_text("\n".join(rows) + "\n")
    return p


@pytest.mark.parametrize(
    "argv, names",
    [
        (["--dataset", "no_such_dataset"], ["no_such_dataset", "digits"]),
        (["--dataset", "missing.csv"], ["missing.csv", "no such file"]),
        (["--clients", "0"], ["--clients=0"]),
        (["--clients", "-3"], ["--clients=-3"]),
        (["--partition", "bogus"], ["'bogus'", "dirichlet:ALPHA"]),
        (["--partition", "dirichlet:-1"], ["'dirichlet:-1'"]),
        (["--partition", "dirichlet:x"], ["'dirichlet:x'"]),
        (["--clients", "100"], ["n_sites=100"]),
        (["--landmarks", "1"], ["--landmarks=1"]),
        (["--rounds", "0"], ["--rounds=0"]),
        (["--lr", "-1"], ["--lr=-1.0"]),
        (["--gamma", "0"], ["--gamma=0.0"]),
        (["--audit-holdout", "0.95"], ["--audit-holdout=0.95"]),
        (["--max-auc", "0.3"], ["--max-auc=0.3"]),
    ],
    ids=[
        "dataset",
        "missing-file",
        "clients0",
        "clients-neg",
        "partition",
        "dirichlet-neg",
        "dirichlet-text",
        "too-many-clients",
        "landmarks",
        "rounds",
        "lr",
        "gamma",
        "holdout",
        "max-auc",
    ],
)
def test_bad_input_exits_2_with_one_line(tmp_path, capsys, argv, names):
    args = ["run", *SMALL, "--out", str(tmp_path / "out")]
    # later flags override the defaults in SMALL
    rc = main(args + argv)
    cap = capsys.readouterr()
    assert rc == 2
    _one_line_error(cap.err, *names)
    assert not (tmp_path / "out").exists()  # refused before any file is written (--max-auc 0.3 wrote config.json)


def test_csv_without_the_label_column(tmp_path, capsys, csv_without_label):
    rc = main(
        [
            "run",
            *SMALL,
            "--dataset",
            str(csv_without_label),
            "--label-column",
            "diagnosis",
            "--value-bound",
            "10",
            "--out",
            str(tmp_path / "o"),
        ]
    )
    line = _one_line_error(capsys.readouterr().err, "label_column", "diagnosis")
    assert rc == 2 and "DataError" in line and "'a', 'b', 'c'" in line  # names the columns present


def test_csv_label_partition_without_labels_is_a_typed_error(tmp_path, capsys, csv_without_label):
    rc = main(
        [
            "run",
            *SMALL,
            "--dataset",
            str(csv_without_label),
            "--partition",
            "label",
            "--value-bound",
            "10",
            "--out",
            str(tmp_path / "o"),
        ]
    )
    assert rc == 2
    _one_line_error(capsys.readouterr().err, "label")


def test_csv_unlabelled_iid_runs(tmp_path, capsys, csv_without_label):
    out = tmp_path / "o"
    rc = main(
        [
            "run",
            *SMALL,
            "--dataset",
            str(csv_without_label),
            "--landmarks",
            "8",
            "--cell-floor",
            "3",
            "--no-audit",
            "--value-bound",
            "10",
            "--out",
            str(out),
        ]
    )
    assert rc == 0, capsys.readouterr().err
    m = json.loads((out / "metrics.json").read_text())
    assert m["n_samples"] == 30 and m["federated"]["ca_10nn"] is None and m["federated"]["trustworthiness"] > 0.5
    assert np.load(out / "embedding.npy").shape == (30, 2)


def test_argparse_errors_exit_2_without_traceback(tmp_path, capsys):
    with pytest.raises(SystemExit) as info:
        main(["run", "--clients", "three", "--out", str(tmp_path)])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "--clients" in err
    assert main([]) == 2  # no subcommand: help, exit 2


def test_audit_gate_blocks_a_leaky_run(tmp_path, capsys):
    out = tmp_path / "leaky"
    rc = main(["run", *LEAKY, "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 1  # the run's verdict is FAIL (its audit gate stopped it), not a refused input (2)
    line = _one_line_error(err, "AuditFailedError", "max_auc")
    assert "--allow-audit-failure" in line
    assert not (out / "embedding.npy").exists() and not (out / "embedding.png").exists()
    m = json.loads((out / "metrics.json").read_text())
    assert m["audit"]["verdict"] == "fail" and m["audit"]["overridden"] is False
    assert m["audit"]["rows_sent"] == 0 and m["audit"]["auc"] > 0.5
    assert "federated" not in m
    assert (out / "audit" / "mia.json").is_file() and not (out / "audit" / "reconstruction.json").exists()


def test_failed_gate_reasons_reach_the_report(tmp_path, capsys):
    out = tmp_path / "leaky"
    assert main(["run", *LEAKY, "--out", str(out)]) == 1
    m = json.loads((out / "metrics.json").read_text())
    assert any("AUC" in f for f in m["audit"].get("failures", []))
    main(["audit", str(out)])
    report = json.loads((out / "report.json").read_text())
    assert any("membership AUC" in r for r in report["verdict"]["reasons"])


def test_allow_audit_failure_proceeds_and_audit_writes_a_valid_report(tmp_path, capsys):
    out = tmp_path / "overridden"
    rc = main(["run", *LEAKY, "--allow-audit-failure", "--out", str(out)])
    cap = capsys.readouterr()
    # one verdict: run ends with the audit's (fail, overridden) and exits with it, naming a remedy
    assert rc == 1, cap.err
    assert "verdict: fail" in cap.out and "remedy:" in cap.out
    assert (out / "embedding.npy").is_file() and (out / "embedding.png").is_file()
    m = json.loads((out / "metrics.json").read_text())
    assert m["audit"]["verdict"] == "fail (overridden)" and m["audit"]["overridden"] is True
    assert m["audit"]["failures"] and "federated" in m
    # the report
    rc = main(["audit", str(out)])
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    report = json.loads((out / "report.json").read_text())
    validate_report(report)
    assert (out / "report.html").is_file()
    assert printed["verdict"] == report["verdict"]["status"] == "fail" and rc == 1
    assert report["verdict"]["overridden"] is True
    assert any("membership AUC" in r for r in report["verdict"]["reasons"])


def test_audit_of_a_gate_stopped_run_still_validates(tmp_path, capsys):
    out = tmp_path / "stopped"
    assert main(["run", *LEAKY, "--out", str(out)]) == 1
    rc = main(["audit", str(out)])
    capsys.readouterr()
    report = json.loads((out / "report.json").read_text())
    validate_report(report)
    assert rc == 1 and report["verdict"]["landmark_gate"] == "fail"


def test_audit_of_a_missing_folder_is_a_one_line_error(tmp_path, capsys):
    rc = main(["audit", str(tmp_path / "nope")])
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1


def _securefed_cmd():
    """The ``securefed`` command of this checkout in a real subprocess: the console script when it runs this
    checkout's package, else ``python -m securefed.cli`` (a console script installed from another checkout would
    test other code than the suite's)."""
    import securefed

    exe = shutil.which("securefed")
    here = os.path.dirname(os.path.dirname(os.path.abspath(securefed.__file__)))
    return [exe] if exe and _installed_is(here) else [sys.executable, "-m", "securefed.cli"]


def _installed_is(here: str) -> bool:
    """Whether the installed package (what the console script imports, from a neutral folder) is ``here``'s."""
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        out = subprocess.run(
            [sys.executable, "-c", "import securefed, os; print(os.path.abspath(securefed.__file__))"],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=d,
            env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
        ).stdout.strip()
    return out.startswith(os.path.abspath(here) + os.sep)


def _env(**extra):
    """The subprocess's environment: this checkout's package first on the path."""
    import securefed

    here = os.path.dirname(os.path.dirname(os.path.abspath(securefed.__file__)))
    path = os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH")) if p)
    return dict(os.environ, PYTHONPATH=path, **extra)


@pytest.mark.slow
def test_subprocess_run_then_audit(tmp_path, repo_root):
    """The paper's rows mode, asked for explicitly, through a real `securefed` process: FedDL's rounds report
    progress, the map is good, and both run and the later `securefed audit` give the same verdict — fail,
    because rows let the coordinator reconstruct every record (exit 1, the reason named)."""
    out = tmp_path / "run"
    env = _env(OMP_NUM_THREADS="1", MPLBACKEND="Agg")
    cmd = _securefed_cmd() + [
        "run",
        "--dataset",
        "iris",
        "--clients",
        "3",
        "--partition",
        "iid",
        "--landmarks",
        "20",
        "--landmark-method",
        "feddl",
        "--nystrom",
        "rows",
        "--rounds",
        "5",
        "--no-compare-centralized",
        "--out",
        str(out),
    ]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert p.returncode == 1, p.stderr
    assert "Traceback" not in p.stderr
    assert "[landmarks] round 5/5" in p.stderr  # progress per round
    assert str(out) in p.stdout and "ca_10nn=" in p.stdout and "verdict: fail" in p.stdout
    for name in ("embedding.npy", "embedding.png", "metrics.json"):
        assert (out / name).is_file()
    m = json.loads((out / "metrics.json").read_text())
    assert m["n_samples"] == 150 and m["federated"]["ca_10nn"] >= 0.85
    a = subprocess.run(
        _securefed_cmd() + ["audit", str(out)], capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path
    )
    # the paper's rows mode lets the server reconstruct every record: the audit fails on purpose (exit 1)
    assert a.returncode == 1, a.stderr
    verdict = json.loads(a.stdout.strip().splitlines()[-1])
    assert verdict["verdict"] == "fail" and any("reconstruct" in r for r in verdict["reasons"])
    validate_report(json.loads((out / "report.json").read_text()))


@pytest.mark.slow
def test_subprocess_bad_input_has_no_traceback(tmp_path):
    p = subprocess.run(
        _securefed_cmd() + ["run", "--dataset", "nosuch", "--out", str(tmp_path / "o")],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env=_env(),
    )
    assert p.returncode == 2
    assert "Traceback" not in p.stderr and len(p.stderr.strip().splitlines()) == 1


def test_dp_run_writes_privacy_block_and_ledger(tmp_path):
    """Issue 4: a DP run's metrics.json carries the privacy block and the ledger is on disk."""
    out = tmp_path / "dp"
    # coordinates keep and no audit: nothing per record leaves and nothing is audited, so the verdict is
    # deterministically "not audited" (exit 1) instead of hanging on what the secret noise made of iris's 4-D
    # records (the reconstruction audit of sent coordinates is tested elsewhere)
    code = main(
        [
            "run",
            "--dataset",
            "iris",
            "--clients",
            "3",
            "--partition",
            "iid",
            "--landmarks",
            "10",
            "--landmark-method",
            "feddl",
            "--coordinates",
            "keep",
            "--rounds",
            "3",
            "--local-steps",
            "2",
            "--epsilon",
            "2",
            "--delta",
            "1e-5",
            "--clip-norm",
            "10",
            "--no-compare-centralized",
            "--no-audit",
            "--quiet",
            "--out",
            str(out),
        ]
    )
    assert code == 1
    assert json.loads((out / "report.json").read_text())["verdict"]["status"] == "not audited"
    m = json.loads((out / "metrics.json").read_text())
    priv = m["privacy"]
    for key in (
        "epsilon",
        "delta",
        "accountant",
        "epsilon_paper_formula",
        "noise_multiplier",
        "sensitivity",
        "sensitivity_rule",
        "releases",
        "clipped_records",
    ):
        assert key in priv, key
    assert 0 < priv["epsilon"] <= 2.0 + 1e-9 and priv["epsilon_paper_formula"] > priv["epsilon"]
    assert m["mode"]["nystrom"] == "local"  # with DP no per-record rows leave a site by default
    lines = (out / "ledger.jsonl").read_text().splitlines()
    assert len(lines) > 1 and json.loads(lines[0])["type"] == "header"


def test_dp_run_on_builtin_data_takes_the_public_range_as_clip_norm(tmp_path):
    """Built-in data sets are public: without --clip-norm a DP run uses τ_X = max|x|·√m (clips nothing);
    a user's file still needs --clip-norm."""
    from securefed.data import load_dataset

    out = tmp_path / "dp"
    code = main(
        [
            "run",
            "--dataset",
            "iris",
            "--clients",
            "3",
            "--partition",
            "iid",
            "--landmarks",
            "10",
            "--rounds",
            "2",
            "--local-steps",
            "1",
            "--epsilon",
            "2",
            "--no-compare-centralized",
            "--no-audit",
            "--coordinates",
            "keep",
            "--quiet",
            "--out",
            str(out),
        ]
    )
    assert code == 1  # "not audited" — deterministic, whatever the secret noise does (see the test above)
    X = load_dataset("iris").X
    priv = json.loads((out / "metrics.json").read_text())["privacy"]
    assert priv["tau_x"] == pytest.approx(float(np.max(np.abs(X))) * np.sqrt(X.shape[1]))
    assert priv["clipped_records"] == 0
    f = tmp_path / "mine.csv"
    np.savetxt(f, X, delimiter=",")
    assert (
        main(
            [
                "run",
                "--dataset",
                str(f),
                "--clients",
                "3",
                "--epsilon",
                "2",
                "--quiet",
                "--no-audit",
                "--out",
                str(tmp_path / "u"),
            ]
        )
        == 2
    )


def test_per_site_files_with_record_ids_round_trip(tmp_path, capsys):
    """--site DIR: one site per file (names = stems); the id column never becomes a feature and comes back in
    embedding.csv in each site's file order."""
    import csv

    from securefed.data import load_dataset

    ds = load_dataset("iris")
    rng = np.random.default_rng(0)
    order = rng.permutation(len(ds.X))
    folder = tmp_path / "sites"
    folder.mkdir()
    want = {}
    for k, name in enumerate(("north", "south", "west")):
        idx = order[k::3]
        ids = [f"P{1000 + int(i)}" for i in idx]
        want[name] = ids
        with open(folder / f"{name}.csv", "w", newline="") as fh:
            w = csv.writer(fh)
            w.writerow(["patient_id", "a", "b", "c", "d", "species"])
            for pid, i in zip(ids, idx):
                w.writerow([pid, *ds.X[i], ds.target_names[ds.y[i]]])
    out = tmp_path / "o"
    rc = main(
        [
            "run",
            "--site",
            str(folder),
            "--id-column",
            "patient_id",
            "--label-column",
            "species",
            "--cell-floor",
            "5",
            "--value-bound",
            "10",
            "--allow-audit-failure",
            "--no-compare-centralized",
            "--quiet",
            "--out",
            str(out),
        ]
    )
    assert rc in (0, 1), capsys.readouterr().err
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["sites"] == ["north", "south", "west"] and cfg["n_features"] == 4
    rows = list(csv.DictReader(open(out / "embedding.csv", encoding="utf-8")))
    for name in want:
        assert [r["record_id"] for r in rows if r["site"] == name] == want[name]
    assert {r["label"] for r in rows} == {"setosa", "versicolor", "virginica"}
    # a numeric id column without --id-column is refused, naming the flags
    with open(folder / "north.csv") as fh:
        text = fh.read().replace("P1", "1")
    (folder / "north.csv").write_text(text)
    for name in ("south", "west"):
        (folder / f"{name}.csv").write_text((folder / f"{name}.csv").read_text().replace("P1", "1"))
    assert (
        main(
            [
                "run",
                "--site",
                str(folder),
                "--label-column",
                "species",
                "--value-bound",
                "10",
                "--quiet",
                "--out",
                str(tmp_path / "o2"),
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert "--id-column" in err and "Traceback" not in err


@pytest.mark.slow
def test_the_default_run_is_private_and_its_verdict_is_pass(tmp_path, capsys):
    """`securefed run` with no flags but the output folder (digits, 10 sites split by label): no row leaves a
    site, the landmarks go through SecAgg+, the membership audit and the reconstruction audit pass, and run
    exits 0 with one verdict, pass."""
    out = tmp_path / "default"
    rc = main(["run", "--no-compare-centralized", "--out", str(out)])
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    assert "verdict: pass" in cap.out and "remedy:" not in cap.out
    m = json.loads((out / "metrics.json").read_text())
    assert m["audit"]["verdict"] == "pass" and m["audit"]["auc"] <= 0.6
    assert m["mode"]["nystrom"] == "local" and m["mode"]["aggregation"] == "secagg"
    assert not any("row" in r for r in m["released"]), m["released"]
    report = json.loads((out / "report.json").read_text())
    validate_report(report)
    assert report["verdict"]["status"] == "pass"
    # the report describes the cells that ran, not FedDL's rounds of landmark updates
    text = json.dumps(report["summary"], ensure_ascii=False)
    assert "landmark updates" not in text and "each child holds ≥ 15 records" in text, text[:2000]
