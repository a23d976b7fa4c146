"""One site (hospital) of the federation: :class:`SiteWorker` answers the coordinator's requests.

The same object serves the in-process run (:mod:`.inprocess`, records in memory) and a Flower SuperNode
(:mod:`securefed.flower.client_app`, records from the site's ``data-path``). A request is a flat dict
(:mod:`.wire`) with an ``op``; the reply is a flat dict, or ``{"error": "<Type>: <message>"}`` when the site
refuses or a protocol machine aborts — a site never crashes on a bad message.

Operations
----------
``hello``          public description: site name, record count (FedDL members), hold-out count, feature
                   count, and the Ed25519 identity key of this run (the private half stays on the site).
``plain``          compute the requested upload (:meth:`SiteWorker.upload`) and return it in the clear.
``secagg-start``   compute the upload, check the announced round against the site's own floors, start the
                   SecAgg+ client machine and return its first message; ``secagg`` feeds it the server's messages.
``ckks-start``     the same for CKKS (``ckks-msgs``, ``ckks-end``).
``rows``           the paper's Nyström rows mode: one row per record, ``D²(X, Y)`` or ``K(X, Y)``, optionally
                   from data-perturbed records (these rows give the records back).
``place``          no-rows mode: place the site's own records against the landmark model the server sent;
                   only the final coordinates (or cluster labels) are returned.

Uploads carry a ``task`` — ``stats`` (γ statistic and feature moments), ``model`` / ``gradient`` (FedDL,
Eqs. 13–16), ``moments`` (the cells' PCA basis), ``cell-counts`` / ``cell-sums`` (the cells), ``rff`` / ``billboard-counts``
/ ``billboard-density`` (the DP billboard), ``audit`` (membership-audit ROC counts) or ``mmd``.
A site weighs its own upload by the rule ``weights`` (``"records"``: its own record count; ``"uniform"``: 1):
the server never chooses a site's weight. With a DP plan (``dp``) the update is clipped, noised and written
to the site's own ledger before the reply (:mod:`.privacy`).

Site options (the SuperNode's ``--node-config`` keys, or the in-process driver's): ``site-name``,
``data-path``, ``label-column``, ``allow-plain`` (default false: the site sends its uploads only into a secure
sum; true lets the coordinator see each of them), ``epsilon-budget``, ``ledger-path``, ``allow-seeded-noise``,
``require-dp``, ``ckks-min-survivors``, ``ckks-allow-minority-quorum``, ``ckks-allow-signature-verify``.
"""

from __future__ import annotations

import json
import zlib

import numpy as np

from ..errors import ConfigError, DecodeError, ProtocolError, SecureFedError, bad_value
from ..securesum import crypto
from .wire import dumps, get_array, loads, put_array

__all__ = ["SiteWorker", "TASKS", "compute_upload", "monitor_scale"]

TASKS = ("stats", "model", "gradient", "audit", "mmd", "moments", "cell-counts", "cell-sums", "rff",
         "billboard-counts", "billboard-density")


def _truthy(v) -> bool:
    return str(v).strip().lower() in ("1", "true", "yes", "on")


def monitor_scale(clip: float | None) -> float:
    """Factor applied to the MMD a site appends to its upload so that it fits the public range (|MMD| ≤ 2)."""
    return 1.0 if clip is None else float(clip) / 2.0


