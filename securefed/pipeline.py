"""``securefed run``: one federated job end to end on built-in data or a file, leaving everything
``securefed audit`` needs in the run folder (:mod:`securefed.report.layout`).

:func:`run_job` loads the data, splits it into sites, builds the run plan once (:class:`~securefed.plan.RunPlan`;
for a built-in, public data set the public value range fills ``value_bound`` / ``clip_norm`` when not given),
runs the one coordinator in this process (:func:`securefed.federation.run_in_process`) with each site's
privacy ledger in ``<out>/site-ledgers/<site>/`` and the coordinator's in ``<out>/ledger.jsonl``, then plays
the server on what left the sites (reconstruction audit), compares with the centralized method and writes
metrics and plots.
"""

from __future__ import annotations

import os
import sys
import time
from importlib import metadata
from typing import Any

import numpy as np

from types import SimpleNamespace

from .errors import ConfigError, LedgerError, SecureFedError, bad_value
from .progress import ProgressPrinter
from .report.layout import clean, write_json, write_run_result

__all__ = ["run_job", "check_job", "JOB_DEFAULTS", "FED_METHODS", "PEER_METHOD_NAMES"]

FED_METHODS = ("tsne", "umap", "spectral")
PEER_METHOD_NAMES = ("dsne", "fdsne", "dp-dsne", "gtm")
#: the job's own settings (not run-plan options) and their defaults: ``securefed run``'s flags of the same names
JOB_DEFAULTS = {
    "dataset": "digits",
    "label_column": None,
    "site": None,
    "id_column": None,
    "keep_column": None,
    "layer": None,
    "clients": 10,
    "partition": "label",
    "method": "tsne",
    "out": "securefed-run",
    "compare_centralized": True,
    "quiet": False,
    "reference_size": 300,
    "force": False,
}


def _versions() -> dict:
    out = {"python": sys.version.split()[0]}
    for pkg in (
        "securefed",
        "numpy",
        "scipy",
        "scikit-learn",
        "cryptography",
        "tenseal",
        "torch",
        "opacus",
        "openTSNE",
        "umap-learn",
        "pynndescent",
    ):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = None
    return out


class _Log:
    def __init__(self, quiet: bool):
        self.quiet = quiet

    def __call__(self, msg: str) -> None:
        if not self.quiet:
            print(msg, file=sys.stderr, flush=True)


_DATA_FLAGS = (
    ("spec", "--site"),
    ("id_column", "--id-column"),
    ("label_column", "--label-column"),
    ("layer", "--layer"),
    ("name_or_path", "--dataset"),
)


def _flag_error(exc: Exception):
    """The same typed error, naming the flag the user typed instead of the data loader's parameter."""
    msg = str(exc)
    for param, flag in _DATA_FLAGS:
        if msg.startswith(param + "=") or msg.startswith(param + " "):
            return type(exc)(flag + msg[len(param) :])
    return type(exc)(f"--dataset/--site: {msg}")


def _load_sites(job: dict, seed: int):
    """``(dataset, site arrays, pooled labels or None, dSNE reference or None, site names, record ids per site or
    None)``: per-site files (``--site``) as the hospitals hold them, or a data set split into ``--clients`` sites."""
    from .data import load_dataset, load_sites, partition
    from .federation.inprocess import site_names

    keep = tuple(job.get("keep_column") or ())
    if job.get("site"):
        try:
            parts = load_sites(
                job["site"],
                label_column=job["label_column"],
                id_column=job.get("id_column"),
                layer=job.get("layer"),
                allow_id_like=keep,
            )
        except SecureFedError as exc:
            raise _flag_error(exc) from None
        ds: Any = SimpleNamespace(
            name=f"{len(parts)} site files",
            X=np.vstack([p.X for p in parts]),
            target_names=parts[0].target_names,
            feature_names=parts[0].feature_names,
            paths={p.name: p.path for p in parts},
        )
        y = None if parts[0].y is None else np.concatenate([p.y for p in parts])
        ids = {p.name: list(p.ids) for p in parts} if parts[0].ids is not None else None
        return ds, [p.X for p in parts], y, None, [p.name for p in parts], ids
    try:
        ds = load_dataset(
            job["dataset"], job["label_column"], job.get("id_column"), layer=job.get("layer"), allow_id_like=keep
        )
    except SecureFedError as exc:
        raise _flag_error(exc) from None
    X_all, y_all = ds.X, ds.y
    ids_all = None if getattr(ds, "ids", None) is None else np.asarray(ds.ids, dtype=object)
    rng = np.random.default_rng(seed)
    reference = None
    if job["method"] in ("dsne", "fdsne", "dp-dsne"):
        # dSNE needs a public reference set: simulate it with a held-out public split of the data set
        n_ref = int(job["reference_size"])
        if not 10 <= n_ref < len(X_all) // 2:
            raise ConfigError(bad_value("--reference-size", n_ref, f"use between 10 and {len(X_all) // 2 - 1}"))
        perm = rng.permutation(len(X_all))
        reference = X_all[perm[:n_ref]]
        keep_idx = np.sort(perm[n_ref:])
        X_all, y_all = X_all[keep_idx], (None if y_all is None else y_all[keep_idx])
        ids_all = None if ids_all is None else ids_all[keep_idx]
    try:
        index_sets = partition(X_all, y_all, job["clients"], job["partition"], random_state=rng)
    except ConfigError as exc:
        raise type(exc)(f"--partition/--clients: {exc}") from None
    sites = [X_all[i] for i in index_sets]
    y = None if y_all is None else np.concatenate([y_all[i] for i in index_sets])
    names = site_names(len(sites))
    ids = None if ids_all is None else {n: [str(v) for v in ids_all[i]] for n, i in zip(names, index_sets)}
    return ds, sites, y, reference, names, ids


