"""Against whom a run's privacy holds: the ``guarantee`` block of ``result.json`` (read by the report).

Computed once, from the plan and from what every site reported at ``hello`` about its own conditions
(:meth:`securefed.federation.site.SiteWorker.guards` — options the site enforces whatever the coordinator asks):

* **the default cells** (no DP) hold against a coordinator that **deviates** from the protocol but colludes with no
  site — every site recomputes each query, verifies each total from the SecAgg+ proof, applies the floor and the
  disclosure check to its own records, and refuses everything it cannot recompute or verify — *if* the sum is
  SecAgg+ (CKKS and plain totals cannot be verified by the sites) and every site keeps its defaults: no plain
  uploads, no paper mode, a cell floor ≥ the plan's, the audit required and not overridable;
* **the DP billboard** holds against **any** coordinator, colluding with any sites, for what ε covers — each site
  adds its full noise (with distributed noise: only while the secure sum holds and no more than ``dp-colluders``
  collude);
* **the paper's modes** (FedDL without DP, rows) hold only against a coordinator that follows the protocol.

In every mode a coordinator that colludes with sites can plant records (the n − 1 attack: a cell of ≥ floor records
of which all but one are the colluders' reveals the victim); only differential privacy bounds that.
"""

from __future__ import annotations

__all__ = ["run_guarantee", "DEVIATING", "HONEST", "ANY", "COLLUSION"]

DEVIATING = "a coordinator that deviates from the protocol, colluding with no site"
HONEST = "a coordinator that follows the protocol (honest-but-curious), not one that deviates"
ANY = "any coordinator, even one colluding with sites, for what the ε covers"
COLLUSION = (
    "A coordinator colluding with sites can plant records around a victim (the n − 1 attack): a cell of at "
    "least the floor's records of which all but one are the colluders' reveals the victim's record, and the "
    "sites cannot tell planted records from real ones. Only differential privacy (--epsilon) bounds what such "
    "a coalition learns."
)


def _site_reasons(guards: dict, floor: int) -> list:
    out = []
    for name, g in sorted(guards.items()):
        if not isinstance(g, dict):
            out.append(f"site {name} did not report its own conditions (an older securefed?)")
            continue
        if g.get("allow-plain"):
            out.append(f"site {name} allows plain uploads (allow-plain): a deviating coordinator could ask for them")
        if g.get("allow-paper-mode"):
            out.append(
                f"site {name} allows the paper's mode (allow-paper-mode): a deviating coordinator could ask for "
                "landmark updates at landmarks of its choosing, or rows that give the records back"
            )
        if int(g.get("cell-floor", 0)) < floor:
            out.append(f"site {name} accepts cells of {g.get('cell-floor')} records, below the plan's floor {floor}")
        if not g.get("require-audit", False):
            out.append(f"site {name} places its records without requiring the membership audit")
        if g.get("allow-audit-failure"):
            out.append(f"site {name} lets a failing membership audit be overridden (allow-audit-failure)")
    return out


def run_guarantee(plan, landmark_info: dict, guards: dict) -> dict:
    """The ``guarantee`` block of a run (module docstring)."""
    method = (landmark_info or {}).get("method")
    reasons: list = []
    if plan.nystrom == "rows":
        adversary = HONEST
        reasons.append(
            "the rows mode sends one row per record: with more landmarks than features the records themselves"
        )
    elif method == "billboard":
        adversary = ANY
        if plan.noise == "distributed":
            reasons.append(
                "noise distributed: the ε holds against the coordinator only while the secure sum holds and "
                "no more sites collude than the sites' dp-colluders allow"
            )
    elif method == "cells":
        adversary = DEVIATING
        if plan.aggregation != "secagg":
            reasons.append(
                f"{plan.aggregation} sums: the sites cannot verify the totals (only SecAgg+ sums come with "
                "a proof each site checks)"
            )
        reasons += _site_reasons(guards, int(plan.cell_floor))
        if reasons:
            adversary = HONEST
    else:  # FedDL landmarks
        adversary = ANY if plan.dp else HONEST
        if not plan.dp:
            reasons.append(
                "FedDL landmark updates without DP: computed at landmarks the coordinator chooses, which no "
                "site can check"
            )
    holds = adversary != HONEST  # (each record's coordinate, when sent, is outside it: the report names that release)
    return {
        "adversary": adversary,
        "holds_against_deviating_coordinator": bool(holds),
        "reasons": reasons,
        "collusion": COLLUSION,
    }
