"""The figures ``securefed budget`` prints: the accountant's ε (or the noise multiplier for a target ε) and
Qiao et al. Theorem 5's formula beside it — a formula, not a bound.

Kept in :mod:`securefed.accounting` (not in the CLI layer) so that every command line that prints budget
figures calls this one function.
"""

from __future__ import annotations

from ..errors import ConfigError, bad_value
from .accountants import calibrate_noise_multiplier, epsilon_from_noise, paper_epsilon

__all__ = ["budget_figures"]


def budget_figures(
    *, epsilon=None, noise_multiplier=None, releases, delta, sample_rate=1.0, accountant="exact"
) -> dict:
    """The JSON object ``securefed budget`` prints (one of ``epsilon`` / ``noise_multiplier`` given).

    Keys: ``epsilon`` (the accountant's ε; with ``--epsilon``, the target), ``delta``, ``noise_multiplier``,
    ``releases``, ``accountant``, ``sample_rate``, ``epsilon_paper_formula`` (Qiao et al. Theorem 5's
    formula at this noise multiplier — not a bound) and ``paper_formula_below_true_epsilon`` (True where the
    formula is below the accountant's ε at that noise multiplier, e.g. z = 0.5, R = 1000: 762 < 2269).
    """
    if (epsilon is None) == (noise_multiplier is None):
        raise ConfigError(
            bad_value("--epsilon/--noise-multiplier", (epsilon, noise_multiplier), "give exactly one of them")
        )
    if noise_multiplier is None:
        z = calibrate_noise_multiplier(epsilon, delta, releases, accountant, sample_rate)
        eps = float(epsilon)
    else:
        z = float(noise_multiplier)
        eps = epsilon_from_noise(z, releases, delta, accountant, sample_rate)
    paper = paper_epsilon(z, releases, delta)
    if noise_multiplier is None:  # the figure at the calibrated z, not the target
        eps_at_z = epsilon_from_noise(z, releases, delta, accountant, sample_rate)
    else:
        eps_at_z = eps
    return {
        "epsilon": eps,
        "delta": float(delta),
        "noise_multiplier": z,
        "releases": int(releases),
        "accountant": accountant,
        "sample_rate": float(sample_rate),
        "epsilon_paper_formula": paper,
        "paper_formula_below_true_epsilon": bool(paper < eps_at_z),
    }
