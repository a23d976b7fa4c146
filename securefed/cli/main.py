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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="securefed", description="Federated t-SNE, UMAP and spectral clustering with secure aggregation, differential privacy and privacy audits.")
    parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    from .run import register as register_run

    register_run(sub)
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
    args_in = sys.argv[1:] if argv is None else list(argv)
    if args_in in (["--version"], ["-V"]):  # answered before any subcommand (and its imports) is loaded
        print(_version())
        return 0
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
