"""The ``securefed`` command (``securefed.cli.main:main``); one module per subcommand."""

from .main import build_parser, main

__all__ = ["main", "build_parser"]
