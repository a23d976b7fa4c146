"""``securefed audit RUN_DIR``: one self-contained ``report.html`` and a versioned, schema-checked ``report.json``.

The report is written for a compliance officer. It opens with a **summary in plain words** (the verdict and its
remedy, what left each site, who could learn what, what ε means here, how good the map is), then the **release
inventory** (every data-dependent output, who receives it, whether ε covers it), the **per-site table**, the
**quality figures beside the privacy figures**, and the details: what each mode sends, the privacy budget, the
membership-inference and reconstruction audits, the map, the ledger, all parameters, library versions and a
glossary. Every number carries a human label (:mod:`securefed.report.labels`); ``report.json`` keeps the machine
names and adds the ``labels`` block. Plots are PNGs embedded as base64, so the file can be mailed or archived alone.

Run-folder files read here: ``metrics.json`` (required), ``config.json``, ``result.json`` (newer runs),
``history.json``, ``ledger.jsonl`` and ``site-ledgers/<site>/<run_id>.jsonl`` (only this run's), ``audit/mia.json``,
``audit/reconstruction.json``, ``embedding.npy``, ``y_true.npy`` / ``labels.npy``, ``embedding.png``. A missing
optional file makes its section say "not available"; it never stops the report.
"""

from __future__ import annotations

import base64
import datetime as _dt
import io
import json
import os
from collections import Counter
from importlib import metadata, resources

import numpy as np

from ..audits.gate import AuditPolicy, audit_gate
from ..errors import ConfigError, DataError, bad_value
from .guarantee import run_guarantee
from .labels import GLOSSARY, LABELS
from .summary import (
    RunFolder,
    coordinates_kept,
    epsilon_is_void,
    infer_mode,
    paper_formula,
    privacy_block,
    release_inventory,
    run_warnings,
    site_table,
    summary,
    utility_table,
)

__all__ = [
    "SCHEMA_VERSION",
    "load_schema",
    "validate_report",
    "infer_mode",
    "what_leaves",
    "reconstruction_verdict",
    "MAX_REBUILT_BEYOND_GUESS",
    "membership_threat_model",
    "read_run_folder",
    "build_report",
    "render_html",
    "write_report",
    "write_audit_files",
    "GLOSSARY",
]

SCHEMA_VERSION = "2.1"
LIBRARIES = (
    "securefed",
    "numpy",
    "scipy",
    "scikit-learn",
    "openTSNE",
    "umap-learn",
    "tenseal",
    "cryptography",
    "opacus",
    "dp-accounting",
    "matplotlib",
    "jsonschema",
)


# ------------------------------------------------------------------------------------------ schema


def load_schema() -> dict:
    """The packaged JSON Schema of ``report.json`` (``securefed/report/report.schema.json``)."""
    with resources.files("securefed.report").joinpath("report.schema.json").open("r", encoding="utf-8") as fh:
        return json.load(fh)


def validate_report(report: dict) -> None:
    """Validate a report dict against the packaged schema; raise :class:`DataError` naming the first problem."""
    import jsonschema

    validator = jsonschema.Draft202012Validator(load_schema())
    errors = sorted(validator.iter_errors(report), key=lambda e: list(e.absolute_path))
    if errors:
        e = errors[0]
        where = "/".join(str(p) for p in e.absolute_path) or "(root)"
        raise DataError(
            bad_value(
                f"report.json:{where}",
                e.instance if not isinstance(e.instance, dict) else "object",
                f"does not match the report schema: {e.message}",
            )
        )


def _get(d, *keys, default=None):
    for k in keys:
        if isinstance(d, dict) and d.get(k) is not None:
            return d[k]
    return default


# ------------------------------------------------------------------------------------------ modes


def what_leaves(
    mode: dict, *, privacy: dict | None = None, n_landmarks=None, n_features=None, rows_privacy: dict | None = None
) -> list[dict]:
    """Every mode of the protocol and what the coordinator learns in it, filled in for this run (``applies`` marks
    the rows that hold here; ``docs/what-leaves-each-site.md`` explains each)."""
    return _landmark_rows(mode, privacy) + _nystrom_rows(mode, n_landmarks, n_features, rows_privacy)


