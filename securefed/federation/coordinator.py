"""The one coordinator of a federated job, sans-I/O: it takes site replies and returns requests.

:class:`Coordinator` runs the whole job for a :class:`~securefed.plan.RunPlan` — ``hello``, the statistics for
the landmarks (cells, the DP billboard, or the FedDL rounds of Qiao et al. Algorithm 1), the
membership-audit gate and the embedding stage (Algorithms 2–3, or the no-rows placement) — and never sleeps,
opens a socket or a file. Two drivers move its requests: the in-memory exchange (:mod:`.inprocess`, what the
estimators and ``securefed run`` use) and Flower (:mod:`securefed.flower.server_app`). The site side is one
object too (:class:`~.site.SiteWorker`).

Driving it::

    co = Coordinator(plan)
    step = co.start(addresses)              # the sites' transport addresses (Flower node ids, ...)
    while step is not None:
        if isinstance(step, ListNodes):     # re-admission of restarted sites: which addresses exist now?
            reply = transport.addresses()
        else:                               # Request: {address: fields} until step.deadline (driver clock)
            reply = transport.request(step.payloads, step.deadline)   # {address: reply fields}
        step = co.receive(reply, transport.now())
    result = co.result                      # RunResult

A site that does not answer by the deadline is dropped for the rest of the run (unless it comes back as a
restarted node, :meth:`Coordinator.readmit`); a secure sum completes whenever its protocol allows and raises
its typed error otherwise. Any exception leaves the coordinator finished (:attr:`Coordinator.error`), with
what it had decided so far in :attr:`Coordinator.partial` (e.g. the audit verdict that stopped the run).

The job is written as a generator (:meth:`Coordinator._job`): each ``yield`` is one request/reply exchange,
so the stages read top to bottom as the paper's algorithms do.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from ..errors import AuditFailedError, ConfigError, DataError, ProtocolAbortedError, ProtocolError, bad_value
from .guarantee import run_guarantee
from .result import RunResult
from .sums import secure_sum
from . import messages as M
from .wire import payload_size

__all__ = ["Coordinator", "Request", "ListNodes", "Sites"]


@dataclass(frozen=True)
class Request:
    """Send ``payloads[address]`` to each address; reply with what arrived by ``deadline`` (driver clock)."""

    payloads: dict
    deadline: float
    label: str = ""


@dataclass(frozen=True)
class ListNodes:
    """Reply with the list of addresses the transport can reach now (for re-admitting restarted sites)."""


@dataclass
class Sites:
    """The coordinator's view of the sites, in site order (sorted by site name)."""

    names: list
    sizes: list  # FedDL members per site (public, announced at hello)
    holdouts: list  # audit hold-out records per site
    n_features: int
    identities: list  # Ed25519 public keys of this run
    address: list  # transport address of each site
    live: set = field(default_factory=set)
    silent: dict = field(default_factory=dict)  # site → why it is not live
    readmitted: list = field(default_factory=list)
    strangers: set = field(default_factory=set)  # addresses that are not sites of this run

    def drop(self, i: int, reason: str | None = None) -> None:
        self.live.discard(i)
        if reason:
            self.silent.setdefault(i, reason)

    def weights(self, rule: str) -> np.ndarray:
        """Each site's weight by the public rule (what the site itself applies to its upload)."""
        if rule == "records":
            return np.asarray(self.sizes, dtype=float)
        return np.ones(len(self.names))

    def weight_total(self, survivors, rule: str) -> float:
        return float(self.weights(rule)[list(survivors)].sum())


def with_site_reasons(exc: BaseException, sites) -> BaseException:
    """The error the user sees when a run aborts after sites refused: the sites' own typed reasons first.

    A sum whose sites all refused (e.g. ``BudgetExceededError`` on a resumed run) ends as a protocol abort — often a
    ``ProtocolTimeoutError`` of the secure sum, which names keys, not the reason. Every refusal a site sent
    (``{"error": "<Type>: ..."}``, kept in ``sites.silent``) is put in front, as a :class:`ProtocolAbortedError`;
    any other error is returned unchanged."""
    if not isinstance(exc, ProtocolAbortedError) or sites is None:
        return exc
    refusals = {
        sites.names[i]: r
        for i, r in sorted(sites.silent.items())
        if 0 <= i < len(sites.names) and r.split(":", 1)[0].endswith("Error")
    }
    if not refusals:
        return exc
    said = "; ".join(f"{name}: {r}" for name, r in refusals.items())
    then = str(exc) if len(str(exc)) <= 200 else str(exc)[:200] + "…"
    return ProtocolAbortedError(f"the run stopped because sites refused — {said} (then: {type(exc).__name__}: {then})")


