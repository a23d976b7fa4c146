"""``securefed run``: the flags are the run plan's options (:mod:`securefed.plan`), one flag per option, plus
the job's own (data set, partition, output folder, comparison, printing).

Every plan option appears as ``--option-name`` with its help text (:data:`securefed.plan.HELP`) and its
default; the Flower run configuration takes the same options under the same names.
"""

from __future__ import annotations

import argparse
import dataclasses
import json

from ..pipeline import JOB_DEFAULTS, PEER_METHOD_NAMES
from ..plan import CHOICES, HELP, METHODS, NOT_CLI_FLAGS, RunPlan, options_from_args

__all__ = ["register", "run_command", "options_table"]

#: the plan options whose ``securefed run`` default differs from the API default, and why
CLI_DEFAULTS = {"n_clusters": None}  # spectral: the number of labels when the data have them, else 8


def _type_of(default, name: str):
    if name in (
        "lr",
        "gamma",
        "value_bound",
        "stage_timeout",
        "epsilon",
        "noise_multiplier",
        "clip_norm",
        "rows_epsilon",
        "kernel_gamma",
        "placement_perplexity",
    ):
        return float
    if name in (
        "landmarks",
        "fractional_bits",
        "degree",
        "threshold",
        "ckks_min_survivors",
        "ckks_quorum",
        "min_survivors",
        "noise_seed_for_testing",
    ):
        return int
    if name == "run_id":
        return str
    return type(default)


_GROUPS = (
    (
        "landmarks",
        (
            "landmarks",
            "landmark_method",
            "cell_floor",
            "cell_rounds",
            "cell_axes",
            "basis_dim",
            "standardize",
            "public_basis_dim",
            "rounds",
            "local_steps",
            "rule",
            "lr",
            "gamma",
            "weights",
        ),
    ),
    (
        "secure sum",
        (
            "aggregation",
            "value_bound",
            "modulus_bits",
            "fractional_bits",
            "degree",
            "threshold",
            "stage_timeout",
            "ckks_precision",
            "key_holder",
            "ckks_min_survivors",
            "ckks_quorum",
            "ckks_verify",
        ),
    ),
    (
        "differential privacy (off unless --epsilon or --noise-multiplier)",
        (
            "epsilon",
            "noise_multiplier",
            "delta",
            "accountant",
            "noise",
            "distributed_mechanism",
            "clip_norm",
            "sample_rate",
            "min_survivors",
            "sensitivity_rule",
            "count_share",
            "density_share",
            "density_grid",
            "rows_epsilon",
            "run_id",
            "noise_seed_for_testing",
        ),
    ),
    (
        "audit gate (before anything per record leaves a site)",
        ("audit_holdout", "max_auc", "max_empirical_epsilon", "allow_audit_failure"),
    ),
    (
        "embedding",
        (
            "nystrom",
            "coordinates",
            "n_components",
            "perplexity",
            "placement_perplexity",
            "n_iter",
            "n_neighbors",
            "min_dist",
            "n_clusters",
            "kernel_gamma",
            "reconstruction",
        ),
    ),
    ("run", ("seed", "n_jobs")),
)


class _HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """Defaults shown for every option with a value; a switch (``--audit`` / ``--no-audit``, ``--standardize``) says
    in its own help whether it is the default, instead of one "(default: True)" under both halves of a pair."""

    def _get_help_string(self, action):
        if action.nargs == 0 and isinstance(action.const, bool):
            return action.help
        return super()._get_help_string(action)


def register(subparsers) -> argparse.ArgumentParser:
    from .main import exit_codes_epilog

    p = subparsers.add_parser(
        "run",
        help="run one federated job (landmarks → audit gate → embedding) on built-in data or a file",
        description="Run a federated t-SNE / UMAP / spectral clustering job. With no flags: digits, 10 sites, one "
        "class per site, Fed-tSNE compared with centralized t-SNE, outputs in ./securefed-run.",
        epilog=exit_codes_epilog(),
        formatter_class=_HelpFormatter,
    )
    _add_job_arguments(p)
    _add_plan_arguments(p)
    p.set_defaults(func=run_command)
    return p


