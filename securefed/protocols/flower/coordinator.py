"""Server side of FedDL over Flower: the same server steps as :func:`securefed.landmarks.fed_dl`.

:func:`run_feddl` mirrors ``fed_dl``'s control flow step for step — federated γ (or a given γ), the
initial landmarks from the federated moments (or a given array) drawn with the same Generator,
``default_lr``, then ``S`` rounds of model averaging (Eq. 15, ``server_model_average``) or gradient
averaging (Eq. 16, ``server_gradient_step``) — but every site computation happens on the site, reached
through an :class:`~securefed.protocols.flower.transport.Exchange`. The sum is formed by

* ``plain``: :class:`~securefed.aggregation.PlainAggregator` over the uploads that arrived, in site order;
* ``secagg``: the real :class:`~securefed.protocols.secagg.SecAggServer`, fed with the sites' encoded
  messages and driven by the wall clock (each stage closes when all answers are in or at its deadline).

So for the same seed, data and options the landmarks equal an in-process ``fed_dl`` run exactly
(plain) or within the quantisation (SecAgg+: stochastic rounding happens on each site with its own
Generator). Dropped sites: a round completes whenever the protocol allows (plain: any survivor;
SecAgg+: every survivor keeps ``t`` live neighbours) and otherwise raises the state machine's typed
error (:class:`~securefed.errors.ProtocolAbortedError` / :class:`~securefed.errors.ProtocolTimeoutError`);
a site that failed to answer is not asked again in this run.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field

import numpy as np

from ...aggregation import AggregateResult, PlainAggregator
from ...errors import ConfigError, ProtocolAbortedError, SecureFedError, bad_value
from ..quantize import dequantize, plan_fixed_point
from ..secagg import RoundSpec, SecAggServer
from .transport import array_from_bytes, array_to_bytes, encode_spec

__all__ = ["FlowerRunConfig", "run_feddl", "Sites"]


@dataclass
class FlowerRunConfig:
    """The run configuration (``[tool.flwr.app.config]`` keys, hyphens → underscores)."""

    out_dir: str = "securefed-flower-run"
    landmarks: int = 50
    rounds: int = 10
    local_steps: int = 5
    rule: str = "model"
    lr: float = 0.0          # 0 → default_lr
    gamma: float = 0.0       # 0 → federated median heuristic
    init: str = "moments"    # "moments" or a path to an (n_landmarks, m) .npy on the server
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
    embedding: str = "tsne-local"  # "tsne-local" (no rows leave: sites place their records) or "none"
    perplexity: float = 30.0
    tsne_seed: int = 0

    @classmethod
    def from_run_config(cls, rc: dict) -> "FlowerRunConfig":
        known = {f for f in cls.__dataclass_fields__}
        kw = {}
        for k, v in rc.items():
            key = k.replace("-", "_")
            if key not in known:
                raise ConfigError(bad_value("run config key", k, f"use one of {', '.join(sorted(known))}"))
            typ = type(getattr(cls, key))
            kw[key] = typ(v)
        return cls(**kw)


@dataclass
class Sites:
    """The sites of a run, in client-id order (sorted by site name)."""

    names: list
    sizes: list
    n_features: int
    identities: tuple
    live: set = field(default_factory=set)


def _log(cfg: FlowerRunConfig, event: str, **kw) -> None:
    os.makedirs(cfg.out_dir, exist_ok=True)
    with open(os.path.join(cfg.out_dir, "progress.jsonl"), "a") as fh:
        fh.write(json.dumps({"t": time.time(), "event": event, **kw}) + "\n")


def hello(ex, cfg: FlowerRunConfig) -> Sites:
    """Ask every node for its site description; assign client ids by sorted site name."""
    replies = ex.request({cid: {"op": "hello"} for cid in ex.nodes}, ex.now() + cfg.plain_timeout)
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
                 tuple(bytes(good[c]["identity"]) for c in order), set(range(len(order))))


class _SecAggState:
    """Session and parameters of the SecAgg+ rounds of one run (from a ``SecAggAggregator``)."""

    def __init__(self, cfg: FlowerRunConfig):
        from ..aggregators import SecAggAggregator
        from ..secagg import STAGES

        if cfg.value_bound <= 0:
            raise ConfigError(bad_value("value-bound", cfg.value_bound, "SecAgg+ quantises into a public range: give a "
                                        "public bound on |feature values| (e.g. 16 for digits, 255 for pixels)"))
        timeouts = {s: cfg.stage_timeout for s in STAGES} if cfg.stage_timeout > 0 else None
        self.agg = SecAggAggregator(clip_range=cfg.value_bound, modulus_bits=cfg.modulus_bits,
                                    fractional_bits=None if cfg.fractional_bits < 0 else cfg.fractional_bits,
                                    degree=cfg.degree or None, threshold=cfg.threshold or None, timeouts=timeouts)
        self.counter = 0


def _aggregate(ex, cfg, sites: Sites, sec, task: dict, weights, label: str, clip) -> tuple[AggregateResult, dict]:
    """One federated sum of the sites' ``task`` uploads (plain or SecAgg+); returns (result, stats)."""
    t0 = time.perf_counter()
    n = len(sites.names)
    w = np.ones(n) if weights is None else np.asarray(weights, dtype=float)
    before_to, before_from = dict(ex.bytes_to), dict(ex.bytes_from)
    live = sorted(sites.live)
    base = dict(task, seed=cfg.seed)
    _log(cfg, "aggregate", label=label, protocol=cfg.aggregation, live=live)
    if cfg.aggregation == "plain":
        replies = ex.request({i: dict(base, op="plain", site=i) for i in live}, ex.now() + cfg.plain_timeout)
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
        agg = _secagg(ex, cfg, sites, sec, base, w, label, t0, clip)
    else:
        raise ConfigError(bad_value("aggregation", cfg.aggregation, "use 'plain' or 'secagg' over Flower"))
    stats = {"label": label, "survivors": list(agg.survivors), "seconds": time.perf_counter() - t0,
             "bytes_to_site": {sites.names[i]: ex.bytes_to[i] - before_to[i] for i in range(n)},
             "bytes_from_site": {sites.names[i]: ex.bytes_from[i] - before_from[i] for i in range(n)},
             "details": agg.details}
    return agg, stats


