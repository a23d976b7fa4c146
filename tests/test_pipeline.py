"""``securefed.pipeline.run``: the run folder and metrics.json of issue 2, checked against the saved outputs."""

import json
import os
import struct

import numpy as np
import pytest

from securefed.data import load_dataset, partition
from securefed.metrics import METRIC_KEYS, clustering_metrics, embedding_metrics
from securefed.pipeline import JOB_DEFAULTS, run_job

pytestmark = pytest.mark.usefixtures("single_blas_thread")

ISSUE2_KEYS = {"method", "dataset", "n_samples", "n_clients", "partition", "federated", "timings"}


def _png_size(path):
    with open(path, "rb") as fh:
        head = fh.read(24)
    assert head[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG file"
    return struct.unpack(">II", head[16:24])  # width, height of the IHDR chunk


def _pooled(name, clients, scheme, seed):
    """The pooled records and labels in site order, as the pipeline builds them."""
    ds = load_dataset(name)
    parts = partition(ds.X, ds.y, clients, scheme, random_state=np.random.default_rng(seed))
    return np.vstack([ds.X[i] for i in parts]), np.concatenate([ds.y[i] for i in parts])


def _cfg(out, **kw):
    """(job, plan options) as ``securefed run`` builds them (the audit gate on by default, 20 % hold-out)."""
    base = dict(
        dataset="iris",
        clients=3,
        partition="iid",
        landmarks=20,
        rounds=5,
        local_steps=3,
        cell_floor=8,
        compare_centralized=False,
        out=str(out),
        quiet=True,
        audit=True,
    )
    base.update(kw)
    job = {k: base.pop(k, v) for k, v in JOB_DEFAULTS.items()}
    job["audit"] = base.pop("audit")
    base.setdefault("audit_holdout", 0.2 if job["audit"] else 0.0)
    return job, base


def run(cfg):
    return run_job(*cfg)


@pytest.fixture(scope="module")
def tsne_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("tsne_run")
    metrics = run(_cfg(out, compare_centralized=True))
    return out, metrics


def test_tsne_run_folder_contents(tsne_run):
    out, _ = tsne_run
    for name in (
        "embedding.npy",
        "embedding.csv",
        "embedding.png",
        "metrics.json",
        "config.json",
        "history.json",
        "y_true.npy",
        "result.json",
        os.path.join("audit", "mia.json"),
        os.path.join("audit", "reconstruction.json"),
    ):
        assert os.path.isfile(out / name), name
    assert not (out / "labels.npy").exists()
    assert not [p for p in os.listdir(out) if p.endswith(".tmp")]


def test_metrics_json_has_the_issue2_form(tsne_run):
    out, returned = tsne_run
    m = json.loads((out / "metrics.json").read_text())
    assert m == json.loads(json.dumps(returned))  # the file is what run() returned
    assert ISSUE2_KEYS | {"centralized"} <= set(m)
    assert (m["method"], m["dataset"], m["n_samples"], m["n_clients"], m["partition"]) == (
        "tsne",
        "iris",
        150,
        3,
        "iid",
    )
    assert set(m["federated"]) == set(METRIC_KEYS)
    assert set(m["centralized"]) == set(METRIC_KEYS)
    for block in (m["federated"], m["centralized"]):
        assert all(isinstance(v, float) and 0.0 <= v <= 1.0 or k == "sc" and -1.0 <= v <= 1.0 for k, v in block.items())
    assert isinstance(m["timings"], dict) and m["timings"]
    assert all(isinstance(v, float) and v >= 0 for v in m["timings"].values())
    assert {"total", "centralized", "federated_total"} <= set(m["timings"])


def test_metrics_are_those_of_the_saved_embedding(tsne_run):
    out, m = tsne_run
    X, y = _pooled("iris", 3, "iid", 0)
    np.testing.assert_array_equal(np.load(out / "y_true.npy"), y)
    E = np.load(out / "embedding.npy")
    assert E.shape == (150, 2) and np.all(np.isfinite(E))
    again = embedding_metrics(X, E, y, random_state=0)
    assert again == pytest.approx(m["federated"], rel=1e-12)
    # iris is tiny: 120 members make 15 cells of ≥ 8 records; the map still separates the classes
    assert m["federated"]["ca_10nn"] >= 0.75 and m["centralized"]["ca_10nn"] >= 0.85


def test_history_and_config(tsne_run, tmp_path):
    out, _ = tsne_run
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["dataset"]["name"] == "iris" and cfg["dataset"]["n_samples"] == 150
    # the private defaults: no rows, SecAgg+ (a built-in data set's public range is the value bound), cells
    assert cfg["mode"]["nystrom"] == "local" and cfg["mode"]["aggregation"] == "secagg"
    assert cfg["options"]["landmark_method"] == "cells"
    assert sum(cfg["site_sizes"]) == 150 and len(cfg["site_sizes"]) == 3
    assert cfg["target_names"] == ["setosa", "versicolor", "virginica"]
    # FedDL's rounds (the paper's rows mode) fill the history and a checkpoint
    run(_cfg(tmp_path, audit=False, nystrom="rows", landmark_method="feddl"))
    h = json.loads((tmp_path / "history.json").read_text())
    assert h["rounds"] == [1, 2, 3, 4, 5] and len(h["mmd"]) == 5 and h["mmd"][-1] < h["mmd"][0]
    assert (tmp_path / "checkpoint.npz").is_file()


def test_plot_puts_federated_beside_centralized(tsne_run, tmp_path):
    out, _ = tsne_run
    w2, h2 = _png_size(out / "embedding.png")
    run(_cfg(tmp_path, audit=False))
    w1, h1 = _png_size(tmp_path / "embedding.png")
    assert h1 == h2 and w2 > 1.6 * w1  # one panel vs two side by side
    m = json.loads((tmp_path / "metrics.json").read_text())
    assert "centralized" not in m and "audit" not in m and ISSUE2_KEYS <= set(m)


def test_spectral_run_writes_labels_and_nmi_ari(tmp_path):
    m = run(
        _cfg(
            tmp_path,
            method="spectral",
            dataset="wine",
            partition="label",
            landmarks=30,
            rounds=10,
            compare_centralized=True,
            audit=False,
        )
    )
    assert (tmp_path / "labels.npy").is_file() and not (tmp_path / "embedding.npy").exists()
    assert (tmp_path / "embedding.png").is_file()
    labels = np.load(tmp_path / "labels.npy")
    _, y = _pooled("wine", 3, "label", 0)
    assert labels.shape == y.shape and len(np.unique(labels)) == 3
    assert {"nmi", "ari"} <= set(m["federated"]) and {"nmi", "ari"} <= set(m["centralized"])
    assert m["federated"]["nmi"] == pytest.approx(clustering_metrics(labels, y)["nmi"], rel=1e-12)
    assert m["federated"]["ari"] == pytest.approx(clustering_metrics(labels, y)["ari"], rel=1e-12)
    on_disk = json.loads((tmp_path / "metrics.json").read_text())
    assert on_disk["method"] == "spectral" and on_disk["federated"] == pytest.approx(m["federated"])


def test_rerun_with_other_parameters_in_same_folder_does_not_reuse_landmarks(tmp_path):
    run(_cfg(tmp_path, audit=False, nystrom="rows"))
    first = np.load(tmp_path / "checkpoint.npz")["Y"]
    try:
        run(_cfg(tmp_path, audit=False, seed=7, gamma=3.0, nystrom="rows"))
    except Exception as exc:  # refusing the stale checkpoint with a typed error is an acceptable fix
        from securefed.errors import ConfigError

        assert isinstance(exc, ConfigError)
        return
    assert not np.array_equal(np.load(tmp_path / "checkpoint.npz")["Y"], first)


def test_embedding_csv_joins_back_to_the_records(tsne_run):
    """embedding.csv: one row per record, (site, record_id) in each site's order, the coordinates of embedding.npy."""
    import csv

    out, _ = tsne_run
    rows = list(csv.DictReader(open(out / "embedding.csv", encoding="utf-8")))
    E = np.load(out / "embedding.npy")
    assert len(rows) == len(E) == 150
    cfg = json.loads((out / "config.json").read_text())
    sizes = dict(zip(cfg["sites"], cfg["site_sizes"]))
    assert [r["site"] for r in rows] == [s for s in cfg["sites"] for _ in range(sizes[s])]
    np.testing.assert_allclose([[float(r[c]) for c in ("x1", "x2")] for r in rows], E, rtol=1e-12)