def _public_bounds(job: dict, options: dict, ds, log) -> dict:
    """Fill ``value_bound`` / ``clip_norm`` from a built-in data set's **public** value range when not given (on the
    user's own records they must be given: :func:`_require_public_bounds`)."""

    options = dict(options)
    if not _public_data(job):
        _require_public_bounds(options)
        return options
    dp = options.get("epsilon") is not None or options.get("noise_multiplier") is not None
    if dp and options.get("clip_norm") is None:
        # every record's norm is at most max|x_j|·√m: a τ_X that clips nothing and depends on no one's records
        options["clip_norm"] = float(np.max(np.abs(ds.X))) * float(np.sqrt(ds.X.shape[1]))
        log(f"[privacy] --clip-norm {options['clip_norm']:g} (the built-in data set's public range: max|x|·√m)")
    if options.get("aggregation", "auto") != "plain" and options.get("value_bound") is None and not dp:
        options["value_bound"] = float(np.max(np.abs(ds.X)))
    return options


def _site_options(out: str, names, plan) -> list:
    """Each in-process site keeps its own ledger in ``<out>/site-ledgers/<site>/`` (one file per run)."""
    if not plan.dp:
        return [{} for _ in names]
    return [{"ledger-path": os.path.join(out, "site-ledgers", name)} for name in names]


def _server_ledger(out: str, plan, run_id: str):
    from .federation.privacy import open_server_ledger

    if not plan.dp:
        return None
    path = os.path.join(out, "ledger.jsonl")
    try:
        return open_server_ledger(plan, run_id, path)
    except LedgerError as exc:
        raise LedgerError(f"--out {out}: {exc} — this folder holds another run's ledger; use another --out") from None


def _run_mode(plan, method: str) -> dict:
    """The run's mode (secure sum, DP, landmark method, ...), as ``metrics.json`` and ``config.json`` record it."""
    return {
        "aggregation": plan.aggregation,
        "dp": plan.dp,
        "nystrom": plan.nystrom,
        "rule": plan.rule,
        "method": method,
        "rows_privacy": plan.rows_epsilon is not None,
        "n_landmarks": plan.landmarks,
        "landmark_method": plan.landmark_method,
        "cell_floor": plan.cell_floor,
        "coordinates": plan.coordinates,
    }


def _write_config(out: str, run_id: str, ds, X, plan, mode: dict, job: dict, sites, names) -> None:
    """Write the run's ``config.json``: its id, data set, mode, job, full plan, site sizes and versions."""
    write_json(
        os.path.join(out, "config.json"),
        {
            "run_id": run_id,
            "dataset": {"name": ds.name, "n_samples": int(len(X)), "n_features": int(X.shape[1])},
            "n_features": int(X.shape[1]),
            "n_landmarks": plan.landmarks,
            "mode": mode,
            "parameters": job,
            "options": plan.as_dict(),
            "site_sizes": [len(s) for s in sites],
            "sites": names,
            "versions": _versions(),
            "target_names": list(ds.target_names) if ds.target_names is not None else None,
        },
    )


