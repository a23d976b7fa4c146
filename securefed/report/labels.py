"""Human labels for every number the report shows, the glossary, and number formatting for a reader.

``report.json`` keeps the machine names (``auc``, ``tpr_at_fpr_1e2`` …) and carries :data:`LABELS` as its
``labels`` block; ``report.html`` shows only the labels. :func:`show` never prints ``None``: a missing figure is
"—" (or a reason such as "not measured").
"""

from __future__ import annotations

import math
import re

__all__ = [
    "LABELS",
    "GLOSSARY",
    "AGGREGATION_NAMES",
    "SENT_NAMES",
    "label",
    "show",
    "count",
    "percent",
    "points",
    "plain_release",
    "plain_failure",
    "PAPER",
]

#: the paper securefed implements, cited by title (the repository ships no copy of it)
PAPER = "Qiao, Ma & Fan, Federated t-SNE and UMAP for Distributed Data Visualization (AAAI 2025)"

AGGREGATION_NAMES = {
    "plain": "plain sums (the coordinator sees each site's update)",
    "secagg": "SecAgg+ (pairwise masks: the coordinator sees only the sum)",
    "ckks": "CKKS homomorphic encryption (the coordinator sees only the sum, never holds the key)",
    "unknown": "not recorded in the run folder",
}

#: what the sites sent in the embedding stage (``reconstruction.mode``), in words
SENT_NAMES = {
    "rows": "distance rows, one per record (the paper's rows mode)",
    "kernel_rows": "kernel rows, one per record (spectral clustering, rows mode)",
    "perturbed_rows": "rows of noised records (data perturbation)",
    "local": "no rows: each record's final position or cluster only",
}

_RELEASE_WORDS = (
    (" (hello)", ""),
    ("(secagg)", "(SecAgg+)"),
    ("(ckks)", "(CKKS)"),
    ("(plain)", "(plain sums)"),
    ("the landmarks and γ,", "the landmarks and the kernel bandwidth γ,"),
    ("one row of n_y per record", "one row of n_y values (one per landmark) per record"),
    ("yes (noise: local)", "Gaussian noise added on each site"),
    ("yes (noise: distributed)", "noise shared across sites, summed securely"),
)


def plain_release(text: str) -> str:
    """A release or note as the coordinator names it, without protocol jargon (``(hello)``, ``(secagg)``)."""
    out = str(text)
    for a, b in _RELEASE_WORDS:
        out = out.replace(a, b)
    return out


def plain_failure(text: str) -> str:
    """An audit-gate failure in words: ``membership AUC 0.625 > max_auc 0.600`` → ``…AUC 0.625 is above the limit 0.600``."""
    s = str(text)
    s = re.sub(r"membership AUC ([\d.]+) > max_auc ([\d.]+)", r"membership-attack AUC \1 is above the limit \2", s)
    s = re.sub(
        r"empirical epsilon lower bound ([\d.]+) > max_empirical_epsilon ([\d.]+)",
        r"the attack proves ε ≥ \1, above the limit \2",
        s,
    )
    return s.replace("epsilon", "ε")


