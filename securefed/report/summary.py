"""The parts of the report written for its reader: the run's mode read from every file that records it, the
release inventory, the per-site table, quality beside privacy, warnings, the verdict's remedies, and the summary
in plain words (what left each site, who could learn what, what ε means here).

Everything here is a pure function of a :class:`RunFolder` (the parsed files of a ``securefed run --out``
folder; older folders lack ``result.json`` and the inventory, and each part says what it could not find).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field

from .labels import AGGREGATION_NAMES, count, label, percent, plain_failure, plain_release, points, show

__all__ = [
    "RunFolder",
    "infer_mode",
    "privacy_block",
    "epsilon_is_void",
    "release_inventory",
    "site_table",
    "utility_table",
    "run_warnings",
    "remedies",
    "summary",
    "checks_against_limits",
    "worst_gap",
    "per_record_release",
    "coordinates_kept",
    "odds_factor",
]


@dataclass
class RunFolder:
    """The parsed files of one run folder (missing ones are ``None`` / empty, with the reason)."""

    path: str
    config: dict
    metrics: dict
    result: dict | None = None
    history: dict = field(default_factory=dict)
    mia: dict | None = None
    rec: dict | None = None
    why: dict = field(default_factory=dict)

    @property
    def options(self) -> dict:
        """The plan's options: result.json's, else config.json's."""
        for src in (self.result or {}, self.config):
            if isinstance(src.get("options"), dict):
                return src["options"]
        return {}


def _first(*values):
    for v in values:
        if v is not None and v != "":
            return v
    return None


def _dict(x) -> dict:
    return x if isinstance(x, dict) else {}


def infer_mode(config: dict, metrics: dict, result: dict | None = None) -> dict:
    """What kind of run this was: aggregation, DP or not, what the embedding stage sent, method, rule.

    Every file that records the mode is read, the run's own record first: ``result.json`` ``options`` (the
    coordinator's plan), ``config.json`` ``mode`` / ``options`` / top-level keys, then ``metrics.json``.
    """
    result = _dict(result)
    ro, cm, co, mm = (
        _dict(result.get("options")),
        _dict(config.get("mode")),
        _dict(config.get("options")),
        _dict(metrics.get("mode")),
    )
    agg = _first(
        ro.get("aggregation"),
        cm.get("aggregation"),
        co.get("aggregation"),
        config.get("aggregation"),
        mm.get("aggregation"),
        _dict(metrics.get("aggregation")).get("protocol"),
        _dict(result.get("aggregation")).get("protocol"),
    )
    agg = str(agg).lower() if agg else "unknown"
    agg = {"secagg+": "secagg", "secaggplus": "secagg"}.get(agg, agg)
    if agg not in ("plain", "secagg", "ckks"):
        agg = "unknown"
    dp_opts = any(o.get(k) is not None for o in (ro, co) for k in ("epsilon", "noise_multiplier"))
    dp = bool(
        dp_opts
        or cm.get("dp")
        or mm.get("dp")
        or config.get("dp")
        or config.get("privacy")
        or metrics.get("privacy")
        or result.get("privacy")
    )
    nys = str(
        _first(
            ro.get("nystrom"),
            cm.get("nystrom"),
            co.get("nystrom"),
            config.get("nystrom"),
            mm.get("nystrom"),
            _dict(result.get("embedding")).get("nystrom"),
        )
        or "unknown"
    ).lower()
    method = str(
        _first(
            ro.get("method"),
            cm.get("method"),
            co.get("method"),
            mm.get("method"),
            metrics.get("method"),
            config.get("method"),
            config.get("estimator"),
        )
        or ""
    ).lower()
    rows_privacy = bool(
        _first(
            ro.get("rows_epsilon"),
            co.get("rows_epsilon"),
            cm.get("rows_privacy"),
            config.get("rows_privacy"),
            config.get("data_perturbation"),
        )
    )
    if nys in ("rows", "paper", "distance", "distances"):
        nys = (
            "perturbed_rows"
            if rows_privacy
            else "kernel_rows"
            if ("spectral" in method or "kernel" in method)
            else "rows"
        )
    elif nys in ("kernel", "kernel_rows"):
        nys = "kernel_rows"
    elif nys in ("perturbed", "perturbed_rows"):
        nys = "perturbed_rows"
    elif nys != "local":
        nys = "unknown"
    rule = _first(ro.get("rule"), cm.get("rule"), co.get("rule"), config.get("rule"))
    landmark_method = _first(
        ro.get("landmark_method"),
        cm.get("landmark_method"),
        co.get("landmark_method"),
        mm.get("landmark_method"),
        _dict(result.get("landmark_stage")).get("method"),
    )
    cell_floor = _first(ro.get("cell_floor"), cm.get("cell_floor"), co.get("cell_floor"), mm.get("cell_floor"))
    return {
        "aggregation": agg,
        "dp": dp,
        "nystrom": nys,
        "rule": rule,
        "method": method or None,
        "landmark_method": landmark_method,
        "cell_floor": cell_floor,
    }


def privacy_block(run: RunFolder) -> dict | None:
    p = run.metrics.get("privacy")
    if not isinstance(p, dict):
        p = _dict(run.result).get("privacy")
    return p if isinstance(p, dict) and p else None