def compute_upload(task: dict, X: np.ndarray, rng: np.random.Generator, kxx: float | None = None) -> np.ndarray:
    """The non-private upload ``task`` asks for, from the site's FedDL members ``X`` (one vector).

    * ``stats``: ``[median_p(‖x−x'‖²)/(4mB), mean_p(x), mean_p(x²)/B]`` (the parts asked in ``want``) — the
      median heuristic's statistic and the feature moments, one secure sum (``B`` = ``scale``);
    * ``model``: ``Y_p`` after ``Q`` local steps from the broadcast ``Y`` (Qiao et al. Algorithm 1 lines 5–10);
    * ``gradient``: ``∇f_p(Y)`` (Eq. 13);
    * ``mmd``: ``[MMD(X_p, Y)]`` (Eq. 10);
    * ``moments``: ``[n_p, Σx/B, Σxxᵀ/B²]`` (the PCA basis of the cell landmarks);
    * ``cell-counts`` / ``cell-sums``: the count pass and the sum pass of :mod:`securefed.landmarks.cells`, in the
      broadcast landmark space;

    and, with ``monitor``, ``MMD(X_p, Y)`` (of the broadcast Y) appended, scaled by :func:`monitor_scale`.
    """
    from ..kernels import local_median_sq_dist
    from ..landmarks.feddl import client_update, mmd, mmd_grad

    kind = task.get("task")
    if kind == "moments":
        from ..landmarks.cells import site_moments

        return site_moments(np.asarray(X) / float(task["scale"]))
    if kind in ("cell-counts", "cell-sums"):
        from ..landmarks.cells import cell_counts, cell_sums
        from .space import LandmarkSpace

        F = LandmarkSpace.get(task).features(X)
        Y = get_array(task, "Y")
        if Y.ndim != 2 or Y.shape[1] != F.shape[1]:
            raise ConfigError(bad_value("landmarks.shape", Y.shape, f"the landmark space has {F.shape[1]} dimensions"))
        return cell_counts(F, Y) if kind == "cell-counts" else cell_sums(F, Y, bool(task.get("second_moments")))
    if kind == "stats":
        B = float(task["scale"])
        m = X.shape[1]
        parts = []
        for want in task["want"]:
            if want == "gamma":
                parts.append(np.array([local_median_sq_dist(X, random_state=rng) / (4.0 * m * B)]))
            elif want == "moments":
                parts += [X.mean(axis=0), (X * X).mean(axis=0) / B]
            else:
                raise ProtocolError(f"unknown statistic {want!r}")
        return np.concatenate(parts)
    Y = get_array(task, "Y")
    if Y.ndim != 2 or Y.shape[1] != X.shape[1]:
        raise ConfigError(bad_value("landmarks.shape", Y.shape, f"this site has {X.shape[1]} features"))
    gamma = float(task.get("gamma", 1.0))
    if kind == "model":
        u = client_update(X, Y, gamma, float(task["lr"]), int(task["local_steps"]))
    elif kind == "gradient":
        u = mmd_grad(X, Y, gamma)
    elif kind == "mmd":
        u = np.array([mmd(X, Y, gamma, kxx_term=kxx)])
    else:
        raise ProtocolError(f"unknown task {kind!r}; expected one of {TASKS}")
    if task.get("monitor"):
        u = np.append(np.ravel(u), mmd(X, Y, gamma, kxx_term=kxx) * monitor_scale(task.get("clip")))
    return u


