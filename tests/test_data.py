"""Tests for securefed.data: loaders, partitioners, site validation, typed errors."""

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from securefed.data import BUILTIN_DATASETS, Dataset, check_sites, load_dataset, partition
from securefed.errors import ConfigError, DataError


# ----------------------------------------------------------------------------- loaders


@pytest.mark.parametrize(
    "name,shape,k",
    [("digits", (1797, 64), 10), ("iris", (150, 4), 3), ("wine", (178, 13), 3), ("breast_cancer", (569, 30), 2)],
)
def test_builtins(name, shape, k):
    ds = load_dataset(name)
    assert isinstance(ds, Dataset) and ds.X.shape == shape and ds.X.dtype == np.float64
    assert ds.y.dtype == np.int64 and len(np.unique(ds.y)) == k and ds.name == name
    with pytest.raises(dataclasses.FrozenInstanceError):
        ds.X = None  # frozen


def test_mnist5k():
    ds = load_dataset("mnist5k")
    assert ds.X.shape == (5000, 784) and set(np.unique(ds.y)) == set(range(10))


def test_unknown_name_lists_builtins_and_types():
    with pytest.raises(ConfigError) as e:
        load_dataset("mnist70k")
    msg = str(e.value)
    assert "name_or_path" in msg and all(b in msg for b in BUILTIN_DATASETS) and ".csv" in msg and ".npz" in msg


def test_missing_file():
    with pytest.raises(ConfigError, match="no such file"):
        load_dataset("/nonexistent/x.csv")


def test_csv_labels_strings_mapped(tmp_path):
    p = tmp_path / "d.csv"
    p.write_text("a,b,kind\n1,2,cat\n3,4,dog\n5,6,cat\n")
    ds = load_dataset(p, label_column="kind")
    np.testing.assert_array_equal(ds.X, [[1, 2], [3, 4], [5, 6]])
    np.testing.assert_array_equal(ds.y, [0, 1, 0])
    assert ds.target_names == ("cat", "dog") and ds.feature_names == ("a", "b")


def test_csv_numeric_labels_and_no_label(tmp_path):
    p = tmp_path / "d.csv"
    p.write_text("y,a\n3,0.5\n7,1.5\n")
    ds = load_dataset(str(p), label_column="y")
    np.testing.assert_array_equal(ds.y, [3, 7])
    ds2 = load_dataset(str(p))
    assert ds2.y is None and ds2.X.shape == (2, 2)


def test_csv_missing_label_column_names_column_and_columns(tmp_path):
    p = tmp_path / "d.csv"
    p.write_text("a,b\n1,2\n3,4\n")
    with pytest.raises(DataError) as e:
        load_dataset(p, label_column="target")
    assert "label_column" in str(e.value) and "'target'" in str(e.value) and "['a', 'b']" in str(e.value)


def test_csv_non_numeric_feature(tmp_path):
    p = tmp_path / "d.csv"
    p.write_text("a,b\n1,x\n3,4\n")
    with pytest.raises(DataError, match="column 'b'"):
        load_dataset(p)


def test_csv_nan_suggests_imputation(tmp_path):
    p = tmp_path / "d.csv"
    p.write_text("a,b\n1,\n3,4\nnan,inf\n")
    with pytest.raises(DataError) as e:
        load_dataset(p)
    assert "2 rows and 2 columns" in str(e.value) and "impute" in str(e.value)


def test_npy_npz(tmp_path):
    X = np.arange(12.0).reshape(6, 2)
    np.save(tmp_path / "a.npy", X)
    assert load_dataset(tmp_path / "a.npy").y is None
    np.savez(tmp_path / "b.npz", X=X, y=np.array(["u", "v"] * 3))
    ds = load_dataset(tmp_path / "b.npz")
    np.testing.assert_array_equal(ds.y, [0, 1] * 3)
    np.savez(tmp_path / "c.npz", data=X)
    with pytest.raises(DataError, match=r"keys present: \['data'\]"):
        load_dataset(tmp_path / "c.npz")
    np.save(tmp_path / "d.npy", np.arange(3.0))
    with pytest.raises(DataError, match="2-D"):
        load_dataset(tmp_path / "d.npy")
    bad = X.copy()
    bad[2, 1] = np.inf
    np.save(tmp_path / "e.npy", bad)
    with pytest.raises(DataError, match="impute"):
        load_dataset(tmp_path / "e.npy")


