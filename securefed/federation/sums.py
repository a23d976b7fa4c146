"""The secure sums of a federated run, coordinator and site halves: plain, SecAgg+ and CKKS.

Every sum the coordinator needs (γ statistic and moments, landmark updates, cell counts and sums, the billboard, audit counts) is
one call ``total = yield from secure_sum(co, task, label, clip)`` inside the coordinator's job
(:mod:`.coordinator`): it yields :class:`~.coordinator.Request` steps to the sites and returns an
:class:`~securefed.securesum.base.AggregateResult`. The protocol state machines are those of
:mod:`securefed.securesum` (sans-I/O); this module only relays their messages between the coordinator and
the sites, stage by stage, closing each stage when every live site answered or at its deadline.

* ``plain``: each site returns its upload in the clear with its own weight; the coordinator sums.
* ``secagg``: the real :class:`~securefed.securesum.secagg.SecAggServer` and each site's
  :class:`~securefed.securesum.secagg.SecAggClient` (stored between messages on the site).
* ``ckks``: :class:`~securefed.securesum.ckks.CKKSServer` / :class:`~securefed.securesum.ckks.CKKSClient`;
  ``ckks-end`` tells every started site to drop the round's secret context.

Weights: a site weighs its own upload by the public rule in the task (its record count, or 1) and refuses a
request that carries a weight of the server's choosing; the coordinator only learns the weighted total and
divides by the public total weight of the survivors.

The relay checks sender identities: a message whose sender field names another site than the one whose reply
carried it is dropped (recorded in ``rejected``), so no site can speak for another (:func:`relay`).

Site floors (site options; a weaker spec is refused before anything is computed;
:mod:`securefed.securesum.threat`): SecAgg+ ``secagg-max-colluders``, ``secagg-min-threshold``,
``secagg-complete-up-to``, ``secagg-security-bits``, ``secagg-min-survivors``, ``dp-colluders``; CKKS
``ckks-min-survivors`` (default 2), ``ckks-allow-minority-quorum`` and ``ckks-allow-signature-verify`` (default
false), ``ckks-flood-bits`` (40), ``ckks-max-fallbacks`` (1), and under distributed DP noise
``min_survivors ≥ t`` (:func:`check_spec_floors`). docs/threat-model-secure-sum.md states the threat model.
"""

from __future__ import annotations

import json
import os
import time
import typing
from dataclasses import dataclass

import numpy as np

from ..errors import ConfigError, DecodeError, ProtocolAbortedError, ProtocolError, bad_value
from ..securesum.base import AggregateResult
from ..securesum.messages import sender_of
from ..securesum.quantize import dequantize, plan_fixed_point, warn_clipped
from .messages import (
    CkksEnd,
    ProtocolMessages,
    ProtocolReply,
    SecAggSetup,
    SumRequest,
    UploadReply,
    decode_reply,
    decode_request,
    encode,
    upload_digest,
)

__all__ = [
    "secure_sum",
    "relay",
    "check_spec_floors",
    "dp_min_survivors",
    "site_handle_ckks",
    "refuse_server_weight",
    "CKKS_END_WAIT",
]

#: Seconds the coordinator waits for ``ckks-end`` acknowledgements.
CKKS_END_WAIT = 10.0


