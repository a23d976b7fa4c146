"""``CKKSAggregator``: the :class:`securefed.securesum.base.Aggregator` seam backed by CKKS (TenSEAL)."""

from __future__ import annotations

import os
import time

import numpy as np

from ...errors import ConfigError, bad_value
from .. import crypto
from ..base import AggregateResult
from ..quantize import check_random_state, warn_clipped
from .params import CKKS_STAGES, FLOOD_BITS, VERIFY_MODES, choose_ckks_parameters, release_error_bound

__all__ = ["CKKSAggregator"]


class CKKSAggregator:
    """Secure sum under CKKS (TenSEAL): the server adds ciphertexts; a key-holding client decrypts.

    Parameters
    ----------
    clip_range : float
        Required public bound c on |coordinate| (clipped, counted, warned), as for SecAgg.
    precision : float, default 1e-6
        Stated absolute precision of the released sum: the decryption is flooded and randomised-rounded to
        step = 2^⌊log2 precision⌋ (:attr:`CKKSRoundSpec.release_bound`).
    key_holder : int, default 0
        Index of the client that generates the key pair.
    fallbacks : tuple of int or None
        The only other clients that receive the secret key (None: one, the lowest other index).
    min_survivors : int or None, default None
        A decryptor refuses sums over fewer signed uploads (None: ``min(2, n)``).
    quorum : int or None, default None
        Survivor-set signatures a decryptor requires (None: a majority ⌊n/2⌋ + 1).
    verify : {"recompute", "signatures"}, default "recompute"
        What the decryptor checks before decrypting (see :mod:`.machines`).
    flood_bits : int, default 40
        λ of the decryption flood (bits of security of the secret key against search attacks).
    dropout, drop_stage, random_state
        Simulator hooks as for :class:`SecAggAggregator` (stages: ``advertise, handoff, input, decrypt``).
    """

    name = "ckks"

    def __init__(
        self,
        clip_range=None,
        *,
        precision: float = 1e-6,
        key_holder: int = 0,
        min_survivors=None,
        quorum=None,
        verify: str = "recompute",
        dropout=None,
        drop_stage: str | None = None,
        random_state=None,
        fallbacks=None,
        flood_bits: int = FLOOD_BITS,
    ):
        if clip_range is None or not np.isfinite(clip_range) or clip_range <= 0:
            raise ConfigError(
                bad_value(
                    "clip_range",
                    clip_range,
                    "CKKS needs a positive public bound on |update| "
                    "coordinates, e.g. clip_range=1.0 for data scaled to [0, 1]",
                )
            )
        if drop_stage is not None and drop_stage not in CKKS_STAGES:
            raise ConfigError(bad_value("drop_stage", drop_stage, f"use one of {', '.join(CKKS_STAGES)} or None"))
        if not (precision > 0):
            raise ConfigError(bad_value("precision", precision, "use a positive absolute precision, e.g. 1e-6"))
        if verify not in VERIFY_MODES:
            raise ConfigError(bad_value("verify", verify, f"use one of {', '.join(VERIFY_MODES)}"))
        self.clip_range, self.precision, self.key_holder = float(clip_range), float(precision), int(key_holder)
        self.min_survivors, self.quorum, self.verify = min_survivors, quorum, verify
        self.fallbacks, self.flood_bits = fallbacks, int(flood_bits)
        self.dropout, self.drop_stage, self.random_state = dropout, drop_stage, random_state
        self._rng = check_random_state(random_state)
        self.session_id = os.urandom(16)
        self._round = 0
        self._identity: dict[int, tuple] = {}

    def _identities(self, n: int):
        if n not in self._identity:
            keys = [crypto.ed25519_keypair() for _ in range(n)]
            self._identity[n] = (tuple(k for k, _ in keys), tuple(p for _, p in keys))
        return self._identity[n]

    def aggregate(self, updates, weights=None, *, round_index: int = 0) -> AggregateResult:
        """One CKKS round: the weighted sum over surviving clients, flooded and rounded to ``precision``."""
        from ..aggregators import check_updates
        from ..runner import dropout_schedule
        from .runner import run_ckks_round

        t0 = time.perf_counter()
        flat, w, shape = check_updates(updates, weights)
        n = len(flat)
        if not 0 <= self.key_holder < n:
            raise ConfigError(bad_value("key_holder", self.key_holder, f"use a client index in [0, {n})"))
        M = max(float(w.sum()) * self.clip_range, self.clip_range)
        fb = self.fallbacks if self.fallbacks is not None else tuple(i for i in range(n) if i != self.key_holder)[:1]
        params = choose_ckks_parameters(flat[0].size, self.precision, M, n, self.flood_bits, 1 + len(fb))
        sched = dropout_schedule(n, self.dropout, self.drop_stage, self._rng, CKKS_STAGES)
        priv, pub = self._identities(n)
        out = run_ckks_round(
            params,
            priv,
            pub,
            flat,
            w,
            self.clip_range,
            drop_at=sched,
            key_holder=self.key_holder,
            session_id=self.session_id,
            round_index=self._round,
            verify=self.verify,
            min_survivors=self.min_survivors,
            quorum=self.quorum,
            max_abs_sum=M,
            fallbacks=fb,
            flood_bits=self.flood_bits,
        )
        self._round += 1
        if out.error is not None:
            raise out.error
        surv = out.survivors
        clipped = int(sum(out.clipped[i] for i in surv))
        warn_clipped(clipped, self.clip_range, "CKKSAggregator")
        up = [out.bytes_up[i] for i in surv]
        from .params import flood_sigma

        sigma = flood_sigma(params.scale_bits, n, M, self.flood_bits, 1 + len(fb))
        return AggregateResult(
            total=out.total.reshape(shape),
            survivors=tuple(int(i) for i in surv),
            weight_sum=float(w[list(surv)].sum()),
            protocol="ckks",
            clipped=clipped,
            bytes_up=int(np.mean(up)),
            bytes_down=int(sum(out.bytes_up.values())),
            seconds=time.perf_counter() - t0,
            details=dict(
                round_index=round_index,
                params=params.as_dict(),
                precision=params.step,
                flood_sigma=sigma,
                flood_bits=self.flood_bits,
                fallbacks=list(fb),
                error_bound=release_error_bound(params.step, sigma, params.length),
                decryptor=out.decryptor,
                timings=out.timings,
                scheduled_dropouts=sched,
                verify=self.verify,
                dropped_at={k: list(v) for k, v in out.dropped_at.items()},
                bytes_to_clients=int(sum(out.bytes_down.values())),
                client_errors=out.client_errors,
            ),
        )
