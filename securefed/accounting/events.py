"""One model of a release for all of accounting: frozen events that every mechanism produces and every accountant
composes (in the manner of Google dp-accounting's ``DpEvent`` tree with ``supports()`` then ``compose()``).

A :class:`ReleaseEvent` says what one release (or ``count`` identical ones) of a site cost, in the five numbers the
accounting needs and nothing else:

* ``mechanism`` — what was released (:data:`MECHANISMS`: FedDL's ``gaussian-gradient``, the billboard's
  ``gaussian-rff`` / ``gaussian-counts`` / ``gaussian-density``, the rows' ``gaussian-data``, and the integer
  distributed mechanisms ``distributed-discrete-gaussian`` / ``distributed-skellam``);
* ``noise`` — a :class:`Noise`: its ``kind`` (``gaussian``; ``discrete-gaussian`` and ``skellam`` for the integer
  mechanisms), the std ``sigma`` of the noise the release is accounted with (in the units of the sensitivity), the
  std ``share`` this site added itself (σ/√t under distributed noise, else σ) and the noise ``multiplier`` z at
  which the release is accounted — ``σ/Δ`` for a Gaussian; under distributed noise the worst case over every
  survivor set the site helps reveal; for the integer mechanisms the Gaussian whose Rényi divergence dominates
  theirs at every order (Kairouz, Liu & Steinke 2021 Prop. 14; Agarwal, Kairouz & Liu 2021);
* ``sensitivity`` — Δ, the L2 change of the released vector when one record changes (a parameter of the event:
  each producer states its own, e.g. the billboard's :data:`securefed.landmarks.merf.RFF_SENSITIVITY`);
* ``sampling`` — a :class:`Sampling`: the Poisson rate ``q`` of the records that entered it (1: every record);
* ``count`` — how many such releases.

:class:`ComposedEvent` is a sequence of events (a site's ledger, a run's plan, the billboard's two or three releases).
Accountants (:mod:`.accountants`) answer :meth:`~.accountants.Accountant.supports` for an event, then
:meth:`~.accountants.Accountant.compose` it: the exact μ-GDP accountant composes Gaussian events at ``q = 1``, PRV
Gaussian events at any ``q``, RDP every kind (the integer kinds through their dominating Gaussian), the paper's
formula Gaussian events. Every ε securefed prints is an accountant's ε of one event tree.

The ledger (:mod:`.ledger`) stores each release's event (``"event"`` in its line, beside the flat fields older
securefed versions wrote; a line without it — an older ledger — is read back into the same event).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field

from ..errors import ConfigError, bad_value

__all__ = [
    "Noise",
    "Sampling",
    "ReleaseEvent",
    "ComposedEvent",
    "FULL_BATCH",
    "MECHANISMS",
    "NOISE_KINDS",
    "gaussian_release",
    "leaves",
    "history_of",
]

NOISE_KINDS = ("gaussian", "discrete-gaussian", "skellam")
MECHANISMS = (
    "gaussian-gradient",
    "gaussian-rff",
    "gaussian-counts",
    "gaussian-density",
    "gaussian-data",
    "distributed-discrete-gaussian",
    "distributed-skellam",
)
_INTEGER_KIND = {"distributed-discrete-gaussian": "discrete-gaussian", "distributed-skellam": "skellam"}


def _positive(name: str, v) -> float:
    if isinstance(v, bool):
        raise ConfigError(bad_value(name, v, "must be a positive finite number"))
    try:
        f = float(v)
    except (TypeError, ValueError):
        raise ConfigError(bad_value(name, v, "must be a positive finite number")) from None
    if not (math.isfinite(f) and f > 0):
        raise ConfigError(bad_value(name, v, "must be a positive finite number"))
    return f


@dataclass(frozen=True)
class Noise:
    """The noise of a release: its kind, the std it is accounted with, the share this site added, and z."""

    kind: str
    sigma: float
    multiplier: float
    share: float | None = None  # None: the site added the full sigma itself

    def __post_init__(self):
        if self.kind not in NOISE_KINDS:
            raise ConfigError(bad_value("noise kind", self.kind, f"use one of {', '.join(NOISE_KINDS)}"))
        object.__setattr__(self, "sigma", _positive("sigma", self.sigma))
        object.__setattr__(self, "multiplier", _positive("noise_multiplier", self.multiplier))
        if self.share is not None:
            object.__setattr__(self, "share", _positive("noise share", self.share))


@dataclass(frozen=True)
class Sampling:
    """How the records entering a release were chosen: Poisson sampling at ``rate`` (1.0: every record)."""

    rate: float = 1.0

    def __post_init__(self):
        r = _positive("sample_rate", self.rate)
        if r > 1.0:
            raise ConfigError(bad_value("sample_rate", self.rate, "use a rate in (0, 1]"))
        object.__setattr__(self, "rate", r)


FULL_BATCH = Sampling(1.0)


@dataclass(frozen=True)
class ReleaseEvent:
    """``count`` releases of ``mechanism`` with ``noise`` on a query of L2 ``sensitivity`` over ``sampling``."""

    mechanism: str
    noise: Noise
    sensitivity: float
    sampling: Sampling = FULL_BATCH
    count: int = 1

    def __post_init__(self):
        if not isinstance(self.mechanism, str) or not self.mechanism:
            raise ConfigError(bad_value("mechanism", self.mechanism, "name the mechanism"))
        object.__setattr__(self, "sensitivity", _positive("sensitivity", self.sensitivity))
        if isinstance(self.count, bool) or not isinstance(self.count, int) or self.count < 0:
            raise ConfigError(bad_value("count", self.count, "use a non-negative integer"))

    @property
    def noise_multiplier(self) -> float:
        return self.noise.multiplier

    @property
    def sample_rate(self) -> float:
        return self.sampling.rate

    def times(self, count: int) -> "ReleaseEvent":
        """The same release made ``count`` times."""
        return ReleaseEvent(self.mechanism, self.noise, self.sensitivity, self.sampling, int(count))

    def settled(self, multiplier: float) -> "ReleaseEvent":
        """The same release accounted at another noise multiplier (a distributed-noise settlement)."""
        n = self.noise
        return ReleaseEvent(
            self.mechanism, Noise(n.kind, n.sigma, multiplier, n.share), self.sensitivity, self.sampling, self.count
        )

    def as_dict(self) -> dict:
        """The JSON object the ledger stores (``"event"``)."""
        n = self.noise
        return {
            "mechanism": self.mechanism,
            "noise": {"kind": n.kind, "sigma": n.sigma, "multiplier": n.multiplier, "share": n.share},
            "sensitivity": self.sensitivity,
            "sampling": {"kind": "poisson", "rate": self.sampling.rate},
            "count": self.count,
        }

    @classmethod
    def from_dict(cls, d: dict) -> "ReleaseEvent":
        try:
            n, s = d["noise"], d["sampling"]
            if s.get("kind", "poisson") != "poisson":
                raise ConfigError(bad_value("sampling kind", s.get("kind"), "only Poisson sampling is accounted"))
            return cls(
                str(d["mechanism"]),
                Noise(n["kind"], n["sigma"], n["multiplier"], n.get("share")),
                d["sensitivity"],
                Sampling(s["rate"]),
                int(d.get("count", 1)),
            )
        except (KeyError, TypeError, AttributeError) as exc:
            raise ConfigError(bad_value("event", d, f"is not a release event ({type(exc).__name__}: {exc})")) from None

    @classmethod
    def from_ledger_fields(cls, ev: dict) -> "ReleaseEvent":
        """The event of a ledger line written without ``"event"`` (older securefed): its flat fields."""
        share = ev.get("noise_share")
        return gaussian_release(
            ev["mechanism"],
            sigma=ev["sigma"],
            sensitivity=ev["sensitivity"],
            noise_multiplier=ev["noise_multiplier"],
            sample_rate=ev.get("sample_rate", 1.0),
            share=None if share is None else float(share),
        )


@dataclass(frozen=True)
class ComposedEvent:
    """Events composed in sequence (dp-accounting's ``ComposedDpEvent``)."""

    events: tuple = field(default_factory=tuple)

    def __post_init__(self):
        object.__setattr__(self, "events", tuple(self.events))
        for e in self.events:
            if not isinstance(e, (ReleaseEvent, ComposedEvent)):
                raise ConfigError(bad_value("event", type(e).__name__, "compose ReleaseEvent or ComposedEvent objects"))


def gaussian_release(
    mechanism: str,
    *,
    sigma: float,
    sensitivity: float,
    noise_multiplier: float | None = None,
    sample_rate: float = 1.0,
    count: int = 1,
    share: float | None = None,
) -> ReleaseEvent:
    """The event of a release with noise std ``sigma`` on a query of sensitivity Δ. ``noise_multiplier`` defaults
    to ``σ/Δ`` (give it where the release is accounted at another z: distributed shares, integer mechanisms).
    The noise kind follows the mechanism (the integer mechanisms' kinds; Gaussian otherwise)."""
    z = float(sigma) / float(sensitivity) if noise_multiplier is None else noise_multiplier
    kind = _INTEGER_KIND.get(mechanism, "gaussian")
    return ReleaseEvent(mechanism, Noise(kind, sigma, z, share), sensitivity, Sampling(sample_rate), int(count))


def leaves(event) -> list[ReleaseEvent]:
    """The release events of an event tree, in order."""
    if isinstance(event, ReleaseEvent):
        return [event]
    if isinstance(event, ComposedEvent):
        return [x for e in event.events for x in leaves(e)]
    raise ConfigError(bad_value("event", type(event).__name__, "give a ReleaseEvent or a ComposedEvent"))


def history_of(event) -> list[tuple[float, float, int]]:
    """The accountants' numeric form of an event tree: ``[(z, q, count)]``, equal (z, q) merged, sorted."""
    c: Counter = Counter()
    for e in leaves(event):
        if e.count:
            c[(float(e.noise.multiplier), float(e.sampling.rate))] += int(e.count)
    return sorted((z, q, n) for (z, q), n in c.items())