def paper_formula(privacy: dict | None):
    """The paper's ε formula under either of its key names (it is not a bound)."""
    p = privacy or {}
    return _first(p.get("epsilon_paper_formula"), p.get("epsilon_paper_bound"))


def epsilon_is_void(run: RunFolder, privacy: dict | None) -> bool:
    """Seeded (test) noise voids ε: whoever knows the seed can subtract the noise."""
    p = privacy or {}
    if p.get("epsilon_void"):
        return True
    if "seeded" in str(p.get("noise_source", "")).lower():
        return True
    opts = run.options
    return any(opts.get(k) is not None for k in ("noise_seed_for_testing", "insecure_noise_seed_for_testing"))


def _n_records(run: RunFolder):
    sizes = run.config.get("site_sizes")
    return _first(
        run.metrics.get("n_samples"),
        _dict(run.config.get("dataset")).get("n_samples"),
        sum(sizes) if isinstance(sizes, list) and sizes else None,
    )


# ------------------------------------------------------------------------------------------ release inventory


def _covered(value, dp: bool) -> str:
    if not dp:
        return "no DP"
    if value is True or (
        isinstance(value, str) and (value.lower().startswith("yes") or "post-processing" in value.lower())
    ):
        return "yes"
    if isinstance(value, str) and value.lower().startswith("by rows"):
        return "yes"
    return "no"


def _coverage_note(value) -> str:
    return value if isinstance(value, str) and value.lower() not in ("yes", "no") else ""


def release_inventory(run: RunFolder, mode: dict) -> list[dict]:
    """Every data-dependent output of the run: what, who receives it, whether ε covers it.

    The run's own inventory (``metrics.json`` / ``result.json`` ``inventory``) when present, else one row per
    ``released`` string; then the outputs every run folder has whether or not the run listed them (site sizes,
    the quality metrics, the centralized comparison, the audits' figures, clip counts).
    """
    dp = bool(mode.get("dp"))
    rows = _listed_releases(run, dp)
    have = " ".join(r["what"].lower() for r in rows)
    return rows + _unlisted_releases(run, mode, dp, have)


def _listed_releases(run: RunFolder, dp: bool) -> list[dict]:
    """The releases the run listed itself: its ``inventory`` rows when it wrote any, else one row per ``released``
    string (a landmark update or gradient counted as covered by ε under DP)."""
    raw = run.metrics.get("inventory") or _dict(run.result).get("inventory")
    rows = []
    if isinstance(raw, list) and raw:
        for r in raw:
            if isinstance(r, dict) and r.get("what"):
                to = str(r.get("to") or "the coordinator")
                rows.append(
                    {
                        "what": plain_release(r["what"]),
                        "to": "this report" if to == "this run folder" else to,
                        "covered": _covered(r.get("covered_by_epsilon"), dp),
                        "note": plain_release(
                            "; ".join(
                                x for x in (_coverage_note(r.get("covered_by_epsilon")), str(r.get("note") or "")) if x
                            )
                        ),
                        "source": "run",
                    }
                )
    else:
        for s in run.metrics.get("released") or _dict(run.result).get("released") or []:
            noisy = dp and any(k in s for k in ("landmark update", "gradient", "sum over sites of the landmark"))
            rows.append(
                {
                    "what": plain_release(s),
                    "to": "the coordinator",
                    "covered": "yes" if noisy else ("no" if dp else "no DP"),
                    "note": "",
                    "source": "run",
                }
            )
    return rows


