"""CKKS secure sum over Flower: the coordinator and site halves of :mod:`securefed.protocols.ckks`.

The same :class:`~securefed.protocols.ckks.CKKSServer` / :class:`~securefed.protocols.ckks.CKKSClient`
state machines that :func:`~securefed.protocols.ckks.run_ckks_round` drives in process are driven here
over a Flower exchange (``transport.Exchange`` or any object with its ``now`` / ``request`` interface):

* :func:`server_ckks_sum` (coordinator) builds the public :class:`~securefed.protocols.ckks.CKKSRoundSpec`
  (fresh 16-byte session per sum, so no message of one sum is accepted in another), sends
  ``{"op": "ckks-start", "spec": …, "weight": …, **base}`` to the live sites, then relays the
  machines' messages stage by stage (``{"op": "ckks-msgs", "msgs": [...]}``) until the key holder — or,
  when it is silent past the ``decrypt`` deadline, the next survivor that confirmed the survivor set —
  returns the decrypted, randomised-rounded weighted sum; finally ``{"op": "ckks-end"}`` tells the
  surviving sites to drop the round's state (the non-decrypting survivors still hold the secret context).
* :func:`site_handle_ckks` (site) computes the update, starts the client machine and feeds it the
  server's messages. Flower starts a fresh ClientApp per message, so the machine is stored between
  messages as bytes (:meth:`~securefed.protocols.ckks.CKKSClient.dump`) in ``state.data`` — including
  the TenSEAL **secret** context on key-holding sites: it stays in the site's own SuperNode state and
  is dropped when the round ends.

Run-config keys read (with ``getattr`` defaults, so older configs work): ``ckks_precision`` (1e-6),
``key_holder`` (0; if that site is not live, the lowest live site), ``ckks_min_survivors`` (0 → 2),
``ckks_quorum`` (0 → a majority of all sites), ``ckks_verify`` (``"recompute"``), ``stage_timeout``
(0 → :data:`~securefed.protocols.ckks.CKKS_TIMEOUTS`) and ``out_dir`` (progress log). A sum with fewer
live sites than ``ckks_min_survivors`` or the quorum aborts before any site is asked.
"""

from __future__ import annotations

import json
import os
import time

import numpy as np

from ...aggregation import AggregateResult
from ...errors import ConfigError, ProtocolAbortedError, ProtocolError, SecureFedError, bad_value
from ..ckks import (CKKS_STAGES, CKKS_TIMEOUTS, CKKSClient, CKKSRoundSpec, CKKSServer, choose_ckks_parameters,
                    decode_ckks_spec, encode_ckks_spec)

__all__ = ["server_ckks_sum", "site_handle_ckks", "ckks_round_spec", "drive_stages", "make_feed"]


def _log(cfg, event: str, **kw) -> None:
    out = getattr(cfg, "out_dir", None)
    if not out:
        return
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "progress.jsonl"), "a") as fh:
        fh.write(json.dumps({"t": time.time(), "event": event, **kw}) + "\n")


def ckks_round_spec(cfg, sites, w, length: int, clip) -> CKKSRoundSpec:
    """The public CKKS round parameters for the live ``sites`` (fresh session id from ``os.urandom``)."""
    if clip is None or not np.isfinite(clip) or clip <= 0:
        raise ConfigError(bad_value("value-bound", clip, "CKKS needs a public bound on |update| coordinates: give "
                                    "value-bound (e.g. 16 for digits, 255 for pixels)"))
    n = len(sites.names)
    live = sorted(sites.live)
    if not live:
        raise ProtocolAbortedError("no live site to run a CKKS sum with")
    kh = int(getattr(cfg, "key_holder", 0) or 0)
    if not 0 <= kh < n:
        raise ConfigError(bad_value("key-holder", kh, f"use a site index in [0, {n})"))
    if kh not in sites.live:
        kh = live[0]
    min_surv = int(getattr(cfg, "ckks_min_survivors", 0) or 0) or 2
    if len(live) < min_surv:
        raise ProtocolAbortedError(f"only {len(live)} live site(s); a CKKS sum is decrypted only over at least "
                                   f"ckks-min-survivors = {min_surv} sites (set it to 1 to release single updates)")
    precision = float(getattr(cfg, "ckks_precision", 1e-6) or 1e-6)
    stage_timeout = float(getattr(cfg, "stage_timeout", 0.0) or 0.0)
    tmo = {s: stage_timeout for s in CKKS_STAGES} if stage_timeout > 0 else dict(CKKS_TIMEOUTS)
    wl = np.asarray(w, dtype=float)[live]
    params = choose_ckks_parameters(length, precision, float(wl.sum()) * float(clip), len(live))
    spec = CKKSRoundSpec(os.urandom(16), 0, n, kh, params, float(clip), tuple(sites.identities), min_surv,
                         str(getattr(cfg, "ckks_verify", "recompute") or "recompute"), tuple(tmo.items()),
                         int(getattr(cfg, "ckks_quorum", 0) or 0))
    if len(live) < spec.signatures_needed:
        raise ProtocolAbortedError(f"only {len(live)} of {n} sites are live; a CKKS sum is decrypted only when "
                                   f"ckks-quorum = {spec.signatures_needed} sites confirm the survivor set (a majority "
                                   "of all sites unless set lower)")
    return spec


