"""Tests for securefed.data: loaders, partitioners, site validation, typed errors."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from securefed.data import BUILTIN_DATASETS, Dataset, check_sites, load_dataset, partition
from securefed.errors import ConfigError, DataError


# ----------------------------------------------------------------------------- loaders

@pytest.mark.parametrize("name,shape,k", [("digits", (1797, 64), 10), ("iris", (150, 4), 3),
                                          ("wine", (178, 13), 3), ("breast_cancer", (569, 30), 2)])
def test_builtins(name, shape, k):
    ds = load_dataset(name)
    assert isinstance(ds, Dataset) and ds.X.shape == shape and ds.X.dtype == np.float64
    assert ds.y.dtype == np.int64 and len(np.unique(ds.y)) == k and ds.name == name
    with pytest.raises(Exception):
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


@pytest.mark.parametrize("sites,match", [
    ([], r"^sites=\[\]"),
    (np.ones((3, 2)), "^sites="),
    ([np.ones((3, 2)), np.ones(3)], r"^sites\[1\]=.*2-D"),
    ([np.ones((3, 2)), np.ones((3, 3))], r"^sites\[1\]=.*same features"),
    ([np.ones((3, 2)), np.ones((3, 2)), np.ones((3, 2)), np.ones((1, 2))], r"^sites\[3\]='<1 records>'.*at least 2"),
    ([np.ones((3, 2)), np.array([[1.0, np.nan], [0, 0]])], r"^sites\[1\]=.*impute"),
    ([np.array([["a", "b"], ["c", "d"]])], r"^sites\[0\]=.*numeric"),
])
def test_check_sites_errors(sites, match):
    with pytest.raises(DataError, match=match):
        check_sites(sites)


def test_check_sites_min_records():
    with pytest.raises(DataError, match="at least 5"):
        check_sites([np.ones((4, 2))], min_records=5)
