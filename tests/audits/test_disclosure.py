"""The site-side disclosure auditor against brute force: on random query families over a few records, it accepts a
family only when no set of fewer than ``floor`` records is an exact combination of the released sums (rank of the
membership matrix, every small set enumerated), and on laminar families it refuses exactly when one is."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from securefed.audits.disclosure import (
    DisclosureRefused,
    check_family,
    check_tree,
    derivable,
    smallest_derivable_bruteforce,
)


def _random_laminar(rng, n, depth=3):
    """A random laminar family over n records: random nested partitions, some parts left unreleased."""
    sets = [np.ones(n, bool)]
    frontier = [np.arange(n)]
    for _ in range(depth):
        nxt = []
        for idx in frontier:
            if len(idx) < 2 or rng.random() < 0.3:
                continue
            k = int(rng.integers(2, min(4, len(idx)) + 1))
            cut = np.sort(rng.choice(np.arange(1, len(idx)), size=k - 1, replace=False))
            parts = np.split(rng.permutation(idx), cut)
            for p in parts:
                if rng.random() < 0.8:  # most children released; some not (then their records stay in the atom)
                    m = np.zeros(n, bool)
                    m[p] = True
                    sets.append(m)
                    nxt.append(p)
        frontier = nxt
    return sets


def _verdict(sets, floor):
    try:
        check_family(sets, floor)
        return True
    except DisclosureRefused:
        return False


@given(seed=st.integers(0, 10_000), n=st.integers(3, 9), floor=st.integers(2, 4))
def test_laminar_families_refused_exactly_when_a_small_set_is_derivable(seed, n, floor):
    rng = np.random.default_rng(seed)
    sets = _random_laminar(rng, n)
    M = np.array(sets, dtype=float)
    small = smallest_derivable_bruteforce(M, floor - 1)
    assert _verdict(sets, floor) == (small is None), (small, [np.flatnonzero(s) for s in sets])


@given(seed=st.integers(0, 10_000), n=st.integers(3, 8), k=st.integers(1, 6), floor=st.integers(2, 4))
def test_any_family_the_auditor_accepts_isolates_no_small_set(seed, n, k, floor):
    """Random (mostly non-laminar) families: whatever the auditor lets through, brute force finds no derivable set
    of fewer than floor records (soundness; non-laminar families are refused)."""
    rng = np.random.default_rng(seed)
    sets = [rng.random(n) < rng.uniform(0.2, 0.9) for _ in range(k)]
    sets = [s for s in sets if s.any()]
    if not sets:
        return
    if _verdict(sets, floor):
        assert smallest_derivable_bruteforce(np.array(sets, dtype=float), floor - 1) is None


def test_the_moved_centre_difference_is_refused():
    """Two sums over ≥ 24 records whose sets differ by one record (a centre moved until one record left the cell):
    the difference isolates it — brute force finds it and the auditor refuses."""
    n = 30
    a = np.zeros(n, bool)
    a[:25] = True
    b = a.copy()
    b[24] = False  # the same cell without one record
    M = np.array([a, b], dtype=float)
    assert smallest_derivable_bruteforce(M, 1) == {24}
    with pytest.raises(DisclosureRefused, match="1 record"):
        check_family([a, b], 15)


def test_an_atom_below_the_floor_is_refused_and_a_full_partition_passes():
    n = 40
    root = np.ones(n, bool)
    left = np.zeros(n, bool)
    left[:20] = True
    right = ~left
    check_family([root, left, right], 15)  # children partition the root: atoms empty
    with pytest.raises(DisclosureRefused):
        check_family([root, left], 25)  # the left half alone: the root minus it (20) and it (20) are below 25
    small = np.zeros(n, bool)
    small[:10] = True
    with pytest.raises(DisclosureRefused):
        check_family([root, small], 15)  # one child of 10 released: itself below the floor


def test_counts_from_other_sites_decide_the_atoms_and_contradictions_are_caught():
    """A site holding 3 records of a 40-record cell: its own records are nested, the atom is judged on the global
    counts; counts smaller than its own records are a forged aggregate."""
    nodes = [("r", None, [0, 1, 2], 40.0), ("a", "r", [0, 1], 20.0), ("b", "r", [2], 20.0)]
    check_tree(nodes, 15)
    with pytest.raises(DisclosureRefused):
        check_tree([("r", None, [0, 1, 2], 40.0), ("a", "r", [0, 1], 30.0)], 15)  # r minus a: 10 records
    from securefed.errors import ProtocolError

    with pytest.raises(ProtocolError, match="not a sum of honest uploads"):
        check_tree([("r", None, [0, 1, 2], 2.0)], 2)


def test_single_record_rank_test():
    M = np.array([[1, 1, 0], [0, 1, 0]], dtype=float)
    assert derivable(M, [1, 0, 0]) and derivable(M, [0, 1, 0]) and not derivable(M, [0, 0, 1])