def _secagg(ex, cfg, sites: Sites, sec: _SecAggState, base: dict, w, label: str, t0: float, clip) -> AggregateResult:
    n = len(sites.names)
    shape = tuple(base.pop("out_shape"))
    length = int(np.prod(shape))
    gp = sec.agg.graph_parameters(n)
    fp = plan_fixed_point(float(clip), w, modulus_bits=sec.agg.modulus_bits,
                          fractional_bits=sec.agg.fractional_bits)
    spec = RoundSpec(sec.agg.session_id, sec.counter, n, gp.degree, gp.threshold, sec.agg.session_id, length, fp,
                     sites.identities, tuple(sec.agg.timeouts.items()))
    sec.counter += 1
    server = SecAggServer(spec, ex.now())
    rejected: list = []
    outgoing: list = []

    def feed(cid, fields):
        if "error" in fields:
            ex.silent[cid] = str(fields["error"])
            return
        for data in fields.get("msgs", []):
            try:
                outgoing.extend(server.receive(bytes(data), ex.now()))
            except SecureFedError:
                if server.stage == "aborted":
                    raise
                rejected.append(cid)

    sb = encode_spec(spec)
    payloads = {i: dict(base, op="secagg-start", site=i, spec=sb, weight=float(w[i])) for i in sorted(sites.live)}
    while True:
        stage = server.stage
        _log(cfg, "stage", label=label, stage=stage, round=spec.round_index)
        ex.request(payloads, server.deadline, on_reply=feed)
        if server.stage == stage and not server.done:
            # every live site answered or failed, or the deadline passed: close the stage now
            outgoing.extend(server.tick(max(ex.now(), server.deadline)))
        if server.done:
            break
        by_site: dict = {}
        for rid, data in outgoing:
            by_site.setdefault(rid, []).append(data)
        outgoing.clear()
        payloads = {rid: {"op": "secagg", "msgs": msgs} for rid, msgs in by_site.items()}
        if not payloads:
            raise ProtocolAbortedError(f"{label}: SecAgg+ stage {server.stage!r} has nobody to ask")
    for i in range(n):
        if i not in server.survivors:
            sites.live.discard(i)
    total = dequantize(server.result, fp).reshape(shape)
    surv = tuple(int(i) for i in server.survivors)
    return AggregateResult(total, surv, float(w[list(surv)].sum()), "secagg", 0,
                           int(np.mean([server.bytes_in.get(i, 0) for i in surv])), int(sum(server.bytes_in.values())),
                           time.perf_counter() - t0, {"degree": spec.degree, "threshold": spec.threshold,
                                                      "dropped_at": {k: list(v) for k, v in server.dropped_at.items()},
                                                      "fixed_point": fp.as_dict(), "rejected": rejected})


