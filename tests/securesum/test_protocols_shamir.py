"""Shamir secret sharing: exhaustive checks over a small field and property tests over p = 2^256 + 297."""

import itertools
from collections import Counter

import pytest
import sympy
from hypothesis import given, settings, strategies as st

from securefed.errors import ProtocolAbortedError
from securefed.securesum import shamir


def test_field_prime_is_the_smallest_prime_above_2_256():
    assert sympy.isprime(shamir.PRIME)
    assert shamir.PRIME == sympy.nextprime(2**256)
    assert shamir.PRIME.bit_length() <= 8 * shamir.SHARE_BYTES


@pytest.mark.parametrize("t,k", [(1, 3), (2, 4), (3, 4), (3, 5)])
def test_every_t_subset_reconstructs_and_t_minus_1_shares_are_uniform_small_field(t, k):
    """Over F_11, enumerate every polynomial: each t-subset gives back the secret, and for every
    (t−1)-subset the share tuple is exactly uniform over F_11^(t−1), whatever the secret."""
    p = 11
    xs = list(range(1, k + 1))
    for secret in (0, 3, 10):
        counts = {sub: Counter() for sub in itertools.combinations(range(k), t - 1)}
        for coeffs in itertools.product(range(p), repeat=t - 1):
            ys = shamir.share_with_coefficients(secret, coeffs, xs, p)
            for sub in itertools.combinations(range(k), t):
                assert shamir.reconstruct([(xs[i], ys[i]) for i in sub], t, p) == secret
            for sub in counts:
                counts[sub][tuple(ys[i] for i in sub)] += 1
        for c in counts.values():
            assert len(c) == p ** (t - 1) and set(c.values()) == {1}


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**256 - 1), st.integers(1, 6), st.integers(0, 4), st.data())
def test_any_t_subset_reconstructs_big_field(secret, t, extra, data):
    k = t + extra
    xs = data.draw(st.lists(st.integers(1, 1000), min_size=k, max_size=k, unique=True))
    ys = shamir.share(secret, xs, t)
    sub = data.draw(st.permutations(list(range(k))))[:t]
    assert shamir.reconstruct([(xs[i], ys[i]) for i in sub], t) == secret
    if t > 1:
        with pytest.raises(ProtocolAbortedError):
            shamir.reconstruct([(xs[i], ys[i]) for i in sub[:-1]], t)


def test_t_minus_1_shares_look_uniform_big_field():
    """Top byte of a single share (t=2) of a fixed secret: chi-square against uniform over 16 bins."""
    from scipy import stats

    tops = [shamir.share(12345, [1, 2], 2)[0] >> 253 for _ in range(3200)]
    counts = [tops.count(v) for v in range(8)]
    assert stats.chisquare(counts).pvalue > 1e-6


def test_secret_bytes_round_trip():
    raw = bytes(range(32))
    assert shamir.int_to_secret(shamir.secret_to_int(raw)) == raw
    with pytest.raises(ProtocolAbortedError):
        shamir.int_to_secret(2**256)