def _add_job_arguments(p: argparse.ArgumentParser) -> None:
    """The "the job" group of ``securefed run``: the data, the sites, the method, the output and the run's switches."""
    job = p.add_argument_group("the job")
    job.add_argument(
        "--dataset",
        default=JOB_DEFAULTS["dataset"],
        help="digits | breast_cancer | wine | iris | mnist5k | fashion-mnist[-5k|-20k] (apt-get install "
        "dataset-fashion-mnist), or a .csv/.npy/.npz path",
    )
    job.add_argument(
        "--site",
        action="append",
        default=None,
        metavar="PATH",
        help="one site's records (CSV/NPY/NPZ/.h5ad); repeat per site, or give a glob or a directory of "
        "per-site files (site names: the file stems); replaces --dataset, --clients and --partition",
    )
    job.add_argument(
        "--label-column",
        default=None,
        help="label column of a CSV file, or the obs column of an .h5ad file (kept out of the features)",
    )
    job.add_argument(
        "--id-column",
        default=None,
        help="record-id column (kept out of the features, written back in embedding.csv); .h5ad: obs_names by default",
    )
    job.add_argument(
        "--keep-column",
        action="append",
        default=None,
        metavar="NAME",
        help="keep a column that looks like a record id as a feature (repeatable)",
    )
    job.add_argument("--layer", default=None, help=".h5ad: use this obsm entry (e.g. X_pca) or layer instead of X")
    job.add_argument("--clients", type=int, default=JOB_DEFAULTS["clients"], help="number of sites P")
    job.add_argument(
        "--partition", default=JOB_DEFAULTS["partition"], help="iid | label (one class per site) | dirichlet:ALPHA"
    )
    job.add_argument(
        "--method",
        default=JOB_DEFAULTS["method"],
        choices=tuple(m for m in METHODS if m != "none") + PEER_METHOD_NAMES,
        help="the map: tsne, umap, spectral; or a related system: dsne, fdsne, dp-dsne, gtm",
    )
    job.add_argument("--out", default=JOB_DEFAULTS["out"], help="output folder")
    cmp = job.add_mutually_exclusive_group()
    cmp.add_argument(
        "--compare-centralized",
        dest="compare_centralized",
        action="store_true",
        default=True,
        help="also fit the centralized method on pooled data (the default)",
    )
    cmp.add_argument(
        "--no-compare-centralized",
        dest="compare_centralized",
        action="store_false",
        help="skip the centralized baseline",
    )
    aud = job.add_mutually_exclusive_group()
    aud.add_argument(
        "--audit", dest="audit", action="store_true", default=True, help="run the membership-audit gate (the default)"
    )
    aud.add_argument("--no-audit", dest="audit", action="store_false", help="no audit gate (--audit-holdout 0)")
    job.add_argument(
        "--reference-size",
        type=int,
        default=JOB_DEFAULTS["reference_size"],
        help="dSNE: size of the public reference split",
    )
    job.add_argument("--quiet", action="store_true", help="no progress output")
    job.add_argument(
        "--force",
        action="store_true",
        help="overwrite the outputs of another run in --out (never another run's privacy ledgers)",
    )


def _add_plan_arguments(p: argparse.ArgumentParser) -> None:
    """One flag per :class:`RunPlan` field (defaults from the plan and ``CLI_DEFAULTS``), in the ``_GROUPS``."""
    defaults = {f.name: f.default for f in dataclasses.fields(RunPlan)}
    defaults.update(CLI_DEFAULTS)
    for title, names in _GROUPS:
        g = p.add_argument_group(title)
        for name in names:
            flag = "--" + name.replace("_", "-")
            d = defaults[name]
            if isinstance(d, bool):
                g.add_argument(flag, action="store_true", default=d, help=HELP[name])
            elif name in ("lr", "landmarks"):
                g.add_argument(flag, default="auto", type=_auto(_type_of(d, name)), help=HELP[name])
            else:
                typ = int if name == "n_clusters" else _type_of(d, name)
                g.add_argument(flag, default=d, type=typ, choices=CHOICES.get(name), help=HELP[name])


def _auto(cast):
    def conv(v: str):
        return v if v == "auto" else cast(v)

    conv.__name__ = cast.__name__
    return conv


def job_from_args(args) -> dict:
    """The job's own settings (data set, sites, output folder …) of parsed ``securefed run`` arguments."""
    return dict({k: getattr(args, k) for k in JOB_DEFAULTS}, audit=args.audit)