LABELS = {
    # quality of the map
    "ca_1nn": "class agreement of the 1 nearest neighbour (CA-1NN)",
    "ca_5nn": "class agreement of the 5 nearest neighbours (CA-5NN)",
    "ca_10nn": "class agreement of the 10 nearest neighbours (CA-10NN)",
    "ca_20nn": "class agreement of the 20 nearest neighbours (CA-20NN)",
    "ca_50nn": "class agreement of the 50 nearest neighbours (CA-50NN)",
    "npa_1nn": "neighbours kept from the records, 1 nearest (NPA-1NN)",
    "npa_5nn": "neighbours kept from the records, 5 nearest (NPA-5NN)",
    "npa_10nn": "neighbours kept from the records, 10 nearest (NPA-10NN)",
    "npa_20nn": "neighbours kept from the records, 20 nearest (NPA-20NN)",
    "npa_50nn": "neighbours kept from the records, 50 nearest (NPA-50NN)",
    "trustworthiness": "trustworthiness (map neighbours that are true neighbours)",
    "nmi": "normalised mutual information with the labels (NMI)",
    "ari": "adjusted Rand index with the labels (ARI)",
    "sc": "silhouette of the classes on the map",
    # membership inference
    "auc": "membership-attack AUC (0.5 = coin toss)",
    "auc_se": "standard error of the membership-attack AUC",
    "tpr_at_fpr_1e2": "members found at 1 % false alarms (TPR at 1 % FPR)",
    "tpr_at_fpr_1e3": "members found at 0.1 % false alarms (TPR at 0.1 % FPR)",
    "threshold": "attack threshold",
    "direction": "attack direction",
    "empirical_epsilon": "ε the attack proves at least (empirical lower bound)",
    "empirical_mu": "μ the attack proves at least (Gaussian-DP lower bound)",
    "epsilon_lb": "ε lower bound",
    "mu_lb": "μ lower bound",
    "confidence": "confidence of the lower bounds",
    "best_score": "best attack score",
    "n_members": "records used to fit the landmarks (members)",
    "n_nonmembers": "held-out records (non-members)",
    "n_sites": "sites",
    "claimed_epsilon": "ε claimed by the run",
    # reconstruction
    "mode": "what the sites sent",
    "attack": "attack used",
    "n_landmarks": "landmarks",
    "n_features": "features per record",
    "n_records": "records",
    "n_zero_norm_records": "records that are all zeros (left out of relative errors)",
    "median_relative_error": "median relative reconstruction error",
    "mean_relative_error": "mean relative reconstruction error",
    "min_relative_error": "smallest relative reconstruction error",
    "p10_relative_error": "10th percentile of the relative error",
    "p90_relative_error": "90th percentile of the relative error",
    "fraction_within_5pct": "records rebuilt to within 5 %",
    "fraction_within_10pct": "records rebuilt to within 10 %",
    "fraction_within_25pct": "records rebuilt to within 25 %",
    "baseline_median_relative_error": "median error of guessing the mean record (baseline)",
    # privacy budget
    "epsilon": "ε spent (the accountant's)",
    "delta": "δ",
    "accountant": "privacy accountant",
    "epsilon_target": "ε asked for",
    "budget_epsilon": "ε budget",
    "epsilon_paper_bound": "ε by the paper's formula (not a bound)",
    "epsilon_paper_formula": "ε by the paper's formula (not a bound)",
    "epsilon_paper_recipe": "ε the paper's noise recipe would claim (not a bound)",
    "paper_formula_below_true_epsilon": "the paper's formula is below the true ε",
    "noise_multiplier": "noise multiplier z (σ / Δ)",
    "sensitivity": "sensitivity Δ of one release",
    "sensitivity_rule": "how Δ was bounded",
    "adjacency": "neighbouring data sets differ by",
    "releases": "noisy releases made",
    "releases_planned": "noisy releases planned",
    "clipped_records": "records clipped to the norm bound τ_X",
    "tau_x": "record norm bound τ_X",
    "tau_y": "landmark norm bound τ_Y",
    "upsilon": "Υ = τ_X + τ_Y",
    "landmark_radius": "landmark radius",
    "gamma": "kernel bandwidth γ",
    "sample_rate": "share of records sampled per step",
    "noise": "where the noise is added",
    "min_survivors": "fewest sites a noisy sum needs",
    "secure_sum": "secure sum of the noise",
    "noise_source": "source of the noise",
    "epsilon_void": "ε is void",
    "noise_share": "noise per site",
    "ledger": "privacy ledger file",
    "ledger_recovered": "ledger recovered after a crash",
    "ledger_sites": "site ledgers",
    "clipped_note": "where clipped records were counted",
    "epsilon_by_round": "ε after each round",
    "epsilon_per_site": "ε spent per site",
    "sigma_per_site": "noise σ per site",
    "sensitivity_per_site": "sensitivity Δ per site",
    "clipped_per_site": "clipped records per site",
    # per-site table
    "site": "site",
    "records": "records",
    "held_out": "held out of the landmarks (audit)",
    "clipped": "records clipped to τ_X",
    "epsilon_spent": "ε spent",
    "site_ledger_releases": "noisy releases in the site's own ledger",
    "bytes_sent": "bytes sent",
    # utility table
    "federated": "federated",
    "centralized": "centralized (pooled records)",
    "gap_points": "gap (points)",
    # timings
    "federated_total": "federated run (s)",
    "coordinator": "coordinator (s)",
    "centralized_time": "centralized baseline (s)",
    "total": "whole job (s)",
    # inventory
    "what": "what",
    "to": "received by",
    "covered_by_epsilon": "covered by ε",
    "note": "note",
}


def label(key: str) -> str:
    """The human label of a machine name (falls back to the name with spaces)."""
    return LABELS.get(key, str(key).replace("_", " "))


