"""The report's first screen: the adversary the verdict holds against (the run's ``guarantee``, or the conservative
reading without it), each check against its limit, the reconstruction judged against guessing the average record,
ε with what it does not cover, the worst quality gap, the paper's authors, and the plots' palettes."""

import json

import numpy as np
import pytest

from securefed.report import validate_report, write_report
from securefed.report.build import reconstruction_verdict
from securefed.report.guarantee import FALLBACK_ADVERSARY, run_guarantee


def _report(make_run, d, kind, result_patch=None):
    make_run(d, kind)
    if result_patch is not None:
        res = json.loads((d / "result.json").read_text())
        res.update(result_patch)
        (d / "result.json").write_text(json.dumps(res))
    html_path, json_path = write_report(d)
    rep = json.loads(open(json_path, encoding="utf-8").read())
    validate_report(rep)
    return rep, open(html_path, encoding="utf-8").read()


def test_without_a_recorded_guarantee_the_verdict_holds_only_against_an_honest_coordinator(tmp_path, run_folder):
    rep, html = _report(run_folder, tmp_path / "r", "norows_pass")
    head = rep["summary"]["headline"]
    assert head.startswith(f"PASS against {FALLBACK_ADVERSARY}, not against one that deviates")
    assert rep["guarantee"]["source"] == "fallback" and rep["guarantee"]["holds_against_deviating_coordinator"] is False
    who = {w["who"]: w["learns"] for w in rep["summary"]["who_learns"]}
    assert who["a coordinator that deviates"].startswith("not covered by this verdict")
    assert "only differential privacy" in who["a coordinator colluding with a site"]
    first = html.split("<h3>Who could learn what</h3>")[0]
    assert "Not covered by this verdict:</b> a coordinator that deviates from the protocol" in first


def test_a_recorded_guarantee_is_what_the_verdict_names(tmp_path, run_folder):
    g = {
        "adversary": "a coordinator that deviates from the protocol, colluding with no site",
        "holds_against_deviating_coordinator": True,
        "reasons": [],
        "collusion": "a coordinator colluding with a site learns that site's records; only DP stops more",
    }
    rep, html = _report(run_folder, tmp_path / "r", "norows_pass", {"guarantee": g})
    assert rep["summary"]["headline"] == (
        "PASS against a coordinator that deviates from the protocol, colluding with no site · no differential privacy"
    )
    assert rep["guarantee"] == dict(g, source="run")
    who = {w["who"]: w["learns"] for w in rep["summary"]["who_learns"]}
    assert who["a coordinator colluding with a site"] == g["collusion"]
    assert "a coordinator that deviates from the protocol;" not in html.split("<h3>Who could learn what</h3>")[0]
    # a malformed key is not trusted: the conservative reading
    assert (
        run_guarantee({"guarantee": {"adversary": "", "holds_against_deviating_coordinator": True}})["source"]
        == "fallback"
    )
    assert (
        run_guarantee({"guarantee": {"adversary": "x", "holds_against_deviating_coordinator": "yes"}})["source"]
        == "fallback"
    )


def test_under_dp_the_first_screen_names_the_audit_counts_outside_epsilon(tmp_path, run_folder):
    rep, html = _report(run_folder, tmp_path / "r", "dp")
    s = rep["summary"]
    assert s["epsilon_short"].startswith("ε = 2 (δ = 1e-5); the membership audit's ROC counts")
    assert "released outside ε: un-noised aggregate counts" in s["epsilon_short"]
    assert s["epsilon"].endswith(
        "Also outside ε: the membership audit's ROC counts (members vs held-out records, "
        "summed over sites) are released outside ε: un-noised aggregate counts."
    )
    first = html.split("<h3>Who could learn what</h3>")[0]
    assert "ε = 2 (δ = 1e-5); the membership audit&#x27;s ROC counts" in first
    checks = {c["check"]: c for c in s["checks"]}
    eps = checks["ε spent (the accountant's, for the whole run)"]
    assert eps["figure"] == "2" and eps["limit"] == "≤ 2 (asked for)" and eps["result"] == "pass"
    auc = checks["membership attack on the landmarks: AUC (0.5 = coin toss)"]
    assert auc["figure"] == "0.510" and auc["limit"] == "≤ 0.6" and auc["result"] == "pass"
    assert "Qiao, Ma &amp; Fan" in html and "Xia" not in html