def server_ckks_sum(ex, cfg, sites, base: dict, w, label: str, t0: float, clip) -> AggregateResult:
    """One CKKS secure sum of the live sites' ``base`` task (coordinator side, mirrors ``_secagg``).

    Parameters
    ----------
    ex : Exchange
        ``now()`` and ``request(payloads, deadline, on_reply)`` as :class:`.transport.Exchange`.
    cfg : FlowerRunConfig
        Reads ``ckks_precision``, ``key_holder``, ``ckks_min_survivors``, ``ckks_verify``,
        ``stage_timeout``, ``out_dir`` (all optional).
    sites : Sites
        Names, Ed25519 identity keys and the live set (sites that fail are removed from it).
    base : dict
        The task fields, including ``out_shape``; sent with ``ckks-start``.
    w : array_like
        One public weight per site.
    label, t0, clip
        Log label, start time (``perf_counter``) and the public bound on |coordinates|.

    Returns
    -------
    AggregateResult
        ``total`` = Σ_{survivors} w_p·clip(u_p), randomised-rounded to the stated step.
    """
    base = dict(base)
    shape = tuple(int(s) for s in base.pop("out_shape"))
    length = int(np.prod(shape))
    w = np.asarray(w, dtype=float)
    spec = ckks_round_spec(cfg, sites, w, length, clip)
    server = CKKSServer(spec, ex.now())
    rejected: list = []
    outgoing: list = []
    feed = make_feed(ex, server, outgoing, rejected)
    sb = encode_ckks_spec(spec)
    started = sorted(sites.live)
    payloads = {i: dict(base, op="ckks-start", site=i, spec=sb, weight=float(w[i])) for i in started}
    try:
        drive_stages(ex, server, payloads, outgoing, feed, "ckks-msgs",
                     on_stage=lambda st: _log(cfg, "stage", label=label, stage=st, protocol="ckks"))
    except SecureFedError:
        # aborted: nobody decrypts; every started site drops the round's state (best effort)
        ex.request({i: {"op": "ckks-end"} for i in started if i not in ex.silent}, ex.now() + spec.timeout("advertise"))
        raise
    for i in range(len(sites.names)):
        if i not in server.survivors:
            sites.live.discard(i)
    # the survivors that did not decrypt still hold the secret context: tell them the round is over
    ex.request({i: {"op": "ckks-end"} for i in sorted(sites.live)}, ex.now() + spec.timeout("advertise"))
    surv = tuple(int(i) for i in server.survivors)
    p = spec.params
    return AggregateResult(
        server.result.reshape(shape), surv, float(w[list(surv)].sum()), "ckks", 0,
        int(np.mean([server.bytes_in.get(i, 0) for i in surv])), int(sum(server.bytes_in.values())),
        time.perf_counter() - t0,
        {"params": p.as_dict(), "precision": p.step, "key_holder": spec.key_holder, "decryptor": server.decryptor,
         "min_survivors": spec.min_survivors, "verify": spec.verify,
         "dropped_at": {k: list(v) for k, v in server.dropped_at.items()}, "rejected": rejected,
         "server_sum_seconds": server.sum_seconds, "bytes_to_sites": int(sum(server.bytes_out.values()))})