GLOSSARY = [
    ("Site", "A party (e.g. a hospital) that holds records and never pools them."),
    ("Coordinator", "Runs the rounds; honest-but-curious: follows the protocol but may study everything it receives."),
    (
        "Landmarks",
        "Synthetic points FedDL fits so that their distribution matches all sites' records (MMD); the shared "
        "map is drawn through them.",
    ),
    ("MMD", "Maximum mean discrepancy: a kernel distance between two sets of points; FedDL minimises it per round."),
    (
        "Embedding stage",
        "How records are placed on the map: the paper's rows mode sends one row of distances per record; "
        "the no-rows mode lets each site place its own records against the landmarks.",
    ),
    (
        "Distance / kernel row",
        "For one record, its distances (or kernel values) to the landmarks; the rows mode sends one per record.",
    ),
    (
        "Trilateration",
        "Recovering a point from its distances to known points; with more landmarks than features it is exact.",
    ),
    ("SecAgg+", "Secure aggregation by pairwise masking: the coordinator learns only the sum of the sites' updates."),
    (
        "CKKS",
        "Homomorphic encryption (TenSEAL): updates are summed encrypted; the coordinator never holds the secret key.",
    ),
    (
        "(ε, δ)-differential privacy",
        "No single record changes the probability of any output by more than a factor e^ε, except with probability δ.",
    ),
    (
        "Joint differential privacy",
        "Each site places its own records using only the DP landmarks and its own data, so what "
        "any site learns about another site's records is (ε, δ)-DP (billboard lemma, Hsu et al. 2014).",
    ),
    (
        "Accountant's ε",
        "The ε the privacy accountant guarantees for the landmark releases given the noise and their number.",
    ),
    (
        "The paper's formula",
        f"The ε given by the formula in {PAPER}, §5.2, for the same noise; shown for comparison, it is "
        "not a bound and can be below the true ε.",
    ),
    (
        "μ-GDP",
        "Gaussian differential privacy: telling a record in from out is no easier than telling N(0,1) from N(μ,1).",
    ),
    ("Membership inference", "An attack deciding whether a given record was used to fit the landmarks."),
    (
        "Membership-attack AUC",
        "Area under the attack's ROC curve: 0.5 = coin toss, 1.0 = perfect membership inference.",
    ),
    ("TPR at FPR", "Share of members the attack finds while wrongly flagging at most the given share of non-members."),
    (
        "Empirical ε",
        "A 95 % lower bound on the privacy loss proven by the attack (Clopper–Pearson); above the claimed ε "
        "means the claim is wrong.",
    ),
    (
        "Relative reconstruction error",
        "‖x̂ − x‖ / ‖x‖ for the coordinator's best reconstruction x̂ of record x; ≤ 5 % counts as recovered.",
    ),
    (
        "Audit gate",
        "The membership check between the landmarks and the embedding stage; a fail stops the run unless "
        "--allow-audit-failure.",
    ),
    ("Points", "Differences of proportions in percentage points: 0.93 vs 0.98 is a gap of −5 points."),
]


def count(n) -> str:
    """``1797`` → ``"1 797"`` (thin-space thousands, as a report reads)."""
    try:
        return f"{int(n):,}".replace(",", "\u202f")
    except (TypeError, ValueError):
        return "—"


def percent(x, digits: int = 0) -> str:
    if not isinstance(x, (int, float)) or isinstance(x, bool) or not math.isfinite(x):
        return "—"
    return f"{100 * x:.{digits}f} %"


def points(fed, cen) -> float | None:
    """``fed − cen`` in percentage points, or None."""
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in (fed, cen)):
        return None
    v = round(100.0 * (fed - cen), 1)
    return 0.0 if v == 0 else v  # never "-0.0"


def _exp(s: str) -> str:
    """``1e-05`` → ``1e-5`` (no padded exponents)."""
    return re.sub(r"e([+-])0*(\d)", lambda m: "e" + ("-" if m.group(1) == "-" else "") + m.group(2), s)


def show(x, digits: int = 4, missing: str = "—") -> str:
    """A value as a reader sees it: never ``None`` / ``nan``; booleans as yes/no; big integers grouped."""
    if x is None:
        return missing
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, int):
        return count(x) if abs(x) >= 10_000 else str(x)
    if isinstance(x, float):
        if not math.isfinite(x):
            return missing
        return _exp(f"{x:.{digits}g}")
    if isinstance(x, (list, tuple)):
        return ", ".join(show(v, digits, missing) for v in x) if x else missing
    if isinstance(x, dict):
        return "; ".join(f"{label(k)}: {show(v, digits, missing)}" for k, v in x.items()) if x else missing
    s = str(x)
    return s if s.strip() else missing