def secure_sum(
    co,
    task,
    label: str,
    clip: float | None,
    weights: str | None = None,
    tap=None,
    integer_bits: int | None = None,
    *,
    out_shape,
    scales=None,
    binding: dict | None = None,
):
    """One federated weighted sum of the live sites' uploads for ``task`` (generator; returns AggregateResult).

    ``task`` is the typed task (:data:`securefed.federation.messages.TASKS`) and ``out_shape`` the shape of the
    upload; ``weights`` is the public weight rule (default: the plan's ``weights``); ``clip`` the public bound on
    |coordinate| (SecAgg+ / CKKS quantise into it); ``scales = [(length, bound), …]`` the upload's parts, each
    divided by its public bound on the site (``scale_lengths`` / ``scale_bounds``); ``tap(site, reply)`` sees each
    site's reply to the request that carried its upload (DP ledger mirror). ``integer_bits``: the uploads are
    already integers mod ``2^integer_bits`` (weighted by their encoder): a SecAgg+ round with integer input, whose
    ``total`` is the sum's raw words mod ``2^integer_bits`` (SecAgg+ only). ``binding``: what each site derives
    itself for this sum (the cells' query), bound into the task digest with the request's fields.
    """
    t0 = time.perf_counter()
    rule = weights or co.plan.weights
    live = sorted(co.sites.live)
    head: dict[str, typing.Any] = {
        "weights": rule,
        "seed": int(co.plan.seed),
        "audit_holdout": float(co.plan.audit_holdout),
    }
    if scales is not None:
        head.update(scale_lengths=[int(k) for k, _ in scales], scale_bounds=[float(b) for _, b in scales])

    def request(op: str, site: int, spec: bytes | None = None, probe: bool = False, **transport) -> dict:
        """The request of ``site``; the first one a site receives for this sum carries the proof of its previous
        SecAgg+ sum (``probe``: the fields alone, for the task digest)."""
        proof = None if probe else co._proofs.pop(int(site), None)
        if proof is not None:
            transport.update(proof_round=proof[0], proof=proof[1])
        return encode(SumRequest(op=op, site=int(site), task=task, spec=spec, **head, **transport))

    shape = tuple(int(v) for v in out_shape)
    co.emit("aggregate", label=label, protocol=co.plan.aggregation, live=live)
    before = co.traffic()
    if co.plan.aggregation == "plain":
        agg = yield from _plain(co, request, shape, rule, label, tap)
    elif co.plan.aggregation == "secagg":
        agg = yield from _secagg(co, request, shape, rule, label, clip, tap, integer_bits, binding)
    elif integer_bits is not None:
        raise ConfigError(
            bad_value(
                co.plan.name("aggregation"),
                co.plan.aggregation,
                "integer uploads need an exact modular sum: use secagg",
            )
        )
    else:
        agg = yield from _ckks(co, request, shape, rule, label, clip, tap)
    co.record_sum(label, agg, before, time.perf_counter() - t0)
    if co.plan.aggregation == "secagg" and not co._clip_counts_named and integer_bits is None:
        co._clip_counts_named = True
        co.release(
            "each site's count of the coordinates of its upload it clipped to the sum's public range, per SecAgg+ "
            "sum, in the clear",
            note="a count per site and sum (0 when the bounds hold), not a value of any record",
        )
    return agg


def _plain(co, request, shape: tuple, rule: str, label: str, tap):
    live = sorted(co.sites.live)
    replies = yield from co.ask({i: request("plain", i) for i in live}, co.plan.request_timeout, tap=tap)
    surv = [i for i in live if i in replies]
    for i in live:
        if i not in surv:
            co.sites.drop(i)
    if not surv:
        raise ProtocolAbortedError(f"{label}: no site returned its update ({co.sites.silent})")
    total = np.zeros(shape)
    for i in surv:
        rep = decode_reply(UploadReply, replies[i])
        if rep.update.shape != shape:
            raise DecodeError(
                f"{label}: site {co.sites.names[i]} sent an update of shape {rep.update.shape}, expected {shape}"
            )
        total += float(rep.weight) * rep.update
    return AggregateResult(total, tuple(surv), co.sites.weight_total(surv, rule), "plain")


#: SecAgg+ rounds set up together (advertise and share for all of them in two round trips) before their inputs exist
PREPARED_ROUNDS = 8


@dataclass
class PreparedRound:
    """A SecAgg+ round whose advertise and share stages are done (the late-bound schedule): its server waits for the
    input part; ``forwarded`` holds each site's ForwardedShares, delivered with that site's input request."""

    server: object
    setup: object
    forwarded: dict


