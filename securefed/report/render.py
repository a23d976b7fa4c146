"""``report.html``: the summary box in plain words first, then the release inventory, the per-site table, quality
beside privacy, and the details. Every number is shown under its human label (:mod:`securefed.report.labels`),
never as ``None``."""

from __future__ import annotations

import html
import json

from .labels import PAPER, SENT_NAMES, count, label, percent, plain_failure, show

__all__ = ["render_html"]

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:24px auto;max-width:1120px;color:#1b1f24;background:#fff;line-height:1.45}
h1{font-size:26px;margin-bottom:2px} h2{font-size:20px;border-bottom:2px solid #d0d7de;padding-bottom:4px;margin-top:34px}
h3{font-size:15px;margin:16px 0 4px} .meta{color:#57606a;font-size:14px;margin-top:0}
table{border-collapse:collapse;margin:8px 0;width:100%} th,td{border:1px solid #d0d7de;padding:6px 8px;text-align:left;vertical-align:top;font-size:14px}
th{background:#f3f5f7;font-weight:600} td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
tr.applies td{background:#fff4d6;font-weight:600} tr.uncovered td.cov{color:#cf222e;font-weight:600} td.cov-yes{color:#1a7f37;font-weight:600}
.summary{border:3px solid #6e7781;border-radius:8px;padding:0 20px 14px;margin:18px 0}
.summary.pass{border-color:#1f883d} .summary.fail{border-color:#cf222e} .summary.override{border-color:#bc4c00}
.headline{margin:0 -20px 10px;padding:12px 20px;font-size:19px;font-weight:700;color:#fff;background:#6e7781;border-radius:4px 4px 0 0}
.pass .headline{background:#1f883d} .fail .headline{background:#cf222e} .override .headline{background:#bc4c00}
.caveat{margin:-10px -20px 12px;padding:8px 20px;background:#fff8c5;border-bottom:1px solid #d4a72c;font-weight:600;color:#7d4e00}
.todo{background:#fff8c5;border:1px solid #d4a72c;border-radius:6px;padding:8px 14px} .todo ol{margin:4px 0 2px 18px;padding:0}
.warn{background:#fff1e5;border-left:4px solid #bc4c00;padding:6px 12px;margin:10px 0} .warn ul{margin:4px 0;padding-left:18px}
.na-text{color:#6e7781;font-style:italic} pre{background:#f6f8fa;padding:10px;overflow:auto;font-size:12px;max-height:420px}
img{max-width:100%;border:1px solid #d0d7de;margin:6px 0} .grid{display:flex;flex-wrap:wrap;gap:16px}
.grid>*{flex:1 1 480px;min-width:0} figure{margin:0} figcaption{font-size:13px;color:#57606a}
.small{font-size:13px;color:#57606a} .gap-bad{color:#cf222e;font-weight:600}
h1.title{font-size:21px;margin:0 0 2px} .first{font-size:13.5px;line-height:1.35}
.first h3{font-size:14px;margin:10px 0 3px} .first table{margin:3px 0} .first th,.first td{padding:3px 6px;font-size:13px}
.first .headline{font-size:17px;padding:9px 16px;margin:0 -16px 6px} .summary.first{padding:0 16px 8px;margin:8px 0}
.first .caveat{margin:-6px -16px 6px;padding:5px 16px} .first .todo{padding:4px 10px} .first .todo ol{margin:2px 0 2px 16px}
.adversary{margin:0 -16px 6px;padding:4px 16px;background:#f6f8fa;border-bottom:1px solid #d0d7de;font-size:13px}
.cols{display:flex;gap:18px} .cols>div{flex:1 1 0;min-width:0}
.perrec{font-weight:600;margin:2px 0 3px;padding:3px 8px;border-left:4px solid #bc4c00;background:#fff8f2}
.perrec.none{border-left-color:#1a7f37;background:#f0fff4}
ul.tight{margin:2px 0;padding-left:18px} ul.tight li{margin:0}
td.res-pass{color:#1a7f37;font-weight:700} td.res-fail{color:#cf222e;font-weight:700} td.res-na{color:#6e7781}
table.who th{width:24%} table.checks td:first-child{width:50%} .sub{font-size:12px;color:#57606a}
"""

_VERDICT_CLASS = {"pass": "pass", "fail": "fail", "fail (overridden)": "override"}


def _e(x) -> str:
    return html.escape(str(x))


def _v(x, digits=4, missing="—") -> str:
    return _e(show(x, digits, missing))


def _gap(points) -> str:
    return "—" if points is None else _e(f"{points:+.1f}")


def _kv(d: dict, keys, *, fmt=None) -> str:
    """A two-column table: human label | value; keys absent from ``d`` are skipped, ``None`` shows as "—"."""
    rows = []
    for k in keys:
        if k not in d or isinstance(d.get(k), (dict, list)):
            continue
        val = fmt(k, d[k]) if fmt else _v(d[k])
        rows.append(f"<tr><th>{_e(label(k))}</th><td>{val}</td></tr>")
    return f"<table>{''.join(rows)}</table>" if rows else "<p class='na-text'>No figures recorded.</p>"


def _img(b64, alt, caption, missing: str | None = None) -> str:
    if not b64:
        return f"<figure><p class='na-text'>{_e(alt)}: {_e(missing or 'not available')}</p></figure>"
    return f"<figure><img alt='{_e(alt)}' src='data:image/png;base64,{b64}'><figcaption>{_e(caption)}</figcaption></figure>"


def _result_cell(result: str) -> str:
    cls = "res-pass" if result == "pass" else "res-fail" if result.startswith("fail") else "res-na"
    return f"<td class='{cls}'>{_e(result)}</td>"


def _summary(report: dict) -> str:
    """The first screen (1280 × 900): the verdict and the adversary it holds against, each check against its limit,
    how good the map is (its worst gap), what left each hospital (per record first) and who could learn what; then
    what ε means, the warnings and the verdict's reasons."""
    s, v = report["summary"], report["verdict"]
    cls = _VERDICT_CLASS.get(v["status"], "na")
    g = report.get("guarantee") or {}
    out = [f"<section class='summary first {cls}' id='summary'><div class='headline'>{_e(s['headline'])}</div>"]
    if s.get("caveat"):
        out.append(f"<div class='caveat'>{_e(s['caveat'])}</div>")
    beyond = (
        [] if g.get("holds_against_deviating_coordinator") else ["a coordinator that deviates from the protocol"]
    ) + ["a coordinator colluding with a site (only --epsilon bounds what the two learn of another site's records)"]
    adv = f"<b>Not covered by this verdict:</b> {_e('; '.join(beyond))} — see “Who could learn what”."
    if s.get("epsilon_short"):
        adv += f"<br><b>Differential privacy:</b> {_e(s['epsilon_short'])}."
    elif not report["mode"]["dp"]:
        adv += "<br><b>No differential privacy:</b> no ε bounds what any party learns about one record."
    out.append(f"<div class='adversary'>{adv}</div>")

    def figure(text: str) -> str:  # "0.2 % (attack 2.1 %, guess 1.9 %)": the figure, its detail in small type
        head, _, tail = text.partition(" (")
        return _e(head) + (f"<br><span class='sub'>({_e(tail)}</span>" if tail else "")

    checks = "".join(
        f"<tr><td>{_e(c['check'])}</td><td class='num'>{figure(c['figure'])}</td><td class='num'>"
        f"{_e(c['limit'])}</td>{_result_cell(c['result'])}</tr>"
        for c in s["checks"]
    )
    left = [
        (
            "<h3>Each check against its limit</h3><table class='checks'><tr><th>check</th><th>figure</th><th>limit"
            f"</th><th>result</th></tr>{checks}</table>"
        )
    ]
    kind = "clustering" if (report.get("utility") or {}).get("kind") == "clustering" else "map"
    left.append(
        f"<h3>How good the {kind} is</h3><p style='margin:2px 0'>{_e(s['quality'])}</p>"
        if s.get("quality")
        else f"<h3>How good the {kind} is</h3><p class='na-text' style='margin:2px 0'>Not measured (no labels, or the "
        "run stopped before the map).</p>"
    )
    if s["remedies"]:
        left.append(
            "<div class='todo'><b>What to do</b><ol>"
            + "".join(f"<li>{_e(r)}</li>" for r in s["remedies"])
            + "</ol></div>"
        )
    nothing = s["per_record"].startswith("Nothing per record")
    right = [
        f"<h3>What left each hospital</h3><p class='perrec{' none' if nothing else ''}'>{_e(s['per_record'])}</p>",
        "<ul class='tight'>" + "".join(f"<li>{_e(x)}</li>" for x in s["left_each_site"]) + "</ul>",
        f"<p class='small' style='margin:2px 0'>Secure sum: {_e(s['aggregation'])}.</p>",
    ]
    out.append(f"<div class='cols'><div>{''.join(left)}</div><div>{''.join(right)}</div></div>")
    out.append(
        "<h3>Who could learn what</h3><table class='who'>"
        + "".join(
            f"<tr><th>{_e(w['who'][0].upper() + w['who'][1:])}</th><td>{_e(w['learns'])}</td></tr>"
            for w in s["who_learns"]
        )
        + "</table>"
    )
    out.append(f"<h3>What ε means here</h3><p>{_e(s['epsilon'])}</p>")
    if s["warnings"]:
        out.append(
            "<div class='warn'><b>Warnings</b><ul>"
            + "".join(f"<li>{_e(w)}</li>" for w in s["warnings"])
            + "</ul></div>"
        )
    out.append(
        "<p class='small'>Why the verdict: " + _e("; ".join(plain_failure(r) for r in v["reasons"])) + ".</p></section>"
    )
    return "".join(out)


def _quality_beside_privacy(report: dict) -> str:
    u = report["utility"]
    if u["available"]:
        rows = "".join(
            f"<tr><th>{_e(r['label'])}</th><td class='num'>{_v(r['federated'], 3)}</td><td class='num'>{_v(r['centralized'], 3)}</td>"
            f"<td class='num{' gap-bad' if (r['gap_points'] or 0) <= -10 else ''}'>"
            f"{_gap(r['gap_points'])}</td></tr>"
            for r in u["rows"]
        )
        left = (
            f"<h3>Quality of the {_e(u.get('kind', 'map'))}</h3><table><tr><th>figure</th><th>federated</th><th>centralized (pooled records)</th>"
            f"<th>gap (points)</th></tr>{rows}</table><p class='small'>Centralized = the same method on the pooled "
            "records, which only this simulation can compute.</p>"
        )
    else:
        left = (
            f"<h3>Quality of the {_e(u.get('kind', 'map'))}</h3><p class='na-text'>Not measured: {_e(u['reason'])}</p>"
        )
    b, m, r = report["budget"], report["mia"], report["reconstruction"]
    prows = []
    if b["available"]:
        eps = show(b.get("epsilon"), 3)
        prows.append(
            (
                "ε spent (the accountant's)",
                f"{eps} (δ = {show(b.get('delta'), 3)})" + (" — VOID: testing seed" if b.get("epsilon_void") else ""),
            )
        )
    else:
        prows.append(("differential privacy", "none in this run"))
    if m["available"]:
        prows += [
            (label("auc"), show(m.get("auc"), 3)),
            (label("tpr_at_fpr_1e2"), percent(m.get("tpr_at_fpr_1e2"), 1)),
            (label("empirical_epsilon"), show(m.get("empirical_epsilon"), 3)),
        ]
    else:
        prows.append(("membership audit", "not measured"))
    if r["available"]:
        prows += [
            (label("fraction_within_5pct"), percent(r.get("fraction_within_5pct"), 1)),
            (
                label("median_relative_error"),
                show(r.get("median_relative_error"), 3)
                + (
                    f" (guessing the mean record: {show(r['baseline_median_relative_error'], 3)})"
                    if isinstance(r.get("baseline_median_relative_error"), (int, float))
                    else ""
                ),
            ),
        ]
    else:
        prows.append(("reconstruction audit", "not measured"))
    right = (
        "<h3>Privacy</h3><table>"
        + "".join(f"<tr><th>{_e(k)}</th><td class='num'>{_e(x)}</td></tr>" for k, x in prows)
        + "</table>"
    )
    return f"<h2>Quality beside privacy</h2><div class='grid'><div>{left}</div><div>{right}</div></div>"


def _inventory(report: dict) -> str:
    dp = bool(report["mode"]["dp"])
    head = (
        "<tr><th>data-dependent output</th><th>received by</th>"
        + ("<th>covered by ε</th>" if dp else "")
        + "<th>note</th></tr>"
    )
    rows = "".join(
        f"<tr class='{'uncovered' if r['covered'] == 'no' else ''}'><td>{_e(r['what'])}</td><td>{_e(r['to'])}</td>"
        + (f"<td class='cov{' cov-yes' if r['covered'] == 'yes' else ''}'>{_e(r['covered'])}</td>" if dp else "")
        + f"<td>{_v(r['note'], missing='')}</td></tr>"
        for r in report["release_inventory"]
    )
    cover = (
        "Every output that depends on the records, who receives it, and whether the differential-privacy "
        "guarantee covers it."
        if dp
        else "Every output that depends on the records and who receives it. This run "
        "has no differential privacy, so no ε covers any of them."
    )
    return (
        "<h2>Release inventory</h2><p>" + cover + " Rows "
        "received by “this report” exist only because this is a simulation that holds every site's records.</p>"
        f"<table>{head}{rows}</table>"
    )


def _sites(report: dict) -> str:
    st = report["sites"]
    if not st["available"]:
        return f"<h2>Per site</h2><p class='na-text'>Not available: {_e(st['reason'])}</p>"
    cols = ["site", "records", "held_out", "clipped", "epsilon_spent", "site_ledger_releases", "bytes_sent"]
    cols = [c for c in cols if c in ("site", "records") or any(r.get(c) is not None for r in st["rows"])]
    head = "".join(f"<th>{_e(label(c))}</th>" for c in cols)
    body = "".join(
        "<tr>"
        + "".join(
            (f"<td>{_e(r['site'])}</td>" if c == "site" else f"<td class='num'>{_v(r.get(c), 3, 'not recorded')}</td>")
            for c in cols
        )
        + "</tr>"
        for r in st["rows"]
    )
    notes = "".join(f"<li>{_e(n)}</li>" for n in st.get("notes", []))
    return f"<h2>Per site</h2><table><tr>{head}</tr>{body}</table>" + (
        f"<ul class='small'>{notes}</ul>" if notes else ""
    )


def _details(report: dict, figures: dict) -> list[str]:
    """The report's sections below the first screen, in order, and its appendix."""
    return (
        _modes_section(report)
        + _budget_section(report, figures)
        + _mia_section(report, figures)
        + _reconstruction_section(report)
        + _quality_section(report, figures)
        + _appendix(report)
    )


def _modes_section(report: dict) -> list[str]:
    """What each mode sends: this run's modes and, folded, the modes it did not use."""
    parts = []
    mode = report["mode"]
    parts.append("<h2>What each mode sends</h2>")
    parts.append(
        f"<p>This run: secure sum <b>{_e(report['summary']['aggregation'])}</b> · differential privacy "
        f"<b>{'yes' if mode['dp'] else 'no'}</b> · embedding stage <b>{_e(mode['nystrom'])}</b>"
        + (f" · coordinates <b>{_e(mode.get('coordinates'))}</b>" if mode["nystrom"] == "local" else "")
        + ". The table lists the modes of this run; docs/what-leaves-each-site.md explains every mode.</p>"
    )

    def mode_rows(rows) -> str:
        return (
            "<table><tr><th>stage</th><th>mode</th><th>the coordinator learns</th></tr>"
            + "".join(
                f"<tr class='{'applies' if r['applies'] else ''}'><td>{_e(r['stage'])}</td><td>{_e(r['mode'])}</td>"
                f"<td>{_e(r['server_learns'])}</td></tr>"
                for r in rows
            )
            + "</table>"
        )

    parts.append(mode_rows([r for r in report["what_leaves"] if r["applies"]]))
    others = [r for r in report["what_leaves"] if not r["applies"]]
    if others:
        parts.append(
            "<details class='other-modes'><summary>The modes this run did <b>not</b> use, and what the "
            f"coordinator would learn in them ({len(others)})</summary>{mode_rows(others)}</details>"
        )
    return parts


def _budget_section(report: dict, figures: dict) -> list[str]:
    """The privacy budget: the accountant's figures and the per-round ε and MMD plots."""
    parts = []
    b = report["budget"]
    parts.append("<h2>Privacy budget</h2>")
    if b["available"]:
        d = b.get("details") if isinstance(b.get("details"), dict) else b
        keys = [k for k in d if not isinstance(d[k], (dict, list))]
        parts.append(_kv(d, keys))
        parts.append(
            f"<p class='small'>ε is the accountant's (the one spent). The paper's formula ({_e(PAPER)}, §5.2) "
            "for the same noise is shown for comparison only: it is not a bound. Per-site figures are in the "
            "per-site table.</p>"
        )
    else:
        parts.append(f"<p class='na-text'>{_e(b.get('reason', 'not available'))}</p>")
    parts.append(
        "<div class='grid'>"
        + _img(figures.get("epsilon"), "ε spent per round", "Cumulative ε after each round (accountant).")
        + _img(
            figures.get("mmd"),
            "MMD per round",
            "How far the landmarks are from the records after each round.",
            b.get("mmd_not_shown"),
        )
        + "</div>"
    )
    return parts


def _mia_section(report: dict, figures: dict) -> list[str]:
    """The membership-inference audit of the landmarks: its figures, one row per attack score, the ROC."""
    parts = []
    m = report["mia"]
    parts.append("<h2>Membership inference on the landmarks</h2>")
    if m["available"]:

        def fmt(k, x):
            return _e(percent(x, 1)) if k.startswith("tpr_") else _v(x, 3)

        parts.append(
            _kv(
                m,
                [
                    "auc",
                    "auc_se",
                    "tpr_at_fpr_1e2",
                    "tpr_at_fpr_1e3",
                    "empirical_epsilon",
                    "empirical_mu",
                    "delta",
                    "confidence",
                    "best_score",
                    "n_members",
                    "n_nonmembers",
                    "n_sites",
                ],
                fmt=fmt,
            )
        )
        rows = "".join(
            f"<tr><td>{_e(k)}</td><td class='num'>{_v(s.get('auc'), 3)}</td><td class='num'>{_e(percent(s.get('tpr_at_fpr_1e2'), 1))}</td>"
            f"<td class='num'>{_e(percent(s.get('tpr_at_fpr_1e3'), 1))}</td><td class='num'>{_v(s.get('epsilon_lb'), 3)}</td>"
            f"<td class='num'>{_v(s.get('mu_lb'), 3)}</td></tr>"
            for k, s in m.get("per_score", {}).items()
        )
        parts.append(
            f"<table><tr><th>attack score</th><th>{_e(label('auc'))}</th><th>{_e(label('tpr_at_fpr_1e2'))}</th>"
            f"<th>{_e(label('tpr_at_fpr_1e3'))}</th><th>{_e(label('epsilon_lb'))}</th><th>{_e(label('mu_lb'))}</th></tr>{rows}</table>"
        )
        if m.get("threat_model"):
            parts.append(f"<p><b>Threat model.</b> {_e(m['threat_model'])} See docs/threat-model.md.</p>")
    else:
        parts.append(f"<p class='na-text'>Not measured: {_e(m.get('reason'))}</p>")
    parts.append(
        "<div class='grid'>"
        + _img(figures.get("roc"), "ROC curve", "Log-scale ROC of each attack score against the no-signal diagonal.")
        + "</div>"
    )
    return parts


def _reconstruction_section(report: dict) -> list[str]:
    """The reconstruction audit: the coordinator's best rebuild of the records."""
    parts = []
    r = report["reconstruction"]
    parts.append("<h2>Reconstruction audit (the coordinator's best rebuild of the records)</h2>")
    if r["available"]:

        def rfmt(k, x):
            if k == "mode":
                return _e(SENT_NAMES.get(x, x))
            return _e(percent(x, 1)) if k.startswith("fraction_") else _v(x, 3)

        parts.append(_kv(r, [k for k in r if k not in ("available", "format")], fmt=rfmt))
    else:
        parts.append(f"<p class='na-text'>Not measured: {_e(r.get('reason'))}</p>")
    return parts


def _quality_section(report: dict, figures: dict) -> list[str]:
    """The map, the density (when released) and every quality figure beside the centralized one, and the time taken."""
    parts = []
    q = report["quality"]
    parts.append(
        "<h2>The map and all quality figures</h2><div class='grid'>"
        + _img(
            figures.get("embedding"),
            "The map",
            "The federated map: colour = class, marker = site (or a panel "
            "coloured by site), quality and privacy mode in the title.",
        )
        + (
            _img(
                figures.get("density"),
                "Every record on the shared map (DP)",
                "The density the sites released with noise (the billboard's third release, covered by ε): "
                "how many records fall in each cell of a grid over the landmark map, while every record's "
                "own coordinate stayed on its site.",
            )
            if figures.get("density")
            else ""
        )
        + "</div>"
    )
    fed, cen = q.get("federated") or {}, q.get("centralized") or {}
    keys = list(dict.fromkeys(list(fed) + list(cen)))
    if keys:
        parts.append(
            "<table><tr><th>figure</th><th>federated</th><th>centralized (pooled records)</th></tr>"
            + "".join(
                f"<tr><th>{_e(label(k))}</th><td class='num'>{_v(fed.get(k), 3, 'not measured')}</td>"
                f"<td class='num'>{_v(cen.get(k), 3, 'not measured')}</td></tr>"
                for k in keys
            )
            + "</table>"
        )
    else:
        parts.append("<p class='na-text'>No quality figures (the run stopped early, or the data have no labels).</p>")
    t = q.get("timings") or {}
    if t:
        tt = {("centralized_time" if k == "centralized" else k): v for k, v in t.items()}
        parts.append("<h3>Time taken</h3>" + _kv(tt, list(tt), fmt=lambda k, x: _v(x, 3)))
    return parts


def _appendix(report: dict) -> list[str]:
    """The ledger, references, parameters, versions, glossary and report.json names (the report's last sections)."""
    parts = []
    led = report["ledger"]
    parts.append("<h2>Privacy ledger</h2>")
    parts.append(
        _kv(
            {
                "events": led.get("n_events"),
                "overrides recorded": led.get("overrides"),
                "event kinds": ", ".join(f"{k}: {n}" for k, n in (led.get("kinds") or {}).items()),
            },
            ["events", "overrides recorded", "event kinds"],
        )
        if led["available"]
        else f"<p class='na-text'>{_e(led.get('reason'))}</p>"
    )
    parts.append(
        "<h2>References</h2><ul>"
        f"<li>{_e(PAPER)} — FedDL (Algorithm 1), the distance rows of the embedding stage (Algorithm 2), data "
        "perturbation (§5.1) and the differentially private landmarks (§5.2, Theorem 5).</li>"
        "<li>Hsu, Huang, Roth, Roughgarden and Wu, Private Matchings and Allocations (STOC 2014) — the billboard "
        "lemma behind joint differential privacy.</li>"
        "<li>docs/threat-model.md and docs/what-leaves-each-site.md in the securefed repository.</li></ul>"
    )
    parts.append(f"<h2>All parameters</h2><p class='small'>Run folder <code>{_e(report['run_dir'])}</code></p>")
    parts.append(
        f"<pre>{_e(json.dumps(report['parameters'], indent=2, sort_keys=True))}</pre>"
        if report["parameters"]
        else "<p class='na-text'>config.json not available.</p>"
    )
    ver = report["versions"]
    parts.append(
        f"<h2>Library versions</h2><p class='small'>Source: {_e(ver['source'])}</p>"
        + _kv(
            {k: (x if x is not None else "not installed") for k, x in ver["libraries"].items()}, list(ver["libraries"])
        )
    )
    parts.append(
        "<h2>Glossary</h2><table>"
        + "".join(f"<tr><th>{_e(g['term'])}</th><td>{_e(g['definition'])}</td></tr>" for g in report["glossary"])
        + "</table>"
    )
    parts.append(
        "<h2>Names in report.json</h2><p class='small'>report.json keeps the machine names; this is what each means.</p>"
        "<table><tr><th>name in report.json</th><th>shown here as</th></tr>"
        + "".join(f"<tr><td><code>{_e(k)}</code></td><td>{_e(x)}</td></tr>" for k, x in report["labels"].items())
        + "</table>"
    )
    return parts


def render_html(report: dict, figures: dict) -> str:
    """The self-contained HTML page for ``report`` (plots embedded as base64 PNG)."""
    run = report.get("run") or {}
    facts = " · ".join(
        x
        for x in (
            f"run {run['run_id']}" if run.get("run_id") else None,
            f"data: {run['dataset']}" if run.get("dataset") else None,
            f"method: {run['method']}" if run.get("method") else None,
            f"{count(run.get('n_records'))} records at {show(run.get('n_sites'))} sites"
            if run.get("n_records")
            else None,
        )
        if x
    )
    parts = [
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>securefed privacy report</title>",
        f"<style>{_CSS}</style></head><body>",
        "<h1 class='title'>securefed privacy report</h1>",
        f"<p class='meta'>{_e(facts)} · generated {_e(report['generated_at'][:16].replace('T', ' '))} UTC · report schema "
        f"{_e(report['schema_version'])}</p>",
        _summary(report),
        _quality_beside_privacy(report),
        _inventory(report),
        _sites(report),
    ]
    parts += _details(report, figures)
    parts.append("</body></html>")
    return "".join(parts)
