"""The one coordinator of a federated job, sans-I/O: it takes site replies and returns requests.

:class:`Coordinator` runs the whole job for a :class:`~securefed.plan.RunPlan` — ``hello``, the statistics for
γ and the start, the FedDL rounds (``papers/000`` Algorithm 1), the optional Lloyd refinement, the
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
restarted node, :meth:`Coordinator._readmit`); a secure sum completes whenever its protocol allows and raises
its typed error otherwise. Any exception leaves the coordinator finished (:attr:`Coordinator.error`), with
what it had decided so far in :attr:`Coordinator.partial` (e.g. the audit verdict that stopped the run).

The job is written as a generator (:meth:`Coordinator._job`): each ``yield`` is one request/reply exchange,
so the stages read top to bottom as the paper's algorithms do.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np

from ..errors import AuditFailedError, ConfigError, DataError, ProtocolAbortedError, ProtocolError, bad_value
from .result import RunResult
from .sums import secure_sum
from .wire import dumps, get_array, loads, payload_size, put_array

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
    sizes: list            # FedDL members per site (public, announced at hello)
    holdouts: list         # audit hold-out records per site
    n_features: int
    identities: list       # Ed25519 public keys of this run
    address: list          # transport address of each site
    live: set = field(default_factory=set)
    silent: dict = field(default_factory=dict)      # site → why it is not live
    readmitted: list = field(default_factory=list)
    strangers: set = field(default_factory=set)     # addresses that are not sites of this run

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
        self.round_trips = 0
        self.messages = 0
        self.bytes_to: dict = {}
        self.bytes_from: dict = {}
        self._sec = None
        self._gen = None
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
            self.error = exc
            self._gen.close()
            raise

    # ------------------------------------------------------------------------------ helpers for the stages
    def emit(self, event: str, **fields) -> None:
        ev = {"event": event, "t": round(time.perf_counter() - self._t0, 4), **fields}
        self.events.append(ev)
        if self.on_event is not None:
            self.on_event(ev)

    def traffic(self) -> tuple[dict, dict]:
        return dict(self.bytes_to), dict(self.bytes_from)

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
        bt, bf = before
        names = self.sites.names
        self.steps.append({"label": label, "survivors": list(agg.survivors), "clipped": int(agg.clipped),
                           "seconds": seconds, "protocol": agg.protocol,
                           "bytes_to_site": {names[i]: self.bytes_to.get(i, 0) - bt.get(i, 0) for i in range(len(names))},
                           "bytes_from_site": {names[i]: self.bytes_from.get(i, 0) - bf.get(i, 0) for i in range(len(names))},
                           "details": agg.details})

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
            self._sec = SecAggAggregator(clip_range=1.0, modulus_bits=p.modulus_bits, fractional_bits=p.fractional_bits,
                                         degree=p.degree, threshold=p.threshold, timeouts=timeouts,
                                         colluders=getattr(p, "secagg_colluders", None))
        return self._sec

    # ------------------------------------------------------------------------------ the job
    def _job(self, addresses):
        plan = self.plan
        self.emit("start", run_id=self.run_id, method=plan.method, nystrom=plan.nystrom, aggregation=plan.aggregation)
        yield from self._hello(addresses)
        released, warnings = [], []
        lm = yield from self._landmarks(released)
        privacy = self.privacy.report() if self.privacy is not None else None  # the landmarks' ε, before any rows
        refinement = None
        if plan.refine:
            yield from self._readmit("before the refinement")
            lm["Y"], refinement = yield from self._refine(lm["Y"], released)
        audit = None
        if plan.audit_holdout > 0:
            yield from self._readmit("before the audit")
            audit = yield from self._audit(lm["Y"], lm["gamma"])
        embedding = None
        if plan.method != "none":
            yield from self._readmit("before the embedding")
            embedding = yield from self._embed(lm["Y"], lm["gamma"], lm["rng"], released, warnings)
        if privacy is not None:
            released.append(f"{plan.rounds * plan.local_steps} noisy landmark releases per site (DP, see privacy)")
            if embedding is not None and embedding.get("rows_privacy") is not None:
                privacy["rows"] = embedding.pop("rows_privacy")
                privacy["epsilon_total"] = float(self.privacy.ledger.spent()[0])
        s = self.sites
        self.emit("done", seconds=time.perf_counter() - self._t0, round_trips=self.round_trips)
        return RunResult(
            landmarks=lm["Y"], gamma=lm["gamma"], lr=lm["lr"], rule=plan.rule, rounds_done=plan.rounds,
            mmd_history=lm["history"], run_id=self.run_id, sites=list(s.names), site_sizes=list(s.sizes),
            holdouts=list(s.holdouts), n_features=s.n_features, released=released, warnings=warnings, privacy=privacy,
            audit=audit, refinement=refinement, embedding=embedding, survivors=sorted(s.live), steps=self.steps,
            readmitted=list(s.readmitted),
            site_errors={s.names[i]: str(e) for i, e in s.silent.items() if 0 <= i < len(s.names)},
            seconds=time.perf_counter() - self._t0, round_trips=self.round_trips, messages=self.messages,
            aggregation=self._aggregation_summary())

    def _aggregation_summary(self) -> dict:
        agg = [st for st in self.steps]
        return {"protocol": self.plan.aggregation, "aggregations": len(agg),
                "clipped": int(sum(st["clipped"] for st in agg)),
                "min_survivors": min((len(st["survivors"]) for st in agg), default=len(self.sites.names)),
                "seconds": float(sum(st["seconds"] for st in agg)),
                "bytes_up_per_client": int(np.mean([sum(st["bytes_from_site"].values()) for st in agg]) / max(1, len(self.sites.names))) if agg else 0,
                "bytes_down": int(sum(sum(st["bytes_from_site"].values()) for st in agg))}

    # ------------------------------------------------------------------------------ hello and re-admission
    def _hello_request(self) -> dict:
        return {"op": "hello", "audit_holdout": float(self.plan.audit_holdout), "seed": int(self.plan.seed)}

    def _hello(self, addresses):
        plan = self.plan
        replies = yield from self._exchange({a: self._hello_request() for a in addresses}, plan.request_timeout)
        good = {a: r for a, r in replies.items() if "error" not in r and a in set(addresses)}
        if len(good) < plan.min_sites:
            errs = {str(a): r.get("error") for a, r in replies.items() if "error" in r}
            raise ProtocolAbortedError(f"only {len(good)} site(s) answered hello (need {plan.name('min_sites')} = "
                                       f"{plan.min_sites}); errors: {errs}")
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
            raise DataError(bad_value("n_records", min(sizes), f"site {names[sizes.index(min(sizes))]!r} has fewer than 2 "
                                      "records for FedDL; give every site at least 2 (more with an audit hold-out)"))
        self.sites = Sites(names, sizes, holdouts, feats.pop(), keys, list(order), set(range(len(order))))
        for i in range(len(order)):
            self.bytes_to[i] = self.bytes_from[i] = 0
        self.emit("hello", sites=names, sizes=sizes)

    def _readmit(self, boundary: str):
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
            self.emit("readmit", sites=back, at=boundary)
        return back

    # ------------------------------------------------------------------------------ stage 1: landmarks
    def _landmarks(self, released: list):
        """FedDL (``papers/000`` Algorithm 1): γ and the start from one secure sum of statistics, then ``S`` rounds
        of model averaging (Eq. 15) or gradient averaging (Eq. 16) through the secure sum (generator)."""
        from ..kernels import check_gamma, median_gamma
        from ..landmarks.feddl import default_lr, init_landmarks, release_bounds

        plan, s = self.plan, self.sites
        m = s.n_features
        rng = np.random.default_rng(plan.seed)
        w_norm = s.weights(plan.weights) / s.weights(plan.weights).sum()
        if plan.dp:
            from .privacy import ServerPrivacy

            gamma0 = plan.gamma if plan.gamma is not None else 1.0 / float(plan.clip_norm) ** 2  # public: τ_X only
            self.privacy = ServerPrivacy(plan, self.run_id, s.sizes, w_norm, check_gamma(gamma0), self.ledger)
        B = plan.sum_bound
        ck = self.resume
        gamma = self.privacy.plan["gamma"] if self.privacy else plan.gamma
        want = ([] if gamma is not None or ck else ["gamma"]) + (["moments"] if plan.init_mode == "moments" and not ck else [])
        stats = {}
        if want:
            length = (1 if "gamma" in want else 0) + (2 * m if "moments" in want else 0)
            task = {"task": "stats", "want": want, "scale": 1.0 if B is None else float(B), "out_shape": [length]}
            a = yield from secure_sum(self, task, "statistics", B, weights="records")
            tot = a.total / a.weight_sum
            if "gamma" in want:
                gamma = median_gamma([tot[0] * 4.0 * m * (1.0 if B is None else B)])
                tot = tot[1:]
                released.append("one scalar per site: its local median squared distance, record-weighted (for γ)")
            if "moments" in want:
                scale = 1.0 if B is None else B
                stats = {"mean": tot[:m], "std": np.sqrt(np.maximum(tot[m:] * scale - tot[:m] ** 2, 0.0))}
                released.append("per-feature means and mean squares (one secure sum, for the initial landmarks)")
        gamma = check_gamma(ck["gamma"] if ck else gamma)
        lr = float(ck["lr"]) if ck else (plan.lr if plan.lr is not None else default_lr(plan.landmarks, gamma))
        if ck:
            Y, start, history = np.array(ck["Y"], dtype=np.float64), int(ck["round"]), list(ck["history"])
            rng.bit_generator.state = ck["rng"]
        else:
            Y, start, history = self._init_landmarks(stats, gamma, rng, init_landmarks), 0, []
        if Y.shape[1] != m:
            raise ConfigError(bad_value(plan.name("init"), f"array{Y.shape}", f"give {m} columns (the sites' features)"))
        clip = release_bounds(B, m, plan.landmarks, gamma).get(plan.rule)
        spread0 = _spread(Y)
        mmd_start: list = []
        for rnd in range(start, plan.rounds):
            if rnd > start:
                yield from self._readmit(f"before round {rnd + 1}")
            Y, mmd0 = yield from self._round(Y, rnd, gamma, lr, clip)
            if mmd0 is not None:
                mmd_start.append(mmd0)
            spread = _spread(Y)
            if not math.isfinite(spread) or spread > 20.0 * (spread0 + 1.0 / math.sqrt(gamma)):
                raise ConfigError(bad_value(plan.name("lr"), lr, f"landmarks diverged in round {rnd + 1} (spread {spread:.3g}, "
                                            f"kernel width {1 / math.sqrt(gamma):.3g}); use the automatic step or a smaller one"))
            if mmd0 is not None:
                history.append(mmd0)  # MMD of Y^rnd, the landmarks round rnd + 1 started from
            self.emit("round", round=rnd + 1, rounds=plan.rounds, mmd_at_start=mmd0,
                      epsilon=float(self.privacy.ledger.spent()[0]) if self.privacy else None)
            self.emit("checkpoint", state={"round": rnd + 1, "Y": Y, "gamma": gamma, "lr": lr, "history": history,
                                           "rng": rng.bit_generator.state, "mmd_pending": mmd0 is not None})
        return {"Y": Y, "gamma": gamma, "lr": lr, "history": history, "rng": rng}

    def _init_landmarks(self, stats: dict, gamma: float, rng, init_landmarks) -> np.ndarray:
        plan, m = self.plan, self.sites.n_features
        mode = plan.init_mode
        if mode == "moments":
            Y = init_landmarks(plan.landmarks, m, mean=stats["mean"], std=stats["std"], rng=rng)
        elif mode == "public":
            radius = float(plan.clip_norm) if plan.dp else float(np.sqrt(1.0 / gamma))
            Y = init_landmarks(plan.landmarks, m, radius=radius, rng=rng)
        else:
            Y = np.array(plan.init, dtype=np.float64)
        return self.privacy.project(Y) if self.privacy is not None else Y

    def _round(self, Y, rnd: int, gamma: float, lr: float, clip):
        """One FedDL round (generator); returns ``(Y, MMD of the Y the round started from or None)``."""
        from ..landmarks.feddl import server_gradient_step, server_model_average
        from .site import monitor_scale

        plan = self.plan
        monitor = plan.monitoring
        mmd0 = None
        steps = [plan.local_steps - 1] if plan.rule == "model" else list(range(plan.local_steps))
        for t in steps:
            task = put_array({"task": plan.rule, "gamma": gamma}, "Y", Y)
            if plan.rule == "model":
                task.update(lr=lr, local_steps=plan.local_steps)
            with_mmd = monitor and t == steps[0]
            if with_mmd:
                task.update(monitor=True, clip=clip)
            task["out_shape"] = [Y.size + 1] if with_mmd else list(Y.shape)
            tap = None
            if self.privacy is not None:
                task.update(self._dp_fields(rnd, t))
                released_steps = range(plan.local_steps) if plan.rule == "model" else [t]
                tap = self._mirror(rnd, released_steps)
            label = f"round {rnd + 1}" + (f" step {t + 1}" if plan.rule == "gradient" else "")
            a = yield from secure_sum(self, task, label, clip, tap=tap)
            total = a.total
            if with_mmd:
                mmd0 = float(total[-1] / a.weight_sum / monitor_scale(clip))
                total = total[:-1].reshape(Y.shape)
                a = type(a)(total, a.survivors, a.weight_sum, a.protocol, a.clipped)
            if self.privacy is not None:
                self._settle(rnd, t, a)
            Y = server_model_average(a) if plan.rule == "model" else server_gradient_step(Y, a, lr)
            if self.privacy is not None:
                Y = self.privacy.project(Y)  # after every server step: Δ assumes Y inside the τ_Y ball at every step
        return Y, mmd0

    def _dp_fields(self, rnd: int, step: int) -> dict:
        settle = self.privacy.unsettled
        self.privacy.unsettled = []
        return {"dp": self.privacy.wire_plan(), "dp_settle": dumps(settle), "round": rnd, "step": step}

    def _mirror(self, rnd: int, steps):
        def hook(site: int, fields: dict) -> None:
            if "dp_events" in fields:
                self.privacy.mirror(site, fields, rnd, steps)
        return hook

    def _settle(self, rnd: int, step: int, a) -> None:
        have = self.privacy.reported(rnd, step)
        missing = [i for i in a.survivors if i not in have]
        if missing:
            raise ProtocolAbortedError(f"round {rnd + 1}: sites {missing} were summed without reporting their ledger "
                                       "events; the aggregate ledger would be incomplete")
        self.privacy.after_aggregate(rnd, step, a.survivors)

    # ------------------------------------------------------------------------------ refinement
    def _refine(self, Y, released: list):
        """Federated Lloyd (k-means) refinement of the landmarks (beyond the paper, for the no-rows mode).

        Each round every site assigns its records to their nearest landmark and uploads, per landmark, its
        scaled sum ``Σ_{x→i} x / n_p`` and count ``c_i / n_p``; the coordinator receives only the record-weighted
        total and moves ``y_i`` to the pooled mean of its records — only when at least ``refine_min_cluster``
        records chose it (the mean of one record *is* that record). Below the floor a landmark keeps its
        position and, except in the last round, restarts as a jittered copy of a populated landmark (k-means
        splitting); one still below the floor after the last round goes back to its FedDL position.
        """
        plan = self.plan
        B = plan.sum_bound
        n_y, m = Y.shape
        rng = np.random.default_rng([plan.seed, 0x11D])
        Y = np.array(Y, dtype=np.float64, copy=True)
        Y_start = Y.copy()
        frozen, ok = 0, np.ones(n_y, bool)
        for r in range(plan.refine):
            if r:
                yield from self._readmit(f"before refinement round {r + 1}")
            task = put_array({"task": "lloyd", "out_shape": [n_y * m + n_y]}, "Y", Y)
            a = yield from secure_sum(self, task, f"refinement {r + 1}", None if B is None else max(B, 1.0),
                                      weights="records")
            tot = a.total
            counts = tot[n_y * m:]
            ok = counts >= plan.refine_min_cluster - 1e-6
            frozen = int(n_y - ok.sum())
            Y[ok] = tot[: n_y * m].reshape(n_y, m)[ok] / counts[ok, None]
            if frozen and r < plan.refine - 1:
                big = np.argsort(-counts)[: max(1, int(ok.sum()))]
                dead = np.flatnonzero(~ok)
                scale = 1e-2 * float(np.sqrt(np.mean(np.var(Y[ok], axis=0)))) if ok.any() else 1e-2
                Y[dead] = Y[big[np.arange(len(dead)) % len(big)]] + scale * rng.standard_normal((len(dead), m))
            self.emit("refine", round=r + 1, rounds=plan.refine, frozen=frozen)
        Y[~ok] = Y_start[~ok]  # a landmark that never gathered enough records keeps its FedDL position
        released.append(f"{plan.refine} Lloyd rounds: per-landmark record-weighted sums and counts (one secure sum each)")
        return Y, {"rounds": plan.refine, "min_cluster_size": plan.refine_min_cluster, "frozen": frozen}

    # ------------------------------------------------------------------------------ stage 2: the audit gate
    def _audit(self, Y, gamma: float):
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
        task = put_array({"task": "audit", "gamma": float(gamma), "scores": scores,
                          "out_shape": [len(scores) * (4 * GRID_SIZE + 4)]}, "Y", Y)
        biggest = float(max(n + h for n, h in zip(s.sizes, s.holdouts)))
        a = yield from secure_sum(self, task, "audit", biggest, weights="uniform")
        delta = self.privacy.plan["delta"] if self.privacy is not None else 0.0
        mia = mia_from_counts(a.total, scores, n_sites=len(a.survivors), aggregation=a.protocol, delta=delta)
        claimed = float(self.privacy.ledger.spent()[0]) if self.privacy is not None else None
        policy = AuditPolicy(max_auc=plan.max_auc, max_empirical_epsilon=plan.max_empirical_epsilon)
        dec = audit_gate(mia, policy, claimed_epsilon=claimed, allow_failure=True)
        out = dec.to_dict()
        out["mia"] = {k: v for k, v in mia.to_dict().items() if k != "per_score"}
        out["mia"]["n_sites"] = len(a.survivors)
        out["mia_result"] = mia
        self.emit("audit", auc=mia.auc, empirical_epsilon=mia.empirical_epsilon, verdict=out["verdict"])
        if not dec.passed and not plan.allow_audit_failure:
            out.update(verdict="fail", overridden=False, proceed=False, ledger_event=None,
                       note="the run stopped at the gate: nothing per record was sent")
            self.partial["audit"] = out
            raise AuditFailedError("landmark membership audit failed: " + "; ".join(str(f) for f in dec.failures)
                                   + f" — nothing per record left the sites; rerun with {plan.name('allow_audit_failure')} "
                                     "to proceed (recorded), or add noise (epsilon) / fewer landmarks")
        return out

    # ------------------------------------------------------------------------------ stage 3: the embedding
    def _embed(self, Y, gamma: float, rng, released: list, warnings: list):
        plan = self.plan
        if plan.nystrom == "local":
            emb = yield from self._embed_local(Y, gamma, rng)
            released.append(emb["sent_kind"])
            if plan.dp:
                warnings.append(f"each site's {emb['sent_kind']} are computed from its raw records; they are not "
                                "covered by the differential-privacy accounting")
            return emb
        emb = yield from self._embed_rows(Y, gamma, rng)
        m = self.sites.n_features
        leak = ("these rows give every record back (n_y > m: trilateration)" if plan.landmarks > m else
                "these rows give back each record's projection onto the landmarks' span (all of it once n_y > m)")
        warnings.append(f"every site sent one row per record ({emb['sent_kind']}); {leak}"
                        + (" — computed from data-perturbed records (rows-epsilon)" if plan.rows_epsilon else ""))
        released.append(emb["sent_kind"])
        return emb

    def _ask_live(self, req: dict):
        """Send ``req`` to every live site (generator); returns ``(replies, missing)``."""
        s = self.sites
        live = sorted(s.live)
        base = dict(req, seed=self.plan.seed, audit_holdout=float(self.plan.audit_holdout))
        before = dict(self.bytes_from)
        replies = yield from self.ask({i: dict(base, site=i) for i in live}, self.plan.request_timeout)
        missing = {s.names[i]: s.silent.get(i, "no reply") for i in live if i not in replies}
        for i in live:
            if i not in replies:
                s.drop(i)
        self._stage_bytes = {s.names[i]: self.bytes_from.get(i, 0) - before.get(i, 0) for i in live}
        return replies, missing

    def _embed_local(self, Y, gamma: float, rng):
        """No rows leave a site: the server models the landmarks, each site places its own records against that
        model and returns only their final coordinates (or cluster labels)."""
        from ..embedding.stages import spectral_landmark_labels, tsne_landmark_model, umap_landmark_model

        plan, s = self.plan, self.sites
        seed = int(rng.integers(0, 2**31 - 1))
        req = put_array({"op": "place", "method": plan.method}, "Y", Y)
        out = {"method": plan.method, "nystrom": "local", "model_seed": seed, "reconstruction": "local"}
        if plan.method == "spectral":
            g = plan.kernel_gamma if plan.kernel_gamma is not None else float(gamma)
            lab_y = np.asarray(spectral_landmark_labels(Y, g, n_clusters=plan.n_clusters, seed=seed))
            req.update(kernel_gamma=g, n_clusters=plan.n_clusters, landmark_labels=[int(v) for v in lab_y])
            replies, missing = yield from self._ask_live(req)
            out.update(landmark_labels=lab_y, kernel_gamma=g, sent_kind="one cluster label per record",
                       labels={s.names[i]: np.asarray(r["labels"], dtype=np.int64) for i, r in sorted(replies.items())})
        else:
            if plan.method == "tsne":
                model, _ = tsne_landmark_model(Y, perplexity=plan.perplexity, n_components=plan.n_components, seed=seed)
                E = np.asarray(model)
                req.update(perplexity=float(plan.perplexity))
            else:
                model = umap_landmark_model(Y, n_neighbors=plan.n_neighbors, min_dist=plan.min_dist,
                                            n_components=plan.n_components, seed=seed)
                E = np.asarray(model.embedding_, dtype=np.float64)
                req.update(n_neighbors=int(plan.n_neighbors), min_dist=float(plan.min_dist))
            req.update(model_seed=seed)
            put_array(req, "landmark_embedding", E)
            self.emit("embedding", landmarks=len(Y), method=plan.method)
            replies, missing = yield from self._ask_live(req)
            out.update(landmark_embedding=E, sent_kind=f"final {plan.n_components}-D coordinates, one per record",
                       coordinates={s.names[i]: get_array(r, "embedding") for i, r in sorted(replies.items())})
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
        req = put_array({"op": "rows", "kind": "kernel" if spectral else "distance", "gamma": g}, "Y", Y)
        if plan.rows_epsilon is not None:
            req["rows_dp"] = dumps({"run_id": self.run_id, "epsilon": float(plan.rows_epsilon), "delta": float(plan.delta),
                                    "accountant": plan.accountant, "tau_x": float(plan.clip_norm),
                                    "noise_seed": plan.noise_seed_for_testing})
        replies, missing = yield from self._ask_live(req)
        if not replies:
            raise ProtocolAbortedError(f"rows stage: no site sent its rows ({missing})")
        order = sorted(replies)
        blocks = [get_array(replies[i], "rows") for i in order]
        rows_privacy = None
        if plan.rows_epsilon is not None:
            for i in order:
                if self.privacy is not None:
                    mirror_release(self.privacy.ledger, i, loads(replies[i]["rows_dp_event"], "rows ledger event"))
            rows_privacy = loads(replies[order[0]]["rows_dp_report"], "rows DP report")
            rows_privacy["sites"] = len(order)
            rows_privacy.pop("epsilon_total_with_ledger", None)
        B = np.vstack(blocks)
        self.emit("rows", records=len(B), sites=[s.names[i] for i in order])
        cuts = np.cumsum([0] + [len(b) for b in blocks])
        parts = lambda A: {s.names[i]: A[a:b] for i, a, b in zip(order, cuts[:-1], cuts[1:])}  # noqa: E731
        out = {"method": plan.method, "nystrom": "rows", "missing": missing, "rows_privacy": rows_privacy,
               "bytes_from_site": self._stage_bytes,
               "rows_per_site": {s.names[i]: len(b) for i, b in zip(order, blocks)}}
        if plan.keep_rows:
            out["rows"] = parts(B)
        noisy = plan.dp
        if spectral:
            labels, path = spectral_from_kernel_rows(B, Y, g, n_clusters=plan.n_clusters, n_neighbors=plan.n_neighbors,
                                                     reconstruction=plan.reconstruction, n_jobs=plan.n_jobs, rng=rng)
            out.update(labels=parts(np.asarray(labels)), kernel_gamma=g,
                       sent_kind="Gaussian-kernel values to the landmarks, one row of n_y per record")
        else:
            if plan.method == "tsne":
                E, path = tsne_from_distance_rows(B, Y, perplexity=plan.perplexity, n_components=plan.n_components,
                                                  n_iter=plan.n_iter, reconstruction=plan.reconstruction,
                                                  noisy_landmarks=noisy, n_jobs=plan.n_jobs, rng=rng)
            else:
                E, path = umap_from_distance_rows(B, Y, n_neighbors=plan.n_neighbors, min_dist=plan.min_dist,
                                                  n_components=plan.n_components, reconstruction=plan.reconstruction,
                                                  noisy_landmarks=noisy, n_jobs=plan.n_jobs, rng=rng)
            out.update(coordinates=parts(np.asarray(E)),
                       sent_kind="squared distances to the landmarks, one row of n_y per record")
        out["reconstruction"] = path
        return out


def _spread(Y: np.ndarray) -> float:
    if not np.all(np.isfinite(Y)):
        return math.inf
    return float(np.sqrt(np.max(np.sum((Y - Y.mean(axis=0)) ** 2, axis=1))))
