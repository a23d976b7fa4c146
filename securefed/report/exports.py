"""Outputs users can join back to their records: one table of every site's coordinates (or cluster labels) with
the record ids, and the map written into each site's AnnData ``obsm`` the way scanpy keeps ``X_umap``.

``embedding.csv`` / ``embedding.parquet`` columns: ``site``, ``record_id``, ``x1 … xk`` (t-SNE / UMAP) or
``cluster`` (spectral clustering), and ``label`` when labels are known. Rows come site by site, each site's
records in its file order; ``record_id`` is the id from the site's file (``--id-column``, ``.h5ad`` ``obs_names``)
or, without ids, the record's 0-based row number in that file.
"""

from __future__ import annotations

import csv
import os
from typing import Mapping, Sequence

import numpy as np

from ..errors import ConfigError, DataError, bad_value

__all__ = [
    "OBSM_KEYS",
    "obsm_key",
    "embedding_rows",
    "write_embedding_table",
    "to_anndata_obsm",
    "write_h5ad_with_embedding",
]

#: the ``obsm`` key of each federated map (scanpy names its own ``X_tsne`` / ``X_umap``)
OBSM_KEYS = {"tsne": "X_fedtsne", "umap": "X_fedumap"}
#: the ``obs`` column of federated spectral-clustering labels (scanpy's clusterings are ``obs`` columns too)
OBS_CLUSTER_KEY = "fedspectral"


def obsm_key(method: str) -> str:
    """``"tsne"`` → ``"X_fedtsne"``, ``"umap"`` → ``"X_fedumap"``, ``"spectral"`` → ``"fedspectral"`` (an obs column)."""
    if method == "spectral":
        return OBS_CLUSTER_KEY
    if method not in OBSM_KEYS:
        raise ConfigError(bad_value("method", method, f"choose one of {sorted(OBSM_KEYS) + ['spectral']}"))
    return OBSM_KEYS[method]


def _per_site(name: str, d, sites, n: dict) -> dict:
    if d is None:
        return {}
    if not isinstance(d, Mapping):
        raise DataError(bad_value(name, f"<{type(d).__name__}>", "give a dict: site name → one value per record"))
    extra = [s for s in d if s not in n]
    if extra:
        raise DataError(bad_value(name, extra, f"these sites have no coordinates; sites: {sites}"))
    out = {}
    for s, v in d.items():
        v = list(v) if not isinstance(v, np.ndarray) else v
        if len(v) != n[s]:
            raise DataError(
                bad_value(f"{name}[{s!r}]", f"<{len(v)} values>", f"give one per record of site {s!r} ({n[s]})")
            )
        out[s] = v
    return out


def embedding_rows(
    coordinates: Mapping,
    ids: Mapping | None = None,
    labels: Mapping | None = None,
    *,
    label_names: Sequence[str] | None = None,
) -> tuple[list[str], list[list]]:
    """``(header, rows)`` of the joinable table (see the module docstring); validates every site's lengths."""
    if not isinstance(coordinates, Mapping) or not coordinates:
        raise DataError(
            bad_value(
                "coordinates",
                f"<{type(coordinates).__name__}>",
                "give a dict: site name → array of coordinates (n, k) or cluster labels (n,)",
            )
        )
    arrs, n = {}, {}
    for s, a in coordinates.items():
        a = np.asarray(a)
        if a.ndim not in (1, 2) or a.dtype.kind not in "iufb":
            raise DataError(
                bad_value(
                    f"coordinates[{s!r}]",
                    f"<array of shape {a.shape}, dtype {a.dtype}>",
                    "give numeric coordinates (n, k) or integer cluster labels (n,)",
                )
            )
        arrs[str(s)], n[str(s)] = a, len(a)
    dims = {a.shape[1] if a.ndim == 2 else 0 for a in arrs.values()}
    if len(dims) != 1:
        raise DataError(bad_value("coordinates", sorted(dims), "every site needs the same number of coordinates"))
    k = dims.pop()
    sites = list(arrs)
    ids_, labels_ = _per_site("ids", ids, sites, n), _per_site("labels", labels, sites, n)
    if labels is not None and len(labels_) != len(sites):
        raise DataError(bad_value("labels", sorted(labels_), f"give labels for every site or none; sites: {sites}"))
    header = (
        ["site", "record_id"] + ([f"x{j + 1}" for j in range(k)] if k else ["cluster"]) + (["label"] if labels_ else [])
    )
    rows = []
    for s in sites:
        a = arrs[s]
        rid = ids_.get(s)
        for i in range(n[s]):
            row: list = [s, str(rid[i]) if rid is not None else str(i)]
            row += [float(v) for v in a[i]] if k else [int(a[i])]
            if labels_:
                lab = labels_[s][i]
                if label_names is not None and isinstance(lab, (int, np.integer)) and 0 <= int(lab) < len(label_names):
                    lab = label_names[int(lab)]
                row.append(lab.item() if isinstance(lab, np.generic) else lab)
            rows.append(row)
    return header, rows


