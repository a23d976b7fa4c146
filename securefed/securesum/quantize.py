"""Fixed-point encoding for masked sums: clip, weight, stochastic rounding, arithmetic modulo 2^k.

A client p with update ``u_p`` and public weight ``w_p ≥ 0`` sends the integer vector

    q_p = SR(w_p · clip(u_p, −c, c) · 2^f)  (mod 2^k)

where ``SR`` is stochastic rounding, ``SR(v) = ⌊v + U⌋`` with ``U ~ U[0, 1)`` drawn from an explicit
``numpy.random.Generator`` (a statistical, not a secret, choice): SR(v) = ⌊v⌋ + 1 with probability
v − ⌊v⌋, so E[SR(v)] = v up to the 2^−24 resolution of the float32 uniforms, and |SR(v) − v| < 1. Weights are **folded into the value after clipping and before
quantisation**, so the clip range c bounds the *unweighted* update (the meaningful, public quantity)
and the weighted mean is ``Σ_p w_p u_p / Σ_p w_p`` with the public weights.

Overflow is refused before the round starts, never wrapped: with A active clients (everyone who
starts the round — an upper bound on the survivors, which is the count Flower gets wrong) and
W = Σ_{p active} w_p, ``|Σ_p q_p| ≤ W·c·2^f + A`` must stay below ``2^(k−2)`` so the centred residue
mod 2^k decodes to the true integer sum (:func:`overflow_bound`) with one **guard bit** to spare: the SecAgg+
server refuses an unmasked sum outside ``±(W·c·2^f + A)`` (a client that masked with another seed than the
one it committed to leaves pseudorandom words, which land outside with probability ≥ 1/2 per coordinate). Values beyond ``±c`` are clipped,
counted and reported (a ``warnings.warn`` and the ``clipped`` field of the result).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np

from ..errors import ConfigError, DataError, OverflowRiskError, bad_value

__all__ = [
    "FixedPoint",
    "plan_fixed_point",
    "integer_plan",
    "integer_words",
    "overflow_bound",
    "quantize",
    "dequantize",
    "ClippingWarning",
    "check_random_state",
    "word_dtype",
]

MAX_FRACTIONAL_BITS = 40


class ClippingWarning(UserWarning):
    """Some update coordinates lay outside the clip range and were clipped (counted in the result)."""


def check_random_state(random_state) -> np.random.Generator:
    """None | int | Generator → Generator (scikit-learn convention; statistics only, never secrets)."""
    if isinstance(random_state, np.random.Generator):
        return random_state
    if random_state is None or isinstance(random_state, (int, np.integer)):
        return np.random.default_rng(random_state)
    raise ConfigError(bad_value("random_state", random_state, "pass None, an int or a numpy.random.Generator"))


def word_dtype(modulus_bits: int):
    """The unsigned numpy word that holds residues mod 2^k."""
    return np.uint32 if modulus_bits <= 32 else np.uint64


@dataclass(frozen=True)
class FixedPoint:
    """A checked fixed-point plan: clip range c, fractional bits f, modulus 2^k."""

    clip: float
    fractional_bits: int
    modulus_bits: int
    active_clients: int
    weight_total: float

    @property
    def scale(self) -> float:
        return float(2**self.fractional_bits)

    @property
    def dtype(self):
        return word_dtype(self.modulus_bits)

    @property
    def step(self) -> float:
        """Quantisation step 2^−f; each client's rounding error is below one step."""
        return 2.0**-self.fractional_bits

    def as_dict(self) -> dict:
        return dict(
            clip_range=self.clip,
            fractional_bits=self.fractional_bits,
            modulus_bits=self.modulus_bits,
            active_clients=self.active_clients,
            weight_total=self.weight_total,
            step=self.step,
            max_abs_error=self.active_clients * self.step,
        )


def overflow_bound(clip: float, fractional_bits: int, weight_total: float, active_clients: int) -> float:
    """Largest possible ``|Σ_p q_p|``: ``W·c·2^f + A`` (one extra unit per client from rounding up)."""
    return weight_total * clip * 2.0**fractional_bits + active_clients


def plan_fixed_point(
    clip_range: float, weights, *, modulus_bits: int = 32, fractional_bits: int | None = None
) -> FixedPoint:
    """Check (or choose) the fixed-point plan for the *active* clients' public ``weights``.

    ``fractional_bits=None`` picks the largest f ≤ 40 that cannot overflow. An explicit f, or a clip
    range / weight total too large for any f ≥ 0, raises :class:`OverflowRiskError`.
    """
    if clip_range is None or not np.isfinite(clip_range) or clip_range <= 0:
        raise ConfigError(
            bad_value(
                "clip_range", clip_range, "pass a positive public bound on |update| (e.g. the data's known value range)"
            )
        )
    if not isinstance(modulus_bits, (int, np.integer)) or not 16 <= modulus_bits <= 64:
        raise ConfigError(bad_value("modulus_bits", modulus_bits, "use an integer in [16, 64], e.g. 32 or 64"))
    w = np.asarray(weights, dtype=float)
    if w.ndim != 1 or w.size == 0 or not np.all(np.isfinite(w)) or np.any(w < 0):
        raise ConfigError(bad_value("weights", weights, "give one finite non-negative weight per active client"))
    n, wt = int(w.size), float(w.sum())
    limit = 2.0 ** (modulus_bits - 2) - 1  # one guard bit below the sign bit (range check of the unmasked sum)
    wmax = float(w.max()) if w.size else 0.0
    if fractional_bits is None:
        if overflow_bound(clip_range, 0, wt, n) > limit:
            raise OverflowRiskError(
                bad_value(
                    "clip_range",
                    clip_range,
                    f"{n} active clients with total weight {wt:g} can overflow a 2^{modulus_bits} modulus even without "
                    "fractional bits; lower clip_range or the weights, or raise modulus_bits (max 64)",
                )
            )
        f = 0
        while (
            f < MAX_FRACTIONAL_BITS
            and overflow_bound(clip_range, f + 1, wt, n) <= limit
            and wmax * clip_range * 2.0 ** (f + 1) < 2.0**52
        ):
            f += 1
    else:
        f = int(fractional_bits)
        if f < 0 or f > 52:
            raise ConfigError(bad_value("fractional_bits", fractional_bits, "use an integer in [0, 52] or None (auto)"))
        if overflow_bound(clip_range, f, wt, n) > limit:
            best = (
                plan_fixed_point(clip_range, w, modulus_bits=modulus_bits).fractional_bits
                if overflow_bound(clip_range, 0, wt, n) <= limit
                else None
            )
            raise OverflowRiskError(
                bad_value(
                    "fractional_bits",
                    fractional_bits,
                    f"{n} active clients × clip {clip_range:g} × total weight {wt:g} × 2^{f} can exceed 2^{modulus_bits - 2} "
                    "(one guard bit below the sign bit); "
                    + (f"use fractional_bits <= {best}" if best is not None else "lower clip_range")
                    + " or raise modulus_bits",
                )
            )
    return FixedPoint(float(clip_range), f, int(modulus_bits), n, wt)


