"""A ``--coordinates keep`` run's report, as Chromium renders it: no sentence says that a coordinate (or a position,
or a cluster label) left a site, and nothing reads as a missing file — the first screen says that nothing per record
left any site."""

import json
import os
import re

import pytest

from securefed.cli import main

pytestmark = [pytest.mark.usefixtures("single_blas_thread"), pytest.mark.slow]

PER_RECORD = re.compile(r"\b(coordinates?|positions?|cluster labels?)\b", re.I)
MOVED = re.compile(r"\b(leaves?|left|went|goes|go to|sent|sends|received|receives|learn(s|ed)?|reach(es|ed)?)\b", re.I)
NEGATED = re.compile(r"\b(nothing|never|no|stay(s|ed)?|kept|keeps?|not)\b", re.I)


def _clauses(dom: str) -> list[str]:
    """The page's text as a reader meets it — cell by cell, sentence by sentence — without the table of the modes
    this run did not use (it says what the coordinator would learn in them) and without embedded images."""
    dom = re.sub(r"<details class=\"other-modes\".*?</details>", " ", dom, flags=re.S)
    dom = dom.split("<h2>Names in report.json</h2>")[0]
    dom = re.sub(r"<(style|script)[^>]*>.*?</\1>", " ", dom, flags=re.S)
    cells = re.split(r"<(?:td|th|li|p|h\d|div)[^>]*>", dom)
    out = []
    for cell in cells:
        text = re.sub(r"<[^>]+>", " ", cell).replace("&amp;", "&")
        out += [c.strip() for c in re.split(r"(?<=[.;:])\s+|\s—\s", text) if c.strip()]
    return out


# under DP the noise is secret (the OS source), so the membership audit of 30 iris hold-outs varies from run to run
# (it crossed 0.6 once in CI): the run proceeds past a failed audit (recorded) so that there is always a report
@pytest.mark.parametrize(
    "extra",
    [["--cell-floor", "8"], ["--epsilon", "1", "--landmarks", "20", "--allow-audit-failure"]],
    ids=["cells", "dp"],
)
def test_a_keep_run_never_says_a_coordinate_left(tmp_path, capsys, extra):
    from securefed.report.browser import find_chromium, render_report

    if find_chromium() is None:
        if os.environ.get("SECUREFED_CI") == "1":
            pytest.fail("chromium is not installed but SECUREFED_CI=1")
        pytest.skip("chromium not installed (apt-get install -y chromium)")
    out = tmp_path / "keep"
    rc = main(
        [
            "run",
            "--dataset",
            "iris",
            "--clients",
            "3",
            "--partition",
            "iid",
            "--coordinates",
            "keep",
            "--no-compare-centralized",
            "--quiet",
            "--out",
            str(out),
            *extra,
        ]
    )
    assert rc in (0, 1), capsys.readouterr().err
    png, dom = render_report(out / "report.html", width=1280, height=900)
    clauses = _clauses(dom)
    claims = [c for c in clauses if PER_RECORD.search(c) and MOVED.search(c) and not NEGATED.search(c)]
    assert not claims, claims
    # the coordinator's row of "who could learn what" names no per-record output except to say there is none
    row = re.search(r"The coordinator \(following the protocol\)</th><td>(.*?)</td>", dom, flags=re.S).group(1)
    assert all(NEGATED.search(c) for c in re.split(r";\s*", row) if PER_RECORD.search(c)), row
    text = " ".join(clauses)
    assert "Nothing per record left any site" in text
    for wrong in ("cover nothing", "reconstruction.json not found", "not available (", "ledger.jsonl not found"):
        assert wrong not in text, wrong
    report = json.loads((out / "report.json").read_text())
    assert report["verdict"]["reconstruction"] == "nothing left" and report["mode"]["coordinates"] == "keep"
    # the first screen (1280 × 900) holds the verdict, the adversary, the checks against their limits, the map quality
    bottoms = _bottoms(out / "report.html", (".headline", ".adversary", "table.checks", ".first .cols p", ".perrec"))
    assert all(0 < b <= 900 for b in bottoms.values()), bottoms


def _bottoms(html_path, selectors) -> dict:
    """Where each selector's element ends on a 1280 × 900 window (px from the top), measured by Chromium itself."""
    import subprocess
    import tempfile

    from securefed.report.browser import _FLAGS, find_chromium

    page = open(html_path, encoding="utf-8").read()
    probe = (
        "<script>const out = {};"
        + "".join(
            f"out[{sel!r}] = document.querySelector({sel!r}).getBoundingClientRect().bottom;" for sel in selectors
        )
        + "document.body.setAttribute('data-bottoms', JSON.stringify(out));</script>"
    )
    with tempfile.TemporaryDirectory() as d:
        probe_path = os.path.join(d, "probe.html")
        with open(probe_path, "w", encoding="utf-8") as fh:
            fh.write(page.replace("</body>", probe + "</body>"))
        p = subprocess.run(
            [
                find_chromium(),
                *_FLAGS,
                f"--user-data-dir={d}/profile",
                "--window-size=1280,900",
                "--dump-dom",
                "file://" + probe_path,
            ],
            capture_output=True,
            timeout=90,
            text=True,
        )
    raw = re.search(r'data-bottoms="([^"]+)"', p.stdout).group(1).replace("&quot;", '"')
    return json.loads(raw)
