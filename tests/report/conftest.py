"""Small synthetic run folders shaped like `securefed run --out` writes them (result.json, metrics.json, config.json,
site ledgers, audit/), for report tests that must not run the pipeline."""

from __future__ import annotations

import json

import numpy as np
import pytest

SITES = ("site-00", "site-01", "site-02")
SIZES = (599, 599, 599)  # 1 797 records, like digits
RUN_ID = "run-test0000000001"


def _mia(auc: float) -> dict:
    grid = np.linspace(0, 1, 11).tolist()
    score = {
        "auc": auc,
        "auc_se": 0.02,
        "tpr_at_fpr_1e2": 0.012,
        "tpr_at_fpr_1e3": 0.001,
        "epsilon_lb": 0.0,
        "mu_lb": 0.0,
        "roc": {"fpr": grid, "tpr": grid},
    }
    return {
        "auc": auc,
        "auc_se": 0.02,
        "tpr_at_fpr_1e2": 0.012,
        "tpr_at_fpr_1e3": 0.001,
        "empirical_epsilon": 0.0,
        "empirical_mu": 0.0,
        "delta": 1e-5,
        "confidence": 0.95,
        "best_score": "nearest",
        "n_members": 1438,
        "n_nonmembers": 359,
        "n_sites": 3,
        "aggregation": "secagg",
        "per_score": {"nearest": score},
        "threat_model": "Attacker: holds the released landmarks.",
    }


def _gate(auc: float, limit: float = 0.6) -> dict:
    ok = auc <= limit
    return {
        "passed": ok,
        "proceed": ok,
        "overridden": False,
        "failures": [] if ok else [f"membership AUC {auc:.3f} > max_auc {limit:.3f}"],
        "auc": auc,
        "empirical_epsilon": 0.0,
        "verdict": "pass" if ok else "fail",
    }


def make_run(d, kind: str, *, config_mode: bool = True, paper_key: str = "epsilon_paper_formula") -> None:
    """Write a run folder into ``d``: ``kind`` ∈ {"dp", "rows_fail", "norows_pass", "mia_fail_stopped"}."""
    d.mkdir(parents=True, exist_ok=True)
    (d / "audit").mkdir(exist_ok=True)
    rng = np.random.default_rng(0)
    n = sum(SIZES)
    y = rng.integers(0, 10, n)
    dp = kind == "dp"
    nystrom = "rows" if kind == "rows_fail" else "local"
    mode, options, config = _mode_options_config(n, dp, nystrom, config_mode)
    (d / "config.json").write_text(json.dumps(config))
    np.save(d / "y_true.npy", y)
    auc = 0.66 if kind == "mia_fail_stopped" else 0.51
    (d / "audit" / "mia.json").write_text(json.dumps(_mia(auc)))
    metrics = {
        "method": "tsne",
        "dataset": "digits",
        "n_samples": n,
        "n_clients": 3,
        "partition": "iid",
        "mode": mode,
        "audit": _gate(auc),
        "timings": {"federated_total": 12.5, "centralized": 7.0, "total": 25.0},
    }
    if kind == "mia_fail_stopped":
        (d / "metrics.json").write_text(json.dumps(metrics))
        return
    coords = {s: rng.normal(size=(k, 2)) + 3 * rng.normal(size=(1, 2)) for s, k in zip(SITES, SIZES)}
    np.save(d / "embedding.npy", np.vstack(list(coords.values())))
    np.savez(d / "embedding.npz", **coords)
    sent = (
        "squared distances to the landmarks, one row of n_y per record"
        if nystrom == "rows"
        else "final 2-D coordinates, one per record"
    )
    inventory = _inventory(dp, sent)
    fed = {
        "ca_10nn": 0.371 if dp else 0.921,
        "trustworthiness": 0.69 if dp else 0.96,
        "nmi": 0.27 if dp else 0.8,
        "ca_5nn": None,
    }
    cen = {"ca_10nn": 0.978, "trustworthiness": 0.996, "nmi": 0.914, "ca_5nn": None}
    privacy = _privacy(paper_key) if dp else None
    warnings = (
        [
            f"each site's {sent} are computed from its raw records; they are not covered by the "
            "differential-privacy accounting"
        ]
        if dp
        else []
    )
    if nystrom == "rows":
        warnings = [
            f"every site sent one row per record ({sent}); these rows give every record back (n_y > m: trilateration)"
        ]
    metrics.update(
        {
            "federated": fed,
            "centralized": cen,
            "aggregation": {"protocol": "secagg", "clipped": 0},
            "released": [r["what"] for r in inventory[:5]],
            "inventory": inventory,
            "warnings": warnings,
            "privacy": privacy,
            "sent_by_each_site": sent,
            "reconstruction_audit": {
                "mode": nystrom,
                "median_relative_error": 6e-14 if nystrom == "rows" else 0.9,
                "fraction_within_5pct": 1.0 if nystrom == "rows" else 0.0,
            },
        }
    )
    if not config_mode:
        metrics.pop("mode")
    (d / "metrics.json").write_text(json.dumps(metrics))
    _write_reconstruction_audit(d, nystrom, n)
    _write_result(d, options, metrics, inventory, warnings, privacy, auc, nystrom, sent)
    (d / "history.json").write_text(
        json.dumps(
            {
                "rounds": list(range(1, 11)),
                "mmd": [] if dp else [0.1 / r for r in range(1, 11)],
                "epsilon": [0.2 * r for r in range(1, 11)] if dp else [],
            }
        )
    )
    if dp:
        _write_ledgers(d)


