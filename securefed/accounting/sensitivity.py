"""Sensitivity of one site's FedDL gradient to one record (Qiao et al. Theorem 5, docs/maths.md).

Derivation (rows = points)
--------------------------
With ``K_xy = K(X_p, Y)`` the gradient of ``f_p(Y) = MMD(X_p, Y)`` is (Qiao et al. Eq. 13)::

    ∇ = −4γ/(n n_y) · (K_xyᵀ X_p − diag(K_xyᵀ 1) Y)  +  (terms in Y only)

Row ``i`` of the data term is ``−4γ/(n n_y) · Σ_j φ(x_j − y_i)`` with ``φ(v) = e^{−γ‖v‖²} v``. So the
data term is ``−4γ/(n n_y) · Σ_j T(x_j)`` where ``T(x)`` is the ``n_y × m`` matrix with rows
``φ(x − y_i)``; the ``Y``-only term does not depend on any record. ``n`` is the normaliser (``n_p``,
or the fixed expected batch size under subsampling), which does not change between neighbours.

*Replace one record* ``x → x'`` (bounded DP, the adjacency of Theorem 5)::

    ‖Δ∇‖_F = 4γ/(n n_y) · ‖T(x) − T(x')‖_F = 4γ/(n n_y) · ( Σ_i ‖φ(x − y_i) − φ(x' − y_i)‖² )^{1/2}

Three valid per-row bounds of ``‖φ(x − y_i) − φ(x' − y_i)‖``:

1. **kernel shape** — ``‖φ(v)‖ = ‖v‖ e^{−γ‖v‖²} ≤ h(Υ) := max_{0≤d≤Υ} d e^{−γd²}``, maximised at
   ``d* = min(Υ, 1/√(2γ))``; by the triangle inequality the row changes by at most ``2h(Υ)``, hence
   ``Δ_shape = 2 · 4γ√n_y/(n n_y) · h(Υ)`` (docs/maths.md). It is attained (``Y = 0``, ``x = −x'`` with
   ``‖x‖ = d*``) whenever ``d* ≤ τ_X``, so it cannot be improved in general.
2. **Lipschitz** — the Jacobian of ``φ`` is ``e^{−γ‖v‖²}(I − 2γ v vᵀ)`` with eigenvalues ``e^{−t}`` and
   ``(1 − 2t)e^{−t}`` (``t = γ‖v‖² ≥ 0``), all in ``[−2e^{−3/2}, 1]``; so ``φ`` is 1-Lipschitz and the
   row changes by at most ``‖x − x'‖ ≤ 2τ_X``: ``Δ_lip = 8γ√n_y τ_X/(n n_y)``.
3. **Theorem 5 of Qiao et al.** — ``Δ_T5 = 8√n_y γ τ_X/(n n_y) · (1 + 2γ(τ_X + τ_Y)(τ_X + Υ))``.
   It is ``Δ_lip`` times a factor ``≥ 1`` (the paper bounds the Lipschitz constant of ``φ`` by
   ``1 + 2γ(τ_X+τ_Y)(τ_X+Υ)`` instead of 1), so it is **valid but never tighter** than ``Δ_lip``.

Both formulas of docs/maths.md §8 are therefore correct upper bounds; securefed adds the
Lipschitz bound, which the paper's own proof route implies, and uses ``min(Δ_lip, Δ_shape)``
(``≤ Δ_T5`` always). ``Υ`` never exceeds ``τ_X + τ_Y`` once the bounds are enforced
(``‖y_i‖ ≤ ‖Y‖₂ ≤ τ_Y``; ``‖x‖ ≤ τ_X``), so a larger ``upsilon`` is reduced to ``τ_X + τ_Y``.

*Add/remove one record* (Poisson-subsampled steps, the adjacency Opacus' accountants assume) with
the fixed normaliser: ``‖Δ∇‖_F = 4γ/(n n_y) · ‖T(x)‖_F ≤ 4γ√n_y/(n n_y) · h(Υ)`` = ``Δ_shape / 2``.
The Lipschitz argument does not apply there (there is no partner record). The normaliser ``n`` must be
a **public** number that is the same on both neighbours — the announced site size times ``q``
(``GradientPerturbation.batch``), never ``q·len(X)``, which changes when a record is added.

Where ``Y`` may be (``y_domain``)
---------------------------------
The kernel-shape bound with ``h(Υ)`` needs ``‖x − y_i‖ ≤ Υ`` at the moment the gradient is computed, i.e.
``Y`` projected onto the τ_Y ball before **every** release. The FedDL code path that skipped the
projection between server steps (gradient rule, ``Q ≥ 2``) measured 1.66–1.75 × Δ (issue 14). Two
bounds do not need the projection at all:

* the Lipschitz bound (``φ`` is 1-Lipschitz on all of ``R^m``), and
* the kernel-shape bound with ``h(∞) = max_{d ≥ 0} d e^{−γd²} = e^{−1/2}/√(2γ)``.

``y_domain="any"`` (the default, and what :class:`~securefed.accounting.GradientPerturbation` uses) takes
only those, so Δ holds at **any** ``Y`` — also one a buggy caller forgot to project or a malicious server
chose. It costs nothing unless ``γ < 1/(2Υ²)`` (a kernel wider than the whole data-plus-landmark ball),
where ``h(∞) > h(Υ)``. ``y_domain="ball"`` gives the tighter ``h(Υ)`` and is valid only if the caller
projects ``Y`` before every release.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..errors import ConfigError, bad_value

__all__ = [
    "Sensitivity",
    "gradient_sensitivity",
    "theorem5_sensitivity",
    "kernel_shape_sensitivity",
    "lipschitz_sensitivity",
    "kernel_shape_peak",
    "data_sensitivity",
    "SENSITIVITY_RULES",
]

SENSITIVITY_RULES = ("min", "theorem5", "kernel_shape", "lipschitz")


@dataclass(frozen=True)
class Sensitivity:
    """ℓ₂ (Frobenius) sensitivity of one site's gradient, with every bound that was computed.

    Attributes
    ----------
    value : float
        The Δ used for calibration.
    rule : str
        Which bound ``value`` is: ``"theorem5"``, ``"kernel_shape"``, ``"lipschitz"`` or
        ``"kernel_shape_add_remove"``.
    theorem5 : float
        Qiao et al. Theorem 5 (replace-one).
    kernel_shape : float
        ``2 · 4γ√n_y/(n n_y) · h(Υ)`` (replace-one).
    lipschitz : float
        ``8γ√n_y τ_X/(n n_y)`` (replace-one; ``φ`` is 1-Lipschitz).
    adjacency : str
        ``"replace"`` or ``"add_remove"``.
    upsilon : float
        The ``Υ`` the kernel-shape bound used (after reduction to ``τ_X + τ_Y``); ``inf`` with ``y_domain="any"``.
    y_domain : str
        ``"any"`` (Δ holds at every ``Y``) or ``"ball"`` (only at ``Y`` projected onto the τ_Y ball).
    """

    value: float
    rule: str
    theorem5: float
    kernel_shape: float
    lipschitz: float = math.inf
    adjacency: str = "replace"
    upsilon: float = math.inf
    y_domain: str = "any"


def _pos(name: str, v, *, allow_zero: bool = False) -> float:
    try:
        f = float(v)
    except (TypeError, ValueError):
        raise ConfigError(bad_value(name, v, "give a positive finite number")) from None
    if not math.isfinite(f) or f < 0 or (f == 0 and not allow_zero):
        raise ConfigError(bad_value(name, v, "give a positive finite number"))
    return f


def kernel_shape_peak(gamma: float, upsilon: float = math.inf) -> float:
    """``h(Υ) = max_{0≤d≤Υ} d·e^{−γd²}``, attained at ``d = min(Υ, 1/√(2γ))`` (docs/maths.md).

    ``upsilon=math.inf`` (default) gives the global maximum ``e^{−1/2}/√(2γ)``, valid for any ``Y``.
    """
    gamma = _pos("gamma", gamma)
    if not (isinstance(upsilon, (int, float)) and upsilon == math.inf):
        upsilon = _pos("upsilon", upsilon, allow_zero=True)
    d = min(upsilon, 1.0 / math.sqrt(2.0 * gamma))
    return d * math.exp(-gamma * d * d)


def theorem5_sensitivity(n_records, n_landmarks, gamma, tau_x, tau_y, upsilon) -> float:
    """Theorem 5 of Qiao et al.: ``Δ = 8√n_y γ τ_X/(n_p n_y) · (1 + 2γ(τ_X + τ_Y)(τ_X + Υ))``."""
    n, ny = float(n_records), float(n_landmarks)
    return 8.0 * math.sqrt(ny) * gamma * tau_x / (n * ny) * (1.0 + 2.0 * gamma * (tau_x + tau_y) * (tau_x + upsilon))


def kernel_shape_sensitivity(n_records, n_landmarks, gamma, upsilon, *, adjacency="replace") -> float:
    """Kernel-shape bound ``2 · 4γ√n_y/(n n_y) · h(Υ)`` (replace-one) or half of it (add/remove)."""
    n, ny = float(n_records), float(n_landmarks)
    one = 4.0 * gamma * math.sqrt(ny) / (n * ny) * kernel_shape_peak(gamma, upsilon)
    return 2.0 * one if adjacency == "replace" else one


def lipschitz_sensitivity(n_records, n_landmarks, gamma, tau_x) -> float:
    """Replace-one bound from the 1-Lipschitz ``φ(v) = e^{−γ‖v‖²} v``: ``8γ√n_y τ_X/(n n_y)``."""
    n, ny = float(n_records), float(n_landmarks)
    return 8.0 * gamma * math.sqrt(ny) * tau_x / (n * ny)


def gradient_sensitivity(
    n_records,
    n_landmarks,
    gamma,
    tau_x,
    tau_y,
    upsilon=None,
    rule: str = "min",
    *,
    adjacency: str = "replace",
    y_domain: str = "any",
) -> Sensitivity:
    """Frobenius sensitivity Δ of one site's MMD gradient (Qiao et al. Eq. 13, Theorem 5).

    See the module docstring for the derivation.

    Parameters
    ----------
    n_records : float
        The gradient's normaliser ``n_p`` (or the expected batch size under subsampling), ``> 0``.
    n_landmarks : int
        ``n_y ≥ 1``.
    gamma : float
        Kernel bandwidth ``γ > 0``.
    tau_x : float
        Enforced bound on record norms (records clipped to it).
    tau_y : float
        Enforced spectral-norm bound of ``Y`` (``Y`` projected onto it).
    upsilon : float, optional
        Bound on ``‖y_i − x_j‖`` (only with ``y_domain="ball"``); ``None`` or anything above ``τ_X + τ_Y``
        means ``τ_X + τ_Y`` (implied by the two enforced bounds). A smaller value is only valid if the
        caller enforces it.
    rule : {"min", "theorem5", "kernel_shape", "lipschitz"}
        Which bound to use; ``"min"`` takes the smallest valid one.
    adjacency : {"replace", "add_remove"}
        Replace-one (full-batch steps) or add/remove-one (Poisson-subsampled steps); add/remove has
        only the kernel-shape bound ``Δ_shape/2``.
    y_domain : {"any", "ball"}
        ``"any"`` (default): Δ holds at every ``Y`` (Lipschitz and ``h(∞)``; module docstring). ``"ball"``:
        the kernel-shape bound uses ``h(Υ)``, valid only when ``Y`` is projected onto the τ_Y ball before
        every release.

    Returns
    -------
    Sensitivity
    """
    n = _pos("n_records", n_records)
    if isinstance(n_landmarks, bool) or int(n_landmarks) != n_landmarks or int(n_landmarks) < 1:
        raise ConfigError(bad_value("n_landmarks", n_landmarks, "use a positive integer"))
    ny = int(n_landmarks)
    gamma = _pos("gamma", gamma)
    tau_x = _pos("tau_x", tau_x)
    tau_y = _pos("tau_y", tau_y)
    if y_domain not in ("any", "ball"):
        raise ConfigError(
            bad_value(
                "y_domain", y_domain, "use 'any' (Δ valid at every Y) or 'ball' (Y projected before every release)"
            )
        )
    cap = tau_x + tau_y
    if y_domain == "any" and upsilon is not None:
        raise ConfigError(
            bad_value(
                "upsilon",
                upsilon,
                "a bound on ‖y − x‖ is used only with y_domain='ball' (Y projected "
                "before every release); drop it, or pass y_domain='ball'",
            )
        )
    ups = cap if upsilon is None else min(_pos("upsilon", upsilon), cap)
    if rule not in SENSITIVITY_RULES:
        raise ConfigError(bad_value("rule", rule, f"use one of {', '.join(SENSITIVITY_RULES)}"))
    if adjacency not in ("replace", "add_remove"):
        raise ConfigError(bad_value("adjacency", adjacency, "use 'replace' or 'add_remove'"))
    t5 = theorem5_sensitivity(n, ny, gamma, tau_x, tau_y, ups)  # ≥ Δ_lip, which holds at every Y
    ks_ups = math.inf if y_domain == "any" else ups
    ks = kernel_shape_sensitivity(n, ny, gamma, ks_ups)
    lip = lipschitz_sensitivity(n, ny, gamma, tau_x)
    if adjacency == "add_remove":
        if rule not in ("min", "kernel_shape"):
            raise ConfigError(
                bad_value("rule", rule, "with add/remove adjacency (subsampling) only 'min' or 'kernel_shape' apply")
            )
        return Sensitivity(ks / 2.0, "kernel_shape_add_remove", t5, ks, lip, adjacency, ks_ups, y_domain)
    cands = {"theorem5": t5, "kernel_shape": ks, "lipschitz": lip}
    if rule == "min":
        chosen = min(("lipschitz", "kernel_shape", "theorem5"), key=lambda k: cands[k])
    else:
        chosen = rule
    return Sensitivity(cands[chosen], chosen, t5, ks, lip, adjacency, ks_ups, y_domain)


def data_sensitivity(tau_x) -> float:
    """ℓ₂ sensitivity of releasing one (clipped) record, replace-one: ``‖x − x'‖ ≤ 2τ_X`` (Theorem 3)."""
    return 2.0 * _pos("tau_x", tau_x)