def _unlisted_releases(run: RunFolder, mode: dict, dp: bool, have: str) -> list[dict]:
    """The outputs every run folder has that the run's own list (``have``: its rows' names, lower case) does not
    name: site sizes, the landmark updates and landmarks, the audits' figures, clip counts, the quality metrics and
    the centralized comparison — each one only where the run folder shows it was produced."""
    rows = []
    privacy = privacy_block(run)
    agg = {"secagg": "SecAgg+", "ckks": "CKKS", "plain": "plain sums"}.get(
        mode.get("aggregation"), "aggregation not recorded"
    )
    feddl = (mode.get("landmark_method") or "feddl") == "feddl"  # cells and the billboard name their own sums
    updates = (
        "the sum over sites of the landmark updates, every round"
        if mode.get("aggregation") != "plain"
        else "each site's own landmark update, every round"
    ) + f" ({agg})"
    extra = [
        (
            ("record count", "site size"),
            "each site's number of records",
            "the coordinator",
            "public by design (the noise is calibrated to it); also readable from the per-site noise scale"
            if dp
            else "",
        ),
        (("landmark update",), updates, "the coordinator", "Gaussian noise added before the sum" if dp else ""),
        (("landmarks",), "the landmarks, every round", "every site", "post-processing of the noisy sums" if dp else ""),
        (
            ("roc counts", "membership-audit"),
            "the membership audit's ROC counts (members vs held-out records), summed over sites",
            "the coordinator",
            "aggregate counts on public score grids",
        ),
        (
            ("clip",),
            "each site's count of records clipped to τ_X",
            "this report",
            "counted on each site; not sent to the coordinator — the simulation reads it for this report",
        ),
        (
            ("quality metrics",),
            "quality metrics of the map (CA-kNN, trustworthiness, NMI) computed against the pooled records",
            "this report",
            "exists only in this simulation",
        ),
        (
            ("centralized",),
            "the centralized comparison (the method on the pooled records) and its panel in embedding.png",
            "this report",
            "exists only in this simulation",
        ),
        (
            ("reconstruction audit",),
            "the reconstruction audit's figures (the coordinator's rebuild compared with the true records)",
            "this report",
            "exists only in this simulation",
        ),
    ]
    ran_rounds = (
        bool(run.result)
        or bool(run.history.get("rounds"))
        or isinstance(run.metrics.get("audit"), dict)
        or os.path.exists(os.path.join(run.path, "landmarks.npy"))
    )
    present = {
        "each site's number of records": True,
        updates: ran_rounds and feddl,
        "the landmarks, every round": bool(run.result) or os.path.exists(os.path.join(run.path, "landmarks.npy")),
        "the membership audit's ROC counts (members vs held-out records), summed over sites": run.mia is not None
        or isinstance(run.metrics.get("audit"), dict),
        "each site's count of records clipped to τ_X": bool(privacy and privacy.get("clipped_records") is not None),
        "quality metrics of the map (CA-kNN, trustworthiness, NMI) computed against the pooled records": bool(
            run.metrics.get("federated")
        ),
        "the centralized comparison (the method on the pooled records) and its panel in embedding.png": bool(
            run.metrics.get("centralized")
        ),
        "the reconstruction audit's figures (the coordinator's rebuild compared with the true records)": run.rec
        is not None
        or bool(run.metrics.get("reconstruction_audit")),
    }
    for keys, what, to, note in extra:
        if present[what] and not any(k in have for k in keys):
            covered = (
                "yes" if (dp and (what.startswith("the landmarks") or what == updates)) else ("no" if dp else "no DP")
            )
            rows.append({"what": what, "to": to, "covered": covered, "note": note, "source": "report"})
    return rows


# ------------------------------------------------------------------------------------------ per-site table


def _site_ledger_releases(run_dir: str, site: str, run_id) -> int | None:
    """Noisy releases recorded in ``site-ledgers/<site>/<run_id>.jsonl`` (never another run's ledger)."""
    if not run_id:
        return None
    path = os.path.join(run_dir, "site-ledgers", site, f"{run_id}.jsonl")
    try:
        with open(path, encoding="utf-8") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return None
    n = 0
    for ln in lines:
        try:
            ev = json.loads(ln)
        except json.JSONDecodeError:
            continue
        if isinstance(ev, dict) and ev.get("type") == "release" and ev.get("run_id") in (None, run_id):
            n += 1
    return n


def _per_site_value(v, i: int, name: str):
    if isinstance(v, list):
        return v[i] if i < len(v) else None
    if isinstance(v, dict):
        return _first(v.get(name), v.get(str(i)))
    return None


def site_table(run: RunFolder) -> dict:
    """One row per site: records, held out for the audit, clipped, ε spent, releases in its own ledger, bytes sent."""
    res = _dict(run.result)
    sizes = run.config.get("site_sizes")
    names = res.get("sites") or run.config.get("sites")
    if not isinstance(names, list) or not names:
        if not isinstance(sizes, list) or not sizes:
            return {
                "available": False,
                "reason": "the run folder does not record the sites (config.json site_sizes)",
                "rows": [],
            }
        names = [f"site {i + 1}" for i in range(len(sizes))]
    members, holdouts = res.get("site_sizes"), res.get("holdouts")
    privacy = privacy_block(run) or {}
    run_id = _first(res.get("run_id"), run.config.get("run_id"))
    sent = {n: 0 for n in names}
    any_bytes = False
    for step in res.get("steps") or []:
        for n, b in _dict(step.get("bytes_from_site")).items():
            if n in sent and isinstance(b, (int, float)):
                sent[n] += int(b)
                any_bytes = True
    for n, b in _dict(_dict(res.get("embedding")).get("bytes_from_site")).items():
        if n in sent and isinstance(b, (int, float)):
            sent[n] += int(b)
            any_bytes = True
    rows = []
    for i, n in enumerate(names):
        rec = _per_site_value(sizes, i, n)
        held = _per_site_value(holdouts, i, n)
        if rec is None and _per_site_value(members, i, n) is not None:
            rec = int(_per_site_value(members, i, n)) + int(held or 0)
        rows.append(
            {
                "site": str(n),
                "records": rec,
                "held_out": held,
                "clipped": _per_site_value(privacy.get("clipped_per_site"), i, n),
                "epsilon_spent": _per_site_value(privacy.get("epsilon_per_site"), i, n),
                "site_ledger_releases": _site_ledger_releases(run.path, str(n), run_id),
                "bytes_sent": sent[n] if any_bytes else None,
            }
        )
    return {
        "available": True,
        "rows": rows,
        "notes": [
            x
            for x in (
                "records held out of the landmarks are the membership audit's non-members; they are still placed on the map"
                if holdouts
                else None,
                "clipped counts are counted on each site and never sent to the coordinator"
                if privacy.get("clipped_per_site") is not None
                else None,
                "bytes sent: every secure sum and the embedding stage, from this site to the coordinator"
                if any_bytes
                else None,
            )
            if x
        ],
    }


