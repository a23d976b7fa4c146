"""Server side of securefed over Flower: the same server steps as :func:`securefed.landmarks.feddl.fed_dl` and
the estimators, with every site computation on the site.

:func:`run_feddl` mirrors ``fed_dl``'s control flow step for step — federated γ (or a given γ; ``1/τ_X²``
under DP), the initial landmarks from the federated moments (or the public radius under DP, or a given
array) drawn with the same Generator, ``default_lr``, then ``S`` rounds of model averaging (Eq. 15,
``server_model_average``) or gradient averaging (Eq. 16, ``server_gradient_step``) — reaching the sites
through an :class:`~securefed.flower.transport.Exchange`. The sum is formed by

* ``plain``: :class:`~securefed.securesum.base.PlainAggregator` over the uploads that arrived, in site order;
* ``secagg``: the real :class:`~securefed.securesum.secagg.SecAggServer`, fed with the sites' encoded
  messages and driven by the wall clock (each stage closes when all answers are in or at its deadline);
* ``ckks``: :func:`~securefed.flower.ckks_flow.server_ckks_sum` (TenSEAL CKKS state machines).

Then, optionally, the membership-audit gate (:func:`audit_stage`) and the embedding: no rows
(:func:`embed_local`, :func:`embed_local_model`) or the paper's rows mode (:func:`embed_rows`), whose
server steps are the estimators' own functions. Differential privacy: :mod:`.privacy`.

So for the same seed, data and options the landmarks equal an in-process ``fed_dl`` run exactly
(plain, also under DP with seeded noise) or within the quantisation (SecAgg+ / CKKS). Dropped sites: a
round completes whenever the protocol allows (plain: any survivor; SecAgg+: every survivor keeps ``t``
live neighbours) and otherwise raises the state machine's typed error
(:class:`~securefed.errors.ProtocolAbortedError` / :class:`~securefed.errors.ProtocolTimeoutError`); a
site that failed to answer is asked again only if it comes back as a restarted node
(:func:`readmit_sites`, at the next round boundary).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field

import numpy as np

from ..securesum.base import AggregateResult, PlainAggregator
from ..errors import AuditFailedError, ConfigError, ProtocolAbortedError, bad_value
from ..securesum.quantize import dequantize, plan_fixed_point, warn_clipped
from ..securesum.secagg import RoundSpec, SecAggServer
from .transport import array_from_bytes, array_to_bytes, encode_spec

__all__ = ["FlowerRunConfig", "cast_config_value", "run_feddl", "Sites", "EMBEDDINGS", "readmit_sites", "audit_stage", "embed_rows",
           "embed_local", "embed_local_model", "save_outputs"]


EMBEDDINGS = ("tsne-local", "umap-local", "spectral-local", "tsne-rows", "umap-rows", "spectral-rows", "none")


def cast_config_value(value, default):
    """Cast a run-config value to the type of its default (``"false"`` → False for booleans)."""
    if isinstance(default, bool):
        if isinstance(value, str):
            v = value.strip().lower()
            if v in ("1", "true", "yes", "on"):
                return True
            if v in ("0", "false", "no", "off", ""):
                return False
            raise ValueError(f"not a boolean: {value!r}")
        return bool(value)
    return type(default)(value)


@dataclass
class FlowerRunConfig:
    """The run configuration (``[tool.flwr.app.config]`` keys, hyphens → underscores).

    Groups: FedDL (``landmarks`` … ``seed``), embedding (``embedding`` … ``reconstruction``; see
    :data:`EMBEDDINGS`), differential privacy (``epsilon`` … ``run_id``, :mod:`.privacy`), the audit gate
    (``audit_holdout`` … ``max_empirical_epsilon``), restarted sites (``readmit``) and CKKS
    (``ckks_precision``, ``key_holder``, read by :mod:`.ckks_flow`). The operator's guide lists every key.
    """

    out_dir: str = "securefed-flower-run"
    landmarks: int = 50
    rounds: int = 10
    local_steps: int = 5
    rule: str = "model"
    lr: float = 0.0          # 0 → default_lr
    gamma: float = 0.0       # 0 → federated median heuristic (1/τ_X² with DP, as in process)
    init: str = "auto"       # "auto" (moments; public radius τ_X with DP), "moments", "public" or a server-side .npy
    weights: str = "records"
    aggregation: str = "secagg"
    value_bound: float = 0.0  # public bound on |feature values|; required for secagg (fed_dl's value_bound)
    modulus_bits: int = 32
    fractional_bits: int = -1
    degree: int = 0
    threshold: int = 0
    stage_timeout: float = 0.0  # 0 → securefed's DEFAULT_TIMEOUTS per stage
    plain_timeout: float = 120.0
    min_sites: int = 2
    wait_sites: float = 120.0
    seed: int = 0
    embedding: str = "tsne-local"  # one of EMBEDDINGS
    perplexity: float = 30.0
    tsne_seed: int = 0
    n_components: int = 2
    n_iter: int = 750
    n_neighbors: int = 15
    min_dist: float = 0.1
    n_clusters: int = 8
    kernel_gamma: float = 0.0   # 0 → FedDL's γ (spectral)
    reconstruction: str = "auto"
    # differential privacy (papers/000 §5; off unless epsilon or noise-multiplier > 0)
    epsilon: float = 0.0
    noise_multiplier: float = 0.0
    delta: float = 1e-5
    accountant: str = "exact"
    noise: str = "local"
    clip_norm: float = 0.0      # τ_X (public; required with DP)
    sample_rate: float = 1.0
    secure_noise: bool = False
    min_survivors: int = 0      # distributed noise: t (0 → all sites)
    sensitivity_rule: str = "min"
    rows_epsilon: float = 0.0   # rows embeddings under DP: ε of the data perturbation of the rows
    run_id: str = ""            # ledger run id ("" → Flower's run id, or a hash of this configuration)
    # membership-audit gate (before anything per-record leaves a site)
    audit_holdout: float = 0.0
    allow_audit_failure: bool = False
    max_auc: float = 0.6
    max_empirical_epsilon: float = 1.0
    # restarted sites
    readmit: bool = True
    # CKKS (securefed.flower.ckks_flow)
    ckks_precision: float = 1e-6
    key_holder: int = 0
    ckks_min_survivors: int = 0    # 0 → 2; raised to the DP t under distributed noise
    ckks_quorum: int = 0           # 0 → a majority of all sites
    ckks_verify: str = "recompute"  # or "signatures" (honest-but-curious server only)

    @classmethod
    def from_run_config(cls, rc: dict) -> "FlowerRunConfig":
        known = {f for f in cls.__dataclass_fields__}
        kw = {}
        for k, v in rc.items():
            key = k.replace("-", "_")
            if key not in known:
                raise ConfigError(bad_value("run config key", k, f"use one of {', '.join(sorted(known))}"))
            try:
                kw[key] = cast_config_value(v, getattr(cls, key))
            except (TypeError, ValueError):
                raise ConfigError(bad_value(k, v, f"give a {type(getattr(cls, key)).__name__}")) from None
        return cls(**kw)

    @classmethod
    def defaults(cls) -> dict:
        """``{run-config key: default}`` (hyphenated keys, as in the Flower App's pyproject.toml)."""
        return {k.replace("_", "-"): getattr(cls, k) for k in cls.__dataclass_fields__}


@dataclass
class Sites:
    """The sites of a run, in client-id order (sorted by site name)."""

    names: list
    sizes: list
    n_features: int
    identities: list
    live: set = field(default_factory=set)
    holdouts: list = field(default_factory=list)
    readmitted: list = field(default_factory=list)
    strangers: set = field(default_factory=set)  # node ids that answered a re-hello with no dropped site's name


def _log(cfg: FlowerRunConfig, event: str, **kw) -> None:
    os.makedirs(cfg.out_dir, exist_ok=True)
    with open(os.path.join(cfg.out_dir, "progress.jsonl"), "a") as fh:
        fh.write(json.dumps({"t": time.time(), "event": event, **kw}, default=str) + "\n")


def _hello_request(cfg: FlowerRunConfig) -> dict:
    return {"op": "hello", "audit_holdout": float(cfg.audit_holdout), "seed": int(cfg.seed)}


def hello(ex, cfg: FlowerRunConfig) -> Sites:
    """Ask every node for its site description; assign client ids by sorted site name."""
    replies = ex.request({cid: _hello_request(cfg) for cid in ex.nodes}, ex.now() + cfg.plain_timeout)
    good = {cid: r for cid, r in replies.items() if "error" not in r}
    if len(good) < max(cfg.min_sites, 1):
        errs = {cid: r.get("error") for cid, r in replies.items() if "error" in r}
        raise ProtocolAbortedError(f"only {len(good)} sites answered hello (need {cfg.min_sites}); errors: {errs}; "
                                   f"silent: {ex.silent}")
    order = sorted(good, key=lambda c: str(good[c]["site_name"]))
    feats = {int(good[c]["n_features"]) for c in order}
    if len(feats) != 1:
        raise ConfigError(bad_value("n_features", sorted(feats), "every site must have the same feature columns"))
    names = [str(good[c]["site_name"]) for c in order]
    if len(set(names)) != len(names):
        raise ConfigError(bad_value("site-name", names, "give every SuperNode a distinct site-name in its node config"))
    ex.nodes = {i: ex.nodes[c] for i, c in enumerate(order)}
    ex.bytes_to = {i: ex.bytes_to[c] for i, c in enumerate(order)}
    ex.bytes_from = {i: ex.bytes_from[c] for i, c in enumerate(order)}
    ex.silent = {}
    return Sites(names, [int(good[c]["n_records"]) for c in order], feats.pop(),
                 [bytes(good[c]["identity"]) for c in order], set(range(len(order))),
                 [int(good[c].get("n_holdout", 0)) for c in order])


def readmit_sites(ex, cfg: FlowerRunConfig, sites: Sites, boundary: str) -> list:
    """Re-admit restarted sites at a round boundary; returns the names re-admitted.

    A site that stopped answering was dropped from ``sites.live``. If a node the server has not seen
    in this run (a restarted SuperNode: new Flower node id) answers ``hello`` with the name of a dropped
    site and the same record and feature counts, it takes that site's client id again with its **new**
    identity key (announced in the next round's SecAgg+ spec); its ledger on disk (same run id) carries
    the budget it already spent. Nodes with unknown names are ignored.

    Trust: the name and the counts are all the server checks, so a node that knows a dropped site's name
    and sizes can take its place (and its SecAgg+/CKKS identity key). In a deployment that is kept out by
    Flower's node authentication (only registered SuperNodes join; README "Deploying", step 2); set
    ``readmit = false`` where that is not in place.
    """
    dead = [i for i in range(len(sites.names)) if i not in sites.live]
    lister = getattr(ex, "available_nodes", None)
    if not cfg.readmit or not dead or lister is None:
        return []
    mapped = set(ex.nodes.values()) | sites.strangers
    fresh = [n for n in lister() if n not in mapped]
    if not fresh:
        return []
    tmp = {-1 - k: n for k, n in enumerate(fresh)}
    for c, n in tmp.items():
        ex.nodes[c] = n
        ex.bytes_to[c] = ex.bytes_from[c] = 0
    try:
        replies = ex.request({c: _hello_request(cfg) for c in tmp}, ex.now() + cfg.plain_timeout)
    finally:
        for c in tmp:
            ex.nodes.pop(c, None)
            ex.bytes_to.pop(c, None)
            ex.bytes_from.pop(c, None)
            ex.silent.pop(c, None)
    back = []
    for c, r in sorted(replies.items()):
        if "error" in r:
            continue
        name = str(r.get("site_name"))
        i = sites.names.index(name) if name in sites.names else -1
        if i < 0:
            sites.strangers.add(tmp[c])  # not a site of this run: never asked again
            continue
        if i not in dead or i in sites.live:
            # a known site whose old node has not been noticed as gone yet: ask this node again at a later
            # boundary (marking it a stranger would lock the restarted site out once its old node drops)
            continue
        if int(r["n_records"]) != sites.sizes[i] or int(r["n_features"]) != sites.n_features:
            _log(cfg, "readmit-refused", site=name, reason="record or feature count changed")
            sites.strangers.add(tmp[c])
            continue
        ex.nodes[i] = tmp[c]
        ex.silent.pop(i, None)
        sites.identities[i] = bytes(r["identity"])
        sites.live.add(i)
        back.append(name)
        sites.readmitted.append({"site": name, "at": boundary})
    if back:
        _log(cfg, "readmit", sites=back, at=boundary)
    return back


class _SecAggState:
    """Session and parameters of the SecAgg+ rounds of one run (from a ``SecAggAggregator``)."""

    def __init__(self, cfg: FlowerRunConfig, bound: float | None):
        from ..securesum.aggregators import SecAggAggregator
        from ..securesum.secagg import STAGES

        if bound is None or bound <= 0:
            raise ConfigError(bad_value("value-bound", cfg.value_bound, "SecAgg+ quantises into a public range: give a "
                                        "public bound on |feature values| (e.g. 16 for digits, 255 for pixels)"))
        timeouts = {s: cfg.stage_timeout for s in STAGES} if cfg.stage_timeout > 0 else None
        self.agg = SecAggAggregator(clip_range=float(bound), modulus_bits=cfg.modulus_bits,
                                    fractional_bits=None if cfg.fractional_bits < 0 else cfg.fractional_bits,
                                    degree=cfg.degree or None, threshold=cfg.threshold or None, timeouts=timeouts)
        self.counter = 0


class _Tap:
    """The exchange, with every reply shown to ``hook(client, fields)`` first (DP ledger mirroring)."""

    def __init__(self, ex, hook):
        self._ex, self._hook = ex, hook

    def __getattr__(self, name):
        return getattr(self._ex, name)

    def request(self, payloads, deadline, on_reply=None):
        def cb(cid, fields):
            if "error" not in fields:
                self._hook(cid, fields)
            if on_reply is not None:
                on_reply(cid, fields)

        return self._ex.request(payloads, deadline, on_reply=cb)


def _aggregate(ex, cfg, sites: Sites, sec, task: dict, weights, label: str, clip, tap=None) -> tuple[AggregateResult, dict]:
    """One federated sum of the sites' ``task`` uploads (plain, SecAgg+ or CKKS); returns (result, stats)."""
    t0 = time.perf_counter()
    n = len(sites.names)
    w = np.ones(n) if weights is None else np.asarray(weights, dtype=float)
    before_to, before_from = dict(ex.bytes_to), dict(ex.bytes_from)
    live = sorted(sites.live)
    base = dict(task, seed=cfg.seed, audit_holdout=float(cfg.audit_holdout))
    _log(cfg, "aggregate", label=label, protocol=cfg.aggregation, live=live)
    io = ex if tap is None else _Tap(ex, tap)
    if cfg.aggregation == "plain":
        replies = io.request({i: dict(base, op="plain", site=i) for i in live}, ex.now() + cfg.plain_timeout)
        for i, r in replies.items():
            if "error" in r:
                ex.silent[i] = str(r["error"])
        surv = [i for i in live if i in replies and "error" not in replies[i]]
        for i in live:
            if i not in surv:
                sites.live.discard(i)
        if not surv:
            raise ProtocolAbortedError(f"{label}: no site returned its update ({ex.silent})")
        ups = [array_from_bytes(replies[i]["update"], replies[i]["shape"]) for i in surv]
        r = PlainAggregator().aggregate(ups, w[surv])
        agg = AggregateResult(r.total, tuple(surv), r.weight_sum, "plain", 0, r.bytes_up, r.bytes_down,
                              time.perf_counter() - t0)
    elif cfg.aggregation == "secagg":
        agg = _secagg(io, cfg, sites, sec, base, w, label, t0, clip)
    elif cfg.aggregation == "ckks":
        from .ckks_flow import server_ckks_sum

        agg = server_ckks_sum(io, cfg, sites, base, w, label, t0, clip)
        for i in range(n):
            if i not in agg.survivors:
                sites.live.discard(i)
    else:
        raise ConfigError(bad_value("aggregation", cfg.aggregation, "use 'plain', 'secagg' or 'ckks' over Flower"))
    stats = {"label": label, "survivors": list(agg.survivors), "clipped": int(agg.clipped),
             "seconds": time.perf_counter() - t0,
             "bytes_to_site": {sites.names[i]: ex.bytes_to[i] - before_to.get(i, 0) for i in range(n)},
             "bytes_from_site": {sites.names[i]: ex.bytes_from[i] - before_from.get(i, 0) for i in range(n)},
             "details": agg.details}
    return agg, stats


def _secagg(ex, cfg, sites: Sites, sec: _SecAggState, base: dict, w, label: str, t0: float, clip) -> AggregateResult:
    """One SecAgg+ sum over the exchange: the real :class:`SecAggServer`, the sites' state machines."""
    from .ckks_flow import drive_stages, make_feed

    n = len(sites.names)
    shape = tuple(base.pop("out_shape"))
    length = int(np.prod(shape))
    gp = sec.agg.graph_parameters(n)
    fp = plan_fixed_point(float(clip), w, modulus_bits=sec.agg.modulus_bits,
                          fractional_bits=sec.agg.fractional_bits)
    spec = RoundSpec(sec.agg.session_id, sec.counter, n, gp.degree, gp.threshold, sec.agg.session_id, length, fp,
                     tuple(sites.identities), tuple(sec.agg.timeouts.items()))
    sec.counter += 1
    server = SecAggServer(spec, ex.now())
    rejected: list = []
    outgoing: list = []
    sb = encode_spec(spec)
    payloads = {i: dict(base, op="secagg-start", site=i, spec=sb, weight=float(w[i])) for i in sorted(sites.live)}
    # the stage relay shared with CKKS: each stage closes when every live site answered or at its deadline
    relay = make_feed(ex, server, outgoing, rejected)
    clipped: dict = {}

    def feed(cid, fields):
        if "secagg_clipped" in fields:  # coordinates the site's client clipped into the public range (quantising)
            clipped[cid] = max(clipped.get(cid, 0), int(fields["secagg_clipped"]))
        relay(cid, fields)

    drive_stages(ex, server, payloads, outgoing, feed, "secagg",
                 on_stage=lambda st: _log(cfg, "stage", label=label, stage=st, round=spec.round_index))
    for i in range(n):
        if i not in server.survivors:
            sites.live.discard(i)
    total = dequantize(server.result, fp).reshape(shape)
    surv = tuple(int(i) for i in server.survivors)
    n_clipped = int(sum(clipped.get(i, 0) for i in surv))
    warn_clipped(n_clipped, float(clip), f"SecAgg+ sum '{label}' over Flower")
    return AggregateResult(total, surv, float(w[list(surv)].sum()), "secagg", n_clipped,
                           int(np.mean([server.bytes_in.get(i, 0) for i in surv])), int(sum(server.bytes_in.values())),
                           time.perf_counter() - t0, {"degree": spec.degree, "threshold": spec.threshold,
                                                      "dropped_at": {k: list(v) for k, v in server.dropped_at.items()},
                                                      "fixed_point": fp.as_dict(), "rejected": rejected})


def _check_config(cfg: FlowerRunConfig) -> None:
    if cfg.rule not in ("model", "gradient"):
        raise ConfigError(bad_value("rule", cfg.rule, "use 'model' (Eq. 15) or 'gradient' (Eq. 16)"))
    if cfg.embedding not in EMBEDDINGS:
        raise ConfigError(bad_value("embedding", cfg.embedding, f"use one of {', '.join(EMBEDDINGS)}"))
    if not 0.0 <= cfg.audit_holdout < 0.9:
        raise ConfigError(bad_value("audit-holdout", cfg.audit_holdout, "use a fraction in [0, 0.9), e.g. 0.2"))
    if cfg.init not in ("auto", "moments", "public") and not cfg.init.endswith(".npy"):
        raise ConfigError(bad_value("init", cfg.init, "use 'auto', 'moments', 'public' or a server-side .npy path"))
    if cfg.rows_epsilon > 0 and not cfg.embedding.endswith("-rows"):
        raise ConfigError(bad_value("rows-epsilon", cfg.rows_epsilon, "applies only to the rows embeddings (tsne-rows, "
                                    "umap-rows, spectral-rows)"))


def run_feddl(ex, cfg: FlowerRunConfig) -> dict:
    """Run FedDL over the sites behind ``ex`` (then the audit gate and the embedding); returns the result
    dict (landmarks as an array)."""
    from ..kernels import check_gamma, median_gamma
    from ..landmarks import (default_lr, init_landmarks, release_bounds, resolve_weights, server_gradient_step,
                              server_model_average)
    from .privacy import ServerPrivacy, derive_run_id, dp_enabled

    t_start = time.perf_counter()
    _check_config(cfg)
    sites = hello(ex, cfg)
    _log(cfg, "hello", sites=sites.names, sizes=sites.sizes)
    m = sites.n_features
    run_id = cfg.run_id or derive_run_id(cfg)
    dp = dp_enabled(cfg)
    if not dp and cfg.rows_epsilon > 0:
        raise ConfigError(bad_value("rows-epsilon", cfg.rows_epsilon, "data perturbation of the rows is part of a "
                                    "differentially private run: give epsilon (or noise-multiplier) and clip-norm too"))
    if dp and cfg.embedding.endswith("-rows") and not cfg.rows_epsilon > 0:
        raise ConfigError(bad_value("rows-epsilon", cfg.rows_epsilon, "with differential privacy and a rows embedding "
                                    "every record's row is a release: give its ε (e.g. rows-epsilon=1), or use a -local embedding"))
    rng = np.random.default_rng(cfg.seed)
    w = resolve_weights(cfg.weights, sites.sizes)
    steps: list = []
    released: list = []
    warnings: list = []

    privacy = None
    if dp:
        if cfg.init == "moments":
            raise ConfigError(bad_value("init", "moments", "with differential privacy use init='public' or 'auto' "
                                        "(the moments are not accounted)"))
        if not cfg.clip_norm > 0:
            raise ConfigError(bad_value("clip-norm", cfg.clip_norm, "differential privacy needs a public bound τ_X on "
                                        "record norms, e.g. clip-norm=10"))
        gamma0 = cfg.gamma if cfg.gamma > 0 else 1.0 / float(cfg.clip_norm) ** 2  # public, as in fed_dl
        privacy = ServerPrivacy(cfg, run_id, sites.sizes, w, check_gamma(gamma0))
        if cfg.aggregation == "ckks" and privacy.gp.noise == "distributed":
            # a CKKS sum over fewer than t survivors would carry less noise than the plan: refuse to decrypt it
            cfg.ckks_min_survivors = max(int(cfg.ckks_min_survivors), int(privacy.gp.t))
    # public bound on |feature values|: value-bound, or τ_X under DP (records are clipped to it), as fed_dl
    bound = cfg.value_bound if cfg.value_bound > 0 else (float(cfg.clip_norm) if dp else None)
    sec = _SecAggState(cfg, bound) if cfg.aggregation == "secagg" else None
    n_total = float(sum(sites.sizes))
    size_w = [n / n_total for n in sites.sizes]

    def mirror(rnd, step_ids):
        def hook(cid, fields):
            if "dp_events" in fields:
                privacy.mirror(cid, fields, rnd, step_ids)
        return hook

    def agg(task, weights, label, clip, tap=None):
        a, st = _aggregate(ex, cfg, sites, sec, task, weights, label, clip, tap)
        steps.append(st)
        return a

    def dp_fields(rnd, step):
        if privacy is None:
            return {}
        settle = privacy.unsettled
        privacy.unsettled = []
        return {"dp": privacy.wire_plan(), "dp_settle": json.dumps(settle), "round": rnd, "step": step}

    def settle(rnd, step, a):
        if privacy is None:
            return
        have = privacy.reported(rnd, step)
        missing = [i for i in a.survivors if i not in have]
        if missing:
            raise ProtocolAbortedError(f"round {rnd + 1}: sites {missing} were summed without reporting their "
                                       "ledger events; the aggregate ledger would be incomplete")
        privacy.after_aggregate(rnd, step, a.survivors)

    # the same releases, scalings and bounds as landmarks._federated_gamma / _federated_moments
    if dp:
        gamma = privacy.plan["gamma"]
    elif cfg.gamma > 0:
        gamma = cfg.gamma
    else:
        scale = 1.0 if bound is None else 4.0 * m * bound
        a = agg({"task": "gamma", "scale": scale, "out_shape": [1]}, size_w, "gamma",
                release_bounds(bound, m, cfg.landmarks, None).get("gamma"))
        gamma = median_gamma([a.total[0] * scale / a.weight_sum])
        released.append("one scalar per site: local median squared distance (for γ)")
    gamma = check_gamma(gamma)
    lr = float(cfg.lr) if cfg.lr > 0 else default_lr(cfg.landmarks, gamma)
    init = ("public" if dp else "moments") if cfg.init == "auto" else cfg.init
    if init == "moments":
        scale = 1.0 if bound is None else bound
        a = agg({"task": "moments", "scale": scale, "out_shape": [2 * m]}, size_w, "moments",
                release_bounds(bound, m, cfg.landmarks, None).get("moments"))
        tot = a.total / a.weight_sum
        mean = tot[:m]
        std = np.sqrt(np.maximum(tot[m:] * scale - mean ** 2, 0.0))
        Y = init_landmarks(cfg.landmarks, m, mean=mean, std=std, rng=rng)
        released.append("per-feature means and mean squares (one secure sum, for the initial landmarks)")
    elif init == "public":
        radius = float(cfg.clip_norm) if dp else float(np.sqrt(1.0 / gamma))
        Y = init_landmarks(cfg.landmarks, m, radius=radius, rng=rng)
    else:
        Y = np.load(init)
        if Y.shape != (cfg.landmarks, m) or not np.all(np.isfinite(Y)):
            raise ConfigError(bad_value("init", init, f"give a finite ({cfg.landmarks}, {m}) array"))
    if privacy is not None:
        Y = privacy.project(Y)
    clip = release_bounds(bound, m, cfg.landmarks, gamma).get(cfg.rule)
    for s in range(cfg.rounds):
        if s > 0:
            readmit_sites(ex, cfg, sites, f"before round {s + 1}")
        if cfg.rule == "model":
            task = {"task": "model", "Y": array_to_bytes(Y), "shape": list(Y.shape), "gamma": gamma, "lr": lr,
                    "local_steps": cfg.local_steps, "out_shape": list(Y.shape), **dp_fields(s, cfg.local_steps - 1)}
            a = agg(task, w, f"round {s + 1}", clip, mirror(s, range(cfg.local_steps)) if privacy else None)
            settle(s, cfg.local_steps - 1, a)
            Y = server_model_average(a)
        else:
            for t in range(cfg.local_steps):
                task = {"task": "gradient", "Y": array_to_bytes(Y), "shape": list(Y.shape), "gamma": gamma,
                        "out_shape": list(Y.shape), **dp_fields(s, t)}
                a = agg(task, w, f"round {s + 1} step {t + 1}", clip, mirror(s, [t]) if privacy else None)
                settle(s, t, a)
                Y = server_gradient_step(Y, a, lr)
        if privacy is not None:
            Y = privacy.project(Y)
        if not np.all(np.isfinite(Y)):
            raise ConfigError(bad_value("lr", lr, f"landmarks diverged in round {s + 1}; use a smaller step"))
        _log(cfg, "round", round=s + 1)
    res = {"landmarks": Y, "embedding": None, "gamma": gamma, "lr": lr, "rounds_done": cfg.rounds, "run_id": run_id,
           "sites": sites.names, "site_sizes": sites.sizes, "released": released, "warnings": warnings}
    if privacy is not None:
        res["privacy"] = privacy.report()
        released.append(f"{cfg.rounds * cfg.local_steps} noisy landmark releases per site (DP, see privacy)")
    if cfg.audit_holdout > 0:
        readmit_sites(ex, cfg, sites, "before the audit")
        res["audit"] = audit_stage(ex, cfg, sites, agg, Y, gamma, privacy)
    if cfg.embedding != "none":
        readmit_sites(ex, cfg, sites, "before the embedding")
    if cfg.embedding.endswith("-local"):
        if cfg.embedding == "tsne-local":
            res["embedding"] = embed_local(ex, cfg, sites, Y)
        else:
            res["embedding"] = embed_local_model(ex, cfg, sites, Y, gamma, rng)
        released.append(res["embedding"]["sent_kind"])
        if privacy is not None:
            warnings.append(f"embedding={cfg.embedding}: each site's {res['embedding']['sent_kind']} are computed from its "
                            "raw records; they are not covered by the differential-privacy accounting")
    elif cfg.embedding.endswith("-rows"):
        res["embedding"] = embed_rows(ex, cfg, sites, Y, gamma, rng, privacy, run_id)
        leak = ("these rows give every record back (n_y > m: trilateration, DESIGN §2)" if cfg.landmarks > m else
                "these rows give back each record's projection onto the landmarks' span (all of it once n_y > m, "
                "DESIGN §2)")
        warnings.append(f"embedding={cfg.embedding}: every site sent one row per record ("
                        f"{res['embedding']['sent_kind']}); {leak}"
                        + (" — computed from data-perturbed records (rows-epsilon)" if cfg.rows_epsilon > 0 else ""))
        released.append(res["embedding"]["sent_kind"])
        if privacy is not None:  # the landmarks' block (as fed_dl reports it) plus the rows and the total
            res["privacy"]["rows"] = res["embedding"].pop("rows_privacy", None)
            res["privacy"]["epsilon_total"] = float(privacy.ledger.spent()[0])
    res.update(survivors=sorted(sites.live), steps=steps, readmitted=sites.readmitted,
               site_errors={sites.names[i]: str(e) for i, e in ex.silent.items() if 0 <= i < len(sites.names)},
               seconds=time.perf_counter() - t_start, flower_messages=ex.messages)
    return res


def audit_stage(ex, cfg: FlowerRunConfig, sites: Sites, agg, Y: np.ndarray, gamma: float, privacy) -> dict:
    """The membership-audit gate over Flower, after the landmarks and before the embedding stage.

    Each live site scores its FedDL members and its held-out records against ``Y`` and uploads only the
    per-threshold counts (:func:`securefed.audits.mia.site_roc_counts`, public grids); the counts are
    summed by the run's aggregation (plain / SecAgg+ / CKKS) and the server computes the ROC, AUC and
    the empirical ε lower bound (:func:`securefed.audits.mia_from_counts`, the server half of
    :func:`securefed.audits.membership_audit`) and applies
    :func:`securefed.audits.audit_gate` with the policy ``max-auc`` / ``max-empirical-epsilon`` (the
    defaults of ``securefed run``) and, under DP, the accountant's ε. A failing audit raises
    :class:`~securefed.errors.AuditFailedError` (nothing per-record leaves a site) unless
    ``allow-audit-failure`` is set (the override is recorded in the result).
    """
    from ..audits import AuditPolicy, audit_gate, mia_from_counts
    from ..audits.mia import GRID_SIZE

    scores = ["nearest", "kde"]
    length = len(scores) * (4 * GRID_SIZE + 4)
    task = {"task": "audit", "Y": array_to_bytes(Y), "shape": list(Y.shape), "gamma": float(gamma), "scores": scores,
            "out_shape": [length]}
    biggest = float(max(n + h for n, h in zip(sites.sizes, sites.holdouts or [0] * len(sites.sizes))))
    a = agg(task, None, "audit", biggest)
    delta = privacy.plan["delta"] if privacy is not None else 0.0
    mia = mia_from_counts(a.total, scores, n_sites=len(a.survivors), aggregation=a.protocol, delta=delta)
    claimed = float(privacy.ledger.spent()[0]) if privacy is not None else None
    policy = AuditPolicy(max_auc=cfg.max_auc, max_empirical_epsilon=cfg.max_empirical_epsilon)
    _log(cfg, "audit", auc=mia.auc, empirical_epsilon=mia.empirical_epsilon, sites=mia.n_sites)
    dec = audit_gate(mia, policy, claimed_epsilon=claimed, allow_failure=True)
    out = dec.to_dict()
    out["mia"] = {k: v for k, v in mia.to_dict().items() if k != "per_score"}
    out["mia"]["n_sites"] = len(a.survivors)
    if not dec.passed and not cfg.allow_audit_failure:
        out.update(verdict="fail", overridden=False, proceed=False, ledger_event=None,
                   note="the run stopped at the gate: nothing per record was sent")
        os.makedirs(cfg.out_dir, exist_ok=True)
        with open(os.path.join(cfg.out_dir, "audit.json"), "w") as fh:
            json.dump(out, fh, indent=1, default=float)
        raise AuditFailedError("landmark membership audit failed: " + "; ".join(str(f) for f in dec.failures)
                               + " — nothing per record left the sites (audit.json); rerun with allow-audit-failure=true "
                                 "to proceed (recorded), or add noise (epsilon) / fewer landmarks")
    return out


def _embed_request(ex, cfg, sites: Sites, req: dict):
    live = sorted(sites.live)
    before_to, before_from = dict(ex.bytes_to), dict(ex.bytes_from)
    replies = ex.request({i: dict(req, site=i, seed=cfg.seed, audit_holdout=float(cfg.audit_holdout)) for i in live},
                         ex.now() + cfg.plain_timeout)
    ok, missing = {}, {}
    for i in live:
        r = replies.get(i)
        if r is None or "error" in r:
            missing[sites.names[i]] = (r or {}).get("error") or ex.silent.get(i, "no reply")
            continue
        ok[i] = r
    stats = {"bytes_to_site": {sites.names[i]: ex.bytes_to[i] - before_to[i] for i in live},
             "bytes_from_site": {sites.names[i]: ex.bytes_from[i] - before_from[i] for i in live}}
    return ok, missing, stats


def embed_local(ex, cfg: FlowerRunConfig, sites: Sites, Y: np.ndarray) -> dict:
    """No-rows t-SNE (``FedTSNE(nystrom="local")``): the server embeds the landmarks, every live site
    places its own records against that model and returns only their coordinates.

    Returns ``{"landmark_embedding", "coordinates": {site name: array}, "sites": [names]}``; a site
    that fails or stays silent is reported in ``missing``.
    """
    from ..embedding.placement import fit_landmark_tsne

    t0 = time.perf_counter()
    E = np.asarray(fit_landmark_tsne(Y, cfg.perplexity, cfg.tsne_seed, cfg.n_components))
    _log(cfg, "embedding", landmarks=len(Y))
    req = {"op": "embed", "Y": array_to_bytes(Y), "shape": list(Y.shape), "perplexity": float(cfg.perplexity),
           "tsne_seed": int(cfg.tsne_seed), "landmark_embedding": array_to_bytes(E), "embedding_shape": list(E.shape)}
    ok, missing, stats = _embed_request(ex, cfg, sites, req)
    coords = {sites.names[i]: array_from_bytes(r["embedding"], r["embedding_shape"]) for i, r in ok.items()}
    return {"landmark_embedding": E, "coordinates": coords, "missing": missing, "seconds": time.perf_counter() - t0,
            "sent_kind": f"final {cfg.n_components}-D coordinates, one per record", **stats}


def embed_local_model(ex, cfg: FlowerRunConfig, sites: Sites, Y: np.ndarray, gamma: float, rng) -> dict:
    """``umap-local`` / ``spectral-local``: as ``FedUMAP`` / ``FedSpectralClustering(nystrom="local")``.

    UMAP: the server fits UMAP on the landmarks (seed drawn from the run's Generator, as the estimator
    does); each site refits the same deterministic model, checks it equals the server's landmark
    embedding and returns only its records' coordinates. Spectral: the server clusters the landmarks
    and sends their labels; each site returns one cluster label per record.
    """
    from ..estimators import spectral_landmark_labels, umap_landmark_model

    t0 = time.perf_counter()
    seed = int(rng.integers(0, 2**31 - 1))
    if cfg.embedding == "umap-local":
        model = umap_landmark_model(Y, n_neighbors=cfg.n_neighbors, min_dist=cfg.min_dist, n_components=cfg.n_components,
                                    seed=seed)
        E = np.asarray(model.embedding_, dtype=np.float64)
        req = {"op": "embed-umap", "Y": array_to_bytes(Y), "shape": list(Y.shape), "n_neighbors": int(cfg.n_neighbors),
               "min_dist": float(cfg.min_dist), "model_seed": seed, "landmark_embedding": array_to_bytes(E),
               "embedding_shape": list(E.shape)}
        ok, missing, stats = _embed_request(ex, cfg, sites, req)
        coords = {sites.names[i]: array_from_bytes(r["embedding"], r["embedding_shape"]) for i, r in ok.items()}
        return {"landmark_embedding": E, "coordinates": coords, "missing": missing, "model_seed": seed,
                "seconds": time.perf_counter() - t0,
                "sent_kind": f"final {cfg.n_components}-D coordinates, one per record", **stats}
    g = float(cfg.kernel_gamma) if cfg.kernel_gamma > 0 else float(gamma)
    lab_y = np.asarray(spectral_landmark_labels(Y, g, n_clusters=cfg.n_clusters, seed=seed))
    req = {"op": "embed-spectral", "Y": array_to_bytes(Y), "shape": list(Y.shape), "kernel_gamma": g,
           "n_clusters": int(cfg.n_clusters), "landmark_labels": [int(v) for v in lab_y]}
    ok, missing, stats = _embed_request(ex, cfg, sites, req)
    labels = {sites.names[i]: np.asarray(r["labels"], dtype=np.int64) for i, r in ok.items()}
    return {"landmark_labels": lab_y, "labels": labels, "missing": missing, "model_seed": seed,
            "seconds": time.perf_counter() - t0, "sent_kind": "one cluster label per record", **stats}


def embed_rows(ex, cfg: FlowerRunConfig, sites: Sites, Y: np.ndarray, gamma: float, rng, privacy, run_id: str) -> dict:
    """The paper's Nyström "rows" stage over Flower (``tsne-rows`` / ``umap-rows`` / ``spectral-rows``).

    Every live site sends one row per record — ``D²(X_p, Y)`` (t-SNE, UMAP) or ``K(X_p, Y)`` (spectral) —
    optionally computed from data-perturbed records (``rows-epsilon``, ``papers/000`` §5.1, written to the
    site's ledger first). The server stacks them in site order and runs **the estimators' own server
    step** (:func:`securefed.estimators.tsne_from_distance_rows`, :func:`~securefed.estimators.umap_from_distance_rows`,
    :func:`~securefed.estimators.spectral_from_kernel_rows`) with the run's Generator, continuing after
    the landmarks exactly as the estimator's does — so for the same rows and seed the result is the
    estimator's. **These rows give the records back** (DESIGN §2); the result says so.
    """
    from ..estimators import spectral_from_kernel_rows, tsne_from_distance_rows, umap_from_distance_rows

    t0 = time.perf_counter()
    spectral = cfg.embedding == "spectral-rows"
    g = (float(cfg.kernel_gamma) if cfg.kernel_gamma > 0 else float(gamma)) if spectral else float(gamma)
    req = {"op": "rows", "Y": array_to_bytes(Y), "shape": list(Y.shape), "kind": "kernel" if spectral else "distance",
           "gamma": g}
    if cfg.rows_epsilon > 0:
        req["rows_dp"] = json.dumps({"run_id": run_id, "epsilon": float(cfg.rows_epsilon), "delta": float(cfg.delta),
                                     "accountant": str(cfg.accountant), "tau_x": float(cfg.clip_norm),
                                     "secure_noise": bool(cfg.secure_noise), "noise_seed": int(cfg.seed)})
    ok, missing, stats = _embed_request(ex, cfg, sites, req)
    if len(ok) == 0:
        raise ProtocolAbortedError(f"rows stage: no site sent its rows ({missing})")
    order = sorted(ok)
    blocks = [array_from_bytes(ok[i]["rows"], ok[i]["rows_shape"]) for i in order]
    rows_privacy = None
    if cfg.rows_epsilon > 0:
        from .privacy import mirror_release

        for i in order:
            if privacy is not None:
                mirror_release(privacy.ledger, i, json.loads(ok[i]["rows_dp_event"]))
        rows_privacy = json.loads(ok[order[0]]["rows_dp_report"])
        rows_privacy["sites"] = len(order)
        rows_privacy.pop("epsilon_total_with_ledger", None)
    B = np.vstack(blocks)
    _log(cfg, "rows", records=len(B), sites=[sites.names[i] for i in order])
    sizes = [len(b) for b in blocks]
    cuts = np.cumsum([0] + sizes)
    out = {"missing": missing, "rows_per_site": {sites.names[i]: n for i, n in zip(order, sizes)},
           "rows_privacy": rows_privacy, **stats}
    if spectral:
        labels, path = spectral_from_kernel_rows(B, Y, g, n_clusters=cfg.n_clusters, n_neighbors=cfg.n_neighbors,
                                                 reconstruction=cfg.reconstruction, n_jobs=1, rng=rng)
        out["labels"] = {sites.names[i]: np.asarray(labels[a:b]) for i, a, b in zip(order, cuts[:-1], cuts[1:])}
        out["sent_kind"] = "Gaussian-kernel values to the landmarks, one row of n_y per record"
    else:
        noisy = privacy is not None
        if cfg.embedding == "tsne-rows":
            E, path = tsne_from_distance_rows(B, Y, perplexity=cfg.perplexity, n_components=cfg.n_components,
                                              n_iter=cfg.n_iter, reconstruction=cfg.reconstruction, noisy_landmarks=noisy,
                                              n_jobs=1, rng=rng)
        else:
            E, path = umap_from_distance_rows(B, Y, n_neighbors=cfg.n_neighbors, min_dist=cfg.min_dist,
                                              n_components=cfg.n_components, reconstruction=cfg.reconstruction,
                                              noisy_landmarks=noisy, n_jobs=1, rng=rng)
        E = np.asarray(E)
        out["coordinates"] = {sites.names[i]: E[a:b] for i, a, b in zip(order, cuts[:-1], cuts[1:])}
        out["sent_kind"] = "squared distances to the landmarks, one row of n_y per record"
    out.update(reconstruction=path, seconds=time.perf_counter() - t0)
    return out


def save_outputs(out_dir: str, res: dict) -> dict:
    """Write the arrays of a :func:`run_feddl` result to ``out_dir``; returns the JSON-able rest.

    ``landmarks.npy``; with an embedding: ``embedding.npz`` (coordinates, one array per site name) or
    ``labels.npz`` (spectral: one label array per site name), plus ``landmark_embedding.npy`` /
    ``landmark_labels.npy`` for the local modes.
    """
    res = dict(res)
    os.makedirs(out_dir, exist_ok=True)
    np.save(os.path.join(out_dir, "landmarks.npy"), res.pop("landmarks"))
    emb = res.pop("embedding", None)
    if emb is not None:
        emb = dict(emb)
        for key in ("landmark_embedding", "landmark_labels"):
            if key in emb:
                np.save(os.path.join(out_dir, key + ".npy"), emb.pop(key))
        if "coordinates" in emb:
            parts = emb.pop("coordinates")
            np.savez(os.path.join(out_dir, "embedding.npz"), **parts)
        else:
            parts = emb.pop("labels")
            np.savez(os.path.join(out_dir, "labels.npz"), **parts)
        res["embedding"] = dict(emb, sites=list(parts), rows={k: len(v) for k, v in parts.items()})
    return res
