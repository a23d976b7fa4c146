"""securefed — federated t-SNE / UMAP / spectral clustering with secure aggregation, DP and audits."""

__version__ = "0.1.0"