def _run_federated(plan, sites, names, X, out: str, run_id: str, job: dict, metrics: dict, log):
    """The federated run itself, checkpointed after every round (resumed from ``checkpoint.npz`` when it is of this
    run); writes its result and ``history.json``, or the partial metrics when it fails; returns the result."""
    from .federation import run_in_process
    from .federation.checkpoint import fingerprint, write_checkpoint

    history: dict[str, list] = {"rounds": [], "mmd": [], "epsilon": []}
    fp = fingerprint(plan, [len(s) for s in sites], X.shape[1])
    ck_path = os.path.join(out, "checkpoint.npz")
    resume = _resume(ck_path, fp, plan, log)
    printer = None if job.get("quiet") else ProgressPrinter()

    def on_event(ev):
        if ev["event"] == "checkpoint":
            write_checkpoint(ck_path, ev["state"], fp)
        elif ev["event"] == "round":
            history["rounds"].append(ev["round"])
            history["epsilon"].append(ev.get("epsilon"))
        if printer is not None:
            printer(ev)

    t0 = time.perf_counter()
    try:
        res = run_in_process(
            plan,
            sites,
            names=names,
            site_options=_site_options(out, names, plan),
            ledger=_server_ledger(out, plan, run_id),
            resume=resume,
            on_event=on_event,
        )
    except Exception as exc:
        _write_partial(out, metrics, getattr(exc, "partial", {}))
        raise
    metrics["timings"]["federated_total"] = time.perf_counter() - t0
    write_run_result(out, res, plan)
    history["mmd"] = list(res.mmd_history)  # of the landmarks each round started from (not under DP: unaccounted)
    if not any(e is not None for e in history["epsilon"]):
        history["epsilon"] = []
    write_json(os.path.join(out, "history.json"), history)
    return res


def run_job(job: dict, options: dict) -> dict:
    """Run one job (``job``: data set, partition, output folder...; ``options``: the plan's options).

    Order: everything that can be refused is refused before anything is written — the job and the plan's options
    first (before any data are read), then the data, the full plan and the output folder (another run's outputs
    are replaced only with ``--force``; another run's privacy ledgers never)."""
    from .federation.privacy import derive_run_id
    from .metrics import clustering_metrics, embedding_metrics
    from .plan import RunPlan

    log = _Log(job.get("quiet", False))
    t_all = time.perf_counter()
    method = job["method"]
    check_job(job, options)
    out = os.path.abspath(job["out"])
    with _forwarded_warnings() as data_warnings:
        ds, sites, y, reference, names, ids = _load_sites(job, int(options.get("seed", 0)))
    for w in data_warnings:
        log(f"[data] warning: {w}")
    X = np.vstack(sites)
    metrics = {
        "method": method,
        "dataset": ds.name,
        "n_samples": int(len(X)),
        "n_clients": len(sites),
        "partition": "the sites' own files" if job.get("site") else job["partition"],
        "timings": {},
    }
    if data_warnings:
        metrics["data_warnings"] = list(data_warnings)
    if method in PEER_METHOD_NAMES:
        _claim_folder(out, None, bool(job.get("force")))
        if y is not None:
            np.save(os.path.join(out, "y_true.npy"), y)
        return _run_peer(job, options, sites, X, y, reference, metrics, out, log, t_all, ds, names)
    if options.get("n_clusters") is None:
        options = dict(options, n_clusters=int(len(np.unique(y))) if y is not None else 8)
    options = _public_bounds(job, options, ds, log)
    plan = RunPlan.build("cli", method=method, keep_rows=True, min_sites=1, **options)
    run_id = plan.run_id or derive_run_id(plan)
    mode = _run_mode(plan, method)
    metrics["mode"] = mode
    _claim_folder(out, run_id, bool(job.get("force")))  # the first write of the run
    if y is not None:
        np.save(os.path.join(out, "y_true.npy"), y)
    _write_config(out, run_id, ds, X, plan, mode, job, sites, names)
    res = _run_federated(plan, sites, names, X, out, run_id, job, metrics, log)
    _federated_metrics(metrics, res, plan, sites, X, y, out, embedding_metrics, clustering_metrics, log)
    _write_table(out, res, method, names, ids, y, sites, ds)
    _write_site_anndata(out, res, method, names, ids, ds, log)
    central = None
    if job["compare_centralized"]:
        t1 = time.perf_counter()
        log("[centralized] fitting the pooled-data baseline for comparison")
        central = _fit_central(method, plan, X, y)
        metrics["timings"]["centralized"] = time.perf_counter() - t1
        metrics["centralized"] = (
            (clustering_metrics(central, y, random_state=plan.seed) if y is not None else {})
            if method == "spectral"
            else embedding_metrics(X, central, y, random_state=plan.seed)
        )
    _plot_run(
        out,
        method,
        job,
        res.stacked("labels" if method == "spectral" else "coordinates"),
        X,
        y,
        central,
        sites,
        metrics,
        ds,
        names,
    )
    if res.embedding and "density" in res.embedding:
        from .report.plots import plot_density

        plot_density(
            os.path.join(out, "density.png"),
            res.embedding["density"],
            res.embedding.get("landmark_embedding"),
            epsilon=(res.privacy or {}).get("epsilon"),
        )
    metrics["timings"]["total"] = time.perf_counter() - t_all
    write_json(os.path.join(out, "metrics.json"), metrics)
    return clean(metrics)