def write_embedding_table(
    path,
    coordinates: Mapping,
    ids: Mapping | None = None,
    labels: Mapping | None = None,
    format: str = "csv",
    *,
    label_names: Sequence[str] | None = None,
) -> str:
    """Write ``embedding.csv`` or ``embedding.parquet``: one row per record, joinable on ``(site, record_id)``.

    Parameters
    ----------
    path : path
        The file to write (its folder is created).
    coordinates : dict site name → array (n, k) of coordinates, or (n,) integer cluster labels
        In site order; each site's rows in its file order (``embedding.npz`` / ``labels.npz`` of the run folder).
    ids : dict site name → list of str, optional
        The record ids (``SiteData.ids``); without them ``record_id`` is the 0-based row number in the site's file.
    labels : dict site name → array, optional
        Known class labels; integer codes are written as ``label_names[code]`` when ``label_names`` is given.
    format : "csv" or "parquet"
        Parquet needs pandas with pyarrow (or fastparquet).

    Returns the path written. Raises :class:`DataError` on mismatched lengths and :class:`ConfigError` for an
    unknown format or a missing parquet engine.
    """
    if format not in ("csv", "parquet"):
        raise ConfigError(bad_value("format", format, "use 'csv' or 'parquet'"))
    header, rows = embedding_rows(coordinates, ids, labels, label_names=label_names)
    path = os.fspath(path)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp"
    if format == "parquet":
        engine = _parquet_engine()
        import pandas as pd

        pd.DataFrame(rows, columns=header).to_parquet(tmp, index=False, engine=engine)
    else:
        with open(tmp, "w", newline="", encoding="utf-8") as fh:
            w = csv.writer(fh)
            w.writerow(header)
            w.writerows([[repr(v) if isinstance(v, float) else v for v in r] for r in rows])
    os.replace(tmp, path)
    return path


def _parquet_engine() -> str:
    for engine in ("pyarrow", "fastparquet"):
        try:
            __import__(engine)
            return engine
        except ImportError:
            continue
    raise ConfigError(
        bad_value(
            "format",
            "parquet",
            "writing parquet needs pyarrow (pip install pyarrow) or fastparquet; or use format='csv'",
        )
    )


def _anndata():
    try:
        import anndata
    except ImportError:
        raise ConfigError(
            bad_value(
                "adata", None, "AnnData support needs the optional dependency anndata: pip install 'securefed[anndata]'"
            )
        ) from None
    return anndata


def to_anndata_obsm(adata, coords, key: str = "X_fedtsne", *, ids: Sequence[str] | None = None):
    """Write one site's federated map into its own AnnData object (in place; also returned).

    2-D ``coords`` (n_obs × k) go to ``adata.obsm[key]`` (``X_fedtsne`` / ``X_fedumap``, :func:`obsm_key`), so
    ``sc.pl.embedding(adata, basis="fedtsne")`` draws it; 1-D integer cluster labels go to the categorical
    ``adata.obs[key]`` (default key for them: ``fedspectral``). ``ids`` (the record ids the coordinates came with)
    are checked against ``adata.obs_names`` so a reordered object is refused rather than mislabelled.

    Raises :class:`DataError` when the row count or the ids do not match.
    """
    coords = np.asarray(coords)
    n_obs = int(adata.n_obs)
    if coords.ndim not in (1, 2) or len(coords) != n_obs:
        raise DataError(
            bad_value(
                "coords",
                f"<array of shape {coords.shape}>",
                f"give one row per observation of this site's AnnData ({n_obs}), in its obs order",
            )
        )
    if ids is not None:
        names = [str(v) for v in adata.obs_names]
        got = [str(v) for v in ids]
        if got != names:
            i = next((j for j in range(min(len(got), len(names))) if got[j] != names[j]), min(len(got), len(names)))
            raise DataError(
                bad_value(
                    "ids",
                    got[i] if i < len(got) else None,
                    f"the coordinates' record {i} is not observation {names[i] if i < len(names) else None!r}; "
                    "pass the AnnData the site's coordinates were computed from, in the same order",
                )
            )
    if coords.ndim == 2:
        if not key.startswith("X_"):
            raise ConfigError(
                bad_value("key", key, "obsm keys of embeddings start with 'X_' (scanpy), e.g. 'X_fedtsne'")
            )
        adata.obsm[key] = np.ascontiguousarray(coords, dtype=np.float64)
    else:
        import pandas as pd

        if key.startswith("X_"):  # an embedding's key given for cluster labels: scanpy keeps those in obs
            key = OBS_CLUSTER_KEY
        adata.obs[key] = pd.Categorical([str(int(v)) for v in coords])
    return adata


def write_h5ad_with_embedding(
    path_in, path_out, coords, key: str = "X_fedtsne", *, ids: Sequence[str] | None = None
) -> str:
    """Read a site's ``.h5ad``, add its federated map (:func:`to_anndata_obsm`) and write it to ``path_out``."""
    anndata = _anndata()
    try:
        adata = anndata.read_h5ad(os.fspath(path_in))
    except Exception as exc:  # h5py / anndata raise many kinds for a missing or broken file
        raise DataError(
            bad_value("path_in", os.fspath(path_in), f"cannot read it as .h5ad ({exc.__class__.__name__}: {exc})")
        ) from None
    to_anndata_obsm(adata, coords, key, ids=ids)
    path_out = os.fspath(path_out)
    os.makedirs(os.path.dirname(os.path.abspath(path_out)), exist_ok=True)
    adata.write_h5ad(path_out)
    return path_out
