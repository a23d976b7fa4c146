"""The coordinator/site glue of differential privacy: what goes on the wire and what each side checks. The DP itself
— mechanisms, their events, accountants, the ledger, the site's budget over runs, the billboard's split, the
integer mechanisms' fit to the ledger and the check of their claims — lives in :mod:`securefed.accounting`; this
module builds the public plans, opens a site's ledger under its site-wide budget, applies the site's options
(``epsilon-budget``, ``allow-seeded-noise``, ``allow-distributed-noise``), checks the coordinator's claims against
the site's own calibration, and keeps the coordinator's mirror ledger and report. The in-process run and the Flower
run use it alike.

What is public and what each side does
--------------------------------------
The calibration of Qiao et al. §5.2 (Theorem 5 / the exact accountant) needs only public numbers:
the site sizes ``n_p`` (announced at ``hello``), ``n_y``, γ, the rounds ``S``, the local steps ``Q``, the
clip norm ``τ_X``, the sampling rate and the client weights. Both sides build the *same*
``GradientPerturbation`` and call its :meth:`~securefed.accounting.GradientPerturbation.calibrate` with the
announced sizes, so σ_p, Δ_p and the noise multiplier are computed by the same code on both sides.

* The **coordinator** (:class:`ServerPrivacy`) sends each site the plan and the σ it computed, mirrors every
  release the sites report into the aggregate ledger (same event ids as the sites' ledgers), settles
  distributed-noise aggregations with the actual survivors and reports the privacy block.
* A **site** (:func:`site_mechanism`) never takes the server's σ on trust: it rebuilds the mechanism
  from the public plan with its **own** ledger (site option ``ledger-path``, one file per run) and its
  **own** budget (``epsilon-budget``, the total over all its runs, checked and booked atomically per release under
  one site-wide lock and a hash-chained index of all its ledgers: :mod:`securefed.accounting.site_budget`), refuses (``BudgetExceededError``) if the plan or any release would
  exceed that budget, refuses if the server's σ is smaller than its own calibration, clips its records to
  ``τ_X``, adds its noise and writes each release to its ledger (fsync'd) **before** the reply leaves.

Noise sources
-------------
By default the noise comes from a CSPRNG on the site (ChaCha20 keyed by ``os.urandom``): nobody can
reproduce it. The option ``noise-seed-for-testing`` seeds it from a public number instead — reproducible,
**and anyone who knows the seed (the server) can subtract the noise**, so the ε is void; a site refuses it
unless its operator sets ``allow-seeded-noise = true``.

Distributed noise (``noise = "distributed"``) is accepted only with gradient averaging and a secure sum
(``secagg`` / ``ckks``; a site refuses to put a noise share into a ``plain`` upload). The coordinator settles
every aggregation with its actual survivors in the aggregate ledger; the site's own ledger keeps the worst
case it accepted (``min-survivors`` = t survivors), which bounds what it spends because it helps reveal only
sums over at least t sites (:func:`site_settle`).

Integer distributed noise (``distributed_mechanism`` ``ddg`` / ``skellam``; issue 14): the continuous shares
would be clipped and rounded by SecAgg+'s fixed-point codec after the noise is added. Instead each site encodes
its weighted gradient with the distributed discrete Gaussian (Kairouz, Liu & Steinke 2021) or Skellam (Agarwal,
Kairouz & Liu 2021) mechanism of :mod:`securefed.accounting.distributed` — clip, public rotation, randomized
rounding, integer noise — and SecAgg+ sums the words mod ``2^bits`` exactly (:func:`integer_mechanism`,
:func:`site_integer_mechanism`, :func:`site_integer_release`; the coordinator decodes, :meth:`ServerPrivacy.decode`).
"""

from __future__ import annotations

import hashlib
import json
import os

import numpy as np

from ..errors import BudgetExceededError, ConfigError, ProtocolAbortedError, ProtocolError, bad_value
from ..plan import INTEGER_MECHANISMS
from ..accounting.distributed import check_integer_claim, integer_claim
from .wire import dumps, truthy

__all__ = [
    "open_server_ledger",
    "public_plan",
    "build_mechanism",
    "site_mechanism",
    "ServerPrivacy",
    "site_mechanism_checks",
    "site_ledger_path",
    "site_settle",
    "release_events",
    "derive_run_id",
    "noise_share_note",
    "mirror_release",
    "plan_digest",
    "site_ledger_dir",
    "open_site_ledger",
    "check_noise_mode",
    "integer_mechanism",
    "integer_claim",
    "site_integer_mechanism",
    "site_integer_release",
]


def public_plan(plan, run_id: str, sizes, gamma: float, weights, n_features: int | None = None) -> dict:
    """The public DP plan (JSON-able) the coordinator sends with every DP request, from a
    :class:`~securefed.plan.RunPlan` and the public numbers of the run. Under an integer distributed mechanism
    (``distributed_mechanism`` ddg / skellam) it also names the mechanism, the feature count (the encoded
    vector's length) and the weight rule; other plans are unchanged."""
    out = _public_plan(plan, run_id, sizes, gamma, weights)
    kind = getattr(plan, "distributed_mechanism", "auto")
    if plan.noise == "distributed" and kind in INTEGER_MECHANISMS:
        out.update(distributed_mechanism=kind, n_features=int(n_features), weights_rule=plan.weights)
    return out


