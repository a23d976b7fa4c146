"""The site side of a Flower deployment, free of Flower types (the ClientApp only moves dicts).

A site answers four operations, each one Flower message in and one out:

``hello``          its public description: site name, record count, feature count and the Ed25519
                   identity public key of this run (the private half stays in the SuperNode's
                   per-run state on the site).
``plain``          compute the requested update (see :func:`compute_update`) and return it in the
                   clear (plain aggregation: the server sees it, as with ``PlainAggregator``).
``secagg-start``   compute the update, build the SecAgg+ client state machine for the announced
                   :class:`~securefed.securesum.secagg.RoundSpec` and return its ``AdvertiseKeys``.
``secagg``         feed the server's securefed messages to the stored state machine, return its replies.
``embed``          no-rows t-SNE stage: place the site's records against the landmark model
                   (:mod:`.embedding`); only the final coordinates are returned.
``embed-umap``     ``umap-local``: the same with the landmark UMAP model.
``embed-spectral`` ``spectral-local``: one cluster label per record from the landmarks' labels.
``rows``           Nyström "rows" stage (the paper): one row per record, ``D²(X, Y)`` or ``K(X, Y)``,
                   optionally from data-perturbed records (these rows give the records back).
``ckks``, ``ckks-*`` CKKS aggregation messages (:mod:`.ckks_flow`).

Uploads (``plain`` / ``secagg-start`` / ``ckks-*``) carry a ``task``: the FedDL updates below, or
``audit`` (the membership-audit ROC counts of :func:`securefed.audits.mia.site_roc_counts`). With a DP
plan (``dp``) the update is clipped, noised and written to the site's own ledger before the reply
(:mod:`.privacy`); a refusal (over budget, seeded noise not allowed, σ below the site's own
calibration) comes back as a typed error.

The updates are the ones :func:`securefed.landmarks.feddl.fed_dl` computes in process, with the same
functions: ``client_update`` (model averaging, Eq. 15), ``mmd_grad`` (gradient averaging, Eq. 16),
the γ statistic of ``_federated_gamma`` and the moments of ``_federated_moments``.
"""

from __future__ import annotations

import numpy as np

from ..errors import ConfigError, ProtocolError, SecureFedError, bad_value
from ..securesum import crypto
from ..securesum.secagg import SecAggClient
from .transport import array_from_bytes, array_to_bytes, decode_spec, dump_client, load_client

__all__ = ["TASKS", "compute_update", "load_site_data", "site_records", "SiteState", "handle"]

TASKS = ("model", "gradient", "gamma", "moments")


def load_site_data(node_config: dict) -> np.ndarray:
    """The site's records from ``data-path`` in the node config (CSV / NPY / NPZ as the CLI accepts)."""
    from ..data import load_dataset

    path = node_config.get("data-path")
    if not path:
        raise ConfigError(bad_value("node config data-path", path,
                                    "start the SuperNode with --node-config 'data-path=\"/path/site.csv\" site-name=\"A\"'"))
    label = node_config.get("label-column") or None
    return load_dataset(str(path), label_column=label).X