# ----------------------------------------------------------------------------- partitions


def _check_cover(parts, n):
    allidx = np.concatenate(parts)
    assert len(allidx) == n and len(np.unique(allidx)) == n  # disjoint cover
    assert all(p.dtype == np.int64 and len(p) >= 2 for p in parts)


@settings(max_examples=25, deadline=None)
@given(n=st.integers(20, 300), s=st.integers(1, 10), seed=st.integers(0, 2**32 - 1))
def test_iid_property(n, s, seed):
    parts = partition(n, None, s, "iid", random_state=seed)
    _check_cover(parts, n)
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 1 and len(parts) == s


@settings(max_examples=25, deadline=None)
@given(k=st.integers(2, 6), s=st.integers(1, 12), seed=st.integers(0, 2**32 - 1))
def test_label_property(k, s, seed):
    rng = np.random.default_rng(seed)
    y = rng.permutation(np.repeat(np.arange(k), 30))
    parts = partition(y, y, s, "label", random_state=seed)
    _check_cover(parts, len(y))
    assert len(parts) == s
    classes = [set(np.unique(y[p])) for p in parts]
    if s >= k:
        assert all(len(c) == 1 for c in classes)  # exactly one class per site
        assert {c.pop() for c in classes} == set(range(k))
    else:  # round-robin: site i holds classes i, i+s, ...
        assert classes == [set(range(i, k, s)) for i in range(s)]


@settings(max_examples=25, deadline=None)
@given(alpha=st.floats(0.01, 100.0), s=st.integers(2, 10), seed=st.integers(0, 2**32 - 1))
def test_dirichlet_property(alpha, s, seed):
    y = np.repeat(np.arange(5), 40)
    parts = partition(len(y), y, s, f"dirichlet:{alpha}", random_state=seed)
    _check_cover(parts, len(y))  # includes the ≥ 2 repair, even for tiny alpha


def test_dirichlet_large_alpha_is_iid_like():
    y = np.repeat(np.arange(4), 1000)
    parts = partition(len(y), y, 5, "dirichlet:1e6", random_state=1)
    for p in parts:
        assert abs(len(p) - 800) <= 10
        frac = np.bincount(y[p], minlength=4) / len(p)
        np.testing.assert_allclose(frac, 0.25, atol=0.02)


def test_dirichlet_small_alpha_is_skewed():
    y = np.repeat(np.arange(10), 100)
    parts = partition(len(y), y, 10, "dirichlet:0.05", random_state=0)
    dominant = [np.bincount(y[p]).max() / len(p) for p in parts]
    assert np.median(dominant) > 0.4  # IID would give ≈ 0.1–0.15


def test_partition_seeded_reproducible():
    y = np.repeat(np.arange(3), 20)
    a = partition(60, y, 4, "dirichlet:0.5", random_state=7)
    b = partition(60, y, 4, "dirichlet:0.5", random_state=7)
    assert all(np.array_equal(x, z) for x, z in zip(a, b))


@pytest.mark.parametrize("scheme", ["dirichlet", "dirichlet:0", "dirichlet:-1", "dirichlet:abc", "noniid", "", 3])
def test_bad_scheme(scheme):
    with pytest.raises(ConfigError, match="scheme"):
        partition(100, np.zeros(100), 2, scheme)