def _public_plan(plan, run_id: str, sizes, gamma: float, weights) -> dict:
    return {
        "run_id": run_id,
        "epsilon": plan.epsilon,
        "noise_multiplier": plan.noise_multiplier,
        "delta": float(plan.delta),
        "accountant": plan.accountant,
        "noise": plan.noise,
        "tau_x": float(plan.clip_norm),
        "sample_rate": float(plan.sample_rate),
        "noise_seed": plan.noise_seed_for_testing,
        "min_survivors": plan.min_survivors,
        "sensitivity_rule": plan.sensitivity_rule,
        "sizes": [int(n) for n in sizes],
        "weights": [float(v) for v in weights],
        "gamma": float(gamma),
        "n_landmarks": int(plan.landmarks),
        "rounds": int(plan.rounds),
        "local_steps": int(plan.local_steps),
        "rule": plan.rule,
        "aggregation": plan.aggregation,
    }


def build_mechanism(plan: dict, ledger, noise_multiplier: float | None = None):
    """A prepared :class:`GradientPerturbation` for ``plan`` writing to ``ledger`` (both sides use this).

    ``noise_multiplier``: the z this side already calibrated for ``plan`` (skips the calibration, which
    takes seconds with the numerical accountants); default: calibrate from ``plan``.
    """
    from ..accounting import GradientPerturbation

    integer = plan.get("distributed_mechanism") in INTEGER_MECHANISMS
    eps, z = plan["epsilon"], plan["noise_multiplier"]
    if noise_multiplier is not None and not integer:
        eps, z = None, float(noise_multiplier)
    gp = GradientPerturbation(
        epsilon=eps,
        delta=plan["delta"],
        noise_multiplier=z,
        accountant=plan["accountant"],
        noise=plan["noise"],
        tau_x=plan["tau_x"],
        sample_rate=plan["sample_rate"],
        ledger=ledger,
        insecure_noise_seed_for_testing=plan["noise_seed"],
        sensitivity_rule=plan["sensitivity_rule"],
        min_survivors=plan["min_survivors"],
    )
    # an integer mechanism registers its own dominating z below: no Gaussian calibration (a placeholder whose
    # plan trivially fits, replaced before anything is released)
    gp.calibrate(
        plan["sizes"],
        gamma=plan["gamma"],
        n_landmarks=plan["n_landmarks"],
        rounds=plan["rounds"],
        local_steps=plan["local_steps"],
        rule=plan["rule"],
        weights=np.asarray(plan["weights"], dtype=float),
        aggregator=plan["aggregation"],
        noise_multiplier=1e6 if integer else None,
    )
    gp.integer = None  # type: ignore[attr-defined]  # the site mechanism carries its integer mechanism here
    if integer:
        _attach_integer(gp, plan)
    return gp


def _attach_integer(gp, plan: dict) -> None:
    """Build the plan's integer mechanism on ``gp`` (:func:`integer_mechanism`) and register its dominating noise
    multiplier as every site's plan in the ledger (the budget check of the whole plan; it fits by construction)."""
    mech = integer_mechanism(gp, plan)
    z = float(mech.ledger_noise_multiplier())
    gp.integer = mech
    gp.z = z
    gp.sigma = [z * float(mech.l2_int)] * gp.n_clients  # integer units: what each site's ledger event carries
    gp.plan_epsilon = [gp.ledger.set_plan(p, z, 1.0, gp.releases_planned) for p in range(gp.n_clients)]


# ------------------------------------------------------------------------------------------------ site


#: the ``ledger-path`` of an in-process site whose ledger lives in memory (estimators without a run folder)
MEMORY = ":memory:"


def site_ledger_dir(node_config: dict) -> str:
    """The site's ledger folder (site option ``ledger-path``; default ``securefed-ledgers`` in the SuperNode's
    working directory), created if missing."""
    d = str(node_config.get("ledger-path") or "securefed-ledgers")
    os.makedirs(d, exist_ok=True)
    return d


def site_ledger_path(node_config: dict, run_id: str) -> str:
    """``<ledger-path>/<run-id>.jsonl``: the site's ledger of this run. A restarted SuperNode reopens the same
    file."""
    if not run_id or "/" in run_id or run_id.startswith(".") or run_id + ".jsonl" == "site-index.jsonl":
        raise ProtocolError(f"bad DP run id {run_id!r} from the server")
    return os.path.join(site_ledger_dir(node_config), run_id + ".jsonl")


def check_noise_mode(noise, node_config: dict) -> None:
    """A site adds a share σ/√t instead of its full σ only where its operator agreed (site option
    ``allow-distributed-noise``, default false): the coordinator's plan cannot lower a site's noise. A plan asking a
    site without that option for a share is refused (:class:`ConfigError`) before anything is computed or booked;
    the site does not silently add its full σ instead (the sum would carry more noise than the run reports)."""
    if noise == "distributed" and not truthy(node_config.get("allow-distributed-noise", False)):
        raise ConfigError(
            bad_value(
                "noise",
                "distributed",
                "this site adds its full σ to every release: it adds only a "
                "share σ/√t inside a secure sum where its operator allows it (site option "
                "allow-distributed-noise=true, trusting that at least t sites' shares are in every "
                "sum revealed); run with noise local, or set that option on every site",
            )
        )


