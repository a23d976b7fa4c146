"""In-process protocol simulator: the real SecAgg+ / CKKS state machines with dropouts and faults.

``simulate`` draws client inputs uniformly in ``[−clip_range, clip_range]`` from a seeded generator,
runs one round through :func:`.runner.run_secagg_round` or :func:`.ckks.run_ckks_round` (encoded bytes
between parties, simulated clock for deadlines; both return a :class:`~.machine.RoundOutcome`), and reports
the outcome as a JSON-ready dict. A fault (``tamper``) is refused by the client that gets it with a typed
error (``client_errors``); the round then completes over the others with their exact sum, or aborts.
"""

from __future__ import annotations

import os
import time

import numpy as np

from ..errors import ConfigError, bad_value
from . import crypto
from .graph import choose_parameters
from .quantize import dequantize, plan_fixed_point
from .runner import TAMPER_KINDS, dropout_schedule, run_secagg_round
from .secagg import DEFAULT_TIMEOUTS, STAGES, RoundSpec

__all__ = ["simulate", "PROTOCOLS"]

PROTOCOLS = ("secagg", "ckks")


def simulate(
    protocol: str = "secagg",
    clients: int = 10,
    length: int = 1000,
    dropout=0.0,
    drop_stage: str | None = None,
    tamper: str | None = None,
    seed: int = 0,
    *,
    degree: int | None = None,
    threshold: int | None = None,
    clip_range: float = 1.0,
    modulus_bits: int = 32,
    fractional_bits: int | None = None,
    precision: float = 1e-6,
    dropout_rate: float | None = None,
    corrupt_fraction: float = 0.1,
    key_holder: int = 0,
) -> dict:
    """Run one round of ``protocol`` among ``clients`` clients on vectors of ``length`` values.

    Parameters
    ----------
    protocol : {"secagg", "ckks"}
    clients, length : int
    dropout : float or list or dict
        Per-client drop probability, explicit client indices, or {client: stage}.
    drop_stage : str or None
        Stage of the dropouts (SecAgg: ``advertise, share, masked, consistency, unmask``; CKKS:
        ``advertise, handoff, input, decrypt``); None = a uniformly random stage per dropping client.
    tamper : str or None
        One of ``TAMPER_KINDS`` (a fault injected into one server → client message).
    seed : int
        Seeds inputs, dropouts and stochastic rounding (never secrets: those use os.urandom).
    degree, threshold, dropout_rate, corrupt_fraction
        SecAgg+ graph: explicit, or derived from the threat model (dropout_rate defaults to ``dropout``
        when it is a probability > 0, else 0.1).

    Returns
    -------
    dict
        ``protocol, clients, survivors, length, max_abs_error, error_bound, aborted, abort_reason,
        error_type, timings{...}, bytes{client_upload, client_download, server_download, server_upload},
        dropped, revealed_shares, parameters``.
    """
    stages = _check(protocol, clients, length, tamper, drop_stage)
    rng = np.random.default_rng(seed)
    inputs = [rng.uniform(-clip_range, clip_range, length) for _ in range(clients)]
    weights = np.ones(clients)
    sched = dropout_schedule(clients, dropout, drop_stage, rng, stages)
    keys = [crypto.ed25519_keypair() for _ in range(clients)]
    priv, pub = tuple(k for k, _ in keys), tuple(p for _, p in keys)
    t0 = time.perf_counter()
    if protocol == "secagg":
        if dropout_rate is None:
            dropout_rate = float(dropout) if isinstance(dropout, float) and dropout > 0 else 0.1
        out, total, error_bound, params, revealed = _secagg_round(
            priv,
            pub,
            inputs,
            weights,
            rng,
            sched,
            tamper,
            degree=degree,
            threshold=threshold,
            dropout_rate=dropout_rate,
            corrupt_fraction=corrupt_fraction,
            clip_range=clip_range,
            modulus_bits=modulus_bits,
            fractional_bits=fractional_bits,
        )
    else:
        out, total, error_bound, params, revealed = _ckks_round(
            priv, pub, inputs, weights, sched, tamper, precision=precision, clip_range=clip_range, key_holder=key_holder
        )
    wall = time.perf_counter() - t0
    return _round_report(
        protocol, clients, length, tamper, seed, inputs, sched, out, total, error_bound, params, revealed, wall
    )


