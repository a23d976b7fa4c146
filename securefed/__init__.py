"""securefed — federated t-SNE / UMAP / spectral clustering with secure aggregation, DP and audits.

Public API (see README.md): the estimators, FedDL, data and metrics helpers, the secure aggregators, the
accounting layer and the audits. The names are imported on first use (PEP 562), so ``import securefed`` — and a
Flower ClientApp process that imports one submodule — does not pay for scikit-learn, openTSNE or torch.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_EXPORTS = {
    "estimators": (
        "FedTSNE",
        "FedUMAP",
        "FedSpectralClustering",
        "CentralizedTSNE",
        "CentralizedUMAP",
        "CentralizedSpectralClustering",
    ),
    "landmarks": ("fed_dl", "FedDLResult", "mmd", "mmd_grad"),
    "data": ("load_dataset", "partition", "check_sites", "Dataset"),
    "metrics": ("embedding_metrics", "clustering_metrics"),
    "securesum.base": ("Aggregator", "AggregateResult", "PlainAggregator", "make_aggregator"),
    "securesum": ("SecAggAggregator", "CKKSAggregator", "simulate"),
    "accounting": (
        "GradientPerturbation",
        "DataPerturbation",
        "PrivacyLedger",
        "gradient_sensitivity",
        "calibrate_noise_multiplier",
        "epsilon_from_noise",
    ),
    "audits": ("AuditPolicy", "audit_gate", "membership_audit"),
    "report": ("write_report",),
    "peers": ("FedDSNE", "DistributedGTM", "CentralizedGTM", "PEER_METHODS"),
    "plan": ("RunPlan",),
    "federation": ("run_in_process", "Coordinator", "SiteWorker"),
    "errors": (
        "SecureFedError",
        "ConfigError",
        "DataError",
        "ProtocolError",
        "BudgetExceededError",
        "AuditFailedError",
    ),
}
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names}

__all__ = ["__version__", *_WHERE]


def __getattr__(name: str):
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'securefed' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