def _landmark_rows(mode: dict, privacy: dict | None) -> list[dict]:
    """:func:`what_leaves`'s rows of the landmark stage (cells, billboard, FedDL: its secure sum and its DP)."""
    agg, dp, nys = mode.get("aggregation"), bool(mode.get("dp")), mode.get("nystrom")
    rule = mode.get("rule") or "model"
    upload = "gradient" if rule == "gradient" else "landmark update Y_p"
    eps = (privacy or {}).get("epsilon")
    delta = (privacy or {}).get("delta")
    releases = (privacy or {}).get("releases")
    lm = mode.get("landmark_method") or "feddl"  # run folders from before the cells and the billboard: FedDL
    floor = mode.get("cell_floor") or "the floor"
    return [
        {
            "stage": "landmarks",
            "mode": "cells (a cell tree with a floor, no DP)",
            "server_learns": f"one secure sum of record counts, feature sums and second moments (a PCA basis); then per level the "
            f"pooled histogram of every candidate cell along its principal axes and, for the children of each "
            f"split whose children all hold ≥ {floor} records, the pooled sums of their features, of their "
            f"squares, and of their products on as many public axes as each child's size allows (never the "
            f"full second moments of a small cell, which would span its records). Every site recomputes each query, verifies each total and refuses a sum after which a "
            f"set of fewer than {floor} of the records would be a combination of the released sums — against a "
            "coordinator that deviates, colluding with no site",
            "applies": lm == "cells",
        },
        {
            "stage": "landmarks",
            "mode": "the DP billboard",
            "server_learns": ("three" if releases == 3 else "two")
            + " noisy secure sums — a random-feature mean embedding of "
            "every record and the landmarks' counts"
            + (" (and, after the placement, a density of every record on the map)" if releases == 3 else "")
            + " — "
            + (
                "each site adding its full Gaussian noise"
                if (privacy or {}).get("noise") != "distributed"
                else "each site adding a share σ/√t of the Gaussian noise inside the secure sum (the sum "
                "carries σ while ≥ t sites survive; a site's upload alone is not private)"
            )
            + " and booking it in its own ledger first: "
            + (
                f"(ε, δ) = ({eps:.4g}, {delta:.3g}) per record for the whole run"
                if isinstance(eps, (int, float)) and isinstance(delta, (int, float))
                else "(ε, δ) per record for the whole run"
            )
            + "; the landmarks, their masses and their map are post-processing (a billboard)",
            "applies": lm == "billboard",
        },
        {
            "stage": "landmarks",
            "mode": "plain aggregation",
            "server_learns": f"every site's {upload if lm == 'feddl' else 'upload'}, every round",
            "applies": agg == "plain",
        },
        {
            "stage": "landmarks",
            "mode": "SecAgg+ or CKKS aggregation",
            "server_learns": "only the sum of the sites' uploads"
            + (" (CKKS: the secret key never reaches the coordinator)" if agg == "ckks" else ""),
            "applies": agg in ("secagg", "ckks"),
        },
        {
            "stage": "landmarks",
            "mode": "a malicious site (no range proofs)",
            "server_learns": "nothing more — but a site can put any value into the sum as its own input and so bias the "
            "landmarks; it cannot read the others' inputs, and under DP the other sites' noise still covers "
            "their records (docs/threat-model-secure-sum.md §5)",
            "applies": agg in ("secagg", "ckks"),
        },
        {
            "stage": "landmarks",
            "mode": "FedDL with differential privacy",
            "server_learns": "the sum plus Gaussian noise: "
            + (
                f"(ε, δ) = ({eps:.4g}, {delta:.3g}) per record over all {releases if releases is not None else 'S·Q'} noisy releases"
                if isinstance(eps, (int, float)) and isinstance(delta, (int, float))
                else "(ε, δ) per record, tracked over all S·Q releases"
            )
            + (
                ". This ε covers the landmarks only: the rows sent in the Nyström stage below are not covered by it"
                if nys in ("rows", "kernel_rows")
                else ""
            ),
            "applies": dp and lm == "feddl",
        },
    ]