def _round_report(
    protocol, clients, length, tamper, seed, inputs, sched, out, total, error_bound, params, revealed, wall: float
) -> dict:
    """:func:`simulate`'s report of one round (``out``: the round's outcome, ``total``: the sum it released, ``wall``:
    its time): the survivors, the error against the plain sum of their inputs, the faults, the timings and bytes."""
    err, survivors = out.error, out.survivors
    timings: dict = {s: {k: round(v, 6) for k, v in d.items()} for s, d in out.timings.items()}
    timings["clients_total"] = round(sum(d["clients"] for d in out.timings.values()), 6)
    timings["server_total"] = round(sum(d["server"] for d in out.timings.values()), 6)
    up, down = out.bytes_up, out.bytes_down
    dropped = {k: list(v) for k, v in out.dropped_at.items()}
    rejected = out.rejected
    timings["total"] = round(wall, 6)
    t1 = time.perf_counter()
    exact = np.sum([inputs[i] for i in survivors], axis=0) if survivors else None
    timings["plain_sum"] = round(time.perf_counter() - t1, 6)
    max_err = float(np.max(np.abs(total - exact))) if (total is not None and exact is not None) else None
    senders = [i for i in range(clients) if up[i] > 0]
    return {
        "protocol": protocol,
        "clients": int(clients),
        "survivors": [int(i) for i in survivors],
        "length": int(length),
        "max_abs_error": max_err,
        "error_bound": error_bound,
        "aborted": err is not None,
        "abort_reason": None if err is None else f"{type(err).__name__}: {err}",
        "error_type": None if err is None else type(err).__name__,
        "tamper": tamper,
        "dropped": dropped,
        "scheduled_dropouts": {str(k): v for k, v in sorted(sched.items())},
        "revealed_shares": revealed,
        "rejected": rejected,
        "client_errors": {str(k): v for k, v in sorted(out.client_errors.items())},
        "timings": timings,
        "bytes": {
            "client_upload": int(np.mean([up[i] for i in senders])) if senders else 0,
            "client_download": int(np.mean([down[i] for i in range(clients)])),
            "server_download": int(sum(up.values())),
            "server_upload": int(sum(down.values())),
        },
        "parameters": params,
        "seed": int(seed),
    }


def _check(protocol, clients, length, tamper, drop_stage) -> tuple:
    """The arguments of :func:`simulate`, checked before any work; returns the protocol's stages."""
    if protocol not in PROTOCOLS:
        raise ConfigError(bad_value("protocol", protocol, "use secagg or ckks"))
    if not isinstance(clients, (int, np.integer)) or clients < 2:
        raise ConfigError(bad_value("clients", clients, "use at least 2 clients"))
    if not isinstance(length, (int, np.integer)) or length < 1:
        raise ConfigError(bad_value("length", length, "use a positive vector length"))
    if tamper is not None and tamper not in TAMPER_KINDS:
        raise ConfigError(bad_value("tamper", tamper, f"use one of {', '.join(TAMPER_KINDS)}"))
    if protocol == "ckks":
        from .ckks import CKKS_STAGES
    stages = STAGES if protocol == "secagg" else CKKS_STAGES
    if drop_stage is not None and drop_stage not in stages:
        raise ConfigError(bad_value("drop_stage", drop_stage, f"for {protocol} use one of {', '.join(stages)}"))
    return stages


def _secagg_round(
    priv,
    pub,
    inputs,
    weights,
    rng,
    sched,
    tamper,
    *,
    degree,
    threshold,
    dropout_rate,
    corrupt_fraction,
    clip_range,
    modulus_bits,
    fractional_bits,
):
    """One SecAgg+ round: (outcome, the dequantised total or None, the error bound, parameters, revealed shares)."""
    clients, length = len(inputs), len(inputs[0])
    gp = choose_parameters(
        clients, degree=degree, threshold=threshold, dropout_rate=dropout_rate, corrupt_fraction=corrupt_fraction
    )
    fp = plan_fixed_point(clip_range, weights, modulus_bits=modulus_bits, fractional_bits=fractional_bits)
    sid = os.urandom(16)
    spec = RoundSpec(
        sid, 0, clients, gp.degree, gp.threshold, sid, length, fp, pub, tuple(DEFAULT_TIMEOUTS.items()), gp.quorum
    )
    out = run_secagg_round(spec, priv, inputs, weights, rng, drop_at=sched, tamper=tamper)
    total = dequantize(out.words, fp) if out.error is None else None
    return out, total, fp.step * clients, dict(graph=gp.as_dict(), fixed_point=fp.as_dict()), out.revealed


def _ckks_round(priv, pub, inputs, weights, sched, tamper, *, precision, clip_range, key_holder):
    """One CKKS round: (outcome, the released total or None, the error bound, parameters, 1 if decrypted)."""
    from .ckks import choose_ckks_parameters, flood_sigma, release_error_bound, run_ckks_round

    clients, length = len(inputs), len(inputs[0])
    params_ckks = choose_ckks_parameters(length, precision, clients * clip_range, clients)
    out = run_ckks_round(
        params_ckks, priv, pub, inputs, weights, clip_range, drop_at=sched, key_holder=key_holder, tamper=tamper
    )
    sigma = flood_sigma(params_ckks.scale_bits, clients, clients * clip_range)
    error_bound = release_error_bound(params_ckks.step, sigma, length)
    return (
        out,
        out.total,
        error_bound,
        dict(params_ckks.as_dict(), flood_sigma=sigma),
        0 if out.error is not None else 1,
    )
