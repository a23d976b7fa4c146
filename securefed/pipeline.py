"""``securefed run``: one federated job end to end, leaving everything ``securefed audit`` needs.

Stages: load data → partition into sites → (DP set-up, ledger) → landmarks (FedDL, secure sum) →
membership audit gate → Nyström stage (rows or local placement) → embedding → reconstruction audit
(play the server on what left the sites) → metrics, plots and the run folder (``notes`` layout):

``config.json`` (parameters, mode, versions), ``metrics.json``, ``history.json``, ``ledger.jsonl``,
``checkpoint.npz``, ``audit/mia.json``, ``audit/reconstruction.json``, ``embedding.npy`` /
``labels.npy``, ``y_true.npy``, ``embedding.png``.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from dataclasses import dataclass, field
from importlib import metadata

import numpy as np

from .errors import AuditFailedError, ConfigError, bad_value

__all__ = ["RunConfig", "run", "FED_METHODS", "PEER_METHOD_NAMES"]

FED_METHODS = ("tsne", "umap", "spectral")
PEER_METHOD_NAMES = ("dsne", "fdsne", "dp-dsne", "gtm")


@dataclass
class RunConfig:
    """Everything ``securefed run`` takes (the CLI flags, one to one)."""

    dataset: str = "digits"
    label_column: str | None = None
    clients: int = 10
    partition: str = "label"
    method: str = "tsne"
    landmarks: int = 300
    rounds: int = 60
    local_steps: int = 5
    rule: str = "model"
    lr: float | str = "auto"
    gamma: float | None = None
    seed: int = 0
    compare_centralized: bool = True
    out: str = "securefed-run"
    aggregation: str = "plain"
    nystrom: str | None = None
    reconstruction: str = "auto"
    audit: bool = True
    audit_holdout: float = 0.2
    allow_audit_failure: bool = False
    max_auc: float = 0.6
    max_empirical_epsilon: float = 1.0
    rows_epsilon: float | None = None
    n_clusters: int | None = None
    reference_size: int = 300
    value_bound: float | None = None
    refine_rounds: int | str = "auto"
    refine_min_cluster: int = 10
    n_jobs: int = 1
    quiet: bool = False
    privacy_args: object = None  # argparse namespace with the accounting flags (or None)
    extra: dict = field(default_factory=dict)


def _versions() -> dict:
    out = {"python": sys.version.split()[0]}
    for pkg in ("securefed", "numpy", "scipy", "scikit-learn", "cryptography", "tenseal", "torch", "opacus",
                "openTSNE", "umap-learn", "pynndescent"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = None
    return out


def _write_json(path: str, obj) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(obj, fh, indent=2, default=_json_default, allow_nan=False)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def _json_default(o):
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    return str(o)


def _clean(d):
    """Replace NaN/inf by None so the JSON is strict."""
    if isinstance(d, dict):
        return {k: _clean(v) for k, v in d.items()}
    if isinstance(d, (list, tuple)):
        return [_clean(v) for v in d]
    if isinstance(d, float) and not np.isfinite(d):
        return None
    return d


def _log(cfg: RunConfig, msg: str) -> None:
    if not cfg.quiet:
        print(msg, file=sys.stderr, flush=True)


def _plot(path: str, panels: list[tuple[str, np.ndarray, np.ndarray | None]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 5.5), squeeze=False)
    for ax, (title, E, c) in zip(axes[0], panels):
        if c is None:
            ax.scatter(E[:, 0], E[:, 1], c="tab:blue", s=3, linewidths=0)
        else:
            ax.scatter(E[:, 0], E[:, 1], c=c, cmap="tab10", s=3, linewidths=0)
        ax.set_title(title)
        ax.set_xticks([])
        ax.set_yticks([])
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _validate(cfg: RunConfig) -> None:
    if cfg.method not in FED_METHODS + PEER_METHOD_NAMES:
        raise ConfigError(bad_value("--method", cfg.method, f"choose one of {', '.join(FED_METHODS + PEER_METHOD_NAMES)}"))
    if isinstance(cfg.clients, bool) or not isinstance(cfg.clients, int) or cfg.clients < 1:
        raise ConfigError(bad_value("--clients", cfg.clients, "use an integer ≥ 1"))
    if cfg.nystrom not in (None, "rows", "local"):
        raise ConfigError(bad_value("--nystrom", cfg.nystrom, "use 'rows' (the paper) or 'local' (no rows leave a site)"))


def _run_id(cfg: RunConfig) -> str:
    """Stable id of a run's parameters: re-running the same command in the same folder resumes it."""
    keys = {k: v for k, v in vars(cfg).items() if k not in ("quiet", "privacy_args", "extra", "n_jobs")}
    if cfg.privacy_args is not None:
        keys["privacy"] = {k: v for k, v in sorted(vars(cfg.privacy_args).items()) if not callable(v)}
    h = hashlib.sha256(json.dumps(keys, sort_keys=True, default=str).encode()).hexdigest()[:16]
    return f"run-{h}"


