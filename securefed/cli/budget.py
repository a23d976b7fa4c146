"""``securefed budget``: the privacy budget of R Gaussian releases.

``securefed budget --noise-multiplier Z --releases R --delta D [--sample-rate Q] [--accountant A]``
prints the ε spent; ``securefed budget --epsilon E --releases R --delta D`` prints the noise multiplier
needed. Both print one JSON object
``{"epsilon", "delta", "noise_multiplier", "releases", "accountant", "sample_rate", "epsilon_paper_formula",
"paper_formula_below_true_epsilon"}`` where ``epsilon_paper_formula`` is what Qiao et al. Theorem 5's
formula gives at the same noise multiplier — **not a bound**: where it is below the accountant's ε,
``paper_formula_below_true_epsilon`` is ``true`` (e.g. z = 0.5, R = 1000: 762 against 2269).

"""

from __future__ import annotations

import argparse
import json

from ..accounting.accountants import ACCOUNTANTS
from ..accounting.budget import budget_figures

__all__ = ["register", "budget_command", "budget_figures"]


def budget_command(args) -> int:
    """Handler of ``securefed budget``: print the JSON figures, return 0."""
    out = budget_figures(
        epsilon=args.epsilon,
        noise_multiplier=args.noise_multiplier,
        releases=args.releases,
        delta=args.delta,
        sample_rate=args.sample_rate,
        accountant=args.accountant,
    )
    print(json.dumps(out))
    return 0


def register(subparsers) -> argparse.ArgumentParser:
    """Add the ``budget`` subcommand to the top-level parser's subparsers."""
    p = subparsers.add_parser(
        "budget",
        help="privacy budget: ε from a noise multiplier, or the noise multiplier for a target ε",
        description="Gaussian-mechanism accounting for R releases: the accountant's ε, and the paper's "
        "Theorem 5 formula beside it (a formula, not a bound).",
    )
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--noise-multiplier", type=float, help="σ/Δ; prints the ε spent")
    g.add_argument("--epsilon", type=float, help="target ε; prints the noise multiplier needed")
    p.add_argument(
        "--releases", type=int, required=True, help="number of noisy releases per record (rounds × local steps)"
    )
    p.add_argument("--delta", type=float, required=True, help="δ, e.g. 1e-5")
    p.add_argument(
        "--sample-rate", type=float, default=1.0, help="Poisson sampling rate per step (needs prv or rdp below 1)"
    )
    p.add_argument(
        "--accountant",
        choices=ACCOUNTANTS,
        default="exact",
        help="exact (μ-GDP), prv, rdp, or paper (the paper's recipe, floored by the exact ε so it stays a bound)",
    )
    p.set_defaults(func=budget_command)
    return p