def _nystrom_rows(mode: dict, n_landmarks, n_features, rows_privacy: dict | None) -> list[dict]:
    """:func:`what_leaves`'s rows of the Nyström stage (what each record's row or coordinate gives away)."""
    nys = mode.get("nystrom")
    kept = mode.get("coordinates") == "keep"
    ny = f"n_y = {n_landmarks}" if n_landmarks is not None else "n_y"
    mm = f"m = {n_features}" if n_features is not None else "m"
    exact = None
    if n_landmarks is not None and n_features is not None:
        exact = int(n_landmarks) > int(n_features)
    rows_note = (
        "Here n_y > m, so every record is recoverable exactly."
        if exact
        else "Here n_y ≤ m, so the part of each record in the landmarks' span is recoverable."
        if exact is False
        else ""
    )
    sigma = (rows_privacy or {}).get("sigma")
    return [
        {
            "stage": "Nyström",
            "mode": "distance rows sent in the clear (paper mode)",
            "server_learns": f"one row of {ny} distances per record. With n_y > m the rows give every record back exactly "
            f"(trilateration); with fewer landmarks the part of x in the landmarks' span ({mm}). {rows_note}".strip(),
            "applies": nys == "rows",
        },
        {
            "stage": "Nyström",
            "mode": "kernel rows sent in the clear (spectral clustering)",
            "server_learns": f"one row of {ny} kernel values per record: −log k / γ gives the squared distances back, so they leak "
            f"exactly what distance rows leak. {rows_note}".strip(),
            "applies": nys == "kernel_rows",
        },
        {
            "stage": "Nyström",
            "mode": "rows of perturbed records (data perturbation)",
            "server_learns": "rows of X + E, E ~ N(0, σ²)"
            + (f" with σ = {sigma:.4g}" if isinstance(sigma, (int, float)) else "")
            + ", σ ≥ 2cτ_X/ε: the coordinator recovers x + e exactly, so the noise is the only protection",
            "applies": nys == "perturbed_rows",
        },
        {
            "stage": "Nyström",
            "mode": "no rows, coordinates sent (local placement, the default)",
            "server_learns": "no per-record rows: the coordinator embeds only the landmarks; each site places its records locally "
            "and sends the coordinator each record's final 2-D coordinate (cluster label for spectral "
            "clustering); the reconstruction audit measures what those reveal. A record's own coordinate is "
            "a function of that record: no ε covers it",
            "applies": nys == "local" and not kept,
        },
        {
            "stage": "Nyström",
            "mode": "no rows, coordinates kept (--coordinates keep)",
            "server_learns": "nothing per record: the coordinator embeds only the landmarks; each site places its records "
            "locally and keeps their coordinates (cluster labels) on the site",
            "applies": nys == "local" and kept,
        },
    ]


# ------------------------------------------------------------------------------------------ io


def _read_json(path):
    try:
        with open(path, "r", encoding="utf-8") as fh:
            return json.load(fh), None
    except FileNotFoundError:
        return None, f"{os.path.basename(path)} not found"
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        return None, f"{os.path.basename(path)} is not valid JSON ({exc.__class__.__name__})"


def _read_npy(path):
    try:
        return np.load(path, allow_pickle=False), None
    except FileNotFoundError:
        return None, f"{os.path.basename(path)} not found"
    except (ValueError, OSError) as exc:
        return None, f"{os.path.basename(path)} unreadable ({exc.__class__.__name__})"


def _read_ledger(path, run_id=None, dp: bool = True):
    """Counts of the coordinator's ledger — only when its header names this run (never another run's ledger)."""
    try:
        with open(path, "r", encoding="utf-8") as fh:
            lines = [ln for ln in fh.read().splitlines() if ln.strip()]
    except FileNotFoundError:
        if not dp:
            return {
                "available": False,
                "reason": "no privacy ledger: this run has no differential privacy, so no noisy "
                "release was booked against a privacy budget",
            }
        return {
            "available": False,
            "reason": "ledger.jsonl not found (a DP run's coordinator ledger should be here; "
            "each site's own ledger stays on the site)",
        }
    kinds: Counter = Counter()
    bad, overrides = 0, 0
    for ln in lines[:1]:
        try:
            first = json.loads(ln)
        except json.JSONDecodeError:
            first = None
        other = first.get("run_id") if isinstance(first, dict) and first.get("type") == "header" else None
        if run_id and other and other != run_id:
            return {
                "available": False,
                "reason": f"ledger.jsonl belongs to another run ({other}), not to {run_id}; not read",
            }
    for ln in lines:
        try:
            ev = json.loads(ln)
        except json.JSONDecodeError:
            bad += 1
            continue
        kind = str(_get(ev, "kind", "type", "event", default="event")) if isinstance(ev, dict) else "event"
        kinds[kind] += 1
        text = json.dumps(ev)
        overrides += ("audit_override" in text) or ("allow-audit-failure" in text)
    out = {"available": True, "n_events": len(lines) - bad, "kinds": dict(kinds), "overrides": int(overrides)}
    if bad:
        out["reason"] = f"{bad} unreadable line(s) skipped"
    return out