def test_partition_bad_inputs():
    with pytest.raises(ConfigError, match="^y=None"):
        partition(100, None, 2, "label")
    with pytest.raises(ConfigError, match="n_sites"):
        partition(100, None, 0, "iid")
    with pytest.raises(ConfigError, match="n_sites"):
        partition(5, None, 3, "iid")
    with pytest.raises(ConfigError, match="y="):
        partition(10, np.zeros(9), 2, "label")
    with pytest.raises(ConfigError, match="n_sites"):  # class of 3 records split over 2 sites
        partition(6, np.array([0, 0, 0, 1, 1, 1]), 4, "label")


# ----------------------------------------------------------------------------- check_sites


def test_check_sites_ok_returns_float_copies():
    a = np.arange(6, dtype=np.int32).reshape(3, 2)
    out = check_sites([a, np.ones((2, 2))])
    assert out[0].dtype == np.float64 and out[0].flags.c_contiguous and out[0] is not a
    out[0][0, 0] = 99
    assert a[0, 0] == 0


@pytest.mark.parametrize(
    "sites,match",
    [
        ([], r"^sites=\[\]"),
        (np.ones((3, 2)), "^sites="),
        ([np.ones((3, 2)), np.ones(3)], r"^sites\[1\]=.*2-D"),
        ([np.ones((3, 2)), np.ones((3, 3))], r"^sites\[1\]=.*same features"),
        (
            [np.ones((3, 2)), np.ones((3, 2)), np.ones((3, 2)), np.ones((1, 2))],
            r"^sites\[3\]='<1 records>'.*at least 2",
        ),
        ([np.ones((3, 2)), np.array([[1.0, np.nan], [0, 0]])], r"^sites\[1\]=.*impute"),
        ([np.array([["a", "b"], ["c", "d"]])], r"^sites\[0\]=.*numeric"),
    ],
)
def test_check_sites_errors(sites, match):
    with pytest.raises(DataError, match=match):
        check_sites(sites)


def test_check_sites_min_records():
    with pytest.raises(DataError, match="at least 5"):
        check_sites([np.ones((4, 2))], min_records=5)


# ----------------------------------------------------------------------------- per-site files, ids, AnnData

from securefed.data import SiteData, feature_scale_warning, load_sites, standardize  # noqa: E402


def _csv(path, header, rows):
    path.write_text(",".join(header) + "\n" + "\n".join(",".join(str(v) for v in r) for r in rows) + "\n")
    return path


@pytest.fixture
def site_dir(tmp_path):
    d = tmp_path / "sites"
    d.mkdir()
    rng = np.random.default_rng(0)
    for name, kinds in (("b_hospital", ["dog", "cat", "dog"]), ("a_hospital", ["cat", "cat", "emu", "cat"])):
        rows = [[f"{name[0]}-{i:03d}", *np.round(rng.normal(size=2), 4), k] for i, k in enumerate(kinds)]
        _csv(d / f"{name}.csv", ["record", "f1", "f2", "kind"], rows)
    (d / "notes.txt").write_text("ignored")
    return d


def test_load_sites_directory_names_ids_and_one_label_mapping(site_dir):
    sites = load_sites(site_dir, label_column="kind", id_column="record")
    assert [s.name for s in sites] == ["a_hospital", "b_hospital"] and all(isinstance(s, SiteData) for s in sites)
    a, b = sites
    assert a.ids == ("a-000", "a-001", "a-002", "a-003") and b.ids == ("b-000", "b-001", "b-002")
    assert a.feature_names == ("f1", "f2") and a.X.shape == (4, 2) and b.X.shape == (3, 2)
    assert a.target_names == b.target_names == ("cat", "dog", "emu")  # one mapping across sites
    np.testing.assert_array_equal(a.y, [0, 0, 2, 0])
    np.testing.assert_array_equal(b.y, [1, 0, 1])
    # the same sites from a glob and from a list of paths
    g = load_sites(str(site_dir / "*.csv"), label_column="kind", id_column="record")
    lst = load_sites(
        [site_dir / "b_hospital.csv", str(site_dir / "a_hospital.csv")], label_column="kind", id_column="record"
    )
    for other in (g, lst):
        assert [s.name for s in other] == ["a_hospital", "b_hospital"]
        assert all(np.array_equal(x.X, y.X) and x.ids == y.ids for x, y in zip(sites, other))