def _prepare_rounds(co, count: int):
    """Set up ``count`` SecAgg+ rounds at once — fresh keys for each — before their inputs are known (generator):
    one request carries every setup part, the advertise and share stages of all of them ride on the same two round
    trips; the forwarded shares wait for each round's input request. Returns the prepared rounds."""
    from ..securesum.messages import peek_header
    from ..securesum.secagg import SetupSpec, encode_setup
    from ..securesum.secagg_server import SecAggServer

    n = len(co.sites.names)
    sec = co.secagg_session()
    gp = sec.graph_parameters(n)
    setups = []
    for _ in range(count):
        setups.append(
            SetupSpec(
                sec.session_id,
                sec._counter[0],
                n,
                gp.degree,
                gp.threshold,
                sec.session_id,
                tuple(co.sites.identities),
                tuple(sec.timeouts.items()),
                gp.quorum,
            )
        )
        sec._counter[0] += 1
    servers = {sp.round_index: SecAggServer(sp, co.now) for sp in setups}
    blobs = [encode_setup(sp) for sp in setups]
    live = sorted(co.sites.live)
    payloads = {
        i: encode(SecAggSetup(site=i, setups=blobs, seed=int(co.plan.seed), audit_holdout=float(co.plan.audit_holdout)))
        for i in live
    }
    co.emit("stage", label=f"prepare {count} secure sums", stage="advertise", protocol="secagg")
    forwarded: dict = {r: {} for r in servers}
    while True:
        deadline = min(sv.deadline for sv in servers.values() if sv.stage not in ("ready", "done", "aborted"))
        replies = yield from co.ask(payloads, deadline - co.now)
        before = {rnd: sv.stage for rnd, sv in servers.items()}
        outgoing: dict = {}
        for i, fields in sorted(replies.items()):
            for data in fields.get("msgs", []) if isinstance(fields.get("msgs", []), list) else []:
                if not isinstance(data, (bytes, bytearray)) or sender_of(data) != i:
                    continue
                try:
                    rnd = peek_header(bytes(data))[2]
                except Exception:  # a malformed header: the machines never see it
                    continue
                if rnd in servers:
                    outgoing.setdefault(rnd, []).extend(servers[rnd].receive(bytes(data), co.now))
        for rnd, sv in servers.items():
            if sv.stage in ("advertise", "share") and sv.stage == before[rnd]:  # every site answered, or the deadline
                outgoing.setdefault(rnd, []).extend(sv.tick(max(co.now, sv.deadline)))
        by_site: dict = {}
        for rnd, out in outgoing.items():
            for rid, data in out:
                if servers[rnd].stage == "ready":
                    forwarded[rnd].setdefault(rid, []).append(data)  # delivered with the input request
                else:
                    by_site.setdefault(rid, []).append(data)
        if all(sv.stage == "ready" for sv in servers.values()):
            break
        if not by_site:
            raise ProtocolAbortedError(
                f"secagg: preparing {count} rounds, stage {[sv.stage for sv in servers.values()]} has nobody to ask"
            )
        payloads = {rid: encode(ProtocolMessages("secagg", msgs)) for rid, msgs in by_site.items()}
    return [PreparedRound(servers[sp.round_index], sp, forwarded[sp.round_index]) for sp in setups]