def _public_data(job: dict) -> bool:
    """A built-in data set (public: its value range is no one's secret); ``--site`` files and user files are not."""
    from .data import BUILTIN_DATASETS

    return not job.get("site") and str(job.get("dataset")).lower() in BUILTIN_DATASETS


def _require_public_bounds(options: dict) -> None:
    """On the user's own records the public bounds of the secure sum and of DP must come from the user (a number
    the sites agree on beforehand), never from the records: a maximum of the records is a release no ε covers."""
    dp = options.get("epsilon") is not None or options.get("noise_multiplier") is not None
    source = (
        "a public range the sites agree on beforehand — from the data dictionary or the instruments' ranges, "
        "never read off the records (their maximum is one patient's value: a release no ε covers)"
    )
    if dp and options.get("clip_norm") is None:
        raise ConfigError(
            bad_value(
                "--clip-norm",
                None,
                "differential privacy on your own records needs a public bound "
                f"τ_X on every record's norm, from {source}; e.g. B·√m when no feature can exceed "
                "B in absolute value (m features)",
            )
        )
    if (
        not dp
        and options.get("aggregation", "auto") in ("auto", "secagg", "ckks")
        and options.get("value_bound") is None
    ):
        raise ConfigError(
            bad_value(
                "--value-bound",
                None,
                "the secure sum on your own records needs a public bound B "
                f"≥ |every feature value|, from {source}; e.g. --value-bound 5000 when no measured "
                "value can exceed 5 000. Without one, only --aggregation plain is possible (the "
                "coordinator then sees every site's own uploads; a deployed site refuses it unless "
                "its operator sets allow-plain)",
            )
        )


def check_job(job: dict, options: dict) -> None:
    """Refuse a bad job or bad plan options before any data are read and before anything is written (typed errors
    naming the flag): the method, the number of sites, the partition, the output folder, the public bounds of the
    user's own records, then every plan option (:class:`~securefed.plan.RunPlan` with stand-ins for the values the
    data decide: the number of clusters and a built-in data set's public range)."""
    from .data import _expand, _parse_scheme
    from .plan import RunPlan

    method = job["method"]
    if method not in FED_METHODS + PEER_METHOD_NAMES:
        raise ConfigError(bad_value("--method", method, f"choose one of {', '.join(FED_METHODS + PEER_METHOD_NAMES)}"))
    if job.get("site"):
        try:
            n_files = len(_expand(job["site"]))
        except SecureFedError as exc:
            raise _flag_error(exc) from None
        if n_files < 2:
            raise ConfigError(
                bad_value(
                    "--site",
                    job["site"],
                    "a federation needs at least 2 sites: give one file per "
                    "site (repeat --site, or a glob or a directory holding 2 or more files)",
                )
            )
    else:
        from .data import BUILTIN_DATASETS, FILE_TYPES

        key = str(job["dataset"])
        if key.lower() not in BUILTIN_DATASETS:
            if os.path.splitext(key)[1].lower() not in FILE_TYPES:
                raise ConfigError(
                    bad_value(
                        "--dataset",
                        key,
                        f"use a built-in dataset {list(BUILTIN_DATASETS)} or a file ending in {list(FILE_TYPES)}",
                    )
                )
            if not os.path.isfile(key):
                raise ConfigError(bad_value("--dataset", key, "no such file; check the path"))
        clients = job["clients"]
        if isinstance(clients, bool) or not isinstance(clients, int) or clients < 2:
            raise ConfigError(
                bad_value(
                    "--clients",
                    clients,
                    "use an integer ≥ 2: a federation needs at least 2 sites "
                    "(the secure sum of one site is that site's own upload)",
                )
            )
        try:
            _parse_scheme(job["partition"])
        except ConfigError as exc:
            raise type(exc)(f"--partition/--clients: {exc}") from None
    out = os.path.abspath(job["out"])
    if os.path.exists(out) and not os.path.isdir(out):
        raise ConfigError(
            bad_value("--out", job["out"], "is a file, not a folder; pick a folder for the run's outputs")
        )
    _check_earlier_run(out, bool(job.get("force")))
    if method in PEER_METHOD_NAMES:
        return
    opts = dict(options)
    if not _public_data(job):
        _require_public_bounds(opts)
    dp = opts.get("epsilon") is not None or opts.get("noise_multiplier") is not None
    if dp and opts.get("clip_norm") is None:
        opts["clip_norm"] = 1.0  # stand-in: a built-in data set's public range fills it after loading
    if not dp and opts.get("aggregation", "auto") != "plain" and opts.get("value_bound") is None:
        opts["value_bound"] = 1.0
    if opts.get("n_clusters") is None:
        opts["n_clusters"] = 2  # stand-in: the number of labels, known after loading
    RunPlan.build("cli", method=method, keep_rows=True, min_sites=1, **opts)


