"""securefed on Flower: SuperLink / SuperNode deployment of FedDL (plain / securefed's own SecAgg+ / CKKS),
differential privacy with a ledger on every site, the membership-audit gate and the embedding stage.

Flower (``flwr``, pinned ``FLOWER_REQUIREMENT``) carries securefed's encoded protocol messages as
message payloads; the state machines and byte codec are those of :mod:`securefed.securesum`.

* :mod:`.server_app` — the ``ServerApp`` (``securefed.flower.server_app:app``)
* :mod:`.client_app` — the ``ClientApp`` (``securefed.flower.client_app:app``); the site's
  data path comes from the SuperNode's node config (``data-path``, ``site-name``, ``label-column``)
* :mod:`.transport` — the payload record and :class:`~.transport.FlowerExchange`, the coordinator's transport
* :mod:`.launch` — write the Flower App directory and run a local (loopback) deployment

The coordinator, the site and DP are not here: Flower drives the same :mod:`securefed.federation` code as the
in-process run.

``flwr`` is optional: importing this package does not import it.
"""

from __future__ import annotations

import importlib.util

from .launch import APP_CONFIG_DEFAULTS, FLOWER_REQUIREMENT, LocalDeployment, write_app

__all__ = ["FLOWER_REQUIREMENT", "APP_CONFIG_DEFAULTS", "LocalDeployment", "write_app", "flower_available"]


def flower_available() -> bool:
    """True when ``flwr`` can be imported."""
    return importlib.util.find_spec("flwr") is not None
