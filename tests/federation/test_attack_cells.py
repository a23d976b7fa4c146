"""Issue 24: the default cells against a coordinator that deviates (no site colluding), with the real SiteWorker and
SecAgg+ — through ``InMemoryExchange(before_request=…)``, the coordinator lying to the sites.

On 9fe16f9 the coordinator chose the cells' space, centres and floor: raw-space bisection recovered every record, a
floor lied to 1 gave 213 exact records, and moving a centre until one record left a cell isolated it. Now every site
recomputes each query from the pinned plan and the verified totals, checks the plan against its own floor, answers
each step once, and checks every total against the sum's proof: each attack is refused — no sum is released."""

import numpy as np
import pytest

from securefed.errors import SecureFedError
from securefed.federation import run_in_process
from securefed.federation.inprocess import site_names
from securefed.federation.wire import put_array
from securefed.plan import RunPlan


def _sites(n=5, per=70, m=6, seed=0):
    rng = np.random.default_rng(seed)
    centres = rng.normal(0.0, 3.0, size=(4, m))
    return [np.clip(centres[rng.integers(0, 4, per)] + rng.normal(0.0, 1.0, size=(per, m)), -9, 9) for _ in range(n)]


def _plan(**kw):
    base = dict(
        method="none", landmark_method="cells", value_bound=10.0, cell_floor=10, audit_holdout=0.0, seed=1, landmarks=40
    )
    base.update(kw)
    return RunPlan.build("api", **base)


def _attack(before_request, sites=None, plan=None):
    """Run the default cells with a lying coordinator; returns (the run's error or None, every site reply)."""
    replies = []

    def after(a, request, reply):
        replies.append((a, request.get("op"), request.get("task"), request.get("step"), reply))

    try:
        run_in_process(
            plan or _plan(), sites or _sites(), exchange={"before_request": before_request, "after_reply": after}
        )
        return None, replies
    except SecureFedError as exc:
        return exc, replies


def _released_cells_sums(replies):
    """The cells steps every site answered without error (what the coordinator could have summed)."""
    steps: dict = {}
    for a, op, task, step, reply in replies:
        if task == "cells" and op in ("secagg-input", "secagg-start") and "error" not in reply:
            steps.setdefault(step, set()).add(a)
    return steps


def test_an_honest_run_releases_every_cells_step_from_every_site():
    err, replies = _attack(lambda a, f: f)
    assert err is None
    steps = _released_cells_sums(replies)
    assert len(steps) >= 3 and all(len(v) == 5 for v in steps.values())


def test_the_floor_lied_to_one_is_refused_by_every_site():
    def lie(a, f):
        if f.get("task") == "cells":
            import json

            plan = json.loads(f["cells"])
            plan["floor"] = 1
            f["cells"] = json.dumps(plan, sort_keys=True)
        return f

    err, replies = _attack(lie)
    assert err is not None
    refusals = [r for _, _, t, _, r in replies if t == "cells"]
    assert refusals and all("error" in r and "cell-floor" in r["error"] for r in refusals)
    assert _released_cells_sums(replies) == {}


def test_raw_space_bisection_is_refused():
    """The old attack's request — a cell-sums task in the records' raw space around centres the coordinator chose
    (a record bisected at ± 1e-3) — is not a request any site answers."""
    sites = _sites()
    target = sites[2][0]

    def bisect(a, f):
        if f.get("task") == "cells" and f.get("step", 0) >= 1:
            g = {k: v for k, v in f.items() if k not in ("cells", "step", "previous", "previous_shape", "task")}
            Y = np.vstack([target + 1e-3, target - 1e-3])
            return put_array(dict(g, task="cell-sums", space="raw", second_moments=False), "Y", Y)
        return f

    err, replies = _attack(bisect, sites)
    assert err is not None
    later = [r for _, _, t, s, r in replies if t == "cell-sums"]
    assert later and all("error" in r and "unknown task" in r["error"] for r in later)


def test_a_cells_step_is_answered_once_and_in_order():
    """Re-asking a step (for instance of a subset of the sites, to difference two sums) or skipping one is
    refused: the coordinator cannot obtain two sums over sets that differ by a few records."""
    asked: dict = {}

    def replay(a, f):
        if f.get("task") == "cells" and f.get("step") == 2:
            asked.setdefault(a, 0)
            asked[a] += 1
        if f.get("task") == "cells" and f.get("step") == 3:
            f = dict(f, step=2)  # the coordinator asks step 2 again instead of step 3
        return f

    err, replies = _attack(replay)
    assert err is not None
    again = [r for _, _, t, s, r in replies if t == "cells" and s == 2]
    assert sum("error" in r for r in again) == 5  # every site answered step 2 once and refused it the second time


