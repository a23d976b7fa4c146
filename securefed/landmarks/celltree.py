"""The cell tree: the default landmarks, a deterministic function of a pinned plan and of verified sums.

Every quantity the tree needs is one secure sum over the sites, and every *next* sum is a function of the plan and
of the sums released so far — nothing else. So the coordinator and **every site** run this same code
(:class:`CellTree`): each site recomputes the next query itself and computes its upload from it; nobody chooses
centres, splits, cells, the space or the floor (``docs/threat-model.md`` §2).

The queries, in order (one secure sum each):

0. **basis** — ``[n_p, Σx/B, Σxxᵀ/B²]`` over every site's members (:func:`~.cells.site_moments`): the global mean μ and
   the top principal axes V (:func:`~.cells.pca_basis`), rounded to float32 (:func:`public_round`) so that every party
   derives the same numbers; a record's features are ``f = (x − μ)V``. The root cell (all members) gets its count,
   sum (0) and second moments from the same sum.
1. **counts of level L** — for every cell of the frontier, how many records fall in each of its children: the cell
   splits through its mean along its top principal axis (2 children) or its top two axes (4 children: the quadrants),
   the axes from the cell's own released covariance (:func:`split_axes`). Each record of the cell goes to the
   child on its side of each hyperplane (:func:`child_index`).
2. **sums of level L** — for every split that is *accepted*, each child's ``Σf`` and ``Σf²`` (coordinate by
   coordinate), and its second moments ``Σggᵀ`` (upper triangle) of ``g = Uf`` on the top r principal axes U of its
   parent, with r = :func:`second_rank` of the child's count (r = d, the full ``Σffᵀ``, only for large cells).
   Exact second moments of a small cell give its members away: the centred ``Σffᵀ`` of m ≤ d records spans exactly
   their (m − 1)-dimensional subspace, so a member's features lie in it and a non-member's do not, and for m a
   little above d a member's leverage under the cell's covariance is visibly below a non-member's. Per-coordinate
   sums of squares carry no more about one record than its cell's mean does (docs/maths.md §12).

A split is accepted only when **every** child holds at least ``floor`` records (a 4-way split that fails falls back
to the 2-way split along the first axis, whose counts are sums of the quadrants' counts); otherwise the cell stays a
leaf. Children partition their parent, so the released cells form a **laminar family** and the smallest sets of
records any combination of released sums isolates are its *atoms* — a released cell minus its released children —
which are empty (an accepted split) or a leaf holding ≥ ``floor`` records. This is the property each site checks on
its own records before it answers (:mod:`securefed.audits.disclosure`). (Unlike k-means, whose cells move between
rounds, so that two successive sums can differ by a single record.)

The landmarks are the leaves' means (their masses the leaves' counts) and, with ``axes`` = R > 0, each leaf's axis
points μ ± √λ_j·v_j (:func:`~.cells.axis_points`).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field

import numpy as np

from ..errors import ConfigError, DecodeError, ProtocolError, bad_value
from .cells import axis_points, pca_basis

__all__ = ["CellsPlan", "CellTree", "Query", "public_round", "split_axes", "best_cut", "bin_edges", "tri_len"]

#: fewest cells a map is drawn from (the landmark t-SNE needs a perplexity (k − 1)/3 above 1)
MIN_CELLS = 5


def public_round(a) -> np.ndarray:
    """Round a derived public number to float32 (and back to float64): parties whose linear algebra differs in the
    last bits (thread counts, BLAS builds) still derive the same splits, so their queries — and digests — agree."""
    return np.asarray(np.asarray(a, dtype=np.float64).astype(np.float32), dtype=np.float64)


def tri_len(d: int) -> int:
    return d * (d + 1) // 2


def _tri(Q: np.ndarray) -> np.ndarray:
    """Upper triangle (row-major) of a symmetric d × d matrix, or of a stack of them."""
    d = Q.shape[-1]
    iu = np.triu_indices(d)
    return Q[..., iu[0], iu[1]]


def _untri(t: np.ndarray, d: int) -> np.ndarray:
    iu = np.triu_indices(d)
    Q = np.zeros(t.shape[:-1] + (d, d))
    Q[..., iu[0], iu[1]] = t
    Q[..., iu[1], iu[0]] = t
    return Q


#: the constant c of second_rank's r + c·r^1.5 ≤ m (8: the leverage signal of a whole root-to-leaf path stays small)
SECOND_RANK_C = 8.0


def second_rank(count: float, d: int) -> int:
    """How many dimensions r of a cell of ``count`` records may have their second moments released: the largest
    r ≤ d with ``r + c·r^1.5 ≤ count``, c = ``SECOND_RANK_C`` (0 for the tiniest cells).

    For a Gaussian cell of m records, a record's leverage ``(g − m̂)ᵀ S⁻¹ (g − m̂)`` under the released r × r scatter S
    is about r/m for a member and r/(m − r) for a non-member, with a spread of about √(2r)/m: a signal-to-noise ratio
    of r^1.5 / (√2 (m − r)) ≤ 1/(c√2) per released cell. A record's path from the root to its leaf crosses up to
    ``max_levels`` released cells, whose signals add up in quadrature: with c = 8, √12/(8√2) = 0.31 < 0.36 (a
    membership AUC below 0.6, the audit's limit) for up to 12 levels; measured on 1 000 50-dimensional blob records,
    the whole path's leverage attack has AUC 0.54 at c = 8 against 0.66 at c = 2. (At m ≤ r the centred scatter even
    spans exactly the members' subspace.)"""
    r = 0
    while r < d and (r + 1) + SECOND_RANK_C * (r + 1) ** 1.5 <= float(count):
        r += 1
    return r


def split_axes(cov: np.ndarray, n_axes: int) -> np.ndarray:
    """The top ``n_axes`` principal axes (rows) of a cell's released covariance (:meth:`CellTree.covariance`; a
    diagonal one — a cell with per-coordinate sums of squares only — gives the coordinates of largest variance).

    Each axis is normalised in sign (its largest-magnitude coordinate positive) and rounded (:func:`public_round`),
    so every party derives the same hyperplanes."""
    w, V = np.linalg.eigh((cov + cov.T) / 2.0)
    A = V[:, np.argsort(-w, kind="stable")[:n_axes]].T.copy()
    for a in A:
        if a[np.argmax(np.abs(a))] < 0:
            a *= -1.0
    return public_round(A)


#: histogram bins per axis in a count pass (the outer two are open-ended)
BINS = 12
#: the inner bin edges span ±EDGE standard deviations of the cell along the axis
EDGE = 2.5


def bin_edges(second_along: float, count: float) -> np.ndarray:
    """The public inner bin edges along one axis of a cell (BINS − 1 edges, ±EDGE·σ around the cell's centre), from
    the cell's released variance along the axis; rounded like every derived public number."""
    sd = math.sqrt(max(float(second_along), 0.0))
    return public_round(np.linspace(-EDGE * sd, EDGE * sd, BINS - 1))


def projections(F: np.ndarray, centre: np.ndarray, axes: np.ndarray) -> np.ndarray:
    return (np.asarray(F) - centre) @ axes.T


def histogram_index(P: np.ndarray, edges: list) -> np.ndarray:
    """Flat bin index of each record's projections (one column per axis) on the cell's public grid."""
    idx = np.zeros(len(P), dtype=np.int64)
    for j, e in enumerate(edges):
        idx = idx * BINS + np.searchsorted(e, P[:, j], side="right")
    return idx


def best_cut(hist: np.ndarray, floor: int) -> int | None:
    """The cut of a 1-D histogram (records in bins < cut go left) that maximises the between-side variance of the
    bin positions (Otsu's criterion: the 1-D two-means split), among the cuts that leave ≥ ``floor`` records on each
    side; None when there is none. Ties go to the cut nearest the middle, then the lower one."""
    h = np.asarray(hist, dtype=np.float64)
    x = np.arange(len(h), dtype=np.float64)
    n = h.sum()
    best, best_score = None, -1.0
    for c in range(1, len(h)):
        n0, n1 = h[:c].sum(), h[c:].sum()
        if n0 < floor or n1 < floor:
            continue
        m0, m1 = (h[:c] * x[:c]).sum() / n0, (h[c:] * x[c:]).sum() / n1
        score = round(n0 * n1 / (n * n) * (m1 - m0) ** 2, 9)
        if score > best_score or (score == best_score and abs(c - len(h) / 2) < abs(best - len(h) / 2)):
            best, best_score = c, score
    return best


@dataclass(frozen=True)
class CellsPlan:
    """The public, pinned parameters of the cell tree (every site refuses a run whose plan changes)."""

    floor: int
    basis_dim: int
    max_cells: int
    max_levels: int
    scale: float
    n_max: int
    standardize: bool = False
    axes: int = 0
    margin: float = 2.0
    version: int = 1

    def __post_init__(self):
        if int(self.floor) < 2:
            raise ConfigError(bad_value("cell-floor", self.floor, "use at least 2"))
        if int(self.basis_dim) < 1 or int(self.max_cells) < 1 or int(self.max_levels) < 1:
            raise ConfigError(bad_value("cells plan", asdict(self), "basis_dim, max_cells and max_levels must be ≥ 1"))
        if not (math.isfinite(float(self.scale)) and float(self.scale) > 0):
            raise ConfigError(bad_value("value-bound", self.scale, "give a positive public bound"))
        if self.version != 1:
            raise DecodeError(f"cells plan version {self.version} is not 1")

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, doc) -> "CellsPlan":
        if not isinstance(doc, dict):
            raise DecodeError("malformed cells plan: not a JSON object")
        try:
            if set(doc) != {f for f in cls.__dataclass_fields__}:
                raise KeyError(f"fields {sorted(doc)}")
            return cls(
                int(doc["floor"]),
                int(doc["basis_dim"]),
                int(doc["max_cells"]),
                int(doc["max_levels"]),
                float(doc["scale"]),
                int(doc["n_max"]),
                bool(doc["standardize"]),
                int(doc["axes"]),
                float(doc["margin"]),
                int(doc["version"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise DecodeError(f"malformed cells plan: {exc}") from None

    def digest(self) -> str:
        return json.dumps(self.to_json(), sort_keys=True)


@dataclass
class _Node:
    path: tuple  # () root; (2, 1): child 1 of child 2 of the root
    count: float
    mean: np.ndarray  # in the basis (f coordinates)
    second: np.ndarray | None = None  # Σffᵀ (d × d): the root only (from the basis sum)
    diag: np.ndarray | None = None  # Σf² per coordinate (d) when released
    proj: tuple | None = None  # (U: r × d public axes, Σ(Uf)(Uf)ᵀ: r × r) when released
    centre: np.ndarray | None = None  # the split's origin and axes (when this cell is on the frontier)
    axes: np.ndarray | None = None
    edges: list | None = None  # the public bin edges along each axis (count pass)
    cut: int | None = None  # accepted split: records in bins < cut along axis 1 go to the first half …
    cuts2: tuple | None = None  # … and each half splits again along axis 2 at its own cut (or not: None)
    children: list = field(default_factory=list)
    leaf: bool = False
    released: bool = False  # its feature sums were released (the root: by the basis sum)
    child_axes: list | None = None  # the public axes of each child's second moments (CellTree._child_axes)


@dataclass(frozen=True)
class Query:
    """One sum of the tree: ``kind`` basis / counts / sums; what each site uploads is :meth:`CellTree.upload`."""

    step: int
    kind: str
    length: int
    parts: tuple  # ((length, public bound per coordinate), …) for the secure sum's scaling
    description: dict  # everything that shapes the upload (centres, axes, which children, which moments)

    def digest_doc(self) -> dict:
        return {
            "step": self.step,
            "kind": self.kind,
            "length": self.length,
            "parts": [list(p) for p in self.parts],
            **self.description,
        }


class CellTree:
    """The cell tree of one run (module docstring): the same object on the coordinator and on every site.

    Drive it with ``q = tree.next_query()`` (None when the tree is complete), each site's ``tree.upload(q, X)``, and
    ``tree.absorb(q, total)`` with the *verified* total of that sum; then ``tree.landmarks()``.

    The plan's ``n_max`` is the largest site's member count (public, from ``hello``): it bounds every coordinate of
    an upload.
    """

    def __init__(self, plan: CellsPlan, n_features: int):
        self.plan = plan
        self.m = int(n_features)
        self.n_max = float(plan.n_max)
        self.d = min(int(plan.basis_dim), self.m)
        self.step = 0
        self.level = 0
        self.mu: np.ndarray | None = None
        self.V: np.ndarray | None = None
        self.trace = 0.0
        self.sd: np.ndarray | None = None
        self.root: _Node | None = None
        self.frontier: list = []  # cells whose children's counts the next query asks
        self.accepted: list = []  # (cell, n_children) whose children's sums the next query asks
        self.done = False
        self.history: list = []  # (query kind, counts) for the result

    # ------------------------------------------------------------------------------ queries
    def next_query(self) -> Query | None:
        """The next sum, a function of the plan and of what was absorbed (None when the tree is complete)."""
        if self.done:
            return None
        B, n = float(self.plan.scale), self.n_max
        if self.root is None:
            m = self.m
            return Query(self.step, "basis", 1 + m + m * m, ((1 + m + m * m, n),), {"scale": B})
        if self.accepted:
            parts, desc = [], []
            r = self._feature_bound()
            R = self._norm_bound()  # |u·f| ≤ ‖f‖ for the unit axes u of a second-moment block
            for cell, k in self.accepted:
                ranks = [len(U) for U in self._child_axes(cell)]
                parts += [(k * self.d, n * r), (k * self.d, n * r * r)]
                parts += [(tri_len(rk), n * R * R) for rk in ranks if rk]
                desc.append(
                    {
                        "cell": list(cell.path),
                        "children": k,
                        "second": ranks,
                        "cut": cell.cut,
                        "cuts2": list(cell.cuts2),
                        "centre": cell.centre.tolist(),
                        "axes": cell.axes.tolist(),
                        "edges": [e.tolist() for e in cell.edges],
                    }
                )
            return Query(
                self.step, "sums", sum(p for p, _ in parts), tuple(parts), {"cells": desc, **self._space_doc()}
            )
        k = sum(BINS ** len(c.axes) for c in self.frontier)
        desc = [
            {
                "cell": list(c.path),
                "centre": c.centre.tolist(),
                "axes": c.axes.tolist(),
                "edges": [e.tolist() for e in c.edges],
            }
            for c in self.frontier
        ]
        return Query(self.step, "counts", k, ((k, n),), {"cells": desc, **self._space_doc()})

    def _space_doc(self) -> dict:
        return {"mu": self.mu.tolist(), "V": self.V.tolist()}

    def _feature_bound(self) -> float:
        """A public bound on |f_j| for a record with |x_i| ≤ B: ‖x − μ‖ ≤ 2B√m and ‖v‖ = 1 (standardised: ×1/σ_min)."""
        B = float(self.plan.scale)
        r = 2.0 * B * math.sqrt(self.m)
        if self.plan.standardize:
            r *= float(np.max(np.abs(self.V))) * math.sqrt(self.m)  # |f_j| ≤ ‖x − μ‖·‖V_j‖ with V = diag(1/σ)·U
        return r

    def _norm_bound(self) -> float:
        """A public bound on ‖f‖ = ‖(x − μ)V‖ for a record with |x_i| ≤ B: 2B√m · ‖V‖₂ (spectral norm; ≈ 1 unless
        standardised)."""
        return 2.0 * float(self.plan.scale) * math.sqrt(self.m) * max(float(np.linalg.norm(self.V, 2)), 1.0)

    def _child_axes(self, cell: _Node) -> list:
        """For each child of an accepted split, the public axes U (r × d) its second moments are released on: the top
        r = :func:`second_rank` (child count) principal axes of the parent (every child releases ``Σf`` and ``Σf²``
        too). Same sets as the sums: the family stays laminar. Computed once per split (a function of released
        numbers)."""
        if cell.child_axes is None:
            out = []
            for c in cell.children:
                r = second_rank(c.count, self.d)
                out.append(split_axes(self.covariance(cell), r) if r else np.zeros((0, self.d)))
            cell.child_axes = out
        return cell.child_axes

    def covariance(self, cell: _Node) -> np.ndarray:
        """A released cell's covariance in the basis: from ``Σffᵀ`` (the root); else its released block on the axes U
        plus, across the rest, the per-coordinate variances from ``Σf²`` (projected off U)."""
        c = max(float(cell.count), 1.0)
        if cell.second is not None:
            cov = cell.second / c - np.outer(cell.mean, cell.mean)
            return (cov + cov.T) / 2.0
        if cell.diag is None:
            raise ProtocolError(f"cell {list(cell.path)} has no released second moments")
        D = np.diag(np.maximum(cell.diag / c - cell.mean**2, 0.0))
        if cell.proj is None or len(cell.proj[0]) == 0:
            return D
        U, Q = cell.proj
        g = U @ cell.mean
        Cr = Q / c - np.outer(g, g)
        P = np.eye(self.d) - U.T @ U
        cov = U.T @ Cr @ U + P @ D @ P
        return (cov + cov.T) / 2.0

    # ------------------------------------------------------------------------------ a site's upload
    def features(self, X: np.ndarray) -> np.ndarray:
        return (np.asarray(X, dtype=np.float64) - self.mu) @ self.V

    def route(self, cell: _Node, F: np.ndarray) -> np.ndarray:
        """Which child of an accepted split each of the cell's records goes to (by its bins on the cell's grid)."""
        P = projections(F, cell.centre, cell.axes)
        b1 = np.searchsorted(cell.edges[0], P[:, 0], side="right")
        side = (b1 >= cell.cut).astype(np.int64)
        out = np.zeros(len(F), dtype=np.int64)
        nxt = 0
        for h in (0, 1):
            c2 = cell.cuts2[h]
            mine = side == h
            if c2 is None:
                out[mine] = nxt
                nxt += 1
            else:
                b2 = np.searchsorted(cell.edges[1], P[mine, 1], side="right")
                out[mine] = nxt + (b2 >= c2)
                nxt += 2
        return out

    def assign(self, F: np.ndarray) -> dict:
        """For every cell of the tree with children: the indices of the records inside each (a dict by path)."""
        out = {(): np.arange(len(F))}
        stack = [self.root]
        while stack:
            cell = stack.pop()
            idx = out[cell.path]
            if not cell.children:
                continue
            ci = self.route(cell, F[idx])
            for j, child in enumerate(cell.children):
                out[child.path] = idx[ci == j]
                stack.append(child)
        return out

    def upload(self, q: Query, X: np.ndarray) -> np.ndarray:
        """This site's vector for query ``q`` from its members ``X`` (before the per-part scaling)."""
        from .cells import site_moments

        if q.kind == "basis":
            return site_moments(np.asarray(X, dtype=np.float64) / float(self.plan.scale))
        F = self.features(X)
        members = self.assign(F)
        return self._counts_upload(F, members) if q.kind == "counts" else self.sums_upload(F, members=members)

    def _counts_upload(self, F: np.ndarray, members: dict) -> np.ndarray:
        """A count pass's vector: each frontier cell's histogram of its records on its public grid."""
        out = []
        for cell in self.frontier:
            idx = members[cell.path]
            hi = histogram_index(projections(F[idx], cell.centre, cell.axes), cell.edges)
            out.append(np.bincount(hi, minlength=BINS ** len(cell.axes)).astype(np.float64))
        return np.concatenate(out)

    def sums_upload(self, F: np.ndarray, values=None, members: dict | None = None) -> np.ndarray:
        """A sums pass's vector for records with features ``F``: per accepted split, each child's Σf, Σf² and its
        block on the public axes. ``values(cell, n)``, when given, replaces the n values summed for ``cell``'s records
        (they keep their children): how ``benchmarks/biased_site.py`` writes a site that crafts in-range records.
        ``members``: :meth:`assign` of ``F`` when the caller has it already."""
        members = self.assign(F) if members is None else members
        out = []
        for cell, k in self.accepted:
            idx = members[cell.path]
            ci = self.route(cell, F[idx])
            Fc = F[idx] if values is None else values(cell, len(idx))
            S = np.zeros((k, self.d))
            np.add.at(S, ci, Fc)
            D2 = np.zeros((k, self.d))
            np.add.at(D2, ci, Fc * Fc)
            out += [S.ravel(), D2.ravel()]
            for j, U in enumerate(self._child_axes(cell)):
                if len(U):
                    G = Fc[ci == j] @ U.T
                    out.append(_tri(G.T @ G))
        return np.concatenate(out) if out else np.zeros(0)

    def family(self, F: np.ndarray, q: Query | None = None) -> list:
        """The laminar family of cells whose feature sums are released — the root (the basis sum) and every child of
        an accepted split — plus, with ``q`` a sums query, the children it is about to release:
        ``[(path, parent path or None, indices of this site's records in the cell, the cell's global count)]`` for
        :func:`securefed.audits.disclosure.check_tree` (the counts came from verified sums)."""
        members = self.assign(F)
        pending = {id(c) for c, _ in self.accepted} if q is not None and q.kind == "sums" else set()
        out: list = []
        stack: list = [(self.root, None)]
        while stack:
            cell, parent = stack.pop()
            out.append((cell.path, parent, members[cell.path], cell.count))
            if cell.children and (cell.children[0].released or id(cell) in pending):
                stack += [(c, cell.path) for c in cell.children]
        return out

    # ------------------------------------------------------------------------------ a site's check of the others' part
    def others_problem(
        self, q: Query, total: np.ndarray, X: np.ndarray, rounding: float = 2.0**-16, bounded: bool = True
    ) -> str | None:
        """What is wrong with the other sites' part ``total − own`` of query ``q`` (``own``: the upload of this site's
        members ``X``), or None: it must be a sum of *records* — as many as the cells' counts leave to the others,
        each inside the public range. A count pass: every count at least this site's own. A sums pass, per child of
        every accepted split with c the others' count: |Σf_i| ≤ c·r and 0 ≤ Σf_i² ≤ c·r² per coordinate,
        Σ_i Σf_i² ≤ c·R² (‖f‖ ≤ R), Cauchy–Schwarz c·Σf_i² ≥ (Σf_i)², and the block on the public axes U positive
        semi-definite with c·Q ⪰ (UΣf)(UΣf)ᵀ; the basis sum the same on the records scaled by the value bound
        (|x_i| ≤ 1). A site that fabricates *records* passes (a fabricated record is a record); an upload no set of
        in-range records gives — inflated sums, negative second moments, moments inconsistent with their counts —
        does not. ``rounding``: the secure sum's largest error per coordinate relative to each part's public bound
        (SecAgg+: active sites × 2⁻ᶠ); ``bounded`` False (plain sums: the plan's scale may be no public range) checks
        only the range-free conditions."""
        total = np.asarray(total, dtype=np.float64).ravel()
        eps = rounding * self.n_max
        if q.kind == "basis":
            m = self.m
            rest = total - self.upload(q, X)
            one = 1.0 if bounded else None
            return _moments_problem(
                float(rest[0]),
                rest[1 : 1 + m],
                rest[1 + m :].reshape(m, m),
                one,
                math.sqrt(m),
                None,
                eps,
                "the basis sum",
            )
        F = self.features(X)
        members = self.assign(F)
        if q.kind == "counts":
            if np.any(total - self._counts_upload(F, members) < -0.5):
                return "a cell count is below this site's own records in that cell"
            return None
        rest = total - self.sums_upload(F, members=members)
        r, R = (self._feature_bound() if bounded else None), self._norm_bound()
        pos = 0
        for cell, k in self.accepted:
            S = rest[pos : pos + k * self.d].reshape(k, self.d)
            pos += k * self.d
            D2 = rest[pos : pos + k * self.d].reshape(k, self.d)
            pos += k * self.d
            for j, (child, U) in enumerate(zip(cell.children, self._child_axes(cell))):
                Q = None
                if len(U):
                    Q = (U, _untri(rest[pos : pos + tri_len(len(U))], len(U)))
                    pos += tri_len(len(U))
                c = float(child.count) - float(len(members.get(child.path, ())))
                bad = _moments_problem(c, S[j], D2[j], r, R, Q, eps, f"cell {list(child.path)}")
                if bad:
                    return bad
        return None

    # ------------------------------------------------------------------------------ absorbing verified sums
    def absorb(self, q: Query, total: np.ndarray) -> None:
        """Take the verified (unscaled) total of query ``q``; advances the tree (:class:`ProtocolError` on a total of
        the wrong shape or one no sum of honest uploads can give)."""
        total = np.asarray(total, dtype=np.float64).ravel()
        if q.step != self.step or total.shape != (q.length,) or not np.all(np.isfinite(total)):
            raise ProtocolError(
                f"cells: a total of shape {total.shape} for step {q.step} (expected {q.length} values "
                f"for step {self.step})"
            )
        self.history.append(q.kind)
        self.step += 1
        if q.kind == "basis":
            self._absorb_basis(total)
        elif q.kind == "counts":
            self._absorb_counts(total)
        else:
            self._absorb_sums(total)

    def _absorb_basis(self, total: np.ndarray) -> None:
        m, B = self.m, float(self.plan.scale)
        n = float(round(total[0]))
        mu, V, trace, sd = pca_basis(total, m, self.d, standardize=self.plan.standardize)
        self.mu = public_round(mu * B)
        self.V = public_round(V / B if self.plan.standardize else V)
        self.trace = float(trace) * (1.0 if self.plan.standardize else B * B)
        self.sd = sd * B
        # the root's second moments in the basis: Vᵀ(Σxxᵀ − n μμᵀ)V (from the same sum)
        Sxx = total[1 + m :].reshape(m, m) * B * B
        Sx = total[1 : 1 + m] * B
        C = Sxx - np.outer(Sx, self.mu) - np.outer(self.mu, Sx) + n * np.outer(self.mu, self.mu)
        second = self.V.T @ C @ self.V
        mean = (Sx - n * self.mu) @ self.V / max(n, 1.0)
        self.root = _Node((), n, mean, (second + second.T) / 2.0, released=True)
        self._set_frontier([self.root])

    def _set_frontier(self, cells: list) -> None:
        p = self.plan
        room = int(p.max_cells) - self._n_leaves()
        front = []
        if self.level < p.max_levels:
            for cell in sorted(cells, key=lambda c: (-c.count, c.path)):
                least = p.margin * self.floor_of(cell)
                if (cell.second is None and cell.diag is None) or cell.count < least or room < 1:
                    cell.leaf = True
                    continue
                n_axes = 2 if (cell.count >= 2 * least and self.d >= 2 and room >= 3) else 1
                cell.centre = public_round(cell.mean)
                cov = self.covariance(cell)
                cell.axes = split_axes(cov, n_axes)
                cell.edges = [bin_edges(float(a @ cov @ a), cell.count) for a in cell.axes]
                room -= (1 << n_axes) - 1
                front.append(cell)
        else:
            for cell in cells:
                cell.leaf = True
        self.frontier = front
        if not front:
            self.done = True

    def floor_of(self, cell) -> int:
        """The least count of each child of ``cell``: the plan's floor, raised with the cell's effective dimension.

        A record's membership in a cell of m records shows in its distance to the cell's mean: in an isotropic
        k-dimensional cell, a member's squared distance is smaller than a non-member's by 2σ²k/m against a spread of
        σ²√(2k), a signal-to-noise ratio √(2k)/m. The effective k is the participation ratio (tr C)² / tr(C²) of the
        cell's released covariance C (public: every party computes it), so the floor is ``DIM_FLOOR · √k`` records per
        mixture landmark (``LANDMARKS_PER_LEAF`` of them per leaf) when that exceeds the plan's floor."""
        p = self.plan
        if DIM_FLOOR <= 0 or (cell.second is None and cell.diag is None) or cell.count <= 0:
            return int(p.floor)
        cov = self.covariance(cell)
        t, t2 = float(np.trace(cov)), float(np.sum(cov * cov))
        k = t * t / t2 if t2 > 0 else 1.0
        return int(max(p.floor, np.ceil(DIM_FLOOR * np.sqrt(k) * LANDMARKS_PER_LEAF)))

    def _n_leaves(self) -> int:
        def count(c):
            return 1 if not c.children else sum(count(x) for x in c.children)

        return count(self.root) if self.root is not None else 0

    def _absorb_counts(self, total: np.ndarray) -> None:
        """Choose each frontier cell's split from its verified histogram: the best cut along axis 1 with ≥ floor records
        on each side (:func:`best_cut`), then — on the 2-axis grid — each half's best cut along axis 2, kept only when
        both its quarters hold ≥ floor; a cell with no admissible cut stays a leaf. Deterministic: every party makes
        the same choice from the same counts."""
        p, pos, accepted = self.plan, 0, []
        room = int(p.max_cells) - self._n_leaves()
        for cell in self.frontier:
            k = BINS ** len(cell.axes)
            h = np.round(total[pos : pos + k])
            pos += k
            if abs(h.sum() - cell.count) > 0.5 or np.any(h < -0.5):
                raise ProtocolError(
                    f"cells: the histogram of cell {list(cell.path)} holds {h.sum():.0f} records, the "
                    f"cell {cell.count:.0f}; the counts are not a sum of honest uploads"
                )
            grid = h.reshape((BINS,) * len(cell.axes))
            marg = grid if grid.ndim == 1 else grid.sum(axis=1)
            floor = self.floor_of(cell)
            cut = best_cut(marg, floor) if room >= 1 else None
            if cut is None:
                cell.leaf, cell.axes, cell.centre, cell.edges = True, None, None, None
                continue
            room -= 1
            halves = [grid[:cut], grid[cut:]]
            cuts2: list = []
            kids: list = []
            for half in halves:
                c2 = best_cut(half.sum(axis=0), floor) if grid.ndim == 2 and room >= 1 else None
                if c2 is None:
                    cuts2.append(None)
                    kids.append(half.sum())
                else:
                    room -= 1
                    cuts2.append(int(c2))
                    kids += [half[:, :c2].sum(), half[:, c2:].sum()]
            cell.cut, cell.cuts2 = int(cut), tuple(cuts2)
            cell.children = [_Node(cell.path + (j,), float(v), np.zeros(self.d)) for j, v in enumerate(kids)]
            accepted.append((cell, len(kids)))
        self.frontier = []
        self.accepted = accepted
        if not accepted:
            self.done = True

    def _absorb_sums(self, total: np.ndarray) -> None:
        pos, new = 0, []
        for cell, k in self.accepted:
            S = total[pos : pos + k * self.d].reshape(k, self.d)
            pos += k * self.d
            D2 = total[pos : pos + k * self.d].reshape(k, self.d)
            pos += k * self.d
            axes = self._child_axes(cell)
            for j, child in enumerate(cell.children):
                child.mean = S[j] / max(child.count, 1.0)
                child.diag = D2[j].copy()
                child.second, child.proj = None, None
                U = axes[j]
                if len(U):
                    child.proj = (U, _untri(total[pos : pos + tri_len(len(U))], len(U)))
                    pos += tri_len(len(U))
                child.released = True
                new.append(child)
        self.accepted = []
        self.level += 1
        self._set_frontier(new)

    # ------------------------------------------------------------------------------ the result
    def released_counts(self) -> list:
        """The record count of every cell whose feature sums were released (the root and every released child)."""
        out, stack = [], [self.root]
        while stack:
            c = stack.pop()
            out.append(c.count)
            stack += [x for x in c.children if x.released]
        return out

    def leaves(self) -> list:
        out, stack = [], [self.root]
        while stack:
            c = stack.pop()
            if c.children:
                stack += c.children[::-1]
            else:
                out.append(c)
        return sorted(out, key=lambda c: c.path)

    def landmarks(self, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """``(landmarks, masses)``: with ``axes`` = 0 (default) the centres of a k-means on a public, seeded sample of the
        leaves' Gaussian mixture (:func:`mixture_landmarks`: post-processing of the released means and second
        moments, :meth:`n_landmarks` of them); with ``axes`` = R > 0 the leaves' means and their axis points
        (:func:`~.cells.axis_points`). Masses sum to the members' count."""
        L = self.leaves()
        Y = np.array([c.mean for c in L])
        c = np.array([c.count for c in L])
        cov = np.array([self.covariance(x) for x in L])
        if self.plan.axes > 0:
            return axis_points(Y, c, cov, self.plan.axes)
        import hashlib

        key = hashlib.sha256(
            b"".join(np.ascontiguousarray(a, dtype="<f8").tobytes() for a in (Y, cov, c)) + str(int(seed)).encode()
        ).hexdigest()
        if key not in _LANDMARKS:  # a pure function of public numbers: computed once per process
            if len(_LANDMARKS) > 16:
                _LANDMARKS.clear()
            _LANDMARKS[key] = mixture_landmarks(Y, cov, c, self.n_landmarks(), seed)
        Yk, ck = _LANDMARKS[key]
        return Yk.copy(), ck.copy()

    def n_landmarks(self) -> int:
        """k of the mixture landmarks: ``LANDMARKS_PER_LEAF`` per leaf, at least ``MIN_CELLS`` and at most the plan's
        ``max_cells`` (``landmarks``, and N / floor). A public function of the released tree."""
        return landmark_count(len(self.leaves()), int(self.plan.max_cells))  # leaves ≤ max_cells: splits need room


def landmark_count(n_leaves: int, max_cells: int) -> int:
    """How many mixture landmarks ``n_leaves`` leaves give (:meth:`CellTree.n_landmarks`)."""
    return max(min(int(round(LANDMARKS_PER_LEAF * n_leaves)), int(max_cells)), int(n_leaves), MIN_CELLS)


_LANDMARKS: dict = {}


def _moments_problem(
    c: float, S: np.ndarray, second: np.ndarray, r: float | None, R: float, proj, eps: float, where: str
) -> str | None:
    """Whether ``(c, S, second)`` can be the count, feature sum and second moments of c records with |f_i| ≤ r and
    ‖f‖ ≤ R (``second``: per-coordinate Σf² when 1-D, Σffᵀ when 2-D; ``proj`` = (U, Σ(Uf)(Uf)ᵀ) or None). The
    tolerance is the secure sum's rounding: ``eps`` × each part's unit (r for sums, r² for second moments), with
    ``eps`` = the relative rounding × n_max (the parts' public bounds are n_max·r and n_max·r²). With ``r`` None
    (plain sums, no public range: exact floats) only the range-free conditions are checked — counts, Cauchy–Schwarz,
    positive semi-definite blocks — to 10⁻⁹ of the sums' own size."""
    diag = np.diag(second) if second.ndim == 2 else second
    if r is None:
        tS = 1e-9 * (1.0 + float(np.max(np.abs(S), initial=0.0)))
        tD = 1e-9 * (1.0 + float(np.max(np.abs(diag), initial=0.0)))
        r = R = math.inf
    else:
        tS, tD = eps * r, eps * r * r
    c = round(c)
    if c < 0:
        return f"{where}: the other sites' part counts {c} records"
    if c == 0:
        if np.any(np.abs(S) > tS) or np.any(np.abs(diag) > tD):
            return f"{where}: the other sites hold no record of it, yet their part of its sums is not 0"
        return None
    if np.any(np.abs(S) > c * r + tS):
        return f"{where}: the other sites' feature sums exceed {c:.0f} records in the public range"
    if np.any(diag < -tD) or (
        math.isfinite(r) and (np.any(diag > c * r * r + tD) or float(diag.sum()) > c * R * R + diag.size * tD)
    ):
        return f"{where}: the other sites' second moments are not those of {c:.0f} records in the public range"
    if np.any(c * diag - S * S < -(c * tD + 2.0 * np.abs(S) * tS + tS * tS)):
        return f"{where}: the other sites' second moments are smaller than their sums allow (Cauchy–Schwarz)"
    blocks = [(second, S)] if second.ndim == 2 else []
    if proj is not None:
        U, Q = proj
        blocks.append((Q, U @ S))
    for Q, g in blocks:
        slack = (c * tD + 2.0 * float(np.linalg.norm(g)) * tS + tS * tS) * len(g)
        if (
            np.linalg.eigvalsh((Q + Q.T) / 2.0).min() < -tD * len(g)
            or np.linalg.eigvalsh(c * (Q + Q.T) / 2.0 - np.outer(g, g)).min() < -slack
        ):
            return f"{where}: the other sites' second-moment block is not that of {c:.0f} records (not c·Q ⪰ ggᵀ)"
    return None


#: synthetic draws per record (and at most this many in all) for the mixture landmarks
DRAWS_PER_RECORD = 20
MAX_DRAWS = 40_000
KMEANS_ITERATIONS = 15
#: records per mixture landmark per √(effective dimension) of a cell (``CellTree.floor_of``; 0: the plan's floor only)
DIM_FLOOR = 2.0
#: mixture landmarks per leaf: 1.5 measured 1–2 CA-10NN points above 1 on digits and MNIST-5k (BENCHMARKS §9d)
LANDMARKS_PER_LEAF = 1.5


def mixture_landmarks(means: np.ndarray, covs: np.ndarray, counts: np.ndarray, k: int, seed: int):
    """Landmarks as post-processing of the cells' released statistics: draw a public, seeded sample from the mixture of
    the leaves' Gaussians N(μ_L, Σ_L) (weights = counts) and run k-means (k-means++ start, Lloyd steps) on it; the
    centres are the landmarks, their masses the sample's cluster sizes rescaled to the records' count.

    No record enters this computation — only the released means and second moments — so it reveals nothing beyond
    them, and every party (the coordinator, each site) computes the same landmarks from the same released sums. The
    k-means centres sit where the records are dense, as federated k-means would put them, without the successive
    overlapping cells whose differences isolate records (``docs/maths.md``)."""
    rng = np.random.default_rng([int(seed), 0x6A11])
    means, counts = np.asarray(means, dtype=np.float64), np.asarray(counts, dtype=np.float64)
    n, d = means.shape
    total = int(min(MAX_DRAWS, DRAWS_PER_RECORD * counts.sum()))
    share = counts / counts.sum() * total
    per = np.floor(share).astype(int)
    per[np.argsort(-(share - per), kind="stable")[: total - per.sum()]] += 1  # largest remainders
    draws = []
    for mu, C, m in zip(means, covs, per):
        C = (C + C.T) / 2.0
        w, V = np.linalg.eigh(C)
        A = V * np.sqrt(np.maximum(w, 0.0))[None, :]
        draws.append(mu + rng.standard_normal((m, d)) @ A.T)
    Z = np.vstack(draws)
    C = _kmeans_pp(Z, min(int(k), len(Z)), rng)
    for _ in range(KMEANS_ITERATIONS):
        a = _nearest(Z, C)
        S = np.zeros_like(C)
        np.add.at(S, a, Z)
        cnt = np.bincount(a, minlength=len(C)).astype(np.float64)
        C = np.where(cnt[:, None] > 0, S / np.maximum(cnt, 1.0)[:, None], C)
    a = _nearest(Z, C)
    cnt = np.bincount(a, minlength=len(C)).astype(np.float64)
    keep = cnt > 0
    return C[keep], cnt[keep] * (counts.sum() / cnt.sum())


def _nearest(Z: np.ndarray, C: np.ndarray, block: int = 4096) -> np.ndarray:
    """Each row of ``Z``'s nearest centre, ``block`` rows at a time (40 000 draws against 3 500 centres at once were
    two 1.1 GB arrays: the peak of a 70 000-record run)."""
    c2 = (C * C).sum(axis=1)[None, :]
    out = np.empty(len(Z), dtype=np.int64)
    for a in range(0, len(Z), block):
        out[a : a + block] = np.argmin(c2 - 2.0 * Z[a : a + block] @ C.T, axis=1)
    return out


def _kmeans_pp(Z: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """k-means++ seeding (Arthur & Vassilvitskii 2007) with the public Generator."""
    C = [Z[int(rng.integers(len(Z)))]]
    d2 = ((Z - C[0]) ** 2).sum(axis=1)
    for _ in range(1, k):
        p = d2 / d2.sum() if d2.sum() > 0 else np.full(len(Z), 1.0 / len(Z))
        j = int(np.searchsorted(np.cumsum(p), rng.random(), side="right"))
        j = min(j, len(Z) - 1)
        C.append(Z[j])
        d2 = np.minimum(d2, ((Z - Z[j]) ** 2).sum(axis=1))
    return np.array(C)