# ------------------------------------------------------------------------------------------ utility


def utility_table(run: RunFolder, mode: dict) -> dict:
    """Federated vs centralized for the figures a reader compares (gap in percentage points)."""
    fed, cen = _dict(run.metrics.get("federated")), _dict(run.metrics.get("centralized"))
    clustering = "spectral" in str(mode.get("method") or run.metrics.get("method") or "")
    keys = ("nmi", "ari") if clustering else ("ca_10nn", "trustworthiness", "nmi")
    rows = []
    for k in keys:
        f, c = fed.get(k), cen.get(k)
        if f is None and c is None:
            continue
        rows.append({"metric": k, "label": label(k), "federated": f, "centralized": c, "gap_points": points(f, c)})
    if not rows:
        why = (
            "the run stopped before the map was drawn"
            if not fed and run.metrics.get("audit")
            else "no quality figures in metrics.json (unlabelled data give no class agreement)"
        )
        return {"available": False, "reason": why, "rows": [], "kind": "clustering" if clustering else "map"}
    return {"available": True, "rows": rows, "kind": "clustering" if clustering else "map"}


# ------------------------------------------------------------------------------------------ warnings


def run_warnings(run: RunFolder, mode: dict, privacy: dict | None) -> list[str]:
    out = []
    p = privacy or {}
    clipped = p.get("clipped_records")
    n = _n_records(run)
    if isinstance(clipped, (int, float)) and clipped > 0:
        share = f" ({percent(clipped / n)})" if isinstance(n, (int, float)) and n else ""
        tau = p.get("tau_x")
        out.append(
            f"{count(clipped)} of {count(n) if n else '?'} records{share} were clipped to the norm bound "
            f"τ_X = {show(tau)}: their pull on the landmarks was shrunk, which the privacy guarantee needs but which "
            "distorts the map where they lie; a larger --clip-norm clips fewer (and costs more noise)"
        )
    agg_clipped = _dict(run.metrics.get("aggregation")).get("clipped")
    if isinstance(agg_clipped, (int, float)) and agg_clipped > 0:
        out.append(
            f"{count(agg_clipped)} values were clipped to the secure sum's fixed-point range (--value-bound): "
            "the sums the coordinator got are slightly off"
        )
    if epsilon_is_void(run, privacy):
        out.append(
            "ε is VOID: the noise was drawn from a seed meant for testing (--noise-seed-for-testing); whoever knows "
            "the seed can subtract the noise. Never file this run as private"
        )
    if p.get("paper_formula_below_true_epsilon"):
        out.append("the paper's ε formula gives less than the true ε here: quote the accountant's ε, not the formula")
    for w in run.metrics.get("warnings") or _dict(run.result).get("warnings") or []:
        w = str(w)
        if w not in out:
            out.append(w)
    return out


# ------------------------------------------------------------------------------------------ remedies


def remedies(mode: dict, verdict: dict, gate: dict | None, rec_block: dict, void: bool) -> list[str]:
    """What to change so the next run passes (one line per failing check), each a remedy that removes the failing
    release rather than one that might (tests re-run each remedy and check that it passes)."""
    out = []
    nys = mode.get("nystrom")
    spectral = "spectral" in str(mode.get("method"))
    if verdict.get("reconstruction") == "fail":
        if nys in ("rows", "kernel_rows"):
            out.append(
                "Run with --nystrom local: the sites then place their own records and send no per-record rows "
                "(in this mode each row lets the coordinator rebuild its record); if the coordinates it then "
                "receives still let it rebuild records, add --coordinates keep."
            )
        elif nys == "perturbed_rows":
            out.append(
                "Run with --nystrom local (no per-record rows), or lower --rows-epsilon (more noise on each row)."
            )
        else:
            what = "cluster label" if spectral else "2-D coordinate"
            out.append(
                f"Run with --coordinates keep: each record's {what} then stays on its site (the sites still share "
                f"the map), so the coordinator receives nothing per record to rebuild records from. --epsilon "
                f"alone does not help: a record's own {what} is outside ε."
            )
    failures = " ".join(str(f) for f in (gate or {}).get("failures", [])).lower()
    if verdict.get("landmark_gate") in ("fail", "fail (overridden)"):
        if "claimed" in failures or "within" in failures:
            out.append(
                "The attack proved more leakage than the claimed ε: the noise is not what the accountant assumed. "
                "Do not file this run; rerun without any testing seed and report the mismatch."
            )
        if mode.get("dp"):
            out.append(
                "Lower --epsilon (more noise) or --landmarks, or fewer --rounds: the landmarks reveal which records "
                "trained them."
            )
        elif mode.get("landmark_method") == "cells":
            out.append(
                "Raise --cell-floor (each landmark is then the mean of more records), or add --epsilon (the DP "
                "landmarks): the landmarks reveal which records trained them."
            )
        else:
            out.append(
                "Lower --landmarks or add --epsilon (differential privacy on the landmarks): the landmarks reveal "
                "which records trained them."
            )
    if verdict.get("status") == "fail (overridden)" or verdict.get("overridden"):
        out.append(
            "This run went on after a failed audit because of --allow-audit-failure: drop that flag and apply the "
            "remedy above."
        )
    if verdict.get("landmark_gate") == "not audited" and verdict.get("reconstruction") in (
        "not audited",
        "nothing left",
    ):
        out.append(
            "Run with the audit on (the default; --audit-holdout 0.2) so the report can check the landmarks and "
            "what left the sites."
        )
    if void:
        out.append("Rerun without --noise-seed-for-testing: only secret noise gives the stated ε.")
    return out