class SiteWorker:
    """One site: its records, its options and its state between messages.

    Parameters
    ----------
    options : dict
        The site's options (module docstring); ``site-name`` names it in the run.
    records : ndarray, optional
        The site's records (in process). Without them they are read from ``options["data-path"]``.
    state : dict, optional
        What an earlier process of this site stored (:attr:`state`): its identity key, its Generator, a live
        protocol machine, its DP calibration. Flower keeps it in the SuperNode's per-run state.
    """

    def __init__(self, options: dict, records: np.ndarray | None = None, state: dict | None = None):
        self.options = dict(options)
        self._records = None if records is None else np.asarray(records, dtype=np.float64)
        self.state = dict(state or {})
        self._live: dict = {}  # objects kept only while this process lives (in process: the whole run)
        self.kept = None  # what this site kept of the embedding (coordinates keep)
        self.on_progress = None  # in process: the run's on_event callback, for the placement's progress events

    # ------------------------------------------------------------------------------ records
    @property
    def name(self) -> str:
        return str(self.options.get("site-name") or self.options.get("data-path") or "site")

    def records(self) -> np.ndarray:
        """All of this site's records (file order)."""
        if self._records is None:
            from ..data import load_dataset

            path = self.options.get("data-path")
            if not path:
                raise ConfigError(bad_value("site option data-path", path, "start the SuperNode with --node-config "
                                            "'data-path=\"/path/site.csv\" site-name=\"A\"'"))
            self._records = load_dataset(str(path), label_column=self.options.get("label-column") or None).X
        return self._records

    def split(self, holdout: float, seed: int) -> tuple[np.ndarray, np.ndarray | None]:
        """``(FedDL members, audit hold-out or None)``: with ``holdout = f > 0`` the site keeps ``round(f·n)``
        records (at least 1, at most ``n − 2``) out of every FedDL computation, chosen with its own Generator
        seeded by the run seed and its site name (the same split for every message, also after a restart)."""
        X = self.records()
        if not holdout:
            return X, None
        if not 0.0 < holdout < 0.9:
            raise ConfigError(bad_value("audit-holdout", holdout, "use a fraction in [0, 0.9), e.g. 0.2"))
        key = ("split", float(holdout), int(seed))
        if key not in self._live:
            g = np.random.default_rng([int(seed), zlib.crc32(self.name.encode()), 0xA0D17])
            n_out = min(max(int(round(holdout * len(X))), 1), len(X) - 2)
            perm = g.permutation(len(X))
            self._live[key] = (X[np.sort(perm[n_out:])], X[np.sort(perm[:n_out])])
        return self._live[key]

    def members(self, fields: dict) -> np.ndarray:
        return self.split(float(fields.get("audit_holdout", 0.0) or 0.0), int(fields.get("seed", 0)))[0]

    # ------------------------------------------------------------------------------ state
    def fingerprint(self) -> str:
        """SHA-256 (first 16 hex digits) of this run's identity public key: operators compare it out of band with
        the fingerprints the coordinator lists in ``result.json`` (the coordinator relays the keys)."""
        import hashlib

        return hashlib.sha256(crypto.ed25519_public_bytes(self.identity())).hexdigest()[:16]

    def identity(self):
        """This run's Ed25519 identity key (created on first use from the OS entropy source)."""
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

        raw = self.state.get("identity")
        if raw is None:
            sk, _ = crypto.ed25519_keypair()
            self.state["identity"] = sk.private_bytes_raw()
            return sk
        return Ed25519PrivateKey.from_private_bytes(bytes(raw))

    def rng(self, seed: int, site: int) -> np.random.Generator:
        """The site's statistical Generator (subsampling, stochastic rounding), kept across messages."""
        g = np.random.default_rng([int(seed), int(site)])
        if "rng" in self.state:
            g.bit_generator.state = json.loads(bytes(self.state["rng"]).decode())
        return g

    def save_rng(self, g: np.random.Generator) -> None:
        self.state["rng"] = json.dumps(g.bit_generator.state).encode()

    def _dp_cache(self) -> dict:
        if "dp_cache" not in self._live:
            self._live["dp_cache"] = json.loads(bytes(self.state["dp_cache"]).decode()) if "dp_cache" in self.state else {}
        return self._live["dp_cache"]

    def _save_dp_cache(self) -> None:
        cache = {k: v for k, v in self._dp_cache().items() if k != "memory_ledger"}
        self.state["dp_cache"] = json.dumps(cache).encode()

    def _kxx(self, X: np.ndarray, gamma: float) -> float:
        """The Y-independent term of Eq. (10) for this site's members (computed once per γ)."""
        from ..landmarks.feddl import _kxx_term

        key = ("kxx", len(X), float(gamma))
        if key not in self._live:
            self._live[key] = _kxx_term(X, gamma)
        return self._live[key]

    # ------------------------------------------------------------------------------ uploads
    def weight(self, fields: dict) -> float:
        """This site's weight in a sum, by the rule in the request — never a number the server chose."""
        rule = fields.get("weights", "records")
        if rule == "records":
            return float(len(self.members(fields)))
        if rule in ("uniform", "count"):
            return 1.0
        raise ProtocolError(f"unknown weight rule {rule!r}; expected 'records' or 'uniform'")

    def upload(self, fields: dict, op: str) -> tuple[np.ndarray, dict]:
        """The vector this site contributes to a sum, plus reply extras (its DP ledger events)."""
        members, holdout = self.split(float(fields.get("audit_holdout", 0.0) or 0.0), int(fields.get("seed", 0)))
        g = self.rng(int(fields.get("seed", 0)), int(fields["site"]))
        try:
            if fields.get("task") == "audit":
                from ..audits.mia import site_roc_counts

                if holdout is None:
                    raise ConfigError(bad_value("audit-holdout", 0, "the audit needs held-out records; set audit-holdout > 0"))
                from .space import LandmarkSpace

                space = LandmarkSpace.get(fields)
                u = site_roc_counts(space.features(members), space.features(holdout), get_array(fields, "Y"),
                                    float(fields["gamma"]), scores=tuple(fields.get("scores", ["nearest", "kde"])), rng=g)
                return u, {}
            if "dp" in fields:
                return self._dp_upload(fields, members, g, op)
            if "billboard" in fields:
                return self._billboard_upload(fields, members, g, op)
            self._refuse_without_dp(f"a non-private {fields.get('task')!r} upload")
            kxx = self._kxx(members, float(fields["gamma"])) if (fields.get("monitor") or fields.get("task") == "mmd") else None
            return _scale_parts(compute_upload(fields, members, g, kxx), fields), {}
        finally:
            self.save_rng(g)

    def _billboard_upload(self, fields: dict, X: np.ndarray, g, op: str) -> tuple[np.ndarray, dict]:
        """One of the DP billboard's releases (:mod:`securefed.landmarks.merf`): the site's own calibration
        and noise, its own ledger written before the reply leaves. ``X``: the landmarks' members; the density
        (release 3) counts every record of the site, the hold-out too."""
        from .privacy import site_billboard_release
        from .space import LandmarkSpace

        if str(fields.get("release")) == "2":
            X = self.records()
        F = LandmarkSpace.get(fields).features(X)
        u, events = site_billboard_release(fields, F, self.options, int(fields["site"]), self._dp_cache(),
                                           len(X), op)
        self._save_dp_cache()
        return _scale_parts(u, fields), {"dp_events": events}

    def _refuse_without_dp(self, what: str) -> None:
        """A site whose operator set ``require-dp = true`` releases nothing about its records without DP."""
        if _truthy(self.options.get("require-dp", False)):
            raise ConfigError(bad_value("differential privacy", "off", f"this site requires DP (site option require-dp) "
                                        f"and refuses {what}; run with epsilon and clip-norm (and rows-epsilon for rows)"))

    def _dp_upload(self, fields: dict, X: np.ndarray, g, op: str) -> tuple[np.ndarray, dict]:
        """A differentially private upload: the site's own mechanism, clipped records, noise, ledger first."""
        from ..accounting import clip_records
        from ..landmarks.feddl import client_update, mmd_grad
        from .privacy import release_events, site_mechanism, site_settle

        plan = loads(fields["dp"], "DP plan")
        site = int(fields["site"])
        if plan["noise"] == "distributed" and op == "plain":
            raise ConfigError(bad_value("aggregation", "plain", "this site adds only a share of the noise (distributed): "
                                        "it sends that upload only into a secure sum (secagg / ckks)"))
        kind = fields.get("task")
        if kind not in ("model", "gradient"):
            raise ProtocolError(f"under differential privacy this site releases only noisy landmark updates, not {kind!r}")
        gp = site_mechanism(plan, self.options, site, self._dp_cache())
        self._save_dp_cache()
        if plan.get("distributed_mechanism"):
            return self._integer_upload(fields, plan, gp, X, g, op)
        site_settle(gp, site, loads(fields.get("dp_settle") or "[]", "settlements"))
        Xc, _ = clip_records(X, gp.tau_x)  # how many were clipped stays on the site (a count of its records)
        Y = get_array(fields, "Y")
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
        # the ledger events are on disk (fsync'd) before this returns, i.e. before the reply leaves
        return u, {"dp_events": release_events(gp, site, rnd, steps)}

    def _integer_upload(self, fields: dict, plan: dict, gp, X: np.ndarray, g, op: str) -> tuple[np.ndarray, dict]:
        """The distributed discrete Gaussian / Skellam release of one FedDL gradient step: the site's own mechanism
        (checked against the coordinator's claims), its weighted gradient encoded to integers mod ``2^bits`` with its
        own integer noise, the ledger written first (:func:`~.privacy.site_integer_release`)."""
        from ..accounting import clip_records
        from ..landmarks.feddl import mmd_grad
        from ..securesum.secagg import decode_spec
        from .privacy import INTEGER_MECHANISMS, release_events, site_integer_mechanism, site_integer_release

        site = int(fields["site"])
        if plan["distributed_mechanism"] not in INTEGER_MECHANISMS or plan["noise"] != "distributed":
            raise ProtocolError(f"unknown distributed mechanism {plan['distributed_mechanism']!r} in the DP plan")
        if op != "secagg-start":
            raise ConfigError(bad_value("aggregation", op.split("-")[0], f"this site's {plan['distributed_mechanism']} "
                                        "upload is a vector of integers mod 2^k: it goes only into a SecAgg+ sum (secagg)"))
        Xc, _ = clip_records(X, gp.tau_x)  # how many were clipped stays on the site
        Y = get_array(fields, "Y")
        if Y.shape[1] != X.shape[1]:
            raise ConfigError(bad_value("landmarks.shape", Y.shape, f"this site has {X.shape[1]} features"))
        _check_request_against_plan(fields, plan, gp, site, len(X), Y, fields.get("task"))
        mech = site_integer_mechanism(plan, gp, site, X.shape[1])
        spec = decode_spec(fields["spec"])
        rnd, t = int(fields["round"]), int(fields["step"])
        Xb, n_norm = gp.batch(site, rnd, t, Xc, g)
        words = site_integer_release(gp, mech, plan, mmd_grad(Xb, Y, gp.gamma, n_norm=n_norm), site=site, rnd=rnd,
                                     step=t, spec=spec)
        return words, {"dp_events": release_events(gp, site, rnd, [t])}

    # ------------------------------------------------------------------------------ dispatch
    def handle(self, fields: dict) -> dict:
        """Answer one request; a securefed error comes back as ``{"error": ...}`` (the machine aborted)."""
        op = fields.get("op")
        try:
            handler = {"hello": self._hello, "plain": self._plain, "secagg-start": self._secagg_start,
                       "secagg": self._secagg, "ckks-start": self._ckks, "ckks-msgs": self._ckks, "ckks-end": self._ckks,
                       "rows": self._rows, "place": self._place}.get(op)
            if handler is None:
                raise ProtocolError(f"unknown operation {op!r}")
            return handler(fields)
        except SecureFedError as exc:
            return {"error": f"{type(exc).__name__}: {exc}"}
        except (KeyError, TypeError, ValueError) as exc:  # a malformed request is the sender's fault: refuse it
            return {"error": f"DecodeError: malformed {op!r} request: {type(exc).__name__}: {exc}"}

    def _hello(self, fields: dict) -> dict:
        X = self.records()
        members, holdout = self.split(float(fields.get("audit_holdout", 0.0) or 0.0), int(fields.get("seed", 0)))
        return {"site_name": self.name, "n_records": int(len(members)),
                "n_holdout": 0 if holdout is None else int(len(holdout)), "n_features": int(X.shape[1]),
                "identity": crypto.ed25519_public_bytes(self.identity())}

    def _plain(self, fields: dict) -> dict:
        if not _truthy(self.options.get("allow-plain", False)):
            raise ConfigError(bad_value("aggregation", "plain", "this site sends its uploads only into a secure sum "
                                        "(secagg or ckks): with plain aggregation the coordinator would see each one. "
                                        "Its operator can allow it with the site option allow-plain=true"))
        u, extra = self.upload(fields, "plain")
        return {**put_array({}, "update", u), "weight": self.weight(fields), **extra}

    def _secagg_start(self, fields: dict) -> dict:
        """Check the announced SecAgg+ round against this site's floors (:mod:`securefed.securesum.threat`) —
        before anything is computed — then compute the upload with the site's own weight and start the client."""
        from ..securesum.secagg import decode_spec
        from ..securesum.secagg_client import SecAggClient
        from ..securesum.secagg_codec import dump_client
        from ..securesum.threat import check_secagg_spec, int_option
        from .sums import dp_min_survivors, refuse_server_weight, request_dp_plan

        refuse_server_weight(fields)
        spec = decode_spec(fields["spec"])
        site = int(fields["site"])
        weight = self.weight(fields)
        dp = request_dp_plan(fields) or {}
        dp = loads(dp, "DP plan") if isinstance(dp, (str, bytes, bytearray)) else dp
        integer_plan = bool(dp.get("distributed_mechanism"))
        if spec.integer != integer_plan:  # before anything is computed or booked
            raise ProtocolError(f"the SecAgg+ round {'sums integers' if spec.integer else 'uses the fixed-point codec'} but "
                                f"the request's upload is {'an integer encoding' if integer_plan else 'real-valued'}; refusing")
        if spec.integer:
            weight = 1.0  # integer inputs come weighted by their encoder (its own weight, from the public plan it checked)
        floors = check_secagg_spec(spec, self.options, weight=weight, dp_t=dp_min_survivors(request_dp_plan(fields)))
        u, extra = self.upload(fields, "secagg-start")
        g = self.rng(int(fields.get("seed", 0)), site)
        dp_floor = _dp_min_survivors(fields, spec.n_clients, int_option(self.options, "dp-colluders", 0))
        client = SecAggClient(spec, site, self.identity(), np.ravel(u), weight, g,
                              min_survivors=min(max(floors.min_survivors, dp_floor), spec.n_clients),
                              colluders=floors.colluders)
        msgs = client.start()
        self.state.update(spec=bytes(fields["spec"]), client=dump_client(client))
        self.save_rng(client._rng)
        return {"msgs": msgs, **extra}

    def _secagg(self, fields: dict) -> dict:
        from ..securesum.secagg import decode_spec
        from ..securesum.secagg_codec import dump_client, load_client

        if "client" not in self.state:
            raise ProtocolError("no SecAgg+ round in progress on this site (restarted?)")
        spec = decode_spec(self.state["spec"])
        client = load_client(self.state["client"], spec, self.identity())
        out: list = []
        try:
            for data in fields.get("msgs", []):
                out += client.receive(bytes(data))
        finally:
            self.state["client"] = dump_client(client)
            self.save_rng(client._rng)
            if client.state in ("done", "aborted"):
                self.state.pop("client", None)
                self.state.pop("spec", None)
        if spec.integer:
            return {"msgs": out}  # an integer round clips nothing after the noise: there is no count to send
        return {"msgs": out, "secagg_clipped": int(client.clipped)}

    def _ckks(self, fields: dict) -> dict:
        from .sums import site_handle_ckks

        extras: dict = {}

        def upload(f):
            u, extra = self.upload(f, f["op"])
            extras.update(extra)
            return u, self.weight(f)

        reply = site_handle_ckks(fields, self, upload)
        return {**reply, **extras} if "error" not in reply else reply

    def _rows(self, fields: dict) -> dict:
        """The paper's rows: one row per record (all records, file order) — ``D²(X, Y)`` or ``K(X, Y)``; with
        ``rows_dp`` from the records clipped to τ_X plus Gaussian noise (Qiao et al. §5.1), ledger first."""
        from ..kernels import gaussian_kernel, sq_dists

        X = self.records()
        site = int(fields["site"])
        Y = get_array(fields, "Y")
        if Y.shape[1] != X.shape[1]:
            raise ConfigError(bad_value("landmarks.shape", Y.shape, f"this site has {X.shape[1]} features"))
        extra: dict = {}
        if not fields.get("rows_dp"):
            self._refuse_without_dp("rows from raw records")
        else:
            from ..accounting import DataPerturbation
            from .privacy import open_site_ledger

            rp = loads(fields["rows_dp"], "rows DP plan")
            ledger = open_site_ledger(rp, self.options, self._dp_cache())
            self._save_dp_cache()
            seed = rp.get("noise_seed")
            dp = DataPerturbation(rp["epsilon"], delta=rp["delta"], tau_x=rp["tau_x"], ledger=ledger,
                                  insecure_noise_seed_for_testing=None if seed is None else int(seed) + site)
            X = dp.perturb_site(X, site=site)
            extra = {"rows_dp_event": dumps(ledger.releases_at(site, None, None)[-1]), "rows_dp_report": dumps(dp.report())}
        if fields.get("kind") == "kernel":
            R = gaussian_kernel(X, Y, float(fields["gamma"]))
        elif fields.get("kind") == "distance":
            R = sq_dists(X, Y)
        else:
            raise ProtocolError(f"unknown rows kind {fields.get('kind')!r}; expected 'distance' or 'kernel'")
        return {**put_array({}, "rows", R), **extra}

    def _progress(self, n_records: int):
        """``progress(done, total)`` for a long local computation: a ``"placement"`` event to :attr:`on_progress`
        (the in-process run's ``on_event``; a Flower site has none), or None."""
        if self.on_progress is None:
            return None
        name, hook = self.name, self.on_progress
        return lambda done, total: hook({"event": "placement", "site": name, "records": int(n_records),
                                         "done": int(done), "total": int(total)})

    def _place(self, fields: dict) -> dict:
        """No-rows mode: place this site's records (all of them, file order) against the coordinator's landmark map,
        using nothing but that broadcast and its own records; return the coordinates / labels, or keep them."""
        from ..embedding import placement
        from .space import LandmarkSpace

        F = LandmarkSpace.get(fields).features(self.records())
        Y = get_array(fields, "Y")
        if Y.ndim != 2 or Y.shape[1] != F.shape[1]:
            raise ConfigError(bad_value("landmarks.shape", Y.shape, f"the landmark space has {F.shape[1]} dimensions"))
        method = fields.get("method")
        if method == "spectral":
            from ..embedding.stages import spectral_assign

            lab_y = np.asarray(fields["landmark_labels"], dtype=np.int64)
            k = int(fields["n_clusters"])
            if lab_y.shape != (len(Y),) or lab_y.min(initial=0) < 0 or lab_y.max(initial=0) >= k:
                raise ProtocolError("landmark labels do not match the landmarks / n_clusters")
            out = spectral_assign(F, Y, float(fields["kernel_gamma"]), lab_y, k)
            reply = {"labels": [int(v) for v in out]}
        else:
            E = get_array(fields, "landmark_embedding")
            if E.shape[0] != len(Y):
                raise ProtocolError("the landmark map does not match the landmarks")
            if method == "tsne":
                out = placement.place_refine(F, Y, E, get_array(fields, "masses"), float(fields["Zn"]),
                                             perplexity=float(fields["perplexity"]), progress=self._progress(len(F)))
            elif method == "umap":
                out = placement.place_weighted(F, Y, E, perplexity=2.0)
            else:
                raise ProtocolError(f"unknown placement method {method!r}; expected 'tsne', 'umap' or 'spectral'")
            reply = put_array({}, "embedding", out)
        if fields.get("keep"):
            self.kept = np.asarray(out)  # the site's own result: it stays here (coordinates keep)
            path = self.options.get("output-path")
            if path:
                import os

                os.makedirs(str(path), exist_ok=True)
                np.save(os.path.join(str(path), f"{self.name}-embedding.npy"), self.kept)
            return {"kept": int(len(out))}
        return reply


