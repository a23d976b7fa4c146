"""SecAggAggregator / fixed point / neighbour graph: agreement with plain sums, overflow refusal, clipping."""

import math

import numpy as np
import pytest
from scipy import special

from securefed.securesum.base import Aggregator, PlainAggregator, make_aggregator
from securefed.errors import ConfigError, OverflowRiskError, ProtocolAbortedError
from securefed.securesum import SecAggAggregator
from securefed.securesum.graph import (
    choose_parameters,
    harary_graph,
    share_leak_probability,
    dropout_failure_probability,
)
from securefed.securesum.quantize import ClippingWarning, overflow_bound, plan_fixed_point, quantize


def test_secagg_matches_plain_weighted_sum_within_stated_error():
    rng = np.random.default_rng(0)
    ups = [rng.uniform(-2, 2, (7, 5)) for _ in range(6)]
    w = rng.uniform(0.5, 3, 6)
    agg = make_aggregator("secagg", clip_range=2.0, degree=5, threshold=3, random_state=1)
    assert isinstance(agg, Aggregator)
    res = agg.aggregate(ups, w, round_index=4)
    plain = PlainAggregator().aggregate(ups, w)
    bound = res.details["fixed_point"]["max_abs_error"]
    assert res.total.shape == (7, 5) and res.protocol == "secagg" and res.survivors == tuple(range(6))
    assert np.max(np.abs(res.total - plain.total)) <= bound
    assert res.weight_sum == pytest.approx(w.sum()) and res.clipped == 0
    assert res.bytes_up > 35 * 4 and res.bytes_down >= 6 * res.bytes_up * 0.9 and res.details["round_index"] == 4


def test_stochastic_rounding_is_unbiased():
    fp = plan_fixed_point(1.0, np.ones(2), modulus_bits=32, fractional_bits=2)
    rng = np.random.default_rng(1)
    x = np.full(200_000, 0.1)  # 0.4 steps: rounds to 0 or 1 step
    q, _ = quantize(x, 1.0, fp, rng)
    mean = q.view(np.int32).mean() * fp.step
    assert abs(mean - 0.1) < 4 * 0.25 * 0.5 / math.sqrt(x.size)


def test_dropouts_are_reported_and_sum_covers_survivors_only():
    rng = np.random.default_rng(2)
    ups = [rng.uniform(-1, 1, 50) for _ in range(8)]
    agg = SecAggAggregator(
        clip_range=1.0, degree=7, threshold=3, dropout={1: "masked", 4: "unmask", 6: "share"}, random_state=0
    )
    res = agg.aggregate(ups)
    assert res.survivors == (0, 2, 3, 4, 5, 7)
    assert (
        np.max(np.abs(res.total - np.sum([ups[i] for i in res.survivors], axis=0)))
        <= res.details["fixed_point"]["max_abs_error"]
    )
    assert res.details["dropped_at"]["masked"] == [1] and res.details["dropped_at"]["unmask"] == [4]


def test_too_many_dropouts_abort_with_typed_error():
    ups = [np.ones(4) for _ in range(5)]
    agg = SecAggAggregator(clip_range=1.0, degree=4, threshold=4, dropout={0: "unmask", 1: "unmask"})
    with pytest.raises(ProtocolAbortedError, match="nothing revealed"):
        agg.aggregate(ups)


def test_overflow_is_refused_against_active_clients():
    # one guard bit: 1000 active clients with clip 1 and f=20 need 1000·2^20 + 1000 < 2^30: fine; 1500 are not
    plan_fixed_point(1.0, np.ones(1000), modulus_bits=32, fractional_bits=20)
    with pytest.raises(OverflowRiskError, match="fractional_bits"):
        plan_fixed_point(1.0, np.ones(1500), modulus_bits=32, fractional_bits=20)
    assert overflow_bound(1.0, 20, 1500.0, 1500) > 2**30 - 1
    with pytest.raises(OverflowRiskError):
        plan_fixed_point(1e6, np.full(10, 1e4), modulus_bits=32)
    with pytest.raises(OverflowRiskError):
        SecAggAggregator(clip_range=1e6, modulus_bits=32, degree=2, threshold=2).aggregate([np.ones(3)] * 3, [1e4] * 3)
    fp = plan_fixed_point(1e6, np.full(10, 1e4), modulus_bits=64)
    assert overflow_bound(fp.clip, fp.fractional_bits, 1e5, 10) <= 2**62 - 1