def run(cfg: RunConfig) -> dict:
    """Run one job; returns the metrics dict (also written to ``<out>/metrics.json``)."""
    from .data import load_dataset, partition
    from .metrics import clustering_metrics, embedding_metrics

    _validate(cfg)
    t_all = time.perf_counter()
    out = os.path.abspath(cfg.out)
    try:
        os.makedirs(out, exist_ok=True)
    except OSError as exc:
        raise ConfigError(bad_value("--out", cfg.out, f"cannot create the folder ({exc.strerror}); pick a writable path")) from None
    try:
        ds = load_dataset(cfg.dataset, cfg.label_column)
    except ConfigError as exc:  # name the flag the user typed
        raise type(exc)(f"--dataset/--label-column: {exc}") from None
    X_all, y_all = ds.X, ds.y
    rng = np.random.default_rng(cfg.seed)
    reference = None
    if cfg.method in ("dsne", "fdsne", "dp-dsne"):
        # dSNE needs a public reference set: simulate it with a held-out public split of the data set
        n_ref = int(cfg.reference_size)
        if not 10 <= n_ref < len(X_all) // 2:
            raise ConfigError(bad_value("--reference-size", n_ref, f"use between 10 and {len(X_all) // 2 - 1}"))
        perm = rng.permutation(len(X_all))
        reference = X_all[perm[:n_ref]]
        keep = np.sort(perm[n_ref:])
        X_all = X_all[keep]
        y_all = None if y_all is None else y_all[keep]
    try:
        parts = partition(X_all, y_all, cfg.clients, cfg.partition, random_state=rng)
    except ConfigError as exc:
        raise type(exc)(f"--partition/--clients: {exc}") from None
    sites = [X_all[i] for i in parts]
    X_pooled = np.vstack(sites)
    y_pooled = None if y_all is None else np.concatenate([y_all[i] for i in parts])
    if y_pooled is not None:
        np.save(os.path.join(out, "y_true.npy"), y_pooled)
    run_id = _run_id(cfg)
    ledger_path = os.path.join(out, "ledger.jsonl")

    # ---------------------------------------------------------------- privacy set-up (issue 4)
    privacy = rows_privacy = None
    if cfg.method in FED_METHODS and cfg.privacy_args is not None:
        from .cli.budget import privacy_from_args
        from .data import BUILTIN_DATASETS

        pa = cfg.privacy_args
        dp_asked = getattr(pa, "epsilon", None) is not None or getattr(pa, "noise_multiplier", None) is not None
        if dp_asked and getattr(pa, "clip_norm", None) is None and str(cfg.dataset) in BUILTIN_DATASETS:
            # a built-in data set is public, so its value range is public knowledge: every record's norm is at
            # most max|x_j|·√m, a τ_X that clips nothing and depends on no one's records
            pa.clip_norm = float(np.max(np.abs(ds.X))) * float(np.sqrt(ds.X.shape[1]))
            cfg.extra["clip_norm_from"] = "built-in data set's public value range: max|x|·√m"
            _log(cfg, f"[privacy] --clip-norm {pa.clip_norm:g} (the built-in data set's public range: max|x|·√m; no record is clipped)")
        privacy = privacy_from_args(pa, ledger_path, run_id, random_state=cfg.seed)
    nystrom = cfg.nystrom or ("local" if privacy is not None else "rows")
    if privacy is not None and nystrom == "rows":
        from .accounting import DataPerturbation

        if cfg.rows_epsilon is None:
            raise ConfigError(bad_value("--rows-epsilon", None, "with differential privacy and --nystrom rows every "
                                        "record's row is a release: give its ε (e.g. --rows-epsilon 1), or use --nystrom local"))
        ledger = privacy.ledger
        if ledger.budget_epsilon is not None:
            ledger.budget_epsilon = ledger.budget_epsilon + float(cfg.rows_epsilon)  # total = landmarks + rows
        rows_privacy = DataPerturbation(cfg.rows_epsilon, delta=privacy.delta, tau_x=privacy.tau_x,
                                        secure_mode=privacy.secure_mode, ledger=ledger)

    value_bound = cfg.value_bound
    if value_bound is None and cfg.aggregation != "plain" and privacy is None:
        from .data import BUILTIN_DATASETS

        if str(cfg.dataset) not in BUILTIN_DATASETS:
            raise ConfigError(bad_value("--value-bound", None, f"--aggregation {cfg.aggregation} quantises into a public range: "
                                        "give a public bound on |feature values| of your data, e.g. --value-bound 255"))
        # the built-in data sets are public, so their value range is public knowledge
        value_bound = float(np.max(np.abs(ds.X)))
    cfg.extra["value_bound"] = value_bound
    mode = {"aggregation": cfg.aggregation, "dp": privacy is not None, "nystrom": nystrom, "rule": cfg.rule,
            "method": cfg.method, "rows_privacy": rows_privacy is not None, "n_landmarks": cfg.landmarks}
    config = {"run_id": run_id, "dataset": {"name": ds.name, "n_samples": int(len(X_pooled)), "n_features": int(X_pooled.shape[1])},
              "n_features": int(X_pooled.shape[1]), "n_landmarks": cfg.landmarks, "mode": mode,
              "parameters": {k: v for k, v in vars(cfg).items() if k not in ("privacy_args", "extra", "quiet")},
              "privacy_parameters": None if cfg.privacy_args is None else
              {k: v for k, v in vars(cfg.privacy_args).items() if not callable(v) and k in (
                  "epsilon", "delta", "accountant", "noise", "clip_norm", "noise_multiplier", "sample_rate",
                  "secure_noise", "min_survivors", "sensitivity_rule")},
              "site_sizes": [len(s) for s in sites], "versions": _versions()}
    _write_json(os.path.join(out, "config.json"), _clean(config))

    metrics = {"method": cfg.method, "dataset": ds.name, "n_samples": int(len(X_pooled)), "n_clients": len(sites),
               "partition": cfg.partition, "mode": mode, "timings": {}}
    history = {"rounds": [], "mmd": [], "epsilon": []}

    def progress(s, Y, val):
        history["rounds"].append(s)
        history["mmd"].append(val)
        if privacy is not None:
            history["epsilon"].append(float(privacy.ledger.spent()[0]))
        if not cfg.quiet and (s == 1 or s % max(1, cfg.rounds // 10) == 0 or s == cfg.rounds):
            extra = f" MMD={val:.5f}" if val is not None else ""
            if privacy is not None:
                extra += f" ε spent={history['epsilon'][-1]:.3f}"
            _log(cfg, f"[landmarks] round {s}/{cfg.rounds}{extra}")

    fed = None
    t0 = time.perf_counter()
    if cfg.method in FED_METHODS:
        fed = _fit_federated(cfg, sites, y_pooled, privacy, rows_privacy, nystrom, progress, out, metrics)
        if cfg.method == "spectral":
            np.save(os.path.join(out, "labels.npy"), fed.labels_)
            metrics["federated"] = clustering_metrics(fed.labels_, y_pooled, random_state=cfg.seed) if y_pooled is not None else {}
        else:
            np.save(os.path.join(out, "embedding.npy"), fed.embedding_)
            metrics["federated"] = embedding_metrics(X_pooled, fed.embedding_, y_pooled, random_state=cfg.seed)
        metrics["timings"].update({f"federated_{k}": v for k, v in fed.timings_.items()})
        metrics["aggregation"] = fed.feddl_.aggregation
        metrics["released_before_rounds"] = fed.feddl_.released
        metrics["reconstruction"] = fed.reconstruction_
        metrics["sent_by_each_site"] = fed.sent_kind_
        if fed.privacy_ is not None:
            metrics["privacy"] = fed.privacy_
            if getattr(fed, "rows_privacy_", None) is not None:
                metrics["privacy"]["rows"] = fed.rows_privacy_
                metrics["privacy"]["epsilon_total"] = float(privacy.ledger.spent()[0])
        if fed.audit_ is not None:
            metrics["audit"] = fed.audit_
        metrics["reconstruction_audit"] = _reconstruction_audit(cfg, fed, sites, out)
    else:
        emb = _fit_peer(cfg, sites, reference, metrics)
        np.save(os.path.join(out, "embedding.npy"), emb)
        metrics["federated"] = embedding_metrics(X_pooled, emb, y_pooled, random_state=cfg.seed)
        fed_emb = emb
    metrics["timings"]["federated_total"] = time.perf_counter() - t0
    if not any(v is not None for v in history["mmd"]):
        history["mmd"] = []  # not monitored (DP runs): the MMD would be an unaccounted release
    _write_json(os.path.join(out, "history.json"), _clean(history))

    central = None
    if cfg.compare_centralized:
        t1 = time.perf_counter()
        _log(cfg, "[centralized] fitting the pooled-data baseline for comparison")
        central = _fit_central(cfg, X_pooled, y_pooled)
        metrics["timings"]["centralized"] = time.perf_counter() - t1
        if cfg.method == "spectral":
            metrics["centralized"] = clustering_metrics(central, y_pooled, random_state=cfg.seed) if y_pooled is not None else {}
        else:
            metrics["centralized"] = embedding_metrics(X_pooled, central, y_pooled, random_state=cfg.seed)

    # plot
    if cfg.method == "spectral":
        from sklearn.decomposition import PCA

        P2 = PCA(2, random_state=0).fit_transform(X_pooled)
        panels = [("Fed-SpeClust clusters (PCA view)", P2, fed.labels_)]
        if central is not None:
            panels.append(("centralized spectral clusters (PCA view)", P2, central))
        if y_pooled is not None:
            panels.append(("true labels (PCA view)", P2, y_pooled))
    else:
        name = {"tsne": "Fed-tSNE", "umap": "Fed-UMAP"}.get(cfg.method, cfg.method)
        panels = [(f"{name} ({cfg.partition}, {len(sites)} sites)", fed.embedding_ if fed is not None else fed_emb, y_pooled)]
        if central is not None:
            panels.append((f"centralized {cfg.method}", central, y_pooled))
    _plot(os.path.join(out, "embedding.png"), panels)
    metrics["timings"]["total"] = time.perf_counter() - t_all
    _write_json(os.path.join(out, "metrics.json"), _clean(metrics))
    return metrics


def _make_auditor(cfg: RunConfig, privacy, out: str, metrics: dict):
    """The membership-inference gate between the landmarks and the Nyström stage (issue 5)."""
    from .audits import AuditPolicy, audit_gate, membership_audit
    from .report import write_audit_files

    policy = AuditPolicy(max_auc=cfg.max_auc, max_empirical_epsilon=cfg.max_empirical_epsilon)

    def auditor(members, holdout, res):
        _log(cfg, "[audit] membership inference on the landmarks (before any row leaves a site)")
        mia = membership_audit(members, holdout, res.landmarks, res.gamma, scores=("nearest", "kde"),
                               delta=privacy.delta if privacy is not None else 0.0, random_state=cfg.seed)
        write_audit_files(out, mia=mia)
        claimed = res.privacy.get("epsilon") if res.privacy else None
        dec = audit_gate(mia, policy, claimed_epsilon=claimed, allow_failure=True,
                         ledger=privacy.ledger if privacy is not None else None)
        if not dec.passed and not cfg.allow_audit_failure:
            block = dec.to_dict()
            block.update(verdict="fail", overridden=False, proceed=False, rows_sent=0,
                         note="the run stopped at the gate: nothing was sent for the Nyström stage")
            block["ledger_event"], block["ledger_recorded"] = None, False
            metrics["audit"] = block
            _write_json(os.path.join(out, "metrics.json"), _clean(metrics))
            raise AuditFailedError(
                "landmark membership audit failed: " + "; ".join(str(f) for f in dec.failures)
                + " — nothing was sent for the Nyström stage; rerun with --allow-audit-failure to proceed (recorded), "
                  "or add noise (--epsilon) / fewer landmarks")
        d = dec.to_dict()
        _log(cfg, f"[audit] verdict: {d['verdict']} (AUC={d['auc']:.3f}, empirical ε ≥ {d['empirical_epsilon']:.3f})")
        return d

    return auditor


def _checkpoint_path(cfg: RunConfig, out: str) -> str:
    """``<out>/checkpoint.npz``, resumed only by the same run (same parameters): a checkpoint another
    configuration left in the folder is discarded, with a message."""
    path = os.path.join(out, "checkpoint.npz")
    owner = os.path.join(out, "checkpoint.owner")
    rid = _run_id(cfg)
    previous = open(owner).read().strip() if os.path.exists(owner) else None
    if os.path.exists(path) and previous != rid:
        _log(cfg, f"[landmarks] discarding {path}: it belongs to a run with other parameters ({previous})")
        os.remove(path)
    elif os.path.exists(path):
        _log(cfg, f"[landmarks] resuming from {path}")
    with open(owner, "w") as fh:
        fh.write(rid + "\n")
    return path


def _fit_federated(cfg, sites, y, privacy, rows_privacy, nystrom, progress, out, metrics):
    from .estimators import FedSpectralClustering, FedTSNE, FedUMAP

    common = dict(n_landmarks=cfg.landmarks, rounds=cfg.rounds, local_steps=cfg.local_steps, rule=cfg.rule,
                  lr=cfg.lr, gamma=cfg.gamma, aggregation=cfg.aggregation, privacy=privacy, nystrom=nystrom,
                  reconstruction=cfg.reconstruction, rows_privacy=rows_privacy,
                  auditor=_make_auditor(cfg, privacy, out, metrics) if cfg.audit else None,
                  audit_holdout=cfg.audit_holdout if cfg.audit else 0.0,
                  checkpoint=_checkpoint_path(cfg, out), random_state=cfg.seed, callback=progress,
                  n_jobs=cfg.n_jobs, keep_sent=True, value_bound=cfg.extra.get("value_bound"),
                  refine_rounds=cfg.refine_rounds, refine_min_cluster=cfg.refine_min_cluster)
    _log(cfg, f"[landmarks] FedDL: {len(sites)} sites, {cfg.landmarks} landmarks, {cfg.rounds} rounds × {cfg.local_steps} "
              f"local steps, {cfg.rule} averaging, {cfg.aggregation} aggregation"
              + (", differential privacy on" if privacy is not None else ""))
    if cfg.method == "tsne":
        est = FedTSNE(**common)
    elif cfg.method == "umap":
        est = FedUMAP(**common)
    else:
        k = cfg.n_clusters or (len(np.unique(y)) if y is not None else 8)
        est = FedSpectralClustering(n_clusters=int(k), **common)
    est.fit(sites)
    _log(cfg, f"[embedding] done ({est.reconstruction_} reconstruction; each site sent: {est.sent_kind_})")
    return est


def _reconstruction_audit(cfg, fed, sites, out) -> dict:
    """Play the server on what left the sites in the Nyström stage and measure what it gives back."""
    from .audits import (reconstruct_from_coordinates, reconstruct_from_distance_rows, reconstruct_from_kernel_rows,
                         reconstruction_record)
    from .report import write_audit_files

    X_true = np.vstack(sites)
    Y = fed.landmarks_
    if fed.nystrom == "rows":
        rows = fed.sent_rows_
        if cfg.method == "spectral":
            X_hat = reconstruct_from_kernel_rows(rows, Y, fed.kernel_gamma_)
            kind, attack = ("perturbed_rows" if fed.rows_privacy is not None else "kernel_rows"), "kernel inversion + trilateration"
        else:
            X_hat = reconstruct_from_distance_rows(rows, Y, squared=True)
            kind, attack = ("perturbed_rows" if fed.rows_privacy is not None else "rows"), "trilateration"
    elif cfg.method == "spectral":
        # only labels leave: the server's best estimate of a record is the mean of its cluster's landmarks
        cent = np.vstack([Y[fed.landmark_labels_ == c].mean(axis=0) if np.any(fed.landmark_labels_ == c) else Y.mean(axis=0)
                          for c in range(fed.n_clusters)])
        X_hat, kind, attack = cent[fed.labels_], "local", "cluster mean of landmarks"
    else:
        coords = [fed.embedding_[s] for s in fed._site_slices()]
        X_hat = np.vstack(reconstruct_from_coordinates(coords, fed.landmark_embedding_, Y))
        kind, attack = "local", "kernel regression from 2-D coordinates through the landmarks"
    rec = reconstruction_record(X_true, X_hat, mode=kind, attack=attack, Y=Y)
    write_audit_files(out, reconstruction=rec)
    _log(cfg, f"[audit] reconstruction from what left the sites ({attack}): median relative error "
              f"{rec['median_relative_error']:.3g}, {100 * rec['fraction_within_5pct']:.1f}% of records within 5%")
    return {k: rec[k] for k in ("mode", "attack", "median_relative_error", "fraction_within_5pct") if k in rec}


def _fit_peer(cfg, sites, reference, metrics):
    from .peers import PEER_METHODS, WHAT_LEAVES

    _log(cfg, f"[{cfg.method}] fitting on {len(sites)} sites")
    opts = {}
    if reference is not None:
        opts["reference"] = reference
    if cfg.method == "gtm":
        # each site summarises its records by at most 60 Gaussian components (papers/003), never more than it holds
        opts["n_components_per_site"] = int(min(60, min(len(s) for s in sites)))
    est = PEER_METHODS[cfg.method](random_state=cfg.seed, **opts)
    emb = est.fit_transform(sites)
    metrics["sent_by_each_site"] = WHAT_LEAVES.get(cfg.method)
    eps = getattr(est, "epsilon_", None)
    if eps is not None:
        metrics["privacy"] = {"epsilon": eps, "delta": getattr(est, "delta_", None),
                              "accountant": getattr(est, "accountant_", "rdp")}
    return np.asarray(emb)


def _fit_central(cfg, X, y):
    from .estimators import CentralizedSpectralClustering, CentralizedTSNE, CentralizedUMAP

    if cfg.method == "spectral":
        k = cfg.n_clusters or (len(np.unique(y)) if y is not None else 8)
        return CentralizedSpectralClustering(int(k), random_state=cfg.seed).fit_predict(X)
    if cfg.method == "umap":
        return CentralizedUMAP(random_state=cfg.seed).fit_transform(X)
    if cfg.method == "gtm":
        from .peers import CentralizedGTM

        return np.asarray(CentralizedGTM(random_state=cfg.seed).fit_transform(X))
    return CentralizedTSNE(random_state=cfg.seed, n_jobs=cfg.n_jobs).fit_transform(X)
