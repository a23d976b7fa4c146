"""securefed on Flower: SuperLink / SuperNode deployment of FedDL (plain / securefed's own SecAgg+ / CKKS),
differential privacy with a ledger on every site, the membership-audit gate and the embedding stage.

Flower (``flwr``, pinned ``FLOWER_REQUIREMENT``) carries securefed's encoded protocol messages as
message payloads; the state machines and byte codec are those of :mod:`securefed.securesum`.

* :mod:`.server_app` — the ``ServerApp`` (``securefed.flower.server_app:app``)
* :mod:`.client_app` — the ``ClientApp`` (``securefed.flower.client_app:app``); the site's
  data path comes from the SuperNode's node config (``data-path``, ``site-name``, ``id-column``, ``label-column``)
* :mod:`.transport` — the payload record and :class:`~.transport.FlowerExchange`, the coordinator's transport
* :mod:`.launch` — write the Flower App directory and run a local (loopback) deployment
* :mod:`.superexec` — securefed's SuperExec for ``--isolation process`` (opt-in: no interpreter start per message)
* :mod:`.trace` — the maintainers' timing trace (``SECUREFED_FLOWER_TRACE``)

The coordinator, the site and DP are not here: Flower drives the same :mod:`securefed.federation` code as the
in-process run.

``flwr`` is optional: importing this package does not import it. Nor does it import the launcher (and with it the
run plan and numpy): a Flower ClientApp process, which imports :mod:`.client_app` for every message, pays only for
flwr and the standard library; the names below are imported on first use (PEP 562).
"""

from __future__ import annotations

import importlib
import importlib.util

__all__ = ["FLOWER_REQUIREMENT", "APP_CONFIG_DEFAULTS", "LocalDeployment", "write_app", "flower_available"]

_LAZY = {
    "FLOWER_REQUIREMENT": ".launch",
    "APP_CONFIG_DEFAULTS": ".launch",
    "LocalDeployment": ".launch",
    "write_app": ".launch",
}


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))


def flower_available() -> bool:
    """True when ``flwr`` can be imported."""
    return importlib.util.find_spec("flwr") is not None
