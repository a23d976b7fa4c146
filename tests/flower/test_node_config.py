"""A SuperNode's node config reads the site's file as ``securefed run`` reads it (``id-column``, ``label-column``,
``keep-column``): the real coordinator and site code in process, each site reading its own CSV as a SuperNode does.
The record ids stay on the site unless it sets ``send-record-ids``; then the run's join table has them."""

import csv

import numpy as np
import pytest

from securefed.errors import ConfigError, DataError
from securefed.federation import Coordinator, InMemoryExchange, SiteWorker, drive
from securefed.plan import from_run_config

# one SiteWorker per site for the whole run, as the warm worker keeps it over Flower
CFG = {
    "landmarks": 6,
    "rounds": 1,
    "local-steps": 2,
    "gamma": 1.0,
    "init": "moments",
    "aggregation": "plain",
    "landmark-method": "feddl",
    "audit-holdout": 0.0,
    "min-sites": 3,
    "seed": 1,
    "method": "tsne",
    "nystrom": "local",
    "perplexity": 5.0,
}


def _write_sites(tmp_path, n=25):
    rng = np.random.default_rng(2)
    paths, ids, feats = [], [], []
    for s in range(3):
        X = rng.normal(size=(n, 3)) + s
        rid = [f"P{s}-{int(v)}" for v in rng.permutation(10_000)[:n]]  # not in file order of anything
        path = tmp_path / f"site{s}.csv"
        with open(path, "w", newline="") as fh:
            w = csv.writer(fh)
            w.writerow(["patient_id", "f0", "diagnosis", "f1", "f2"])
            for r, x in zip(rid, X):
                w.writerow([r, repr(float(x[0])), s % 2, repr(float(x[1])), repr(float(x[2]))])
        paths.append(str(path))
        ids.append(rid)
        feats.append(X)
    return paths, ids, feats


def _run(paths, options):
    workers = {
        100 + i: SiteWorker(
            {"site-name": f"site{i}", "data-path": p, "allow-plain": True, "allow-paper-mode": True, **options(i)}
        )
        for i, p in enumerate(paths)
    }
    return drive(Coordinator(from_run_config(CFG)), InMemoryExchange(workers)), workers


def test_id_and_label_columns_stay_out_of_the_features_and_the_ids_on_the_site(tmp_path):
    paths, _, feats = _write_sites(tmp_path)
    res, workers = _run(paths, lambda i: {"id-column": "patient_id", "label-column": "diagnosis"})
    assert res.n_features == 3
    for i, w in workers.items():  # the features are the three f-columns, in file order
        np.testing.assert_array_equal(w.records(), feats[i - 100])
    assert "record_ids" not in res.embedding  # nobody chose to send them
    assert not any("record ids" in e["what"] for e in res.inventory)


def test_send_record_ids_sends_them_with_the_coordinates_and_names_the_release(tmp_path):
    from securefed.flower.server_app import write_join_table

    paths, ids, _ = _write_sites(tmp_path)
    res, _ = _run(
        paths,
        lambda i: {
            "id-column": "patient_id",
            "label-column": "diagnosis",
            **({"send-record-ids": True} if i != 1 else {}),
        },
    )
    assert res.embedding["record_ids"] == {"site0": ids[0], "site2": ids[2]}  # site1 kept its ids
    rel = [e for e in res.inventory if "record ids" in e["what"]]
    assert len(rel) == 1 and "site0" in rel[0]["what"] and "site1" not in rel[0]["what"]
    assert rel[0]["to"] == "the coordinator" and rel[0]["covered_by_epsilon"] is False
    path = write_join_table(str(tmp_path / "out"), res.embedding, res.embedding.pop("record_ids"))
    with open(path, newline="") as fh:
        rows = list(csv.DictReader(fh))
    for s in range(3):
        got = [r["record_id"] for r in rows if r["site"] == f"site{s}"]
        assert got == (ids[s] if s != 1 else [str(k) for k in range(len(ids[1]))])  # site1: its row numbers
        xy = np.array([[float(r["x1"]), float(r["x2"])] for r in rows if r["site"] == f"site{s}"])
        np.testing.assert_array_equal(xy, res.embedding["coordinates"][f"site{s}"])


def test_file_options_are_checked_before_any_work(tmp_path):
    paths, _, _ = _write_sites(tmp_path)
    with pytest.raises(DataError, match="id_column"):  # an id-like column is never silently a feature
        SiteWorker({"data-path": paths[0], "label-column": "diagnosis"}).records()
    plain = tmp_path / "no-ids.csv"
    plain.write_text("a,b\n1.0,2.0\n3.0,4.5\n5.0,6.0\n")
    with pytest.raises(ConfigError, match="send-record-ids"):  # ids to send, but no id column named
        SiteWorker({"data-path": str(plain), "send-record-ids": True}).records()
    # keep-column: the operator keeps an id-like column as a feature on purpose (here: row numbers 0…n−1)
    numbered = tmp_path / "numbered.csv"
    numbered.write_text("id,a\n0,1.0\n1,2.5\n2,0.5\n")
    with pytest.raises(DataError, match="id"):
        SiteWorker({"data-path": str(numbered)}).records()
    X = SiteWorker({"data-path": str(numbered), "keep-column": "other, id"}).records()
    np.testing.assert_array_equal(X, [[0.0, 1.0], [1.0, 2.5], [2.0, 0.5]])