def site_mechanism_checks(plan: dict, node_config: dict) -> float:
    """The site operator's conditions for any DP release: its ``epsilon-budget`` (returned) is set, and
    seeded noise is used only if ``allow-seeded-noise`` is true (ConfigError otherwise)."""
    budget = node_config.get("epsilon-budget")
    try:
        ok = budget is not None and float(budget) > 0
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise ConfigError(
            bad_value(
                "node config epsilon-budget",
                budget,
                "this site takes part in differentially "
                "private runs only with its own ε budget: start the SuperNode with "
                "--node-config '... epsilon-budget=2.0'",
            )
        )
    if plan["noise_seed"] is not None and not truthy(node_config.get("allow-seeded-noise", False)):
        raise ConfigError(
            bad_value(
                "noise-seed-for-testing",
                plan["noise_seed"],
                "the run asks for seeded (reproducible, "
                "NOT secret) noise: the server knows the seed and could remove it. Run without it, or "
                "set allow-seeded-noise=true in this site's options for experiments",
            )
        )
    return float(budget)


def _memo_ledger(memo: dict, *args, **kw):
    """:func:`securefed.accounting.ledger.memo_ledger`: the site's ε memo lives in its SuperNode state."""
    from ..accounting.ledger import memo_ledger

    return memo_ledger(memo, *args, **kw)


def plan_digest(plan: dict) -> str:
    """Digest of the public plan without the server's σ claims (the site's calibration cache key)."""
    doc = {k: v for k, v in plan.items() if k not in ("sigma", "integer_claim")}
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:32]


def _site_budget(node_config: dict, budget: float, memo: dict):
    """The site-wide budget of this site's ``ledger-path`` (:class:`~securefed.accounting.site_budget.SiteBudget`):
    one lock and one hash-chained index over the ledgers of all its runs; other runs' ledgers are read read-only
    with the site's memoised accountant."""
    from ..accounting.site_budget import SiteBudget

    def open_ledger(path, head):
        return _memo_ledger(
            memo, path, head["run_id"], delta=head["delta"], accountant=head["accountant"], read_only=True
        )

    return SiteBudget(site_ledger_dir(node_config), budget, open_ledger, memo.setdefault("site-spent", {}))


def open_site_ledger(plan: dict, node_config: dict, cache: dict):
    """The site's ledger of this run (``<ledger-path>/<run-id>.jsonl``) under the site-wide budget: every check and
    booking of a release holds the site's lock and adds what the site spent in all its other runs
    (:class:`~securefed.accounting.site_budget.SiteBudget`; a tampered earlier ledger is refused with
    :class:`LedgerError` naming it). A new run with nothing left is refused with :class:`BudgetExceededError`."""
    budget = site_mechanism_checks(plan, node_config)
    memo = cache.setdefault("eps", {})
    kw = dict(delta=plan["delta"], accountant=plan["accountant"])
    if node_config.get("ledger-path") == MEMORY:  # an in-process site without a run folder: this run only
        if "memory_ledger" not in cache:
            cache["memory_ledger"] = _memo_ledger(memo, None, plan["run_id"], budget_epsilon=budget, **kw)
        return cache["memory_ledger"]
    path = site_ledger_path(node_config, plan["run_id"])
    guard = _site_budget(node_config, budget, memo)
    with guard.locked():
        guard.sync()
        if not os.path.exists(path):
            before, _, runs = guard.spent_elsewhere(plan["run_id"])
            if not budget - before > 1e-12:
                raise BudgetExceededError(
                    bad_value(
                        "node config epsilon-budget",
                        budget,
                        f"this site already spent ε = "
                        f"{before:.4g} in {len(runs)} earlier run(s) ({', '.join(runs)}); "
                        f"nothing is left for run {plan['run_id']}",
                    )
                )
            led = _memo_ledger(memo, path, plan["run_id"], budget_epsilon=budget, site_budget=guard, **kw)
        else:  # this run's ledger: its budget is in its header (a budget cannot change mid-run)
            led = _memo_ledger(memo, path, plan["run_id"], site_budget=guard, **kw)
        guard.sync()  # a new ledger's header enters the index
    return led


def site_mechanism(plan: dict, node_config: dict, site: int, cache: dict | None = None):
    """The site's own mechanism for ``plan``: its ledger, its budget, its own calibration.

    ``cache`` (a dict the caller keeps in the site's state between messages) holds what this site already
    computed: its noise multiplier per plan, a memo of ε values and its spending in earlier runs; it is
    filled on first use. The budget is what is left of ``epsilon-budget`` after the site's earlier runs.

    Raises :class:`ConfigError` when the site's operator set no ``epsilon-budget`` or the plan asks for
    seeded noise the operator did not allow; :class:`BudgetExceededError` when the whole plan would exceed
    the budget (``PrivacyLedger.set_plan``); :class:`ProtocolError` when the server's claimed σ for this site
    is below the site's own calibration.
    """
    site = int(site)
    if not 0 <= site < len(plan["sizes"]):
        raise ProtocolError(f"site index {site} outside the plan's {len(plan['sizes'])} sites")
    check_noise_mode(plan.get("noise"), node_config)
    cache = {} if cache is None else cache
    zs = cache.setdefault("z", {})
    ledger = open_site_ledger(plan, node_config, cache)
    digest = plan_digest(plan)
    try:
        gp = build_mechanism(plan, ledger, zs.get(digest))  # set_plan inside checks the whole plan against the budget
    except BudgetExceededError as exc:
        raise BudgetExceededError(
            f"this site refuses run {plan['run_id']}: its plan does not fit what is left of its "
            f"epsilon-budget {site_mechanism_checks(plan, node_config):g} after its other runs; "
            f"nothing was computed or sent. ({exc})"
        ) from None
    zs[digest] = float(gp.z)
    claimed = (plan.get("sigma") or [None] * len(plan["sizes"]))[site]
    if claimed is not None and float(claimed) < gp.sigma[site] * (1 - 1e-9):
        raise ProtocolError(
            f"the server asks for σ={float(claimed):.6g} but this site's own calibration gives "
            f"σ={gp.sigma[site]:.6g}; refusing"
        )
    return gp