#: what a run writes into its folder besides the privacy ledgers (replaced only with ``--force``)
_RUN_OUTPUTS = (
    "config.json",
    "metrics.json",
    "result.json",
    "audit.json",
    "history.json",
    "report.html",
    "report.json",
    "checkpoint.npz",
    "embedding.npy",
    "embedding.npz",
    "embedding.png",
    "embedding.csv",
    "labels.npy",
    "labels.npz",
    "y_true.npy",
    "landmarks.npy",
    "landmark_masses.npy",
    "landmark_embedding.npy",
    "landmark_labels.npy",
    "density.npz",
    "density.png",
    "progress.jsonl",
)
_SITE_FILES = "sites"  # the sites' own AnnData with the map written back (.h5ad sites)


def _earlier_run(out: str) -> tuple[bool, str | None]:
    """``(the folder holds a finished earlier run, its run id)``: finished = it wrote metrics.json or a report (a run
    that stopped at its audit gate has finished too); an unfinished run with the same plan resumes."""
    import json

    done = any(os.path.exists(os.path.join(out, f)) for f in ("metrics.json", "report.html", "report.json"))
    try:
        with open(os.path.join(out, "config.json"), encoding="utf-8") as fh:
            previous = json.load(fh).get("run_id")
    except (OSError, ValueError, AttributeError):
        previous = None
    return done, previous


def _check_earlier_run(out: str, force: bool) -> None:
    """Refuse a folder holding a finished run unless ``--force`` (no file is touched here)."""
    if not os.path.isdir(out):
        return
    done, previous = _earlier_run(out)
    if done and not force:
        raise ConfigError(
            bad_value(
                "--out",
                out,
                f"holds the outputs of an earlier run{f' ({previous})' if previous else ''}"
                " (metrics.json, report.html …); they are never overwritten silently: use another "
                "--out, or --force to replace them (privacy ledgers are never deleted)",
            )
        )


def _claim_folder(out: str, run_id: str | None, force: bool) -> None:
    """A run folder belongs to one run: an earlier run's outputs are replaced only with ``--force``, and another
    run's privacy ledger never (it is that run's record of spent budget). An unfinished run with the same plan
    (a checkpoint, no metrics.json) resumes. Creates the folder: the first write of a run."""
    _check_earlier_run(out, force)
    done, previous = _earlier_run(out) if os.path.isdir(out) else (False, None)
    other = previous is not None and previous != run_id
    if other and (
        os.path.exists(os.path.join(out, "ledger.jsonl")) or os.path.isdir(os.path.join(out, "site-ledgers"))
    ):
        raise ConfigError(
            bad_value(
                "--out",
                out,
                f"holds the privacy ledgers of another run ({previous}); they record "
                "spent privacy budget and are never overwritten: use another --out",
            )
        )
    if other and not force:
        raise ConfigError(
            bad_value(
                "--out",
                out,
                f"holds the outputs of another run ({previous}); use another --out, or --force to replace them",
            )
        )
    if done or other:  # --force: the earlier outputs go, the ledgers stay
        import shutil

        for name in _RUN_OUTPUTS:
            if os.path.exists(os.path.join(out, name)):
                os.remove(os.path.join(out, name))
        for name in ("audit", _SITE_FILES):
            shutil.rmtree(os.path.join(out, name), ignore_errors=True)
    try:
        os.makedirs(out, exist_ok=True)
    except OSError as exc:
        raise ConfigError(
            bad_value("--out", out, f"cannot create the folder ({exc.strerror}); pick a writable path")
        ) from None


