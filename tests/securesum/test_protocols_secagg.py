"""SecAgg+ state machines: exact sums under random dropout schedules, mask uniformity, faults, timeouts."""

import os

import numpy as np
import pytest
from scipy import stats

from securefed.errors import (AuthenticationError, ConfigError, DecodeError, ProtocolAbortedError, ProtocolError,
                              ProtocolTimeoutError)
from securefed.securesum import crypto
from securefed.securesum.messages import (ConsistencyRequest, MaskedInput, UnmaskRequest, decode, encode,
                                          peek_header)
from securefed.securesum.quantize import plan_fixed_point
from securefed.securesum.runner import TAMPER_KINDS, run_secagg_round
from securefed.securesum.secagg import DEFAULT_TIMEOUTS, STAGES, RoundSpec, SecAggClient, SecAggServer
from securefed.securesum.simulator import simulate

_KEYS = {}


def identities(n):
    if n not in _KEYS:
        keys = [crypto.ed25519_keypair() for _ in range(n)]
        _KEYS[n] = (tuple(k for k, _ in keys), tuple(p for _, p in keys))
    return _KEYS[n]


def make_spec(n, k, t, d, clip=100.0, fbits=0, bits=32, rnd=0):
    sid = os.urandom(16)
    fp = plan_fixed_point(clip, np.ones(n), modulus_bits=bits, fractional_bits=fbits)
    return RoundSpec(sid, rnd, n, k, t, sid, d, fp, identities(n)[1], tuple(DEFAULT_TIMEOUTS.items()))


def oracle(spec, sched):
    """Expected survivors (or None for an abort), from the protocol's definition alone."""
    nb, t = spec.neighbours, spec.threshold
    idx = {s: i for i, s in enumerate(STAGES)}

    def alive_at(stage):
        return {i for i in range(spec.n_clients) if sched.get(i) is None or idx[sched[i]] > idx[stage]}

    def prune(s):
        s = set(s)
        while True:
            bad = {u for u in s if len(nb[u] & s) < t}
            if not bad:
                return s
            s -= bad

    u1 = prune(alive_at("advertise"))
    u2 = prune(u1 & alive_at("share"))
    u3 = u2 & alive_at("masked")
    if not u1 or not u2 or not u3:
        return None
    u5 = u3 & alive_at("consistency") & alive_at("unmask")
    for u in u2:
        needed = u in u3 or (nb[u] & u2 & u3)
        if needed and len(nb[u] & u2 & u5) < t:
            return None
    return tuple(sorted(u3))


def test_exact_sum_over_1000_random_dropout_schedules():
    """Integer inputs with f = 0 make quantisation exact: the output must equal the survivors' exact sum,
    and the round must complete exactly when every needed client keeps ≥ t live share holders."""
    rng = np.random.default_rng(20240601)
    completed = aborted = 0
    stages_seen = set()
    for trial in range(1000):
        n = int(rng.integers(3, 6))
        k = n - 1 if n % 2 == 1 and rng.random() < 0.5 else int(rng.choice([d for d in range(2, n) if d % 2 == 0 or n % 2 == 0] + [n - 1]))
        t = int(rng.integers(1, k + 1))
        d = 4
        spec = make_spec(n, k, t, d, clip=1000.0, fbits=0, bits=int(rng.choice([32, 64, 24])))
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
            from securefed.securesum.quantize import dequantize
            got = dequantize(out.words, spec.fixed_point)
            np.testing.assert_array_equal(got, np.sum([xs[i] for i in want], axis=0))
            completed += 1
    assert completed > 300 and aborted > 50 and stages_seen == set(STAGES)


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


@pytest.mark.parametrize("kind,err", [("ciphertext", AuthenticationError), ("signature", AuthenticationError),
                                      ("replay", ProtocolError), ("reorder", ProtocolError),
                                      ("wrong_round", DecodeError), ("wrong_session", DecodeError),
                                      ("truncate", DecodeError)])
def test_every_fault_kind_is_rejected_with_its_typed_error_and_nothing_revealed(kind, err):
    assert kind in TAMPER_KINDS
    res = simulate("secagg", clients=5, length=16, tamper=kind, seed=3, degree=4, threshold=3)
    assert res["aborted"] and res["error_type"] == err.__name__
    assert res["revealed_shares"] == 0 and res["max_abs_error"] is None and res["survivors"] == []


def test_server_rejects_replayed_and_stale_messages_without_aborting():
    n, d = 4, 8
    spec = make_spec(n, 3, 2, d)
    server = SecAggServer(spec)
    clients = [SecAggClient(spec, i, identities(n)[0][i], np.ones(d), 1.0, 0) for i in range(n)]
    adv = [c.start() [0] for c in clients]
    server.receive(adv[0])
    with pytest.raises(ProtocolError, match="duplicate"):
        server.receive(adv[0])
    out = []
    for a in adv[1:]:
        out += server.receive(a)
    assert server.stage == "share"
    with pytest.raises(ProtocolError, match="stale|expected"):
        server.receive(adv[1])
    with pytest.raises(DecodeError):
        server.receive(encode(ConsistencyRequest(os.urandom(16), 0, 1, (0,))))
    assert server.stage == "share"  # still running


def test_client_refuses_equivocation_and_unmasking_when_declared_dropped():
    n, d = 4, 8
    spec = make_spec(n, 3, 2, d)
    server = SecAggServer(spec)
    clients = [SecAggClient(spec, i, identities(n)[0][i], np.ones(d), 1.0, 0) for i in range(n)]
    out = []
    for c in clients:
        out += server.receive(c.start()[0])
    for stage in ("share", "masked"):
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
    # nobody shares keys before the deadline → typed timeout, nothing revealed
    with pytest.raises(ProtocolTimeoutError):
        server.tick(1e9)
    assert server.stage == "aborted" and server.result is None


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