def site_settle(gp, site: int, settle: list) -> None:
    """Record in the site's ledger the settlements the server announced ``[[round, step, survivors], ...]``
    for this site's distributed-noise releases (the site recomputes the noise multiplier itself) — but
    only those that **raise** its spending: a survivor list of ``t`` or more sites could only lower the
    worst case the site booked when it released, and the site does not take the server's word for that.

    Since an honest site helps reveal a distributed-noise sum only over at least ``t`` survivors (its
    SecAgg+ client refuses smaller survivor sets; a CKKS round is specified with ``min_survivors ≥ t``),
    the worst case it books at release time is an upper bound on what it spends, whether or not a
    settlement reaches it later (the last aggregation's never does)."""
    if gp.noise != "distributed" or getattr(gp, "integer_kind", None):
        return  # integer mechanisms book the worst case over every k ≥ t survivors at release time
    for rnd, step, surv in settle or []:
        surv = sorted({int(s) for s in surv})
        evs = gp.ledger.releases_at(int(site), int(rnd), int(step))
        if evs and int(site) in surv and len(surv) < gp.t:
            gp.settle(round=rnd, step=step, survivors=surv, release_ids={int(site): evs[-1]["id"]})


def release_events(gp, site: int, rnd: int, steps) -> list:
    """The site's latest ledger event for each (round, step) it just released, as JSON strings (for the server)."""
    out = []
    for t in steps:
        evs = gp.ledger.releases_at(int(site), int(rnd), int(t))
        if evs:
            out.append(json.dumps(evs[-1], sort_keys=True))
    return out


# ------------------------------------------------------------------------------- integer distributed noise


def integer_mechanism(gp, plan: dict):
    """The run's integer mechanism from the public plan (:func:`securefed.accounting.distributed.fit_integer_mechanism`:
    the same numbers on the coordinator and on every site)."""
    from ..accounting.distributed import fit_integer_mechanism

    kind = plan["distributed_mechanism"]
    if kind not in INTEGER_MECHANISMS:
        raise ConfigError(bad_value("distributed_mechanism", kind, f"use one of {', '.join(INTEGER_MECHANISMS)}"))
    return fit_integer_mechanism(
        gp, kind, n_features=int(plan["n_features"]), rotation_seed=str(plan["run_id"]), weights=plan["weights"]
    )


def site_integer_mechanism(plan: dict, gp, site: int, n_features: int):
    """A site's own integer mechanism for ``plan`` — never the coordinator's numbers — after checking what the
    coordinator claims against it (:class:`ProtocolError` otherwise, nothing computed or sent):

    * the plan's feature count is the site's own and the plan's weight for this site is its own rule's weight
      (records: its record count over the announced total; uniform: 1/P);
    * the claimed per-site noise (σ² or λ) and modulus bits are not below the site's own calibration, and the
      claimed granularity and padded dimension are the site's own (the coordinator decodes with them).

    """
    if int(plan["n_features"]) != int(n_features):
        raise ProtocolError(f"the DP plan encodes {plan['n_features']} features, this site has {n_features}; refusing")
    sizes = np.asarray(plan["sizes"], dtype=float)
    own = (
        sizes / sizes.sum() if plan.get("weights_rule", "records") == "records" else np.full(len(sizes), 1 / len(sizes))
    )
    if not np.isclose(float(plan["weights"][site]), own[site], rtol=1e-9, atol=0.0):
        raise ProtocolError(
            f"the DP plan weighs this site {plan['weights'][site]!r}, its own rule "
            f"({plan.get('weights_rule', 'records')}) gives {own[site]!r}; refusing"
        )
    mech = gp.integer  # the site's own calibration from the public plan (build_mechanism)
    check_integer_claim(mech, plan.get("integer_claim"))
    return mech


def site_integer_release(gp, mech, plan: dict, grad: np.ndarray, *, site: int, rnd: int, step: int, spec) -> np.ndarray:
    """One site's integer release (KLS / AKL Algorithm 1 via :meth:`_DistributedInteger.encode`): check the SecAgg+
    spec (integer input, modulus ≥ the mechanism's, the padded length), check the rest of the plan fits the site's
    budget, write the release to the site's ledger (fsync'd), then encode ``w_p · grad`` — clipped, rotated,
    rounded, with this site's integer noise — into words mod ``2^bits``. Nothing about the clipping leaves the
    site. The noise comes from ``os.urandom`` unless the plan has ``noise_seed`` (testing: the ε is void)."""
    from ..accounting.samplers import SeededWordSource

    if spec is None or not getattr(spec, "integer", False):
        raise ProtocolError(
            f"this site's {mech.mechanism} upload is a vector of integers mod 2^{mech.modulus_bits}: it "
            "goes only into a SecAgg+ round with integer input; refusing"
        )
    if spec.fixed_point.modulus_bits < mech.modulus_bits:
        raise ProtocolError(
            f"the SecAgg+ round sums mod 2^{spec.fixed_point.modulus_bits}, below the 2^{mech.modulus_bits} "
            "this site's wrap-around bound needs; refusing"
        )
    if spec.length != mech.padded_dim:
        raise ProtocolError(
            f"the SecAgg+ round sums {spec.length} words, the encoded vector has {mech.padded_dim}; refusing"
        )
    z = float(mech.ledger_noise_multiplier())
    led = gp.ledger
    if not getattr(gp, "_integer_plan_checked", False):
        first = int(rnd) * gp.local_steps + int(step)
        led.check_plan(site, z, 1.0, max(gp.releases_planned - first, 0))
        gp._integer_plan_checked = True
    attempt = len(led.releases_at(site, rnd, step))
    seed = plan.get("noise_seed")
    src = None if seed is None else SeededWordSource(int(seed), (site, rnd, step, attempt))
    mech.record_release(
        led,
        site=site,
        round=rnd,
        step=step,
        attempt=attempt,
        noise_source="secure" if seed is None else "seeded-testing",
    )
    w = float(plan["weights"][site])
    return mech.encode(w * np.asarray(grad, dtype=np.float64).ravel(), round=rnd, step=step, src=src)