def _secagg(
    co,
    request,
    shape: tuple,
    rule: str,
    label: str,
    clip,
    tap,
    integer_bits: int | None = None,
    binding: dict | None = None,
):
    """One SecAgg+ sum in the late-bound schedule: a prepared round (set up in a batch, :func:`_prepare_rounds`), its
    input part bound to the task digest every site recomputes, three round trips (masked input with the forwarded
    shares and the previous sum's proof, consistency, unmask); the proof of this sum is kept for the next request
    each survivor receives."""
    from ..securesum.quantize import integer_plan
    from ..securesum.secagg import InputSpec, encode_input

    n = len(co.sites.names)
    if not co._prepared:
        co._prepared = yield from _prepare_rounds(co, PREPARED_ROUNDS)
    pr = co._prepared.pop(0)
    server = pr.server
    w = co.sites.weights(rule)
    integer = integer_bits is not None
    sec = co.secagg_session()
    if integer:  # the encoder weighted, clipped and rounded: a plain modular sum of words
        fp = integer_plan(int(integer_bits), n)
    else:
        fp = plan_fixed_point(float(clip), w, modulus_bits=sec.modulus_bits, fractional_bits=sec.fractional_bits)
    probe = request("secagg-input", 0, probe=True)
    digest = upload_digest(decode_request(probe), binding)
    inp = InputSpec(int(np.prod(shape)), fp, integer, digest)
    server.open_input(inp, co.now)
    ib = encode_input(inp)
    live = sorted(co.sites.live)
    payloads = {
        i: request("secagg-input", i, ib, round_index=pr.setup.round_index, msgs=pr.forwarded.get(i, [])) for i in live
    }
    rejected: list = []
    clipped: dict = {}
    yield from relay(co, server, payloads, "secagg", label, rejected, clipped, "secagg_clipped", tap)
    for i in range(n):
        if i not in server.survivors:
            co.sites.drop(i, "not among the SecAgg+ survivors")
    surv = tuple(int(i) for i in server.survivors)
    co._proofs = {i: (pr.setup.round_index, server.proof()) for i in surv}
    server.forget()
    n_clipped = int(sum(clipped.get(i, 0) for i in surv))
    if integer:
        if clipped:
            rejected.append(f"sites {sorted(clipped)} sent a clip count in an integer round (ignored)")
        total = server.result.reshape(shape)
    else:
        warn_clipped(n_clipped, float(clip), f"SecAgg+ sum '{label}'")
        total = dequantize(server.result, fp).reshape(shape)
    spec = server.spec
    return AggregateResult(
        total,
        surv,
        co.sites.weight_total(surv, rule),
        "secagg",
        n_clipped,
        int(np.mean([server.bytes_in.get(i, 0) for i in surv])),
        int(sum(server.bytes_in.values())),
        0.0,
        {
            "degree": spec.degree,
            "threshold": spec.threshold,
            "quorum": spec.signatures_needed,
            "fixed_point": fp.as_dict(),
            "dropped_at": {k: list(v) for k, v in server.dropped_at.items()},
            "rejected": rejected,
            "schedule": "late",
            "task_digest": digest.hex(),
            "blame": list(getattr(server, "blame", ())),
            "suspects": list(getattr(server, "suspects", ())),
        },
    )


def relay(co, server, payloads: dict, op: str, label: str, rejected: list, clipped: dict, clip_key: str, tap=None):
    """Relay a sans-I/O server machine's messages to the sites stage by stage until it is done (generator).

    Works for any :class:`~securefed.securesum.machine.StageServer` (``SecAggServer``, ``CKKSServer``); ``tap``
    sees the replies to the first request (the one that carries each site's upload). A site's refusal is
    recorded and the site treated as silent; a message whose sender field is not the site whose reply carried
    it is dropped here (a site cannot speak for another); a message the machine refuses is listed in
    ``rejected`` (the round goes on); an error that aborts the machine propagates (typed, "nothing revealed").
    """
    msg_op = "secagg" if op == "secagg" else "ckks-msgs"
    while True:
        stage = server.stage
        co.emit("stage", label=label, stage=stage, protocol=op)
        replies = yield from co.ask(payloads, server.deadline - co.now, tap=tap)
        tap = None
        outgoing: list = []
        for i, fields in sorted(replies.items()):
            if clip_key in fields:
                try:
                    clipped[i] = max(clipped.get(i, 0), int(fields[clip_key]))
                except (TypeError, ValueError):
                    rejected.append(f"site {i}: malformed {clip_key}")
            msgs = fields.get("msgs", [])
            if not isinstance(msgs, (list, tuple)):
                rejected.append(f"site {i}: malformed msgs")
                continue
            for data in msgs:
                if not isinstance(data, (bytes, bytearray, memoryview)) or sender_of(data) != i:
                    rejected.append(f"site {i}: a message that does not name site {i} as its sender; dropped")
                    continue
                before = len(server.rejected)
                try:
                    outgoing += server.receive(bytes(data), co.now)  # raises only when the round is aborted
                finally:
                    rejected.extend(f"site {i}: {type(e).__name__}: {e}" for _, e in server.rejected[before:])
        if server.stage == stage and not server.done:
            outgoing += server.tick(max(co.now, server.deadline))  # every asked site answered or the deadline passed
        if server.done:
            return
        by_site: dict = {}
        for rid, data in outgoing:
            by_site.setdefault(rid, []).append(data)
        payloads = {rid: encode(ProtocolMessages(msg_op, msgs)) for rid, msgs in by_site.items()}
        if not payloads:
            raise ProtocolAbortedError(f"{op}: stage {server.stage!r} has nobody to ask")