def _versions(config):
    v = _get(config, "versions", "library_versions")
    if isinstance(v, dict) and v:
        return {"source": "run", "libraries": {str(k): (None if x is None else str(x)) for k, x in v.items()}}
    libs = {}
    for name in LIBRARIES:
        try:
            libs[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            libs[name] = None
    return {"source": "report environment", "libraries": libs}


def _jsonable(x):
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, float) and not np.isfinite(x):
        return None
    return x


# ------------------------------------------------------------------------------------------ plots


def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=96, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _plt():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _roc_png(per_score: dict) -> str:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5.2, 4.4))
    floor = 1e-4
    for kind, v in per_score.items():
        roc = v.get("roc") or {}
        f, t = np.asarray(roc.get("fpr", []), float), np.asarray(roc.get("tpr", []), float)
        if f.size:
            ax.step(
                np.maximum(f, floor),
                np.maximum(t, floor),
                where="post",
                label=f"{kind} (AUC {v.get('auc', float('nan')):.3f})",
            )
    g = np.logspace(-4, 0, 100)
    ax.plot(g, g, "k--", lw=1, label="no signal (TPR = FPR)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(floor, 1)
    ax.set_ylim(floor, 1.05)
    ax.set_xlabel("false positive rate")
    ax.set_ylabel("true positive rate")
    ax.set_title("Membership inference on the landmarks (log ROC)")
    ax.legend(loc="lower right", fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    return _png(fig)


def _series_png(values, title, ylabel, rounds=None) -> str:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5.2, 3.4))
    v = np.asarray(values, float)
    x = np.asarray(rounds, float) if rounds is not None and len(rounds) == len(v) else np.arange(1, len(v) + 1)
    ax.plot(x, v, marker="o" if len(v) <= 40 else None, ms=3)
    ax.set_xlabel("round")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    return _png(fig)


def _file_png(path: str) -> str | None:
    """A PNG the run wrote (base64), or None."""
    try:
        with open(path, "rb") as fh:
            return base64.b64encode(fh.read()).decode("ascii")
    except OSError:
        return None


def _embedding_png(run: RunFolder, mode: dict, privacy: dict | None) -> str | None:
    """The map with class legend, site markers, quality and privacy lines (t-SNE / UMAP); spectral: the run's PNG."""
    E, _ = _read_npy(os.path.join(run.path, "embedding.npy"))
    if E is None or E.ndim != 2 or E.shape[1] < 2 or not len(E):
        return _file_png(os.path.join(run.path, "embedding.png"))
    from .plots import draw_panels, standard_panels

    y = None
    for name in ("y_true.npy", "labels.npy"):
        lab, _ = _read_npy(os.path.join(run.path, name))
        if lab is not None and len(lab) == len(E):
            y = lab
            break
    method = mode.get("method") or run.metrics.get("method") or "tsne"
    panels = standard_panels(
        method if method != "spectral" else "tsne",
        E[:, :2],
        y=y,
        site_sizes=run.config.get("site_sizes"),
        mode=mode,
        privacy=privacy,
        fed_metrics=run.metrics.get("federated"),
        partition=run.metrics.get("partition"),
    )
    fig = draw_panels(
        panels,
        class_names=run.config.get("target_names"),
        site_names=_get(run.result or {}, "sites") or run.config.get("sites"),
        panel_size=5.2,
    )
    return _png(fig)


# ------------------------------------------------------------------------------------------ report