class _forwarded_warnings:
    """Collect the data loaders' warnings (e.g. one patient id at two sites) as lines for the log and the report."""

    def __enter__(self) -> list:
        import warnings

        self._cm = warnings.catch_warnings(record=True)
        self._got = self._cm.__enter__()
        warnings.simplefilter("always", UserWarning)
        self.lines: list = []
        return self.lines

    def __exit__(self, *exc) -> None:
        self._cm.__exit__(*exc)
        self.lines += [str(w.message) for w in self._got if issubclass(w.category, UserWarning)]


def _resume(ck_path: str, fp: dict, plan, log) -> dict | None:
    from .federation.checkpoint import read_checkpoint

    try:
        resume = read_checkpoint(ck_path, fp, plan.rounds)
    except ConfigError:
        log(f"[landmarks] discarding {ck_path}: it belongs to a run with other parameters")
        os.remove(ck_path)
        return None
    if resume is not None:
        log(f"[landmarks] resuming from {ck_path} (round {resume['round']})")
    return resume


def _write_partial(out: str, metrics: dict, partial: dict) -> None:
    """A run that stopped: what it decided (the audit gate's verdict) goes to metrics.json and audit/."""
    from .report import write_audit_files

    if "audit" in partial:
        audit = dict(partial["audit"])
        write_audit_files(out, mia=audit.pop("mia_result"))
        metrics["audit"] = dict(audit, rows_sent=0)
    write_json(os.path.join(out, "metrics.json"), metrics)


def _federated_metrics(metrics, res, plan, sites, X, y, out, embedding_metrics, clustering_metrics, log) -> None:
    from .report import write_audit_files

    emb = res.embedding
    if plan.method == "spectral":
        labels = res.stacked("labels")
        np.save(os.path.join(out, "labels.npy"), labels)
        metrics["federated"] = clustering_metrics(labels, y, random_state=plan.seed) if y is not None else {}
    else:
        E = res.stacked("coordinates")
        np.save(os.path.join(out, "embedding.npy"), E)
        metrics["federated"] = embedding_metrics(X, E, y, random_state=plan.seed)
    metrics["aggregation"] = res.aggregation
    metrics["released"] = res.released
    metrics["inventory"] = res.inventory + [
        {
            "what": "quality metrics of the map (CA-kNN, trustworthiness, NMI) computed against the pooled records",
            "to": "this run folder",
            "covered_by_epsilon": False,
            "note": "exists only in this simulation",
        },
        {
            "what": "the centralized comparison (the method on the pooled records) and its panel in embedding.png",
            "to": "this run folder",
            "covered_by_epsilon": False,
            "note": "exists only in this simulation",
        },
    ]
    metrics["warnings"] = res.warnings
    metrics["reconstruction"] = emb.get("reconstruction")
    metrics["sent_by_each_site"] = emb.get("sent_kind")
    metrics["round_trips"] = res.round_trips
    metrics["round_trips_per_stage"] = res.round_trips_per_stage()
    metrics["timings"]["coordinator"] = res.seconds
    if res.privacy is not None:
        from .accounting import clip_records

        # each site counts its own clipped records; the count never leaves it (the simulation reads them here)
        per_site = [int(clip_records(X_p, plan.clip_norm)[1]) for X_p in sites]
        metrics["privacy"] = dict(
            res.privacy,
            clipped_per_site=per_site,
            clipped_records=int(sum(per_site)),
            clipped_note="counted on each site for its own records; not sent to the coordinator",
        )
    if res.audit is not None:
        write_audit_files(out, mia=res.audit["mia_result"])
        metrics["audit"] = {k: v for k, v in res.audit.items() if k != "mia_result"}
    metrics["reconstruction_audit"] = _reconstruction_audit(plan, res, sites, out, log)


