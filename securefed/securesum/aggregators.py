"""``SecAggAggregator``: the :class:`securefed.securesum.base.Aggregator` seam backed by SecAgg+.

Each ``aggregate`` call runs one full SecAgg+ round (:mod:`.secagg`) in-process over the real state
machines and byte codec (:mod:`.runner`): the "server" side of the product only ever holds masked
vectors and the unmasked *sum*. Every call is a fresh protocol round (fresh X25519 keys, fresh self-mask
seeds; see :mod:`.secagg` for why mask keys are not reused across rounds) inside one session whose
id is drawn from ``os.urandom`` when the aggregator is built. The Ed25519 identity keys are
long-term: generated once per aggregator (per client count) and distributed to the state machines as a
PKI would.

Choice of ``clip_range``: it is **required** and must be a public bound on |coordinate| of every
update (for FedDL model averaging, the known data range, e.g. ``[0, 1]`` pixels → 1.0, plus the step
size margin). A data-dependent default (the round's max |value|) would itself leak information, so
securefed refuses to guess; coordinates beyond it are clipped, counted and warned about.
"""

from __future__ import annotations

import os
import time
from typing import Any

import numpy as np

from .base import AggregateResult
from ..errors import ConfigError, bad_value
from . import crypto
from .graph import choose_parameters
from .quantize import check_random_state, dequantize, plan_fixed_point, warn_clipped
from .runner import dropout_schedule, run_secagg_round
from .secagg import DEFAULT_TIMEOUTS, STAGES, RoundSpec

__all__ = ["SecAggAggregator", "check_updates"]


def check_updates(updates, weights):
    """Validate a round's updates and weights; returns (flat float64 arrays, weights, shape)."""
    if updates is None or len(updates) == 0:
        raise ConfigError(bad_value("updates", updates, "pass at least one client update"))
    shape = np.shape(updates[0])
    flat = []
    for i, u in enumerate(updates):
        if np.shape(u) != shape:
            raise ConfigError(bad_value(f"updates[{i}].shape", np.shape(u), f"all updates must have shape {shape}"))
        flat.append(np.asarray(u, dtype=np.float64).ravel())
    if weights is None:
        w = np.ones(len(updates))
    else:
        w = np.asarray(weights, dtype=float)
    if w.shape != (len(updates),) or not np.all(np.isfinite(w)) or np.any(w < 0):
        raise ConfigError(bad_value("weights", weights, "give one finite non-negative weight per update"))
    return flat, w, shape


