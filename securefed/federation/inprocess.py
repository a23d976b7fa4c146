"""The in-process driver: the coordinator and one :class:`~.site.SiteWorker` per site in this process.

:class:`InMemoryExchange` is a transport like Flower's (requests with deadlines, replies by address), with a
simulated clock: when a site does not answer, the clock jumps to the request's deadline — nothing sleeps. It
can also play a deployment's faults (a site that falls silent at some operation, a late reply, a restarted
site with a new address and empty state, a fresh site process per message), so the coordinator's handling of
them is tested without Flower. :func:`run_in_process` is what the estimators and ``securefed run`` call.
"""

from __future__ import annotations

import os

import numpy as np
from threadpoolctl import threadpool_limits

from .coordinator import Coordinator, ListNodes
from .site import SiteWorker
from .wire import check_fields

__all__ = ["InMemoryExchange", "drive", "run_in_process", "site_names"]


class InMemoryExchange:
    """Deliver requests to site workers in this process.

    Parameters
    ----------
    workers : dict
        ``{address: SiteWorker}``.
    silent_from : dict, optional
        ``{address: op}``: the site stops answering from its first request with that ``op`` on (a crashed node).
    late : dict, optional
        ``{address: (op, seconds)}``: the site's replies to ``op`` take that long; a reply later than the
        request's deadline is lost (the coordinator never sees it).
    fresh_process : bool
        Rebuild each worker from its stored state before every message (as a Flower ClientApp process is).
    after_reply : callable, optional
        ``after_reply(address, request, reply)`` before the coordinator sees the reply (tests use it to
        inspect or tamper).
    before_request : callable, optional
        ``before_request(address, request) -> request``: what the site receives instead of the coordinator's
        request (a copy; tests use it to play a coordinator that lies to one site).
    sign_lies : bool
        With ``before_request``: re-bind the secure sum's task digest in the rewritten request's spec to the
        rewritten fields — a coordinator that lies *and* announces its lie in the round spec, so that the site's
        own checks of the lie are reached (without it the digest check refuses every rewritten sum first).
    """

    def __init__(
        self,
        workers: dict,
        *,
        silent_from: dict | None = None,
        late: dict | None = None,
        fresh_process: bool = False,
        after_reply=None,
        before_request=None,
        sign_lies: bool = False,
    ):
        self.workers = dict(workers)
        self.silent_from = dict(silent_from or {})
        self.late = dict(late or {})
        self.fresh_process = fresh_process
        self.after_reply = after_reply
        self.before_request = before_request
        self.sign_lies = sign_lies
        self.dead: set = set()
        self.clock = 0.0
        self.ops: list = []

    def now(self) -> float:
        return self.clock

    def addresses(self) -> list:
        return sorted(a for a in self.workers if a not in self.dead)

    def restart(self, address, new_address=None):
        """The site at ``address`` comes back as a new node: new address, same data and options, empty state."""
        old = self.workers[address]
        self.dead.add(address)
        new = new_address if new_address is not None else max(a for a in self.workers if isinstance(a, int)) + 1
        self.workers[new] = SiteWorker(old.options, old._records)
        self.silent_from.pop(address, None)
        return new

    def request(self, payloads: dict, deadline: float) -> dict:
        out = {}
        missing = False
        for a, fields in payloads.items():
            if self.before_request is not None:
                told = dict(fields)
                fields = self.before_request(a, dict(fields))
                if self.sign_lies and fields != told:
                    fields = _rebind_digest(fields)
            self.ops.append(fields.get("op"))
            if a in self.dead or a not in self.workers or self.silent_from.get(a) == fields.get("op"):
                self.dead.add(a)
                missing = True
                continue
            op, delay = self.late.get(a, (None, 0.0))
            if op == fields.get("op") and delay > deadline - self.clock:
                missing = True
                continue
            w = self.workers[a]
            if self.fresh_process:
                w = self.workers[a] = SiteWorker(w.options, w._records, state=dict(w.state))
            reply = check_fields(w.handle(dict(check_fields(fields, "request"))), "reply")
            if self.after_reply is not None:
                self.after_reply(a, fields, reply)
            out[a] = reply
        if missing:
            self.clock = max(self.clock, deadline)  # the missing replies time out
        return out