def test_load_sites_errors_name_the_parameter(tmp_path, site_dir):
    with pytest.raises(DataError, match=r"^spec=.*no such file"):
        load_sites(tmp_path / "nope.csv")
    with pytest.raises(DataError, match=r"^spec=.*matches no files"):
        load_sites(str(tmp_path / "*.csv"))
    with pytest.raises(DataError, match=r"^spec=\[\]"):
        load_sites([])
    (tmp_path / "x").mkdir()
    _csv(tmp_path / "x" / "a_hospital.csv", ["record", "f1", "f2", "kind"], [["z", 1, 2, "cat"], ["y", 3, 4, "dog"]])
    with pytest.raises(DataError, match=r"^spec=.*site name 'a_hospital'.*distinct"):
        load_sites([site_dir, tmp_path / "x" / "a_hospital.csv"], label_column="kind", id_column="record")
    # the same feature columns in another order are matched by name; other names are refused, naming them
    _csv(tmp_path / "p.csv", ["age", "weight", "height"], [[1, 2, 3], [4, 5, 6]])
    _csv(tmp_path / "q.csv", ["age", "height", "weight"], [[1, 2, 3], [4, 5, 6]])
    p, q = load_sites([tmp_path / "p.csv", tmp_path / "q.csv"])
    assert q.feature_names == p.feature_names and q.X.tolist() == [[1, 3, 2], [4, 6, 5]]
    _csv(tmp_path / "q.csv", ["age", "height", "mass"], [[1, 2, 3], [4, 5, 6]])
    with pytest.raises(
        DataError,
        match=r"^spec=.*site 'q' \(q.csv\) does not have the feature columns of site 'p' "
        r"\(p.csv\): missing \['weight'\]; extra \['mass'\]",
    ):
        load_sites([tmp_path / "p.csv", tmp_path / "q.csv"])
    # an empty site, a 1-record site
    (tmp_path / "e").mkdir()
    _csv(tmp_path / "e" / "full.csv", ["u", "v"], [[1, 2], [3, 4]])
    (tmp_path / "e" / "empty.csv").write_text("u,v\n")
    with pytest.raises(DataError, match=r"^spec=.*empty\.csv.*no data rows"):
        load_sites(tmp_path / "e")
    _csv(tmp_path / "e" / "empty.csv", ["u", "v"], [[5, 6]])
    with pytest.raises(DataError, match=r"site 'empty' holds 1 record.*at least 2"):
        load_sites(tmp_path / "e")
    # unreadable file, NaN with its row
    (tmp_path / "junk.npy").write_bytes(b"\x00\x01 not numpy")
    with pytest.raises(DataError, match=r"^spec=.*junk\.npy"):
        load_sites(tmp_path / "junk.npy")
    _csv(tmp_path / "n.csv", ["u", "v"], [[1, 2], [3, "nan"], [5, 6]])
    with pytest.raises(DataError, match=r"first at CSV line 3, column 'v'.*impute"):
        load_sites(tmp_path / "n.csv")
    with pytest.raises(DataError, match=r"^id_column='nope'.*columns present"):
        load_sites(site_dir, id_column="nope", label_column="kind")
    with pytest.raises(DataError, match=r"^layer="):
        load_sites(site_dir, layer="X_pca")