def make_feed(ex, server, outgoing: list, rejected: list):
    """The ``on_reply`` callback of :func:`drive_stages`: a site's messages into ``server``.

    A site's ``{"error": ...}`` is recorded in ``ex.silent``; a message the machine rejects is listed in
    ``rejected`` (the round goes on); an error that aborts the machine propagates.
    """

    def feed(cid, fields):
        if "error" in fields:
            ex.silent[cid] = str(fields["error"])
            return
        for data in fields.get("msgs", []):
            try:
                outgoing.extend(server.receive(bytes(data), ex.now()))
            except SecureFedError as exc:
                if server.stage == "aborted":
                    raise
                rejected.append(f"site {cid}: {type(exc).__name__}: {exc}")

    return feed


def drive_stages(ex, server, payloads: dict, outgoing: list, feed, op: str, on_stage=None) -> None:
    """Relay a sans-I/O server machine's messages over ``ex`` stage by stage until it is done (or raises).

    Works for any server with ``stage``, ``done``, ``deadline`` and ``tick(now)`` (``CKKSServer``,
    ``SecAggServer``): sends ``payloads``, lets ``feed(cid, fields)`` pass each reply to the machine
    (appending its output to ``outgoing``), closes a stage at its deadline, then sends the machine's
    messages as ``{"op": op, "msgs": [...]}`` per recipient. ``on_stage(stage)`` is called before each
    request (progress logging).
    """
    while True:
        stage = server.stage
        if on_stage is not None:
            on_stage(stage)
        ex.request(payloads, server.deadline, on_reply=feed)
        if server.stage == stage and not server.done:
            # every asked site answered or failed, or the deadline passed: close the stage now
            outgoing.extend(server.tick(max(ex.now(), server.deadline)))
        if server.done:
            return
        by_site: dict = {}
        for rid, data in outgoing:
            by_site.setdefault(rid, []).append(data)
        outgoing.clear()
        payloads = {rid: {"op": op, "msgs": msgs} for rid, msgs in by_site.items()}
        if not payloads:
            raise ProtocolAbortedError(f"{op}: stage {server.stage!r} has nobody to ask")


def site_handle_ckks(fields: dict, X, state, compute_update) -> dict:
    """Site side of a CKKS sum: ops ``ckks-start``, ``ckks-msgs`` and ``ckks-end``; returns the reply fields.

    Every op name starts with ``ckks-``, so a site dispatcher can route on that prefix (``ckks`` is
    accepted as an alias of ``ckks-msgs``).

    ``state`` is the site's :class:`~.site.SiteState` (``data`` dict of bytes, ``identity()``,
    ``rng(seed, site)``, ``save_rng(g)``); the client machine lives in ``state.data["ckks_client"]``
    (its spec in ``state.data["ckks_spec"]``) between messages and is removed when the machine is done
    or aborted, or on ``ckks-end``.
    ``compute_update(fields, X, rng)`` computes the site's update (``site.compute_update``). A
    securefed error (bad message, failed signature, refused decryption) comes back as
    ``{"error": "<Type>: <message>"}`` after the machine has aborted.
    """
    op = fields.get("op")
    try:
        if op == "ckks-start":
            spec = decode_ckks_spec(fields["spec"])
            site = int(fields["site"])
            g = state.rng(int(fields.get("seed", 0)), site)
            u = compute_update(fields, X, g)
            state.save_rng(g)
            client = CKKSClient(spec, site, state.identity(), np.ravel(u), float(fields["weight"]))
            msgs = client.start()
            state.data.update(ckks_spec=bytes(fields["spec"]), ckks_client=client.dump())
            return {"msgs": msgs}
        if op in ("ckks-msgs", "ckks"):
            if "ckks_client" not in state.data:
                raise ProtocolError("no CKKS round in progress on this site (restarted SuperNode?)")
            spec = decode_ckks_spec(state.data["ckks_spec"])
            client = CKKSClient.load(state.data["ckks_client"], spec, state.identity())
            out: list = []
            try:
                for data in fields.get("msgs", []):
                    out += client.receive(bytes(data))
            finally:
                if client.state in ("done", "aborted"):
                    state.data.pop("ckks_client", None)
                    state.data.pop("ckks_spec", None)
                else:
                    state.data["ckks_client"] = client.dump()
            return {"msgs": out}
        if op == "ckks-end":  # the round is over: forget the machine and the secret context it holds
            state.data.pop("ckks_client", None)
            state.data.pop("ckks_spec", None)
            return {"ended": True}
        raise ProtocolError(f"unknown CKKS operation {op!r}; expected 'ckks-start', 'ckks-msgs' or 'ckks-end'")
    except SecureFedError as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
