"""``securefed audit RUN_DIR [--out DIR]``: write report.html and report.json for a run folder.

Exit codes: 0 when the verdict is "pass", 1 when it is "fail", "fail (overridden)" or "not audited" (so a
compliance pipeline can stop on it); bad input raises a :class:`~securefed.errors.SecureFedError` (exit 2); an
internal error exits 3 (:data:`securefed.cli.main.EXIT_CODES`).
"""

from __future__ import annotations

import json

from ..report.build import write_report

__all__ = ["register", "handle_audit"]


def handle_audit(args) -> int:
    """Write the report and print ``{"html": ..., "json": ..., "verdict": ..., "reasons": [...]}``."""
    html_path, json_path = write_report(args.run_dir, args.out)
    with open(json_path, "r", encoding="utf-8") as fh:
        verdict = json.load(fh)["verdict"]
    print(
        json.dumps({"html": html_path, "json": json_path, "verdict": verdict["status"], "reasons": verdict["reasons"]})
    )
    from .main import EXIT_FAIL, EXIT_PASS

    return EXIT_PASS if verdict["status"] == "pass" else EXIT_FAIL


def register(subparsers) -> None:
    """Add the ``audit`` subcommand to the securefed CLI."""
    import argparse

    from .main import exit_codes_epilog

    p = subparsers.add_parser(
        "audit",
        help="write report.html and report.json (verdict, what leaves each site, budget, MIA, reconstruction risk)",
        description="Read a `securefed run --out` folder and write a self-contained privacy report.",
        epilog=exit_codes_epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("run_dir", metavar="RUN_DIR", help="the --out folder of `securefed run`")
    p.add_argument("--out", metavar="DIR", default=None, help="where to write the report (default: RUN_DIR)")
    p.set_defaults(func=handle_audit)
