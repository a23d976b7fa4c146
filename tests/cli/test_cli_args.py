"""``securefed run``'s flags come from the plan (one list of choices, no import circle), and ``--help`` says the
truth about each switch."""

import subprocess
import sys

from securefed import estimators, plan
from securefed.cli.main import build_parser


def _run_parser():
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    return sub.choices["run"]


def test_every_choice_flag_offers_the_plans_choices():
    run = _run_parser()
    by_dest = {a.dest: a for a in run._actions}
    for name, choices in plan.CHOICES.items():
        if name in plan.NOT_CLI_FLAGS:
            continue
        assert tuple(by_dest[name].choices) == tuple(choices), name
    assert estimators.NYSTROM_MODES is plan.NYSTROM_MODES


def test_every_plan_flag_is_offered_once():
    run = _run_parser()
    dests = [a.dest for a in run._actions]
    for name in plan.plan_defaults():
        if name == "method":  # the job's --method, which also names the related systems (dsne, gtm …)
            continue
        assert dests.count(name) == (0 if name in plan.NOT_CLI_FLAGS else 1), name


def test_the_pipeline_does_not_import_the_command_line():
    """No import of securefed.cli anywhere in pipeline.py (not even a lazy one inside a function): the command line
    depends on the pipeline, never the reverse."""
    import ast
    import inspect

    from securefed import pipeline

    tree = ast.parse(inspect.getsource(pipeline))
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            target = ("." * node.level) + (node.module or "")
            assert "cli" not in target.split("."), (node.lineno, target)
        elif isinstance(node, ast.Import):
            assert not any("securefed.cli" in a.name for a in node.names), node.lineno
    code = (
        "import sys, securefed.pipeline; "
        "bad = sorted(m for m in sys.modules if m.startswith('securefed.cli')); "
        "assert not bad, bad"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr


def test_help_shows_no_default_under_both_halves_of_a_switch():
    text = _run_parser().format_help()
    flat = " ".join(text.split())
    assert "(default: True)" not in flat and "(default: False)" not in flat
    assert "--audit run the membership-audit gate (the default)" in flat
    assert "--no-audit no audit gate" in flat
