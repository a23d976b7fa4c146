"""``securefed budget`` and the privacy options of ``securefed run``.

``securefed budget --noise-multiplier Z --releases R --delta D [--sample-rate Q] [--accountant A]``
prints the ε spent; ``securefed budget --epsilon E --releases R --delta D`` prints the noise multiplier
needed. Both print one JSON object
``{"epsilon", "delta", "noise_multiplier", "releases", "accountant", "epsilon_paper_bound"}``
where ``epsilon_paper_bound`` is ``papers/000`` Theorem 5's ε at the same noise multiplier.

"""

from __future__ import annotations

import argparse
import json

from ..errors import ConfigError, bad_value
from ..accounting.accountants import ACCOUNTANTS, calibrate_noise_multiplier, check_delta, epsilon_from_noise, paper_epsilon

__all__ = ["register", "budget_command", "budget_figures"]


def budget_figures(*, epsilon=None, noise_multiplier=None, releases, delta, sample_rate=1.0, accountant="exact") -> dict:
    """The JSON object ``securefed budget`` prints (one of ``epsilon`` / ``noise_multiplier`` given)."""
    if (epsilon is None) == (noise_multiplier is None):
        raise ConfigError(bad_value("--epsilon/--noise-multiplier", (epsilon, noise_multiplier), "give exactly one of them"))
    if noise_multiplier is None:
        z = calibrate_noise_multiplier(epsilon, delta, releases, accountant, sample_rate)
        eps = float(epsilon)
    else:
        z = float(noise_multiplier)
        eps = epsilon_from_noise(z, releases, delta, accountant, sample_rate)
    return {"epsilon": eps, "delta": float(delta), "noise_multiplier": z, "releases": int(releases),
            "accountant": accountant, "sample_rate": float(sample_rate),
            "epsilon_paper_bound": paper_epsilon(z, releases, delta)}


def budget_command(args) -> int:
    """Handler of ``securefed budget``: print the JSON figures, return 0."""
    out = budget_figures(epsilon=args.epsilon, noise_multiplier=args.noise_multiplier, releases=args.releases,
                         delta=args.delta, sample_rate=args.sample_rate, accountant=args.accountant)
    print(json.dumps(out))
    return 0


def register(subparsers) -> argparse.ArgumentParser:
    """Add the ``budget`` subcommand to the top-level parser's subparsers."""
    p = subparsers.add_parser("budget", help="privacy budget: ε from a noise multiplier, or the noise multiplier for a target ε",
                              description="Gaussian-mechanism accounting for R releases (papers/000 Theorem 5 vs exact).")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--noise-multiplier", type=float, help="σ/Δ; prints the ε spent")
    g.add_argument("--epsilon", type=float, help="target ε; prints the noise multiplier needed")
    p.add_argument("--releases", type=int, required=True, help="number of noisy releases per record (rounds × local steps)")
    p.add_argument("--delta", type=float, required=True, help="δ, e.g. 1e-5")
    p.add_argument("--sample-rate", type=float, default=1.0, help="Poisson sampling rate per step (needs prv or rdp below 1)")
    p.add_argument("--accountant", choices=ACCOUNTANTS, default="exact")
    p.set_defaults(func=budget_command)
    return p
