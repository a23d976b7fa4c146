"""Every figure the accountants print, bit for bit as at commit 9fe16f9 (before the event model of issue 22 item 3).

``figures_9fe16f9.json`` beside this file was written by this module (``python tests/accounting/
test_acc_figures_unchanged.py --record``) on the code of commit 9fe16f9, before the accounting was restructured;
the test recomputes the same figures on the current code and asserts **exact** equality (floats compared with
``==``: the accountants are deterministic). Covered: ``securefed budget`` (its printed JSON), the accountants on
heterogeneous histories, and the privacy block, the aggregate ledger and every site ledger of small in-process
runs: FedDL gradient / model with local noise, distributed Gaussian shares, DDG, Skellam, the billboard with and
without the density, distributed billboard shares, the rows' data perturbation and Poisson subsampling (RDP and PRV).

What is left out of the comparison: wall-clock times, file paths, event ids' random in-memory run ids, and the
seeded-noise release digests (they depend on the noise and the Poisson sample, not on the accounting).
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import sys
import tempfile
from types import SimpleNamespace

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
RECORD = os.path.join(HERE, "figures_9fe16f9.json")
_DROP = {"time", "created", "path", "ledger", "release_digest", "seed_tag"}


def _clean(v):
    """JSON-able copy without the keys that are not accounting figures (times, paths, digests)."""
    if isinstance(v, dict):
        return {str(k): _clean(x) for k, x in sorted(v.items(), key=lambda kv: str(kv[0])) if str(k) not in _DROP}
    if isinstance(v, (list, tuple)):
        return [_clean(x) for x in v]
    if isinstance(v, np.ndarray):
        return [_clean(x) for x in v.tolist()]
    if isinstance(v, (np.floating,)):
        return float(v)
    if isinstance(v, (np.integer,)):
        return int(v)
    if isinstance(v, float) and not math.isfinite(v):
        return repr(v)
    return v


def _budget_cli(argv) -> dict:
    from securefed.cli.budget import budget_command

    ns = dict(epsilon=None, noise_multiplier=None, releases=None, delta=None, sample_rate=1.0, accountant="exact")
    it = iter(argv)
    for flag in it:
        ns[flag.lstrip("-").replace("-", "_")] = next(it)
    for k in ("epsilon", "noise_multiplier", "delta", "sample_rate"):
        ns[k] = None if ns[k] is None else float(ns[k])
    ns["releases"] = int(ns["releases"])
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        budget_command(SimpleNamespace(**ns))
    return {"argv": list(argv), "stdout": buf.getvalue()}


BUDGET_CASES = [
    ["--noise-multiplier", "1.1", "--releases", "100", "--delta", "1e-5"],
    ["--noise-multiplier", "0.5", "--releases", "1000", "--delta", "1e-5"],
    ["--epsilon", "1.0", "--releases", "40", "--delta", "1e-5"],
    ["--epsilon", "2.0", "--releases", "10", "--delta", "1e-6", "--accountant", "paper"],
    ["--noise-multiplier", "3.0", "--releases", "50", "--delta", "1e-5", "--accountant", "paper"],
    [
        "--noise-multiplier",
        "1.0",
        "--releases",
        "200",
        "--delta",
        "1e-5",
        "--sample-rate",
        "0.1",
        "--accountant",
        "rdp",
    ],
    [
        "--noise-multiplier",
        "1.0",
        "--releases",
        "100",
        "--delta",
        "1e-5",
        "--sample-rate",
        "0.1",
        "--accountant",
        "prv",
    ],
    ["--epsilon", "1.0", "--releases", "100", "--delta", "1e-5", "--sample-rate", "0.2", "--accountant", "rdp"],
]

HISTORIES = [
    [(1.3, 1.0, 7), (0.9, 1.0, 2), (4.0, 1.0, 1)],
    [(2.0, 0.1, 30), (1.0, 0.2, 5), (1.5, 1.0, 3)],
]


def _accountant_figures() -> dict:
    from securefed.accounting import calibrate_noise_multiplier, epsilon_from_noise, get_accountant

    out = {"history": [], "calibrate": [], "epsilon": []}
    for h in HISTORIES:
        for name in ("exact", "prv", "rdp", "paper"):
            if name == "exact" and any(q < 1 for _, q, _ in h):
                continue
            out["history"].append([name, [list(x) for x in h], get_accountant(name).epsilon_history(h, 1e-5)])
    for name, q in (("exact", 1.0), ("paper", 1.0), ("rdp", 0.05), ("prv", 0.3)):
        out["calibrate"].append([name, q, calibrate_noise_multiplier(1.5, 1e-5, 60, name, q)])
        out["epsilon"].append([name, q, epsilon_from_noise(1.7, 60, 1e-5, name, q)])
    return out


def _sites(n=3, m=4, seed=5):
    rng = np.random.default_rng(seed)
    return [np.clip(rng.normal(size=(40 + 6 * i, m)) * 0.5 + 0.3 * i, -3, 3) for i in range(n)]


def _billboard_sites():
    rng = np.random.default_rng(0)
    centres = rng.normal(size=(4, 10)) * 3
    out = []
    for _ in range(3):
        lab = rng.integers(0, 4, size=80)
        out.append(np.clip(centres[lab] + rng.normal(size=(80, 10)), -8, 8))
    return out


FEDDL = dict(
    method="none",
    landmark_method="feddl",
    landmarks=6,
    rounds=2,
    local_steps=2,
    value_bound=3.0,
    seed=3,
    audit_holdout=0.0,
    clip_norm=2.0,
    min_sites=3,
)
BILLBOARD = dict(
    method="tsne",
    epsilon=2.0,
    delta=1e-5,
    clip_norm=8.0 * math.sqrt(10),
    value_bound=8.0,
    audit_holdout=0.0,
    landmarks=30,
    n_iter=250,
    seed=5,
)

RUNS = {
    "feddl-gradient-local": dict(FEDDL, rule="gradient", aggregation="plain", epsilon=2.0, noise_seed_for_testing=1),
    "feddl-model-local": dict(FEDDL, rule="model", aggregation="plain", epsilon=1.5),
    "feddl-gradient-distributed-gaussian": dict(
        FEDDL,
        rule="gradient",
        aggregation="secagg",
        epsilon=3.0,
        noise="distributed",
        distributed_mechanism="gaussian",
        noise_seed_for_testing=2,
    ),
    "feddl-ddg": dict(
        FEDDL,
        rule="gradient",
        aggregation="secagg",
        epsilon=2.0,
        noise="distributed",
        distributed_mechanism="ddg",
        local_steps=1,
        noise_seed_for_testing=3,
    ),
    "feddl-skellam": dict(
        FEDDL,
        rule="gradient",
        aggregation="secagg",
        epsilon=2.0,
        noise="distributed",
        distributed_mechanism="skellam",
        local_steps=1,
        noise_seed_for_testing=3,
    ),
    "feddl-subsampled-rdp": dict(
        FEDDL,
        rule="gradient",
        aggregation="plain",
        epsilon=2.0,
        sample_rate=0.5,
        accountant="rdp",
        noise_seed_for_testing=4,
    ),
    "feddl-subsampled-prv": dict(
        FEDDL, rule="gradient", aggregation="plain", epsilon=2.0, sample_rate=0.5, accountant="prv", rounds=1
    ),
    "feddl-paper": dict(FEDDL, rule="model", aggregation="plain", epsilon=1.0, accountant="paper"),
    "rows": dict(
        FEDDL,
        method="tsne",
        nystrom="rows",
        aggregation="plain",
        epsilon=1.0,
        rows_epsilon=1.0,
        rounds=1,
        n_iter=250,
        perplexity=10.0,
        noise_seed_for_testing=1,
    ),
    "billboard": dict(BILLBOARD, aggregation="plain", noise_seed_for_testing=11),
    "billboard-density": dict(BILLBOARD, aggregation="plain", coordinates="keep", density_share=0.2),
    "billboard-distributed": dict(BILLBOARD, aggregation="secagg", noise="distributed", noise_seed_for_testing=11),
}


def _ledger_figures(path: str) -> list:
    with open(path) as fh:
        return [_clean(json.loads(line)) for line in fh if line.strip()]


def _run_figures(name: str) -> dict:
    from threadpoolctl import threadpool_limits

    from securefed.federation import run_in_process
    from securefed.federation.privacy import open_server_ledger
    from securefed.plan import RunPlan

    plan = RunPlan.build("api", **dict(RUNS[name], run_id=f"fig-{name}"))
    sites = _billboard_sites() if name.startswith("billboard") else _sites()
    with tempfile.TemporaryDirectory() as tmp, threadpool_limits(limits=1, user_api="blas"):
        ledger = open_server_ledger(plan, plan.run_id, os.path.join(tmp, "ledger.jsonl"))
        res = run_in_process(plan, sites, ledger=ledger)
        site_dir = os.path.join(tmp, "site-ledgers")
        sites_out = {
            s: _ledger_figures(os.path.join(site_dir, s, f"{plan.run_id}.jsonl")) for s in sorted(os.listdir(site_dir))
        }
        return {
            "privacy": _clean(res.privacy),
            "landmark_privacy": _clean(getattr(res, "landmark_info", None) or {}),
            "ledger": _ledger_figures(os.path.join(tmp, "ledger.jsonl")),
            "site_ledgers": sites_out,
            "ledger_summary": _clean(ledger.summary()),
            "epsilon_by_round": _clean(ledger.epsilon_by_round()),
        }


def all_figures() -> dict:
    from securefed.landmarks.merf import RFF_SENSITIVITY

    return {
        "rff_sensitivity": RFF_SENSITIVITY,
        "budget_cli": [_budget_cli(a) for a in BUDGET_CASES],
        "accountants": _clean(_accountant_figures()),
        "runs": {name: _run_figures(name) for name in RUNS},
    }


# ------------------------------------------------------------------------------------ the tests


@pytest.fixture(scope="module")
def recorded():
    with open(RECORD) as fh:
        return json.load(fh)


def _assert_same(got, want, where="figures", more_keys=False):
    """Exact equality, with the path of the first difference in the message. ``more_keys``: a ledger line may carry
    keys it did not carry at 9fe16f9 (the event model's fields, the site index), never lose or change one."""
    if isinstance(want, dict):
        assert isinstance(got, dict), where
        if more_keys:
            assert not set(want) - set(got), f"{where}: keys {sorted(set(want) - set(got))} lost"
        else:
            assert sorted(got) == sorted(want), f"{where}: keys {sorted(set(got) ^ set(want))} differ"
        for k in want:
            _assert_same(got[k], want[k], f"{where}.{k}", more_keys)
    elif isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want), f"{where}: length {len(got)} != {len(want)}"
        for i, (g, w) in enumerate(zip(got, want)):
            _assert_same(g, w, f"{where}[{i}]", more_keys)
    else:
        assert got == want and type(got) is type(want), f"{where}: {got!r} != {want!r} (as at 9fe16f9)"


