"""``securefed flower-app DIR``: write the Flower App that ``flwr run`` submits to a SuperLink.

Wired by the lead's ``securefed/cli.py`` through :func:`register`. Does not need ``flwr`` itself (the
operator's machine runs ``flwr run`` afterwards). Prints the run configuration as JSON.
"""

from __future__ import annotations

import json
import os

from ..errors import ConfigError, bad_value
from ..flower.launch import APP_CONFIG_DEFAULTS, cast_config_value, write_app

__all__ = ["register", "handle_flower_app", "parse_settings"]


def parse_settings(items) -> dict:
    """``["rounds=30", "aggregation=secagg"]`` → dict with the defaults' types (ConfigError otherwise)."""
    out = {}
    for item in items or []:
        if "=" not in item:
            raise ConfigError(bad_value("--set", item, "use KEY=VALUE, e.g. --set rounds=30"))
        k, v = item.split("=", 1)
        k = k.strip()
        if k not in APP_CONFIG_DEFAULTS:
            raise ConfigError(bad_value("--set key", k, f"use one of {', '.join(sorted(APP_CONFIG_DEFAULTS))}"))
        typ = type(APP_CONFIG_DEFAULTS[k])
        try:
            out[k] = cast_config_value(v.strip().strip('"'), APP_CONFIG_DEFAULTS[k], k)
        except ValueError:
            raise ConfigError(bad_value(k, v, f"give a {typ.__name__}")) from None
    return out


def register(subparsers) -> None:
    """Add the ``flower-app`` subcommand to an argparse subparsers object."""
    p = subparsers.add_parser(
        "flower-app",
        help="write the Flower App directory for a multi-site deployment",
        description="Write DIR/pyproject.toml naming securefed's ServerApp and ClientApp, "
        "with the run configuration; then run `flwr run DIR <superlink>`.",
    )
    p.add_argument("directory")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help=f"run configuration, keys: {', '.join(APP_CONFIG_DEFAULTS)}",
    )
    p.set_defaults(func=handle_flower_app)


def handle_flower_app(args) -> int:
    """Write the app; print its configuration."""
    cfg = parse_settings(args.set)
    if os.path.exists(args.directory) and not os.path.isdir(args.directory):
        raise ConfigError(bad_value("directory", args.directory, "give a directory path"))
    write_app(args.directory, cfg)
    print(json.dumps({"app": os.path.abspath(args.directory), "run_config": {**APP_CONFIG_DEFAULTS, **cfg}}))
    return 0
