"""securefed — federated t-SNE / UMAP / spectral clustering with secure aggregation, DP and audits.

Public API (see README.md): the estimators, FedDL, data and metrics helpers, the secure aggregators,
the accounting layer and the audits.
"""

__version__ = "0.1.0"

from .accounting import (
    DataPerturbation,
    GradientPerturbation,
    PrivacyLedger,
    calibrate_noise_multiplier,
    epsilon_from_noise,
    gradient_sensitivity,
)
from .securesum.base import AggregateResult, Aggregator, PlainAggregator, make_aggregator
from .audits import AuditPolicy, audit_gate, membership_audit
from .report import write_report
from .data import Dataset, check_sites, load_dataset, partition
from .errors import (
    AuditFailedError,
    BudgetExceededError,
    ConfigError,
    DataError,
    ProtocolError,
    SecureFedError,
)
from .estimators import (
    CentralizedSpectralClustering,
    CentralizedTSNE,
    CentralizedUMAP,
    FedSpectralClustering,
    FedTSNE,
    FedUMAP,
)
from .landmarks import FedDLResult, fed_dl, mmd, mmd_grad
from .metrics import clustering_metrics, embedding_metrics
from .peers import PEER_METHODS, CentralizedGTM, DistributedGTM, FedDSNE
from .securesum import CKKSAggregator, SecAggAggregator, simulate

__all__ = [
    "__version__",
    "FedTSNE", "FedUMAP", "FedSpectralClustering",
    "CentralizedTSNE", "CentralizedUMAP", "CentralizedSpectralClustering",
    "fed_dl", "FedDLResult", "mmd", "mmd_grad",
    "load_dataset", "partition", "check_sites", "Dataset",
    "embedding_metrics", "clustering_metrics",
    "Aggregator", "AggregateResult", "PlainAggregator", "make_aggregator",
    "SecAggAggregator", "CKKSAggregator", "simulate",
    "GradientPerturbation", "DataPerturbation", "PrivacyLedger", "gradient_sensitivity",
    "calibrate_noise_multiplier", "epsilon_from_noise",
    "AuditPolicy", "audit_gate", "membership_audit", "write_report",
    "FedDSNE", "DistributedGTM", "CentralizedGTM", "PEER_METHODS",
    "SecureFedError", "ConfigError", "DataError", "ProtocolError", "BudgetExceededError", "AuditFailedError",
]