#: the reconstruction audit's limit: the share of records the coordinator rebuilds to within 5 % **beyond** what guessing
#: the average record gives (what anyone knowing the population's average knows without the run)
MAX_REBUILT_BEYOND_GUESS = 0.01


def reconstruction_verdict(rec: dict, max_rebuilt: float = MAX_REBUILT_BEYOND_GUESS) -> tuple[str, str | None]:
    """Judge the reconstruction audit against what an attacker knows without the run.

    ``rec["fraction_within_5pct_beyond_baseline"]`` — the records the attack rebuilds to within 5 % that guessing the
    average record does not — must be at most ``max_rebuilt`` (1 %). A record that lies within 5 % of the average is
    "rebuilt" by anyone; only what the run adds counts. Run folders from before the baseline (no such key) are judged
    on the raw share against 0 %. ``{"available": False, "kept": True}``: nothing per record left the sites
    (``"nothing left"``)."""
    if rec.get("kept"):
        return "nothing left", None
    if not rec.get("available"):
        return "not audited", None
    raw = float(rec["fraction_within_5pct"])
    beyond = rec.get("fraction_within_5pct_beyond_baseline")
    detail = (
        f"median relative error {rec['median_relative_error']:.3g}"
        + (
            f" against {rec['baseline_median_relative_error']:.3g} for the guess"
            if isinstance(rec.get("baseline_median_relative_error"), (int, float))
            else ""
        )
        + f", attack: {rec.get('attack', 'see report')}"
    )
    if beyond is None:
        if raw > 0.0:
            return "fail", (
                f"{100 * raw:.1f} % of records are reconstructible to within 5 % relative error from what left "
                f"the sites (limit 0 %: this run folder records no baseline guess; {detail})"
            )
        return "pass", None
    if float(beyond) > max_rebuilt:
        return "fail", (
            f"{100 * float(beyond):.1f} % of records are reconstructible to within 5 % from what left the "
            f"sites beyond guessing the average record (limit {100 * max_rebuilt:g} %; attack "
            f"{100 * raw:.1f} %, the guess {100 * float(rec.get('baseline_fraction_within_5pct', 0.0)):.1f} %; "
            f"{detail})"
        )
    return "pass", None


def read_run_folder(run_dir) -> RunFolder:
    """Parse a run folder (``metrics.json`` required); raise :class:`ConfigError` naming the path and the fix."""
    run_dir = os.fspath(run_dir)
    if not os.path.isdir(run_dir):
        raise ConfigError(bad_value("run_dir", run_dir, "no such folder; pass the --out folder of `securefed run`"))
    metrics, why = _read_json(os.path.join(run_dir, "metrics.json"))
    if not isinstance(metrics, dict):
        raise ConfigError(
            bad_value(
                "run_dir",
                run_dir,
                f"{why or 'metrics.json is not a JSON object'}: run "
                f"`securefed run --out {run_dir}` first (the report needs metrics.json)",
            )
        )
    config, _ = _read_json(os.path.join(run_dir, "config.json"))
    result, _ = _read_json(os.path.join(run_dir, "result.json"))
    history, _ = _read_json(os.path.join(run_dir, "history.json"))
    mia, mia_why = _read_json(os.path.join(run_dir, "audit", "mia.json"))
    rec, rec_why = _read_json(os.path.join(run_dir, "audit", "reconstruction.json"))
    return RunFolder(
        run_dir,
        config if isinstance(config, dict) else {},
        metrics,
        result if isinstance(result, dict) else None,
        history if isinstance(history, dict) else {},
        mia if isinstance(mia, dict) else None,
        rec if isinstance(rec, dict) else None,
        {"mia": mia_why, "reconstruction": rec_why},
    )


def _budget(privacy, history, figures) -> dict:
    eps_hist = [float(e) for e in (history.get("epsilon") or []) if e is not None]
    if privacy:
        budget = {
            "available": True,
            "epsilon": privacy.get("epsilon"),
            "delta": privacy.get("delta"),
            "epsilon_paper_formula": paper_formula(privacy),
            "accountant": privacy.get("accountant"),
            "epsilon_per_round": eps_hist,
            "details": privacy,
        }
    else:
        budget = {
            "available": False,
            "reason": "no differential privacy in this run: the landmarks carry no (ε, δ) guarantee",
            "epsilon_per_round": eps_hist,
        }
    figures["epsilon"] = (
        _series_png(eps_hist, "ε spent (cumulative) per round", "ε", history.get("rounds")) if eps_hist else None
    )
    mmd = [float(v) for v in (history.get("mmd") or []) if v is not None]
    figures["mmd"] = (
        _series_png(mmd, "MMD(records, landmarks) per round", "MMD²", history.get("rounds")) if mmd else None
    )
    if not mmd:
        budget["mmd_not_shown"] = (
            "not monitored: with differential privacy the MMD would be a release outside ε"
            if privacy
            else "not recorded in history.json"
        )
    return budget


