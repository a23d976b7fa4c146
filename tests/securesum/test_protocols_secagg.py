"""SecAgg+ state machines: exact sums under random dropout schedules (N up to 50, weights, near-bound values),
mask uniformity, faults, timeouts."""

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from scipy import stats

from securefed.errors import AuthenticationError, ConfigError, DecodeError, ProtocolAbortedError, ProtocolTimeoutError
from securefed.securesum import crypto
from securefed.securesum.messages import ConsistencyRequest, MaskedInput, UnmaskRequest, decode, encode, peek_header
from securefed.securesum.graph import choose_parameters
from securefed.securesum.quantize import dequantize, plan_fixed_point
from securefed.securesum.runner import TAMPER_KINDS, run_secagg_round
from securefed.securesum.secagg import DEFAULT_TIMEOUTS, STAGES, RoundSpec, SecAggClient, SecAggServer
from securefed.securesum.simulator import simulate

_KEYS = {}


def identities(n):
    if n not in _KEYS:
        keys = [crypto.ed25519_keypair() for _ in range(n)]
        _KEYS[n] = (tuple(k for k, _ in keys), tuple(p for _, p in keys))
    return _KEYS[n]


def make_spec(n, k, t, d, clip=100.0, fbits=0, bits=32, rnd=0, quorum=0, weights=None):
    sid = os.urandom(16)
    fp = plan_fixed_point(clip, np.ones(n) if weights is None else weights, modulus_bits=bits, fractional_bits=fbits)
    return RoundSpec(sid, rnd, n, k, t, sid, d, fp, identities(n)[1], tuple(DEFAULT_TIMEOUTS.items()), quorum)


def oracle(spec, sched):
    """Expected survivors (or None for an abort), from the protocol's definition alone (honest clients)."""
    nb, t, q = spec.neighbours, spec.threshold, spec.signatures_needed
    idx = {s: i for i, s in enumerate(STAGES)}

    def alive_at(stage):
        return {i for i in range(spec.n_clients) if sched.get(i) is None or idx[sched[i]] > idx[stage]}

    def prune(s, ok):
        s = set(s)
        while True:
            bad = {u for u in s if not ok(u, s)}
            if not bad:
                return s
            s -= bad

    u1 = prune(alive_at("advertise"), lambda u, s: len(nb[u] & s) >= t)
    u2 = prune(u1 & alive_at("share"), lambda u, s: len(nb[u] & s) >= t)
    peers = {u: nb[u] & u2 for u in u2}  # P_u: every live neighbour's shares are valid
    u3 = prune(u2 & alive_at("masked"), lambda u, s: len(peers[u] & s) >= t)
    if not u1 or not u2 or not u3 or len(u3) < q:
        return None

    def holders_ok(live):
        for u in u2:
            if u not in u3 and not any(u in peers[w] for w in u3):
                continue
            if len({w for w in live if u in peers[w]}) < t:
                return False
        return True

    signers = u3 & alive_at("consistency")
    if not holders_ok(u3) or len(signers) < q or not holders_ok(signers):
        return None
    if not holders_ok(signers & alive_at("unmask")):
        return None
    return tuple(sorted(u3))


