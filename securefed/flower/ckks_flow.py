"""CKKS secure sum over Flower: the coordinator and site halves of :mod:`securefed.securesum.ckks`.

The same :class:`~securefed.securesum.ckks.CKKSServer` / :class:`~securefed.securesum.ckks.CKKSClient`
state machines that :func:`~securefed.securesum.ckks.run_ckks_round` drives in process are driven here
over a Flower exchange (``transport.Exchange`` or any object with its ``now`` / ``request`` interface):

* :func:`server_ckks_sum` (coordinator) builds the public :class:`~securefed.securesum.ckks.CKKSRoundSpec`
  (fresh 16-byte session per sum, so no message of one sum is accepted in another), sends
  ``{"op": "ckks-start", "spec": …, "weight": …, **base}`` to the live sites, then relays the
  machines' messages stage by stage (``{"op": "ckks-msgs", "msgs": [...]}``) until the key holder — or,
  when it is silent past the ``decrypt`` deadline, the next survivor that confirmed the survivor set —
  returns the decrypted, randomised-rounded weighted sum; finally ``{"op": "ckks-end"}`` tells the
  surviving sites to drop the round's state (the non-decrypting survivors still hold the secret context).
* :func:`site_handle_ckks` (site) first checks the announced spec against the site's own floors (below),
  then computes the update, starts the client machine and feeds it the server's messages. Flower starts
  a fresh ClientApp per message, so the machine is stored between messages as bytes
  (:meth:`~securefed.securesum.ckks.CKKSClient.dump`) in ``state.data`` — including the TenSEAL
  **secret** context on key-holding sites: it stays in the site's own SuperNode state and is dropped
  on ``ckks-end``, which the coordinator sends to **every** site it started (survivor or not, silent
  or not — a site that stopped answering may still hold the context; the message waits in the
  SuperLink for its TTL), or when the machine finishes or aborts. A site whose SuperNode died lost its
  in-memory state anyway.

Trust in the identity keys (read this). The malicious-server protections of
:mod:`securefed.securesum.ckks` are signature checks against ``spec.identity_keys``, and over Flower the
**server relays those keys**: it gathers each site's Ed25519 public key at ``hello`` and hands the list
to every site inside the spec, so the server is the key directory — as for SecAgg+ over Flower. A
server that substitutes the keys of the other sites (or invents sites) can forge their signatures and
defeats the decryptor's checks. Those protections therefore assume the identity keys are authentic;
making them so (Flower node authentication, plus pinning or out-of-band comparison of the sites'
public keys) is the operator's job and is not done by this module.

Site floors (SuperNode node config, read by :func:`site_handle_ckks`; a site refuses — nothing computed,
nothing sent — any spec weaker than):

* ``ckks-min-survivors`` (default 2): ``spec.min_survivors`` must be at least this;
* ``ckks-allow-minority-quorum`` (default false): unless true, the survivor-set quorum must be a
  majority ⌊n/2⌋ + 1 of the round's n sites;
* ``ckks-allow-signature-verify`` (default false): unless true, ``spec.verify`` must be ``"recompute"``;
* under a DP plan with ``noise = "distributed"`` (the request's ``dp`` field), ``spec.min_survivors`` must
  be at least the plan's t (``min_survivors``, or all sites): the site adds only a 1/√t share of the
  noise, so a sum over fewer than t sites would be under-noised.

Run-config keys read (with ``getattr`` defaults, so older configs work): ``ckks_precision`` (1e-6),
``key_holder`` (0; if that site is not live, the lowest live site), ``ckks_min_survivors`` (0 → 2, raised
to the DP t under distributed noise; an explicit value below t is a ConfigError), ``ckks_quorum`` (0 → a
majority of all sites), ``ckks_verify`` (``"recompute"``), ``stage_timeout`` (0 →
:data:`~securefed.securesum.ckks.CKKS_TIMEOUTS`), ``out_dir`` (progress log), and the DP keys
``epsilon``, ``noise_multiplier``, ``noise``, ``min_survivors``. A sum with fewer live sites than the
spec's ``min_survivors`` or quorum aborts before any site is asked.

Clipping is never silent: each site reports how many coordinates its CKKS client clipped to the public
bound (``ckks_clipped`` in its reply), and :func:`server_ckks_sum` puts the survivors' total in
``AggregateResult.clipped`` and warns (:func:`~securefed.securesum.quantize.warn_clipped`). The counts
are self-reported by the sites.
"""

