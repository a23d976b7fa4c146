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
``require-dp``, ``allow-distributed-noise`` (default false: the site adds its full σ to every DP release and refuses a
plan that asks it for a share σ/√t; true lets it add the share inside a secure sum), ``dp-colluders``,
``ckks-min-survivors``, ``ckks-allow-minority-quorum``, ``ckks-allow-signature-verify``; reading the file as
``securefed run`` does: ``id-column``, ``keep-column`` (comma-separated), ``layer``; ``send-record-ids`` (default
false: the record ids never leave the site; true: they go with its coordinates, so the coordinator's outputs join
back to the records by id).
"""

from __future__ import annotations

import dataclasses
import json
import typing
import zlib

import numpy as np

from ..errors import ConfigError, DecodeError, ProtocolError, SecureFedError, bad_value
from ..securesum import crypto
from . import messages as M
from .wire import truthy

__all__ = ["SiteWorker", "TASKS", "compute_upload", "monitor_scale"]

TASKS = tuple(M.TASKS)


def monitor_scale(clip: float | None) -> float:
    """Factor applied to the MMD a site appends to its upload so that it fits the public range (|MMD| ≤ 2)."""
    return 1.0 if clip is None else float(clip) / 2.0


def compute_upload(task, X: np.ndarray, rng: np.random.Generator, kxx: float | None = None) -> np.ndarray:
    """The non-private upload a task asks for, from the site's FedDL members ``X`` (one vector).

    ``task`` is one of :data:`securefed.federation.messages.TASKS` (or the flat dict of one):

    * ``Stats``: ``[median_p(‖x−x'‖²)/(4mB), mean_p(x), mean_p(x²)/B]`` (the parts asked in ``want``) — the
      median heuristic's statistic and the feature moments, one secure sum (``B`` = ``scale``);
    * ``Model``: ``Y_p`` after ``Q`` local steps from the broadcast ``Y`` (Qiao et al. Algorithm 1 lines 5–10);
    * ``Gradient``: ``∇f_p(Y)`` (Eq. 13);
    * ``Mmd``: ``[MMD(X_p, Y)]`` (Eq. 10);

    and, with ``monitor``, ``MMD(X_p, Y)`` (of the broadcast Y) appended, scaled by :func:`monitor_scale`.
    """
    from ..kernels import local_median_sq_dist
    from ..landmarks.feddl import client_update, mmd, mmd_grad
    from . import messages as M

    task = as_task(task)
    if isinstance(task, M.Stats):
        B = float(task.scale)
        m = X.shape[1]
        parts = []
        for want in task.want:
            if want == "gamma":
                parts.append(np.array([local_median_sq_dist(X, random_state=rng) / (4.0 * m * B)]))
            elif want == "moments":
                parts += [X.mean(axis=0), (X * X).mean(axis=0) / B]
            else:
                raise ProtocolError(f"unknown statistic {want!r}")
        return np.concatenate(parts)
    if not isinstance(task, (M.Model, M.Gradient, M.Mmd)):
        raise ProtocolError(f"task {task.NAME!r} is not a non-private upload of this site")
    Y = task.Y
    if Y.ndim != 2 or Y.shape[1] != X.shape[1]:
        raise ConfigError(bad_value("landmarks.shape", Y.shape, f"this site has {X.shape[1]} features"))
    gamma = float(task.gamma)
    if isinstance(task, M.Model):
        u = client_update(X, Y, gamma, float(task.lr), int(task.local_steps))
    elif isinstance(task, M.Gradient):
        u = mmd_grad(X, Y, gamma)
    else:
        return np.array([mmd(X, Y, gamma, kxx_term=kxx)])
    if task.monitor:
        u = np.append(np.ravel(u), mmd(X, Y, gamma, kxx_term=kxx) * monitor_scale(task.clip))
    return u


def as_task(task):
    """A typed task (:data:`securefed.federation.messages.TASKS`) from a task or the flat dict of one."""
    from . import messages as M

    if isinstance(task, M.Task):
        return task
    if not isinstance(task, dict):
        raise DecodeError(f"a task must be a task message or a dict, not {type(task).__name__}")
    cls = M.TASKS.get(task.get("task"))
    if cls is None:
        raise ProtocolError(f"unknown task {task.get('task')!r}; expected one of {TASKS}")
    return M._decode_fields(cls, task, set(), what=f"{cls.NAME} task")


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
        self._ids: tuple[str, ...] | None = (
            None  # record ids from the site's file (site option id-column), when it has them
        )
        self.state = dict(state or {})
        self._live: dict = {}  # objects kept only while this process lives (in process: the whole run)
        self.kept: np.ndarray | None = None  # what this site kept of the embedding (coordinates keep)
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
                raise ConfigError(
                    bad_value(
                        "site option data-path",
                        path,
                        'start the SuperNode with --node-config \'data-path="/path/site.csv" site-name="A"\'',
                    )
                )
            keep = [c.strip() for c in str(self.options.get("keep-column") or "").split(",") if c.strip()]
            ds = load_dataset(
                str(path),
                label_column=self.options.get("label-column") or None,
                id_column=self.options.get("id-column") or None,
                layer=self.options.get("layer") or None,
                allow_id_like=keep,
            )
            if truthy(self.options.get("send-record-ids", False)) and ds.ids is None:
                raise ConfigError(
                    bad_value(
                        "site option send-record-ids",
                        self.options.get("send-record-ids"),
                        'name the file\'s id column too (id-column="..."), or drop send-record-ids',
                    )
                )
            self._records, self._ids = ds.X, ds.ids
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

    def _pin_seed(self, seed: int) -> None:
        """The run's public seed (hold-out split, landmark post-processing) is pinned at its first use: a request
        that carries another seed later in the run is refused (it would move the hold-out)."""
        pinned = self.state.get("seed")
        if pinned is None:
            self.state["seed"] = int(seed)
        elif int(pinned) != int(seed):
            raise ProtocolError(
                f"the request's seed {seed} differs from the run's seed {pinned} this site pinned; refusing"
            )

    @property
    def _run_seed(self) -> int:
        return int(self.state.get("seed", 0))

    def members(self, req) -> np.ndarray:
        """The FedDL members of a request (``req``: any request with ``audit_holdout`` and ``seed``)."""
        return self.split(float(req.audit_holdout or 0.0), int(req.seed))[0]

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
            self._live["dp_cache"] = (
                json.loads(bytes(self.state["dp_cache"]).decode()) if "dp_cache" in self.state else {}
            )
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
    def weight(self, req: M.SumRequest) -> float:
        """This site's weight in a sum, by the rule in the request — never a number the server chose."""
        return float(len(self.members(req))) if req.weights == "records" else 1.0

    def upload(self, req: M.SumRequest) -> tuple[np.ndarray, dict]:
        """The vector this site contributes to a sum, plus reply extras (its DP ledger events)."""
        self._pin_seed(req.seed)
        members, holdout = self.split(float(req.audit_holdout or 0.0), int(req.seed))
        g = self.rng(int(req.seed), int(req.site))
        task = req.task
        try:
            if isinstance(task, M.Audit):
                from ..audits.mia import site_roc_counts

                if holdout is None:
                    raise ConfigError(
                        bad_value("audit-holdout", 0, "the audit needs held-out records; set audit-holdout > 0")
                    )
                if self.state.get("audit_answered"):
                    raise ProtocolError(
                        "this site has answered the membership audit of this run already (once per "
                        "run: audit counts at other landmarks would locate records); refusing"
                    )
                self._check_landmarks(task.cells, task.previous, task.Y, task.space, members, gamma=task.gamma)
                self.state["audit_answered"] = True
                spec = self._live.get("bound_spec")
                if req.op in ("secagg-input", "secagg-start") and spec is not None:
                    self.state["audit_secagg_round"] = int(spec.round_index)  # its gate reads only the verified total
                u = site_roc_counts(
                    task.space.features(members),
                    task.space.features(holdout),
                    task.Y,
                    float(task.gamma),
                    scores=tuple(task.scores),
                    rng=g,
                )
                return u, {}
            if isinstance(task, (M.Model, M.Gradient)) and task.dp is not None:
                return self._dp_upload(req, task, members, g)
            if isinstance(task, (M.Rff, M.BillboardCounts, M.BillboardDensity)):
                return self._billboard_upload(req, task, members)
            if isinstance(task, M.Cells):
                self._refuse_without_dp("the cells' non-private sums")
                return self._cells_upload(req, task, members), {}
            self._refuse_without_dp(f"a non-private {task.NAME!r} upload")
            self._refuse_paper_mode(f"a non-private {task.NAME!r} upload")
            kxx = (
                self._kxx(members, float(getattr(task, "gamma", 1.0)))
                if (isinstance(task, M.Mmd) or getattr(task, "monitor", False))
                else None
            )
            return _scale_parts(compute_upload(task, members, g, kxx), req), {}
        finally:
            self.save_rng(g)

    # ------------------------------------------------------------------------------ the cell tree
    def cell_tree(self, task: M.Cells, members: np.ndarray):
        """This site's own copy of the run's cell tree (:mod:`securefed.landmarks.celltree`), advanced to
        ``task.step`` with the totals relayed so far — each checked against this site's own records first.

        The plan is pinned at the first cells request of the run and must meet the site's own floor (site option
        ``cell-floor``, default 15); every later request must carry the same plan and the next step."""
        from ..landmarks.celltree import CellsPlan
        from ..securesum.threat import int_option

        plan = CellsPlan.from_json(task.cells)
        own_floor = int_option(self.options, "cell-floor", 15)
        if plan.floor < own_floor:
            raise ConfigError(
                bad_value(
                    "cell-floor",
                    plan.floor,
                    f"this site reveals a sum of features only over at "
                    f"least {own_floor} records (its site option cell-floor); refusing the plan",
                )
            )
        if plan.n_max < len(members):
            raise ProtocolError(
                f"the cells plan bounds a site's records by n_max = {plan.n_max}, this site holds "
                f"{len(members)}; refusing"
            )
        pinned = self.state.get("cells_plan")
        if pinned is None:
            if task.step != 0:
                raise ProtocolError(f"cells step {task.step} asked of a site that has not answered step 0; refusing")
            self.state["cells_plan"] = plan.digest()
            self.state["cells_totals"] = []
        elif pinned != plan.digest():
            raise ProtocolError(
                "the cells plan differs from the one this site pinned at the first cells sum of the run "
                "(floor, basis, levels and bounds are fixed once per run); refusing"
            )
        totals = list(self.state.get("cells_totals", []))
        expected = int(self.state.get("cells_next", 0))
        if task.step != expected or (task.step > 0) != (task.previous is not None):
            raise ProtocolError(
                f"cells step {task.step} asked; this site answers each step of the run once and in "
                f"order, and expects step {expected} (with the total of step {expected - 1}); refusing"
            )
        tree = self._replayed_tree(plan, members.shape[1])
        if task.previous is not None and tree.step < task.step:  # (not yet absorbed for this request)
            q = tree.next_query()
            total = np.asarray(task.previous, dtype=np.float64).ravel()
            self._check_verified_total(q, total)
            _check_total_against_own(
                q, tree, total, members, self._cells_rounding(), bounded=not self.state.get("cells_plain", False)
            )
            tree.absorb(q, total)
            totals.append(np.ascontiguousarray(total, dtype="<f8").tobytes())
            self.state["cells_totals"] = totals
        self._live["cell_tree"] = tree
        return tree

    def _cells_rounding(self) -> float:
        """The largest rounding of the previous cells total per coordinate, relative to its parts' public bounds:
        under SecAgg+ the verified sum's active sites × 2⁻ᶠ (×4 for margin); else 2⁻¹⁶ (plain sums are exact
        floats; CKKS is asked for a precision of 1e-6)."""
        got = self._live.get("verified")
        if self.state.get("cells_secagg_round") is None or got is None:
            return 2.0**-16
        fp = got[2].fixed_point
        return 4.0 * float(fp.active_clients) * float(fp.step)

    def _check_verified_total(self, q, total: np.ndarray) -> None:
        """Under SecAgg+, the relayed total of a cells sum must be the one this site verified itself from the sum's
        proof (the same words, dequantised and scaled back as the coordinator does); a site that put its input into a
        SecAgg+ cells sum absorbs no total without that proof."""
        from ..securesum.quantize import dequantize

        if self.state.get("cells_secagg_round") is None:
            return  # the previous cells sum was not a SecAgg+ sum (plain: allow-plain; CKKS): nothing to verify
        want = int(self.state["cells_secagg_round"])
        got = self._live.get("verified")
        if got is None or got[0] != want or int(self.state.get("secagg/verified", -1)) != want:
            raise ProtocolError(
                "the total of the previous cells sum comes without the proof of that SecAgg+ sum; "
                "this site absorbs only totals it verified; refusing"
            )
        _, words, spec = got
        scale = np.concatenate([np.full(int(k), float(b)) for k, b in q.parts])
        mine = dequantize(words, spec.fixed_point).reshape(-1) * scale
        if mine.shape != total.shape or not np.array_equal(mine, total):
            raise ProtocolError(
                "the relayed total of the previous cells sum is not the total its proof shows; refusing"
            )

    def _cells_binding(self, req: M.SumRequest) -> dict | None:
        """For a cells sum, the query this site derives itself (its tree advanced with the checked totals): what the
        task digest binds besides the request's fields. None for other tasks."""
        if not isinstance(req.task, M.Cells):
            return None
        members = self.members(req)
        tree = self.cell_tree(req.task, members)
        q = tree.next_query()
        if q is None:
            raise ProtocolError("the cell tree is complete: there is no further cells sum to answer; refusing")
        return q.digest_doc()

    def _replayed_tree(self, plan, m: int):
        """The tree as the checked totals this site stored left it (a fresh process replays them)."""
        from ..landmarks.celltree import CellTree

        totals = list(self.state.get("cells_totals", []))
        tree = self._live.get("cell_tree")
        if tree is None or tree.step != len(totals):
            tree = CellTree(plan, m)
            for raw in totals:
                tree.absorb(tree.next_query(), np.frombuffer(bytes(raw), dtype="<f8"))
        self._live["cell_tree"] = tree
        return tree

    def _check_landmarks(self, cells, previous, Y, space, members: np.ndarray, gamma: float | None = None) -> None:
        """In a cells run, the landmarks, space and γ of an audit or placement request must be the ones this site
        computes itself from its tree (finished here with the relayed last total when it is not yet); a site that
        answered cells sums refuses a request that omits them. Outside cells runs (``cells`` None and no pinned
        plan) nothing is checked here."""
        from ..landmarks.celltree import CellsPlan

        pinned = self.state.get("cells_plan")
        if pinned is None:
            if cells is not None:
                raise ProtocolError(
                    "the request names a cells plan but this site answered no cells sum in this run; refusing"
                )
            return
        if cells is None or CellsPlan.from_json(cells).digest() != pinned:
            raise ProtocolError(
                "this site answered the cells sums of this run: an audit or placement request must carry "
                "the pinned cells plan (the site checks the landmarks against its own); refusing"
            )
        if previous is not None:
            step = int(self.state.get("cells_next", 0))
            tree = self.cell_tree(M.Cells(cells=cells, step=step, previous=previous), members)
            self.state["cells_next"] = step + 1  # the tree is finished: no further cells sum
        else:
            tree = self._replayed_tree(CellsPlan.from_json(cells), members.shape[1])
        if tree.next_query() is not None:
            raise ProtocolError("the cell tree is not complete: the coordinator skipped cells sums; refusing")
        own_Y, _ = tree.landmarks(seed=int(self._run_seed))
        scale = float(np.max(np.abs(own_Y))) if own_Y.size else 1.0
        if Y.shape != own_Y.shape or not np.allclose(Y, own_Y, rtol=1e-9, atol=1e-12 * max(scale, 1e-300)):
            raise ProtocolError(
                "the request's landmarks are not the cell landmarks this site computes from the released sums; refusing"
            )
        if space.kind != "pca" or not (np.array_equal(space.mu, tree.mu) and np.array_equal(space.V, tree.V)):
            raise ProtocolError("the request's landmark space is not the basis this site derived; refusing")
        if gamma is not None and not np.isclose(gamma, 1.0 / max(2.0 * tree.trace, 1e-300), rtol=1e-9):
            raise ProtocolError(f"the request's gamma={gamma} is not the one the cells give; refusing")

    def _cells_upload(self, req: M.SumRequest, task: M.Cells, members: np.ndarray) -> np.ndarray:
        """This site's part of the cell tree's next sum: the query recomputed here (nothing the coordinator chose),
        the disclosure check on this site's records before any sum of features, the upload scaled by the query's
        own public bounds."""
        from ..audits.disclosure import check_tree

        if req.scale_lengths or req.scale_bounds:
            raise ProtocolError(
                "a cells request carries scales: this site derives them from the cells plan itself; refusing"
            )
        tree = self.cell_tree(task, members)
        q = tree.next_query()
        if q is None:
            raise ProtocolError("the cell tree is complete: there is no further cells sum to answer; refusing")
        if q.kind == "sums":
            check_tree(tree.family(tree.features(members), q), tree.plan.floor)
        u = tree.upload(q, members)
        self.state["cells_next"] = int(q.step) + 1  # answered: never again in this run
        self.state["cells_plain"] = req.op == "plain"  # a plain sum's scale may be no public range (others_problem)
        spec = self._live.get("bound_spec")
        if req.op in ("secagg-input", "secagg-start") and spec is not None:
            self.state["cells_secagg_round"] = int(spec.round_index)  # its total is absorbed only with its proof
        else:
            self.state.pop("cells_secagg_round", None)
        scale = np.concatenate([np.full(int(k), float(b)) for k, b in q.parts])
        return u / scale

    def _site_audit_gate(self, req: M.Place) -> None:
        """Before anything per record leaves a cells run, the site applies the membership-audit gate itself to the
        audit's total (relayed with the placement request), with its own limits: site options ``max-auc`` (0.6) and
        ``max-empirical-epsilon`` (1.0); ``require-audit`` (true) refuses a placement without an audit and
        ``allow-audit-failure`` (false) lets its operator override a failing one."""
        from ..audits import AuditPolicy, audit_gate, mia_from_counts

        if req.audit_total is None:
            if truthy(self.options.get("require-audit", True)):
                raise ConfigError(
                    bad_value(
                        "audit",
                        "none",
                        "this site places its records only after a membership "
                        "audit of the landmarks passes (site option require-audit); run with an "
                        "audit hold-out (audit-holdout > 0)",
                    )
                )
            return
        scores = tuple(req.audit_scores or ("nearest", "kde"))
        if self.state.get("audit_secagg_round") is not None:
            from ..securesum.quantize import dequantize

            want = int(self.state["audit_secagg_round"])
            got = self._live.get("verified")
            if got is None or got[0] != want:
                raise ProtocolError(
                    "the audit's total comes without the proof of that SecAgg+ sum; this site applies "
                    "its audit gate only to a total it verified; refusing"
                )
            mine = dequantize(got[1], got[2].fixed_point).reshape(-1)
            if mine.shape != np.shape(req.audit_total) or not np.array_equal(mine, np.ravel(req.audit_total)):
                raise ProtocolError("the relayed audit total is not the total its proof shows; refusing")
        mia = mia_from_counts(req.audit_total, scores, n_sites=1, aggregation="secagg")
        policy = AuditPolicy(
            max_auc=float(self.options.get("max-auc", 0.6)),
            max_empirical_epsilon=float(self.options.get("max-empirical-epsilon", 1.0)),
        )
        dec = audit_gate(mia, policy, allow_failure=True)
        if not dec.passed and not truthy(self.options.get("allow-audit-failure", False)):
            raise ConfigError(
                bad_value(
                    "the membership audit",
                    f"AUC {mia.auc:.3f}",
                    "this site's own audit gate failed ("
                    + "; ".join(str(f) for f in dec.failures)
                    + "): it sends nothing per record; "
                    "its operator may override with the site option allow-audit-failure",
                )
            )

    def _billboard_upload(self, req: M.SumRequest, task, X: np.ndarray) -> tuple[np.ndarray, dict]:
        """One of the DP billboard's releases (:mod:`securefed.landmarks.merf`): the site's own calibration
        and noise, its own ledger written before the reply leaves. ``X``: the landmarks' members; the density
        (release 3) counts every record of the site, the hold-out too."""
        from .privacy import site_billboard_release

        if task.release == 2:
            X = self.records()
        F = task.space.features(X)
        u, events = site_billboard_release(
            M.encode_task(task), F, self.options, int(req.site), self._dp_cache(), len(X), req.op
        )
        self._save_dp_cache()
        return _scale_parts(u, req), {"dp_events": events}

    def _refuse_without_dp(self, what: str) -> None:
        """A site whose operator set ``require-dp = true`` releases nothing about its records without DP."""
        if truthy(self.options.get("require-dp", False)):
            raise ConfigError(
                bad_value(
                    "differential privacy",
                    "off",
                    f"this site requires DP (site option require-dp) "
                    f"and refuses {what}; run with epsilon and clip-norm (and rows-epsilon for rows)",
                )
            )

    def _dp_upload(self, req: M.SumRequest, task, X: np.ndarray, g) -> tuple[np.ndarray, dict]:
        """A differentially private upload: the site's own mechanism, clipped records, noise, ledger first."""
        from ..accounting import clip_records
        from ..landmarks.feddl import client_update, mmd_grad
        from .privacy import release_events, site_mechanism, site_settle

        plan = task.dp
        site = int(req.site)
        if plan["noise"] == "distributed" and req.op == "plain":
            raise ConfigError(
                bad_value(
                    "aggregation",
                    "plain",
                    "this site adds only a share of the noise (distributed): "
                    "it sends that upload only into a secure sum (secagg / ckks)",
                )
            )
        gp = site_mechanism(plan, self.options, site, self._dp_cache())
        self._save_dp_cache()
        if plan.get("distributed_mechanism"):
            return self._integer_upload(req, task, plan, gp, X, g)
        site_settle(gp, site, task.dp_settle or [])
        Xc, _ = clip_records(X, gp.tau_x)  # how many were clipped stays on the site (a count of its records)
        Y = task.Y
        if Y.shape[1] != X.shape[1]:
            raise ConfigError(bad_value("landmarks.shape", Y.shape, f"this site has {X.shape[1]} features"))
        _check_request_against_plan(task, plan, gp, site, len(X), Y)
        rnd = int(task.round)
        if isinstance(task, M.Model):
            u = client_update(Xc, Y, gp.gamma, float(task.lr), gp.local_steps, privacy=gp, site=site, round=rnd, rng=g)
            steps = list(range(gp.local_steps))
        else:
            t = int(task.step)
            Xb, n_norm = gp.batch(site, rnd, t, Xc, g)
            u = gp.perturb(mmd_grad(Xb, Y, gp.gamma, n_norm=n_norm), site=site, round=rnd, step=t)
            steps = [t]
        # the ledger events are on disk (fsync'd) before this returns, i.e. before the reply leaves
        return u, {"dp_events": release_events(gp, site, rnd, steps)}

    def _integer_upload(self, req: M.SumRequest, task, plan: dict, gp, X: np.ndarray, g) -> tuple[np.ndarray, dict]:
        """The distributed discrete Gaussian / Skellam release of one FedDL gradient step: the site's own mechanism
        (checked against the coordinator's claims), its weighted gradient encoded to integers mod ``2^bits`` with its
        own integer noise, the ledger written first (:func:`~.privacy.site_integer_release`)."""
        from ..accounting import clip_records
        from ..landmarks.feddl import mmd_grad
        from ..securesum.secagg import decode_spec
        from .privacy import INTEGER_MECHANISMS, release_events, site_integer_mechanism, site_integer_release

        site = int(req.site)
        if plan["distributed_mechanism"] not in INTEGER_MECHANISMS or plan["noise"] != "distributed":
            raise ProtocolError(f"unknown distributed mechanism {plan['distributed_mechanism']!r} in the DP plan")
        if req.op not in ("secagg-start", "secagg-input"):
            raise ConfigError(
                bad_value(
                    "aggregation",
                    req.op.split("-")[0],
                    f"this site's {plan['distributed_mechanism']} "
                    "upload is a vector of integers mod 2^k: it goes only into a SecAgg+ sum (secagg)",
                )
            )
        Xc, _ = clip_records(X, gp.tau_x)  # how many were clipped stays on the site
        Y = task.Y
        if Y.shape[1] != X.shape[1]:
            raise ConfigError(bad_value("landmarks.shape", Y.shape, f"this site has {X.shape[1]} features"))
        _check_request_against_plan(task, plan, gp, site, len(X), Y)
        mech = site_integer_mechanism(plan, gp, site, X.shape[1])
        spec = self._live.get("bound_spec") or decode_spec(req.spec)
        rnd, t = int(task.round), int(task.step or 0)
        Xb, n_norm = gp.batch(site, rnd, t, Xc, g)
        words = site_integer_release(
            gp, mech, plan, mmd_grad(Xb, Y, gp.gamma, n_norm=n_norm), site=site, rnd=rnd, step=t, spec=spec
        )
        return words, {"dp_events": release_events(gp, site, rnd, [t])}

    # ------------------------------------------------------------------------------ dispatch
    def handle(self, fields: dict) -> dict:
        """Answer one request (a flat dict, :mod:`.messages`); a securefed error comes back as ``{"error": ...}``."""
        op = fields.get("op") if isinstance(fields, dict) else None
        self._live["bound_spec"] = None  # the full spec of the SecAgg+ round this request feeds (set by its handler)
        self._live["digest"] = None
        try:
            if op in M.SumRequest.OPS and isinstance(fields, dict):
                from .sums import refuse_server_weight

                refuse_server_weight(fields)  # named before the strict decoder refuses the unknown field
            req = M.decode_request(fields)
            handlers: dict[type, typing.Callable[[typing.Any], dict]] = {
                M.Hello: self._hello,
                M.SumRequest: self._sum,
                M.ProtocolMessages: self._protocol,
                M.SecAggSetup: self._secagg_setup,
                M.CkksEnd: self._ckks_end,
                M.Rows: self._rows,
                M.Place: self._place,
            }
            return handlers[type(req)](req)
        except SecureFedError as exc:
            return {"error": f"{type(exc).__name__}: {exc}"}
        except (KeyError, TypeError, ValueError) as exc:  # a malformed request is the sender's fault: refuse it
            return {"error": f"DecodeError: malformed {op!r} request: {type(exc).__name__}: {exc}"}

    def _hello(self, req: M.Hello) -> dict:
        X = self.records()
        members, holdout = self.split(float(req.audit_holdout or 0.0), int(req.seed))
        return M.encode(
            M.HelloReply(
                self.name,
                int(len(members)),
                0 if holdout is None else int(len(holdout)),
                int(X.shape[1]),
                crypto.ed25519_public_bytes(self.identity()),
                self.guards(),
            )
        )

    def guards(self) -> dict:
        """The site's own conditions that the run's guarantee against a deviating coordinator rests on (reported at
        hello, for the report; the site enforces them whatever the coordinator does)."""
        from ..securesum.threat import int_option

        return {
            "allow-plain": truthy(self.options.get("allow-plain", False)),
            "allow-paper-mode": truthy(self.options.get("allow-paper-mode", False)),
            "cell-floor": int_option(self.options, "cell-floor", 15),
            "require-audit": truthy(self.options.get("require-audit", True)),
            "allow-audit-failure": truthy(self.options.get("allow-audit-failure", False)),
            "require-dp": truthy(self.options.get("require-dp", False)),
            "allow-distributed-noise": truthy(self.options.get("allow-distributed-noise", False)),
        }

    def _refuse_paper_mode(self, what: str) -> None:
        """Uploads no site can check — FedDL's non-private landmark updates and statistics at landmarks the coordinator
        chose, and rows from raw records (which give the records back) — only with the operator's consent (site
        option ``allow-paper-mode``, default false): a deviating coordinator would ask for them instead of the
        cells."""
        if not truthy(self.options.get("allow-paper-mode", False)):
            raise ConfigError(
                bad_value(
                    "site option allow-paper-mode",
                    False,
                    f"this site refuses {what}: its result "
                    "is not something it can recompute or verify (the paper's FedDL / rows mode); "
                    "its operator can allow it with allow-paper-mode=true, or run the default "
                    "cells, or add differential privacy (epsilon)",
                )
            )

    def _sum(self, req: M.SumRequest) -> dict:
        if req.op == "plain":
            return self._plain(req)
        if req.op == "secagg-start":
            return self._secagg_start(req)
        if req.op == "secagg-input":
            return self._secagg_input(req)
        return self._ckks(req)

    def _plain(self, req: M.SumRequest) -> dict:
        if not truthy(self.options.get("allow-plain", False)):
            raise ConfigError(
                bad_value(
                    "aggregation",
                    "plain",
                    "this site sends its uploads only into a secure sum "
                    "(secagg or ckks): with plain aggregation the coordinator would see each one. "
                    "Its operator can allow it with the site option allow-plain=true",
                )
            )
        digest = M.upload_digest(req, self._cells_binding(req))
        if digest in list(self.state.get("answered", [])):
            raise ProtocolError(
                "this site has sent its upload to this very sum already (the same request): a sum is "
                "answered once; refusing"
            )
        u, extra = self.upload(req)
        self._answered(digest)
        return M.encode(M.UploadReply(u, self.weight(req), extra.get("dp_events")))

    # ------------------------------------------------------------------------------ SecAgg+
    def _store_client(self, client, spec_bytes: bytes, part: str) -> None:
        """Keep a round's client machine (and which spec it runs under: its setup part, or the full spec) in the
        state, by round. A finished round is kept until its proof arrives — the last one only; an aborted round is
        forgotten."""
        r = int(client.spec.round_index)
        if client.state == "aborted":
            self._forget_round(r)
            return
        if client.state == "done":
            last = self.state.get("secagg/last")
            if last is not None and int(last) != r:
                self._forget_round(int(last))
            self.state["secagg/last"] = r
            if f"secagg/{r}/digest" in self.state:  # its unmask shares are out: the sum can be revealed
                self._answered(self.state.pop(f"secagg/{r}/digest"))
        from ..securesum.secagg_codec import dump_client

        self.state[f"secagg/{r}/client"] = dump_client(client)
        self.state[f"secagg/{r}/spec"] = bytes(spec_bytes)
        self.state[f"secagg/{r}/part"] = part
        self.save_rng(client._rng)

    def _forget_round(self, r: int) -> None:
        for k in ("client", "spec", "part", "digest"):
            self.state.pop(f"secagg/{int(r)}/{k}", None)

    def _load_client(self, r: int):
        """``(client, spec bytes, part)`` of the stored round ``r`` (:class:`ProtocolError` when there is none)."""
        from ..securesum.secagg import decode_setup, decode_spec
        from ..securesum.secagg_codec import load_client

        key = f"secagg/{int(r)}/client"
        if key not in self.state:
            raise ProtocolError(f"no SecAgg+ round {r} in progress on this site (restarted, or never set up)")
        raw, part = bytes(self.state[f"secagg/{r}/spec"]), str(self.state[f"secagg/{r}/part"])
        spec = decode_setup(raw) if part == "setup" else decode_spec(raw)
        return load_client(self.state[key], spec, self.identity()), raw, part

    def _secagg_setup(self, req: M.SecAggSetup) -> dict:
        """Prepare SecAgg+ rounds before their inputs exist (late-bound schedule): each setup part checked against
        this site's floors before anything is made, then one client per round (fresh keys) and its AdvertiseKeys."""
        from ..securesum.secagg import decode_setup
        from ..securesum.secagg_client import SecAggClient
        from ..securesum.threat import check_secagg_spec

        self._pin_seed(req.seed)
        site = int(req.site)
        setups = [decode_setup(b) for b in req.setups]
        floors = [check_secagg_spec(sp, self.options) for sp in setups]  # all of them before any key is made
        g = self.rng(int(req.seed), site)
        out: list = []
        for blob, sp, fl in zip(req.setups, setups, floors):
            client = SecAggClient(
                sp,
                site,
                self.identity(),
                random_state=g,
                min_survivors=min(fl.min_survivors, sp.n_clients),
                colluders=fl.colluders,
            )
            out += client.start()
            self._store_client(client, blob, "setup")
        return M.encode(M.ProtocolReply(out))

    def _verify_proof(self, proof: bytes | None, proof_round: int | None) -> None:
        """Check the proof of this site's last SecAgg+ sum (it rides on the next request): the total is the sum of
        the survivors' signed inputs, recomputed here; the verified words are kept for the checks that read the
        total (the cells, the audit gate)."""
        if proof is None:
            return
        last = self.state.get("secagg/last")
        if last is None or proof_round is None or int(proof_round) != int(last):
            raise ProtocolError(
                f"the request carries the proof of SecAgg+ round {proof_round}; this site's last sum "
                f"was round {last}; refusing"
            )
        client, raw, _ = self._load_client(int(last))
        words = client.verify_sum(bytes(proof))
        self._live["verified"] = (int(last), words, client.spec)
        self.state["secagg/verified"] = int(last)

    def check_digest(self, digest: bytes, req: M.SumRequest, binding: dict | None = None) -> None:
        """Refuse a secure sum whose spec names another task than the request this site received (with, for the cells,
        the query this site derived itself) — before anything is computed — and a sum this site has answered already
        (the same digest: asked again, e.g. of a subset of the sites, its difference with the first would isolate
        the missing sites' uploads)."""
        mine = M.upload_digest(req, binding)
        if bytes(digest) != mine:
            raise ProtocolError(
                "the secure sum's task digest is not the digest of the request this site received (and "
                "of the query it derived): the coordinator sent this site another request than the one "
                "the round signs; refusing before anything is computed"
            )
        if mine in list(self.state.get("answered", [])):
            raise ProtocolError(
                "this site has revealed its upload to this very sum already (the same task digest): a "
                "sum is answered once; refusing"
            )
        self._live["digest"] = mine  # recorded as answered once the sum can be revealed (_answered)

    def _answered(self, digest: bytes | None) -> None:
        """Record a sum as answered: from now on the coordinator can hold it (a plain upload, a CKKS ciphertext, the
        unmask shares of a SecAgg+ round)."""
        if digest is not None:
            self.state["answered"] = list(self.state.get("answered", [])) + [bytes(digest)]

    def _secagg_input(self, req: M.SumRequest) -> dict:
        """Late-bound SecAgg+: the prepared round ``round_index`` receives its forwarded shares, the proof of the
        previous sum is checked, the input part's task digest is checked against this request (and the cells query
        derived here), the round checked against the site's floors with the full spec — then the upload."""
        from ..securesum.secagg import decode_input
        from ..securesum.threat import check_secagg_spec, int_option
        from .sums import dp_min_survivors, request_dp_plan

        self._pin_seed(req.seed)
        if req.spec is None or req.round_index is None:
            raise DecodeError("malformed 'secagg-input' message: it needs spec (the input part) and round_index")
        self._verify_proof(req.proof, req.proof_round)
        client, raw, part = self._load_client(int(req.round_index))
        if part != "setup" or client.schedule != "late":
            raise ProtocolError(f"SecAgg+ round {req.round_index} was not prepared for a late-bound input; refusing")
        for data in req.msgs or []:
            client.receive(bytes(data))
        if client.state != "ready":
            raise ProtocolError(f"SecAgg+ round {req.round_index} is not ready for its input (state {client.state!r})")
        inp = decode_input(req.spec)
        binding = self._cells_binding(req)
        self.check_digest(inp.task_digest, req, binding)
        spec = client.spec.bind(inp)
        weight = self.weight(req)
        dp = request_dp_plan(req.task) or {}
        if spec.integer != bool(dp.get("distributed_mechanism")):
            raise ProtocolError(
                f"the SecAgg+ round {'sums integers' if spec.integer else 'uses the fixed-point codec'} but "
                f"the request's upload is {'an integer encoding' if not spec.integer else 'real-valued'}; "
                "refusing"
            )
        if spec.integer:
            weight = 1.0
        floors = check_secagg_spec(spec, self.options, weight=weight, dp_t=dp_min_survivors(dp or None))
        self._live["bound_spec"] = spec
        u, extra = self.upload(req)
        dp_floor = _dp_min_survivors(req.task, spec.n_clients, int_option(self.options, "dp-colluders", 0))
        floor = max(floors.min_survivors, dp_floor)
        if isinstance(req.task, M.Cells):
            floor = spec.n_clients  # every cells sum over the same sites (a sum over fewer would isolate the rest)
        msgs = client.provide_input(inp, np.ravel(u), weight, min_survivors=min(floor, spec.n_clients))
        from ..securesum.secagg import encode_spec

        self.state[f"secagg/{int(req.round_index)}/digest"] = self._live.get("digest")
        self._store_client(client, encode_spec(spec), "full")
        reply = M.ProtocolReply(msgs, dp_events=extra.get("dp_events"))
        return M.encode(reply if spec.integer else dataclasses.replace(reply, secagg_clipped=int(client.clipped)))

    def _secagg_start(self, req: M.SumRequest) -> dict:
        """Check the announced SecAgg+ round against this site's floors (:mod:`securefed.securesum.threat`) —
        before anything is computed — then compute the upload with the site's own weight and start the client
        (the construction schedule: the whole spec and the input at once)."""
        from ..securesum.secagg import decode_spec
        from ..securesum.secagg_client import SecAggClient
        from ..securesum.threat import check_secagg_spec, int_option
        from .sums import dp_min_survivors, request_dp_plan

        if req.spec is None:
            raise DecodeError("malformed 'secagg-start' message: missing field 'spec'")
        self._verify_proof(req.proof, req.proof_round)
        spec = decode_spec(req.spec)
        self.check_digest(spec.task_digest, req, self._cells_binding(req))
        site = int(req.site)
        weight = self.weight(req)
        dp = request_dp_plan(req.task) or {}
        integer_plan = bool(dp.get("distributed_mechanism"))
        if spec.integer != integer_plan:  # before anything is computed or booked
            raise ProtocolError(
                f"the SecAgg+ round {'sums integers' if spec.integer else 'uses the fixed-point codec'} but "
                f"the request's upload is {'an integer encoding' if integer_plan else 'real-valued'}; refusing"
            )
        if spec.integer:
            weight = (
                1.0  # integer inputs come weighted by their encoder (its own weight, from the public plan it checked)
            )
        floors = check_secagg_spec(spec, self.options, weight=weight, dp_t=dp_min_survivors(dp or None))
        self._live["bound_spec"] = spec
        u, extra = self.upload(req)
        g = self.rng(int(req.seed), site)
        dp_floor = _dp_min_survivors(req.task, spec.n_clients, int_option(self.options, "dp-colluders", 0))
        floor = max(floors.min_survivors, dp_floor)
        if isinstance(req.task, M.Cells):
            floor = spec.n_clients
        client = SecAggClient(
            spec,
            site,
            self.identity(),
            np.ravel(u),
            weight,
            g,
            min_survivors=min(floor, spec.n_clients),
            colluders=floors.colluders,
        )
        msgs = client.start()
        self.state[f"secagg/{spec.round_index}/digest"] = self._live.get("digest")
        self._store_client(client, bytes(req.spec), "full")
        return M.encode(M.ProtocolReply(msgs, dp_events=extra.get("dp_events")))

    def _protocol(self, req: M.ProtocolMessages) -> dict:
        if req.op == "ckks-msgs":
            from .sums import site_handle_ckks

            return site_handle_ckks(req, self, None)
        from ..securesum.messages import peek_header

        out: list = []
        clipped = None
        by_round: dict = {}
        for data in req.msgs:
            try:
                by_round.setdefault(int(peek_header(bytes(data))[2]), []).append(bytes(data))
            except SecureFedError:
                raise
            except Exception as exc:
                raise DecodeError(f"malformed SecAgg+ message: {exc}") from None
        for r, msgs in sorted(by_round.items()):
            client, raw, part = self._load_client(r)
            try:
                for data in msgs:
                    out += client.receive(data)
            finally:
                self._store_client(client, raw, part)
            if part == "full" and not client.spec.integer:
                clipped = int(client.clipped)
        return M.encode(M.ProtocolReply(out, secagg_clipped=clipped))

    def _ckks(self, req: M.SumRequest) -> dict:
        from .sums import site_handle_ckks

        extras: dict = {}

        def upload(r):
            u, extra = self.upload(r)
            extras.update(extra)
            self._answered(self._live.get("digest"))  # the ciphertext goes out with this reply
            return u, self.weight(r)

        reply = site_handle_ckks(req, self, upload)
        return {**reply, **extras} if "error" not in reply else reply

    def _ckks_end(self, req: M.CkksEnd) -> dict:
        from .sums import site_handle_ckks

        return site_handle_ckks(req, self, None)

    def _rows(self, req: M.Rows) -> dict:
        """The paper's rows: one row per record (all records, file order) — ``D²(X, Y)`` or ``K(X, Y)``; with
        ``rows_dp`` from the records clipped to τ_X plus Gaussian noise (Qiao et al. §5.1), ledger first."""
        from ..kernels import gaussian_kernel, sq_dists

        X = self.records()
        site = int(req.site)
        Y = req.Y
        if Y.ndim != 2 or Y.shape[1] != X.shape[1]:
            raise ConfigError(bad_value("landmarks.shape", Y.shape, f"this site has {X.shape[1]} features"))
        if req.kind not in ("distance", "kernel"):
            raise ProtocolError(f"unknown rows kind {req.kind!r}; expected 'distance' or 'kernel'")
        event = report = None
        if req.rows_dp is None:
            self._refuse_without_dp("rows from raw records")
            self._refuse_paper_mode("rows from raw records")
        else:
            from ..accounting import DataPerturbation
            from .privacy import open_site_ledger

            rp = req.rows_dp
            ledger = open_site_ledger(rp, self.options, self._dp_cache())
            self._save_dp_cache()
            seed = rp.get("noise_seed")
            dp = DataPerturbation(
                rp["epsilon"],
                delta=rp["delta"],
                tau_x=rp["tau_x"],
                ledger=ledger,
                insecure_noise_seed_for_testing=None if seed is None else int(seed) + site,
            )
            X = dp.perturb_site(X, site=site)
            event, report = ledger.releases_at(site, None, None)[-1], dp.report()
        R = gaussian_kernel(X, Y, float(req.gamma)) if req.kind == "kernel" else sq_dists(X, Y)
        return M.encode(M.RowsReply(R, event, report))

    def _progress(self, n_records: int):
        """``progress(done, total)`` for a long local computation: a ``"placement"`` event to :attr:`on_progress`
        (the in-process run's ``on_event``; a Flower site has none), or None."""
        if self.on_progress is None:
            return None
        name, hook = self.name, self.on_progress
        return lambda done, total: hook(
            {"event": "placement", "site": name, "records": int(n_records), "done": int(done), "total": int(total)}
        )

    def _place(self, req: M.Place) -> dict:
        """No-rows mode: place this site's records (all of them, file order) against the coordinator's landmark map,
        using nothing but that broadcast and its own records; return the coordinates / labels, or keep them."""
        from ..embedding import placement

        self._pin_seed(req.seed)
        if self.state.get("placed"):
            raise ProtocolError(
                "this site has placed its records in this run already (once per run: placements "
                "against other maps would reveal more of each record); refusing"
            )
        members = self.members(req)
        self._verify_proof(req.proof, req.proof_round)
        self._check_landmarks(req.cells, req.previous, req.Y, req.space, members)
        if self.state.get("cells_plan") is not None:
            self._site_audit_gate(req)
        self.state["placed"] = True
        F = req.space.features(self.records())
        Y = req.Y
        if Y.ndim != 2 or Y.shape[1] != F.shape[1]:
            raise ConfigError(bad_value("landmarks.shape", Y.shape, f"the landmark space has {F.shape[1]} dimensions"))
        if req.method == "spectral":
            from ..embedding.stages import spectral_assign

            if req.landmark_labels is None or req.n_clusters is None or req.kernel_gamma is None:
                raise DecodeError(
                    "malformed 'place' message: spectral placement needs landmark_labels, n_clusters and kernel_gamma"
                )
            lab_y = np.asarray(req.landmark_labels, dtype=np.int64)
            k = int(req.n_clusters)
            if lab_y.shape != (len(Y),) or lab_y.min(initial=0) < 0 or lab_y.max(initial=0) >= k:
                raise ProtocolError("landmark labels do not match the landmarks / n_clusters")
            out = spectral_assign(F, Y, float(req.kernel_gamma), lab_y, k)
            reply = M.PlaceReply(labels=[int(v) for v in out])
        else:
            E = req.landmark_embedding
            if E is None or E.shape[0] != len(Y):
                raise ProtocolError("the landmark map does not match the landmarks")
            if req.method == "tsne":
                if req.masses is None or req.Zn is None or req.perplexity is None:
                    raise DecodeError("malformed 'place' message: t-SNE placement needs masses, Zn and perplexity")
                out = placement.place_refine(
                    F,
                    Y,
                    E,
                    req.masses,
                    float(req.Zn),
                    perplexity=float(req.perplexity),
                    progress=self._progress(len(F)),
                )
            elif req.method == "umap":
                out = placement.place_weighted(F, Y, E, perplexity=2.0)
            else:
                raise ProtocolError(f"unknown placement method {req.method!r}; expected 'tsne', 'umap' or 'spectral'")
            reply = M.PlaceReply(embedding=out)
        if req.keep:
            self.kept = np.asarray(out)  # the site's own result: it stays here (coordinates keep)
            path = self.options.get("output-path")
            if path:
                import os

                os.makedirs(str(path), exist_ok=True)
                np.save(os.path.join(str(path), f"{self.name}-embedding.npy"), self.kept)
            return M.encode(M.PlaceReply(kept=int(len(out))))
        if self._ids is not None and truthy(self.options.get("send-record-ids", False)):
            # the site's own choice: ids name who is in its data
            reply = dataclasses.replace(reply, record_ids=[str(v) for v in self._ids])
        return M.encode(reply)


def _check_total_against_own(
    q, tree, total: np.ndarray, members: np.ndarray, rounding: float, bounded: bool = True
) -> None:
    """What a site can check of a relayed cells total on its own (the tree itself checks that children add up to
    their parent): the other sites' part of it is a sum of records in the public range — every count at least this
    site's own, every sum of features one that records could give (:meth:`CellTree.others_problem`). A forged total
    that passes is caught by the proof of the secure sum where there is one; a site that fabricates in-range records
    is not caught (docs/threat-model.md §3.9)."""
    bad = tree.others_problem(q, total, members, rounding, bounded)
    if bad:
        raise ProtocolError(
            f"the relayed cells total is no sum of in-range records: {bad}; refusing (a site that "
            "fabricates uploads beyond records of its declared size is caught here)"
        )


def _scale_parts(u: np.ndarray, req: M.SumRequest) -> np.ndarray:
    """Divide each consecutive part of an upload by its public bound (``scale_lengths[i]`` coordinates bounded by
    ``scale_bounds[i]``), so the secure sum's fixed-point range is used well; the coordinator multiplies back."""
    lengths, bounds = req.scale_lengths, req.scale_bounds
    if not lengths and not bounds:
        return u
    u = np.ravel(np.asarray(u, dtype=np.float64))
    try:
        if lengths is None or bounds is None or len(lengths) != len(bounds):
            raise ValueError(f"{len(lengths or [])} lengths for {len(bounds or [])} bounds")
        scale = np.concatenate([np.full(int(k), float(b)) for k, b in zip(lengths, bounds)])
    except (TypeError, ValueError) as exc:
        raise DecodeError(f"malformed scale_lengths / scale_bounds: {exc}") from None
    if scale.shape != u.shape or not np.all(scale > 0):
        raise DecodeError(
            f"scale_lengths / scale_bounds cover {scale.size} coordinates with positive bounds; the upload has {u.size}"
        )
    return u / scale


def _dp_min_survivors(task, n_clients: int, colluders: int = 0) -> int:
    """Under distributed noise a site helps unmask only sums over at least the plan's t sites (else 1).

    With ``colluders`` = c (site option ``dp-colluders``) the floor is t + c: colluding survivors can leave
    their noise share out, so only |U| − c shares are certain (docs/threat-model-secure-sum.md); the site
    refuses such a round before computing when t + c exceeds the sites (:mod:`securefed.securesum.threat`).
    """
    from .sums import dp_min_survivors, request_dp_plan

    t = dp_min_survivors(request_dp_plan(task))
    if not t:
        return 1
    return min(t, int(n_clients)) if not colluders else t + int(colluders)


def _check_request_against_plan(task, plan: dict, gp, site: int, n_records: int, Y: np.ndarray) -> None:
    """Refuse a DP request whose numbers disagree with what the site's noise was calibrated for.

    The site's σ comes from the public plan (its record count, γ, n_y, S, Q, the rule); a server that
    announced other numbers in the plan than it uses in the request — e.g. 100× this site's record count,
    or a small γ in the plan and a large one in the request — would shrink the site's noise below what its
    data needs. So the site checks its own record count, and computes with the plan's γ and Q itself.
    """
    from . import messages as M

    if int(plan["sizes"][site]) != int(n_records):
        raise ProtocolError(
            f"the DP plan announces {plan['sizes'][site]} records for this site, which holds {n_records} "
            "(its noise would be calibrated for the wrong count); refusing"
        )
    if not np.isclose(float(task.gamma), gp.gamma, rtol=1e-12, atol=0.0):
        raise ProtocolError(f"the request's gamma={task.gamma} differs from the DP plan's {gp.gamma}; refusing")
    if Y.shape[0] != gp.n_landmarks:
        raise ProtocolError(f"the request carries {Y.shape[0]} landmarks, the DP plan {gp.n_landmarks}; refusing")
    if task.NAME != gp.rule:
        raise ProtocolError(f"the request asks for a {task.NAME!r} upload, the DP plan for rule {gp.rule!r}; refusing")
    if isinstance(task, M.Model) and int(task.local_steps) != gp.local_steps:
        raise ProtocolError(
            f"the request asks for {task.local_steps} local steps, the DP plan for {gp.local_steps}; refusing"
        )
    if task.round is None:
        raise DecodeError("malformed DP upload request: missing field 'round'")
    rnd = int(task.round)
    step = int(task.step or 0)
    if not (0 <= rnd < gp.rounds and 0 <= step < gp.local_steps):
        raise ProtocolError(
            f"release (round {rnd}, step {step}) is outside the DP plan's {gp.rounds} rounds × "
            f"{gp.local_steps} steps; refusing"
        )