def _reconstruction_audit(plan, res, sites, out, log) -> dict:
    """Play the server on what left the sites in the embedding stage and measure what it gives back."""
    from .audits import (
        reconstruct_from_coordinates,
        reconstruct_from_distance_rows,
        reconstruct_from_kernel_rows,
        reconstruction_record,
    )
    from .report import write_audit_files

    X_true = np.vstack(sites)
    Y = res.landmark_space.to_original(res.landmarks, X_true.shape[1])  # the coordinator's reading of its landmarks
    emb = res.embedding
    perturbed = plan.rows_epsilon is not None
    if emb.get("kept_on_sites"):
        log("[audit] reconstruction: nothing per record left the sites (coordinates kept on the sites)")
        return {"mode": "kept", "attack": "none: no per-record output reached the coordinator"}
    if plan.nystrom == "rows":
        rows = res.stacked("rows")
        if plan.method == "spectral":
            X_hat = reconstruct_from_kernel_rows(rows, Y, emb["kernel_gamma"])
            kind, attack = ("perturbed_rows" if perturbed else "kernel_rows"), "kernel inversion + trilateration"
        else:
            X_hat = reconstruct_from_distance_rows(rows, Y, squared=True)
            kind, attack = ("perturbed_rows" if perturbed else "rows"), "trilateration"
    elif plan.method == "spectral":
        # only labels leave: the server's best estimate of a record is the mean of its cluster's landmarks
        lab_y = emb["landmark_labels"]
        cent = np.vstack(
            [Y[lab_y == c].mean(axis=0) if np.any(lab_y == c) else Y.mean(axis=0) for c in range(plan.n_clusters)]
        )
        X_hat, kind, attack = cent[res.stacked("labels")], "local", "cluster mean of landmarks"
    else:
        coords = [emb["coordinates"][name] for name in res.sites]
        X_hat = np.vstack(reconstruct_from_coordinates(coords, emb["landmark_embedding"], Y))
        kind, attack = "local", "kernel regression from 2-D coordinates through the landmarks"
    # judged against what an attacker knows without the run: the average record (a population statistic)
    rec = reconstruction_record(X_true, X_hat, mode=kind, attack=attack, Y=Y, reference=X_true.mean(axis=0))
    write_audit_files(out, reconstruction=rec)
    log(
        f"[audit] reconstruction from what left the sites ({attack}): median relative error "
        f"{rec['median_relative_error']:.3g} (guessing the average record: {rec['baseline_median_relative_error']:.3g}), "
        f"{100 * rec['fraction_within_5pct']:.1f}% of records within 5% (the guess: "
        f"{100 * rec['baseline_fraction_within_5pct']:.1f}%; beyond it: {100 * rec['fraction_within_5pct_beyond_baseline']:.1f}%)"
    )
    return {
        k: rec[k]
        for k in (
            "mode",
            "attack",
            "median_relative_error",
            "fraction_within_5pct",
            "baseline_median_relative_error",
            "baseline_fraction_within_5pct",
            "fraction_within_5pct_beyond_baseline",
        )
        if k in rec
    }


def _write_table(out, res, method, names, ids, y, sites, ds) -> None:
    """``embedding.csv``: one row per record — site, record id (the id column, or the row in the site's data),
    coordinates or cluster, and the label when known — joinable back to each site's records."""
    from .report.exports import write_embedding_table

    key = "labels" if method == "spectral" else "coordinates"
    parts = (res.embedding or {}).get(key) or res.site_outputs
    if not parts:
        return
    bounds = np.cumsum([0] + [len(s) for s in sites])
    labels = None if y is None else {n: y[a:b] for n, a, b in zip(names, bounds[:-1], bounds[1:])}
    write_embedding_table(
        os.path.join(out, "embedding.csv"),
        {n: parts[n] for n in names if n in parts},
        ids=None if ids is None else {n: ids[n] for n in names if n in parts},
        labels=None if labels is None else {n: labels[n] for n in names if n in parts},
        label_names=ds.target_names,
    )


def _write_site_anndata(out, res, method, names, ids, ds, log) -> None:
    """``.h5ad`` sites: each site's own AnnData with its part of the map written back, as scanpy keeps ``X_umap`` —
    ``obsm["X_fedtsne"]`` / ``obsm["X_fedumap"]`` (``obs["fedspectral"]`` for cluster labels) — into
    ``<out>/sites/<site>.h5ad`` (the site's file itself is never modified)."""
    from .report.exports import obsm_key, write_h5ad_with_embedding

    paths = {n: p for n, p in (getattr(ds, "paths", None) or {}).items() if str(p).lower().endswith(".h5ad")}
    if not paths:
        return
    key = "labels" if method == "spectral" else "coordinates"
    parts = (res.embedding or {}).get(key) or res.site_outputs
    written = []
    for name in names:
        if name in paths and name in (parts or {}):
            written.append(
                write_h5ad_with_embedding(
                    paths[name],
                    os.path.join(out, _SITE_FILES, f"{name}.h5ad"),
                    parts[name],
                    obsm_key(method),
                    ids=None if ids is None else ids[name],
                )
            )
    if written:
        log(
            f"[outputs] each site's AnnData with the map in {'obs' if method == 'spectral' else 'obsm'}"
            f"[{obsm_key(method)!r}]: {os.path.join(out, _SITE_FILES)}/<site>.h5ad"
        )


