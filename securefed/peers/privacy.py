"""Privacy accounting of the noisy dSNE releases (Saha et al. 2023, §2 and §5).

The F-dSNE paper tracks its AdaCliP releases with the moments accountant (Abadi et al. 2016);
securefed uses its successor, the Rényi-DP accountant of Opacus (Mironov 2017), for full-batch
(``q = 1``) Gaussian releases, through ``securefed.accounting`` (``get_accountant``); the noisy
releases are written to its ``PrivacyLedger`` by :class:`~securefed.peers.FedDSNE` when one is given.
"""

from __future__ import annotations

import warnings

import numpy as np

from ..errors import ConfigError, bad_value

__all__ = ["record_sensitivity", "calibrate_noise_multiplier"]


def record_sensitivity(n_rows: int) -> float:
    """L2 sensitivity of one clipped AdaCliP release when one site record is replaced.

    Every row of the transformed matrix is clipped to norm 1 (Algorithm 3 of Saha et al. 2023).
    One local record enters the site's affinities ``P`` (Eq. 1 normalises over all points) and its
    own embedding attracts/repels every reference point (Eq. 4), so it can change **every** row:
    ``‖W̃(D) − W̃(D')‖_F ≤ Σ_i 2 … = 2 √N_s`` (N_s = number of released rows).
    """
    return 2.0 * float(np.sqrt(n_rows))


def _epsilon(noise_multiplier: float, releases: int, delta: float, accountant: str = "rdp") -> float:
    """ε of ``releases`` full-batch Gaussian releases with noise multiplier ``z = σ/Δ``.

    Delegates to ``securefed.accounting.get_accountant(accountant)`` (default ``"rdp"``: Opacus'
    RDP accountant; ``"exact"`` is the tight μ-GDP composition for full participation).
    Returns 0 for no release and ``inf`` for ``z = 0``.
    """
    if releases <= 0:
        return 0.0
    if noise_multiplier <= 0:
        return float("inf")
    from ..accounting import get_accountant

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # Opacus' "optimal order at the grid's end"
        return float(get_accountant(accountant).epsilon(float(noise_multiplier), int(releases), float(delta)))


def calibrate_noise_multiplier(epsilon: float, releases: int, delta: float, accountant: str = "rdp") -> float:
    """Smallest noise multiplier ``z`` with ``_epsilon(z, releases, delta) ≤ epsilon``.

    Delegates to ``securefed.accounting.calibrate_noise_multiplier``.

    Raises
    ------
    ConfigError
        For a non-positive ε or δ outside (0, 1).
    """
    if not (np.isfinite(epsilon) and epsilon > 0):
        raise ConfigError(bad_value("epsilon", epsilon, "use a positive number, e.g. 1.0"))
    if not (0 < delta < 1):
        raise ConfigError(bad_value("delta", delta, "use a value in (0, 1), e.g. 1e-5"))
    from ..accounting import calibrate_noise_multiplier as _calibrate

    return float(_calibrate(float(epsilon), float(delta), int(releases), accountant=accountant))
