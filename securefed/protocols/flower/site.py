"""The site side of a Flower deployment, free of Flower types (the ClientApp only moves dicts).

A site answers four operations, each one Flower message in and one out:

``hello``          its public description: site name, record count, feature count and the Ed25519
                   identity public key of this run (the private half stays in the SuperNode's
                   per-run state on the site).
``plain``          compute the requested update (see :func:`compute_update`) and return it in the
                   clear (plain aggregation: the server sees it, as with ``PlainAggregator``).
``secagg-start``   compute the update, build the SecAgg+ client state machine for the announced
                   :class:`~securefed.protocols.secagg.RoundSpec` and return its ``AdvertiseKeys``.
``secagg``         feed the server's securefed messages to the stored state machine, return its replies.
``embed``          no-rows t-SNE stage: place the site's records against the landmark model
                   (:mod:`.embedding`); only the final coordinates are returned.

The updates are the ones :func:`securefed.landmarks.fed_dl` computes in process, with the same
functions: ``client_update`` (model averaging, Eq. 15), ``mmd_grad`` (gradient averaging, Eq. 16),
the γ statistic of ``_federated_gamma`` and the moments of ``_federated_moments``.
"""

from __future__ import annotations

import numpy as np

from ...errors import ConfigError, ProtocolError, SecureFedError, bad_value
from .. import crypto
from ..secagg import SecAggClient
from .transport import array_from_bytes, array_to_bytes, decode_spec, dump_client, load_client

__all__ = ["TASKS", "compute_update", "load_site_data", "SiteState", "handle"]

TASKS = ("model", "gradient", "gamma", "moments")


def load_site_data(node_config: dict) -> np.ndarray:
    """The site's records from ``data-path`` in the node config (CSV / NPY / NPZ as the CLI accepts)."""
    from ...data import load_dataset

    path = node_config.get("data-path")
    if not path:
        raise ConfigError(bad_value("node config data-path", path,
                                    "start the SuperNode with --node-config 'data-path=\"/path/site.csv\" site-name=\"A\"'"))
    label = node_config.get("label-column") or None
    return load_dataset(str(path), label_column=label).X


def compute_update(task: dict, X: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """The upload the server asked for, exactly as :func:`securefed.landmarks.fed_dl` computes it.

    ``task["task"]``: ``"model"`` — ``client_update`` (Q local steps, papers/000 Alg. 1 lines 5–10);
    ``"gradient"`` — ``mmd_grad`` at the broadcast Y (Eq. 13); ``"gamma"`` — ``[median_p / scale]``
    (median heuristic); ``"moments"`` — ``[mean_p(x), mean_p(x²) / scale]``. The last two must stay
    identical to ``landmarks._federated_gamma`` / ``_federated_moments`` (the tests compare the results).
    """
    from ...kernels import local_median_sq_dist
    from ...landmarks import client_update, mmd_grad

    kind = task.get("task")
    if kind == "model" or kind == "gradient":
        Y = array_from_bytes(task["Y"], task["shape"])
        if Y.shape[1] != X.shape[1]:
            raise ConfigError(bad_value("landmarks.shape", Y.shape, f"this site has {X.shape[1]} features"))
        if kind == "model":
            return client_update(X, Y, float(task["gamma"]), float(task["lr"]), int(task["local_steps"]))
        return mmd_grad(X, Y, float(task["gamma"]))
    if kind == "gamma":  # landmarks._federated_gamma: local median squared distance / scale
        return np.array([local_median_sq_dist(X, random_state=rng) / float(task["scale"])], dtype=np.float64)
    if kind == "moments":  # landmarks._federated_moments: [mean_p, mean_p(x²) / scale]
        return np.concatenate([X.mean(axis=0), (X * X).mean(axis=0) / float(task["scale"])])
    raise ProtocolError(f"unknown task {kind!r}; expected one of {TASKS}")


class SiteState:
    """What a site keeps between messages: a dict of bytes/ints (Flower stores it in ``context.state``)."""

    def __init__(self, stored: dict | None = None):
        self.data = dict(stored or {})

    def identity(self):
        """This run's Ed25519 identity key (created on first use from the OS entropy source)."""
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

        raw = self.data.get("identity")
        if raw is None:
            sk, _ = crypto.ed25519_keypair()
            self.data["identity"] = sk.private_bytes_raw()
            return sk
        return Ed25519PrivateKey.from_private_bytes(bytes(raw))

    def rng(self, seed: int, site: int) -> np.random.Generator:
        """The site's statistical Generator (stochastic rounding, subsampling), kept across messages."""
        import json

        g = np.random.default_rng([int(seed), int(site)])
        if "rng" in self.data:
            g.bit_generator.state = json.loads(bytes(self.data["rng"]).decode())
        return g

    def save_rng(self, g: np.random.Generator) -> None:
        import json

        self.data["rng"] = json.dumps(g.bit_generator.state).encode()


def handle(fields: dict, node_config: dict, state: SiteState) -> dict:
    """Answer one server request (``fields`` of the ``securefed`` record); returns the reply fields.

    A securefed error (bad message, failed signature, aborted protocol) is returned as
    ``{"error": "<Type>: <message>"}`` after the state machine has aborted; it never crashes the site.
    """
    op = fields.get("op")
    try:
        if op == "hello":
            X = load_site_data(node_config)
            sk = state.identity()
            return {"site_name": str(node_config.get("site-name") or node_config.get("data-path")),
                    "n_records": int(X.shape[0]), "n_features": int(X.shape[1]),
                    "identity": crypto.ed25519_public_bytes(sk)}
        if op == "plain":
            X = load_site_data(node_config)
            g = state.rng(int(fields.get("seed", 0)), int(fields["site"]))
            u = compute_update(fields, X, g)
            state.save_rng(g)
            return {"update": array_to_bytes(u), "shape": list(np.shape(u))}
        if op == "secagg-start":
            X = load_site_data(node_config)
            spec = decode_spec(fields["spec"])
            site = int(fields["site"])
            g = state.rng(int(fields.get("seed", 0)), site)
            u = compute_update(fields, X, g)
            client = SecAggClient(spec, site, state.identity(), np.ravel(u), float(fields["weight"]), g)
            msgs = client.start()
            state.data.update(spec=bytes(fields["spec"]), client=dump_client(client))
            state.save_rng(client._rng)
            return {"msgs": msgs}
        if op == "embed":
            from .embedding import place_records

            X = load_site_data(node_config)
            Y = array_from_bytes(fields["Y"], fields["shape"])
            E = array_from_bytes(fields["landmark_embedding"], fields["embedding_shape"])
            Z = place_records(Y, X, float(fields["perplexity"]), int(fields["tsne_seed"]), E, E.shape[1])
            return {"embedding": array_to_bytes(Z), "embedding_shape": list(Z.shape)}
        if op == "secagg":
            if "client" not in state.data:
                raise ProtocolError("no SecAgg+ round in progress on this site (restarted SuperNode?)")
            spec = decode_spec(state.data["spec"])
            client = load_client(state.data["client"], spec, state.identity())
            out: list = []
            try:
                for data in fields.get("msgs", []):
                    out += client.receive(bytes(data))
            finally:
                state.data["client"] = dump_client(client)
                state.save_rng(client._rng)
            if client.state in ("done", "aborted"):
                state.data.pop("client", None)
                state.data.pop("spec", None)
            return {"msgs": out}
        raise ProtocolError(f"unknown operation {op!r}")
    except SecureFedError as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