# ------------------------------------------------------------------------------------------ summary

#: above this ε the guarantee is reported as meaningless (the odds factor e^ε exceeds 22 000)
MEANINGFUL_EPSILON = 10.0
#: the un-noised release beside every DP run: the audit's summed ROC counts (issue: named on the first screen)
ROC_OUTSIDE_EPSILON = (
    "the membership audit's ROC counts (members vs held-out records, summed over sites) are "
    "released outside ε: un-noised aggregate counts"
)


def odds_factor(eps: float) -> str:
    """e^ε as a reader sees it, without overflowing: ``"7.39"`` for ε = 2, ``"10^4.34e+08"`` for ε = 1e9."""
    if eps < 700:
        return show(math.exp(eps), 3)
    return "10^" + show(eps / math.log(10.0), 3)


def coordinates_kept(run: RunFolder, mode: dict) -> bool:
    """Nothing per record left the sites: ``--coordinates keep`` (the sites kept their coordinates / labels)."""
    rec = _dict(run.metrics.get("reconstruction_audit"))
    emb = _dict(_dict(run.result).get("embedding"))
    return (
        rec.get("mode") == "kept"
        or bool(emb.get("kept_on_sites"))
        or (run.options.get("coordinates") == "keep" and mode.get("nystrom") == "local")
    )


def _stopped_at_gate(run: RunFolder) -> bool:
    return not run.metrics.get("federated") and isinstance(run.metrics.get("audit"), dict) and not run.result


def per_record_release(run: RunFolder, mode: dict) -> str:
    """One sentence: what, per record, left the sites (the first thing a reader must know)."""
    nys = mode.get("nystrom")
    spectral = "spectral" in str(mode.get("method"))
    what = "cluster label" if spectral else "2-D coordinate on the map"
    if _stopped_at_gate(run) or (
        not run.metrics.get("federated")
        and isinstance(run.metrics.get("audit"), dict)
        and _dict(run.metrics.get("audit")).get("verdict") == "fail"
    ):
        return "Nothing per record left any site: the run stopped at its audit gate, before the map."
    if coordinates_kept(run, mode):
        return (
            f"Nothing per record left any site: each record's {what} stayed on its site (--coordinates keep); the "
            "coordinator received only the sums and counts listed here."
        )
    if nys == "local":
        return (
            f"Each record's {what} went to the coordinator — outside ε: a record's own output is a function of that "
            "record (--coordinates keep keeps them on the sites)."
        )
    if nys in ("rows", "kernel_rows"):
        return (
            "One row of distances per record went to the coordinator (the paper's rows mode): the rows give the "
            "records back."
        )
    if nys == "perturbed_rows":
        return "One row per noised record went to the coordinator: the noise on each row is its only protection."
    return "What left the sites per record is not recorded in this run folder."


def _epsilon_sentence(privacy: dict | None, mode: dict, void: bool, inventory: list[dict]) -> str:
    if not mode.get("dp") or not privacy:
        return (
            "No differential privacy in this run: no ε bounds what the coordinator's view reveals about any one "
            "record; only the audits below measure it, empirically."
        )
    eps, delta = privacy.get("epsilon"), privacy.get("delta")
    if not isinstance(eps, (int, float)) or not math.isfinite(eps):
        return "Differential privacy was on, but the run folder does not record the ε spent."
    if void:
        return f"ε = {show(eps, 3)} is VOID in this run: the noise came from a testing seed, so it bounds nothing."
    d = f"δ = {show(delta, 3)}" if isinstance(delta, (int, float)) else "a small δ"
    s = (
        f"ε = {show(eps, 3)} bounds how much any one patient's record can change what the coordinator sees of the "
        f"landmark training: at most a factor e^{show(eps, 3)} ≈ {odds_factor(eps)} in the odds of any conclusion drawn "
        f"from it, except with probability {d}."
    )
    if eps > MEANINGFUL_EPSILON:
        s += (
            f" An ε above {MEANINGFUL_EPSILON:g} bounds nothing a reader would call private: the noise is too small "
            "to hide any one record."
        )
    outside = [
        r["what"]
        for r in inventory
        if r["covered"] == "no"
        and r["to"] not in ("this report", "its own site")
        and not r["what"].lower().startswith("nothing")
    ]
    per_record = [w for w in outside if "per record" in w or "coordinate" in w or "row" in w or "label" in w]
    if per_record:
        s += f" It does not cover {per_record[0]}: a record's own output is a function of that record."
    s += f" Also outside ε: {ROC_OUTSIDE_EPSILON}."
    return s