# ---------------------------------------------------------------------------------------------- server

_MIRROR_SKIP = (
    "type",
    "id",
    "run_id",
    "accountant_state",
    "time",
    "site",
    "round",
    "step",
    "attempt",
    "mechanism",
    "sensitivity",
    "sigma",
    "noise_multiplier",
    "sample_rate",
    "event",
)


def mirror_release(ledger, site: int, ev: dict) -> None:
    """Copy one release event a site reported into the server's ``ledger`` (same id; skipped if present).

    The server's budget check applies (:class:`BudgetExceededError` if the site released more than planned).
    """
    if ledger.get(ev["id"]) is not None:
        return
    if ev.get("run_id") != ledger.run_id or int(ev.get("site", -1)) != int(site):
        raise ProtocolError(f"site {site} reported a release of another run or site: {ev.get('id')}")
    from ..accounting.events import ReleaseEvent

    extra = {k: v for k, v in ev.items() if k not in _MIRROR_SKIP}
    try:
        event = ReleaseEvent.from_ledger_fields(ev)
        if "event" in ev and ReleaseEvent.from_dict(ev["event"]) != event:
            raise ProtocolError(f"site {site} reported a release whose event disagrees with its fields: {ev.get('id')}")
    except (ConfigError, KeyError, TypeError, ValueError) as exc:
        raise ProtocolError(f"site {site} reported a malformed release {ev.get('id')}: {exc}") from None
    ledger.record(event, site=int(site), round=ev["round"], step=ev["step"], attempt=int(ev["attempt"]), **extra)


