"""What a federated run produced (:class:`RunResult`), whichever driver moved its messages."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

__all__ = ["RunResult"]


@dataclass
class RunResult:
    """The outcome of one :class:`~securefed.federation.coordinator.Coordinator` run.

    Attributes
    ----------
    landmarks : ndarray (n_y, d)
        The landmarks, in ``landmark_space`` (the records' own features for FedDL; a PCA or public basis otherwise).
    landmark_space : LandmarkSpace
    masses : ndarray or None
        Records per landmark (cells: exact pooled counts; billboard: noisy counts), None for FedDL.
    landmark_info : dict
        The landmark stage's figures (method, rounds, cells, basis, σ of the DP releases …).
    gamma, lr : float
        FedDL's kernel bandwidth and step size.
    rule : str
    rounds_done : int
    mmd_history : list of float
        Weighted MMD of the landmarks each round started from, ``Y^0 … Y^{S−1}`` (each site reports it with its
        upload, so it costs no extra sum; empty unless monitored, never under DP by default).
    run_id : str
        The privacy ledgers' run id.
    sites, site_sizes, holdouts : lists
        Site names in site order, their FedDL record counts and audit hold-out counts.
    n_features : int
    released : list of str
        Every data-dependent release of the run (the ``what`` of :attr:`inventory`).
    inventory : list of dict
        Every data-dependent release: ``what``, ``to`` (who receives it), ``covered_by_epsilon`` (False, or how),
        ``note``.
    warnings : list of str
    privacy : dict or None
        The DP block (ε spent, σ and Δ per site, releases, ...).
    audit : dict or None
        The audit gate's decision (``verdict``, ``auc``, ``empirical_epsilon``, ``mia``, ``mia_result``).
    embedding : dict or None
        ``method``, ``nystrom``, ``coordinates`` (or ``labels``) ``{site name: array}`` in each site's record order,
        ``landmark_embedding`` / ``landmark_labels`` (no-rows mode), ``rows`` (rows mode with ``keep_rows``),
        ``reconstruction``, ``sent_kind``, ``missing``.
    survivors : list of int
        Sites still live at the end.
    steps : list of dict
        One entry per secure sum: survivors, clipping, bytes to and from each site, protocol details.
    readmitted, site_errors
        Re-admitted restarted sites; each dropped site's typed error or silence.
    seconds : float
    round_trips, messages : int
        Request/reply exchanges of the run, and individual messages (one per site per exchange).
    aggregation : dict
        Totals over the secure sums (protocol, count, clipped coordinates, bytes).
    site_outputs : dict
        In-process runs only: what each site kept on its own side (``coordinates keep``) — collected here because
        this process simulates the sites; in a deployment it never leaves them.
    identity_fingerprints : dict
        ``{site name: SHA-256 prefix of the identity key the coordinator relayed}`` (compare out of band with each
        site's own, which its SuperNode logs).
    """

    landmarks: np.ndarray
    landmark_space: object
    masses: np.ndarray | None
    gamma: float
    lr: float
    rule: str
    rounds_done: int
    mmd_history: list
    run_id: str
    sites: list
    site_sizes: list
    holdouts: list
    n_features: int
    released: list = field(default_factory=list)
    inventory: list = field(default_factory=list)
    warnings: list = field(default_factory=list)
    privacy: dict | None = None
    audit: dict | None = None
    landmark_info: dict = field(default_factory=dict)
    site_outputs: dict = field(default_factory=dict)
    embedding: dict | None = None
    survivors: list = field(default_factory=list)
    steps: list = field(default_factory=list)
    readmitted: list = field(default_factory=list)
    site_errors: dict = field(default_factory=dict)
    seconds: float = 0.0
    round_trips: int = 0
    messages: int = 0
    aggregation: dict = field(default_factory=dict)
    identity_fingerprints: dict = field(default_factory=dict)
    guarantee: dict = field(default_factory=dict)

    def round_trips_per_stage(self) -> dict:
        """Request/reply round trips by stage: each secure sum's (grouped by its label up to the first digit or
        colon), and the rest (hello, re-admission, the embedding requests)."""
        import re

        out: dict = {}
        for st in self.steps:
            key = re.split(r"[:\d]", st["label"], maxsplit=1)[0].strip() or st["label"]
            out[key] = out.get(key, 0) + int(st.get("round_trips", 0))
        out["hello, embedding and the rest"] = int(self.round_trips) - sum(out.values())
        return out

    def stacked(self, key: str = "coordinates") -> np.ndarray | None:
        """The per-site embedding arrays (``coordinates`` or ``labels``) stacked in site order."""
        if self.embedding is None:
            return None
        if key not in self.embedding:
            kept = self.embedding.get("kept_on_sites")
            if (
                not kept
                or not self.site_outputs
                or key != ("labels" if self.embedding.get("method") == "spectral" else "coordinates")
            ):
                return None
            parts = self.site_outputs  # coordinates keep: each site's own result (the in-process simulation holds all)
        else:
            parts = self.embedding[key]
        return np.concatenate([np.asarray(parts[name]) for name in self.sites if name in parts])
