"""The DP billboard's accounting: one (ε, δ) split over its two or three Gaussian releases (μ-GDP), and their events.

The billboard (:mod:`securefed.landmarks.merf`) releases a random-feature mean embedding (release 1), the counts per
landmark (release 2) and optionally a density of every record on the landmark map (release 3). With
``μ = gdp_mu(ε, δ)`` for the whole run, release 1 gets ``μ₁ = μ√(1−ρ−ρ₃)``, release 2 ``μ₂ = μ√ρ`` (ρ =
``count_share``) and release 3 ``μ₃ = μ√ρ₃`` (ρ₃ = ``density_share``), so ``√(μ₁² + μ₂² + μ₃²) = μ`` (μ-GDP
composition; Dong, Roth & Su): release i carries Gaussian noise ``σ_i = Δ_i / μ_i``. The sensitivities ``Δ_i`` are
parameters (the billboard states them: :data:`~securefed.landmarks.merf.RFF_SENSITIVITY`,
:data:`~securefed.landmarks.merf.COUNT_SENSITIVITY`).

:func:`billboard_events` gives each release's :class:`~.events.ReleaseEvent` (with this site's share σ/√t under
distributed noise), which the site's ledger checks together before the first release and records one by one.
"""

from __future__ import annotations

import math

from ..errors import ConfigError, bad_value
from .accountants import gdp_epsilon, gdp_mu
from .events import ComposedEvent, ReleaseEvent, gaussian_release

__all__ = ["BILLBOARD_MECHANISMS", "billboard_noise", "billboard_events", "billboard_plan_event"]

BILLBOARD_MECHANISMS = ("gaussian-rff", "gaussian-counts", "gaussian-density")


def billboard_noise(
    epsilon: float,
    delta: float,
    count_share: float = 0.2,
    density_share: float = 0.0,
    *,
    sensitivities: tuple[float, float, float],
) -> dict:
    """σ₁, σ₂ (and σ₃ of the optional density release) for (ε, δ) over the whole run (module docstring):
    ``μ₁² = μ²(1 − count_share − density_share)``, ``μ₂² = μ²·count_share``, ``μ₃² = μ²·density_share``,
    ``σ_i = Δ_i/μ_i`` with ``sensitivities = (Δ₁, Δ₂, Δ₃)``."""
    if not 0.0 < count_share < 1.0:
        raise ConfigError(bad_value("count_share", count_share, "use a share of the budget in (0, 1), e.g. 0.2"))
    if not 0.0 <= density_share < 1.0 - count_share:
        raise ConfigError(
            bad_value(
                "density_share",
                density_share,
                f"use a share in [0, {1.0 - count_share:g}) (count-share {count_share:g} is spent already), e.g. 0.2",
            )
        )
    d1, d2, d3 = (float(v) for v in sensitivities)
    mu = gdp_mu(float(epsilon), float(delta))
    mu1 = mu * math.sqrt(1.0 - count_share - density_share)
    mu2, mu3 = mu * math.sqrt(count_share), mu * math.sqrt(density_share)
    return {
        "mu": mu,
        "mu1": mu1,
        "mu2": mu2,
        "mu3": mu3,
        "sigma1": d1 / mu1,
        "sigma2": d2 / mu2,
        "sigma3": d3 / mu3 if density_share else None,
        "epsilon": gdp_epsilon(float(delta), math.sqrt(mu1**2 + mu2**2 + mu3**2)),
        "delta": float(delta),
        "count_share": float(count_share),
        "density_share": float(density_share),
        "sensitivities": (d1, d2, d3),
    }


def billboard_events(noise: dict, *, t: int = 1) -> list[ReleaseEvent]:
    """The events of the billboard's releases (two, or three with the density) from :func:`billboard_noise`'s split:
    Gaussian noise σ_i on Δ_i, accounted at ``σ_i/Δ_i = 1/μ_i``; this site adds the share ``σ_i/√t`` (``t = 1``:
    local noise, the full σ_i)."""
    k = 3 if noise.get("sigma3") else 2
    sigmas = (noise["sigma1"], noise["sigma2"], noise["sigma3"])[:k]
    return [
        gaussian_release(
            BILLBOARD_MECHANISMS[i],
            sigma=s,
            sensitivity=noise["sensitivities"][i],
            share=s if t == 1 else s / math.sqrt(t),
        )
        for i, s in enumerate(sigmas)
    ]


def billboard_plan_event(noise: dict, *, t: int = 1) -> ComposedEvent:
    """All the billboard's releases of one site as one event (the budget check before the first release)."""
    return ComposedEvent(tuple(billboard_events(noise, t=t)))