def test_a_forged_total_is_detected_by_every_site():
    """A wrong count vector relayed to every site (the coordinator forges the total in the proof and in the relayed
    total alike): each site recomputes the sum from the proof's signed inputs and refuses."""
    from securefed.securesum import messages as SM
    from securefed.securesum.quantize import word_dtype

    def forge(a, f):
        if f.get("task") == "cells" and f.get("step") == 2 and f.get("proof"):
            p = SM.decode(f["proof"])
            words = np.frombuffer(p.total, dtype=word_dtype(p.bits)).copy()
            words[0] += 1  # one record moved into the first candidate cell
            f = dict(f, proof=SM.encode(type(p)(**{**p.__dict__, "total": words.tobytes()})))
        return f

    err, replies = _attack(forge)
    assert err is not None
    at2 = [r for _, _, t, s, r in replies if t == "cells" and s == 2]
    assert len(at2) == 5 and all("error" in r and ("forged" in r["error"] or "proof" in r["error"]) for r in at2)


def test_a_relayed_total_that_is_not_the_proofs_is_refused():
    def shift(a, f):
        if f.get("task") == "cells" and f.get("step") == 2:
            prev = np.frombuffer(f["previous"], dtype="<f8").copy()
            prev[0] += 1.0
            f = dict(f, previous=prev.tobytes())
        return f

    err, replies = _attack(shift)
    assert err is not None
    at2 = [r for _, _, t, s, r in replies if t == "cells" and s == 2]
    assert at2 and all("error" in r and "proof" in r["error"] for r in at2)


def test_different_parameters_to_one_site_stop_the_sum_before_unmasking():
    """Per-site equivocation of what a sum computes — here another cells plan's scale for one site (issue 25's
    per-site scale isolation): its digest differs, so no honest site reveals anything of that sum."""
    import json

    victim = 0

    def equivocate(a, f):
        if f.get("task") == "cells" and f.get("step") == 1 and a == victim:
            plan = json.loads(f["cells"])
            plan["scale"] = 1e300
            f = dict(f, cells=json.dumps(plan, sort_keys=True))
        return f

    err, replies = _attack(equivocate)
    assert err is not None
    # nobody revealed a share of step 1's round: the victim refused (the plan differs from the one it pinned) and the
    # others saw no survivor set with its quorum
    assert _released_cells_sums(replies).get(1, set()) != set(range(5))


@pytest.mark.parametrize("seed", [0, 1])
def test_every_released_cell_holds_the_floor(seed):
    """The invariant itself, counted from the records: replay the run's tree on the pooled members (its queries are a
    function of the sums) — every cell whose sums were released holds ≥ floor records, and the replay's landmarks are
    the run's. (Changing a `< floor` to `< floor - 1` in the tree's cut makes this fail.)"""
    from securefed.federation import SiteWorker
    from securefed.landmarks.celltree import CellsPlan, CellTree

    sites = _sites(seed=seed)
    plan = _plan(audit_holdout=0.2, seed=seed, allow_audit_failure=True)  # the audit is not what is tested here
    res = run_in_process(plan, sites)
    members = [SiteWorker({"site-name": n}, X).split(0.2, seed)[0] for n, X in zip(site_names(len(sites)), sites)]
    cp = CellsPlan(
        floor=10,
        basis_dim=50,
        max_cells=min(40, sum(map(len, members)) // 10),
        max_levels=12,
        scale=10.0,
        n_max=max(map(len, members)),
    )
    tree = CellTree(cp, sites[0].shape[1])
    while (q := tree.next_query()) is not None:
        tree.absorb(q, sum(tree.upload(q, X) for X in members))
    F = tree.features(np.vstack(members))
    cells = tree.assign(F)
    released = [path for path, _, _, _ in tree.family(F)]
    assert len(released) > 1
    counted = sorted(len(cells[path]) for path in released)
    assert counted == res.landmark_info["released_counts"]  # the replay is the run's tree, counted from the records
    for path in released:
        assert len(cells[path]) >= 10, (path, len(cells[path]))
