"""No function over 100 lines without a reason beside it.

A function longer than ``MAX_LINES`` (from its ``def`` to its last line, docstring included) must say why on its
``def`` line, as a comment ``# long: <the reason>``; everything else is split into named pieces."""

import ast
import glob
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAX_LINES = 100
REASON = re.compile(r"#\s*long:\s*\S")


def long_functions(source: str, max_lines: int = MAX_LINES):
    """(name, first line, length) of every function longer than ``max_lines`` with no ``# long: why`` on its def line."""
    lines = source.splitlines()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            n = node.end_lineno - node.lineno + 1
            if n > max_lines and not REASON.search(lines[node.lineno - 1]):
                yield node.name, node.lineno, n


def test_no_function_over_100_lines_without_a_reason():
    bad = []
    for pattern in ("securefed/**/*.py", "benchmarks/*.py", "scripts/*.py", "tests/**/*.py"):
        for path in sorted(glob.glob(os.path.join(ROOT, pattern), recursive=True)):
            with open(path, encoding="utf-8") as fh:
                for name, line, n in long_functions(fh.read()):
                    bad.append(f"{os.path.relpath(path, ROOT)}:{line}: {name} is {n} lines")
    assert not bad, "split these functions, or give the reason on the def line as `# long: why`:\n" + "\n".join(bad)


def test_the_check_sees_a_long_function_and_its_reason():
    body = "\n".join(f"    x{i} = {i}" for i in range(100))
    assert [n for n, _, _ in long_functions(f"def f():\n{body}\n")] == ["f"]
    assert list(long_functions(f"def f():  # long: one table of cases\n{body}\n")) == []
    assert list(long_functions(f"def f():\n{body[:-40]}\n")) == []
