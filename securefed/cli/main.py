"""The ``securefed`` command: ``run``, ``audit``, ``simulate``, ``budget``, ``flower-app``.

Exit codes (:data:`EXIT_CODES`; the README and ``securefed --help`` list them):

* 0 — the privacy verdict is "pass" (or the command has no verdict and succeeded);
* 1 — the privacy verdict is not "pass": "fail", "fail (overridden)", "not audited", or the run stopped at its
  membership-audit gate (:class:`~securefed.errors.AuditFailedError`);
* 2 — refused: bad input or a deliberate error (:class:`~securefed.errors.SecureFedError`), printed on one line
  naming the option and the fix, no traceback (argparse's own usage errors exit 2 too);
* 3 — internal error: a bug in securefed (one line; ``SECUREFED_DEBUG=1`` shows the traceback);
* 130 — interrupted (Ctrl-C).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys

from ..errors import AuditFailedError, SecureFedError

__all__ = ["main", "build_parser", "EXIT_CODES", "EXIT_PASS", "EXIT_FAIL", "EXIT_REFUSED", "EXIT_INTERNAL"]

EXIT_PASS, EXIT_FAIL, EXIT_REFUSED, EXIT_INTERNAL, EXIT_INTERRUPTED = 0, 1, 2, 3, 130
#: every exit status of ``securefed`` and its meaning
EXIT_CODES = {
    EXIT_PASS: "the privacy verdict is pass (or the command has no verdict and succeeded)",
    EXIT_FAIL: "the privacy verdict is not pass: fail, fail (overridden), not audited, or the run stopped at its "
    "membership-audit gate",
    EXIT_REFUSED: "refused: bad input or a deliberate error, one line naming the option and the fix",
    EXIT_INTERNAL: "internal error: a bug in securefed (SECUREFED_DEBUG=1 shows the traceback; please report it)",
    EXIT_INTERRUPTED: "interrupted",
}


def exit_codes_epilog() -> str:
    return "exit codes:\n" + "\n".join(f"  {code:>3}  {text}" for code, text in EXIT_CODES.items())


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="securefed",
        description="Federated t-SNE, UMAP and spectral clustering with "
        "secure aggregation, differential privacy and privacy audits.",
        epilog=exit_codes_epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
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
        return EXIT_REFUSED
    try:
        return int(args.func(args) or 0)
    except SecureFedError as exc:
        print(f"securefed {args.command}: error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_FAIL if isinstance(exc, AuditFailedError) else EXIT_REFUSED
    except BrokenPipeError:  # output piped into e.g. `head`: not an error of ours
        with contextlib.suppress(OSError):
            sys.stdout = open(os.devnull, "w")
        return EXIT_PASS
    except KeyboardInterrupt:
        print(f"securefed {args.command}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as exc:  # an unexpected error is a bug: one line, the traceback on request
        if os.environ.get("SECUREFED_DEBUG"):
            raise
        print(
            f"securefed {args.command}: internal error: {type(exc).__name__}: {exc} "
            "(set SECUREFED_DEBUG=1 for the traceback and please report it)",
            file=sys.stderr,
        )
        return EXIT_INTERNAL


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
