"""``securefed budget`` and the privacy options of ``securefed run``.

``securefed budget --noise-multiplier Z --releases R --delta D [--sample-rate Q] [--accountant A]``
prints the ε spent; ``securefed budget --epsilon E --releases R --delta D`` prints the noise multiplier
needed. Both print one JSON object
``{"epsilon", "delta", "noise_multiplier", "releases", "accountant", "sample_rate", "epsilon_paper_formula",
"paper_formula_below_true_epsilon"}`` where ``epsilon_paper_formula`` is what ``papers/000`` Theorem 5's
formula gives at the same noise multiplier — **not a bound**: where it is below the accountant's ε,
``paper_formula_below_true_epsilon`` is ``true`` (e.g. z = 0.5, R = 1000: 762 against 2269).

For ``securefed run``: :func:`add_privacy_arguments` adds the options and :func:`privacy_from_args`
builds the :class:`~securefed.accounting.GradientPerturbation` (or ``None`` without DP)::

    add_privacy_arguments(run_parser)
    privacy = privacy_from_args(args, ledger_path=os.path.join(out, "ledger.jsonl"), run_id=run_id, random_state=seed)
"""

from __future__ import annotations

import argparse
import json
import math

from ..errors import ConfigError, bad_value
from .accountants import ACCOUNTANTS, check_delta
from .budget import budget_figures

__all__ = ["register", "budget_command", "add_privacy_arguments", "privacy_from_args", "budget_figures"]


def budget_command(args) -> int:
    """Handler of ``securefed budget``: print the JSON figures, return 0."""
    out = budget_figures(epsilon=args.epsilon, noise_multiplier=args.noise_multiplier, releases=args.releases,
                         delta=args.delta, sample_rate=args.sample_rate, accountant=args.accountant)
    print(json.dumps(out))
    return 0


def register(subparsers) -> argparse.ArgumentParser:
    """Add the ``budget`` subcommand to the top-level parser's subparsers."""
    p = subparsers.add_parser("budget", help="privacy budget: ε from a noise multiplier, or the noise multiplier for a target ε",
                              description="Gaussian-mechanism accounting for R releases: the accountant's ε, and the paper's "
                                          "Theorem 5 formula beside it (a formula, not a bound).")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--noise-multiplier", type=float, help="σ/Δ; prints the ε spent")
    g.add_argument("--epsilon", type=float, help="target ε; prints the noise multiplier needed")
    p.add_argument("--releases", type=int, required=True, help="number of noisy releases per record (rounds × local steps)")
    p.add_argument("--delta", type=float, required=True, help="δ, e.g. 1e-5")
    p.add_argument("--sample-rate", type=float, default=1.0, help="Poisson sampling rate per step (needs prv or rdp below 1)")
    p.add_argument("--accountant", choices=ACCOUNTANTS, default="exact",
                   help="exact (μ-GDP), prv, rdp, or paper (the paper's recipe, floored by the exact ε so it stays a bound)")
    p.set_defaults(func=budget_command)
    return p


def add_privacy_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``--epsilon --delta --accountant --noise --clip-norm --noise-multiplier --sample-rate
    --secure-noise --insecure-noise-seed-for-testing --min-survivors --sensitivity-rule`` to a ``securefed run`` parser.

    The noise is secret (CSPRNG) by default; ``--secure-noise`` is kept as a no-op for old command lines.
    ``--insecure-noise-seed-for-testing SEED`` makes it reproducible **and void** (anyone who knows the seed
    can subtract it; the report says so). The run's ``--seed`` never seeds DP noise."""
    g = parser.add_argument_group("differential privacy (papers/000 §5.2; off unless --epsilon or --noise-multiplier)")
    g.add_argument("--epsilon", type=float, default=None, help="target ε per record over the whole run ('inf' = no DP)")
    g.add_argument("--delta", type=float, default=1e-5, help="target δ (default 1e-5)")
    g.add_argument("--accountant", choices=ACCOUNTANTS, default="exact",
                   help="exact (μ-GDP), prv, rdp or paper (Theorem 5's recipe, floored by the exact ε)")
    g.add_argument("--noise", choices=("local", "distributed"), default="local",
                   help="local: full σ per site and step; distributed: σ²/t shares under secure aggregation")
    g.add_argument("--clip-norm", type=float, default=None, help="public bound τ_X on record norms (required with DP)")
    g.add_argument("--noise-multiplier", type=float, default=None, help="σ/Δ instead of a target ε")
    g.add_argument("--sample-rate", type=float, default=1.0, help="Poisson sampling rate per local step")
    g.add_argument("--secure-noise", action="store_true",
                   help="kept for old command lines: DP noise is always from the CSPRNG (os.urandom + ChaCha20) unless "
                        "--insecure-noise-seed-for-testing is given")
    g.add_argument("--insecure-noise-seed-for-testing", type=int, default=None, metavar="SEED",
                   help="TESTS ONLY: reproducible DP noise from SEED; anyone who knows it can subtract the noise, so the "
                        "report marks the ε void")
    g.add_argument("--min-survivors", type=int, default=None, help="distributed noise: the secure aggregator's threshold t")
    g.add_argument("--sensitivity-rule", choices=("min", "theorem5", "kernel_shape", "lipschitz"), default="min",
                   help="Δ used: min of the valid bounds (default) or the paper's Theorem 5")


def privacy_from_args(args, ledger_path, run_id, random_state):
    """Build the :class:`GradientPerturbation` for ``securefed run`` (``None`` when DP is off).

    DP is on when ``--epsilon`` (finite) or ``--noise-multiplier`` is given. The ledger is created
    (or resumed) at ``ledger_path`` with budget ``--epsilon``. ``random_state`` (the run seed) seeds only
    the subsampling; the noise is secret unless ``--insecure-noise-seed-for-testing`` is given.
    """
    from .bounds import default_tau_x
    from .ledger import PrivacyLedger
    from .mechanisms import GradientPerturbation

    eps = getattr(args, "epsilon", None)
    z = getattr(args, "noise_multiplier", None)
    if eps is not None and math.isinf(eps) and eps > 0:
        eps = None
        if z is None:
            return None
    if eps is None and z is None:
        return None
    if eps is not None and z is not None:
        raise ConfigError(bad_value("--noise-multiplier", z, "give --epsilon or --noise-multiplier, not both"))
    delta = check_delta(args.delta)
    if getattr(args, "secure_noise", False) and getattr(args, "insecure_noise_seed_for_testing", None) is not None:
        raise ConfigError(bad_value("--insecure-noise-seed-for-testing", args.insecure_noise_seed_for_testing,
                                    "contradicts --secure-noise; drop one of them"))
    if getattr(args, "clip_norm", None) is None:
        raise ConfigError(bad_value("--clip-norm", None, "differential privacy needs a public bound on record norms, e.g. "
                                    "--clip-norm 10 (for pixels in [0,1] with m features, √m always holds)"))
    tau_x = default_tau_x(1, tau_x=args.clip_norm)
    ledger = PrivacyLedger(ledger_path, run_id, budget_epsilon=eps, delta=delta, accountant=args.accountant)
    return GradientPerturbation(epsilon=eps, delta=delta, noise_multiplier=z, accountant=args.accountant, noise=args.noise,
                                tau_x=tau_x, sample_rate=args.sample_rate, ledger=ledger,
                                random_state=random_state, sensitivity_rule=getattr(args, "sensitivity_rule", "min"),
                                min_survivors=getattr(args, "min_survivors", None),
                                insecure_noise_seed_for_testing=getattr(args, "insecure_noise_seed_for_testing", None))
