"""Against whom the verdict holds: the run's ``guarantee`` (``result.json``), or the conservative reading when the
run does not record one.

A run's ``result.json`` may carry a top-level ``"guarantee"`` written by the code that drove it::

    {"adversary": "a coordinator that deviates from the protocol, colluding with no site",
     "holds_against_deviating_coordinator": true,
     "reasons": ["why not, one per item", ...],          # empty when it holds
     "collusion": "what a coordinator colluding with a site can still do, and that only DP stops it"}

:func:`run_guarantee` is the one place the report reads it. When the key is absent (runs written before the sites
checked the coordinator's requests themselves) the report says only what holds without such checks: the verdict
holds against a coordinator that **follows** the protocol (honest-but-curious), not against one that deviates.
"""

from __future__ import annotations

__all__ = ["FALLBACK_ADVERSARY", "run_guarantee", "verdict_scope"]

#: the adversary a verdict holds against when the run records no guarantee
FALLBACK_ADVERSARY = "a coordinator that follows the protocol (honest-but-curious)"

#: what a deviating coordinator could do unnoticed, per landmark method (the fallback's example)
_DEVIATIONS = {
    "cells": "apply the cell floor to fewer records than it announces",
    "billboard": "send one site other scale bounds than the others and read that site's noisy upload alone",
    "feddl": "ask one site for its update again without the others and read it alone",
}
_FALLBACK_COLLUSION = (
    "a coordinator colluding with a site also sees that site's records and can set them against the shared landmarks "
    "and sums; only differential privacy (--epsilon) bounds what the two learn about any one record of another site"
)


def run_guarantee(result: dict | None) -> dict:
    """The run's guarantee (``result["guarantee"]``, every field checked), or the conservative fallback.

    Returns ``{"adversary", "holds_against_deviating_coordinator", "reasons", "collusion", "source"}`` with
    ``source`` ``"run"`` (read from result.json) or ``"fallback"`` (not recorded: honest-but-curious only).
    """
    g = (result or {}).get("guarantee") if isinstance(result, dict) else None
    if (
        isinstance(g, dict)
        and isinstance(g.get("adversary"), str)
        and g["adversary"].strip()
        and isinstance(g.get("holds_against_deviating_coordinator"), bool)
    ):
        reasons = g.get("reasons")
        return {
            "adversary": g["adversary"].strip(),
            "holds_against_deviating_coordinator": g["holds_against_deviating_coordinator"],
            "reasons": [str(r) for r in reasons] if isinstance(reasons, list) else [],
            "collusion": str(g.get("collusion") or _FALLBACK_COLLUSION),
            "source": "run",
        }
    method = ((result or {}).get("options") or {}).get("landmark_method") if isinstance(result, dict) else None
    example = _DEVIATIONS.get(method, "ask different sites different questions")
    reason = (
        f"the sites do not check what the coordinator asks of them in this run: one that deviates could, for "
        f"instance, {example}, and no site would notice (docs/threat-model.md)"
    )
    return {
        "adversary": FALLBACK_ADVERSARY,
        "holds_against_deviating_coordinator": False,
        "reasons": [reason],
        "collusion": _FALLBACK_COLLUSION,
        "source": "fallback",
    }


def verdict_scope(guarantee: dict) -> str:
    """The words after "PASS": ``"against <adversary>"``, and ``"not against one that deviates"`` when it does not
    hold against a deviating coordinator and the adversary's own words do not say so already."""
    adv = guarantee["adversary"]
    if guarantee["holds_against_deviating_coordinator"] or "deviat" in adv:
        return f"against {adv}"
    return f"against {adv}, not against one that deviates"
