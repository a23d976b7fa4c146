"""The ``securefed`` command: ``run``, ``audit``, ``simulate``, ``budget``, ``flower-app``.

Every deliberate error (:class:`~securefed.errors.SecureFedError`) is printed on one line and the
command exits with status 2; no traceback. ``SECUREFED_DEBUG=1`` shows tracebacks of unexpected errors.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys

from ..errors import SecureFedError

__all__ = ["main", "build_parser"]


def _lr(value: str):
    return value if value == "auto" else float(value)


def _add_run(subparsers) -> None:
    from ..pipeline import FED_METHODS, PEER_METHOD_NAMES

    p = subparsers.add_parser(
        "run",
        help="run one federated job (landmarks → audit gate → embedding) on built-in data or a file",
        description="Run a federated t-SNE / UMAP / spectral clustering job. With no flags: digits, 10 sites, one class "
                    "per site, Fed-tSNE compared with centralized t-SNE, outputs in ./securefed-run.",
    )
    p.add_argument("--dataset", default="digits", help="digits | breast_cancer | wine | iris | mnist5k, or a .csv/.npy/.npz path")
    p.add_argument("--label-column", default=None, help="label column of a CSV file")
    p.add_argument("--clients", type=int, default=10, help="number of sites P (default 10)")
    p.add_argument("--partition", default="label", help="iid | label (one class per site) | dirichlet:ALPHA")
    p.add_argument("--method", default="tsne", choices=FED_METHODS + PEER_METHOD_NAMES)
    p.add_argument("--landmarks", type=int, default=300, help="n_y, landmarks learned by FedDL (default 300)")
    p.add_argument("--rounds", type=int, default=60, help="S, FedDL rounds (default 60)")
    p.add_argument("--local-steps", type=int, default=5, help="Q, local steps per round (default 5)")
    p.add_argument("--rule", choices=("model", "gradient"), default="model", help="model (Eq. 15) or gradient (Eq. 16) averaging")
    p.add_argument("--lr", type=_lr, default="auto", help="FedDL step size, or 'auto' (n_y / (8γ))")
    p.add_argument("--gamma", type=float, default=None, help="kernel bandwidth γ (default: federated median heuristic)")
    p.add_argument("--seed", type=int, default=0)
    cmp = p.add_mutually_exclusive_group()
    cmp.add_argument("--compare-centralized", dest="compare_centralized", action="store_true", default=True,
                     help="also fit the centralized method on pooled data (default)")
    cmp.add_argument("--no-compare-centralized", dest="compare_centralized", action="store_false")
    p.add_argument("--out", default="securefed-run", help="output folder (default ./securefed-run)")
    p.add_argument("--aggregation", choices=("plain", "secagg", "ckks"), default="plain",
                   help="how the server sums the sites' updates: in the clear, SecAgg+ masking, or CKKS encryption")
    p.add_argument("--nystrom", choices=("rows", "local"), default=None,
                   help="rows: the paper, one row per record leaves each site (it reveals the records); local: only final "
                        "coordinates leave (default: rows without DP, local with DP)")
    p.add_argument("--reconstruction", choices=("auto", "paper", "features"), default="auto",
                   help="server path for --nystrom rows: dense Eq. 21 (paper) or feature map + kNN (no n×n)")
    aud = p.add_mutually_exclusive_group()
    aud.add_argument("--audit", dest="audit", action="store_true", default=True, help="run the membership-inference gate (default)")
    aud.add_argument("--no-audit", dest="audit", action="store_false")
    p.add_argument("--audit-holdout", type=float, default=0.2, help="share of each site's records kept out of FedDL as audit non-members")
    p.add_argument("--allow-audit-failure", action="store_true", help="continue past a failed audit (recorded in ledger and report)")
    p.add_argument("--max-auc", type=float, default=0.6, help="audit policy: largest acceptable attack AUC")
    p.add_argument("--max-empirical-epsilon", type=float, default=1.0, help="audit policy: largest acceptable empirical ε")
    p.add_argument("--rows-epsilon", type=float, default=None, help="ε of the perturbed rows (DP with --nystrom rows)")
    p.add_argument("--n-clusters", type=int, default=None, help="spectral: clusters (default: number of labels)")
    p.add_argument("--reference-size", type=int, default=300, help="dSNE: size of the public reference split")
    p.add_argument("--value-bound", type=float, default=None,
                   help="public bound on |feature values| (secagg/ckks quantise into it; default for built-in data: their public range)")
    p.add_argument("--refine-rounds", type=lambda v: v if v == "auto" else int(v), default="auto",
                   help="federated Lloyd rounds after FedDL (default auto: 10 with --nystrom local and no DP, else 0)")
    p.add_argument("--refine-min-cluster", type=int, default=10,
                   help="a landmark moves only to the mean of at least this many records (default 10)")
    p.add_argument("--n-jobs", type=int, default=1)
    p.add_argument("--quiet", action="store_true", help="no progress output")
    try:
        from .budget import add_privacy_arguments
    except ImportError:  # pragma: no cover - the accounting package ships with securefed
        add_privacy_arguments = None
    if add_privacy_arguments is not None:
        add_privacy_arguments(p)
    p.set_defaults(func=_run_command)


def _run_command(args) -> int:
    from ..pipeline import RunConfig, run

    cfg = RunConfig(
        dataset=args.dataset, label_column=args.label_column, clients=args.clients, partition=args.partition,
        method=args.method, landmarks=args.landmarks, rounds=args.rounds, local_steps=args.local_steps, rule=args.rule,
        lr=args.lr, gamma=args.gamma, seed=args.seed, compare_centralized=args.compare_centralized, out=args.out,
        aggregation=args.aggregation, nystrom=args.nystrom, reconstruction=args.reconstruction, audit=args.audit,
        audit_holdout=args.audit_holdout, allow_audit_failure=args.allow_audit_failure, max_auc=args.max_auc,
        max_empirical_epsilon=args.max_empirical_epsilon, rows_epsilon=args.rows_epsilon, n_clusters=args.n_clusters,
        reference_size=args.reference_size, value_bound=args.value_bound,
        refine_rounds=args.refine_rounds, refine_min_cluster=args.refine_min_cluster, n_jobs=args.n_jobs, quiet=args.quiet, privacy_args=args,
    )
    metrics = run(cfg)
    out = os.path.abspath(args.out)
    fed = metrics.get("federated", {})
    cen = metrics.get("centralized")
    key = "nmi" if args.method == "spectral" else "ca_10nn"
    line = f"federated {key}={fed.get(key)}"
    if cen:
        line += f"  centralized {key}={cen.get(key)}"
    if metrics.get("privacy"):
        line += f"  ε={metrics['privacy'].get('epsilon')} (δ={metrics['privacy'].get('delta')})"
    print(line)
    print(f"outputs in {out}: metrics.json, embedding.png, {'labels.npy' if args.method == 'spectral' else 'embedding.npy'}, "
          f"config.json, history.json; write the privacy report with: securefed audit {out}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="securefed", description="Federated t-SNE, UMAP and spectral clustering with secure aggregation, differential privacy and privacy audits.")
    parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    _add_run(sub)
    from .budget import register as register_budget
    from .audit import register as register_audit
    from .simulate import register as register_simulate

    register_audit(sub)
    register_simulate(sub)
    register_budget(sub)
    from .flower_app import register as register_flower

    register_flower(sub)
    return parser


def _version() -> str:
    from .. import __version__

    return f"securefed {__version__}"


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except SecureFedError as exc:
        print(f"securefed {args.command}: error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # output piped into e.g. `head`: not an error of ours
        with contextlib.suppress(OSError):
            sys.stdout = open(os.devnull, "w")
        return 0
    except KeyboardInterrupt:
        print(f"securefed {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # an unexpected error is a bug: one line, the traceback on request
        if os.environ.get("SECUREFED_DEBUG"):
            raise
        print(f"securefed {args.command}: internal error: {type(exc).__name__}: {exc} "
              "(set SECUREFED_DEBUG=1 for the traceback and please report it)", file=sys.stderr)
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