def membership_threat_model(mode: dict, scores) -> str:
    """The membership attack's threat model in the words of this run: its landmark method and the scores that ran
    (shadow fits of the landmark method only for the ``lira`` score)."""
    lm = mode.get("landmark_method") or "feddl"
    what = {
        "cells": "the cell landmarks (cell means) and their counts",
        "billboard": "the DP landmarks (the billboard), their masses and their map",
        "feddl": "the FedDL landmarks Y and the kernel bandwidth γ",
    }.get(lm, "the released landmarks")
    method = {"cells": "the cells", "billboard": "the billboard", "feddl": "FedDL"}.get(lm, "the landmark method")
    scores = list(scores or [])
    shadow = (
        (
            f" (in this audit: a share of each site's held-out records, used for shadow runs of {method} by the lira "
            "score)"
        )
        if "lira" in scores
        else ""
    )
    return (
        f"Attacker: holds {what} and the run's public parameters, and has records from the same population"
        f"{shadow}; it does not have the target records. Question: was record x used to fit the landmarks? Each site "
        "scores its own members and held-out non-members locally"
        + (f" ({', '.join(scores)} score{'s' if len(scores) > 1 else ''})" if scores else "")
        + "; only per-threshold counts on a public grid leave a site (summed, through the secure sum when "
        "configured). Empirical ε: score, threshold and direction chosen on a selection split, Clopper-Pearson 95 % "
        "bounds on a disjoint test split, δ subtracted (Jagielski et al. 2020; Nasr et al. 2023)."
    )


def _mia_block(run: RunFolder, figures, mode: dict) -> dict:
    mia = run.mia
    if isinstance(mia, dict) and "auc" in mia:
        block = {"available": True, **{k: v for k, v in mia.items() if k != "per_score"}}
        block["per_score"] = {
            k: {kk: vv for kk, vv in v.items() if kk != "roc"} for k, v in (mia.get("per_score") or {}).items()
        }
        block["threat_model"] = membership_threat_model(mode, list(block["per_score"]))
        figures["roc"] = _roc_png(mia.get("per_score") or {})
        return block
    figures["roc"] = None
    return {"available": False, "reason": run.why.get("mia") or "audit/mia.json has no AUC"}


def _rec_block(run: RunFolder, mode: dict) -> dict:
    rec = run.rec
    if isinstance(rec, dict) and "median_relative_error" in rec and "fraction_within_5pct" in rec:
        return {"available": True, **rec}
    if isinstance(rec, dict) and isinstance(rec.get("risk"), dict):
        return {"available": True, **{k: v for k, v in rec.items() if k != "risk"}, **rec["risk"]}
    if coordinates_kept(run, mode):
        return {
            "available": False,
            "kept": True,
            "reason": "nothing to attack: no per-record output left the sites (each site kept its records' "
            "coordinates or labels: --coordinates keep)",
        }
    return {
        "available": False,
        "reason": run.why.get("reconstruction") or "audit/reconstruction.json has no risk figures",
    }


