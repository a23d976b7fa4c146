"""``securefed simulate``: run one secure-aggregation round in-process and print the outcome.

Wired by the lead's ``securefed/cli.py`` through :func:`register`. Exit code 0 when the simulation ran
(an aborted round is a reported outcome, ``"aborted": true``); bad flags raise ConfigError (exit 2).
"""

from __future__ import annotations

import json

from ..securesum.runner import TAMPER_KINDS

__all__ = ["register", "handle_simulate"]


def register(subparsers) -> None:
    """Add the ``simulate`` subcommand to an argparse subparsers object."""
    p = subparsers.add_parser(
        "simulate",
        help="simulate one SecAgg+ or CKKS round with dropouts and faults",
        description="Run the real secure-aggregation state machines in one process.",
    )
    p.add_argument("--protocol", choices=("secagg", "ckks"), default="secagg")
    p.add_argument("--clients", type=int, default=10)
    p.add_argument("--length", type=int, default=1000)
    p.add_argument("--dropout", type=float, default=0.0, help="probability that each client drops")
    p.add_argument(
        "--drop-stage",
        default=None,
        help="secagg: advertise|share|masked|consistency|unmask; ckks: advertise|handoff|input|decrypt",
    )
    p.add_argument("--tamper", choices=TAMPER_KINDS, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--degree", type=int, default=None)
    p.add_argument("--threshold", type=int, default=None)
    p.add_argument("--clip-range", type=float, default=1.0)
    p.add_argument("--modulus-bits", type=int, default=32)
    p.add_argument("--precision", type=float, default=1e-6, help="ckks: stated absolute precision")
    p.add_argument("--json", action="store_true", help="print the full result as JSON")
    p.set_defaults(func=handle_simulate)


def handle_simulate(args) -> int:
    """Run :func:`securefed.securesum.simulate` from parsed arguments; print JSON or a summary."""
    from ..securesum.simulator import simulate

    res = simulate(
        protocol=args.protocol,
        clients=args.clients,
        length=args.length,
        dropout=args.dropout,
        drop_stage=args.drop_stage,
        tamper=args.tamper,
        seed=args.seed,
        degree=args.degree,
        threshold=args.threshold,
        clip_range=args.clip_range,
        modulus_bits=args.modulus_bits,
        precision=args.precision,
    )
    if args.json:
        print(json.dumps(res, default=str))
    else:
        status = f"ABORTED ({res['abort_reason']})" if res["aborted"] else "completed"
        print(
            f"{res['protocol']}: {res['clients']} clients, {len(res['survivors'])} survivors, d={res['length']}: {status}; "
            f"max |error| {res['max_abs_error']}, {res['timings']['total']:.3f} s, "
            f"{res['bytes']['client_upload']} B uploaded per client"
        )
    return 0