from __future__ import annotations

import json
import os
import time

import numpy as np

from ..securesum.base import AggregateResult
from ..errors import ConfigError, DecodeError, ProtocolAbortedError, ProtocolError, SecureFedError, bad_value
from ..securesum.ckks import (CKKS_STAGES, CKKS_TIMEOUTS, CKKSClient, CKKSRoundSpec, CKKSServer, choose_ckks_parameters,
                    decode_ckks_spec, encode_ckks_spec)
from ..securesum.quantize import warn_clipped

__all__ = ["server_ckks_sum", "site_handle_ckks", "ckks_round_spec", "drive_stages", "make_feed",
           "check_spec_floors", "dp_min_survivors", "CKKS_END_WAIT"]

#: Seconds the coordinator waits for ``ckks-end`` acknowledgements (the message itself stays queued in the
#: SuperLink for its TTL, so a slow site still receives it).
CKKS_END_WAIT = 10.0


def _truthy(v) -> bool:
    return str(v).strip().lower() in ("1", "true", "yes", "on")


def dp_min_survivors(plan) -> int:
    """The DP threshold t a secure sum must respect, from a public DP plan (dict or JSON); 0 if none.

    Only distributed noise needs it (papers/000 §5, distributed mode: each site adds a share
    ``w_p s_p = z·M/√t``, so the released sum carries std ≥ z·M only over at least t inputs); t is the plan's
    ``min_survivors`` or, when unset, every site of the plan.
    """
    if plan is None:
        return 0
    if isinstance(plan, (str, bytes, bytearray)):
        try:
            plan = json.loads(plan)
        except ValueError as exc:
            raise DecodeError(f"malformed DP plan in the request: {exc}") from None
    if not isinstance(plan, dict):
        raise DecodeError("malformed DP plan in the request: not a JSON object")
    if plan.get("noise") != "distributed":
        return 0
    try:
        return int(plan.get("min_survivors") or len(plan["sizes"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise DecodeError(f"malformed DP plan in the request: {exc}") from None


def _node_min_survivors(node_config: dict) -> int:
    raw = node_config.get("ckks-min-survivors", 2)
    try:
        v = int(raw)
        ok = v >= 1 and float(raw) == v
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise ConfigError(bad_value("node config ckks-min-survivors", raw, "use a positive integer, e.g. 2 (the "
                                    "fewest sites a decrypted CKKS sum may cover)"))
    return v


def check_spec_floors(spec: CKKSRoundSpec, node_config: dict | None = None, dp_plan=None) -> None:
    """Refuse a server-announced CKKS spec weaker than this site's floors (:class:`ProtocolError`).

    Parameters
    ----------
    spec : CKKSRoundSpec
        As decoded from the server's ``ckks-start``.
    node_config : dict, optional
        The SuperNode's node config: ``ckks-min-survivors`` (default 2), ``ckks-allow-minority-quorum``
        (default false), ``ckks-allow-signature-verify`` (default false). See the module docstring.
    dp_plan : dict or str, optional
        The request's public DP plan; under distributed noise ``spec.min_survivors`` must be ≥ its t.

    Raises
    ------
    ProtocolError
        Naming the violated floor and the node-config key that would relax it.
    ConfigError
        A malformed ``ckks-min-survivors``.
    """
    nc = dict(node_config or {})
    floor = _node_min_survivors(nc)
    if spec.min_survivors < floor:
        raise ProtocolError(f"the server's CKKS round lets a sum over min_survivors = {spec.min_survivors} site(s) be "
                            f"decrypted, below this site's floor ckks-min-survivors = {floor} (a smaller sum could "
                            "expose this site's update); refusing. To accept, lower ckks-min-survivors in this "
                            "SuperNode's node config")
    majority = spec.n_clients // 2 + 1
    if spec.signatures_needed < majority and not _truthy(nc.get("ckks-allow-minority-quorum", False)):
        raise ProtocolError(f"the server's CKKS round needs only quorum = {spec.signatures_needed} survivor-set "
                            f"signatures of {spec.n_clients} sites, below a majority ({majority}): a malicious server "
                            "could get two survivor sets decrypted and difference them; refusing. To accept, set "
                            "ckks-allow-minority-quorum=true in this SuperNode's node config")
    if spec.verify != "recompute" and not _truthy(nc.get("ckks-allow-signature-verify", False)):
        raise ProtocolError(f"the server's CKKS round uses verify = {spec.verify!r}: the decryptor would decrypt the "
                            "server's claimed sum unchecked (a malicious server could substitute one site's upload); "
                            "refusing. To accept, set ckks-allow-signature-verify=true in this SuperNode's node config")
    t = dp_min_survivors(dp_plan)
    if spec.min_survivors < t:
        raise ProtocolError(f"the request's DP plan uses distributed noise with t = {t} (each site adds a 1/sqrt(t) "
                            f"share), but the CKKS round decrypts sums over min_survivors = {spec.min_survivors} < t "
                            "sites, which would carry too little noise; refusing. The server must run with "
                            f"ckks-min-survivors >= {t}")


def _log(cfg, event: str, **kw) -> None:
    out = getattr(cfg, "out_dir", None)
    if not out:
        return
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "progress.jsonl"), "a") as fh:
        fh.write(json.dumps({"t": time.time(), "event": event, **kw}) + "\n")


def _cfg_dp_t(cfg, n: int) -> int:
    """The DP t of the run config (``min_survivors``, 0 → all n sites) under distributed noise, else 0."""
    dp_on = float(getattr(cfg, "epsilon", 0.0) or 0.0) > 0 or float(getattr(cfg, "noise_multiplier", 0.0) or 0.0) > 0
    if not dp_on or str(getattr(cfg, "noise", "local")) != "distributed":
        return 0
    return int(getattr(cfg, "min_survivors", 0) or 0) or n


def ckks_round_spec(cfg, sites, w, length: int, clip) -> CKKSRoundSpec:
    """The public CKKS round parameters for the live ``sites`` (fresh session id from ``os.urandom``).

    ``min_survivors`` is ``cfg.ckks_min_survivors`` (0 → 2), at least the DP t under distributed noise
    (``cfg.min_survivors``, 0 → all sites): :class:`ConfigError` if set explicitly below t.
    """
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
    min_surv = int(getattr(cfg, "ckks_min_survivors", 0) or 0)
    t = _cfg_dp_t(cfg, n)
    if min_surv and min_surv < t:
        raise ConfigError(bad_value("ckks-min-survivors", min_surv, f"distributed DP noise assumes no sum over fewer "
                                    f"than t = {t} sites is revealed (each site adds a 1/sqrt(t) share): use "
                                    f"ckks-min-survivors >= {t}, or 0 for the default"))
    min_surv = max(min_surv or 2, t)
    if len(live) < min_surv:
        raise ProtocolAbortedError(f"only {len(live)} live site(s); a CKKS sum is decrypted only over at least "
                                   f"min_survivors = {min_surv} sites (ckks-min-survivors"
                                   f"{f', raised to the DP t = {t}' if t > 2 else ''}; set it to 1 to release single "
                                   "updates)")
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
        Reads ``ckks_precision``, ``key_holder``, ``ckks_min_survivors``, ``ckks_quorum``, ``ckks_verify``,
        ``stage_timeout``, ``out_dir`` and the DP keys ``epsilon``, ``noise_multiplier``, ``noise``,
        ``min_survivors`` (all optional; see the module docstring).
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
        ``total`` = Σ_{survivors} w_p·clip(u_p), randomised-rounded to the stated step; ``clipped`` = the
        survivors' reported count of clipped coordinates (warned, :class:`ClippingWarning`).
    """
    base = dict(base)
    shape = tuple(int(s) for s in base.pop("out_shape"))
    length = int(np.prod(shape))
    w = np.asarray(w, dtype=float)
    spec = ckks_round_spec(cfg, sites, w, length, clip)
    server = CKKSServer(spec, ex.now())
    rejected: list = []
    outgoing: list = []
    clipped: dict = {}
    feed = make_feed(ex, server, outgoing, rejected, clipped)
    sb = encode_ckks_spec(spec)
    started = sorted(sites.live)
    payloads = {i: dict(base, op="ckks-start", site=i, spec=sb, weight=float(w[i])) for i in started}
    try:
        drive_stages(ex, server, payloads, outgoing, feed, "ckks-msgs",
                     on_stage=lambda st: _log(cfg, "stage", label=label, stage=st, protocol="ckks"))
    finally:
        # done or aborted: every started site drops the round's state. The key holder handed the secret
        # context to every site that advertised a key, and any of them — survivor or not, answering or
        # silent (a slow site may still process its handoff) — may hold it; so all of them are told.
        ex.request({i: {"op": "ckks-end"} for i in started}, ex.now() + min(spec.timeout("advertise"), CKKS_END_WAIT))
    for i in range(len(sites.names)):
        if i not in server.survivors:
            sites.live.discard(i)
    surv = tuple(int(i) for i in server.survivors)
    n_clipped = int(sum(clipped.get(i, 0) for i in surv))
    warn_clipped(n_clipped, float(clip), "server_ckks_sum")
    p = spec.params
    return AggregateResult(
        server.result.reshape(shape), surv, float(w[list(surv)].sum()), "ckks", n_clipped,
        int(np.mean([server.bytes_in.get(i, 0) for i in surv])), int(sum(server.bytes_in.values())),
        time.perf_counter() - t0,
        {"params": p.as_dict(), "precision": p.step, "key_holder": spec.key_holder, "decryptor": server.decryptor,
         "min_survivors": spec.min_survivors, "quorum": spec.signatures_needed, "verify": spec.verify,
         "clipped_per_site": {int(i): int(clipped.get(i, 0)) for i in surv},
         "dropped_at": {k: list(v) for k, v in server.dropped_at.items()}, "rejected": rejected,
         "server_sum_seconds": server.sum_seconds, "bytes_to_sites": int(sum(server.bytes_out.values()))})


def make_feed(ex, server, outgoing: list, rejected: list, clipped: dict | None = None):
    """The ``on_reply`` callback of :func:`drive_stages`: a site's messages into ``server``.

    A site's ``{"error": ...}`` is recorded in ``ex.silent``; a message the machine rejects is listed in
    ``rejected`` (the round goes on); an error that aborts the machine propagates. With a ``clipped``
    dict, a reply's ``ckks_clipped`` (the site's count of clipped coordinates) is stored under its id.
    """

    def feed(cid, fields):
        if "error" in fields:
            ex.silent[cid] = str(fields["error"])
            return
        if clipped is not None and "ckks_clipped" in fields:
            try:
                clipped[cid] = max(0, int(fields["ckks_clipped"]))
            except (TypeError, ValueError):
                rejected.append(f"site {cid}: malformed ckks_clipped {fields['ckks_clipped']!r}")
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


def site_handle_ckks(fields: dict, X, state, compute_update, node_config: dict | None = None) -> dict:
    """Site side of a CKKS sum: ops ``ckks-start``, ``ckks-msgs`` and ``ckks-end``; returns the reply fields.

    Every op name starts with ``ckks-``, so a site dispatcher can route on that prefix (``ckks`` is
    accepted as an alias of ``ckks-msgs``).

    On ``ckks-start`` the announced spec is checked first against the site's floors
    (:func:`check_spec_floors` with ``node_config`` — the SuperNode's node config, None → the defaults —
    and the request's DP plan ``fields["dp"]``); a weaker spec is refused before the update is computed.
    The identity keys inside the spec are taken as relayed by the server (module docstring: authentic
    keys are the operator's job). The reply that carries this site's upload also carries
    ``ckks_clipped``, the number of coordinates its client clipped to ``[−clip, clip]``.

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
            check_spec_floors(spec, node_config, fields.get("dp"))
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
            before = client.state
            try:
                for data in fields.get("msgs", []):
                    out += client.receive(bytes(data))
            finally:
                if client.state in ("done", "aborted"):
                    state.data.pop("ckks_client", None)
                    state.data.pop("ckks_spec", None)
                else:
                    state.data["ckks_client"] = client.dump()
            if before in ("advertised", "keyed") and client.state in ("uploaded", "confirmed", "done"):
                return {"msgs": out, "ckks_clipped": int(client.clipped)}  # this reply carries the upload
            return {"msgs": out}
        if op == "ckks-end":  # the round is over: forget the machine and the secret context it holds
            state.data.pop("ckks_client", None)
            state.data.pop("ckks_spec", None)
            return {"ended": True}
        raise ProtocolError(f"unknown CKKS operation {op!r}; expected 'ckks-start', 'ckks-msgs' or 'ckks-end'")
    except SecureFedError as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