def integer_plan(modulus_bits: int, active_clients: int) -> FixedPoint:
    """The "plan" of a secure sum whose inputs are already integers mod ``2^k`` (no codec: no clip range, no
    fractional bits, weight 1 per client — a weight is folded in by the input mechanism before it encodes)."""
    if (
        isinstance(modulus_bits, bool)
        or not isinstance(modulus_bits, (int, np.integer))
        or not 16 <= modulus_bits <= 64
    ):
        raise ConfigError(
            bad_value(
                "modulus_bits",
                modulus_bits,
                "use an integer in [16, 64] (SecAgg+ words are "
                "uint32 or uint64); a mechanism needing fewer bits is summed in 16",
            )
        )
    return FixedPoint(0.0, 0, int(modulus_bits), int(active_clients), float(active_clients))


def integer_words(update, fp: FixedPoint) -> np.ndarray:
    """An integer input vector as words mod ``2^k`` (refused unless every value is an integer in ``[0, 2^k)``)."""
    x = np.asarray(update).ravel()
    if x.dtype.kind not in "ui":
        raise DataError(
            bad_value(
                "update.dtype",
                x.dtype,
                "an integer secure sum takes unsigned integers mod 2^k "
                "(e.g. DistributedDiscreteGaussian.encode's output), not floats",
            )
        )
    if x.size and (x.min() < 0 or int(x.max()) >= (1 << fp.modulus_bits)):
        raise DataError(
            bad_value(
                "update",
                f"values in [{int(x.min())}, {int(x.max())}]",
                f"reduce the input mod 2^{fp.modulus_bits} before the secure sum",
            )
        )
    return x.astype(fp.dtype)


def quantize(update, weight: float, fp: FixedPoint, rng: np.random.Generator) -> tuple[np.ndarray, int]:
    """Clip, weight and stochastically round one update to residues mod 2^k.

    Returns ``(q, n_clipped)`` with ``q`` a flat array of ``fp.dtype`` words (two's complement mod 2^k).
    """
    x = np.asarray(update, dtype=np.float64).ravel()
    if not np.all(np.isfinite(x)):
        raise DataError(bad_value("update", "non-finite values", "updates must be finite (no NaN or inf)"))
    n_clipped = 0
    if x.size and (x.max() > fp.clip or x.min() < -fp.clip):
        n_clipped = int(np.count_nonzero(np.abs(x) > fp.clip))
        x = np.clip(x, -fp.clip, fp.clip)
    # SR(v) = ⌊v + U⌋: P(round up) = frac(v). U is float32 (a multiple of 2^-24), so the rounding bias
    # is below 2^-24 of a step; the overflow check guarantees |v| + 1 < 2^(k-1), so the cast is exact.
    v = x * (float(weight) * fp.scale)
    v += rng.random(v.size, dtype=np.float32)
    np.floor(v, out=v)
    if fp.modulus_bits <= 32:
        words = v.astype(np.int32).view(np.uint32)
    else:
        words = v.astype(np.int64).view(np.uint64)
    if fp.modulus_bits not in (32, 64):
        words &= fp.dtype((1 << fp.modulus_bits) - 1)
    return words, n_clipped


def dequantize(words: np.ndarray, fp: FixedPoint) -> np.ndarray:
    """Centred residue of ``words`` mod 2^k divided by 2^f (float64)."""
    k = fp.modulus_bits
    if k == 64:
        signed = words.view(np.int64)
    elif k == 32:
        signed = words.view(np.int32)
    else:
        w = (words & fp.dtype((1 << k) - 1)).astype(np.int64)
        signed = np.where(w >= (1 << (k - 1)), w - (1 << k), w)
    return signed.astype(np.float64) / fp.scale


def warn_clipped(n_clipped: int, clip: float, where: str) -> None:
    """Never clip silently: one warning per aggregation that clipped anything."""
    if n_clipped:
        warnings.warn(
            f"{where}: {n_clipped} update coordinates exceeded clip_range={clip:g} and were clipped "
            "(counted in AggregateResult.clipped)",
            ClippingWarning,
            stacklevel=3,
        )