def _rebind_digest(fields: dict) -> dict:
    """``fields`` with its round spec's task digest recomputed from its own fields (see ``sign_lies``)."""
    import dataclasses

    from ..securesum.ckks import decode_ckks_spec, encode_ckks_spec
    from ..securesum.secagg import decode_input, decode_spec, encode_input, encode_spec
    from .messages import request_digest

    op, spec = fields.get("op"), fields.get("spec")
    if spec is None or op not in ("secagg-input", "secagg-start", "ckks-start"):
        return fields
    digest = request_digest(fields)
    if op == "secagg-input":
        return dict(fields, spec=encode_input(dataclasses.replace(decode_input(spec), task_digest=digest)))
    if op == "secagg-start":
        return dict(fields, spec=encode_spec(dataclasses.replace(decode_spec(spec), task_digest=digest)))
    return dict(fields, spec=encode_ckks_spec(dataclasses.replace(decode_ckks_spec(spec), task_digest=digest)))


def drive(coordinator: Coordinator, exchange):
    """Run ``coordinator`` over ``exchange`` (anything with ``addresses()``, ``request(payloads, deadline)`` and
    ``now()``) to the end; returns its :class:`~.result.RunResult` (or raises the run's typed error)."""
    try:
        step = coordinator.start(exchange.addresses())
        while step is not None:
            reply = (
                exchange.addresses() if isinstance(step, ListNodes) else exchange.request(step.payloads, step.deadline)
            )
            step = coordinator.receive(reply, exchange.now())
    except Exception as exc:
        exc.partial = coordinator.partial  # type: ignore[attr-defined]  # what the run had decided before it stopped (e.g. the audit verdict)
        raise
    return coordinator.result


def site_names(n: int) -> list[str]:
    """``site-00``, ``site-01``, ... (sorting by name keeps the order the sites were given in)."""
    width = max(2, len(str(n - 1)))
    return [f"site-{i:0{width}d}" for i in range(n)]


def run_in_process(
    plan, sites, *, names=None, site_options=None, ledger=None, resume=None, on_event=None, exchange: dict | None = None
):
    """Run ``plan`` on ``sites`` (one record array per site) in this process; returns the RunResult.

    ``site_options`` (one dict per site, or one for all) are the sites' own options (DP budget and ledger
    folder, floors); ``ledger`` the coordinator's aggregate ledger (DP); ``exchange`` options of
    :class:`InMemoryExchange` (faults, keyed by site index). Under DP each site keeps its own ledger: in
    ``<the aggregate ledger's folder>/site-ledgers/<site>/`` when the aggregate ledger is a file (so a crash
    loses nothing a site released), in memory otherwise.
    """
    from .privacy import MEMORY

    sites = [np.asarray(X, dtype=np.float64) for X in sites]
    names = list(names) if names is not None else site_names(len(sites))
    if isinstance(site_options, dict) or site_options is None:
        site_options = [dict(site_options or {}) for _ in sites]
    workers = {}
    for i, (X, name, opts) in enumerate(zip(sites, names, site_options)):
        o = {"site-name": name, **opts}
        if plan.aggregation == "plain":
            o.setdefault("allow-plain", True)  # the user of this simulation chose plain aggregation for every site
        # the user of this simulation is every site's operator: the sites' own conditions follow the plan
        o.setdefault("cell-floor", int(plan.cell_floor))
        o.setdefault("require-audit", plan.audit_holdout > 0)
        o.setdefault("max-auc", float(plan.max_auc))
        o.setdefault("max-empirical-epsilon", float(plan.max_empirical_epsilon))
        o.setdefault("allow-audit-failure", bool(plan.allow_audit_failure))
        paper = plan.nystrom == "rows" or (plan.landmark_method == "feddl" and not plan.dp)
        o.setdefault("allow-paper-mode", paper)  # the paper's mode, asked for by the user of this simulation
        if plan.noise == "distributed":
            o.setdefault("allow-distributed-noise", True)  # ... and noise shares for every site
        if plan.dp:
            budget = float(plan.epsilon or 0.0) + float(plan.rows_epsilon or 0.0)
            o.setdefault("epsilon-budget", budget if plan.epsilon is not None else 1e12)
            path = getattr(ledger, "path", None)
            o.setdefault(
                "ledger-path",
                MEMORY if path is None else os.path.join(os.path.dirname(os.path.abspath(path)), "site-ledgers", name),
            )
            if plan.noise_seed_for_testing is not None:
                o.setdefault("allow-seeded-noise", True)
        workers[i] = SiteWorker(o, X)
        workers[i].on_progress = on_event  # the sites' long steps (the placement) report on the same channel
    ex = InMemoryExchange(workers, **dict(exchange or {}))
    # the site computations are small products: one BLAS thread is 5–10× faster than two on 2 shared cores
    with threadpool_limits(limits=1, user_api="blas"):
        res = drive(Coordinator(plan, ledger=ledger, resume=resume, on_event=on_event), ex)
    if plan.coordinates == "keep":  # this process simulates the sites: collect what each kept on its own side
        res.site_outputs = {w.name: w.kept for w in ex.workers.values() if w.kept is not None}
    return res