def _left_each_site(inventory: list[dict], run: RunFolder) -> list[str]:
    out = [r["what"] for r in inventory if r["to"] == "the coordinator"]
    if not out and isinstance(run.metrics.get("audit"), dict) and not run.metrics.get("federated"):
        out = ["only what the landmark stage needs: the run stopped at the audit gate, before anything per record left"]
    return out or ["not recorded in this run folder (no result.json, no released list in metrics.json)"]


def _who_learns(mode: dict, privacy: dict | None, rec_block: dict, run: RunFolder, guarantee: dict) -> list[dict]:
    agg, nys, dp = mode.get("aggregation"), mode.get("nystrom"), bool(mode.get("dp"))
    eps = (privacy or {}).get("epsilon")
    eps_txt = (
        f" plus noise (ε = {show(eps, 3)})" if dp and isinstance(eps, (int, float)) else " plus noise" if dp else ""
    )
    method = mode.get("landmark_method") or "feddl"
    if method == "cells":
        floor = mode.get("cell_floor") or "the floor"
        lm = (
            f"{'each site' if agg == 'plain' else 'only the sum over sites'} of the cell tree's record counts and, for "
            f"cells of at least {floor} records, of their feature sums, sums of squares and second moments on a few public axes — over nested cells of "
            f"≥ {floor} records each (a floor, and a check that no smaller set of records is a combination of the "
            "released sums, that every site applies to its own records)"
        )
    elif method == "billboard":
        lm = f"two noisy sums over sites (a random-feature mean embedding of the records and the landmark counts){eps_txt}"
    elif agg == "plain":
        lm = f"each site's own landmark update every round{eps_txt}"
    elif agg in ("secagg", "ckks"):
        lm = f"only the sum over sites of the landmark updates{eps_txt} ({'SecAgg+' if agg == 'secagg' else 'CKKS'} hides each site's own)"
    else:
        lm = f"the landmark updates{eps_txt} (aggregation not recorded)"
    stopped = _stopped_at_gate(run)
    kept = coordinates_kept(run, mode)
    spectral = "spectral" in str(mode.get("method"))
    if stopped:
        per = "nothing per record: the run stopped at the audit gate"
    elif kept:
        per = (
            f"nothing per record: every record's {'cluster label' if spectral else 'coordinate'} stayed on its site "
            "(--coordinates keep)"
        )
    elif rec_block.get("available"):
        f = rec_block.get("fraction_within_5pct")
        base = rec_block.get("baseline_fraction_within_5pct")
        per_txt = f"the reconstruction audit rebuilt {percent(f, 1)} of records to within 5 %" + (
            f"; guessing the average record: {percent(base, 1)}" if isinstance(base, (int, float)) else ""
        )
        per = {
            "rows": f"one row of distances per record — enough to rebuild records ({per_txt})",
            "kernel_rows": f"one row of kernel values per record — enough to rebuild records ({per_txt})",
            "perturbed_rows": f"one row per noised record — the noise is the only protection ({per_txt})",
            "local": ("each record's cluster label" if spectral else "each record's final 2-D coordinate")
            + f", outside ε ({per_txt})",
        }.get(nys, per_txt)
    else:
        per = {
            "rows": "one row of distances per record (rebuilds records; not audited here)",
            "kernel_rows": "one row of kernel values per record (rebuilds records; not audited here)",
            "local": "each record's final coordinate on the map, outside ε (not audited here)",
        }.get(nys, "not recorded")
    sites = (
        "the landmarks (synthetic points, not records) and the kernel bandwidth, every round"
        if method == "feddl"
        else "the landmarks (computed from the cells' means and second moments over ≥ the floor, not records), their "
        "masses and their map"
        if method == "cells"
        else "the billboard: the DP landmarks, their masses and their map"
    )
    sites += (
        "; with DP, what a site learns about another site's records is bounded by ε (joint differential privacy: "
        "each site places its own records from the shared landmarks only — Hsu et al. 2014)"
        if dp
        else "; without DP the landmarks are fitted to every site's records — the membership audit measures what they reveal"
    )
    sites += ". No site receives another site's records, rows or positions."
    deviating = (
        "nothing more than a coordinator that follows the protocol: the sites check what it asks of them"
        if guarantee["holds_against_deviating_coordinator"]
        else "not covered by this verdict — " + "; ".join(guarantee["reasons"] or ["no check recorded"])
    )
    return [
        {"who": "the coordinator (following the protocol)", "learns": f"how many records each site holds; {lm}; {per}"},
        {"who": "a coordinator that deviates", "learns": deviating},
        {"who": "a coordinator colluding with a site", "learns": guarantee["collusion"]},
        {"who": "the other sites", "learns": sites},
        {
            "who": "the reader of this report",
            "learns": (
                "the audit figures only: the run stopped before the map was drawn"
                if stopped
                else "the quality figures"
                + (" and the centralized comparison" if run.metrics.get("centralized") else "")
                + ", computed on the pooled records — they exist only in this simulation"
            ),
        },
    ]


#: the short name of each quality figure in a sentence
_SHORT = {"ca_10nn": "CA-10NN", "trustworthiness": "trustworthiness", "nmi": "NMI", "ari": "ARI"}