class ServerPrivacy:
    """The server's side of DP over Flower: plan, aggregate ledger, settlements, report.

    Parameters
    ----------
    plan : RunPlan
    run_id : str
        Ledger run id shared with the sites (event ids ``{run_id}/site{p}/round{s}/step{t}/attempt{a}``).
    sizes, weights : sequences
        Public site sizes (from ``hello``) and the normalised client weights.
    gamma : float
    ledger : PrivacyLedger, optional
        The aggregate ledger (:func:`open_server_ledger`; default in memory).
    """

    def __init__(self, plan, run_id: str, sizes, weights, gamma: float, ledger=None, n_features: int | None = None):
        self.plan = public_plan(plan, run_id, sizes, gamma, weights, n_features)
        self.ledger = ledger if ledger is not None else open_server_ledger(plan, run_id, None)
        self.gp = build_mechanism(self.plan, self.ledger)
        self.gp.clipped_per_site = [None] * len(sizes)  # counted on each site; never sent
        self._pending: dict = {}
        self.unsettled: list = []  # [[round, step, survivors]] to tell the sites
        #: the distributed discrete Gaussian / Skellam mechanism (None: Gaussian noise)
        self.integer = self.gp.integer

    @property
    def secagg_bits(self) -> int:
        """The SecAgg+ modulus of the integer sums: the mechanism's bits (SecAgg+ words have at least 16)."""
        return max(16, int(self.integer.modulus_bits))

    def decode(self, agg, rnd: int, step: int, shape):
        """The integer secure sum's words → ``Σ_{p∈U} w_p clip(∇f_p)`` plus the summed noise (KLS / AKL decoder),
        with the survivors' normalised weight total, as the server step expects."""
        from ..securesum.base import AggregateResult

        total = self.integer.decode(np.asarray(agg.total).ravel(), round=rnd, step=step, shape=shape)
        w = np.asarray(self.plan["weights"], dtype=float)
        surv = tuple(int(i) for i in agg.survivors)
        if len(surv) < self.integer.min_survivors:
            raise ProtocolAbortedError(
                f"the integer sum covers {len(surv)} sites, fewer than t = "
                f"{self.integer.min_survivors}: its noise is not what was accounted"
            )
        return AggregateResult(
            total,
            surv,
            float(w[list(surv)].sum()),
            agg.protocol,
            0,
            agg.bytes_up,
            agg.bytes_down,
            agg.seconds,
            dict(agg.details, decoded=self.integer.mechanism),
        )

    def reported(self, rnd: int, step: int) -> set:
        """Sites whose release for (round, step) is in the aggregate ledger and not yet settled."""
        return set(self._pending.get((int(rnd), int(step)), {}))

    def wire_plan(self) -> str:
        """The plan every site receives (JSON), with the σ_p the server computed for each site (and, under an
        integer mechanism, its claimed noise, modulus and granularity: :func:`integer_claim`)."""
        extra = {"integer_claim": integer_claim(self.integer)} if self.integer is not None else {}
        return json.dumps(dict(self.plan, sigma=[float(v) for v in self.gp.sigma], **extra), sort_keys=True)

    def project(self, Y: np.ndarray) -> np.ndarray:
        """The server's projection onto the τ_Y ball (after init and after each round, as in process)."""
        return self.gp.project(Y)

    def mirror(self, site: int, reply: dict, rnd: int, steps) -> None:
        """Copy the releases a site reports into the aggregate ledger (checking they are the planned ones)."""
        evs = [json.loads(s) for s in reply.get("dp_events", [])]
        want = {(int(rnd), int(t)) for t in steps}
        got = set()
        for ev in evs:
            if self.integer is not None:
                mech = self.integer
                if (
                    ev.get("mechanism") != mech.mechanism
                    or int(ev.get("modulus_bits", 0)) < mech.modulus_bits
                    or float(ev["noise_multiplier"]) < mech.ledger_noise_multiplier() * (1 - 1e-9)
                ):
                    raise ProtocolError(
                        f"site {site} reports a {ev.get('mechanism')} release (z={ev.get('noise_multiplier')}, "
                        f"2^{ev.get('modulus_bits')}) below the plan's {mech.mechanism}"
                    )
            elif float(ev["sigma"]) < self.gp.sigma[int(site)] * (1 - 1e-9):
                raise ProtocolError(f"site {site} reports σ={ev['sigma']} below the plan's {self.gp.sigma[int(site)]}")
            got.add((ev["round"], ev["step"]))
            mirror_release(self.ledger, site, ev)
            self._pending.setdefault((ev["round"], ev["step"]), {})[int(site)] = ev["id"]
        if want - got:
            raise ProtocolError(
                f"site {site} returned a noisy update without its ledger events for {sorted(want - got)}"
            )

    def after_aggregate(self, rnd: int, step: int, survivors) -> None:
        """Settle a distributed-noise aggregation with the actual survivors (server ledger)."""
        pend = self._pending.pop((int(rnd), int(step)), {})
        if self.gp.noise != "distributed" or not pend or self.integer is not None:
            return  # integer mechanisms: each release already booked the worst case over k ≥ t survivors
        self.gp.settle(round=rnd, step=step, survivors=survivors, release_ids=pend)
        self.unsettled.append([int(rnd), int(step), [int(s) for s in survivors]])

    def report(self) -> dict:
        """The privacy block of ``result.json`` (the same keys as ``securefed run``'s ``metrics.json``)."""
        rep = self.gp.report()
        rep["noise_share"] = noise_share_note(self.plan)
        rep["ledger_sites"] = (
            "each site holds its own ledger (node config ledger-path); this is the server's aggregate copy"
        )
        if self.integer is not None:
            rep = self._integer_report(rep)
        return rep

    def _integer_report(self, rep: dict) -> dict:
        """The privacy block under ddg / skellam: ε from the paper's bound (KLS Prop. 14 worst over k ∈ [t, n]
        survivors; AKL at k = t) at the releases made, the ledger's dominating bound beside it, the modulus and the
        wrap-around probability (per aggregation and, by a union bound, over the run)."""
        mech = self.integer
        done = max(
            (
                sum(1 for e in self.ledger.events("release") if e["site"] == p and e["mechanism"] == mech.mechanism)
                for p in range(len(self.plan["sizes"]))
            ),
            default=0,
        )
        for k in (
            "epsilon_paper_formula",
            "paper_formula_below_true_epsilon",
            "epsilon_paper_recipe",
            "sigma_per_site",
            "clipped_records",
            "clipped_per_site",
        ):
            rep.pop(k, None)
        eps_ledger = float(self.ledger.spent()[0])
        rep.update(
            {
                "mechanism": mech.mechanism,
                "distributed_mechanism": self.plan["distributed_mechanism"],
                "epsilon": float(mech.epsilon(done)) if done else 0.0,
                "epsilon_planned": float(mech.epsilon_accounted),
                "epsilon_ledger": eps_ledger,
                "accountant": "rdp: "
                + (
                    "KLS 2021 Prop. 14 (worst over t..n survivors)"
                    if hasattr(mech, "sigma2")
                    else "AKL 2021 Skellam RDP bound (t survivors)"
                )
                + "; ledger: a dominating Gaussian",
                "releases": done,
                "noise_multiplier": float(mech.ledger_noise_multiplier()),
                "modulus_bits": int(mech.modulus_bits),
                "secagg_modulus_bits": self.secagg_bits,
                "wrap_probability": float(mech.wrap_probability_bound),
                "wrap_probability_run": float(min(1.0, done * mech.wrap_probability_bound)),
                "clip_counts": "never sent: each site clips its weighted gradient to the public norm inside the encoder",
                "noise_source": (
                    "secure (os.urandom: exact CKS 2020 discrete Gaussian / PTRS Poisson)"
                    if self.plan["noise_seed"] is None
                    else "seeded-testing (the ε is void)"
                ),
                "integer": mech.report(),
            }
        )
        return rep


def open_server_ledger(plan, run_id: str, path: str | None):
    """The coordinator's aggregate ledger of a DP run at ``path`` (None: in memory), with the run's budget:
    ``epsilon`` (+ ``rows_epsilon`` for perturbed rows). The driver opens it; the coordinator only writes to it."""
    budget = plan.epsilon
    if budget is not None and plan.rows_epsilon is not None:
        budget += float(plan.rows_epsilon)  # total = landmarks + the rows' data perturbation
    return _memo_ledger({}, path, run_id, budget_epsilon=budget, delta=float(plan.delta), accountant=plan.accountant)


