"""Site-side disclosure control of sum queries (simulatable auditing): refuse a sum after which a small set of records
would be an exact linear combination of the released sums.

A site answers sums over sets of records: ``Σ_{r ∈ S} f(r)`` for the cells of :mod:`securefed.landmarks.celltree` (every
site's records in the cell, summed over the sites). Stacking the indicator vectors of the released sets gives the
membership matrix ``M`` (queries × records); a set ``T`` of records is *derivable* when ``1_T`` lies in the row span of
``M`` — then a combination of the released sums is exactly ``Σ_{r ∈ T} f(r)``, whatever ``f`` is. The site must refuse
a query after which some non-empty ``T`` with ``|T| < floor`` is derivable.

For a single record that is a rank test (:func:`derivable`); for sets in general it is a sparsest-vector problem. The
cell tree is built so that it is tractable: its released sets form a **laminar family** (any two are nested or
disjoint: children partition their parent). Then the row span is spanned by the family's **atoms** — each set minus
the union of its released children — and the derivable sets are exactly the unions of atoms (the triangular change of
basis between sets and atoms); the smallest non-empty derivable set is the smallest non-empty atom. So the check is:
**the family is laminar and every non-empty atom holds at least ``floor`` records** (:func:`check_family`).

The decision uses only the queries (which sets are asked) and the sets' sizes — the verified counts, themselves
released sums — never the answers' feature values: a refusal tells nobody anything they did not know (Kenthapadi,
Mishra & Nissim, *Simulatable auditing*, PODS 2005). A site sees only its own records: it checks nesting on its own
records and takes the global sizes of the sets from the verified counts (an atom's global size is its set's count
minus its released children's counts), so the records of every site — a site that dropped out included — are
protected by every other site's check.
"""

from __future__ import annotations

import numpy as np

from ..errors import ProtocolError

__all__ = ["DisclosureRefused", "check_family", "check_tree", "derivable", "smallest_derivable_bruteforce"]


class DisclosureRefused(ProtocolError):
    """A site refuses a sum: afterwards a set of fewer than ``floor`` records would be derivable."""


def check_tree(nodes: list, floor: int) -> None:
    """The laminar check on one site, with the family's structure given: ``nodes = [(node id, parent id or None,
    indices of this site's records in the set, the set's global size)]``.

    Raises :class:`DisclosureRefused` when a set's records are not inside its parent's on this site, two sets with
    the same parent share a record, or a non-empty atom (a set minus its children) holds fewer than ``floor`` records
    (globally, by the counts) — and :class:`ProtocolError` when the counts contradict this site's own records (a
    set whose global size is smaller than this site's records in it)."""
    by_id = {}
    for nid, parent, idx, count in nodes:
        by_id[nid] = (parent, np.unique(np.asarray(idx, dtype=np.int64)), float(count))
    children: dict = {}
    for nid, (parent, idx, count) in by_id.items():
        if len(idx) > count + 0.5:
            raise ProtocolError(
                f"set {nid!r}: the released count {count:.0f} is below this site's own "
                f"{len(idx)} records in it; the counts are not a sum of honest uploads"
            )
        if parent is None:
            continue
        if parent not in by_id:
            raise DisclosureRefused(f"set {nid!r}: its parent {parent!r} was never released; refusing")
        if not np.isin(idx, by_id[parent][1]).all():
            raise DisclosureRefused(
                f"set {nid!r} holds records of this site outside its parent {parent!r}: the "
                "released sets would not be nested (their differences could isolate records)"
            )
        children.setdefault(parent, []).append(nid)
    for parent, kids in children.items():
        seen = np.concatenate([by_id[k][1] for k in kids]) if kids else np.zeros(0, np.int64)
        if len(np.unique(seen)) != len(seen):
            raise DisclosureRefused(
                f"two sets under {parent!r} share a record of this site: the family is not laminar; refusing"
            )
    for nid, (_parent, idx, count) in by_id.items():
        atom = count - sum(by_id[k][2] for k in children.get(nid, []))
        own = len(idx) - sum(len(by_id[k][1]) for k in children.get(nid, []))
        if atom < -0.5 or own > atom + 0.5:
            raise ProtocolError(
                f"set {nid!r}: its children's counts exceed it ({atom:.0f} records left, {own} of "
                "them this site's); the counts are not a sum of honest uploads"
            )
        if 0.5 < atom < floor - 0.5:
            raise DisclosureRefused(
                f"after this sum, set {nid!r} minus its released subsets would hold {atom:.0f} "
                f"record(s) (fewer than the cell floor {floor}): their sum would be derivable from "
                "the released sums; refusing"
            )


def check_family(sets: list, floor: int, counts=None) -> None:
    """The check of :func:`check_tree` for an arbitrary family of sets over one site's records (``sets``: boolean
    masks or index arrays over ``n`` records; ``counts``: the sets' global sizes, default their sizes here).

    Infers the structure: processed from the largest set down, each set must lie inside exactly one earlier set or
    outside all of them; a set that cuts across another is refused (the family is not laminar, and its derivable
    sets are not known to be large)."""
    masks = [np.asarray(s) for s in sets]
    n = max((len(m) if m.dtype == bool else (int(m.max()) + 1 if m.size else 0)) for m in masks) if masks else 0
    idx = [np.flatnonzero(m) if m.dtype == bool else np.unique(m.astype(np.int64)) for m in masks]
    cnt = [float(len(i)) for i in idx] if counts is None else [float(c) for c in counts]
    order = sorted(range(len(idx)), key=lambda j: (-len(idx[j]), j))
    label = np.full(n, -1, dtype=np.int64)
    nodes = []
    for j in order:
        labs = np.unique(label[idx[j]])
        if len(labs) > 1:
            raise DisclosureRefused(
                f"set {j} cuts across sets {sorted(int(v) for v in labs if v >= 0)}: the family is "
                "not laminar; refusing"
            )
        parent = int(labs[0]) if len(labs) == 1 and labs[0] >= 0 else None
        if parent is not None and len(idx[j]) == len(idx[parent]):
            # the same set twice: it adds nothing to the span
            continue
        nodes.append((j, parent, idx[j], cnt[j]))
        label[idx[j]] = j
    check_tree(nodes, floor)


def derivable(M: np.ndarray, target: np.ndarray) -> bool:
    """Whether the 0/1 vector ``target`` lies in the row span of ``M`` (exact rank test over the rationals, via
    floating point on small integer matrices)."""
    M = np.asarray(M, dtype=np.float64)
    t = np.asarray(target, dtype=np.float64)[None, :]
    if M.size == 0:
        return not t.any()
    return np.linalg.matrix_rank(np.vstack([M, t])) == np.linalg.matrix_rank(M)


def smallest_derivable_bruteforce(M: np.ndarray, max_size: int):
    """The smallest non-empty set of at most ``max_size`` records derivable from the queries ``M`` (rows: 0/1
    indicator vectors), by enumerating every such set — for tests on small examples. None when there is none."""
    from itertools import combinations

    M = np.asarray(M, dtype=np.float64)
    n = M.shape[1]
    for size in range(1, max_size + 1):
        for T in combinations(range(n), size):
            t = np.zeros(n)
            t[list(T)] = 1.0
            if derivable(M, t):
                return set(T)
    return None