def run_command(args) -> int:
    """Run, then give the verdict ``securefed audit`` gives for the same folder (report written) and exit with it."""
    import os

    from ..pipeline import run_job
    from ..report.build import write_report

    metrics = run_job(job_from_args(args), options_from_args(args))
    out = os.path.abspath(args.out)
    fed = metrics.get("federated", {})
    cen = metrics.get("centralized")
    key = "nmi" if args.method == "spectral" else "ca_10nn"
    line = f"federated {key}={_fmt(fed.get(key))}"
    if cen:
        line += f"  centralized {key}={_fmt(cen.get(key))}"
    if metrics.get("privacy"):
        line += f"  ε={_fmt(metrics['privacy'].get('epsilon'))} (δ={metrics['privacy'].get('delta'):g})"
    print(line)
    html, _ = write_report(out)
    with open(os.path.join(out, "report.json"), encoding="utf-8") as fh:
        verdict = json.load(fh)["verdict"]
    print(
        f"verdict: {verdict['status']}"
        + ("" if verdict["status"] == "pass" else " — " + "; ".join(verdict.get("reasons", [])[:3]))
    )
    for remedy in verdict.get("remedies", [])[:3]:
        print(f"  remedy: {remedy}")
    print(
        f"outputs in {out}: report.html (the privacy report), embedding.png, embedding.csv, metrics.json, result.json"
    )
    from .main import EXIT_FAIL, EXIT_PASS

    return EXIT_PASS if verdict["status"] == "pass" else EXIT_FAIL


def _fmt(v) -> str:
    return "n/a" if v is None else f"{v:.4g}" if isinstance(v, float) else str(v)


def options_table() -> str:
    """The Markdown table of every run-plan option — estimator parameter, ``securefed run`` flag, Flower run-config
    key, default and meaning — that ``docs/options.md`` holds (a test keeps the two equal)."""
    from ..plan import _NOT_IN_RUN_CONFIG, option_name, plan_defaults

    defaults = plan_defaults()
    rows = [
        "| parameter (Python) | `securefed run` flag | Flower run-config key | default | meaning |",
        "|---|---|---|---|---|",
    ]
    for name, text in HELP.items():
        d = defaults[name]
        shown = (
            ("auto" if name in ("lr", "landmarks") else "unset")
            if d is None
            else (str(d).lower() if isinstance(d, bool) else str(d))
        )
        if name in CLI_DEFAULTS and CLI_DEFAULTS[name] != defaults[name]:
            shown = f"{defaults[name]} (CLI: {'from the labels' if CLI_DEFAULTS[name] is None else CLI_DEFAULTS[name]})"
        flag = "—" if name in NOT_CLI_FLAGS else f"`{option_name(name, 'cli')}`"
        key = "—" if name in _NOT_IN_RUN_CONFIG else f"`{option_name(name, 'flower')}`"
        rows.append(f"| {_python_route(name)} | {flag} | {key} | {shown} | {text.replace('|', chr(92) + '|')} |")
    return "\n".join(rows) + "\n"


#: plan options set through the estimators' ``privacy`` / ``rows_privacy`` objects: plan name → constructor argument
_PRIVACY_ROUTE = {
    "epsilon": "epsilon",
    "noise_multiplier": "noise_multiplier",
    "delta": "delta",
    "accountant": "accountant",
    "noise": "noise",
    "clip_norm": "tau_x",
    "sample_rate": "sample_rate",
    "sensitivity_rule": "sensitivity_rule",
    "min_survivors": "min_survivors",
    "noise_seed_for_testing": "insecure_noise_seed_for_testing",
    "run_id": "ledger",
}


def _python_route(name: str) -> str:
    """How an estimator user sets plan option ``name``: a parameter of the estimator, a key of its
    ``aggregation_options``, an argument of its ``privacy`` object — or not at all (RunPlan.build only)."""
    import inspect

    from ..estimators import _SUM_OPTIONS, FedSpectralClustering, FedTSNE, FedUMAP
    from ..plan import option_name

    params = set().union(*(inspect.signature(c.__init__).parameters for c in (FedTSNE, FedUMAP, FedSpectralClustering)))
    api = option_name(name, "api")
    if api in params:
        return f"`{api}`"
    if name in _SUM_OPTIONS:
        return f'`aggregation_options["{name}"]`'
    if name in _PRIVACY_ROUTE:
        return f"`privacy=GradientPerturbation({_PRIVACY_ROUTE[name]}=…)`"
    if name == "rows_epsilon":
        return "`rows_privacy=DataPerturbation(epsilon=…)`"
    special = {
        "seed": "`random_state`",
        "keep_rows": "`keep_sent`",
        "method": "the class: `FedTSNE`, `FedUMAP`, `FedSpectralClustering`",
    }
    return special.get(name, "—")