def _short(row: dict) -> str:
    return _SHORT.get(row.get("metric"), str(row.get("label")))


def worst_gap(util: dict) -> dict | None:
    """The utility row with the most negative gap to the centralized method (the map's worst figure), or None."""
    rows = [r for r in util.get("rows", []) if r.get("gap_points") is not None] if util.get("available") else []
    return min(rows, key=lambda r: r["gap_points"]) if rows else None


def _quality_sentence(util: dict, dp: bool, cells: bool = False) -> str | None:
    """How good the map is, its worst gap to the centralized method named first (never only the best figure)."""
    if not util.get("available"):
        return None
    worst = worst_gap(util)
    rows = ([worst] if worst else []) + [r for r in util["rows"] if r is not worst]
    parts = []
    for r in rows:
        short = _short(r)
        if r["centralized"] is None:
            parts.append(f"{short} {show(r['federated'], 3)} (no centralized comparison)")
        elif r["gap_points"] is not None:
            parts.append(
                f"{short} {show(r['federated'], 3)} vs {show(r['centralized'], 3)} ({r['gap_points']:+.1f} points)"
            )
        else:
            parts.append(f"{short} {show(r['federated'], 3)} vs {show(r['centralized'], 3)}")
    kind = "clustering" if util.get("kind") == "clustering" else "map"
    if worst is not None and worst["gap_points"] < 0:
        s = f"Worst gap to the same method on the pooled records: {parts[0]}."
        if parts[1:]:
            s += " Also " + "; ".join(parts[1:]) + "."
    else:
        s = f"Quality of the {kind}: " + "; ".join(parts) + "."
    if worst is not None and worst["gap_points"] <= -10:
        s += " Far from the centralized one: check it before relying on it (" + (
            "more records sharpen it; a larger --epsilon barely does — on a few thousand records the measured "
            "DP map is nearly flat in ε (MNIST-5k: 4 points from ε = 1 to no noise at all; the landmarks' fit "
            "limits it) — and costs privacy)."
            if dp
            else "more records, or a lower --cell-floor — more, smaller cells, at a privacy cost the membership audit "
            "measures)."
            if cells
            else "more records or more --landmarks sharpen it, at a privacy cost the membership audit measures)."
        )
    return s


def checks_against_limits(
    run: RunFolder,
    mode: dict,
    verdict: dict,
    gate: dict | None,
    mia_block: dict,
    rec_block: dict,
    privacy: dict | None,
    max_rebuilt: float,
) -> list[dict]:
    """Each privacy check's figure against its limit: the membership attack's AUC and empirical ε (the audit gate's
    policy), the records the coordinator rebuilds beyond guessing the average record, and under DP the ε spent
    against the ε asked for. ``result``: pass, fail, fail (overridden), not run, or nothing left."""
    opts = run.options
    gate = gate or {}
    out = []
    max_auc = _first(opts.get("max_auc"), 0.6)
    max_emp = _first(opts.get("max_empirical_epsilon"), 1.0)
    auc = _first(gate.get("auc"), mia_block.get("auc") if mia_block.get("available") else None)
    emp = _first(
        gate.get("empirical_epsilon"), mia_block.get("empirical_epsilon") if mia_block.get("available") else None
    )
    gate_status = verdict.get("landmark_gate")
    ran = gate_status != "not audited" and auc is not None

    def status(ok: bool) -> str:
        return "pass" if ok else ("fail (overridden)" if gate_status == "fail (overridden)" else "fail")

    out.append(
        {
            "check": "membership attack on the landmarks: AUC (0.5 = coin toss)",
            "figure": f"{auc:.3f}" if ran else "—",
            "limit": f"≤ {show(max_auc, 3)}",
            "result": status(auc <= max_auc) if ran else "not run",
        }
    )
    out.append(
        {
            "check": "ε that attack proves at least (empirical bound)",
            "figure": f"{emp:.2f}" if ran and emp is not None else "—",
            "limit": f"≤ {show(max_emp, 3)}",
            "result": status(emp <= max_emp) if ran and emp is not None else "not run",
        }
    )
    rec_status = verdict.get("reconstruction")
    if rec_status == "nothing left":
        out.append(
            {
                "check": "records the coordinator rebuilds to within 5 %, beyond guessing the average record",
                "figure": "nothing to rebuild from",
                "limit": f"≤ {percent(max_rebuilt)}",
                "result": "pass",
            }
        )
    elif rec_block.get("available"):
        beyond = rec_block.get("fraction_within_5pct_beyond_baseline")
        raw = rec_block.get("fraction_within_5pct")
        if beyond is None:  # a run folder from before the baseline: the raw share, judged against no leak at all
            out.append(
                {
                    "check": "records the coordinator rebuilds to within 5 % (no baseline recorded)",
                    "figure": percent(raw, 1),
                    "limit": "≤ 0 %",
                    "result": rec_status,
                }
            )
        else:
            out.append(
                {
                    "check": "records the coordinator rebuilds to within 5 %, beyond guessing the average record",
                    "figure": percent(beyond, 1) + f" (attack {percent(raw, 1)}, guess "
                    f"{percent(rec_block.get('baseline_fraction_within_5pct'), 1)})",
                    "limit": f"≤ {percent(max_rebuilt)}",
                    "result": rec_status,
                }
            )
    else:
        out.append(
            {
                "check": "records the coordinator rebuilds to within 5 %, beyond guessing the average record",
                "figure": "—",
                "limit": f"≤ {percent(max_rebuilt)}",
                "result": "not run",
            }
        )
    if mode.get("dp") and privacy:
        eps, target = privacy.get("epsilon"), _first(opts.get("epsilon"), privacy.get("epsilon_target"))
        ok = isinstance(eps, (int, float)) and isinstance(target, (int, float)) and eps <= target * (1 + 1e-9)
        out.append(
            {
                "check": "ε spent (the accountant's, for the whole run)",
                "figure": show(eps, 3),
                "limit": f"≤ {show(target, 3)} (asked for)" if isinstance(target, (int, float)) else "—",
                "result": "pass" if ok else ("fail" if isinstance(target, (int, float)) else "not run"),
            }
        )
    return out