def test_budget_command_prints_the_same_json(recorded):
    for case in recorded["budget_cli"]:
        assert _budget_cli(case["argv"])["stdout"] == case["stdout"]


def test_accountants_give_the_same_figures(recorded):
    _assert_same(json.loads(json.dumps(_clean(_accountant_figures()))), recorded["accountants"], "accountants")


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(RUNS))
def test_every_run_figure_is_unchanged(recorded, name):
    from securefed.landmarks.merf import RFF_SENSITIVITY

    if name.startswith("billboard") and RFF_SENSITIVITY != recorded["rff_sensitivity"]:
        pytest.skip(
            f"the billboard's Δ₁ changed ({recorded['rff_sensitivity']} → {RFF_SENSITIVITY}, issue 27): its "
            "figures legitimately differ; re-record them on the commit before the event model"
        )
    got = json.loads(json.dumps(_run_figures(name)))
    want = recorded["runs"][name]
    for part in ("ledger", "site_ledgers"):  # the files may say more than they did, never less or otherwise
        _assert_same(got.pop(part), want[part], f"{name}.{part}", more_keys=True)
    _assert_same(got, {k: v for k, v in want.items() if k not in ("ledger", "site_ledgers")}, name)


if __name__ == "__main__":  # record the figures (only on the reference commit)
    if "--record" not in sys.argv:
        raise SystemExit("usage: python tests/accounting/test_acc_figures_unchanged.py --record")
    figs = all_figures()
    with open(RECORD, "w") as fh:
        json.dump(figs, fh, indent=1, sort_keys=True)
        fh.write("\n")
    print(f"wrote {RECORD}")
