"""The options table in docs/options.md is the code's (one vocabulary: parameter, flag, Flower key, default)."""

import os

from securefed.cli.run import options_table
from securefed.plan import HELP, plan_defaults


def test_options_doc_holds_the_generated_table(repo_root):
    with open(os.path.join(repo_root, "docs", "options.md"), encoding="utf-8") as fh:
        doc = fh.read()
    table = doc.split("<!-- options-table -->\n", 1)[1].split("<!-- /options-table -->", 1)[0]
    assert table == options_table(), (
        "docs/options.md is stale: paste securefed.cli.run.options_table() between the markers"
    )


def test_every_plan_option_has_help_and_a_row():
    missing = sorted(set(plan_defaults()) - set(HELP))
    assert not missing, f"plan options without a HELP line (and so without a row in docs/options.md): {missing}"
    assert options_table().count("\n") == len(HELP) + 2