def _ckks(co, request, shape: tuple, rule: str, label: str, clip, tap):
    from ..securesum.ckks import CKKSServer, encode_ckks_spec

    w = co.sites.weights(rule)
    spec = ckks_round_spec(
        co,
        w,
        int(np.prod(shape)),
        clip,
        task_digest=upload_digest(decode_request(request("ckks-start", 0, probe=True))),
    )
    server = CKKSServer(spec, co.now)
    sb = encode_ckks_spec(spec)
    started = sorted(co.sites.live)
    payloads = {i: request("ckks-start", i, sb) for i in started}
    rejected: list = []
    clipped: dict = {}
    try:
        yield from relay(co, server, payloads, "ckks", label, rejected, clipped, "ckks_clipped", tap)
    finally:
        # done or aborted: every started site drops the round's state (the key holder and the fallback
        # decryptors hold the secret context, the others a public one) — survivor or not, answering or silent.
        yield from co.ask(
            {i: encode(CkksEnd()) for i in started}, min(spec.timeout("advertise"), CKKS_END_WAIT), record_silence=False
        )
    for i in range(len(co.sites.names)):
        if i not in server.survivors:
            co.sites.drop(i, "not among the CKKS survivors")
    surv = tuple(int(i) for i in server.survivors)
    n_clipped = int(sum(clipped.get(i, 0) for i in surv))
    warn_clipped(n_clipped, float(clip), f"CKKS sum '{label}'")
    p = spec.params
    return AggregateResult(
        server.result.reshape(shape),
        surv,
        co.sites.weight_total(surv, rule),
        "ckks",
        n_clipped,
        int(np.mean([server.bytes_in.get(i, 0) for i in surv])),
        int(sum(server.bytes_in.values())),
        0.0,
        {
            "params": p.as_dict(),
            "precision": p.step,
            "key_holder": spec.key_holder,
            "fallbacks": list(spec.fallbacks),
            "decryptor": server.decryptor,
            "flood_bits": spec.flood_bits,
            "flood_sigma": spec.flood_sigma,
            "error_bound": spec.release_bound,
            "min_survivors": spec.min_survivors,
            "quorum": spec.signatures_needed,
            "verify": spec.verify,
            "dropped_at": {k: list(v) for k, v in server.dropped_at.items()},
            "rejected": rejected,
            "blame": list(server.blame),
        },
    )