def run_feddl(ex, cfg: FlowerRunConfig) -> dict:
    """Run FedDL over the sites behind ``ex``; returns the result dict (landmarks as an array)."""
    from ...kernels import check_gamma, median_gamma
    from ...landmarks import (default_lr, init_landmarks, release_bounds, resolve_weights, server_gradient_step,
                              server_model_average)

    t_start = time.perf_counter()
    if cfg.rule not in ("model", "gradient"):
        raise ConfigError(bad_value("rule", cfg.rule, "use 'model' (Eq. 15) or 'gradient' (Eq. 16)"))
    sites = hello(ex, cfg)
    _log(cfg, "hello", sites=sites.names, sizes=sites.sizes)
    m = sites.n_features
    sec = _SecAggState(cfg) if cfg.aggregation == "secagg" else None
    rng = np.random.default_rng(cfg.seed)
    w = resolve_weights(cfg.weights, sites.sizes)
    steps: list = []
    released: list = []

    bound = cfg.value_bound if cfg.value_bound > 0 else None
    n_total = float(sum(sites.sizes))
    size_w = [n / n_total for n in sites.sizes]

    def agg(task, weights, label, clip):
        a, st = _aggregate(ex, cfg, sites, sec, task, weights, label, clip)
        steps.append(st)
        return a

    # the same releases, scalings and bounds as landmarks._federated_gamma / _federated_moments
    if cfg.gamma > 0:
        gamma = cfg.gamma
    else:
        scale = 1.0 if bound is None else 4.0 * m * bound
        a = agg({"task": "gamma", "scale": scale, "out_shape": [1]}, size_w, "gamma",
                release_bounds(bound, m, cfg.landmarks, None).get("gamma"))
        gamma = median_gamma([a.total[0] * scale / a.weight_sum])
        released.append("one scalar per site: local median squared distance (for γ)")
    gamma = check_gamma(gamma)
    lr = float(cfg.lr) if cfg.lr > 0 else default_lr(cfg.landmarks, gamma)
    if cfg.init == "moments":
        scale = 1.0 if bound is None else bound
        a = agg({"task": "moments", "scale": scale, "out_shape": [2 * m]}, size_w, "moments",
                release_bounds(bound, m, cfg.landmarks, None).get("moments"))
        tot = a.total / a.weight_sum
        mean = tot[:m]
        std = np.sqrt(np.maximum(tot[m:] * scale - mean ** 2, 0.0))
        Y = init_landmarks(cfg.landmarks, m, mean=mean, std=std, rng=rng)
        released.append("per-feature means and mean squares (one secure sum, for the initial landmarks)")
    else:
        Y = np.load(cfg.init)
        if Y.shape != (cfg.landmarks, m) or not np.all(np.isfinite(Y)):
            raise ConfigError(bad_value("init", cfg.init, f"give a finite ({cfg.landmarks}, {m}) array"))
    clip = release_bounds(bound, m, cfg.landmarks, gamma).get(cfg.rule)
    for s in range(cfg.rounds):
        if cfg.rule == "model":
            task = {"task": "model", "Y": array_to_bytes(Y), "shape": list(Y.shape), "gamma": gamma, "lr": lr,
                    "local_steps": cfg.local_steps, "out_shape": list(Y.shape)}
            Y = server_model_average(agg(task, w, f"round {s + 1}", clip))
        else:
            for t in range(cfg.local_steps):
                task = {"task": "gradient", "Y": array_to_bytes(Y), "shape": list(Y.shape), "gamma": gamma,
                        "out_shape": list(Y.shape)}
                Y = server_gradient_step(Y, agg(task, w, f"round {s + 1} step {t + 1}", clip), lr)
        if not np.all(np.isfinite(Y)):
            raise ConfigError(bad_value("lr", lr, f"landmarks diverged in round {s + 1}; use a smaller step"))
        _log(cfg, "round", round=s + 1)
    emb = None
    if cfg.embedding == "tsne-local":
        emb = embed_local(ex, cfg, sites, Y)
    elif cfg.embedding != "none":
        raise ConfigError(bad_value("embedding", cfg.embedding, "use 'tsne-local' (no rows leave the sites) or 'none'"))
    return {"landmarks": Y, "embedding": emb, "gamma": gamma, "lr": lr, "rounds_done": cfg.rounds, "sites": sites.names,
            "site_sizes": sites.sizes, "survivors": sorted(sites.live), "steps": steps, "released": released,
            "seconds": time.perf_counter() - t_start, "flower_messages": ex.messages}


def embed_local(ex, cfg: FlowerRunConfig, sites: Sites, Y: np.ndarray) -> dict:
    """No-rows t-SNE (``FedTSNE(nystrom="local")``): the server embeds the landmarks, every live site
    places its own records against that model and returns only their coordinates.

    Returns ``{"landmark_embedding", "coordinates": {site name: array}, "sites": [names]}``; a site
    that fails or stays silent is reported in ``missing``.
    """
    from .embedding import fit_landmark_tsne

    t0 = time.perf_counter()
    E = np.asarray(fit_landmark_tsne(Y, cfg.perplexity, cfg.tsne_seed))
    _log(cfg, "embedding", landmarks=len(Y))
    before_to, before_from = dict(ex.bytes_to), dict(ex.bytes_from)
    req = {"op": "embed", "Y": array_to_bytes(Y), "shape": list(Y.shape), "perplexity": float(cfg.perplexity),
           "tsne_seed": int(cfg.tsne_seed), "landmark_embedding": array_to_bytes(E), "embedding_shape": list(E.shape)}
    live = sorted(sites.live)
    replies = ex.request({i: dict(req) for i in live}, ex.now() + cfg.plain_timeout)
    coords, missing = {}, {}
    for i in live:
        r = replies.get(i)
        if r is None or "error" in r:
            missing[sites.names[i]] = (r or {}).get("error") or ex.silent.get(i, "no reply")
            continue
        coords[sites.names[i]] = array_from_bytes(r["embedding"], r["embedding_shape"])
    return {"landmark_embedding": E, "coordinates": coords, "missing": missing, "seconds": time.perf_counter() - t0,
            "bytes_to_site": {sites.names[i]: ex.bytes_to[i] - before_to[i] for i in live},
            "bytes_from_site": {sites.names[i]: ex.bytes_from[i] - before_from[i] for i in live}}