def derive_run_id(plan) -> str:
    """A stable run id from the plan's options (used when ``run_id`` is not given)."""
    keys = {k: v for k, v in plan.as_dict().items() if k != "run_id"}
    return "run-" + hashlib.sha256(json.dumps(keys, sort_keys=True, default=str).encode()).hexdigest()[:16]


def noise_share_note(plan: dict) -> str:
    """One sentence for the report on what each site added."""
    if plan["noise"] == "local":
        return "each site added its full σ_p to every local-step gradient (private on its own)"
    if plan.get("distributed_mechanism") in INTEGER_MECHANISMS:
        t = plan["min_survivors"] or len(plan["sizes"])
        what = "N_Z(0, σ²)" if plan["distributed_mechanism"] == "ddg" else "Sk(λ, λ)"
        return (
            f"each site added integer noise {what} to its clipped, rotated, rounded weighted gradient; SecAgg+ summed "
            f"the integers mod 2^k over at least t = {t} sites (no float clipping after the noise)"
        )
    t = plan["min_survivors"] or len(plan["sizes"])
    return (
        f"each site added a share σ_p = z·M/(w_p·√t), t = {t}; the revealed sum carries noise of std ≥ z·M "
        f"while at least {t} sites survive (settled per aggregation)"
    )


# ------------------------------------------------------------------------------------------- the DP billboard

from ..accounting.billboard import BILLBOARD_MECHANISMS as _BILLBOARD_MECHANISMS  # noqa: E402


def billboard_plan(plan, run_id: str, sizes) -> dict:
    """The public plan of the billboard's releases (what every site rebuilds its noise from). ``noise`` local: each
    site adds the full σ; distributed: a share σ/√t, t = ``min_survivors`` (unset: every site)."""
    t = int(plan.min_survivors or len(sizes)) if plan.noise == "distributed" else 1
    return {
        "run_id": run_id,
        "epsilon": float(plan.epsilon),
        "delta": float(plan.delta),
        "accountant": plan.accountant,
        "count_share": float(plan.count_share),
        "density_share": float(plan.density_share),
        "density_grid": int(plan.density_grid),
        "noise": plan.noise,
        "t": t,
        "sizes": [int(n) for n in sizes],
        "noise_seed": plan.noise_seed_for_testing,
    }


class BillboardPrivacy:
    """The coordinator's side of the DP billboard: the public plan, the aggregate ledger (each site's release events
    mirrored) and the privacy block of the result."""

    def __init__(self, plan, run_id: str, sizes, noise: dict, ledger=None, *, scale: float | None = None):
        self.public = {"tau_x": plan.clip_norm, "feature_scale": scale}
        self.plan = billboard_plan(plan, run_id, sizes)
        self.noise = noise
        self.ledger = ledger if ledger is not None else open_server_ledger(plan, run_id, None)
        self.reported_releases: dict = {}
        t = self.plan["t"]
        self.noise_note = (
            "each site added the full σ to its own upload: private on its own, whatever the coordinator "
            "or the other sites do (the sum carries √P·σ)"
            if self.plan["noise"] == "local"
            else f"each site added a share σ/√t (t = {t}) inside the secure sum: the revealed sum carries noise "
            f"of std ≥ σ while at least {t} sites' shares are in it — against the coordinator as long as "
            "the secure sum holds and no more sites collude with it than the sites' dp-colluders allow; "
            "a site's upload alone is not private"
        )

    def wire_plan(self) -> str:
        return dumps(self.plan)

    def mirror(self, site: int, reply: dict, release: int) -> None:
        for text in reply.get("dp_events", []):
            ev = json.loads(text)
            if ev.get("mechanism") != _BILLBOARD_MECHANISMS[release] or int(ev.get("step", -1)) != release:
                raise ProtocolError(f"site {site} reported {ev.get('mechanism')} for billboard release {release}")
            mirror_release(self.ledger, site, ev)
            self.reported_releases.setdefault(release, set()).add(int(site))

    def check_reported(self, release: int, survivors) -> None:
        missing = [i for i in survivors if i not in self.reported_releases.get(release, set())]
        if missing:
            raise ProtocolAbortedError(
                f"billboard release {release + 1}: sites {missing} were summed without reporting "
                "their ledger events; the aggregate ledger would be incomplete"
            )

    def report(self) -> dict:
        eps, delta = self.ledger.spent()
        n = self.noise
        k = 3 if n.get("sigma3") else 2
        what = " + a density of every record on the map" if k == 3 else ""
        return {
            "mechanism": f"DP billboard: random-feature mean embedding + landmark counts{what} ({k} releases)",
            "epsilon": eps,
            "delta": delta,
            "accountant": self.ledger.accountant_name,
            "epsilon_target": self.plan["epsilon"],
            "mu": n["mu"],
            "mu_per_release": [n["mu1"], n["mu2"], n["mu3"]][:k],
            "sigma_per_release": [n["sigma1"], n["sigma2"], n["sigma3"]][:k],
            "sensitivity_per_release": list(n["sensitivities"][:k]),
            "releases": k,
            "noise": self.plan["noise"],
            "noise_share": self.noise_note,
            "adjacency": "replace one record",
            "epsilon_per_site": {str(p): self.ledger.spent(p)[0] for p in self.ledger.sites()},
            "tau_x": self.public["tau_x"],
            "feature_scale": self.public["feature_scale"],
            "clip_note": "each record is divided by the public feature scale, mapped into the public basis and "
            "its random features are bounded (‖φ‖ = 1): the sensitivity needs no clipping of records",
        }