def _guards(reply: dict):
    """A site's own conditions from its hello reply (None when it reported none or they do not parse)."""
    try:
        return M.decode(M.HelloReply, reply, strict=False).guards
    except Exception:
        return None


class Coordinator:
    """The sans-I/O coordinator of one run (module docstring).

    Parameters
    ----------
    plan : RunPlan
    ledger : PrivacyLedger, optional
        The coordinator's aggregate ledger under DP (the driver opens it: a file in the run folder, or in
        memory when None). It mirrors every release the sites report and records the settlements.
    resume : dict, optional
        A checkpoint state the coordinator emitted earlier (event ``"checkpoint"``) for the same plan and
        sites: the rounds restart after it.
    on_event : callable, optional
        ``on_event(event: dict)`` for every progress event (the drivers print or log them).
    """

    def __init__(self, plan, *, ledger=None, resume: dict | None = None, on_event=None):
        from .privacy import derive_run_id

        self.plan = plan
        self.ledger = ledger
        self.resume = resume
        self.on_event = on_event
        self.run_id = plan.run_id or derive_run_id(plan)
        self.now = 0.0
        self.events: list = []
        self.partial: dict = {}
        self.result: RunResult | None = None
        self.error: Exception | None = None
        self.sites: Sites | None = None
        self.privacy = None
        self.steps: list = []
        self.inventory: list = []
        self.warnings: list = []
        self.round_trips = 0
        self.messages = 0
        self.bytes_to: dict = {}
        self.bytes_from: dict = {}
        self._sec = None
        self._audit_relay: dict = {}
        self._clip_counts_named = False
        self._prepared: list = []  # SecAgg+ rounds set up ahead of their inputs (federation.sums.PreparedRound)
        self._proofs: dict = {}  # site → (round, proof of its last SecAgg+ sum): rides on its next request
        self._gen = None
        self.guards: dict = {}  # each site's own conditions, as it reported them at hello
        self._started = False
        self._t0 = time.perf_counter()

    # ------------------------------------------------------------------------------ driving
    @property
    def done(self) -> bool:
        return self.result is not None or self.error is not None

    def start(self, addresses):
        """Begin the run with the sites at ``addresses``; returns the first step."""
        if self._gen is not None:
            raise ProtocolError("the coordinator was already started")
        self._gen = self._job(list(addresses))
        return self._advance(None)

    def receive(self, reply, now: float):
        """Feed the driver's reply to the last step (at driver time ``now``); returns the next step or None."""
        if self._gen is None or self.done:
            raise ProtocolError("the coordinator is not running")
        self.now = float(now)
        return self._advance(reply)

    def _advance(self, reply):
        try:
            if not self._started:
                self._started = True
                return next(self._gen)
            return self._gen.send(reply)
        except StopIteration as stop:
            self.result = stop.value
            return None
        except BaseException as exc:  # fail closed: nothing more is asked of any site
            err = with_site_reasons(exc, self.sites)
            self.error = err
            self._gen.close()
            if err is exc:
                raise
            raise err from exc

    # ------------------------------------------------------------------------------ helpers for the stages
    def emit(self, event: str, **fields) -> None:
        ev = {"event": event, "t": round(time.perf_counter() - self._t0, 4), **fields}
        self.events.append(ev)
        if self.on_event is not None:
            self.on_event(ev)

    def release(self, what: str, *, to: str = "the coordinator", covered: bool | str = False, note: str = "") -> None:
        """Record one data-dependent release in the run's inventory: what, who receives it, whether ε covers it."""
        self.inventory.append({"what": what, "to": to, "covered_by_epsilon": covered, "note": note})

    def traffic(self) -> tuple[dict, dict, int]:
        """Bytes to / from each site and round trips so far (a stage's figures are the differences)."""
        return dict(self.bytes_to), dict(self.bytes_from), self.round_trips

    def ask(self, payloads: dict, timeout: float, *, tap=None, record_silence: bool = True):
        """One request/reply exchange with sites by index (generator); returns ``{site: reply}`` without errors.

        A site's ``{"error": ...}`` or silence is recorded in ``sites.silent``; ``tap(site, reply)`` sees every
        good reply first (the DP ledger mirror)."""
        addr = {self.sites.address[i]: i for i in payloads}
        for i, f in payloads.items():
            self.bytes_to[i] = self.bytes_to.get(i, 0) + payload_size(f)
        replies = yield from self._exchange({self.sites.address[i]: f for i, f in payloads.items()}, timeout)
        out = {}
        for a, f in replies.items():
            i = addr.get(a)
            if i is None:
                continue
            self.bytes_from[i] = self.bytes_from.get(i, 0) + payload_size(f)
            if "error" in f:
                if record_silence:
                    self.sites.silent[i] = str(f["error"])
                continue
            if tap is not None:
                tap(i, f)
            out[i] = f
        if record_silence:
            for i in payloads:
                if i not in out:
                    self.sites.silent.setdefault(i, "no reply before the deadline")
        return out

    def _exchange(self, payloads: dict, timeout: float):
        self.round_trips += 1
        self.messages += len(payloads)
        reply = yield Request(payloads, self.now + float(timeout))
        if not isinstance(reply, dict):
            raise ProtocolError(f"the driver answered a request with {type(reply).__name__}, not a dict")
        return reply

    def record_sum(self, label: str, agg, before: tuple, seconds: float) -> None:
        bt, bf, rt = before
        names = self.sites.names
        self.steps.append(
            {
                "label": label,
                "survivors": list(agg.survivors),
                "clipped": int(agg.clipped),
                "seconds": seconds,
                "protocol": agg.protocol,
                "round_trips": self.round_trips - rt,
                "bytes_to_site": {names[i]: self.bytes_to.get(i, 0) - bt.get(i, 0) for i in range(len(names))},
                "bytes_from_site": {names[i]: self.bytes_from.get(i, 0) - bf.get(i, 0) for i in range(len(names))},
                "details": agg.details,
            }
        )

    def secagg_session(self):
        """The SecAgg+ session of this run (one session id, a round counter, the graph parameters).

        Parameters come from the threat model of a malicious coordinator colluding with up to c sites
        (:func:`securefed.securesum.graph.choose_parameters`: the complete graph with 2t > k + c and the quorum
        2q > n + c up to 128 sites; c = the plan's ``secagg_colluders`` when it has one, else ⌈n/10⌉ ≥ 1 — the
        sites' default). Explicit ``degree`` / ``threshold`` are announced as given: sites refuse unsafe ones.
        """
        if self._sec is None:
            from ..securesum.aggregators import SecAggAggregator
            from ..securesum.secagg import STAGES

            p = self.plan
            timeouts = {s: p.stage_timeout for s in STAGES} if p.stage_timeout else None
            self._sec = SecAggAggregator(
                clip_range=1.0,
                modulus_bits=p.modulus_bits,
                fractional_bits=p.fractional_bits,
                degree=p.degree,
                threshold=p.threshold,
                timeouts=timeouts,
                colluders=getattr(p, "secagg_colluders", None),
            )
        return self._sec

    # ------------------------------------------------------------------------------ the job
    def _job(self, addresses):
        plan = self.plan
        self.emit("start", run_id=self.run_id, method=plan.method, nystrom=plan.nystrom, aggregation=plan.aggregation)
        yield from self._hello(addresses)
        warnings = self.warnings
        if plan.aggregation == "plain":
            warnings.append(
                "plain aggregation: the coordinator saw each site's own uploads, not only their sum (give a "
                f"public {plan.name('value_bound')} for the default secure sum)"
            )
        self.release(
            "each site's record count, hold-out count and feature count (hello)",
            note="public by design: the DP calibration uses the sizes",
        )
        lm = yield from self._landmarks()
        privacy = self.privacy.report() if self.privacy is not None else None  # the landmarks' ε, before any rows
        audit = None
        if plan.audit_holdout > 0:
            yield from self.readmit("before the audit")
            audit = yield from self._audit(lm)
        embedding = None
        if plan.method != "none":
            yield from self.readmit("before the embedding")
            embedding = yield from self._embed(lm, warnings)
            self.emit("embedded", what=embedding["sent_kind"], missing=sorted(embedding["missing"]))
            if plan.density_share:
                from .landmark_stages import billboard_density

                embedding["density"] = yield from billboard_density(self, lm, embedding)
                privacy = self.privacy.report()  # now three releases
        if privacy is not None:
            if plan.noise_seed_for_testing is not None:
                privacy["epsilon_void"] = True
                privacy["epsilon_void_reason"] = (
                    "seeded noise (noise-seed-for-testing): anyone who knows the seed, the "
                    "coordinator included, can subtract the noise; the ε holds for no one"
                )
                warnings.append("the DP noise was seeded for testing: the ε printed is void")
            if embedding is not None and embedding.get("rows_privacy") is not None:
                privacy["rows"] = embedding.pop("rows_privacy")
                privacy["epsilon_total"] = float(self.privacy.ledger.spent()[0])
        s = self.sites
        self.emit("done", seconds=time.perf_counter() - self._t0, round_trips=self.round_trips)
        return RunResult(
            landmarks=lm.Y,
            landmark_space=lm.space,
            masses=lm.masses,
            gamma=lm.gamma,
            lr=lm.lr,
            rule=plan.rule,
            rounds_done=plan.rounds,
            mmd_history=lm.history,
            run_id=self.run_id,
            sites=list(s.names),
            site_sizes=list(s.sizes),
            holdouts=list(s.holdouts),
            n_features=s.n_features,
            released=[r["what"] for r in self.inventory],
            inventory=list(self.inventory),
            warnings=warnings,
            privacy=privacy,
            audit=audit,
            landmark_info=lm.info,
            embedding=embedding,
            survivors=sorted(s.live),
            steps=self.steps,
            readmitted=list(s.readmitted),
            site_errors={s.names[i]: str(e) for i, e in s.silent.items() if 0 <= i < len(s.names)},
            seconds=time.perf_counter() - self._t0,
            round_trips=self.round_trips,
            messages=self.messages,
            identity_fingerprints=self.fingerprints(),
            aggregation=self._aggregation_summary(),
            guarantee=run_guarantee(plan, lm.info, self.guards),
        )

    def _aggregation_summary(self) -> dict:
        """Totals over the run's secure sums (the figures FedDLResult.aggregation always had)."""
        sums = self.steps
        up = [
            np.mean([st["bytes_from_site"][self.sites.names[i]] for i in st["survivors"]])
            for st in sums
            if st["survivors"]
        ]
        return {
            "protocol": self.plan.aggregation,
            "aggregations": len(sums),
            "clipped": int(sum(st["clipped"] for st in sums)),
            "min_survivors": min((len(st["survivors"]) for st in sums), default=len(self.sites.names)),
            "seconds": float(sum(st["seconds"] for st in sums)),
            "bytes_up_per_client": int(sum(up)),
            "bytes_down": int(sum(sum(st["bytes_to_site"].values()) for st in sums)),
        }

    # ------------------------------------------------------------------------------ hello and re-admission
    def _hello_request(self) -> dict:
        return M.encode(M.Hello(audit_holdout=float(self.plan.audit_holdout), seed=int(self.plan.seed)))

    def _hello(self, addresses):
        plan = self.plan
        replies = yield from self._exchange({a: self._hello_request() for a in addresses}, plan.request_timeout)
        good = {a: r for a, r in replies.items() if "error" not in r and a in set(addresses)}
        if len(good) < plan.min_sites:
            errs = {str(a): r.get("error") for a, r in replies.items() if "error" in r}
            raise ProtocolAbortedError(
                f"only {len(good)} site(s) answered hello (need {plan.name('min_sites')} = "
                f"{plan.min_sites}); errors: {errs}"
            )
        try:
            order = sorted(good, key=lambda a: str(good[a]["site_name"]))
            names = [str(good[a]["site_name"]) for a in order]
            feats = {int(good[a]["n_features"]) for a in order}
            sizes = [int(good[a]["n_records"]) for a in order]
            holdouts = [int(good[a].get("n_holdout", 0)) for a in order]
            keys = [bytes(good[a]["identity"]) for a in order]
        except (KeyError, TypeError, ValueError) as exc:
            raise ProtocolError(f"malformed hello reply: {exc}") from None
        if len(feats) != 1:
            raise DataError(bad_value("n_features", sorted(feats), "every site must have the same feature columns"))
        if len(set(names)) != len(names):
            raise ConfigError(bad_value("site-name", names, "give every site a distinct name"))
        if min(sizes) < 2:
            raise DataError(
                bad_value(
                    "n_records",
                    min(sizes),
                    f"site {names[sizes.index(min(sizes))]!r} has fewer than 2 "
                    "records for FedDL; give every site at least 2 (more with an audit hold-out)",
                )
            )
        self.sites = Sites(names, sizes, holdouts, feats.pop(), keys, list(order), set(range(len(order))))
        self.guards = {names[j]: _guards(good[a]) for j, a in enumerate(order)}
        for i in range(len(order)):
            self.bytes_to[i] = self.bytes_from[i] = 0
        self.emit("hello", sites=names, sizes=sizes, fingerprints=self.fingerprints())

    def fingerprints(self) -> dict:
        """``{site name: SHA-256 of its identity key}`` as relayed by the coordinator (compare with each site's own)."""
        import hashlib

        return {n: hashlib.sha256(k).hexdigest()[:16] for n, k in zip(self.sites.names, self.sites.identities)}

    def readmit(self, boundary: str):
        """Re-admit restarted sites at a round boundary (generator; returns the names re-admitted).

        A site that stopped answering was dropped. If an address the coordinator has not seen in this run (a
        restarted node) answers ``hello`` with the name of a dropped site and the same record and feature
        counts, it takes that site's place with its **new** identity key; its ledger on disk (same run id)
        carries the budget it already spent. The coordinator checks only the name and the counts, so this
        relies on the transport's node authentication to keep other nodes out (``readmit = false`` disables it).
        """
        s = self.sites
        dead = [i for i in range(len(s.names)) if i not in s.live]
        if not self.plan.readmit or not dead:
            return []
        available = yield ListNodes()
        fresh = [a for a in (available or []) if a not in set(s.address) and a not in s.strangers]
        if not fresh:
            return []
        replies = yield from self._exchange({a: self._hello_request() for a in fresh}, self.plan.request_timeout)
        back = []
        for a, r in replies.items():
            if a not in fresh or "error" in r:
                continue
            name = str(r.get("site_name"))
            i = s.names.index(name) if name in s.names else -1
            if i < 0:
                s.strangers.add(a)  # not a site of this run: never asked again
                continue
            if i not in dead or i in s.live:
                continue  # its old node is not known to be gone yet: ask again at a later boundary
            if int(r.get("n_records", -1)) != s.sizes[i] or int(r.get("n_features", -1)) != s.n_features:
                self.emit("readmit-refused", site=name, reason="record or feature count changed")
                s.strangers.add(a)
                continue
            s.address[i] = a
            s.silent.pop(i, None)
            s.identities[i] = bytes(r["identity"])
            s.live.add(i)
            back.append(name)
            s.readmitted.append({"site": name, "at": boundary})
        if back:
            self._prepared = []  # the prepared SecAgg+ rounds name the old identity keys: set up new ones
            self.emit("readmit", sites=back, at=boundary)
        return back

    # ------------------------------------------------------------------------------ stage 1: landmarks
    def _landmarks(self):
        """The landmark stage of the plan's method (generator); returns the stage's result dict."""
        from . import landmark_stages

        method = {
            "feddl": landmark_stages.feddl,
            "cells": landmark_stages.cells,
            "billboard": landmark_stages.billboard,
        }[self.plan.landmark_method]
        return (yield from method(self))

    # ------------------------------------------------------------------------------ stage 2: the audit gate
    def _audit(self, lm):
        """The membership-audit gate, after the landmarks and before anything per record leaves a site.

        Each live site scores its FedDL members and its held-out records against ``Y`` and uploads only
        per-threshold counts (:func:`securefed.audits.mia.site_roc_counts`, public grids), summed by the run's
        aggregation; the coordinator computes the ROC, AUC and empirical ε lower bound
        (:func:`securefed.audits.mia_from_counts`) and applies :func:`securefed.audits.audit_gate` — with, under
        DP, the accountant's ε. A failing audit raises :class:`AuditFailedError` (nothing per record leaves a
        site) unless ``allow_audit_failure`` (the override is recorded).
        """
        from ..audits import AuditPolicy, audit_gate, mia_from_counts
        from ..audits.mia import GRID_SIZE

        plan, s = self.plan, self.sites
        scores = ["nearest", "kde"]
        task = M.Audit(space=lm.space, Y=lm.Y, gamma=float(lm.gamma), scores=scores, **lm.relay)
        if lm.relay:
            lm.relay = {"cells": lm.relay["cells"], "previous": None}  # the sites finish their trees with this request
        biggest = float(max(n + h for n, h in zip(s.sizes, s.holdouts)))
        a = yield from secure_sum(
            self, task, "audit", biggest, weights="uniform", out_shape=[len(scores) * (4 * GRID_SIZE + 4)]
        )
        delta = self.privacy.plan["delta"] if self.privacy is not None else 0.0
        mia = mia_from_counts(a.total, scores, n_sites=len(a.survivors), aggregation=a.protocol, delta=delta)
        claimed = float(self.privacy.ledger.spent()[0]) if self.privacy is not None else None
        policy = AuditPolicy(max_auc=plan.max_auc, max_empirical_epsilon=plan.max_empirical_epsilon)
        dec = audit_gate(mia, policy, claimed_epsilon=claimed, allow_failure=True)
        out = dec.to_dict()
        out["mia"] = {k: v for k, v in mia.to_dict().items() if k != "per_score"}
        out["mia"]["n_sites"] = len(a.survivors)
        out["mia_result"] = mia
        self._audit_relay = {"audit_total": a.total, "audit_scores": list(scores)}  # each site applies the gate itself
        self.release(
            "the sum over sites of the membership-audit ROC counts (members vs held-out records)",
            note="aggregate counts on public score grids",
        )
        self.emit("audit", auc=mia.auc, empirical_epsilon=mia.empirical_epsilon, verdict=out["verdict"])
        if not dec.passed and not plan.allow_audit_failure:
            out.update(
                verdict="fail",
                overridden=False,
                proceed=False,
                ledger_event=None,
                note="the run stopped at the gate: nothing per record was sent",
            )
            self.partial["audit"] = out
            remedy = {
                "cells": f"a larger {plan.name('cell_floor')} (now {plan.cell_floor})",
                "billboard": f"a smaller {plan.name('epsilon')}",
            }.get(lm.info["method"], f"noise ({plan.name('epsilon')}) or fewer {plan.name('landmarks')}")
            raise AuditFailedError(
                "landmark membership audit failed: "
                + "; ".join(str(f) for f in dec.failures)
                + f" — nothing per record left the sites; rerun with {remedy}, or with "
                f"{plan.name('allow_audit_failure')} to proceed (recorded)"
            )
        return out

    # ------------------------------------------------------------------------------ stage 3: the embedding
    def _embed(self, lm, warnings: list):
        plan = self.plan
        if plan.nystrom == "local":
            emb = yield from self._embed_local(lm)
            if plan.coordinates == "keep":
                self.release(
                    f"nothing per record: each site kept its {emb['sent_kind']}",
                    to="its own site",
                    note="the coordinator holds only the landmarks' map",
                )
            else:
                self.release(
                    f"each site's {emb['sent_kind']}",
                    note="a record's own coordinate is a function of that record: no ε covers it",
                )
                if plan.dp:
                    warnings.append(
                        f"each site's {emb['sent_kind']} went to the coordinator: computed from the site's "
                        "raw records, they are not covered by the differential-privacy accounting "
                        "(run with coordinates keep to leave them on the sites)"
                    )
            return emb
        emb = yield from self._embed_rows(lm.Y, lm.gamma, lm.rng)
        m = self.sites.n_features
        leak = (
            "these rows give every record back (n_y > m: trilateration)"
            if plan.landmarks > m
            else "these rows give back each record's projection onto the landmarks' span (all of it once n_y > m)"
        )
        warnings.append(
            f"every site sent one row per record ({emb['sent_kind']}); {leak}"
            + (" — computed from data-perturbed records (rows-epsilon)" if plan.rows_epsilon else "")
        )
        self.release(
            f"each site's {emb['sent_kind']}", covered="by rows-epsilon" if plan.rows_epsilon else False, note=leak
        )
        return emb

    def _ask_live(self, req):
        """Send the typed request ``req`` to every live site, each with its own index (generator); returns
        ``(replies, missing)``."""
        import dataclasses

        s = self.sites
        live = sorted(s.live)
        base = dataclasses.replace(req, seed=int(self.plan.seed), audit_holdout=float(self.plan.audit_holdout))
        before = dict(self.bytes_from)

        def per_site(i):
            proof = self._proofs.pop(i, None) if hasattr(base, "proof") else None
            extra = {} if proof is None else {"proof_round": proof[0], "proof": proof[1]}
            return M.encode(dataclasses.replace(base, site=i, **extra))

        replies = yield from self.ask({i: per_site(i) for i in live}, self.plan.request_timeout)
        missing = {s.names[i]: s.silent.get(i, "no reply") for i in live if i not in replies}
        for i in live:
            if i not in replies:
                s.drop(i)
        self._stage_bytes = {s.names[i]: self.bytes_from.get(i, 0) - before.get(i, 0) for i in live}
        return replies, missing

    def _embed_local(self, lm):
        """No rows leave a site: the coordinator maps the landmarks (with their masses), each site places its own
        records against that map (:func:`securefed.embedding.placement.place_refine` for t-SNE, the weighted mean of
        the nearest landmarks' positions for UMAP, the cluster of highest kernel affinity for spectral clustering)
        and returns only their final coordinates or labels — or keeps them (``coordinates keep``)."""
        from ..embedding.placement import weighted_tsne
        from ..embedding.stages import spectral_landmark_labels, umap_landmark_model

        plan, s = self.plan, self.sites
        Y, space = lm.Y, lm.space
        N = float(sum(s.sizes) + sum(s.holdouts))
        if lm.masses is None:
            c = np.full(len(Y), N / len(Y))
        else:  # the cells count the landmarks' members only; the map holds every record (the hold-out too)
            c = lm.masses = np.asarray(lm.masses, dtype=np.float64) * (N / float(np.sum(lm.masses)))
        seed = int(lm.rng.integers(0, 2**31 - 1))
        req = {
            "method": plan.method,
            "keep": plan.coordinates == "keep",
            "Y": Y,
            "masses": c,
            "space": space,
            **lm.relay,
            **(self._audit_relay if lm.relay else {}),
        }
        out = {
            "method": plan.method,
            "nystrom": "local",
            "model_seed": seed,
            "reconstruction": "local",
            "landmark_masses": c,
        }
        if plan.method == "spectral":
            g = plan.kernel_gamma if plan.kernel_gamma is not None else float(lm.gamma)
            lab_y = np.asarray(spectral_landmark_labels(Y, g, n_clusters=plan.n_clusters, seed=seed, masses=c))
            req.update(kernel_gamma=g, n_clusters=plan.n_clusters, landmark_labels=[int(v) for v in lab_y])
            out.update(landmark_labels=lab_y, kernel_gamma=g, sent_kind="one cluster label per record", key="labels")
        else:
            if plan.method == "tsne":
                E, Zn = weighted_tsne(Y, c, perplexity=plan.perplexity, seed=seed, n_components=plan.n_components)
                req.update(perplexity=float(plan.placement_perplexity), Zn=float(Zn))
                out["Zn"] = float(Zn)
            else:
                E = np.asarray(
                    umap_landmark_model(
                        Y,
                        n_neighbors=plan.n_neighbors,
                        min_dist=plan.min_dist,
                        n_components=plan.n_components,
                        seed=seed,
                    ).embedding_,
                    dtype=np.float64,
                )
            req["landmark_embedding"] = E
            out.update(
                landmark_embedding=E,
                sent_kind=f"final {plan.n_components}-D coordinates, one per record",
                key="coordinates",
            )
        self.emit("embedding", landmarks=len(Y), method=plan.method)
        replies, missing = yield from self._ask_live(M.Place(**req))
        key = out.pop("key")
        if plan.coordinates == "keep":
            out["kept_on_sites"] = {s.names[i]: int(r["kept"]) for i, r in sorted(replies.items())}
        elif key == "labels":
            out["labels"] = {s.names[i]: np.asarray(r["labels"], dtype=np.int64) for i, r in sorted(replies.items())}
        else:
            out["coordinates"] = {
                s.names[i]: M.decode_reply(M.PlaceReply, r).embedding for i, r in sorted(replies.items())
            }
        ids = {
            s.names[i]: [str(v) for v in rids]
            for i, r in sorted(replies.items())
            if (rids := M.decode_reply(M.PlaceReply, r).record_ids) is not None
        }
        for name, v in ids.items():  # a site that chose send-record-ids: its ids, in its record order
            if len(v) != len(out.get("coordinates", out.get("labels", {})).get(name, v)):
                raise ProtocolError(f"site {name!r} sent {len(v)} record ids for a different number of records")
        if ids:
            out["record_ids"] = ids
            self.release(
                f"the record ids of {', '.join(sorted(ids))} (site option send-record-ids)",
                note="the site chose to send them: they name who is in its data",
            )
        out.update(missing=missing, bytes_from_site=self._stage_bytes)
        return out

    def _embed_rows(self, Y, gamma: float, rng):
        """The paper's Nyström rows mode (Algorithms 2–3): every live site sends one row per record and the server
        runs the estimators' own server step on them. **These rows give the records back.**"""
        from ..embedding.stages import spectral_from_kernel_rows, tsne_from_distance_rows, umap_from_distance_rows
        from .privacy import mirror_release

        plan, s = self.plan, self.sites
        spectral = plan.method == "spectral"
        g = (plan.kernel_gamma if plan.kernel_gamma is not None else float(gamma)) if spectral else float(gamma)
        rows_dp = None
        if plan.rows_epsilon is not None:
            rows_dp = {
                "run_id": self.run_id,
                "epsilon": float(plan.rows_epsilon),
                "delta": float(plan.delta),
                "accountant": plan.accountant,
                "tau_x": float(plan.clip_norm),
                "noise_seed": plan.noise_seed_for_testing,
            }
        req = M.Rows(kind="kernel" if spectral else "distance", Y=Y, gamma=g, rows_dp=rows_dp)
        replies, missing = yield from self._ask_live(req)
        if not replies:
            raise ProtocolAbortedError(f"rows stage: no site sent its rows ({missing})")
        order = sorted(replies)
        typed = {i: M.decode_reply(M.RowsReply, replies[i]) for i in order}
        blocks = [typed[i].rows for i in order]
        rows_privacy = None
        if plan.rows_epsilon is not None:
            for i in order:
                if self.privacy is not None:
                    mirror_release(self.privacy.ledger, i, typed[i].rows_dp_event)
            rows_privacy = dict(typed[order[0]].rows_dp_report)
            rows_privacy["sites"] = len(order)
            rows_privacy.pop("epsilon_total_with_ledger", None)
        B = np.vstack(blocks)
        self.emit("rows", records=len(B), sites=[s.names[i] for i in order])
        cuts = np.cumsum([0] + [len(b) for b in blocks])
        parts = lambda A: {s.names[i]: A[a:b] for i, a, b in zip(order, cuts[:-1], cuts[1:])}  # noqa: E731
        out = {
            "method": plan.method,
            "nystrom": "rows",
            "missing": missing,
            "rows_privacy": rows_privacy,
            "bytes_from_site": self._stage_bytes,
            "rows_per_site": {s.names[i]: len(b) for i, b in zip(order, blocks)},
        }
        if plan.keep_rows:
            out["rows"] = parts(B)
        noisy = plan.dp
        if spectral:
            labels, path = spectral_from_kernel_rows(
                B,
                Y,
                g,
                n_clusters=plan.n_clusters,
                n_neighbors=plan.n_neighbors,
                reconstruction=plan.reconstruction,
                n_jobs=plan.n_jobs,
                rng=rng,
            )
            out.update(
                labels=parts(np.asarray(labels)),
                kernel_gamma=g,
                sent_kind="Gaussian-kernel values to the landmarks, one row of n_y per record",
            )
        else:
            if plan.method == "tsne":
                E, path = tsne_from_distance_rows(
                    B,
                    Y,
                    perplexity=plan.perplexity,
                    n_components=plan.n_components,
                    n_iter=plan.n_iter,
                    reconstruction=plan.reconstruction,
                    noisy_landmarks=noisy,
                    n_jobs=plan.n_jobs,
                    rng=rng,
                )
            else:
                E, path = umap_from_distance_rows(
                    B,
                    Y,
                    n_neighbors=plan.n_neighbors,
                    min_dist=plan.min_dist,
                    n_components=plan.n_components,
                    reconstruction=plan.reconstruction,
                    noisy_landmarks=noisy,
                    n_jobs=plan.n_jobs,
                    rng=rng,
                )
            out.update(
                coordinates=parts(np.asarray(E)),
                sent_kind="squared distances to the landmarks, one row of n_y per record",
            )
        out["reconstruction"] = path
        return out