def test_each_check_is_against_its_limit_in_the_first_screen(tmp_path, run_folder):
    rep, html = _report(run_folder, tmp_path / "r", "mia_fail_stopped")
    checks = rep["summary"]["checks"]
    assert [c["result"] for c in checks] == ["fail", "pass", "not run"]
    assert checks[0]["figure"] == "0.660" and checks[0]["limit"] == "≤ 0.6"
    first = html.split("<h3>Who could learn what</h3>")[0]
    assert "<td class='res-fail'>fail</td>" in first and "≤ 0.6" in first


@pytest.mark.parametrize(
    "beyond, raw, status", [(0.002, 0.021, "pass"), (0.011, 0.03, "fail"), (None, 0.001, "fail"), (None, 0.0, "pass")]
)
def test_reconstruction_is_judged_beyond_guessing_the_average_record(beyond, raw, status):
    rec = {
        "available": True,
        "fraction_within_5pct": raw,
        "median_relative_error": 0.44,
        "baseline_median_relative_error": 0.44,
        "baseline_fraction_within_5pct": 0.019,
    }
    if beyond is not None:
        rec["fraction_within_5pct_beyond_baseline"] = beyond
    got, why = reconstruction_verdict(rec)
    assert got == status
    if status == "fail":
        assert ("limit 1 %" if beyond is not None else "limit 0 %") in why
    assert reconstruction_verdict({"available": False, "kept": True}) == ("nothing left", None)


def test_the_baseline_counts_only_what_the_attack_adds():
    """Closed form: records at known distances from the average record; an attack that returns the average itself
    adds nothing, one that returns every record exactly adds every record the guess misses."""
    from securefed.audits import reconstruction_risk

    rng = np.random.default_rng(0)
    X = 10.0 + rng.normal(size=(400, 5))
    mean = X.mean(axis=0)
    guess_hits = np.linalg.norm(X - mean, axis=1) / np.linalg.norm(X, axis=1) <= 0.05
    r = reconstruction_risk(X, np.tile(mean, (400, 1)), reference=mean)
    assert r["fraction_within_5pct"] == r["baseline_fraction_within_5pct"] == pytest.approx(guess_hits.mean())
    assert r["fraction_within_5pct_beyond_baseline"] == 0.0
    r = reconstruction_risk(X, X, reference=mean)
    assert r["fraction_within_5pct"] == 1.0 and r["fraction_within_5pct_beyond_baseline"] == pytest.approx(
        1.0 - guess_hits.mean()
    )


def _lab(rgb):
    """CIE L*a*b* (D65) of sRGB in [0, 1] — the closed-form conversion, for colour differences ΔE76."""
    c = np.asarray(rgb, dtype=float)[..., :3]
    lin = np.where(c <= 0.04045, c / 12.92, ((c + 0.055) / 1.055) ** 2.4)
    M = np.array([[0.4124, 0.3576, 0.1805], [0.2126, 0.7152, 0.0722], [0.0193, 0.1192, 0.9505]])
    xyz = lin @ M.T / np.array([0.95047, 1.0, 1.08883])
    f = np.where(xyz > (6 / 29) ** 3, np.cbrt(xyz), xyz / (3 * (6 / 29) ** 2) + 4 / 29)
    return np.stack([116 * f[..., 1] - 16, 500 * (f[..., 0] - f[..., 1]), 200 * (f[..., 1] - f[..., 2])], axis=-1)


@pytest.mark.parametrize("n", [3, 8, 10, 12, 20])
def test_site_colours_are_distinct_and_clusters_do_not_wear_the_classes_colours(n):
    from securefed.report.plots import palette

    lab = _lab(np.array(palette("site", n)))
    d = np.linalg.norm(lab[:, None] - lab[None], axis=-1)[np.triu_indices(n, 1)]
    floor = 25 if n <= 12 else 14  # the old tab20b shades: ΔE 14.0 at 10 sites, 12.7 at 20
    assert d.min() > floor, f"two of {n} sites differ by ΔE {d.min():.1f}"
    classes, clusters = _lab(np.array(palette("class", 10))), _lab(np.array(palette("cluster", 10)))
    assert np.all(np.linalg.norm(classes - clusters, axis=-1) > 12)  # cluster k never looks like class k
