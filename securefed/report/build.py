"""``securefed audit RUN_DIR``: one self-contained ``report.html`` and a versioned, schema-checked ``report.json``.

The report is written for a compliance officer: a verdict first (pass / fail and why), then **what leaves each
site in this run's mode** (DESIGN §2, filled in), the privacy budget (the accountant's ε and the paper's bound),
the membership-inference results on the landmarks, the measured reconstruction risk of what the sites sent, the
quality figures, all parameters, library versions and a glossary. Plots are PNGs embedded as base64 (matplotlib
Agg), so the file can be mailed or archived on its own.

Run-folder layout read here (``notes/PIPELINE.md``): ``config.json``, ``metrics.json`` (required), ``history.json``,
``ledger.jsonl``, ``audit/mia.json``, ``audit/reconstruction.json``, ``embedding.npy``, ``labels.npy``,
``y_true.npy``. A missing optional file makes its section say "not available"; it never stops the report.
"""

from __future__ import annotations

import base64
import datetime as _dt
import html
import io
import json
import os
from collections import Counter
from importlib import metadata, resources

import numpy as np

from ..errors import ConfigError, DataError, bad_value
from ..audits.gate import AuditPolicy, audit_gate

__all__ = [
    "SCHEMA_VERSION",
    "load_schema",
    "validate_report",
    "infer_mode",
    "what_leaves",
    "reconstruction_verdict",
    "build_report",
    "render_html",
    "write_report",
    "write_audit_files",
    "GLOSSARY",
]

SCHEMA_VERSION = "1.0"
LIBRARIES = ("securefed", "numpy", "scipy", "scikit-learn", "openTSNE", "umap-learn", "tenseal", "cryptography",
             "opacus", "dp-accounting", "matplotlib", "jsonschema")

GLOSSARY = [
    ("Site / client", "A party (e.g. a hospital) that holds records and never pools them."),
    ("Server", "Coordinates the rounds; honest-but-curious: follows the protocol but may study everything it receives."),
    ("Landmarks (Y)", "n_y synthetic points FedDL fits so that their distribution matches all sites' records (MMD)."),
    ("MMD", "Maximum mean discrepancy: a kernel distance between two sets of points; FedDL minimises it per round."),
    ("Nyström stage", "Sites describe each record relative to the landmarks so the server can estimate all pairwise distances."),
    ("Distance / kernel row", "For one record, its n_y distances (or kernel values) to the landmarks; paper mode sends one per record."),
    ("Trilateration", "Recovering a point from its distances to known points; with more landmarks than features it is exact."),
    ("SecAgg+", "Secure aggregation by pairwise masking: the server learns only the sum of the sites' updates."),
    ("CKKS", "Homomorphic encryption (TenSEAL): updates are summed encrypted; the server never holds the secret key."),
    ("(ε, δ)-differential privacy", "No single record changes the probability of any output by more than a factor e^ε (plus δ)."),
    ("Accountant's ε", "The ε the privacy accountant guarantees for the landmarks given the noise and number of releases."),
    ("Paper bound", "The ε implied by Theorem 5 of the FedDL paper for the same noise; looser than the accountant's."),
    ("μ-GDP", "Gaussian differential privacy: telling a record in from out is no easier than telling N(0,1) from N(μ,1)."),
    ("Membership inference", "An attack deciding whether a given record was used to fit the landmarks."),
    ("AUC", "Area under the attack's ROC curve: 0.5 = coin toss, 1.0 = perfect membership inference."),
    ("TPR at FPR", "Share of members the attack finds while wrongly flagging at most the given share of non-members."),
    ("Empirical ε", "A 95 % lower bound on the privacy loss proven by the attack (Clopper–Pearson); above the accountant's ε means the claim is wrong."),
    ("LiRA", "Likelihood-ratio attack: compares a record's score under Y with its scores under shadow landmarks that never saw it."),
    ("Relative reconstruction error", "‖x̂ − x‖ / ‖x‖ for the server's best reconstruction x̂ of record x; ≤ 5 % counts as recovered."),
    ("Audit gate", "The policy check between the landmarks and the Nyström stage; failing stops the run unless --allow-audit-failure."),
]


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
        raise DataError(bad_value(f"report.json:{where}", e.instance if not isinstance(e.instance, dict) else "object",
                                  f"does not match the report schema: {e.message}"))


