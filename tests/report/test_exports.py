"""Outputs users can join: per-site CSVs → embedding.csv (ids in = ids out, in order) and .h5ad → obsm."""

import csv

import numpy as np
import pytest

from securefed.data import load_sites
from securefed.errors import ConfigError, DataError
from securefed.report.exports import (
    embedding_rows,
    obsm_key,
    to_anndata_obsm,
    write_embedding_table,
    write_h5ad_with_embedding,
)


def _site_csvs(tmp_path, rng):
    d = tmp_path / "sites"
    d.mkdir()
    for name, n in (("north", 6), ("south", 4), ("east", 5)):
        ids = [f"{name[:2].upper()}{v:05d}" for v in rng.choice(99999, n, replace=False)]  # not sorted
        lines = ["mrn,a,b,c,diagnosis"] + [
            f"{i},{x[0]:.6f},{x[1]:.6f},{x[2]:.6f},{['benign', 'malignant'][k]}"
            for i, x, k in zip(ids, rng.normal(size=(n, 3)), rng.integers(0, 2, n))
        ]
        (d / f"{name}.csv").write_text("\n".join(lines) + "\n")
    return d


def test_per_site_csvs_round_trip_ids_in_equal_ids_out(tmp_path):
    rng = np.random.default_rng(0)
    sites = load_sites(_site_csvs(tmp_path, rng), id_column="mrn", label_column="diagnosis")
    coords = {s.name: s.X @ rng.normal(size=(3, 2)) for s in sites}  # stand-in for each site's placed records
    out = write_embedding_table(
        tmp_path / "out" / "embedding.csv",
        coords,
        {s.name: s.ids for s in sites},
        {s.name: s.y for s in sites},
        label_names=sites[0].target_names,
    )
    with open(out, newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert list(rows[0]) == ["site", "record_id", "x1", "x2", "label"]
    assert [r["site"] for r in rows] == [s.name for s in sites for _ in range(s.n_samples)]
    assert [r["record_id"] for r in rows] == [i for s in sites for i in s.ids]  # ids in = ids out, in order
    back = np.array([[float(r["x1"]), float(r["x2"])] for r in rows])
    np.testing.assert_array_equal(back, np.vstack([coords[s.name] for s in sites]))  # exact (repr round-trip)
    assert {r["label"] for r in rows} <= {"benign", "malignant"}
    # joinable: each site's file joined on record_id gives back its own rows
    north = {r["record_id"]: r for r in rows if r["site"] == "north"}
    assert set(north) == set(sites[1].ids)


def test_table_without_ids_uses_row_numbers_and_clusters():
    header, rows = embedding_rows({"a": np.array([2, 0, 1]), "b": np.array([1, 1])})
    assert header == ["site", "record_id", "cluster"]
    assert rows == [["a", "0", 2], ["a", "1", 0], ["a", "2", 1], ["b", "0", 1], ["b", "1", 1]]


def test_table_errors(tmp_path):
    with pytest.raises(DataError, match=r"^ids\['a'\]=.*one per record of site 'a' \(3\)"):
        embedding_rows({"a": np.zeros((3, 2))}, ids={"a": ["x", "y"]})
    with pytest.raises(DataError, match=r"^ids=\['c'\]"):
        embedding_rows({"a": np.zeros((3, 2))}, ids={"c": ["x"]})
    with pytest.raises(DataError, match="same number of coordinates"):
        embedding_rows({"a": np.zeros((3, 2)), "b": np.zeros((3, 3))})
    with pytest.raises(ConfigError, match="^format='xlsx'"):
        write_embedding_table(tmp_path / "e.x", {"a": np.zeros((1, 2))}, format="xlsx")


def test_parquet_or_a_typed_error(tmp_path):
    coords = {"a": np.arange(6.0).reshape(3, 2)}
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        with pytest.raises(ConfigError, match="pip install pyarrow"):
            write_embedding_table(tmp_path / "e.parquet", coords, format="parquet")
        return
    import pandas as pd

    p = write_embedding_table(tmp_path / "e.parquet", coords, {"a": ["r1", "r2", "r3"]}, format="parquet")
    df = pd.read_parquet(p)
    assert list(df["record_id"]) == ["r1", "r2", "r3"] and list(df["x2"]) == [1.0, 3.0, 5.0]


def test_h5ad_round_trip_into_obsm(tmp_path):
    anndata = pytest.importorskip("anndata")
    import pandas as pd

    rng = np.random.default_rng(3)
    src = tmp_path / "in"
    src.mkdir()
    for name, n in (("site_a", 8), ("site_b", 5)):
        ad = anndata.AnnData(
            X=rng.poisson(3.0, size=(n, 4)).astype(np.float32),
            obs=pd.DataFrame(index=[f"{name}-cell{v}" for v in rng.permutation(n)]),
        )
        ad.write_h5ad(src / f"{name}.h5ad")
    sites = load_sites(src)
    for s in sites:
        coords = rng.normal(size=(s.n_samples, 2))
        out = write_h5ad_with_embedding(
            s.path, tmp_path / "out" / f"{s.name}.h5ad", coords, obsm_key("tsne"), ids=s.ids
        )
        back = anndata.read_h5ad(out)
        assert tuple(back.obs_names) == s.ids  # ids in = ids out, in order
        np.testing.assert_array_equal(back.obsm["X_fedtsne"], coords)
    ad = anndata.read_h5ad(src / "site_a.h5ad")
    with pytest.raises(DataError, match=r"^coords=.*\(8\)"):
        to_anndata_obsm(ad, np.zeros((7, 2)))
    with pytest.raises(DataError, match=r"^ids=.*record 0"):
        to_anndata_obsm(ad, np.zeros((8, 2)), "X_fedumap", ids=list(reversed(ad.obs_names)))
    to_anndata_obsm(ad, np.array([0, 1, 1, 0, 2, 2, 1, 0]), obsm_key("spectral"))
    assert list(ad.obs["fedspectral"].astype(str)) == ["0", "1", "1", "0", "2", "2", "1", "0"]
    assert obsm_key("umap") == "X_fedumap"