@pytest.mark.parametrize(
    "header,values",
    [
        ("patient_id", [101, 102, 103, 104, 105]),  # header says id
        ("ID", [7, 3, 9, 1, 4]),
        ("PatientID", [7, 3, 9, 1, 4]),
        ("", [0, 1, 2, 3, 4]),  # pandas' unnamed index
        ("x0", [0, 1, 2, 3, 4]),  # values 0..n-1
        ("x0", [5, 3, 1, 2, 4]),  # a permutation of 1..n
    ],
)
def test_an_id_column_never_becomes_a_feature(tmp_path, header, values):
    rows = [[v, float(i) * 0.37 + 1, (i * 7) % 5 + 0.5] for i, v in enumerate(values)]
    p = _csv(tmp_path / "s.csv", [header, "f1", "f2"], rows)
    for load in (lambda **kw: load_sites(p, **kw), lambda **kw: load_dataset(p, **kw)):
        with pytest.raises(DataError) as e:
            load()
        msg = str(e.value)
        assert msg.startswith("id_column=None") and f"--id-column {header}" in msg and f"--keep-column {header}" in msg
        kept = load(id_column=header)
        X = kept[0].X if isinstance(kept, list) else kept.X
        ids = kept[0].ids if isinstance(kept, list) else kept.ids
        assert X.shape == (5, 2) and ids == tuple(str(v) for v in values)  # out of the features, ids kept
        deliberate = load(allow_id_like=[header])
        X = deliberate[0].X if isinstance(deliberate, list) else deliberate.X
        assert X.shape == (5, 3)  # kept as a feature only when asked


def test_string_id_column_and_ordinary_features_pass(tmp_path):
    p = _csv(
        tmp_path / "s.csv",
        ["mrn", "age", "paid", "lipid"],
        [["A7", 31, 1, 0.5], ["B2", 45, 0, 0.7], ["C9", 38, 1, 0.2]],
    )
    with pytest.raises(DataError, match="id_column"):  # a string column: the error says how to pass it as ids
        load_dataset(p)
    ds = load_dataset(p, id_column="mrn")
    assert ds.ids == ("A7", "B2", "C9") and ds.feature_names == ("age", "paid", "lipid")
    _csv(tmp_path / "d.csv", ["id", "f"], [["a", 1], ["a", 2]])
    with pytest.raises(DataError, match=r"^id_column='a'.*twice"):
        load_dataset(tmp_path / "d.csv", id_column="id")
    # an npy whose first column is a row index is refused too; allow_id_like keeps it by position
    X = np.column_stack([np.arange(10.0), np.random.default_rng(0).normal(size=(10, 2))])
    np.save(tmp_path / "i.npy", X)
    with pytest.raises(DataError, match="column '0'.*looks like a record id"):
        load_dataset(tmp_path / "i.npy")
    assert load_dataset(tmp_path / "i.npy", allow_id_like=[0]).X.shape == (10, 3)


def test_npz_sites_with_ids_and_labels(tmp_path):
    rng = np.random.default_rng(1)
    for name in ("s1", "s2"):
        np.savez(
            tmp_path / f"{name}.npz",
            X=rng.normal(size=(4, 3)),
            y=np.array(["u", "v", "u", "w"]),
            ids=np.array([f"{name}-{i}" for i in range(4)]),
        )
    sites = load_sites(tmp_path)
    assert sites[1].ids == ("s2-0", "s2-1", "s2-2", "s2-3") and sites[0].target_names == ("u", "v", "w")


def _adata(n, rng, sparse=True):
    import anndata
    import pandas as pd
    import scipy.sparse as sp

    X = rng.poisson(2.0, size=(n, 6)).astype(np.float32)
    obs = pd.DataFrame(
        {
            "cell_type": pd.Categorical(rng.choice(["B", "T", "NK"], n)),
            "barcode": [f"bc{i:04d}" for i in rng.permutation(n)],
        },
        index=[f"cell-{i}" for i in rng.permutation(10 * n)[:n]],
    )
    ad = anndata.AnnData(
        X=sp.csr_matrix(X) if sparse else X, obs=obs, var=pd.DataFrame(index=[f"gene{j}" for j in range(6)])
    )
    ad.obsm["X_pca"] = rng.normal(size=(n, 3))
    return ad