def compute_update(task: dict, X: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """The upload the server asked for, exactly as :func:`securefed.landmarks.feddl.fed_dl` computes it.

    ``task["task"]``: ``"model"`` — ``client_update`` (Q local steps, papers/000 Alg. 1 lines 5–10);
    ``"gradient"`` — ``mmd_grad`` at the broadcast Y (Eq. 13); ``"gamma"`` — ``[median_p / scale]``
    (median heuristic); ``"moments"`` — ``[mean_p(x), mean_p(x²) / scale]``. The last two must stay
    identical to ``landmarks._federated_gamma`` / ``_federated_moments`` (the tests compare the results).
    """
    from ..kernels import local_median_sq_dist
    from ..landmarks import client_update, mmd_grad

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


def site_records(fields: dict, node_config: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """``(all records, FedDL members, audit hold-out or None)`` of this site.

    With ``audit_holdout = f > 0`` in the request, the site keeps ``round(f·n)`` records (at least 1, at
    most ``n − 2``) out of every FedDL computation, chosen with its own Generator seeded by the run seed
    and its site name (the same split for every message of the run, also after a restart) — the split
    of ``FedTSNE(audit_holdout=f)``. They are scored as non-members by the audit and embedded afterwards.
    """
    import zlib

    X = load_site_data(node_config)
    f = float(fields.get("audit_holdout", 0.0) or 0.0)
    if not f:
        return X, X, None
    if not 0.0 < f < 0.9:
        raise ConfigError(bad_value("audit-holdout", f, "use a fraction in [0, 0.9), e.g. 0.2"))
    name = str(node_config.get("site-name") or node_config.get("data-path"))
    g = np.random.default_rng([int(fields.get("seed", 0)), zlib.crc32(name.encode()), 0xA0D17])
    n_out = min(max(int(round(f * len(X))), 1), len(X) - 2)
    perm = g.permutation(len(X))
    return X, X[np.sort(perm[n_out:])], X[np.sort(perm[:n_out])]


def _dp_update(fields: dict, X: np.ndarray, g: np.random.Generator, node_config: dict, op: str,
               state: SiteState) -> tuple[np.ndarray, dict]:
    """A differentially private upload: the site's own mechanism, clipped records, noise, ledger first."""
    import json

    from ..accounting import clip_records
    from ..landmarks import client_update, mmd_grad
    from .privacy import release_events, site_mechanism, site_settle

    plan = json.loads(fields["dp"])
    site = int(fields["site"])
    if plan["noise"] == "distributed" and op == "plain":
        raise ConfigError(bad_value("aggregation", "plain", "this site adds only a share of the noise (distributed): it "
                                    "sends that upload only into a secure sum (secagg / ckks)"))
    kind = fields.get("task")
    if kind not in ("model", "gradient"):
        raise ProtocolError(f"under differential privacy this site releases only noisy landmark updates, not {kind!r}")
    cache = json.loads(bytes(state.data["dp_cache"]).decode()) if "dp_cache" in state.data else {}
    gp = site_mechanism(plan, node_config, site, cache)
    state.data["dp_cache"] = json.dumps(cache).encode()  # this site's own calibration, reused by later messages
    site_settle(gp, site, json.loads(fields.get("dp_settle") or "[]"))
    Xc, n_clipped = clip_records(X, gp.tau_x)
    Y = array_from_bytes(fields["Y"], fields["shape"])
    if Y.shape[1] != X.shape[1]:
        raise ConfigError(bad_value("landmarks.shape", Y.shape, f"this site has {X.shape[1]} features"))
    _check_request_against_plan(fields, plan, gp, site, len(X), Y, kind)
    rnd = int(fields["round"])
    if kind == "model":
        u = client_update(Xc, Y, gp.gamma, float(fields["lr"]), gp.local_steps, privacy=gp, site=site, round=rnd, rng=g)
        steps = range(gp.local_steps)
    else:
        t = int(fields["step"])
        Xb, n_norm = gp.batch(site, rnd, t, Xc, g)
        u = gp.perturb(mmd_grad(Xb, Y, gp.gamma, n_norm=n_norm), site=site, round=rnd, step=t)
        steps = [t]
    # the ledger events are on disk (fsync'd) before this function returns, i.e. before the reply leaves
    return u, {"dp_events": release_events(gp, site, rnd, steps), "clipped": int(n_clipped)}


def _dp_min_survivors(fields: dict, n_clients: int) -> int:
    """Under distributed noise a site helps unmask only sums over at least the plan's t sites (else 1)."""
    import json

    if "dp" not in fields:
        return 1
    plan = json.loads(fields["dp"])
    if plan.get("noise") != "distributed":
        return 1
    return min(int(plan.get("min_survivors") or len(plan["sizes"])), int(n_clients))


def _check_request_against_plan(fields: dict, plan: dict, gp, site: int, n_records: int, Y: np.ndarray, kind: str) -> None:
    """Refuse a DP request whose numbers disagree with what the site's noise was calibrated for.

    The site's σ comes from the public plan (its record count, γ, n_y, S, Q, the rule); a server that
    announced other numbers in the plan than it uses in the request — e.g. 100× this site's record count,
    or a small γ in the plan and a large one in the request — would shrink the site's noise below what its
    data needs. So the site checks its own record count, and computes with the plan's γ and Q itself.
    """
    if int(plan["sizes"][site]) != int(n_records):
        raise ProtocolError(f"the DP plan announces {plan['sizes'][site]} records for this site, which holds {n_records} "
                            "(its noise would be calibrated for the wrong count); refusing")
    if not np.isclose(float(fields["gamma"]), gp.gamma, rtol=1e-12, atol=0.0):
        raise ProtocolError(f"the request's gamma={fields['gamma']} differs from the DP plan's {gp.gamma}; refusing")
    if Y.shape[0] != gp.n_landmarks:
        raise ProtocolError(f"the request carries {Y.shape[0]} landmarks, the DP plan {gp.n_landmarks}; refusing")
    if kind != gp.rule:
        raise ProtocolError(f"the request asks for a {kind!r} upload, the DP plan for rule {gp.rule!r}; refusing")
    if kind == "model" and int(fields["local_steps"]) != gp.local_steps:
        raise ProtocolError(f"the request asks for {fields['local_steps']} local steps, the DP plan for {gp.local_steps}; "
                            "refusing")
    rnd = int(fields["round"])
    step = int(fields.get("step", 0))
    if not (0 <= rnd < gp.rounds and 0 <= step < gp.local_steps):
        raise ProtocolError(f"release (round {rnd}, step {step}) is outside the DP plan's {gp.rounds} rounds × "
                            f"{gp.local_steps} steps; refusing")


def _upload(fields: dict, node_config: dict, state: SiteState, op: str, g=None) -> tuple[np.ndarray, dict, np.random.Generator]:
    """The vector this site contributes to a federated sum, plus reply extras (ledger events); ``g`` is the
    site's Generator (default: restored from ``state``; the caller saves it)."""
    _, members, holdout = site_records(fields, node_config)
    if g is None:
        g = state.rng(int(fields.get("seed", 0)), int(fields["site"]))
    if fields.get("task") == "audit":
        from ..audits.mia import site_roc_counts

        if holdout is None:
            raise ConfigError(bad_value("audit-holdout", 0, "the audit needs held-out records; set audit-holdout > 0"))
        Y = array_from_bytes(fields["Y"], fields["shape"])
        u = site_roc_counts(members, holdout, Y, float(fields["gamma"]), scores=tuple(fields.get("scores", ["nearest", "kde"])),
                            rng=g)
        return u, {}, g
    if "dp" in fields:
        u, extra = _dp_update(fields, members, g, node_config, op, state)
        return u, extra, g
    _refuse_without_dp(node_config, f"a non-private {fields.get('task')!r} upload")
    return compute_update(fields, members, g), {}, g


def _refuse_without_dp(node_config: dict, what: str) -> None:
    """A site whose operator set ``require-dp = true`` releases nothing about its records without DP."""
    if str(node_config.get("require-dp", False)).strip().lower() in ("1", "true", "yes", "on"):
        raise ConfigError(bad_value("differential privacy", "off", f"this site requires DP (node config require-dp) and "
                                    f"refuses {what}; run with epsilon and clip-norm (and rows-epsilon for rows)"))


def _rows(fields: dict, node_config: dict, state: SiteState) -> dict:
    """Nyström "rows" stage: one row per record (all records, file order) — D²(X, Y) or K(X, Y).

    With ``rows_dp`` the rows are computed from the records clipped to ``τ_X`` plus Gaussian noise
    (``papers/000`` §5.1, :class:`~securefed.accounting.DataPerturbation`), the release written to the
    site's ledger first.
    """
    import json

    from ..kernels import gaussian_kernel, sq_dists

    X, _, _ = site_records(fields, node_config)
    site = int(fields["site"])
    Y = array_from_bytes(fields["Y"], fields["shape"])
    if Y.shape[1] != X.shape[1]:
        raise ConfigError(bad_value("landmarks.shape", Y.shape, f"this site has {X.shape[1]} features"))
    extra: dict = {}
    if not fields.get("rows_dp"):
        _refuse_without_dp(node_config, "rows from raw records")
    if fields.get("rows_dp"):
        from ..accounting import DataPerturbation
        from .privacy import open_site_ledger

        rp = json.loads(fields["rows_dp"])
        cache = json.loads(bytes(state.data["dp_cache"]).decode()) if "dp_cache" in state.data else {}
        ledger = open_site_ledger(rp, node_config, cache)
        state.data["dp_cache"] = json.dumps(cache).encode()
        dp = DataPerturbation(rp["epsilon"], delta=rp["delta"], tau_x=rp["tau_x"], secure_mode=rp["secure_noise"],
                              ledger=ledger, random_state=None if rp["secure_noise"] else int(rp["noise_seed"]) + site)
        X = dp.perturb_site(X, site=site)
        extra = {"rows_dp_event": json.dumps(ledger.releases_at(site, None, None)[-1], sort_keys=True),
                 "rows_dp_report": json.dumps(dp.report(), sort_keys=True)}
    if fields.get("kind") == "kernel":
        R = gaussian_kernel(X, Y, float(fields["gamma"]))
    elif fields.get("kind") == "distance":
        R = sq_dists(X, Y)
    else:
        raise ProtocolError(f"unknown rows kind {fields.get('kind')!r}; expected 'distance' or 'kernel'")
    return {"rows": array_to_bytes(R), "rows_shape": list(R.shape), **extra}


def handle(fields: dict, node_config: dict, state: SiteState) -> dict:
    """Answer one server request (``fields`` of the ``securefed`` record); returns the reply fields.

    A securefed error (bad message, failed signature, aborted protocol) is returned as
    ``{"error": "<Type>: <message>"}`` after the state machine has aborted; it never crashes the site.
    """
    op = fields.get("op")
    try:
        if op == "hello":
            X, members, holdout = site_records(fields, node_config)
            sk = state.identity()
            return {"site_name": str(node_config.get("site-name") or node_config.get("data-path")),
                    "n_records": int(members.shape[0]), "n_holdout": 0 if holdout is None else int(len(holdout)),
                    "n_features": int(X.shape[1]), "identity": crypto.ed25519_public_bytes(sk)}
        if op == "plain":
            u, extra, g = _upload(fields, node_config, state, op)
            state.save_rng(g)
            return {"update": array_to_bytes(u), "shape": list(np.shape(u)), **extra}
        if op == "secagg-start":
            spec = decode_spec(fields["spec"])
            site = int(fields["site"])
            u, extra, g = _upload(fields, node_config, state, op)
            client = SecAggClient(spec, site, state.identity(), np.ravel(u), float(fields["weight"]), g,
                                  min_survivors=_dp_min_survivors(fields, spec.n_clients))
            msgs = client.start()
            state.data.update(spec=bytes(fields["spec"]), client=dump_client(client))
            state.save_rng(client._rng)
            return {"msgs": msgs, **extra}
        if isinstance(op, str) and (op == "ckks" or op.startswith("ckks-")):
            from .ckks_flow import site_handle_ckks

            extras: dict = {}

            def upload(f, _X, g):  # site_handle_ckks restores and saves the Generator around this call
                u, extra, _ = _upload(f, node_config, state, op, g)
                extras.update(extra)
                return u

            reply = site_handle_ckks(fields, None, state, upload, node_config)
            return {**reply, **extras} if "error" not in reply else reply
        if op == "rows":
            return _rows(fields, node_config, state)
        if op == "embed":
            from ..embedding.placement import place_records

            X = load_site_data(node_config)
            Y = array_from_bytes(fields["Y"], fields["shape"])
            E = array_from_bytes(fields["landmark_embedding"], fields["embedding_shape"])
            Z = place_records(Y, X, float(fields["perplexity"]), int(fields["tsne_seed"]), E, E.shape[1])
            return {"embedding": array_to_bytes(Z), "embedding_shape": list(Z.shape)}
        if op == "embed-umap":
            from ..embedding.placement import place_records_umap

            X = load_site_data(node_config)
            Y = array_from_bytes(fields["Y"], fields["shape"])
            E = array_from_bytes(fields["landmark_embedding"], fields["embedding_shape"])
            Z = place_records_umap(Y, X, int(fields["n_neighbors"]), float(fields["min_dist"]), int(fields["model_seed"]),
                                   E, E.shape[1])
            return {"embedding": array_to_bytes(Z), "embedding_shape": list(Z.shape)}
        if op == "embed-spectral":
            from ..estimators import spectral_assign

            X = load_site_data(node_config)
            Y = array_from_bytes(fields["Y"], fields["shape"])
            lab_y = np.asarray(fields["landmark_labels"], dtype=np.int64)
            k = int(fields["n_clusters"])
            if lab_y.shape != (len(Y),) or lab_y.min(initial=0) < 0 or lab_y.max(initial=0) >= k:
                raise ProtocolError("landmark labels do not match the landmarks / n_clusters")
            lab = spectral_assign(X, Y, float(fields["kernel_gamma"]), lab_y, k)
            return {"labels": [int(v) for v in lab]}
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
            return {"msgs": out, "secagg_clipped": int(client.clipped)}
        raise ProtocolError(f"unknown operation {op!r}")
    except SecureFedError as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