def ckks_round_spec(co, w, length: int, clip, task_digest: bytes | None = None):
    """The public CKKS round parameters for the live sites (fresh session id from ``os.urandom``).

    ``min_survivors`` is the plan's ``ckks_min_survivors`` (unset → 2), at least the DP t under distributed noise
    (:class:`ConfigError` if set explicitly below t). The secret key goes to the key holder and one fallback
    decryptor (the next live site), nobody else; ``max_abs_sum`` is Σ live weights × clip (the range check).
    """
    from ..securesum.ckks import CKKS_STAGES, CKKS_TIMEOUTS, FLOOD_BITS, CKKSRoundSpec, choose_ckks_parameters

    plan, sites = co.plan, co.sites
    n = len(sites.names)
    live = sorted(sites.live)
    if not live:
        raise ProtocolAbortedError("no live site to run a CKKS sum with")
    kh = plan.key_holder
    if not 0 <= kh < n:
        raise ConfigError(bad_value(plan.name("key_holder"), kh, f"use a site index in [0, {n})"))
    if kh not in sites.live:
        kh = live[0]
    t = (plan.min_survivors or n) if (plan.dp and plan.noise == "distributed") else 0
    min_surv = plan.ckks_min_survivors
    if min_surv and min_surv < t:
        raise ConfigError(
            bad_value(
                plan.name("ckks_min_survivors"),
                min_surv,
                f"distributed DP noise assumes no sum over "
                f"fewer than t = {t} sites is revealed (each site adds a 1/sqrt(t) share): use at "
                f"least {t}, or leave it unset",
            )
        )
    min_surv = max(min_surv or 2, t)
    if len(live) < min_surv:
        raise ProtocolAbortedError(
            f"only {len(live)} live site(s); a CKKS sum is decrypted only over at least "
            f"min_survivors = {min_surv} sites"
        )
    tmo = {s: plan.stage_timeout for s in CKKS_STAGES} if plan.stage_timeout else dict(CKKS_TIMEOUTS)
    wl = np.asarray(w, dtype=float)[live]
    M = max(float(wl.sum()) * float(clip), float(clip))
    n_fb = getattr(plan, "ckks_fallbacks", None)  # a plan option (when the plan offers it); default one fallback
    n_fb = 1 if n_fb is None else int(n_fb)
    fallbacks = tuple(i for i in live if i != kh)[:n_fb]
    params = choose_ckks_parameters(length, plan.ckks_precision, M, len(live), FLOOD_BITS, 1 + len(fallbacks))
    spec = CKKSRoundSpec(
        os.urandom(16),
        0,
        n,
        kh,
        params,
        float(clip),
        tuple(sites.identities),
        min_surv,
        plan.ckks_verify,
        tuple(tmo.items()),
        int(plan.ckks_quorum or 0),
        M,
        FLOOD_BITS,
        fallbacks,
        **({} if task_digest is None else {"task_digest": task_digest}),
    )
    if len(live) < spec.signatures_needed:
        raise ProtocolAbortedError(
            f"only {len(live)} of {n} sites are live; a CKKS sum is decrypted only when "
            f"{spec.signatures_needed} sites confirm the survivor set (a majority of all sites "
            "unless ckks-quorum is set lower)"
        )
    return spec


# ============================================================================================ site half


def request_dp_plan(task):
    """The public DP plan a task carries (FedDL's ``dp`` or the billboard's ``billboard``), or None (``task``: a typed
    task or the flat dict of one)."""
    if isinstance(task, dict):
        return task.get("dp") or task.get("billboard")
    return getattr(task, "dp", None) or getattr(task, "billboard", None)