def test_h5ad_sites_x_obsm_labels_ids(tmp_path):
    pytest.importorskip("anndata")
    rng = np.random.default_rng(2)
    ads = {"hosp_a": _adata(7, rng), "hosp_b": _adata(5, rng, sparse=False)}
    for k, ad in ads.items():
        ad.write_h5ad(tmp_path / f"{k}.h5ad")
    sites = load_sites(tmp_path, label_column="cell_type")
    for s in sites:
        ad = ads[s.name]
        assert s.ids == tuple(ad.obs_names) and s.feature_names == tuple(ad.var_names) and s.X.dtype == np.float64
        np.testing.assert_array_equal(s.X, np.asarray(ad.X.todense() if hasattr(ad.X, "todense") else ad.X))
        assert [s.target_names[c] for c in s.y] == list(ad.obs["cell_type"].astype(str))
    pca = load_sites(tmp_path, layer="X_pca", id_column="barcode")
    assert pca[0].X.shape == (7, 3) and pca[0].ids == tuple(ads["hosp_a"].obs["barcode"]) and pca[0].y is None
    with pytest.raises(DataError, match=r"^layer='X_umap'.*obsm keys: \['X_pca'\]"):
        load_sites(tmp_path, layer="X_umap")
    with pytest.raises(DataError, match=r"^label_column='celltype'.*obs columns"):
        load_sites(tmp_path, label_column="celltype")
    ds = load_dataset(tmp_path / "hosp_b.h5ad", label_column="cell_type")
    assert ds.X.shape == (5, 6) and ds.ids == tuple(ads["hosp_b"].obs_names)


def test_h5ad_without_anndata_is_a_typed_error(tmp_path, monkeypatch):
    import sys

    (tmp_path / "a.h5ad").write_bytes(b"")
    monkeypatch.setitem(sys.modules, "anndata", None)
    with pytest.raises(DataError, match=r"pip install 'securefed\[anndata\]'"):
        load_sites(tmp_path / "a.h5ad")


def test_feature_scale_warning_and_standardize():
    ds = load_dataset("breast_cancer")
    parts = partition(ds.X, ds.y, 3, "iid", random_state=0)
    msg = feature_scale_warning([ds.X[p] for p in parts])
    assert msg is not None and "--standardize" in msg and "\n" not in msg
    mean, std = ds.X.mean(axis=0), ds.X.std(axis=0)
    Z = [standardize(ds.X[p], mean, std) for p in parts]
    assert feature_scale_warning(Z) is None
    np.testing.assert_allclose(np.vstack(Z).std(axis=0), 1.0, atol=1e-12)
    const = standardize(np.array([[1.0, 5.0], [3.0, 5.0]]), [2.0, 5.0], [1.0, 0.0])
    np.testing.assert_array_equal(const, [[-1.0, 0.0], [1.0, 0.0]])
    with pytest.raises(DataError, match=r"^std="):
        standardize(np.ones((2, 2)), [0, 0], [1.0])
    site = SiteData("a", ds.X, None, None, ds.feature_names, None, "a")
    assert "'worst area'" in feature_scale_warning([site])


# ----------------------------------------------------------------------------- Fashion-MNIST (Debian package files)


def _write_idx(path, arr: np.ndarray) -> None:
    """An idx file as LeCun's format defines it, written here independently of the loader (gzip, big-endian sizes)."""
    import gzip
    import struct

    header = bytes([0, 0, 0x08, arr.ndim]) + b"".join(struct.pack(">I", d) for d in arr.shape)
    with gzip.open(path, "wb") as fh:
        fh.write(header + np.ascontiguousarray(arr, dtype=np.uint8).tobytes())


def _fake_fashion(folder, n_train=30, n_test=12, side=4, seed=0):
    rng = np.random.default_rng(seed)
    parts = {}
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        X = rng.integers(0, 256, size=(n, side, side), dtype=np.uint8)
        y = rng.integers(0, 10, size=n, dtype=np.uint8)
        _write_idx(folder / f"{prefix}-images-idx3-ubyte.gz", X)
        _write_idx(folder / f"{prefix}-labels-idx1-ubyte.gz", y)
        parts[prefix] = (X, y)
    return parts


