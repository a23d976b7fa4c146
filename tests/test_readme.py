"""README.md holds exactly the two set-up commands (issue 2), and .ci/run runs the README's test command."""

import os
import re
import shutil
import stat
import subprocess

import pytest


def _read(repo_root, *parts):
    with open(os.path.join(repo_root, *parts), encoding="utf-8") as fh:
        return fh.read()


def _block(readme: str, marker: str) -> str:
    """The text between ``<!-- marker -->`` and ``<!-- /marker -->`` (exactly one such pair)."""
    opens = readme.count(f"<!-- {marker} -->")
    closes = readme.count(f"<!-- /{marker} -->")
    assert opens == 1 and closes == 1, f"README.md needs exactly one <!-- {marker} --> … <!-- /{marker} --> pair"
    return readme.split(f"<!-- {marker} -->", 1)[1].split(f"<!-- /{marker} -->", 1)[0]


def _fenced_command(block: str) -> str:
    lines = [ln for ln in block.strip().splitlines()]
    assert len(lines) == 3 and re.fullmatch(r"```\w*", lines[0]) and lines[2] == "```", (
        f"expected one fenced one-line command, got: {block!r}"
    )
    cmd = lines[1].strip()
    assert cmd and not cmd.startswith("#")
    return cmd


def test_readme_has_exactly_the_two_marked_commands(repo_root):
    readme = _read(repo_root, "README.md")
    run_cmd = _fenced_command(_block(readme, "run-command"))
    test_cmd = _fenced_command(_block(readme, "test-command"))
    assert "pip install" in run_cmd and "securefed run" in run_cmd
    assert "pip install" in test_cmd and "pytest" in test_cmd
    assert "torch==" in run_cmd and "torch==" in test_cmd  # never an unpinned torch (multi-GB CUDA build)
    # no other marker pairs: the two commands are the only marked blocks
    assert set(re.findall(r"<!-- /?([\w-]+) -->", readme)) == {"run-command", "test-command"}


def test_ci_extraction_yields_the_readme_test_command(repo_root):
    readme = _read(repo_root, "README.md")
    expected = _fenced_command(_block(readme, "test-command"))
    ci = _read(repo_root, ".ci", "run")
    lines = [ln for ln in ci.splitlines() if ln.startswith("cmd=$(")]
    assert len(lines) == 1, ".ci/run should extract the command in one `cmd=$(...)` line"
    p = subprocess.run(
        ["bash", "-c", lines[0] + '\nprintf "%s" "$cmd"'], cwd=repo_root, capture_output=True, text=True, timeout=30
    )
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == expected


@pytest.fixture
def fake_repo(tmp_path, repo_root):
    """A copy of .ci/run beside a README whose test command we choose, with a stub chromium on PATH
    (so .ci/run does not try to apt-get it)."""
    (tmp_path / ".ci").mkdir()
    shutil.copy(os.path.join(repo_root, ".ci", "run"), tmp_path / ".ci" / "run")
    bindir = tmp_path / "bin"
    bindir.mkdir()
    stub = bindir / "chromium"
    stub.write_text("#!/bin/sh\nexit 0\n")
    stub.chmod(stub.stat().st_mode | stat.S_IEXEC)

    def run_with(test_command: str) -> subprocess.CompletedProcess:
        (tmp_path / "README.md").write_text(
            "# x\n\n<!-- run-command -->\n```\necho run\n```\n<!-- /run-command -->\n\n"
            f"<!-- test-command -->\n```\n{test_command}\n```\n<!-- /test-command -->\n"
        )
        env = dict(os.environ, PATH=f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}")
        return subprocess.run(
            ["bash", str(tmp_path / ".ci" / "run")], capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path
        )

    return run_with


def test_ci_runs_the_command_and_treats_exit_5_as_failure(fake_repo):
    ok = fake_repo("echo suite-ran && exit 0")
    assert ok.returncode == 0 and "suite-ran" in ok.stdout
    assert fake_repo("exit 3").returncode == 3  # a failing suite fails CI with its own code
    five = fake_repo("exit 5")  # pytest: no tests collected
    assert five.returncode == 1 and "no tests" in five.stdout