@pytest.mark.slow
def test_exact_sum_over_1000_random_dropout_schedules():
    """Integer inputs with f = 0 make quantisation exact: the output must equal the survivors' exact sum,
    and the round must complete exactly when every needed client keeps ≥ t live share holders, every
    survivor ≥ t masking partners among the survivors, and the quorum signs."""
    rng = np.random.default_rng(20240601)
    completed = aborted = 0
    stages_seen = set()
    for trial in range(1000):
        n = int(rng.integers(3, 6))
        k = (
            n - 1
            if n % 2 == 1 and rng.random() < 0.5
            else int(rng.choice([d for d in range(2, n) if d % 2 == 0 or n % 2 == 0] + [n - 1]))
        )
        t = int(rng.integers(1, k + 1))
        d = 4
        quorum = int(rng.choice([0, n // 2 + 1, n]))
        spec = make_spec(n, k, t, d, clip=1000.0, fbits=0, bits=int(rng.choice([32, 64, 24])), quorum=quorum)
        xs = [rng.integers(-1000, 1001, d).astype(float) for _ in range(n)]
        p = rng.uniform(0, 0.6)
        sched = {i: STAGES[int(rng.integers(5))] for i in range(n) if rng.random() < p}
        stages_seen.update(sched.values())
        out = run_secagg_round(spec, identities(n)[0], xs, np.ones(n), rng, drop_at=sched)
        want = oracle(spec, sched)
        if want is None:
            assert out.aborted and isinstance(out.error, ProtocolAbortedError), (trial, sched, out.error)
            assert out.words is None
            aborted += 1
        else:
            assert out.error is None, (trial, n, k, t, sched, out.error)
            assert out.survivors == want
            got = dequantize(out.words, spec.fixed_point)
            np.testing.assert_array_equal(got, np.sum([xs[i] for i in want], axis=0))
            completed += 1
    assert completed > 300 and aborted > 50 and stages_seen == set(STAGES)


def _weighted_round(n, data, fbits=3, clip=4.0):
    """One round with the default (malicious-server) parameters for n clients, integer weights and inputs on
    the 2^-f grid up to the clip bound (so the weighted sum is exact), and a drawn dropout schedule."""
    gp = choose_parameters(n)
    w = np.array(data.draw(st.lists(st.integers(1, 5), min_size=n, max_size=n)), float)
    d = 3
    step = 2.0**-fbits
    top = int(clip / step)
    near = st.integers(top - 2, top).flatmap(lambda m: st.sampled_from([m, -m]))  # at / next to the bound
    xs = [
        np.array(data.draw(st.lists(st.one_of(near, st.integers(-top, top)), min_size=d, max_size=d)), float) * step
        for _ in range(n)
    ]
    sched = data.draw(st.dictionaries(st.integers(0, n - 1), st.sampled_from(STAGES), max_size=max(1, n // 4)))
    spec = make_spec(n, gp.degree, gp.threshold, d, clip=clip, fbits=fbits, bits=32, quorum=gp.quorum, weights=w)
    out = run_secagg_round(
        spec, identities(n)[0], xs, w, np.random.default_rng(0), drop_at=sched, colluders=gp.colluders
    )
    want = oracle(spec, sched)
    if want is None:
        assert out.aborted and out.words is None, (n, sched, out.error)
    else:
        assert out.error is None and out.survivors == want, (n, sched, out.error)
        np.testing.assert_array_equal(
            dequantize(out.words, spec.fixed_point), np.sum([w[i] * xs[i] for i in want], axis=0)
        )
        assert max(out.clipped.values()) == 0


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(3, 12), st.data())
def test_dropouts_weights_and_near_bound_values_small_n(n, data):
    _weighted_round(n, data)


@pytest.mark.slow
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(13, 50), st.data())
def test_dropouts_weights_and_near_bound_values_up_to_50(n, data):
    _weighted_round(n, data)


def _drive_collect_masked(n, xs, bits=32):
    spec = make_spec(n, n - 1, 2, xs[0].size, clip=1000.0, fbits=0, bits=bits)
    server = SecAggServer(spec)
    clients = [SecAggClient(spec, i, identities(n)[0][i], xs[i], 1.0, 0) for i in range(n)]
    out, masked = [], {}
    for c in clients:
        out += server.receive(c.start()[0])
    while out and not server.done:
        nxt = []
        for rid, data in out:
            for reply in clients[rid].receive(data):
                if peek_header(reply)[0] is MaskedInput:
                    m = decode(reply)
                    masked[m.sender] = np.frombuffer(m.data, dtype=np.uint32 if bits <= 32 else np.uint64)
                nxt += server.receive(reply)
        out = nxt
    return spec, server, masked


def test_masked_vectors_are_uniform_and_independent_of_inputs():
    d = 32768
    zeros = [np.zeros(d) for _ in range(3)]
    highs = [np.full(d, 1000.0) for _ in range(3)]
    _, s0, m0 = _drive_collect_masked(3, zeros)
    _, s1, m1 = _drive_collect_masked(3, highs)
    assert s0.stage == s1.stage == "done"
    np.testing.assert_array_equal(s1.result.view(np.int32), np.full(d, 3000))
    hists = []
    for masked in (m0, m1):
        for v in masked.values():
            h = np.bincount((v >> np.uint32(28)).astype(np.int64), minlength=16)  # top 4 bits
            assert stats.chisquare(h).pvalue > 1e-6
            hists.append(h)
            assert np.mean(v == 0) < 1e-3  # the zero input is hidden
    # masked views of zero inputs and of maximal inputs are indistinguishable (two-sample chi-square)
    table = np.vstack([hists[0], hists[3]])
    assert stats.chi2_contingency(table).pvalue > 1e-6


@pytest.mark.parametrize(
    "kind,err,dropped",
    [
        ("ciphertext", None, True),
        ("signature", None, False),
        ("replay", "UnexpectedMessageError", True),
        ("reorder", "UnexpectedMessageError", True),
        ("wrong_round", "DecodeError", True),
        ("wrong_session", "DecodeError", True),
        ("truncate", "DecodeError", True),
    ],
)
def test_every_fault_kind_costs_one_client_at_most_and_never_a_wrong_sum(kind, err, dropped):
    """A forged or broken message reaches one client: it refuses it with a typed error (or leaves the peer the
    message was about out of its peer set); the round completes over the others with their exact sum."""
    assert kind in TAMPER_KINDS
    res = simulate("secagg", clients=6, length=16, tamper=kind, seed=3)
    assert not res["aborted"] and res["max_abs_error"] <= res["error_bound"]
    if err is not None:
        assert list(res["client_errors"]) == ["0"] and res["client_errors"]["0"].startswith(err)
    assert (len(res["survivors"]) == 5) == dropped


def test_server_refuses_replayed_and_stale_messages_without_aborting():
    n, d = 4, 8
    spec = make_spec(n, 3, 2, d)
    server = SecAggServer(spec)
    clients = [SecAggClient(spec, i, identities(n)[0][i], np.ones(d), 1.0, 0) for i in range(n)]
    adv = [c.start()[0] for c in clients]
    server.receive(adv[0])
    assert server.receive(adv[0]) == [] and "duplicate" in str(server.rejected[-1][1])
    out = []
    for a in adv[1:]:
        out += server.receive(a)
    assert server.stage == "share"
    assert server.receive(adv[1]) == [] and "expected" in str(server.rejected[-1][1])
    assert server.receive(encode(ConsistencyRequest(os.urandom(16), 0, 1, (0,)))) == []
    assert isinstance(server.rejected[-1][1], DecodeError)
    assert server.stage == "share" and len(server.rejected) == 3  # still running, nothing raised


def test_client_refuses_equivocation_and_unmasking_when_declared_dropped():
    n, d = 4, 8
    spec = make_spec(n, 3, 2, d)
    server = SecAggServer(spec)
    clients = [SecAggClient(spec, i, identities(n)[0][i], np.ones(d), 1.0, 0) for i in range(n)]
    out = []
    for c in clients:
        out += server.receive(c.start()[0])
    for _stage in ("share", "masked"):
        nxt = []
        for rid, data in out:
            for r in clients[rid].receive(data):
                nxt += server.receive(r)
        out = nxt
    # out now holds ConsistencyRequests for survivors (0, 1, 2, 3)
    sid = spec.session_id
    with pytest.raises(ProtocolAbortedError, match="declared dropped"):
        clients[0].receive(encode(ConsistencyRequest(sid, 0, 0, (1, 2, 3))))
    assert clients[0].state == "aborted"
    with pytest.raises(ProtocolAbortedError):
        clients[0].receive(out[0][1])
    sig = clients[1].receive(out[1][1])
    # server shows client 1 a different survivor set at unmask time → refused, nothing revealed
    with pytest.raises(AuthenticationError, match="survivor set"):
        clients[1].receive(encode(UnmaskRequest(sid, 0, 1, (1, 2, 3), ())))
    assert clients[1].state == "aborted" and sig
    # the right set but fewer signatures than the quorum (3 of 4) → refused, nothing revealed
    sigs = [decode(clients[i].receive(out[i][1])[0]) for i in (2, 3)]
    from securefed.securesum.messages import SignatureEntry

    with pytest.raises(ProtocolAbortedError, match="quorum"):
        clients[2].receive(
            encode(UnmaskRequest(sid, 0, 2, (0, 1, 2, 3), tuple(SignatureEntry(m.sender, m.signature) for m in sigs)))
        )


def test_timeouts_close_stages_on_the_simulated_clock():
    n, d = 4, 8
    spec = make_spec(n, 3, 2, d)
    server = SecAggServer(spec, now=100.0)
    clients = [SecAggClient(spec, i, identities(n)[0][i], np.ones(d), 1.0, 0) for i in range(n)]
    for c in clients[:3]:
        assert server.receive(c.start()[0], now=101.0) == []
    assert server.tick(100.0 + DEFAULT_TIMEOUTS["advertise"] - 1e-6) == []
    out = server.tick(100.0 + DEFAULT_TIMEOUTS["advertise"])
    assert server.stage == "share" and sorted(r for r, _ in out) == [0, 1, 2]
    # nobody shares keys before the deadline → typed timeout, nothing revealed; fail closed
    with pytest.raises(ProtocolTimeoutError):
        server.tick(1e9)
    assert server.stage == "aborted" and server.result is None and isinstance(server.error, ProtocolTimeoutError)
    assert server.receive(clients[3].start()[0]) == [] and server.stage == "aborted"


def test_keys_are_fresh_each_round_and_round_binding():
    n, d = 3, 4
    spec0 = make_spec(n, 2, 2, d, rnd=0)
    c = SecAggClient(spec0, 0, identities(n)[0][0], np.ones(d), 1.0, 0)
    a = decode(c.start()[0])
    c2 = SecAggClient(spec0, 0, identities(n)[0][0], np.ones(d), 1.0, 0)
    b = decode(c2.start()[0])
    assert a.c_pk != b.c_pk and a.s_pk != b.s_pk


def test_clients_refuse_to_unmask_a_sum_over_fewer_than_min_survivors():
    """DP with distributed noise: a sum over fewer than t clients carries less noise than accounted, so
    clients with min_survivors = t refuse to sign a smaller survivor set and nothing is revealed."""
    rng = np.random.default_rng(7)
    n = 5
    spec = make_spec(n, 4, 2, 3, clip=1000.0)
    xs = [rng.integers(-1000, 1001, 3).astype(float) for _ in range(n)]
    sched = {4: "masked"}  # client 4 drops before sending its masked input: 4 survivors
    out = run_secagg_round(spec, identities(n)[0], xs, np.ones(n), rng, drop_at=sched, min_survivors=5)
    assert out.words is None and isinstance(out.error, ProtocolAbortedError)
    out = run_secagg_round(spec, identities(n)[0], xs, np.ones(n), rng, drop_at=sched, min_survivors=4)
    assert out.error is None and out.survivors == (0, 1, 2, 3)
    with pytest.raises(ConfigError, match="^min_survivors="):
        SecAggClient(spec, 0, identities(n)[0][0], xs[0], 1.0, rng, min_survivors=6)