def site_billboard_release(
    fields: dict, F: np.ndarray, node_config: dict, site: int, cache: dict, n_records: int, op: str = "secagg"
):
    """A site's billboard release (``release`` 0: Σφ over its records; 1: its counts per landmark; 2: the density
    of all its records — ``F`` then holds every record, the hold-out too — on the landmark map) with its own noise.

    The site rebuilds σ from the public plan (never the coordinator's number), checks that all releases fit what is
    left of its budget before the first one, refuses a plan that names another record count for it or that differs
    from the plan of the run's earlier releases (the budget split is fixed once per run), adds its noise
    (the full σ, or a share σ/√t inside a secure sum) from the CSPRNG and writes the release to its own ledger —
    fsync'd — before returning. Returns ``(noisy vector, [ledger event as JSON])``."""
    from ..accounting.noise import secure_standard_normal, seeded_standard_normal
    from ..landmarks.cells import cell_counts
    from ..accounting.billboard import billboard_events, billboard_plan_event
    from ..landmarks.merf import billboard_noise, rff, rff_frequencies
    from .wire import get_array

    plan = json.loads(fields["billboard"])
    check_noise_mode(plan.get("noise"), node_config)
    release = int(fields["release"])
    if release not in (0, 1, 2):
        raise ProtocolError(f"unknown billboard release {release}")
    pinned = cache.setdefault("billboard_plans", {}).setdefault(str(plan.get("run_id")), plan_digest(plan))
    if pinned != plan_digest(plan):  # e.g. a small share of μ² claimed for each release in turn: more than ε in all
        raise ProtocolError(
            f"the billboard plan of run {plan.get('run_id')} differs from the one this site started the "
            "run with (shares, ε, δ or sizes changed between releases); refusing"
        )
    if release < 2 and int(plan["sizes"][site]) != int(n_records):
        raise ProtocolError(
            f"the billboard plan announces {plan['sizes'][site]} records for this site, which holds "
            f"{n_records}; refusing"
        )
    noise = billboard_noise(plan["epsilon"], plan["delta"], plan["count_share"], float(plan.get("density_share", 0.0)))
    if release == 2 and not noise["sigma3"]:
        raise ProtocolError(
            "a density release was asked for, but the billboard plan spends no budget on it (density_share 0); refusing"
        )
    ledger = open_site_ledger({**plan, "noise_seed": plan.get("noise_seed")}, node_config, cache)
    if release == 0:
        d = F.shape[1]
        W = rff_frequencies(d, int(fields["n_freq"]), tuple(float(v) for v in fields["lengthscales"]))
        u = rff(F, W).sum(axis=0)
    elif release == 1:
        u = cell_counts(F, get_array(fields, "Y"))
    else:
        u = _site_density(fields, F, int(plan["density_grid"]))
    if plan["noise"] == "local":
        t = 1
    elif plan["noise"] == "distributed":
        if op == "plain":
            raise ConfigError(
                bad_value(
                    "aggregation",
                    "plain",
                    "this site adds only a share of the billboard's noise "
                    "(distributed): it sends that upload only into a secure sum (secagg / ckks)",
                )
            )
        t = int(plan["t"])
        if not 1 <= t <= len(plan["sizes"]):
            raise ProtocolError(f"the billboard plan's t = {t} is not a number of sites (1..{len(plan['sizes'])})")
    else:
        raise ProtocolError(f"the billboard plan asks for {plan['noise']!r} noise; expected local or distributed")
    if release == 0 and not ledger.releases_at(site, 0, 0):
        ledger.check_event(site, billboard_plan_event(noise, t=t))  # all releases together fit what is left?
    event = billboard_events(noise, t=t)[release]  # the share σ/√t: the sum over ≥ t sites carries σ (maths.md §10)
    share = event.noise.share
    attempt = len(ledger.releases_at(site, 0, release))
    if plan.get("noise_seed") is None:
        e = secure_standard_normal(u.shape)
    else:
        e = seeded_standard_normal(int(plan["noise_seed"]), (site, 0, release, attempt), u.shape)
    ev = ledger.record(
        event,
        site=site,
        round=0,
        step=release,
        attempt=attempt,
        noise=plan["noise"],
        noise_share=share,
        noise_source="secure" if plan.get("noise_seed") is None else "seeded-testing",
    )
    return u + share * e, [dumps(ev)]


def _site_density(fields: dict, F: np.ndarray, grid: int) -> np.ndarray:
    """Release 3's counts: every record at its landmark-only position — placed against the landmark map alone, not
    against the site's other records (:func:`securefed.embedding.placement.place_refine` with ``interact=False``: a
    function of that record and the broadcast) — on the public window of the landmark map."""
    from ..embedding.placement import place_refine
    from ..landmarks.merf import density_box, density_counts
    from .wire import get_array

    Y, E, c = get_array(fields, "Y"), get_array(fields, "landmark_embedding"), get_array(fields, "masses")
    if E.ndim != 2 or E.shape != (len(Y), 2) or c.shape != (len(Y),) or not np.all(c > 0):
        raise ProtocolError("the density release needs the 2-D map of the landmarks and their positive masses")
    lo, hi = density_box(E)
    P = place_refine(F, Y, E, c, float(fields["Zn"]), perplexity=float(fields["perplexity"]), interact=False)
    return density_counts(P, lo, hi, grid)