def dp_min_survivors(plan) -> int:
    """The DP threshold t a secure sum must respect, from a public DP plan (dict or JSON); 0 if none.

    Only distributed noise needs it (Qiao et al. §5, distributed mode: each site adds a share
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
        return int(plan.get("min_survivors") or plan.get("t") or len(plan["sizes"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise DecodeError(f"malformed DP plan in the request: {exc}") from None


def check_spec_floors(spec, node_config: dict | None = None, dp_plan=None, weight: float | None = None) -> None:
    """Refuse a server-announced CKKS spec weaker than this site's floors (:class:`ProtocolError`).

    Parameters
    ----------
    spec : CKKSRoundSpec
        As decoded from the server's ``ckks-start``.
    node_config : dict, optional
        The SuperNode's node config: ``ckks-min-survivors`` (default 2), ``ckks-allow-minority-quorum``
        (default false), ``ckks-allow-signature-verify`` (default false), ``ckks-flood-bits`` (40),
        ``ckks-max-fallbacks`` (1); :func:`securefed.securesum.threat.check_ckks_spec`.
    dp_plan : dict or str, optional
        The request's public DP plan; under distributed noise ``spec.min_survivors`` must be ≥ its t.
    weight : float, optional
        This site's own weight; its clipped contribution must fit the spec's bound on |sum|.

    Raises
    ------
    ProtocolError
        Naming the violated floor and the node-config key that would relax it.
    ConfigError
        A malformed site option.
    """
    from ..securesum.threat import check_ckks_spec

    check_ckks_spec(spec, node_config, dp_min_survivors(dp_plan), weight=weight)


def refuse_server_weight(fields: dict) -> None:
    """A site's weight comes from its own data by the public rule in the request — never from the server: a
    request carrying a ``weight`` field (e.g. 0 for every site but a victim, which would make the "sum" the
    victim's update) is refused."""
    if "weight" in fields:
        raise ProtocolError(
            f"the request carries weight={fields['weight']!r}: a site weighs its upload itself by the "
            "public rule ('weights': 'records' or 'uniform') and never takes a weight from the server; "
            "refusing"
        )


def site_handle_ckks(req, worker, upload) -> dict:
    """Site side of a CKKS sum: a ``ckks-start`` :class:`~.messages.SumRequest`, ``ckks-msgs``
    (:class:`~.messages.ProtocolMessages`) or ``ckks-end`` (:class:`~.messages.CkksEnd`); returns the reply fields.

    On ``ckks-start`` the announced spec is checked first against the site's floors (:func:`check_spec_floors`
    with the site's options, the request's DP plan and the site's own weight); a weaker spec, or a request that
    carries a weight of the server's choosing, is refused before the update is computed. The identity keys
    inside the spec are taken as relayed by the server (authentic keys are the operator's job: node
    authentication and out-of-band comparison). The reply that carries this site's upload also carries
    ``ckks_clipped``, the number of coordinates its client clipped to ``[−clip, clip]``.

    ``worker`` is the :class:`~.site.SiteWorker` (its ``state`` dict keeps the client machine between messages,
    removed when the machine is done or aborted, or on ``ckks-end``; its ``weight(req)`` is the site's own
    weight); ``upload(req)`` returns the site's ``(update, weight)``. Errors propagate to the worker, which
    returns them as ``{"error": ...}``.
    """
    from ..securesum.ckks import CKKSClient, decode_ckks_spec

    state = worker.state
    if isinstance(req, SumRequest):
        if req.spec is None:
            raise DecodeError("malformed 'ckks-start' message: missing field 'spec'")
        spec = decode_ckks_spec(req.spec)
        worker.check_digest(spec.task_digest, req, worker._cells_binding(req))
        check_spec_floors(spec, worker.options, request_dp_plan(req.task), worker.weight(req))
        u, weight = upload(req)
        client = CKKSClient(spec, int(req.site), worker.identity(), np.ravel(u), float(weight))
        msgs = client.start()
        state.update(ckks_spec=bytes(req.spec), ckks_client=client.dump())
        return encode(ProtocolReply(msgs))
    if isinstance(req, ProtocolMessages):
        if "ckks_client" not in state:
            raise ProtocolError("no CKKS round in progress on this site (restarted?)")
        spec = decode_ckks_spec(state["ckks_spec"])
        client = CKKSClient.load(state["ckks_client"], spec, worker.identity())
        out: list = []
        before = client.state
        try:
            for data in req.msgs:
                out += client.receive(bytes(data))
        finally:
            if client.state in ("done", "aborted"):
                state.pop("ckks_client", None)
                state.pop("ckks_spec", None)
            else:
                state["ckks_client"] = client.dump()
        if before in ("advertised", "keyed") and client.state in ("uploaded", "confirmed", "done"):
            return encode(ProtocolReply(out, ckks_clipped=int(client.clipped)))  # this reply carries the upload
        return encode(ProtocolReply(out))
    # ckks-end: the round is over: forget the machine and the secret context it holds
    state.pop("ckks_client", None)
    state.pop("ckks_spec", None)
    return encode(ProtocolReply(ended=True))