def _mode_options_config(n: int, dp: bool, nystrom: str, config_mode: bool) -> tuple[dict, dict, dict]:
    """The run's mode, its plan's options and its ``config.json`` (without ``config_mode``: an older one)."""
    mode = {
        "aggregation": "secagg",
        "dp": dp,
        "nystrom": nystrom,
        "rule": "model",
        "method": "tsne",
        "rows_privacy": False,
        "n_landmarks": 100,
    }
    options = {
        "aggregation": "secagg",
        "epsilon": 2.0 if dp else None,
        "noise_multiplier": None,
        "nystrom": nystrom,
        "method": "tsne",
        "landmarks": 100,
        "rule": "model",
        "rows_epsilon": None,
        "noise_seed_for_testing": None,
    }
    config = {
        "run_id": RUN_ID,
        "dataset": {"name": "digits", "n_samples": n, "n_features": 64},
        "n_features": 64,
        "n_landmarks": 100,
        "options": options,
        "site_sizes": list(SIZES),
        "sites": list(SITES),
        "target_names": [f"digit {i}" for i in range(10)],
    }
    if config_mode:
        config["mode"] = mode
    else:  # an older config.json: no mode, a stale top-level key; result.json holds the truth
        config.pop("options")
        config["aggregation"] = "plain"
    return mode, options, config


def _inventory(dp: bool, sent: str) -> list[dict]:
    """The run's own release inventory (``sent``: what each site sent in the embedding stage)."""
    return [
        {
            "what": "each site's record count, hold-out count and feature count (hello)",
            "to": "the coordinator",
            "covered_by_epsilon": False,
            "note": "public by design: the DP calibration uses the sizes",
        },
        {
            "what": "only the sum over sites of the landmark updates (secagg), 10 times",
            "to": "the coordinator",
            "covered_by_epsilon": "yes (noise: local)" if dp else False,
            "note": "",
        },
        {
            "what": "the landmarks and γ, every round",
            "to": "every site",
            "covered_by_epsilon": "post-processing of the DP releases" if dp else False,
            "note": "",
        },
        {
            "what": "the sum over sites of the membership-audit ROC counts (members vs held-out records)",
            "to": "the coordinator",
            "covered_by_epsilon": False,
            "note": "aggregate counts on public score grids",
        },
        {
            "what": f"each site's {sent}",
            "to": "the coordinator",
            "covered_by_epsilon": False,
            "note": "a record's own coordinate is a function of that record: no ε covers it",
        },
        {
            "what": "quality metrics of the map (CA-kNN, trustworthiness, NMI) computed against the pooled records",
            "to": "this run folder",
            "covered_by_epsilon": False,
            "note": "exists only in this simulation",
        },
        {
            "what": "the centralized comparison (the method on the pooled records) and its panel in embedding.png",
            "to": "this run folder",
            "covered_by_epsilon": False,
            "note": "exists only in this simulation",
        },
    ]


