"""The privacy report a compliance officer files: ``report.json`` (validated against its JSON Schema) and
``report.html``, built from a run folder (``securefed audit RUN_DIR``)."""

from .build import (SCHEMA_VERSION, build_report, load_schema, validate_report, what_leaves, write_audit_files,
                    write_report)

__all__ = ["SCHEMA_VERSION", "build_report", "load_schema", "validate_report", "what_leaves", "write_audit_files",
           "write_report"]