# ------------------------------------------------------------------------------------------ mode


def _get(d, *keys, default=None):
    for k in keys:
        if isinstance(d, dict) and d.get(k) is not None:
            return d[k]
    return default


def infer_mode(config: dict, metrics: dict) -> dict:
    """What kind of run this was: aggregation, DP or not, and what the Nyström stage sent.

    Reads ``config["mode"]`` (a dict) when present, else top-level config keys, else metrics. Keys understood:
    ``aggregation`` (plain | secagg | ckks), ``privacy``/``dp``, ``nystrom`` (rows | local),
    ``rows_privacy`` (data perturbation of the rows), ``method`` (spectral clustering sends kernel rows),
    ``rule`` (model | gradient).
    """
    m = config.get("mode") if isinstance(config.get("mode"), dict) else {}
    agg = _get(m, "aggregation") or _get(config, "aggregation") or _get(metrics.get("aggregation") or {}, "protocol")
    agg = str(agg).lower() if agg else "unknown"
    agg = {"secagg+": "secagg", "secaggplus": "secagg"}.get(agg, agg)
    if agg not in ("plain", "secagg", "ckks"):
        agg = "unknown"
    priv = metrics.get("privacy")
    dp = bool(_get(m, "dp", "privacy")) or bool(_get(config, "dp", "privacy")) or bool(priv)
    nys = str(_get(m, "nystrom") or _get(config, "nystrom") or "unknown").lower()
    method = str(_get(m, "method") or _get(config, "method", "estimator") or "").lower()
    if nys in ("rows", "paper", "distance", "distances"):
        if _get(m, "rows_privacy") or _get(config, "rows_privacy", "data_perturbation"):
            nys = "perturbed_rows"
        elif "spectral" in method or "kernel" in method:
            nys = "kernel_rows"
        else:
            nys = "rows"
    elif nys in ("kernel", "kernel_rows"):
        nys = "kernel_rows"
    elif nys in ("perturbed", "perturbed_rows"):
        nys = "perturbed_rows"
    elif nys not in ("local",):
        nys = "unknown"
    rule = _get(m, "rule") or _get(config, "rule")
    return {"aggregation": agg, "dp": dp, "nystrom": nys, "rule": rule}


