"""The privacy report a compliance officer files (``report.json``, validated against its JSON Schema, and
``report.html``, summary in plain words first), built from a run folder (``securefed audit RUN_DIR``); the
joinable exports (``embedding.csv`` / ``.parquet``, AnnData ``obsm``) and the run's ``embedding.png``."""

from .build import (
    SCHEMA_VERSION,
    build_report,
    load_schema,
    validate_report,
    what_leaves,
    write_audit_files,
    write_report,
)
from .exports import obsm_key, to_anndata_obsm, write_embedding_table, write_h5ad_with_embedding
from .plots import Panel, plot_run, standard_panels

__all__ = [
    "SCHEMA_VERSION",
    "build_report",
    "load_schema",
    "validate_report",
    "what_leaves",
    "write_audit_files",
    "write_report",
    "write_embedding_table",
    "to_anndata_obsm",
    "write_h5ad_with_embedding",
    "obsm_key",
    "Panel",
    "plot_run",
    "standard_panels",
]