def _plot_run(out, method, job, federated, X, y, central, sites, metrics, ds, names) -> None:
    from .report.plots import plot_run, standard_panels

    panels = standard_panels(
        method,
        federated,
        y=y,
        site_sizes=[len(s) for s in sites],
        centralized=central,
        X=X if method == "spectral" else None,
        mode=metrics.get("mode"),
        privacy=metrics.get("privacy"),
        fed_metrics=metrics.get("federated"),
        cen_metrics=metrics.get("centralized"),
        partition=None if job.get("site") else job.get("partition"),
    )  # --site: no split was made
    plot_run(os.path.join(out, "embedding.png"), panels, class_names=ds.target_names, site_names=names)


def _run_peer(job, options, sites, X, y, reference, metrics, out, log, t_all, ds, names) -> dict:
    from .metrics import embedding_metrics
    from .peers import PEER_METHODS, WHAT_LEAVES

    method, seed = job["method"], int(options.get("seed", 0))
    log(f"[{method}] fitting on {len(sites)} sites")
    opts = {}
    if reference is not None:
        opts["reference"] = reference
    if method == "gtm":
        # each site summarises its records by at most 60 Gaussian components (Zhang & Cheung), never more than it holds
        opts["n_components_per_site"] = int(min(60, min(len(s) for s in sites)))
    est = PEER_METHODS[method](random_state=seed, **opts)
    t0 = time.perf_counter()
    emb = np.asarray(est.fit_transform(sites))
    metrics["timings"]["federated_total"] = time.perf_counter() - t0
    metrics["mode"] = {"method": method, "aggregation": "plain", "dp": getattr(est, "epsilon_", None) is not None}
    metrics["sent_by_each_site"] = WHAT_LEAVES.get(method)
    eps = getattr(est, "epsilon_", None)
    if eps is not None:
        metrics["privacy"] = {
            "epsilon": eps,
            "delta": getattr(est, "delta_", None),
            "accountant": getattr(est, "accountant_", "rdp"),
        }
    np.save(os.path.join(out, "embedding.npy"), emb)
    write_json(
        os.path.join(out, "config.json"),
        {
            "dataset": {"name": metrics["dataset"], "n_samples": int(len(X)), "n_features": int(X.shape[1])},
            "mode": metrics["mode"],
            "parameters": job,
            "versions": _versions(),
        },
    )
    metrics["federated"] = embedding_metrics(X, emb, y, random_state=seed)
    central = None
    if job["compare_centralized"]:
        t1 = time.perf_counter()
        central = _fit_central(method, None, X, y, seed=seed)
        metrics["timings"]["centralized"] = time.perf_counter() - t1
        metrics["centralized"] = embedding_metrics(X, central, y, random_state=seed)
    _plot_run(out, method, job, emb, X, y, central, sites, metrics, ds, names)
    write_json(os.path.join(out, "history.json"), {"rounds": [], "mmd": [], "epsilon": []})
    metrics["timings"]["total"] = time.perf_counter() - t_all
    write_json(os.path.join(out, "metrics.json"), metrics)
    return clean(metrics)


def _fit_central(method, plan, X, y, seed=None):
    from .estimators import CentralizedSpectralClustering, CentralizedTSNE, CentralizedUMAP

    seed = plan.seed if plan is not None else seed
    if method == "spectral":
        return CentralizedSpectralClustering(int(plan.n_clusters), random_state=seed).fit_predict(X)
    if method == "umap":
        return CentralizedUMAP(random_state=seed).fit_transform(X)
    if method == "gtm":
        from .peers import CentralizedGTM

        return np.asarray(CentralizedGTM(random_state=seed).fit_transform(X))
    n_jobs = plan.n_jobs if plan is not None else 1
    return CentralizedTSNE(random_state=seed, n_jobs=n_jobs).fit_transform(X)