def what_leaves(mode: dict, *, privacy: dict | None = None, n_landmarks=None, n_features=None,
                rows_privacy: dict | None = None) -> list[dict]:
    """DESIGN §2's table, filled in for this run: every row, with ``applies`` marking the ones that hold here."""
    agg, dp, nys = mode.get("aggregation"), bool(mode.get("dp")), mode.get("nystrom")
    rule = mode.get("rule") or "model"
    upload = "gradient" if rule == "gradient" else "landmark update Y_p"
    eps = (privacy or {}).get("epsilon")
    delta = (privacy or {}).get("delta")
    releases = (privacy or {}).get("releases")
    ny = f"n_y = {n_landmarks}" if n_landmarks is not None else "n_y"
    mm = f"m = {n_features}" if n_features is not None else "m"
    exact = None
    if n_landmarks is not None and n_features is not None:
        exact = int(n_landmarks) > int(n_features)
    rows_note = ("Here n_y > m, so every record is recoverable exactly." if exact else
                 "Here n_y ≤ m, so the part of each record in the landmarks' span is recoverable." if exact is False else
                 "")
    sigma = (rows_privacy or {}).get("sigma")
    rows = [
        {"stage": "landmarks", "mode": "plain aggregation",
         "server_learns": f"every site's {upload}, every round", "applies": agg == "plain"},
        {"stage": "landmarks", "mode": "SecAgg+ or CKKS aggregation",
         "server_learns": "only the sum of the sites' updates each round" + (" (CKKS: the secret key never reaches the server)" if agg == "ckks" else ""),
         "applies": agg in ("secagg", "ckks")},
        {"stage": "landmarks", "mode": "with differential privacy",
         "server_learns": "the sum plus Gaussian noise: " + (
             f"(ε, δ) = ({eps:.4g}, {delta:.3g}) per record over all {releases if releases is not None else 'S·Q'} noisy releases"
             if isinstance(eps, (int, float)) and isinstance(delta, (int, float)) else "(ε, δ) per record, tracked over all S·Q releases") +
             (". This ε covers the landmarks only: the rows sent in the Nyström stage below are not covered by it"
              if nys in ("rows", "kernel_rows") else ""),
         "applies": dp},
        {"stage": "Nyström", "mode": "distance rows sent in the clear (paper mode)",
         "server_learns": f"one row of {ny} distances per record. With n_y > m the rows give every record back exactly "
                          f"(trilateration); with fewer landmarks the part of x in the landmarks' span ({mm}). {rows_note}".strip(),
         "applies": nys == "rows"},
        {"stage": "Nyström", "mode": "kernel rows sent in the clear (spectral clustering)",
         "server_learns": f"one row of {ny} kernel values per record: −log k / γ gives the squared distances back, so they leak "
                          f"exactly what distance rows leak. {rows_note}".strip(),
         "applies": nys == "kernel_rows"},
        {"stage": "Nyström", "mode": "rows of perturbed records (data perturbation, Sec. 5.1)",
         "server_learns": "rows of X + E, E ~ N(0, σ²)" + (f" with σ = {sigma:.4g}" if isinstance(sigma, (int, float)) else "") +
                          ", σ ≥ 2cτ_X/ε: the server recovers x + e exactly, so the noise is the only protection",
         "applies": nys == "perturbed_rows"},
        {"stage": "Nyström", "mode": "no rows (local placement)",
         "server_learns": "no per-record rows: the server embeds only the landmarks; each site places its records locally and "
                          "only their final 2-D coordinates leave the site (the reconstruction audit measures what those reveal)",
         "applies": nys == "local"},
    ]
    return rows


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


def _read_ledger(path):
    try:
        with open(path, "r", encoding="utf-8") as fh:
            lines = [ln for ln in fh.read().splitlines() if ln.strip()]
    except FileNotFoundError:
        return {"available": False, "reason": "ledger.jsonl not found"}
    kinds, bad, overrides = Counter(), 0, 0
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
            ax.step(np.maximum(f, floor), np.maximum(t, floor), where="post", label=f"{kind} (AUC {v.get('auc', float('nan')):.3f})")
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


def _embedding_png(E, labels) -> str:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5.6, 5.2))
    E = np.asarray(E, float)
    if labels is not None and len(labels) == len(E):
        lab = np.asarray(labels)
        uniq = np.unique(lab)
        cmap = plt.get_cmap("tab10" if len(uniq) <= 10 else "tab20")
        for i, u in enumerate(uniq):
            s = lab == u
            ax.scatter(E[s, 0], E[s, 1], s=4, color=cmap(i % cmap.N), label=str(u))
        if len(uniq) <= 20:
            ax.legend(markerscale=3, fontsize=7, loc="best")
    else:
        ax.scatter(E[:, 0], E[:, 1], s=4, color="tab:blue")
    ax.set_title(f"Embedding ({len(E)} records)")
    ax.set_xticks([])
    ax.set_yticks([])
    return _png(fig)


# ------------------------------------------------------------------------------------------ report