def test_fashion_mnist_reads_the_package_layout(tmp_path, monkeypatch):
    from securefed import data

    parts = _fake_fashion(tmp_path)
    monkeypatch.setattr(data, "FASHION_MNIST_DIR", str(tmp_path))
    ds = load_dataset("fashion-mnist")
    (Xa, ya), (Xb, yb) = parts["train"], parts["t10k"]
    # train first, then the test images, each image flattened row by row, pixel values unscaled
    np.testing.assert_array_equal(ds.X, np.vstack([Xa.reshape(30, 16), Xb.reshape(12, 16)]).astype(np.float64))
    np.testing.assert_array_equal(ds.y, np.concatenate([ya, yb]))
    assert ds.X.dtype == np.float64 and ds.y.dtype == np.int64 and ds.name == "fashion-mnist"
    assert len(ds.target_names) == 10 and ds.target_names[0] == "T-shirt/top"


def test_fashion_mnist_subsets_are_seeded_and_nested_in_file_order(tmp_path, monkeypatch):
    from securefed import data

    _fake_fashion(tmp_path, n_train=60, n_test=20)
    monkeypatch.setattr(data, "FASHION_MNIST_DIR", str(tmp_path))
    monkeypatch.setattr(data, "_FASHION_SUBSETS", {"fashion-mnist-5k": 10, "fashion-mnist-20k": 25})
    full = load_dataset("fashion-mnist")
    a, b = load_dataset("fashion-mnist-5k"), load_dataset("fashion-mnist-5k")
    np.testing.assert_array_equal(a.X, b.X)  # the same records every time: a public, seeded choice
    assert a.X.shape == (10, 16) and load_dataset("fashion-mnist-20k").X.shape == (25, 16)
    rows = {r.tobytes(): i for i, r in enumerate(full.X)}
    idx = [rows[r.tobytes()] for r in a.X]
    assert idx == sorted(idx) and len(set(idx)) == 10  # distinct records of the full set, in file order
    np.testing.assert_array_equal(a.y, full.y[idx])


def test_fashion_mnist_absent_names_the_debian_package(tmp_path, monkeypatch):
    from securefed import data

    monkeypatch.setattr(data, "FASHION_MNIST_DIR", str(tmp_path / "nowhere"))
    for name in ("fashion-mnist", "fashion-mnist-20k"):
        with pytest.raises(ConfigError) as e:
            load_dataset(name)
        msg = str(e.value)
        assert "apt-get install dataset-fashion-mnist" in msg and name in msg and "\n" not in msg


def test_fashion_mnist_corrupt_file_is_a_data_error(tmp_path, monkeypatch):
    import gzip

    from securefed import data

    _fake_fashion(tmp_path)
    with gzip.open(tmp_path / "t10k-labels-idx1-ubyte.gz", "wb") as fh:
        fh.write(bytes([0, 0, 8, 1, 0, 0, 0, 99]) + bytes(5))  # announces 99 labels, holds 5
    monkeypatch.setattr(data, "FASHION_MNIST_DIR", str(tmp_path))
    with pytest.raises(DataError, match="reinstall"):
        load_dataset("fashion-mnist")


@pytest.mark.skipif(
    not __import__("os").path.isfile("/usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz"),
    reason="the Debian package dataset-fashion-mnist is not installed",
)
def test_fashion_mnist_real_package_files():
    ds = load_dataset("fashion-mnist-5k")
    assert ds.X.shape == (5000, 784) and ds.X.min() == 0 and ds.X.max() == 255
    assert set(np.unique(ds.y)) == set(range(10))
    from securefed.data import read_idx

    y = np.concatenate(
        [
            read_idx("/usr/share/datasets/fashion-mnist/train-labels-idx1-ubyte.gz"),
            read_idx("/usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz"),
        ]
    )
    assert len(y) == 70_000 and np.all(np.bincount(y) == 7_000)  # the published class balance