def test_clipping_is_counted_and_warned():
    ups = [np.array([0.5, 3.0, -4.0]), np.array([0.1, 0.2, 0.3]), np.array([5.0, 0.0, 0.0])]
    agg = SecAggAggregator(clip_range=1.0, degree=2, threshold=2, random_state=0)
    with pytest.warns(ClippingWarning, match="3 update coordinates"):
        res = agg.aggregate(ups)
    assert res.clipped == 3
    np.testing.assert_allclose(res.total, [1.6, 1.2, -0.7], atol=1e-6)


def test_clip_range_is_required():
    with pytest.raises(ConfigError, match="clip_range"):
        SecAggAggregator()
    with pytest.raises(ConfigError, match="clip_range"):
        make_aggregator("secagg")


def test_harary_graph_is_regular_symmetric_and_seeded():
    for n, k in [(10, 4), (10, 5), (11, 6), (12, 11)]:
        g = harary_graph(n, k, b"seed")
        assert all(len(s) == k and i not in s for i, s in enumerate(g))
        assert all(i in g[j] for i, s in enumerate(g) for j in s)
        assert g == harary_graph(n, k, b"seed")
    assert harary_graph(20, 4, b"a") != harary_graph(20, 4, b"b")


def test_threat_model_bounds_are_computed_exactly():
    n, k, t, gamma = 20, 8, 3, 0.1
    corrupt = 2
    # brute force hypergeometric tail P[X >= t] for k of n-1 neighbours with `corrupt` corrupt
    tail = sum(
        special.comb(corrupt, x, exact=True) * special.comb(n - 1 - corrupt, k - x, exact=True)
        for x in range(t, min(corrupt, k) + 1)
    ) / special.comb(n - 1, k, exact=True)
    assert share_leak_probability(n, k, t, gamma) == pytest.approx(min(1.0, n * tail))
    drop = sum(special.comb(k, x, exact=True) * 0.2**x * 0.8 ** (k - x) for x in range(k - t + 1, k + 1))
    assert dropout_failure_probability(n, k, t, 0.2) == pytest.approx(n * drop)
    # sparse graphs (above the complete-graph range): the bounds of Bell et al. with the malicious condition
    gp = choose_parameters(200, dropout_rate=0.1, corrupt_fraction=0.1)
    assert gp.degree < 199 and gp.log2_disconnect <= -40 and gp.log2_dropout_failure <= -10 and gp.log2_leak <= -40
    assert 2**gp.log2_dropout_failure == pytest.approx(dropout_failure_probability(200, gp.degree, gp.threshold, 0.1))
    assert gp.quorum == (200 + gp.colluders) // 2 + 1 and 2 * gp.quorum > 200 + gp.colluders
    semi = choose_parameters(100, dropout_rate=0.1, corrupt_fraction=0.1, server_model="semi-honest")
    assert semi.degree < 99  # the honest-but-curious model stays available, explicitly
    assert choose_parameters(10, degree=9, threshold=5).source == "explicit"
    with pytest.raises(ConfigError, match="threat model"):
        choose_parameters(200, dropout_rate=0.3, corrupt_fraction=0.2, complete_up_to=0)


def test_with_options_keeps_session_and_identities():
    agg = SecAggAggregator(clip_range=1.0, degree=2, threshold=2, random_state=0)
    agg.aggregate([np.ones(2)] * 3)
    wide = agg.with_options(clip_range=1000.0)
    assert wide.session_id == agg.session_id and wide.clip_range == 1000.0 and wide._identity is agg._identity
    res = wide.aggregate([np.full(2, 500.0)] * 3)
    assert res.clipped == 0 and np.allclose(res.total, 1500.0, atol=1e-3)
    assert res.details["protocol_round"] == 1  # round counter continues: no (session, round) reuse
    res2 = agg.aggregate([np.ones(2)] * 3)
    assert res2.details["protocol_round"] == 2
