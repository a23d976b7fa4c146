"""A hospital's own files, the first time: columns matched by name, ids kept per site, nothing written before the
input is accepted, never an earlier run overwritten, exit codes that tell a FAIL from an error, the map written back
into each site's AnnData, and the public bounds of the user's records taken from the user — never from the records."""

import csv
import json
import os

import numpy as np
import pytest

from securefed.cli import main
from securefed.cli.main import EXIT_CODES
from securefed.data import load_dataset, load_sites
from securefed.errors import DataError

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
    "--no-compare-centralized",
    "--quiet",
]


def _write_csv(path, header, rows):
    with open(path, "w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(header)
        w.writerows(rows)


def _iris_sites(folder, *, shuffle_columns_of=None, ids=lambda name, i: f"{name}-{i}"):
    """Three CSV sites of iris (string patient ids, a species label); one of them may list its columns in another
    order."""
    ds = load_dataset("iris")
    folder.mkdir(exist_ok=True)
    names = ["a", "b", "c"]
    cols = ["sepal_length", "sepal_width", "petal_length", "petal_width"]
    for k, name in enumerate(names):
        idx = np.arange(k, len(ds.X), 3)
        order = [3, 0, 2, 1] if name == shuffle_columns_of else [0, 1, 2, 3]
        header = ["patient_id"] + [cols[j] for j in order] + ["species"]
        rows = [[ids(name, int(i))] + [ds.X[i, j] for j in order] + [ds.target_names[ds.y[i]]] for i in idx]
        _write_csv(folder / f"{name}.csv", header, rows)
    return ds


# ------------------------------------------------------------------------------------------------ columns and ids


def test_columns_are_matched_by_header_name(tmp_path):
    ds = _iris_sites(tmp_path / "s", shuffle_columns_of="b")
    sites = load_sites(str(tmp_path / "s"), label_column="species", id_column="patient_id")
    for k, s in enumerate(sites):
        assert s.feature_names == ("sepal_length", "sepal_width", "petal_length", "petal_width")
        np.testing.assert_array_equal(s.X, ds.X[k::3])  # site b's reordered columns are back in place


def test_missing_and_extra_columns_are_refused_in_one_line(tmp_path):
    _iris_sites(tmp_path / "s")
    text = (tmp_path / "s" / "c.csv").read_text().replace("petal_width", "petal_w")
    (tmp_path / "s" / "c.csv").write_text(text)
    with pytest.raises(DataError) as info:
        load_sites(str(tmp_path / "s"), label_column="species", id_column="patient_id")
    msg = str(info.value)
    assert "\n" not in msg and "missing ['petal_width']" in msg and "extra ['petal_w']" in msg and "c.csv" in msg


def test_one_patient_id_at_two_sites_is_a_warning_with_the_count(tmp_path):
    _iris_sites(tmp_path / "s", ids=lambda name, i: f"P{i // 3 if name != 'c' else 1000 + i}")  # a and b: P0, P1 …
    with pytest.warns(UserWarning, match=r"^50 record id\(s\) appear at more than one site") as rec:
        sites = load_sites(str(tmp_path / "s"), label_column="species", id_column="patient_id")
    assert "'P0' at a and b" in str(rec[0].message)
    assert sites[0].ids[:2] == ("P0", "P1") and sites[1].ids[:2] == ("P0", "P1")  # the ids stay per site


# ------------------------------------------------------------------------------------------------ before any write


@pytest.mark.parametrize(
    "argv, flag",
    [
        (["--epsilon", "0"], "--epsilon"),
        (["--epsilon", "-1"], "--epsilon"),
        (["--clients", "1"], "--clients"),
        (["--cell-floor", "1"], "--cell-floor"),
        (["--method", "spectral", "--n-clusters", "1"], "--n-clusters"),
    ],
    ids=["eps0", "eps-1", "clients1", "floor1", "clusters1"],
)
def test_bad_input_is_refused_before_any_data_are_read_or_any_file_written(tmp_path, capsys, monkeypatch, argv, flag):
    def no_data(*a, **k):
        raise AssertionError("the data were read before the input was checked")

    monkeypatch.setattr("securefed.data.load_dataset", no_data)
    monkeypatch.setattr("securefed.data.load_sites", no_data)
    out = tmp_path / "out"
    rc = main(["run", *SMALL, "--out", str(out), *argv])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1 and flag in err, err
    assert not out.exists()  # not even the folder


def test_a_single_site_file_is_refused_before_it_is_read(tmp_path, capsys, monkeypatch):
    _iris_sites(tmp_path / "s")
    monkeypatch.setattr("securefed.data.load_sites", lambda *a, **k: pytest.fail("read"))
    rc = main(
        ["run", "--site", str(tmp_path / "s" / "a.csv"), "--value-bound", "10", "--quiet", "--out", str(tmp_path / "o")]
    )
    assert rc == 2 and "at least 2 sites" in capsys.readouterr().err and not (tmp_path / "o").exists()


def _snapshot(folder):
    return {
        p: (os.path.getmtime(folder / p), (folder / p).read_bytes())
        for p in sorted(os.listdir(folder))
        if (folder / p).is_file()
    }


@pytest.mark.slow
def test_an_earlier_run_is_never_overwritten_without_force(tmp_path, capsys):
    out = tmp_path / "run"
    run = ["run", *SMALL, "--cell-floor", "6", "--no-audit"]
    assert main([*run, "--out", str(out)]) == 1  # "not audited"
    before = _snapshot(out)
    assert {"metrics.json", "report.html", "y_true.npy", "embedding.npy"} <= set(before)
    for again in ([], ["--landmarks", "25"]):  # the same plan, and another one
        rc = main([*run, *again, "--out", str(out)])
        err = capsys.readouterr().err
        assert rc == 2 and "--out" in err and "--force" in err and len(err.strip().splitlines()) == 1
        assert _snapshot(out) == before  # every file intact, y_true.npy included
    assert main([*run, "--force", "--out", str(out)]) == 1
    after = _snapshot(out)
    assert after["metrics.json"][0] > before["metrics.json"][0]  # replaced on request


# ------------------------------------------------------------------------------------------------ exit codes


def test_exit_codes_tell_a_fail_from_an_error(tmp_path, capsys, monkeypatch, repo_root):
    # 2: refused input
    assert main(["run", *SMALL, "--epsilon", "0", "--out", str(tmp_path / "a")]) == 2

    # 3: an internal error (a bug), never 1 — which is a FAIL verdict
    def bug(*a, **k):
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr("securefed.pipeline.run_job", bug)
    assert main(["run", *SMALL, "--out", str(tmp_path / "b")]) == 3
    assert "internal error: ZeroDivisionError" in capsys.readouterr().err
    monkeypatch.setattr("securefed.report.build.build_report", bug)
    (tmp_path / "c").mkdir()
    assert main(["audit", str(tmp_path / "c")]) == 3
    # the README and --help list every code
    with open(os.path.join(repo_root, "README.md"), encoding="utf-8") as fh:
        readme = fh.read()
    for code, text in EXIT_CODES.items():
        assert f"| {code} | {text} |" in readme, code


# ------------------------------------------------------------------------------------------------ ε = 1e9


@pytest.mark.slow
def test_a_huge_epsilon_is_reported_without_a_crash(tmp_path, capsys):
    out = tmp_path / "e9"
    rc = main(["run", *SMALL, "--epsilon", "1e9", "--coordinates", "keep", "--out", str(out)])
    cap = capsys.readouterr()
    assert rc in (0, 1), cap.err
    report = json.loads((out / "report.json").read_text())
    assert "10^4.34e8" in report["summary"]["epsilon"] and "bounds nothing" in report["summary"]["epsilon"]
    assert main(["audit", str(out)]) in (0, 1)  # securefed audit too (it crashed with OverflowError)


# ------------------------------------------------------------------------------------------------ .h5ad


@pytest.mark.slow
def test_h5ad_sites_get_the_map_back_in_obsm(tmp_path, capsys):
    anndata = pytest.importorskip("anndata")
    import pandas as pd

    ds = load_dataset("iris")
    folder = tmp_path / "sites"
    folder.mkdir()
    ids = {}
    for k, name in enumerate(("north", "south", "west")):
        idx = np.arange(k, len(ds.X), 3)
        ids[name] = [f"{name}-cell-{i}" for i in idx]
        ad = anndata.AnnData(
            X=ds.X[idx].astype(np.float32),
            obs=pd.DataFrame({"species": [ds.target_names[c] for c in ds.y[idx]]}, index=ids[name]),
        )
        ad.write_h5ad(folder / f"{name}.h5ad")
    original = {n: (folder / f"{n}.h5ad").read_bytes() for n in ids}
    out = tmp_path / "run"
    rc = main(
        [
            "run",
            "--site",
            str(folder),
            "--label-column",
            "species",
            "--value-bound",
            "10",
            "--cell-floor",
            "5",
            "--allow-audit-failure",
            "--no-compare-centralized",
            "--quiet",
            "--out",
            str(out),
        ]
    )
    assert rc in (0, 1), capsys.readouterr().err
    coords = np.load(out / "embedding.npz")
    for name, site_ids in ids.items():
        back = anndata.read_h5ad(out / "sites" / f"{name}.h5ad")
        assert list(back.obs_names) == site_ids
        np.testing.assert_allclose(back.obsm["X_fedtsne"], coords[name])
        np.testing.assert_array_equal(back.X, ds.X[np.arange(list(ids).index(name), len(ds.X), 3)].astype(np.float32))
        assert (folder / f"{name}.h5ad").read_bytes() == original[name]  # the site's own file is never modified


# ------------------------------------------------------------------------------------------------ public bounds


@pytest.mark.slow
def test_bounds_of_the_users_own_records_come_from_the_user(tmp_path, capsys):
    """A DP parameter read off the records is a release outside ε: on --site data the clip norm and the value bound
    are the user's (a typed error naming the flag), never max|x|·√m of the pooled records called 'public'."""
    _iris_sites(tmp_path / "s")
    base = ["run", "--site", str(tmp_path / "s"), "--label-column", "species", "--id-column", "patient_id"]
    rc = main(base + ["--epsilon", "1", "--out", str(tmp_path / "dp")])
    err = capsys.readouterr().err
    assert rc == 2 and "--clip-norm=None is invalid" in err and "never read off the records" in err
    assert "data set's public range" not in err and not (tmp_path / "dp").exists()
    rc = main(base + ["--out", str(tmp_path / "plain")])
    err = capsys.readouterr().err
    assert rc == 2 and "--value-bound=None is invalid" in err and "--aggregation plain" in err
    # with the bound stated, the run says nothing of a "public range" it did not have
    rc = main(
        base
        + [
            "--epsilon",
            "1",
            "--clip-norm",
            "20",
            "--coordinates",
            "keep",
            "--landmarks",
            "20",
            "--no-compare-centralized",
            "--out",
            str(tmp_path / "ok"),
        ]
    )
    err = capsys.readouterr().err
    assert rc in (0, 1) and "public range" not in err and "--clip-norm" not in err, err
    assert json.loads((tmp_path / "ok" / "metrics.json").read_text())["privacy"]["tau_x"] == 20.0


# ------------------------------------------------------------------------------------------------ remedies that work


@pytest.mark.slow
def test_a_failing_reconstruction_remedy_passes_when_applied(tmp_path, capsys):
    """iris with cells of ≥ 8 records: the membership audit passes but the coordinator rebuilds about 45 % of the
    records from their 2-D coordinates (the average record puts 1 % within 5 %; at floors of 4 and 6 the sites' own
    membership gate already stops the run at the landmarks). The remedy the run prints is
    --coordinates keep; the same run with it passes."""
    args = [
        "run",
        "--dataset",
        "iris",
        "--clients",
        "3",
        "--partition",
        "iid",
        "--cell-floor",
        "8",
        "--no-compare-centralized",
        "--quiet",
    ]
    assert main(args + ["--out", str(tmp_path / "a")]) == 1
    out = capsys.readouterr().out
    remedy = next(ln for ln in out.splitlines() if ln.strip().startswith("remedy:"))
    assert "--coordinates keep" in remedy
    report = json.loads((tmp_path / "a" / "report.json").read_text())
    rec = report["reconstruction"]
    assert report["verdict"]["reconstruction"] == "fail" and rec["fraction_within_5pct_beyond_baseline"] > 0.1
    assert main(args + ["--coordinates", "keep", "--out", str(tmp_path / "b")]) == 0
    report = json.loads((tmp_path / "b" / "report.json").read_text())
    assert report["verdict"]["status"] == "pass" and report["verdict"]["reconstruction"] == "nothing left"


# ------------------------------------------------------------------------------------------------ the README's path


def _readme_site_command(repo_root) -> list:
    """The README's own-data example (``securefed run --site …``, continuation lines joined), as argv."""
    import shlex

    with open(os.path.join(repo_root, "README.md"), encoding="utf-8") as fh:
        lines = fh.read().splitlines()
    i = next(k for k, ln in enumerate(lines) if ln.startswith("securefed run --site "))
    text = lines[i]
    while text.rstrip().endswith("\\"):
        i += 1
        text = text.rstrip()[:-1] + " " + lines[i].strip()
    argv = shlex.split(text.split("  #")[0], comments=True)
    assert argv[:2] == ["securefed", "run"]
    return argv[1:]


@pytest.mark.slow
def test_the_readmes_own_data_example_on_breast_cancer_passes_or_its_remedy_does(tmp_path, capsys, repo_root):
    """The README's own-data command as a newcomer runs it: scikit-learn's breast_cancer as three hospitals' CSV
    files of unequal sizes with string patient ids. It passes — or fails with a remedy whose re-run passes."""
    from sklearn.datasets import load_breast_cancer

    d = load_breast_cancer()
    order = np.random.default_rng(0).permutation(len(d.data))
    folder = tmp_path / "data"
    folder.mkdir()
    for name, (a, b) in zip("abc", ((0, 300), (300, 470), (470, len(order)))):
        _write_csv(
            folder / f"site-{name}.csv",
            ["patient_id", *d.feature_names, "diagnosis"],
            [[f"H{name.upper()}-{i:05d}", *d.data[i], d.target_names[d.target[i]]] for i in order[a:b]],
        )
    argv = _readme_site_command(repo_root)
    argv[argv.index("--site") + 1] = str(folder / "site-*.csv")
    argv[argv.index("--out") + 1] = str(tmp_path / "run")
    rc = main(argv + ["--quiet"])
    cap = capsys.readouterr()
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    if rc != 0:
        assert rc == 1 and report["verdict"]["status"] == "fail", cap.err
        remedy = report["verdict"]["remedies"][0]
        flags = [w for w in remedy.split() if w.startswith("--")][:1]
        assert flags == ["--coordinates"], remedy
        argv[argv.index("--out") + 1] = str(tmp_path / "remedy")
        assert main(argv + ["--coordinates", "keep", "--quiet"]) == 0, capsys.readouterr().err
        report = json.loads((tmp_path / "remedy" / "report.json").read_text())
    assert report["verdict"]["status"] == "pass"
    # a small consortium's weak map shows in the summary: its worst figure, not its best
    worst = min((r for r in report["utility"]["rows"] if r["gap_points"] is not None), key=lambda r: r["gap_points"])
    short = {"ca_10nn": "CA-10NN", "trustworthiness": "trustworthiness", "nmi": "NMI"}[worst["metric"]]
    assert report["summary"]["quality"].startswith(f"Worst gap to the same method on the pooled records: {short} ")