def _scale_parts(u: np.ndarray, fields: dict) -> np.ndarray:
    """Divide each consecutive part of an upload by its public bound (``scale_lengths[i]`` coordinates bounded by
    ``scale_bounds[i]``), so the secure sum's fixed-point range is used well; the coordinator multiplies back."""
    lengths, bounds = fields.get("scale_lengths"), fields.get("scale_bounds")
    if not lengths and not bounds:
        return u
    u = np.ravel(np.asarray(u, dtype=np.float64))
    try:
        if len(lengths) != len(bounds):
            raise ValueError(f"{len(lengths)} lengths for {len(bounds)} bounds")
        scale = np.concatenate([np.full(int(k), float(b)) for k, b in zip(lengths, bounds)])
    except (TypeError, ValueError) as exc:
        raise DecodeError(f"malformed scale_lengths / scale_bounds: {exc}") from None
    if scale.shape != u.shape or not np.all(scale > 0):
        raise DecodeError(f"scale_lengths / scale_bounds cover {scale.size} coordinates with positive bounds; the "
                          f"upload has {u.size}")
    return u / scale


def _dp_min_survivors(fields: dict, n_clients: int, colluders: int = 0) -> int:
    """Under distributed noise a site helps unmask only sums over at least the plan's t sites (else 1).

    With ``colluders`` = c (site option ``dp-colluders``) the floor is t + c: colluding survivors can leave
    their noise share out, so only |U| − c shares are certain (docs/threat-model-secure-sum.md); the site
    refuses such a round before computing when t + c exceeds the sites (:mod:`securefed.securesum.threat`).
    """
    from .sums import dp_min_survivors, request_dp_plan

    t = dp_min_survivors(request_dp_plan(fields))
    if not t:
        return 1
    return min(t, int(n_clients)) if not colluders else t + int(colluders)


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