def reconstruction_verdict(rec: dict, max_fraction_within_5pct: float = 0.0) -> tuple[str, str | None]:
    """A reconstruction audit fails when more than ``max_fraction_within_5pct`` of the records were recovered to ≤ 5 %."""
    if not rec.get("available"):
        return "not audited", None
    f = float(rec["fraction_within_5pct"])
    if f > max_fraction_within_5pct:
        return "fail", (f"{100 * f:.1f} % of records are reconstructible to within 5 % relative error from what left the sites "
                        f"(median relative error {rec['median_relative_error']:.3g}, attack: {rec.get('attack', 'see report')})")
    return "pass", None


def build_report(run_dir: str) -> tuple[dict, dict]:
    """Read a run folder and return ``(report, figures)`` (``figures``: name → base64 PNG or None)."""
    run_dir = os.fspath(run_dir)
    if not os.path.isdir(run_dir):
        raise ConfigError(bad_value("run_dir", run_dir, "no such folder; pass the --out folder of `securefed run`"))
    metrics, why = _read_json(os.path.join(run_dir, "metrics.json"))
    if metrics is None:
        raise ConfigError(bad_value("run_dir", run_dir, f"{why}: run `securefed run --out {run_dir}` first "
                                    "(the report needs metrics.json)"))
    config, _ = _read_json(os.path.join(run_dir, "config.json"))
    config = config or {}
    history, _ = _read_json(os.path.join(run_dir, "history.json"))
    history = history or {}
    mia, mia_why = _read_json(os.path.join(run_dir, "audit", "mia.json"))
    rec, rec_why = _read_json(os.path.join(run_dir, "audit", "reconstruction.json"))

    mode = infer_mode(config, metrics)
    privacy = metrics.get("privacy") if isinstance(metrics.get("privacy"), dict) else None
    n_landmarks = _get(config, "n_landmarks") or _get(config.get("mode") or {}, "n_landmarks")
    n_features = _get(config, "n_features") or _get(config.get("dataset") or {}, "n_features")
    figures = {}

    # budget
    eps_hist = [float(e) for e in (history.get("epsilon") or []) if e is not None]
    if privacy:
        budget = {"available": True, "epsilon": privacy.get("epsilon"), "delta": privacy.get("delta"),
                  "epsilon_paper_formula": privacy.get("epsilon_paper_formula"), "accountant": privacy.get("accountant"),
                  "epsilon_per_round": eps_hist, "details": privacy}
    else:
        budget = {"available": False, "reason": "no differential privacy in this run: the landmarks carry no (ε, δ) guarantee",
                  "epsilon_per_round": eps_hist}
    figures["epsilon"] = _series_png(eps_hist, "ε spent (cumulative) per round", "ε", history.get("rounds")) if eps_hist else None
    mmd = [float(v) for v in (history.get("mmd") or []) if v is not None]
    figures["mmd"] = _series_png(mmd, "MMD(X, Y) per round", "MMD²", history.get("rounds")) if mmd else None

    # MIA
    if isinstance(mia, dict) and "auc" in mia:
        mia_block = {"available": True, **{k: v for k, v in mia.items() if k != "per_score"}}
        mia_block["per_score"] = {k: {kk: vv for kk, vv in v.items() if kk != "roc"} for k, v in (mia.get("per_score") or {}).items()}
        figures["roc"] = _roc_png(mia.get("per_score") or {})
    else:
        mia_block = {"available": False, "reason": mia_why or "audit/mia.json has no AUC"}
        figures["roc"] = None

    # reconstruction
    if isinstance(rec, dict) and "median_relative_error" in rec and "fraction_within_5pct" in rec:
        rec_block = {"available": True, **rec}
    elif isinstance(rec, dict) and isinstance(rec.get("risk"), dict):
        rec_block = {"available": True, **{k: v for k, v in rec.items() if k != "risk"}, **rec["risk"]}
    else:
        rec_block = {"available": False, "reason": rec_why or "audit/reconstruction.json has no risk figures"}

    # verdict
    reasons, overridden = [], False
    gate = metrics.get("audit") if isinstance(metrics.get("audit"), dict) else None
    if gate and "verdict" in gate:
        gate_status = str(gate["verdict"])
        overridden = bool(gate.get("overridden"))
        reasons += [f"landmark audit: {f}" for f in gate.get("failures", [])]
    elif mia_block["available"]:
        claimed = budget.get("epsilon") if budget["available"] else None
        dec = audit_gate(mia, AuditPolicy(), claimed_epsilon=claimed, allow_failure=True)
        gate_status = "pass" if dec.passed else "fail"
        reasons += [f"landmark audit (default policy): {f}" for f in dec.failures]
    else:
        gate_status = "not audited"
        reasons.append("landmark audit: not available (" + mia_block["reason"] + ")")
    if gate_status not in ("pass", "fail", "fail (overridden)", "not audited"):
        gate_status = "fail" if "fail" in gate_status else "pass" if gate_status == "pass" else "not audited"
    rec_status, rec_reason = reconstruction_verdict(rec_block)
    if rec_reason:
        reasons.append("reconstruction: " + rec_reason)
    if not rec_block["available"]:
        reasons.append("reconstruction audit: not available (" + rec_block["reason"] + ")")
    if "fail" in (gate_status, rec_status):
        status = "fail"
    elif gate_status == "fail (overridden)":
        status = "fail (overridden)"
        reasons.append("the landmark audit failed and was overridden with --allow-audit-failure")
    elif gate_status == "not audited" and rec_status == "not audited":
        status = "not audited"
    else:
        status = "pass"
    if status == "pass":
        reasons.insert(0, "every available check passed")

    # embedding
    E, _ = _read_npy(os.path.join(run_dir, "embedding.npy"))
    labels = None
    for name in ("y_true.npy", "labels.npy"):
        lab, _ = _read_npy(os.path.join(run_dir, name))
        if lab is not None and E is not None and len(lab) == len(E):
            labels = lab
            break
    figures["embedding"] = _embedding_png(E, labels) if (E is not None and E.ndim == 2 and E.shape[1] >= 2 and len(E)) else None

    quality = {k: v for k, v in metrics.items() if k not in ("privacy", "audit")}
    report = {
        "schema_version": SCHEMA_VERSION,
        "generated_at": _dt.datetime.now(_dt.timezone.utc).isoformat(),
        "run_dir": os.path.abspath(run_dir),
        "verdict": {"status": status, "reasons": reasons, "landmark_gate": gate_status, "reconstruction": rec_status,
                    "overridden": overridden},
        "mode": mode,
        "what_leaves": what_leaves(mode, privacy=privacy, n_landmarks=n_landmarks, n_features=n_features,
                                   rows_privacy=_get(config, "rows_privacy") if isinstance(_get(config, "rows_privacy"), dict) else None),
        "budget": budget,
        "mia": mia_block,
        "reconstruction": rec_block,
        "quality": quality,
        "parameters": config,
        "versions": _versions(config),
        "glossary": [{"term": t, "definition": d} for t, d in GLOSSARY],
        "plots": {k: v is not None for k, v in figures.items()},
        "ledger": _read_ledger(os.path.join(run_dir, "ledger.jsonl")),
    }
    return _jsonable(report), figures