class SecAggAggregator:
    """Secure sum by SecAgg+ (Bell et al. 2020) — the server learns only the survivors' weighted sum.

    Parameters
    ----------
    clip_range : float
        Required public bound c: each coordinate is clipped to [−c, c] before weighting (counted).
    modulus_bits : int, default 32
        k of the ring Z_{2^k} (16–64). 32 halves mask-expansion cost; use 64 for many clients / large
        weights. Overflow is checked against the active clients before every round.
    fractional_bits : int or None
        f of the fixed point (step 2^−f). None: the largest safe f (≤ 40) for this round.
    degree, threshold : int or None
        Explicit neighbour degree k and Shamir threshold t. None: derived from the threat model below
        (:func:`securefed.securesum.graph.choose_parameters`: against a malicious server colluding with c
        clients, the complete graph with 2t > k + c up to 128 clients). ``degree=clients-1`` is classic SecAgg.
    dropout_rate, corrupt_fraction, security_bits, correctness_bits, server_model, colluders, quorum
        The threat model used to derive k, t and the consistency quorum q (see :mod:`.graph`; default
        ``server_model="malicious"``, c = ⌈γ n⌉ ≥ 1, q = ⌊(n + c)/2⌋ + 1).
    timeouts : dict, optional
        Seconds per stage (keys ``advertise, share, masked, consistency, unmask``); defaults
        ``DEFAULT_TIMEOUTS``. The in-process driver never sleeps; deadlines are simulated.
    dropout : float | list[int] | dict[int, str] | None
        Simulator hook: probability of each client dropping, explicit indices, or {client: stage}.
    drop_stage : str or None
        Stage at which simulated dropouts happen (None: uniformly random stage per client).
    random_state : None | int | Generator
        For stochastic rounding and the dropout simulation (statistics only; secrets use os.urandom).
    """

    name = "secagg"

    def __init__(
        self,
        clip_range=None,
        *,
        modulus_bits: int = 32,
        fractional_bits: int | None = None,
        degree: int | None = None,
        threshold: int | None = None,
        dropout_rate: float = 0.1,
        corrupt_fraction: float = 0.1,
        security_bits: float = 40.0,
        correctness_bits: float = 10.0,
        server_model: str = "malicious",
        timeouts: dict | None = None,
        dropout=None,
        drop_stage: str | None = None,
        random_state=None,
        colluders: int | None = None,
        quorum: int | None = None,
    ):
        if clip_range is None:
            raise ConfigError(
                bad_value(
                    "clip_range",
                    None,
                    "SecAgg needs a public bound on |update| coordinates, "
                    "e.g. clip_range=1.0 for data scaled to [0, 1]; a data-derived default would leak",
                )
            )
        if not np.isfinite(clip_range) or clip_range <= 0:
            raise ConfigError(bad_value("clip_range", clip_range, "use a positive finite number"))
        if drop_stage is not None and drop_stage not in STAGES:
            raise ConfigError(bad_value("drop_stage", drop_stage, f"use one of {', '.join(STAGES)} or None"))
        tmo = dict(DEFAULT_TIMEOUTS)
        if timeouts:
            unknown = set(timeouts) - set(STAGES)
            if unknown:
                raise ConfigError(bad_value("timeouts", timeouts, f"keys must be among {', '.join(STAGES)}"))
            tmo.update({k: float(v) for k, v in timeouts.items()})
        self.clip_range = float(clip_range)
        self.modulus_bits = modulus_bits
        self.fractional_bits = fractional_bits
        self.degree, self.threshold = degree, threshold
        self.threat_model: dict[str, Any] = dict(
            dropout_rate=dropout_rate,
            corrupt_fraction=corrupt_fraction,
            security_bits=security_bits,
            correctness_bits=correctness_bits,
            server_model=server_model,
            colluders=colluders,
            quorum=quorum,
        )
        self.timeouts = tmo
        self.dropout, self.drop_stage = dropout, drop_stage
        self.random_state = random_state
        self._rng = check_random_state(random_state)
        self.session_id = os.urandom(16)
        self._counter = [0]  # shared with copies from with_options(): (session, round) never repeats
        self._identity: dict[int, tuple] = {}
        self._params: dict[int, object] = {}

    def with_options(self, **changes) -> "SecAggAggregator":
        """A copy with some options changed (e.g. another ``clip_range`` for a differently scaled
        release) that keeps this aggregator's session id, round counter and identity keys."""
        opts = dict(
            clip_range=self.clip_range,
            modulus_bits=self.modulus_bits,
            fractional_bits=self.fractional_bits,
            degree=self.degree,
            threshold=self.threshold,
            timeouts=self.timeouts,
            dropout=self.dropout,
            drop_stage=self.drop_stage,
            random_state=self._rng,
            **self.threat_model,
        )
        opts.update(changes)
        other = SecAggAggregator(**opts)
        other.session_id, other._identity, other._counter = self.session_id, self._identity, self._counter
        return other

    def graph_parameters(self, n_clients: int):
        """The (degree, threshold, quorum) used for ``n_clients`` (cached)."""
        if n_clients not in self._params:
            self._params[n_clients] = choose_parameters(
                n_clients, degree=self.degree, threshold=self.threshold, **self.threat_model
            )
        return self._params[n_clients]

    def _identities(self, n: int):
        if n not in self._identity:
            keys = [crypto.ed25519_keypair() for _ in range(n)]
            self._identity[n] = (tuple(k for k, _ in keys), tuple(p for _, p in keys))
        return self._identity[n]

    def round_spec(self, n_clients: int, length: int, weights) -> RoundSpec:
        """The public parameters of the next round (checks overflow against the active clients)."""
        gp = self.graph_parameters(n_clients)
        fp = plan_fixed_point(
            self.clip_range, weights, modulus_bits=self.modulus_bits, fractional_bits=self.fractional_bits
        )
        return RoundSpec(
            self.session_id,
            self._counter[0],
            n_clients,
            gp.degree,
            gp.threshold,
            self.session_id,
            length,
            fp,
            self._identities(n_clients)[1],
            tuple(self.timeouts.items()),
            gp.quorum,
        )

    def aggregate(self, updates, weights=None, *, round_index: int = 0) -> AggregateResult:
        """One SecAgg+ round: the weighted sum over the surviving clients (see AggregateResult)."""
        t0 = time.perf_counter()
        flat, w, shape = check_updates(updates, weights)
        n = len(flat)
        if n < 2:
            raise ConfigError(bad_value("updates", n, "secure aggregation needs at least 2 clients"))
        spec = self.round_spec(n, flat[0].size, w)
        self._counter[0] += 1
        sched = dropout_schedule(n, self.dropout, self.drop_stage, self._rng)
        out = run_secagg_round(spec, self._identities(n)[0], flat, w, self._rng, drop_at=sched)
        if out.error is not None:
            raise out.error
        fp = spec.fixed_point
        total = dequantize(out.words, fp).reshape(shape)
        surv = out.survivors
        clipped = int(sum(out.clipped[i] for i in surv))
        warn_clipped(clipped, self.clip_range, "SecAggAggregator")
        up = [out.bytes_up[i] for i in surv]
        seconds = time.perf_counter() - t0
        return AggregateResult(
            total=total,
            survivors=tuple(int(i) for i in surv),
            weight_sum=float(w[list(surv)].sum()),
            protocol="secagg",
            clipped=clipped,
            bytes_up=int(np.mean(up)) if up else 0,
            bytes_down=int(sum(out.bytes_up.values())),
            seconds=seconds,
            details=dict(
                round_index=round_index,
                protocol_round=spec.round_index,
                degree=spec.degree,
                threshold=spec.threshold,
                graph=self.graph_parameters(n).as_dict(),
                fixed_point=fp.as_dict(),
                quorum=spec.signatures_needed,
                dropped_at={k: list(v) for k, v in out.dropped_at.items()},
                scheduled_dropouts=sched,
                timings=out.timings,
                bytes_to_clients=int(sum(out.bytes_down.values())),
                rejected=out.rejected,
                client_errors=out.client_errors,
            ),
        )