def _headline(
    verdict: dict, rec_block: dict, gate: dict | None, privacy: dict | None, mode: dict, void: bool, guarantee: dict
) -> str:
    from .guarantee import verdict_scope

    st = verdict["status"]
    if st == "fail" and verdict.get("reconstruction") == "fail":
        beyond = rec_block.get("fraction_within_5pct_beyond_baseline")
        f = beyond if beyond is not None else rec_block.get("fraction_within_5pct")
        return (
            f"FAIL — the coordinator can rebuild {percent(f, 1)} of records to within 5 % from what the sites sent"
            + (" (beyond guessing the average record)" if beyond is not None else "")
        )
    if st == "fail":
        f = "; ".join(plain_failure(x) for x in (gate or {}).get("failures", [])[:1])
        return "FAIL — the membership audit on the landmarks failed" + (f" ({f})" if f else "")
    if st == "fail (overridden)":
        return "FAIL (OVERRIDDEN) — the membership audit failed and the run went on with --allow-audit-failure"
    if st == "not audited":
        return "NOT AUDITED — this run folder holds no audit results"
    eps = (privacy or {}).get("epsilon")
    tail = (
        f" · ε = {show(eps, 3)} (δ = {show((privacy or {}).get('delta'), 3)})"
        if mode.get("dp") and isinstance(eps, (int, float))
        else ""
    )
    if not mode.get("dp"):
        tail = " · no differential privacy"
    return f"PASS {verdict_scope(guarantee)}" + tail + (" — but ε is VOID (testing seed)" if void else "")


def _caveat(util: dict, verdict: dict) -> str | None:
    """A line under a PASS when the map is far from the centralized one on its worst figure: privacy passed,
    usefulness did not."""
    if verdict["status"] != "pass":
        return None
    r = worst_gap(util)
    if r is None or r["gap_points"] > -10:
        return None
    kind = "clustering" if util.get("kind") == "clustering" else "map"
    return (
        f"But the {kind} is far from the centralized one: {_short(r)} {show(r['federated'], 3)} against "
        f"{show(r['centralized'], 3)} on pooled records ({r['gap_points']:+.1f} points). Look at it before using it."
    )


def summary(
    run: RunFolder,
    mode: dict,
    verdict: dict,
    gate: dict | None,
    rec_block: dict,
    inventory: list[dict],
    util: dict,
    warnings: list[str],
    *,
    mia_block: dict | None = None,
    max_rebuilt: float = 0.01,
) -> dict:
    """The summary box: headline (the verdict and the adversary it holds against), each check against its limit,
    what left each site (per record first), who could learn what, what ε means, how good the map is (its worst gap
    named), remedies."""
    from .guarantee import run_guarantee, verdict_scope

    privacy = privacy_block(run)
    void = epsilon_is_void(run, privacy)
    guarantee = run_guarantee(run.result)
    eps = (privacy or {}).get("epsilon")
    return {
        "headline": _headline(verdict, rec_block, gate, privacy, mode, void, guarantee),
        "caveat": _caveat(util, verdict),
        "status": verdict["status"],
        "adversary": verdict_scope(guarantee),
        "checks": checks_against_limits(
            run, mode, verdict, gate, mia_block or {"available": False}, rec_block, privacy, max_rebuilt
        ),
        "aggregation": AGGREGATION_NAMES.get(mode.get("aggregation"), str(mode.get("aggregation"))),
        "per_record": per_record_release(run, mode),
        "left_each_site": _left_each_site(inventory, run),
        "who_learns": _who_learns(mode, privacy, rec_block, run, guarantee),
        "epsilon": _epsilon_sentence(privacy, mode, void, inventory),
        "epsilon_short": (
            f"ε = {show(eps, 3)} (δ = {show((privacy or {}).get('delta'), 3)})"
            + (" — VOID (testing seed)" if void else "")
            + f"; {ROC_OUTSIDE_EPSILON}"
            if mode.get("dp") and isinstance(eps, (int, float))
            else None
        ),
        "quality": _quality_sentence(util, bool(mode.get("dp")), mode.get("landmark_method") == "cells"),
        "remedies": remedies(mode, verdict, gate, rec_block, void),
        "warnings": warnings,
    }