def _privacy(paper_key: str) -> dict:
    """The privacy block of a DP run (``paper_key``: the name of the paper formula's ε)."""
    return {
        "epsilon": 1.9999999999999967,
        "delta": 1e-5,
        "accountant": "exact",
        paper_key: 5.14,
        "noise_multiplier": 14.1,
        "releases": 50,
        "clipped_records": 930,
        "clipped_per_site": [310, 320, 300],
        "tau_x": 16.0,
        "epsilon_per_site": {"0": 2.0, "1": 2.0, "2": 2.0},
        "noise_source": "secure",
        "sigma_per_site": [0.1, 0.1, 0.1],
        "min_survivors": None,
    }


def _write_reconstruction_audit(d, nystrom: str, n: int) -> None:
    """The reconstruction audit's ``audit/reconstruction.json``: exact rebuilds from rows, none from coordinates."""
    rec = {
        "format": "securefed.audits.reconstruction/1",
        "mode": nystrom,
        "attack": "trilateration" if nystrom == "rows" else "kernel regression from 2-D coordinates",
        "n_landmarks": 100,
        "n_features": 64,
        "n_records": n,
        "n_zero_norm_records": 0,
        "median_relative_error": 6e-14 if nystrom == "rows" else 0.9,
        "fraction_within_5pct": 1.0 if nystrom == "rows" else 0.0,
        "baseline_median_relative_error": 0.56,
    }
    (d / "audit" / "reconstruction.json").write_text(json.dumps(rec))


def _write_result(
    d,
    options: dict,
    metrics: dict,
    inventory: list,
    warnings: list,
    privacy: dict | None,
    auc: float,
    nystrom: str,
    sent: str,
) -> None:
    """The run's ``result.json``: its plan, sites, releases, privacy, audit gate, embedding stage and steps."""
    steps = [
        {
            "label": f"round {r}",
            "protocol": "secagg",
            "bytes_from_site": {s: 1000 for s in SITES},
            "bytes_to_site": {s: 2000 for s in SITES},
        }
        for r in range(1, 11)
    ]
    result = {
        "status": "completed",
        "run_id": RUN_ID,
        "options": options,
        "sites": list(SITES),
        "site_sizes": [479, 479, 480],
        "holdouts": [120, 120, 119],
        "released": metrics["released"],
        "inventory": inventory,
        "warnings": warnings,
        "privacy": privacy,
        "audit": _gate(auc),
        "embedding": {
            "method": "tsne",
            "nystrom": nystrom,
            "sent_kind": sent,
            "bytes_from_site": {s: 500 for s in SITES},
        },
        "steps": steps,
        "aggregation": {"protocol": "secagg"},
    }
    (d / "result.json").write_text(json.dumps(result))


def _write_ledgers(d) -> None:
    """A DP run's ledgers: each site's (with another run's beside it, never read) and the coordinator's."""
    for i, s in enumerate(SITES):
        (d / "site-ledgers" / s).mkdir(parents=True)
        lines = [{"type": "header", "run_id": RUN_ID}] + [{"type": "release", "run_id": RUN_ID, "site": i}] * 50
        (d / "site-ledgers" / s / f"{RUN_ID}.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")
        other = [{"type": "release", "run_id": "run-other"}] * 7  # another run's ledger: never read
        (d / "site-ledgers" / s / "run-other.jsonl").write_text("\n".join(json.dumps(x) for x in other) + "\n")
    (d / "ledger.jsonl").write_text(
        json.dumps({"type": "header", "run_id": RUN_ID})
        + "\n"
        + json.dumps({"type": "release", "run_id": RUN_ID})
        + "\n"
    )


@pytest.fixture(scope="session")
def run_folder():
    """``run_folder(d, kind, **kw)`` writes a synthetic run folder (see :func:`make_run`)."""
    return make_run