def _verdict(run: RunFolder, budget, mia_block, rec_block) -> tuple[dict, dict | None]:
    reasons, overridden = [], False
    gate = run.metrics.get("audit") if isinstance(run.metrics.get("audit"), dict) else None
    if gate is None and isinstance((run.result or {}).get("audit"), dict):
        gate = run.result["audit"]
    if gate and "verdict" in gate:
        gate_status = str(gate["verdict"])
        overridden = bool(gate.get("overridden"))
        reasons += [f"landmark audit: {f}" for f in gate.get("failures", [])]
    elif mia_block["available"]:
        claimed = budget.get("epsilon") if budget["available"] else None
        dec = audit_gate(run.mia, AuditPolicy(), claimed_epsilon=claimed, allow_failure=True)
        gate_status = "pass" if dec.passed else "fail"
        gate = {"failures": list(dec.failures)}
        reasons += [f"landmark audit (default policy): {f}" for f in dec.failures]
    else:
        gate_status = "not audited"
        reasons.append("landmark audit: not available (" + mia_block["reason"] + ")")
    if gate_status not in ("pass", "fail", "fail (overridden)", "not audited"):
        gate_status = "fail" if "fail" in gate_status else "not audited"
    rec_status, rec_reason = reconstruction_verdict(rec_block)
    if rec_reason:
        reasons.append("reconstruction: " + rec_reason)
    if not rec_block["available"]:
        stopped = gate_status == "fail" and not run.metrics.get("federated")
        reasons.append(
            "reconstruction audit: "
            + (
                "not run — the run stopped at the audit gate, so nothing per record left the sites"
                if stopped
                else rec_block["reason"]
                if rec_block.get("kept")
                else "not available (" + rec_block["reason"] + ")"
            )
        )
    if "fail" in (gate_status, rec_status):
        status = "fail"
    elif gate_status == "fail (overridden)":
        status = "fail (overridden)"
        reasons.append("the landmark audit failed and was overridden with --allow-audit-failure")
    elif gate_status == "not audited" and rec_status in ("not audited", "nothing left"):
        status = "not audited"
    else:
        status = "pass"
    if status == "pass":
        reasons.insert(0, "every available check passed")
    return (
        {
            "status": status,
            "reasons": reasons,
            "landmark_gate": gate_status,
            "reconstruction": rec_status,
            "overridden": overridden,
        },
        gate,
    )


def _run_facts(run: RunFolder, mode: dict) -> dict:
    ds = run.config.get("dataset")
    sizes = run.config.get("site_sizes")
    return {
        "run_id": _get(run.result or {}, "run_id") or run.config.get("run_id"),
        "dataset": _get(ds if isinstance(ds, dict) else {}, "name")
        or (ds if isinstance(ds, str) else None)
        or run.metrics.get("dataset"),
        "method": mode.get("method") or run.metrics.get("method"),
        "n_records": run.metrics.get("n_samples") or (sum(sizes) if isinstance(sizes, list) and sizes else None),
        "n_sites": run.metrics.get("n_clients") or (len(sizes) if isinstance(sizes, list) else None),
        "n_features": run.config.get("n_features") or _get(ds if isinstance(ds, dict) else {}, "n_features"),
        "partition": run.metrics.get("partition"),
        "has_result_json": run.result is not None,
    }


