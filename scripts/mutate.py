"""Mutation run on securefed's privacy-critical functions: does each deliberate bug make a test fail?

    python scripts/mutate.py                  # every mutation of the table, its tests, a markdown kill table
    python scripts/mutate.py --list           # the table only (and whether each target text is found)
    python scripts/mutate.py --only ckks-no-flood secagg-no-quorum --timeout 600

Each row of ``MUTATIONS`` names a file, an exact piece of its text, what replaces it and the tests that must
catch the change. The script copies the repository (the working tree as it is, without ``.git`` and caches) into a
temporary folder — it never edits the working tree — runs each selection of tests once on the unmutated copy
(the baseline: a mutation is judged only against tests that pass without it), then for each mutation writes the
mutated file into the copy, runs its tests there (``python -m pytest -x``, the copy first on ``sys.path``) and
restores the file. Outcomes:

* ``killed`` — a test failed (the first failing test is named);
* ``survived`` — every test passed: nothing guards this line against that bug;
* ``target-not-found`` — the old text is not in the file (the code moved on: update the row), or is there more
  than once (``ambiguous``): the mutation is not applied;
* ``timeout``, ``error`` (pytest could not run: collection or usage error), ``baseline-failed`` (the tests fail
  without the mutation, so they cannot judge it).

The exit code is 0 when no mutation survived and every target was found, 1 otherwise.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclass(frozen=True)
class Mutation:
    id: str
    area: str  # what the mutated line guards
    path: str  # relative to the repository root
    old: str  # exact text, present once in the file
    new: str
    tests: tuple  # pytest arguments
    issue: str = ""  # issue 22's mutation run: "survived" (one of its five survivors), "caught" (a kind of bug it
    # caught: Δ, noise scale, accounting, Shamir, masks, ledger order, billboard Δ, DDG, weights) or "new"
    note: str = field(default="", compare=False)


ACC = "tests/accounting/"
SS = "tests/securesum/"
CKKS_TESTS = (SS + "test_attack_ckks.py", SS + "test_ckks_machines.py", SS + "test_protocols_ckks.py")
CELL_TESTS = (
    "tests/federation/test_cell_axes.py",
    "tests/federation/test_cells_scale.py",
    "tests/audits/test_disclosure.py",
)

MUTATIONS = [
    # ---- the five survivors of issue 22 (the cell floor: two mutations)
    Mutation(
        "cell-floor-cut-strict",
        "cell floor: a split leaving exactly floor records on a side is allowed",
        "securefed/landmarks/celltree.py",
        "        if n0 < floor or n1 < floor:\n",
        "        if n0 <= floor or n1 <= floor:\n",
        CELL_TESTS,
        "survived",
    ),
    Mutation(
        "cell-floor-cut-minus-one",
        "cell floor: no split leaves fewer than floor records on a side",
        "securefed/landmarks/celltree.py",
        "        if n0 < floor or n1 < floor:\n",
        "        if n0 < floor - 1 or n1 < floor - 1:\n",
        CELL_TESTS,
        "survived",
    ),
    Mutation(
        "cell-floor-atom-minus-one",
        "cell floor: the site's disclosure auditor refuses an atom under the floor",
        "securefed/audits/disclosure.py",
        "        if 0.5 < atom < floor - 0.5:\n",
        "        if 0.5 < atom < floor - 1.5:\n",
        ("tests/audits/test_disclosure.py",),
        "survived",
    ),
    Mutation(
        "ckks-no-flood",
        "CKKS decryptor floods the decryption (key-recovery hygiene)",
        "securefed/securesum/ckks/machines.py",
        "        out = randomized_round(raw + gaussian_noise(p.length, spec.flood_sigma), p.step)\n",
        "        out = randomized_round(raw, p.step)\n",
        CKKS_TESTS,
        "survived",
    ),
    Mutation(
        "ckks-no-step-check",
        "CKKS server accepts a decrypted sum only at the stated rounding step",
        "securefed/securesum/ckks/machines.py",
        "        if msg.step != p.step or len(msg.data) != 8 * p.length:\n",
        "        if len(msg.data) != 8 * p.length:\n",
        CKKS_TESTS,
        "survived",
    ),
    Mutation(
        "report-override-reads-pass",
        "an overridden audit failure is never reported as pass",
        "securefed/report/build.py",
        '    elif gate_status == "fail (overridden)":\n        status = "fail (overridden)"\n',
        '    elif gate_status == "fail (overridden)":\n        status = "pass"\n',
        ("tests/report/test_report_override.py", "tests/report/test_report.py", "-k", "overrid or verdict"),
        "survived",
    ),
    Mutation(
        "secagg-no-quorum",
        "SecAgg+ client reveals shares only after a quorum of survivor-set signatures",
        "securefed/securesum/secagg_client.py",
        "        if good < q:\n",
        "        if False:\n",
        (SS + "test_attack_equivocation.py", "-k", "not 13_to_30"),
        "survived (only a unit test caught it; here: the attack tests alone)",
    ),
    # ---- caught in issue 22: Δ, noise scale, accounting, Shamir, masks, ledger order, billboard Δ, DDG, weights
    Mutation(
        "delta-kernel-shape-halved",
        "Δ: the kernel-shape bound of the MMD gradient (replace-one = 2 × one)",
        "securefed/accounting/sensitivity.py",
        '    return 2.0 * one if adjacency == "replace" else one\n',
        "    return one\n",
        (ACC + "test_acc_sensitivity.py", ACC + "test_acc_sensitivity_search.py"),
        "caught",
    ),
    Mutation(
        "delta-lipschitz-halved",
        "Δ: the Lipschitz bound 8γ√n_y τ_X/(n n_y)",
        "securefed/accounting/sensitivity.py",
        "    return 8.0 * gamma * math.sqrt(ny) * tau_x / (n * ny)\n",
        "    return 4.0 * gamma * math.sqrt(ny) * tau_x / (n * ny)\n",
        (ACC + "test_acc_sensitivity.py", ACC + "test_acc_sensitivity_search.py"),
        "caught",
    ),
    Mutation(
        "delta-data-halved",
        "Δ of a released record: ‖x − x'‖ ≤ 2τ_X (Theorem 3 corrected)",
        "securefed/accounting/sensitivity.py",
        '    return 2.0 * _pos("tau_x", tau_x)\n',
        '    return 1.0 * _pos("tau_x", tau_x)\n',
        (ACC + "test_acc_mechanisms.py",),
        "caught",
    ),
    Mutation(
        "noise-scale-halved",
        "noise scale: a release carries N(0, σ²), σ as booked",
        "securefed/accounting/mechanisms.py",
        "        noisy = value + sigma * self.normal(key + (attempt,), value.shape)\n",
        "        noisy = value + 0.5 * sigma * self.normal(key + (attempt,), value.shape)\n",
        (ACC + "test_acc_mechanisms.py", ACC + "test_acc_secret_noise.py"),
        "caught",
    ),
    Mutation(
        "noise-calibration-halved",
        "noise scale: σ = z·Δ per site",
        "securefed/accounting/mechanisms.py",
        "            self.sigma = [self.z * d for d in deltas]\n",
        "            self.sigma = [self.z * d / 2 for d in deltas]\n",
        (ACC + "test_acc_mechanisms.py",),
        "caught",
    ),
    Mutation(
        "accounting-count-ignored",
        "accounting: μ = √(Σ count/z²) over a history of releases",
        "securefed/accounting/accountants.py",
        "            total += c / (z * z)\n",
        "            total += 1 / (z * z)\n",
        (ACC + "test_acc_accountants.py", ACC + "test_acc_ledger.py"),
        "caught",
    ),
    Mutation(
        "accounting-gdp-delta",
        "accounting: δ(ε) = Φ(−ε/μ + μ/2) − e^ε Φ(−ε/μ − μ/2)",
        "securefed/accounting/accountants.py",
        "    b = -epsilon / mu - mu / 2.0\n",
        "    b = -epsilon / mu - mu\n",
        (ACC + "test_acc_accountants.py",),
        "caught",
    ),
    Mutation(
        "ledger-not-written",
        "ledger before release: the event is on disk (fsync'd) before the value leaves",
        "securefed/accounting/ledger.py",
        "        if self.path is not None:\n            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)\n",
        "        if False:\n            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)\n",
        (ACC + "test_acc_ledger.py",),
        "caught",
    ),
    Mutation(
        "ledger-no-budget-check",
        "ledger before release: a release over budget is refused before it is written",
        "securefed/accounting/ledger.py",
        "            self._refuse_over_budget(site, eps_after)\n            hist = ",
        "            hist = ",
        (ACC + "test_acc_ledger.py",),
        "caught",
    ),
    Mutation(
        "billboard-rff-sensitivity",
        "billboard: Δ₁ = 2 of the random-feature sum (‖φ‖ = 1)",
        "securefed/landmarks/merf.py",
        "RFF_SENSITIVITY = 2.0 ",
        "RFF_SENSITIVITY = 1.0 ",
        ("tests/federation/test_billboard.py", "-k", "calibration or compose or sensitivity"),
        "caught",
    ),
    Mutation(
        "billboard-count-sensitivity",
        "billboard: Δ₂ = √2 of the per-cell counts",
        "securefed/landmarks/merf.py",
        "COUNT_SENSITIVITY = math.sqrt(2.0)",
        "COUNT_SENSITIVITY = 1.0",
        ("tests/federation/test_billboard.py", "-k", "calibration or compose or sensitivity or replace"),
        "new",
    ),
    Mutation(
        "ddg-no-noise",
        "distributed discrete Gaussian: each site adds its integer noise before the sum",
        "securefed/accounting/distributed.py",
        "        y = r + self._noise(self.padded_dim, src)\n",
        "        y = r\n",
        (ACC + "test_acc_distributed.py", "tests/federation/test_distributed_integer.py"),
        "caught",
    ),
    Mutation(
        "ddg-variance-quartered",
        "distributed discrete Gaussian: the noise has the calibrated σ²",
        "securefed/accounting/distributed.py",
        "        return discrete_gaussian(self.sigma2, size, src)\n",
        "        return discrete_gaussian(self.sigma2 / 4, size, src)\n",
        (ACC + "test_acc_distributed.py", "tests/federation/test_distributed_integer.py"),
        "new",
    ),
    Mutation(
        "skellam-rate-quartered",
        "distributed Skellam: the noise has the calibrated rate λ",
        "securefed/accounting/distributed.py",
        "        return skellam(self.lam, size, src)\n",
        "        return skellam(self.lam / 4, size, src)\n",
        (ACC + "test_acc_distributed.py", "tests/federation/test_distributed_integer.py"),
        "new",
    ),
    Mutation(
        "shamir-degree-too-low",
        "Shamir: a polynomial of degree t − 1 (t − 1 shares reveal nothing)",
        "securefed/securesum/shamir.py",
        "    coeffs = [secrets.randbelow(prime) for _ in range(threshold - 1)]\n",
        "    coeffs = [secrets.randbelow(prime) for _ in range(threshold - 2)]\n",
        (SS + "test_protocols_shamir.py",),
        "caught",
    ),
    Mutation(
        "shamir-lagrange-sign",
        "Shamir: Lagrange coefficients at 0",
        "securefed/securesum/shamir.py",
        "                den = den * (xm - xj) % prime\n",
        "                den = den * (xj - xm) % prime\n",
        (SS + "test_protocols_shamir.py",),
        "caught",
    ),
    Mutation(
        "masks-pair-sign",
        "SecAgg+ masks: the pairwise masks of u < v and v > u cancel",
        "securefed/securesum/secagg_client.py",
        "sign=+1 if self.id < v else -1,",
        "sign=+1,",
        (SS + "test_protocols_secagg.py",),
        "caught",
    ),
    Mutation(
        "masks-self-mask-sign",
        "SecAgg+ masks: the self mask the server removes with the revealed seed",
        "securefed/securesum/secagg_client.py",
        "info=self_info(spec.round_index, self.id), sign=+1, buf=buf",
        "info=self_info(spec.round_index, self.id), sign=-1, buf=buf",
        (SS + "test_protocols_secagg.py",),
        "caught",
    ),
    Mutation(
        "server-weight-accepted",
        "a site never takes a weight from the server (a zero weight for all but a victim)",
        "securefed/federation/sums.py",
        '    if "weight" in fields:\n        raise ProtocolError(',
        "    if False:\n        raise ProtocolError(",
        ("tests/federation/test_secure_sum_threats.py", "-k", "weight"),
        "caught",
    ),
]

_IGNORE = {
    ".git",
    ".mypy_cache",
    ".ruff_cache",
    ".hypothesis",
    ".pytest_cache",
    "__pycache__",
    "securefed-run",
    ".benchmarks",
    "build",
    "dist",
}


def _ignore(src: str, names: list) -> set:
    out = {n for n in names if n in _IGNORE or n.endswith(".egg-info")}
    if os.path.basename(src) == "benchmarks" and "results" in names:
        out.add("results")
    return out


def copy_repository(repo: str, dest: str) -> str:
    """The working tree as it is (uncommitted edits included), without version control and caches."""
    target = os.path.join(dest, "repo")
    shutil.copytree(repo, target, ignore=_ignore, symlinks=True)
    return target


def locate(copy: str, m: Mutation) -> str | None:
    """None when the mutation applies; else why not (target-not-found / ambiguous)."""
    path = os.path.join(copy, m.path)
    if not os.path.isfile(path):
        return f"target-not-found: no file {m.path}"
    n = open(path, encoding="utf-8").read().count(m.old)
    if n == 0:
        return "target-not-found: the old text is not in the file"
    if n > 1:
        return f"target-not-found: ambiguous, the old text is there {n} times"
    return None


def run_tests(copy: str, tests: tuple, timeout: float) -> tuple[str, str, float]:
    """(outcome, detail, seconds) of ``pytest -x`` on ``tests`` in the copy."""
    env = dict(os.environ, PYTHONPATH=copy, PYTHONDONTWRITEBYTECODE="1", PYTHONHASHSEED="0")
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests]
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=copy, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return "timeout", f"over {timeout:.0f} s", time.perf_counter() - t0
    secs = time.perf_counter() - t0
    out = proc.stdout + proc.stderr
    if proc.returncode == 0:
        return "passed", "", secs
    if proc.returncode == 1:
        failed = re.findall(r"^FAILED (\S+)", out, flags=re.M) or re.findall(r"^ERROR (\S+)", out, flags=re.M)
        return "failed", (failed[0] if failed else "a test failed"), secs
    tail = " ".join(out.strip().splitlines()[-2:])[:200]
    return "error", f"pytest exit {proc.returncode}: {tail}", secs


def mutate_and_test(copy: str, m: Mutation, timeout: float) -> tuple[str, str, float]:
    path = os.path.join(copy, m.path)
    original = open(path, encoding="utf-8").read()
    try:
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(original.replace(m.old, m.new, 1))
        result, detail, secs = run_tests(copy, m.tests, timeout)
    finally:
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(original)
    outcome = {"failed": "killed", "passed": "survived"}.get(result, result)
    return outcome, detail, secs


def _machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as fh:
            names = [ln.split(":", 1)[1].strip() for ln in fh if ln.startswith("model name")]
        cpu = names[0] if names else cpu
    except OSError:
        pass
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return f"{cpu}, {os.cpu_count()} cores, load {load:.1f}, Python {platform.python_version()}"


def _row(m: Mutation, outcome: str, detail: str, secs: float | None) -> str:
    tests = " ".join(m.tests)
    took = "" if secs is None else f"{secs:.0f}"
    return f"| `{m.id}` | {m.area} | `{m.path}` | `{tests}` | {m.issue or '-'} | **{outcome}** | {detail} | {took} |"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="+", metavar="ID", help="run only these mutations")
    ap.add_argument("--list", action="store_true", help="print the table and whether each target is found; run nothing")
    ap.add_argument("--repo", default=ROOT, help="the repository to copy (default: this script's)")
    ap.add_argument("--timeout", type=float, default=1200.0, help="seconds per test run (default 1200)")
    ap.add_argument("--no-baseline", action="store_true", help="skip the unmutated runs of each test selection")
    a = ap.parse_args(argv)
    chosen = [m for m in MUTATIONS if not a.only or m.id in a.only]
    unknown = set(a.only or ()) - {m.id for m in MUTATIONS}
    if unknown:
        ap.error(f"unknown mutation ids: {', '.join(sorted(unknown))}")
    print(f"# mutation run, {datetime.date.today().isoformat()}, {_machine()}")
    print(f"# {' '.join([os.path.basename(sys.executable), 'scripts/mutate.py'] + list(argv or sys.argv[1:]))}")
    print("\n| mutation | guards | file | tests | issue 22 | outcome | first failing test / reason | s |")
    print("|---|---|---|---|---|---|---|---|", flush=True)
    counts: dict = {}
    with tempfile.TemporaryDirectory(prefix="securefed-mutate-") as tmp:
        copy = copy_repository(os.path.abspath(a.repo), tmp)
        baseline: dict = {}
        for m in chosen:
            why = locate(copy, m)
            if why is not None or a.list:
                outcome, detail, secs = ("target-not-found", why, None) if why else ("found", "", None)
            else:
                if not a.no_baseline and m.tests not in baseline:
                    baseline[m.tests] = run_tests(copy, m.tests, a.timeout)
                base = baseline.get(m.tests, ("passed", "", 0.0))
                if base[0] != "passed":
                    outcome, detail, secs = "baseline-failed", f"{base[0]}: {base[1]}", base[2]
                else:
                    outcome, detail, secs = mutate_and_test(copy, m, a.timeout)
            counts[outcome] = counts.get(outcome, 0) + 1
            print(_row(m, outcome, detail, secs), flush=True)
    print("\n" + ", ".join(f"{k}: {v}" for k, v in sorted(counts.items())) + f" (of {len(chosen)})")
    bad = {k for k in counts if k not in ("killed", "found")}
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