# ------------------------------------------------------------------------------------------ html

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:24px auto;max-width:1100px;color:#1b1f24;background:#fff}
h1{font-size:26px;margin-bottom:4px} h2{font-size:20px;border-bottom:2px solid #d0d7de;padding-bottom:4px;margin-top:32px}
table{border-collapse:collapse;margin:8px 0;width:100%} th,td{border:1px solid #d0d7de;padding:6px 8px;text-align:left;vertical-align:top;font-size:14px}
th{background:#f3f5f7} tr.applies td{background:#fff4d6;font-weight:600}
.verdict{padding:14px 18px;border-radius:6px;font-size:18px;color:#fff;margin:12px 0}
.pass{background:#1f883d} .fail{background:#cf222e} .override{background:#bc4c00} .na{background:#6e7781}
.na-text{color:#6e7781;font-style:italic} pre{background:#f6f8fa;padding:10px;overflow:auto;font-size:12px;max-height:420px}
img{max-width:100%;border:1px solid #d0d7de;margin:6px 0} .grid{display:flex;flex-wrap:wrap;gap:12px}
.grid figure{margin:0;flex:1 1 480px} figcaption{font-size:13px;color:#57606a}
"""


def _e(x) -> str:
    return html.escape(str(x))


def _fmt(x, digits=4):
    if isinstance(x, bool) or x is None:
        return _e(x)
    if isinstance(x, (int, np.integer)):
        return _e(x)
    if isinstance(x, (float, np.floating)):
        return _e(f"{x:.{digits}g}")
    return _e(x)


def _kv_table(d: dict, keys=None) -> str:
    keys = keys or [k for k in d if not isinstance(d[k], (dict, list))]
    rows = "".join(f"<tr><th>{_e(k)}</th><td>{_fmt(d.get(k))}</td></tr>" for k in keys if k in d)
    return f"<table>{rows}</table>"


def _img(b64, alt, caption) -> str:
    if not b64:
        return f"<figure><p class='na-text'>{_e(alt)}: not available</p></figure>"
    return f"<figure><img alt='{_e(alt)}' src='data:image/png;base64,{b64}'><figcaption>{_e(caption)}</figcaption></figure>"


def render_html(report: dict, figures: dict) -> str:
    """The self-contained HTML page for ``report`` (plots embedded as base64 PNG)."""
    v = report["verdict"]
    cls = {"pass": "pass", "fail": "fail", "fail (overridden)": "override"}.get(v["status"], "na")
    parts = [
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>securefed audit report</title>",
        f"<style>{_CSS}</style></head><body>",
        "<h1>securefed privacy audit report</h1>",
        f"<p>Run folder: <code>{_e(report['run_dir'])}</code> · generated {_e(report['generated_at'])} · report schema {_e(report['schema_version'])}</p>",
        f"<h2>Verdict</h2><div class='verdict {cls}'>Verdict: {_e(v['status'].upper())}</div>",
        "<ul>" + "".join(f"<li>{_e(r)}</li>" for r in v["reasons"]) + "</ul>",
        f"<p>Landmark audit gate: <b>{_e(v['landmark_gate'])}</b> · reconstruction audit: <b>{_e(v['reconstruction'])}</b></p>",
    ]
    mode = report["mode"]
    parts.append("<h2>What leaves each site in this mode</h2>")
    parts.append(f"<p>Aggregation: <b>{_e(mode['aggregation'])}</b> · differential privacy: <b>{'yes' if mode['dp'] else 'no'}</b> · "
                 f"Nyström stage: <b>{_e(mode['nystrom'])}</b>. Highlighted rows apply to this run (DESIGN §2). "
                 "The paper's private variants protect only the landmarks; the Nyström rows are a separate release.</p>")
    parts.append("<table><tr><th>stage</th><th>mode</th><th>the server learns</th><th>applies to this run</th></tr>" + "".join(
        f"<tr class='{'applies' if r['applies'] else ''}'><td>{_e(r['stage'])}</td><td>{_e(r['mode'])}</td>"
        f"<td>{_e(r['server_learns'])}</td><td>{'yes' if r['applies'] else 'no'}</td></tr>" for r in report["what_leaves"]) + "</table>")

    b = report["budget"]
    parts.append("<h2>Privacy budget</h2>")
    if b["available"]:
        parts.append(_kv_table(b["details"] if isinstance(b.get("details"), dict) else b))
        parts.append("<p>ε is the accountant's (the one spent); the paper's Theorem-5 bound for the same noise is shown for comparison.</p>")
    else:
        parts.append(f"<p class='na-text'>{_e(b.get('reason', 'not available'))}</p>")
    parts.append("<div class='grid'>" + _img(figures.get("epsilon"), "ε spent per round", "Cumulative ε after each round (accountant).")
                 + _img(figures.get("mmd"), "MMD per round", "MMD between the records and the landmarks after each round.") + "</div>")

    m = report["mia"]
    parts.append("<h2>Membership inference on the landmarks</h2>")
    if m["available"]:
        parts.append(_kv_table(m, ["auc", "auc_se", "tpr_at_fpr_1e2", "tpr_at_fpr_1e3", "empirical_epsilon", "empirical_mu",
                                   "delta", "confidence", "best_score", "n_members", "n_nonmembers", "n_sites", "aggregation"]))
        rows = "".join(f"<tr><td>{_e(k)}</td><td>{_fmt(s.get('auc'))}</td><td>{_fmt(s.get('tpr_at_fpr_1e2'))}</td>"
                       f"<td>{_fmt(s.get('tpr_at_fpr_1e3'))}</td><td>{_fmt(s.get('epsilon_lb'))}</td><td>{_fmt(s.get('mu_lb'))}</td></tr>"
                       for k, s in m.get("per_score", {}).items())
        parts.append("<table><tr><th>score</th><th>AUC</th><th>TPR @ FPR 1e-2</th><th>TPR @ FPR 1e-3</th><th>ε lower bound</th>"
                     f"<th>μ lower bound</th></tr>{rows}</table>")
        parts.append(f"<p><b>Threat model.</b> {_e(m.get('threat_model', ''))}</p>")
    else:
        parts.append(f"<p class='na-text'>Not available: {_e(m.get('reason'))}</p>")
    parts.append("<div class='grid'>" + _img(figures.get("roc"), "ROC curve", "Log-scale ROC of each attack score against the no-signal diagonal.") + "</div>")

    r = report["reconstruction"]
    parts.append("<h2>Reconstruction risk (the server's best reconstruction of records)</h2>")
    if r["available"]:
        parts.append(_kv_table(r, [k for k in r if k != "available" and not isinstance(r[k], (dict, list))]))
    else:
        parts.append(f"<p class='na-text'>Not available: {_e(r.get('reason'))}</p>")

    parts.append("<h2>Embedding and quality</h2><div class='grid'>" + _img(figures.get("embedding"), "Embedding", "The final map, coloured by label when known.") + "</div>")
    q = report["quality"]
    parts.append(_kv_table(q) if q else "<p class='na-text'>No quality figures.</p>")

    led = report["ledger"]
    parts.append("<h2>Privacy ledger</h2>")
    parts.append(_kv_table({"events": led.get("n_events"), "overrides recorded": led.get("overrides"),
                            "event kinds": json.dumps(led.get("kinds"))}) if led["available"]
                 else f"<p class='na-text'>Not available: {_e(led.get('reason'))}</p>")

    parts.append("<h2>All parameters</h2>")
    parts.append(f"<pre>{_e(json.dumps(report['parameters'], indent=2, sort_keys=True))}</pre>" if report["parameters"]
                 else "<p class='na-text'>config.json not available.</p>")
    ver = report["versions"]
    parts.append(f"<h2>Library versions</h2><p>Source: {_e(ver['source'])}</p>"
                 + _kv_table({k: (x if x is not None else 'not installed') for k, x in ver["libraries"].items()}))
    parts.append("<h2>Glossary</h2><table>" + "".join(f"<tr><th>{_e(g['term'])}</th><td>{_e(g['definition'])}</td></tr>"
                                                     for g in report["glossary"]) + "</table>")
    parts.append("</body></html>")
    return "".join(parts)


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
        The ``--out`` folder of ``securefed run`` (``metrics.json`` is required).
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
        raise ConfigError(bad_value("out", out_dir, f"cannot create the folder ({exc.strerror}); pick a writable path")) from None
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