def build_report(run_dir) -> tuple[dict, dict]:
    """Read a run folder and return ``(report, figures)`` (``figures``: name → base64 PNG or None)."""
    run = read_run_folder(run_dir)
    config, metrics = run.config, run.metrics
    mode = infer_mode(config, metrics, run.result)
    mode["coordinates"] = "keep" if coordinates_kept(run, mode) else "send"
    privacy = privacy_block(run)
    n_landmarks = (
        _get(run.options, "landmarks") or _get(config, "n_landmarks") or _get(config.get("mode") or {}, "n_landmarks")
    )
    n_features = (
        _get(config, "n_features")
        or _get(config.get("dataset") or {}, "n_features")
        or _get(run.result or {}, "n_features")
    )
    figures: dict = {}
    budget = _budget(privacy, run.history, figures)
    mia_block = _mia_block(run, figures, mode)
    rec_block = _rec_block(run, mode)
    verdict, gate = _verdict(run, budget, mia_block, rec_block)
    figures["embedding"] = _embedding_png(run, mode, privacy)
    density = _file_png(os.path.join(run.path, "density.png"))
    if density:  # only runs that released the DP density (billboard release 3)
        figures["density"] = density
    inventory = release_inventory(run, mode)
    util = utility_table(run, mode)
    warnings = run_warnings(run, mode, privacy)
    summ = summary(
        run,
        mode,
        verdict,
        gate,
        rec_block,
        inventory,
        util,
        warnings,
        mia_block=mia_block,
        max_rebuilt=MAX_REBUILT_BEYOND_GUESS,
    )
    verdict["remedies"] = summ["remedies"]
    rows_privacy = _get(config, "rows_privacy")
    report = {
        "schema_version": SCHEMA_VERSION,
        "generated_at": _dt.datetime.now(_dt.timezone.utc).isoformat(),
        "run_dir": os.path.abspath(run.path),
        "run": _run_facts(run, mode),
        "summary": summ,
        "verdict": verdict,
        "mode": {k: mode[k] for k in ("aggregation", "dp", "nystrom", "rule", "method", "coordinates")},
        "guarantee": run_guarantee(run.result),
        "release_inventory": inventory,
        "sites": site_table(run),
        "utility": util,
        "warnings": warnings,
        "what_leaves": what_leaves(
            mode,
            privacy=privacy,
            n_landmarks=n_landmarks,
            n_features=n_features,
            rows_privacy=rows_privacy if isinstance(rows_privacy, dict) else None,
        ),
        "budget": dict(budget, epsilon_void=epsilon_is_void(run, privacy)) if budget["available"] else budget,
        "mia": mia_block,
        "reconstruction": rec_block,
        "quality": {k: v for k, v in metrics.items() if k not in ("privacy", "audit")},
        "parameters": config,
        "versions": _versions(config),
        "glossary": [{"term": t, "definition": d} for t, d in GLOSSARY],
        "labels": dict(LABELS),
        "plots": {k: v is not None for k, v in figures.items()},
        "ledger": _read_ledger(
            os.path.join(run.path, "ledger.jsonl"), _run_facts(run, mode)["run_id"], dp=bool(mode.get("dp"))
        ),
    }
    return _jsonable(report), figures


def render_html(report: dict, figures: dict) -> str:
    """The self-contained HTML page for ``report`` (plots embedded as base64 PNG); see :mod:`securefed.report.render`."""
    from .render import render_html as _render

    return _render(report, figures)


def _atomic_write(path: str, text: str) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def write_report(run_dir, out_dir=None) -> tuple[str, str]:
    """Write ``report.html`` and ``report.json`` for a run folder; return their paths.

    Parameters
    ----------
    run_dir : path
        The ``--out`` folder of ``securefed run`` (``metrics.json`` is required; older folders without
        ``result.json`` work, with fewer sections filled in).
    out_dir : path, optional
        Where to write (default: ``run_dir``). Created when missing.

    Raises
    ------
    ConfigError
        Missing run folder or ``metrics.json`` (the message names the path and the fix).
    DataError
        The report does not match its packaged schema (nothing is written).
    """
    report, figures = build_report(run_dir)
    validate_report(report)
    out_dir = os.fspath(out_dir) if out_dir is not None else os.fspath(run_dir)
    try:
        os.makedirs(out_dir, exist_ok=True)
    except OSError as exc:
        raise ConfigError(
            bad_value("out", out_dir, f"cannot create the folder ({exc.strerror}); pick a writable path")
        ) from None
    json_path = os.path.join(out_dir, "report.json")
    html_path = os.path.join(out_dir, "report.html")
    _atomic_write(json_path, json.dumps(report, indent=2, sort_keys=False, allow_nan=False))
    _atomic_write(html_path, render_html(report, figures))
    return html_path, json_path


def write_audit_files(run_dir, *, mia=None, reconstruction=None) -> dict:
    """Write ``audit/mia.json`` (an :class:`MIAResult` or its dict) and ``audit/reconstruction.json`` into a run folder.

    ``reconstruction`` is the dict of :func:`securefed.audits.reconstruction_record`. Returns the paths written.
    """
    os.makedirs(os.path.join(os.fspath(run_dir), "audit"), exist_ok=True)
    out = {}
    if mia is not None:
        d = mia.to_dict() if hasattr(mia, "to_dict") else dict(mia)
        out["mia"] = os.path.join(run_dir, "audit", "mia.json")
        _atomic_write(out["mia"], json.dumps(_jsonable(d), allow_nan=False))
    if reconstruction is not None:
        out["reconstruction"] = os.path.join(run_dir, "audit", "reconstruction.json")
        _atomic_write(out["reconstruction"], json.dumps(_jsonable(dict(reconstruction)), allow_nan=False))
    return out
