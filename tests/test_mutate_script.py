"""scripts/mutate.py: every target of its table is in today's code, and a target that moved is reported, not a crash.

(The mutation run itself takes tens of minutes; it is a maintainer's tool, its kill table is in BENCHMARKS.md.)"""

import importlib.util
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def mutate():
    spec = importlib.util.spec_from_file_location("securefed_mutate", os.path.join(ROOT, "scripts", "mutate.py"))
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up while the class is made
    spec.loader.exec_module(mod)
    yield mod
    sys.modules.pop(spec.name, None)


def test_every_mutation_target_is_found_once(mutate):
    assert len(mutate.MUTATIONS) >= 19 and len({m.id for m in mutate.MUTATIONS}) == len(mutate.MUTATIONS)
    missing = [(m.id, why) for m in mutate.MUTATIONS if (why := mutate.locate(ROOT, m))]
    assert not missing, f"update the rows of scripts/mutate.py whose code moved: {missing}"
    for m in mutate.MUTATIONS:  # every selection names test files that exist
        assert all(os.path.exists(os.path.join(ROOT, t)) for t in m.tests if t.startswith("tests/")), m.id


def test_a_target_that_moved_is_reported_not_applied(mutate, tmp_path, capsys):
    repo = tmp_path / "repo"
    (repo / "securefed" / "securesum").mkdir(parents=True)
    (repo / "securefed" / "securesum" / "shamir.py").write_text("def share():\n    pass\n")  # the code moved on
    rc = mutate.main(["--only", "shamir-lagrange-sign", "masks-pair-sign", "--repo", str(repo)])
    out = capsys.readouterr().out
    assert rc == 1
    assert out.count("**target-not-found**") == 2 and "target-not-found: 2 (of 2)" in out
    assert "the old text is not in the file" in out and "no file securefed/securesum/secagg_client.py" in out
    with pytest.raises(SystemExit):
        mutate.main(["--only", "no-such-mutation"])
