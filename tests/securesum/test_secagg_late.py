"""Issue 26 item 1 (the pipeline option, fresh keys per sum): the input of a SecAgg+ round bound after the share stage.

The advertise and share stages of several rounds run before their inputs exist (each client waits in ``ready``,
serialised between messages as a Flower site stores it); each round then costs masked input, consistency and
unmask. What is checked here, beyond the adversary tests that run under both schedules (conftest ``schedule``):

* exact sums for K rounds set up at once, through the state codec in every state, with dropouts;
* masks of two rounds are never equal (fresh keys, fresh seed), and a site that drops in round k gives the
  server nothing that unmasks its input to an earlier round (a test with reused keys recovers it);
* the new attack of a shared setup — the server puts in the survivor set a site that masked under another input
  part — is refused because every signer checks every member's input binding (without that check the attack
  recovers the victim's input exactly: measured);
* misuse fails closed: a message in ``ready``, ``provide_input`` twice or in the wrong state, a stored state
  loaded with another spec;
* the new message and the spec parts round-trip through strict codecs (hypothesis).
"""

import dataclasses
import os

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from securefed.errors import ConfigError, DecodeError, ProtocolError, ProtocolTimeoutError, SecureFedError
from securefed.securesum import crypto, shamir
from securefed.securesum import messages as M
from securefed.securesum.graph import choose_parameters
from securefed.securesum.messages import (
    BoundConsistencyRequest,
    ConsistencyRequest,
    InputDigest,
    SignatureEntry,
    UnmaskRequest,
    decode,
    encode,
)
from securefed.securesum.quantize import dequantize, plan_fixed_point
from securefed.securesum.secagg import (
    DEFAULT_TIMEOUTS,
    InputSpec,
    RoundSpec,
    SetupSpec,
    decode_input,
    decode_setup,
    decode_spec,
    encode_input,
    encode_setup,
    encode_spec,
    input_hash,
    pair_info,
    self_info,
)
from securefed.securesum.secagg_client import SecAggClient
from securefed.securesum.secagg_codec import dump_client, load_client
from securefed.securesum.secagg_server import SecAggServer
from securefed.securesum.task import task_digest

_KEYS: dict = {}
FB = 4


def identities(n):
    if n not in _KEYS:
        keys = [crypto.ed25519_keypair() for _ in range(n)]
        _KEYS[n] = (tuple(k for k, _ in keys), tuple(p for _, p in keys))
    return _KEYS[n]


def setup(n, rnd=0, sid=None):
    gp = choose_parameters(n)
    sid = sid or os.urandom(16)
    return SetupSpec(
        sid, rnd, n, gp.degree, gp.threshold, sid, identities(n)[1], tuple(DEFAULT_TIMEOUTS.items()), gp.quorum
    ), gp


def input_part(n, d, task=b"cells", clip=1000.0):
    fp = plan_fixed_point(clip, np.ones(n), modulus_bits=32, fractional_bits=FB)
    return InputSpec(d, fp, False, task_digest({"task": task}))


def pump(server, clients, out, now=0.0, dead=()):
    """Deliver server → client messages and the replies until nothing moves; a client that raises is dead."""
    dead = set(dead)
    while out:
        nxt = []
        for rid, data in out:
            if rid in dead:
                continue
            try:
                replies = clients[rid].receive(data, now)
            except SecureFedError:
                dead.add(rid)
                continue
            for r in replies:
                nxt += server.receive(r, now)
        out = nxt
    return dead


def set_up_rounds(n, k, sid=None, dead=()):
    """Advertise and share stages of k rounds (one session), every client stored with the state codec in
    ``ready``. Returns [(setup, server, {client id: stored bytes})]."""
    sid = sid or os.urandom(16)
    priv = identities(n)[0]
    rounds = []
    for rnd in range(k):
        su, gp = setup(n, rnd, sid)
        server = SecAggServer(su)
        clients = {i: SecAggClient(su, i, priv[i], colluders=gp.colluders) for i in range(n) if i not in dead}
        out = []
        for c in clients.values():
            out += server.receive(c.start()[0])
        pump(server, clients, out, dead=dead)
        while server.stage in ("advertise", "share"):  # someone is missing: the stage closes at its deadline
            pump(server, clients, server.tick(server.deadline), dead=dead)
        assert server.stage == "ready" and all(c.state == "ready" for c in clients.values())
        rounds.append((su, server, {i: dump_client(c) for i, c in clients.items()}))
    return rounds


def finish(su, server, stored, inputs, inp, drop_masked=(), now=0.0):
    """Bind the input part on the server and on every stored client (loaded back from bytes), run the rest."""
    priv = identities(su.n_clients)[0]
    server.open_input(inp, now)
    clients = {i: load_client(b, su, priv[i]) for i, b in stored.items()}
    out = []
    for i, c in clients.items():
        if i in drop_masked:
            continue
        for m in c.provide_input(inp, inputs[i], 1.0):
            out += server.receive(m, now)
    # round trips through the codec after binding too (needs the full spec now)
    full = su.bind(inp)
    clients = {i: load_client(dump_client(c), full, priv[i]) for i, c in clients.items()}
    dead = pump(server, clients, out, now, dead=drop_masked)
    if not server.done:
        t = server.deadline
        pump(server, clients, server.tick(t), t, dead=dead)
    return server, clients


# ------------------------------------------------------------------------------------------- schedule


def test_k_rounds_set_up_before_their_inputs_give_exact_sums():
    n, d, k = 6, 7, 3
    rounds = set_up_rounds(n, k)
    rng = np.random.default_rng(1)
    for su, server, stored in rounds:
        xs = [rng.integers(-500 * 2**FB, 500 * 2**FB, d) / 2**FB for _ in range(n)]
        inp = input_part(n, d, task=f"round {su.round_index}".encode())
        server, _ = finish(su, server, stored, xs, inp)
        assert server.stage == "done" and server.survivors == tuple(range(n))
        np.testing.assert_array_equal(dequantize(server.result, inp.fixed_point), np.sum(xs, axis=0))
        assert server.spec == su.bind(inp)


def test_late_round_with_a_dropout_before_and_after_masking():
    n, d = 8, 5
    ((su, server, stored),) = set_up_rounds(n, 1)
    xs = [np.full(d, float(i)) for i in range(n)]
    server, _ = finish(su, server, stored, xs, input_part(n, d), drop_masked=(7,))
    assert server.stage == "done" and server.survivors == tuple(range(7))  # 7's pairwise masks removed via s_7
    np.testing.assert_array_equal(dequantize(server.result, server.spec.fixed_point), np.full(d, float(sum(range(7)))))


def test_a_site_dropped_in_setup_is_in_no_round():
    n, d = 8, 3
    ((su, server, stored),) = set_up_rounds(n, 1, dead={3})
    assert server.dropped_at["advertise"] == (3,)
    xs = [np.ones(d)] * n
    server, _ = finish(su, server, stored, xs, input_part(n, d))
    assert server.survivors == (0, 1, 2, 4, 5, 6, 7)


def test_both_schedules_give_the_same_sum_and_the_joined_spec_digests_as_a_whole():
    from securefed.securesum.messages import peek_header
    from securefed.securesum.runner import run_secagg_round

    n, d = 5, 4
    su, gp = setup(n)
    inp = input_part(n, d)
    full = su.bind(inp)
    assert full.setup == su and full.input_spec == inp and full.digest == decode_spec(encode_spec(full)).digest
    assert su.digest != full.digest  # setup and full digests are domain-separated
    assert decode_setup(encode_setup(su)) == su and decode_input(encode_input(inp)) == inp
    xs = [np.arange(d) * 1.5 + i for i in range(n)]
    sums, kinds = {}, {}
    for schedule in ("construction", "late"):
        seen = set()

        def watch(direction, who, data, seen=seen):
            seen.add(peek_header(data)[0].__name__)
            return [data]

        out = run_secagg_round(
            full,
            identities(n)[0],
            xs,
            np.ones(n),
            np.random.default_rng(0),
            drop_at={1: "masked"},
            schedule=schedule,
            intercept=watch,
            colluders=gp.colluders,
        )
        assert out.error is None and out.survivors == (0, 2, 3, 4)
        sums[schedule], kinds[schedule] = dequantize(out.result, inp.fixed_point), seen
    np.testing.assert_array_equal(sums["construction"], np.sum([xs[i] for i in (0, 2, 3, 4)], axis=0))
    np.testing.assert_array_equal(sums["late"], sums["construction"])
    assert kinds["late"] - kinds["construction"] == {"BoundConsistencyRequest"}
    assert kinds["construction"] - kinds["late"] == {"ConsistencyRequest"}


# ------------------------------------------------------------------------- fresh keys, fresh masks


def test_masks_of_two_rounds_are_never_equal():
    """Zero inputs: the masked input *is* the mask. Two rounds of one session, same clients: independent."""
    n, d = 5, 4096
    rounds = set_up_rounds(n, 2)
    masks, adverts = [], []
    for su, server, stored in rounds:
        inp = input_part(n, d)
        server.open_input(inp)
        priv = identities(n)[0]
        got = {}
        for i, b in stored.items():
            c = load_client(b, su, priv[i])
            got[i] = np.frombuffer(decode(c.provide_input(inp, np.zeros(d))[0]).data, dtype=np.uint32)
            adverts.append((c._c_pk, c._s_pk))
        masks.append(got)
    for i in range(n):
        same = np.mean(masks[0][i] == masks[1][i])
        assert same < 1e-3, (i, same)  # 2^-32 per word by chance
        for j in range(i + 1, n):
            assert np.mean(masks[0][i] == masks[0][j]) < 1e-3
    keys = [k for pair in adverts for k in pair]
    assert len(set(keys)) == len(keys)  # every key of every client of every round is fresh


def test_dropping_in_round_k_unmasks_nothing_of_round_k_minus_1():
    """Site v survives round 0 (its self-mask seed b_0 is revealed then) and drops in round 1 after the share stage
    (its mask key s_1 is reconstructed then). With s_1 the attacker cannot strip round 0's pairwise masks; with
    reused keys (s_0 = s_1, the unsound design the docstring of secagg.py rejects) it recovers v's input exactly."""
    n, d, v = 6, 32, 5
    priv = identities(n)[0]
    sid = os.urandom(16)
    rng = np.random.default_rng(3)
    x = [rng.integers(-500 * 2**FB, 500 * 2**FB, d) / 2**FB for _ in range(n)]
    held = {}

    def run(rnd, drop_masked):
        su, _ = setup(n, rnd, sid)
        server = SecAggServer(su)
        clients = {i: SecAggClient(su, i, priv[i]) for i in range(n)}
        out = []
        for c in clients.values():
            out += server.receive(c.start()[0])
        pump(server, clients, out)
        held[rnd] = {i: (c._s_sk, c._s_pk, c._b) for i, c in clients.items()}
        inp = input_part(n, d)
        server.open_input(inp)
        out, masked = [], {}
        for i, c in clients.items():
            if i in drop_masked:
                continue
            m = c.provide_input(inp, x[i])
            masked[i] = decode(m[0])
            out += server.receive(m[0])
        dead = pump(server, clients, out, dead=drop_masked)
        if not server.done:
            pump(server, clients, server.tick(server.deadline), server.deadline, dead=dead)
        return server, masked

    s0, masked0 = run(0, ())
    s1, _ = run(1, (v,))
    assert s0.stage == s1.stage == "done" and v in s0.survivors and v not in s1.survivors
    fp = s0.spec.fixed_point
    b0 = held[0][v][2]  # revealed in round 0 (v survived): the server reconstructs it
    s_recovered = held[1][v][0]  # reconstructed in round 1 (v dropped)

    def strip(s_sk):
        acc = np.frombuffer(masked0[v].data, dtype=fp.dtype).copy()
        buf = bytearray(acc.nbytes + 16)
        crypto.add_mask_inplace(acc, b0, session_id=sid, info=self_info(0, v), sign=-1, buf=buf)
        for u in masked0[v].peers:
            shared = crypto.x25519_shared(s_sk, held[0][u][1])
            crypto.add_mask_inplace(
                acc, shared, session_id=sid, info=pair_info(0, v, u), sign=-1 if v < u else +1, buf=buf
            )
        return dequantize(acc, fp)

    assert np.array_equal(strip(held[0][v][0]), x[v])  # reused keys: round 0's input recovered exactly
    assert not np.allclose(strip(s_recovered), x[v])  # fresh keys: garbage
    assert crypto.x25519_public_bytes(s_recovered) != held[0][v][1]


# -------------------------------------------------------------- the attack a shared setup makes possible


class _NoBindingCheck(SecAggClient):
    """The design without input bindings: signs a late-bound survivor set without checking its members."""

    def _on_consistency(self, msg):
        return self._sign_survivors(self._survivor_set(msg.survivors, self.min_survivors))


def _mixed_input_parts(n, victim, clients_cls):
    """A shared setup; the server binds input part A (a request whose honest answer is zeros) at every site but
    the victim, and input part B (the victim's real request) at the victim. Returns what the attacker holds."""
    priv = identities(n)[0]
    su, gp = setup(n)
    clients = {i: clients_cls(su, i, priv[i], colluders=gp.colluders) for i in range(n)}
    server = SecAggServer(su)
    out = []
    for c in clients.values():
        out += server.receive(c.start()[0])
    pump(server, clients, out)
    d = 6
    part_a, part_b = input_part(n, d, task=b"zeros"), input_part(n, d, task=b"the victim's data")
    x_victim = np.arange(1.0, d + 1.0) * 3.25
    masked = {}
    for i, c in clients.items():
        inp, x = (part_b, x_victim) if i == victim else (part_a, np.zeros(d))
        masked[i] = decode(c.provide_input(inp, x)[0])
    return su, clients, masked, su.bind(part_a), x_victim


def _attack(su, clients, masked, full_a, request):
    """Ask every site to sign U = all sites (victim included), then unmask with whatever they reveal."""
    n, sid, rnd = su.n_clients, su.session_id, su.round_index
    U = tuple(range(n))
    sigs = {}
    for i, c in clients.items():
        try:
            sigs[i] = decode(c.receive(encode(request(i, U)))[0]).signature
        except SecureFedError:
            pass
    entries = tuple(SignatureEntry(i, s) for i, s in sorted(sigs.items()))
    b_pts = {}
    for i in sigs:
        try:
            rep = decode(clients[i].receive(encode(UnmaskRequest(sid, rnd, i, U, entries)))[0])
        except SecureFedError:
            continue
        for s in rep.self_shares:
            b_pts.setdefault(s.owner, []).append((i + 1, s.value))
    fp, t = full_a.fixed_point, full_a.threshold
    if any(len(b_pts.get(u, [])) < t for u in U):
        return sigs, None
    acc = np.zeros(full_a.length, dtype=fp.dtype)
    buf = bytearray(acc.nbytes + 16)
    for u in U:
        np.add(acc, np.frombuffer(masked[u].data, dtype=fp.dtype), out=acc)
        b = shamir.int_to_secret(shamir.reconstruct(b_pts[u], t))
        crypto.add_mask_inplace(acc, b, session_id=sid, info=self_info(rnd, u), sign=-1, buf=buf)
    return sigs, dequantize(acc, fp)


def test_a_site_bound_to_another_input_part_is_kept_out_of_the_sum():
    n, victim = 6, 5
    su, clients, masked, full_a, _ = _mixed_input_parts(n, victim, SecAggClient)
    sid = su.session_id

    def bound(i, U):  # the attacker holds every masked input: it sends every binding it has
        return BoundConsistencyRequest(
            sid,
            0,
            i,
            U,
            tuple(InputDigest(u, input_hash(masked[u].data, masked[u].peers), masked[u].signature) for u in U),
        )

    sigs, got = _attack(su, clients, masked, full_a, bound)
    assert got is None and sigs == {}  # nobody signs: the victim's binding is for part B, the others' for A
    assert all(c.state == "aborted" for c in clients.values())


def test_without_the_binding_check_the_same_attack_recovers_the_victims_input_exactly():
    n, victim = 6, 5
    su, clients, masked, full_a, x_victim = _mixed_input_parts(n, victim, _NoBindingCheck)
    _, got = _attack(su, clients, masked, full_a, lambda i, U: ConsistencyRequest(su.session_id, 0, i, U))
    assert got is not None and np.array_equal(got, x_victim)  # the shared setup's masks cancel across input parts


# ------------------------------------------------------------------------------------ fail closed


def _ready_clients(n=4):
    ((su, server, stored),) = set_up_rounds(n, 1)
    priv = identities(n)[0]
    return su, server, {i: load_client(b, su, priv[i]) for i, b in stored.items()}


def test_misuse_fails_closed():
    su, server, clients = _ready_clients()
    inp = input_part(4, 3)
    sid = su.session_id
    # a message in ready aborts the client; the server refuses client messages in ready without aborting
    with pytest.raises(ProtocolError, match="no message expected in state 'ready'"):
        clients[0].receive(encode(ConsistencyRequest(sid, 0, 0, (0, 1, 2, 3))))
    assert clients[0].state == "aborted"
    m = clients[1].provide_input(inp, np.ones(3))[0]
    assert server.receive(m) == [] and server.stage == "ready" and "ready" in str(server.rejected[-1][1])
    # provide_input twice: aborted (a second masked input would difference two inputs under one mask)
    with pytest.raises(ProtocolError, match="provide_input"):
        clients[1].provide_input(inp, np.zeros(3))
    assert clients[1].state == "aborted"
    # a bad input leaves the client ready, nothing sent
    with pytest.raises(ConfigError, match="update.size"):
        clients[2].provide_input(inp, np.ones(5))
    assert clients[2].state == "ready"
    with pytest.raises(ConfigError, match="InputSpec"):
        clients[2].provide_input(encode_input(inp), np.ones(3))
    # a construction-schedule client has its input: provide_input aborts it
    full = su.bind(inp)
    c = SecAggClient(full, 0, identities(4)[0][0], np.ones(3))
    with pytest.raises(ProtocolError):
        c.provide_input(inp, np.ones(3))
    # open_input twice aborts the server
    server.open_input(inp)
    with pytest.raises(ProtocolError, match="open_input"):
        server.open_input(inp)
    assert server.stage == "aborted"
    # construction-time refusals
    with pytest.raises(ConfigError, match="update"):
        SecAggClient(su, 0, identities(4)[0][0], np.ones(3))
    with pytest.raises(ConfigError, match="update"):
        SecAggClient(full, 0, identities(4)[0][0])
    with pytest.raises(ConfigError, match="schedule"):
        SecAggClient(su, 0, identities(4)[0][0], schedule="construction")
    with pytest.raises(ConfigError, match="schedule"):
        SecAggServer(full, schedule="sometimes")


def test_a_floor_known_only_with_the_input_part_can_be_raised_at_provide_input():
    """Distributed DP: the plan (and with it t_DP + dp-colluders) comes with the input request; a client raises its
    survivor-set floor then, and refuses to sign a smaller set (nothing revealed)."""
    n, d = 6, 3
    ((su, server, stored),) = set_up_rounds(n, 1)
    priv = identities(n)[0]
    inp = input_part(n, d)
    server.open_input(inp)
    clients = {i: load_client(b, su, priv[i]) for i, b in stored.items()}
    with pytest.raises(ConfigError, match="min_survivors"):
        clients[0].provide_input(inp, np.ones(d), min_survivors=n + 1)
    assert clients[0].state == "ready"
    out = []
    for i in range(n - 1):  # site 5 never sends its masked input: U has 5 members
        out += server.receive(clients[i].provide_input(inp, np.ones(d), min_survivors=n if i == 0 else None)[0])
    out += server.tick(server.deadline)
    assert server.stage == "consistency"
    replies = {rid: clients[rid] for rid, _ in out}
    with pytest.raises(SecureFedError, match="refuses a survivor set of 5"):
        replies[0].receive(dict(out)[0])
    assert replies[1].receive(dict(out)[1])  # floor not raised: site 1 signs


def test_the_ready_server_has_no_deadline_and_the_masked_stage_times_out_from_open_input():
    _, server, _ = _ready_clients()
    assert server.tick(1e12) == [] and server.stage == "ready"
    server.open_input(input_part(4, 3), now=5.0)
    assert server.deadline == 5.0 + DEFAULT_TIMEOUTS["masked"]
    with pytest.raises(ProtocolTimeoutError):
        server.tick(server.deadline)  # nobody sent a masked input
    assert server.stage == "aborted"


def test_stored_state_refuses_another_spec():
    su, _, clients = _ready_clients()
    priv = identities(4)[0]
    other, _ = setup(4)
    blob = dump_client(clients[0])
    with pytest.raises(DecodeError, match="another setup part"):
        load_client(blob, other, priv[0])
    inp = input_part(4, 3)
    assert load_client(blob, su.bind(inp), priv[0]).spec == su  # a full spec with this setup: setup part used
    c = load_client(blob, su, priv[0])
    c.provide_input(inp, np.ones(3))
    bound = dump_client(c)
    with pytest.raises(DecodeError, match="another input part"):
        load_client(bound, su.bind(input_part(4, 3, task=b"other")), priv[0])
    with pytest.raises(DecodeError, match="another input part"):
        load_client(bound, su, priv[0])
    assert load_client(bound, su.bind(inp), priv[0]).state == "masked"
    with pytest.raises(DecodeError):
        load_client(b"{not json", su, priv[0])


# ------------------------------------------------------------------------------------------ codecs

sess = st.binary(min_size=16, max_size=16)
ids = st.integers(0, 2**32 - 1)
sorted_ids = st.lists(st.integers(0, 10_000), unique=True, max_size=12).map(lambda xs: tuple(sorted(xs)))
BOUND = st.builds(
    BoundConsistencyRequest,
    sess,
    st.integers(0, 2**32 - 1),
    ids,
    sorted_ids,
    st.lists(
        st.builds(InputDigest, ids, st.binary(min_size=32, max_size=32), st.binary(min_size=64, max_size=64)),
        max_size=5,
    ).map(tuple),
)


@settings(max_examples=200, deadline=None)
@given(BOUND, st.data())
def test_bound_consistency_request_round_trips_and_mutations_are_refused_or_reencode(msg, data):
    raw = M.encode(msg)
    assert M.decode(raw) == msg and M.decode(raw, expected=BoundConsistencyRequest) == msg
    b = bytearray(raw)
    op = data.draw(st.sampled_from(["flip", "cut", "extend"]))
    if op == "flip":
        i = data.draw(st.integers(0, len(b) - 1))
        b[i] ^= data.draw(st.integers(1, 255))
    elif op == "cut":
        b = b[: data.draw(st.integers(0, len(b) - 1))]
    else:
        b += data.draw(st.binary(min_size=1, max_size=8))
    try:
        out = M.decode(bytes(b))
    except DecodeError:
        return
    assert op == "flip" and M.encode(out) == bytes(b)


@settings(max_examples=100, deadline=None)
@given(
    st.integers(2, 40),
    st.integers(1, 10**6),
    st.booleans(),
    st.binary(min_size=32, max_size=32),
    st.integers(16, 64),
    st.integers(0, 2**32 - 1),
)
def test_spec_parts_round_trip_and_join_to_the_whole(n, length, integer, task, bits, rnd):
    from securefed.securesum.quantize import integer_plan

    task = task if task != bytes(32) else b"\x01" * 32
    keys = tuple(bytes([i % 256]) * 32 for i in range(n))
    su = SetupSpec(b"s" * 16, rnd, n, n - 1, max(1, n // 2), b"g", keys, tuple(DEFAULT_TIMEOUTS.items()), 0)
    fp = integer_plan(bits, n) if integer else plan_fixed_point(1.0, np.ones(n), modulus_bits=bits)
    inp = InputSpec(length, fp, integer, task)
    assert decode_setup(encode_setup(su)) == su and decode_input(encode_input(inp)) == inp
    whole = RoundSpec(
        b"s" * 16,
        rnd,
        n,
        n - 1,
        max(1, n // 2),
        b"g",
        length,
        fp,
        keys,
        tuple(DEFAULT_TIMEOUTS.items()),
        0,
        integer,
        task,
    )
    assert su.bind(inp) == whole and su.bind(inp).digest == whole.digest and whole.setup.digest == su.digest


def test_spec_part_codecs_are_strict():
    su, _ = setup(3)
    inp = input_part(3, 2)
    for raw, dec, match in (
        (encode_setup(su), decode_input, "part"),
        (encode_input(inp), decode_setup, "part"),
        (encode_setup(su).replace(b'"v": 1', b'"v": 2'), decode_setup, "version"),
        (encode_input(inp)[:-1] + b', "weight": 3}', decode_input, "unknown fields"),
        (encode_spec(su.bind(inp))[:-1] + b', "extra": 1}', decode_spec, "unknown fields"),
        (b"[1, 2]", decode_setup, "version"),
        (b"\xff", decode_input, "malformed"),
        (encode_input(inp).replace(b'"length": 2', b'"length": "x"'), decode_input, "malformed"),
    ):
        with pytest.raises(DecodeError, match=match):
            dec(raw)
    with pytest.raises(ConfigError, match="InputSpec"):
        su.bind(dataclasses.asdict(inp))


@pytest.mark.parametrize("mode", ["construction", "late-auto", "late"])
def test_every_client_state_survives_a_fresh_process_per_message(mode):
    """As on Flower: each message is handled by a client rebuilt from its stored bytes, in every state of every
    schedule (the late-bound client stored in init, advertised, shared, ready, masked, signed and done)."""
    n, d = 5, 6
    su, _ = setup(n)
    inp = input_part(n, d)
    full = su.bind(inp)
    priv = identities(n)[0]
    xs = [np.arange(d) + 10.0 * i for i in range(n)]
    if mode == "late":
        clients = {i: SecAggClient(su, i, priv[i]) for i in range(n)}
        server = SecAggServer(su)
    else:
        sched = "construction" if mode == "construction" else "late"
        clients = {i: SecAggClient(full, i, priv[i], xs[i], 1.0, i, schedule=sched) for i in range(n)}
        server = SecAggServer(full, schedule=sched)
    stored = {i: dump_client(c) for i, c in clients.items()}
    states = set()

    def handle(i, fn):
        c = load_client(stored[i], full, priv[i])  # the full spec: load_client uses its setup part while unbound
        states.add(c.state)
        replies = fn(c)
        stored[i] = dump_client(c)
        states.add(c.state)
        return replies

    out = [m for i in range(n) for r in handle(i, lambda c: c.start()) for m in server.receive(r)]
    while not server.done:
        nxt = []
        for rid, data in out:
            nxt += [m for r in handle(rid, lambda c, data=data: c.receive(data)) for m in server.receive(r)]
        if server.stage == "ready":  # the late-bound round: ForwardedShares first, then bind the input part
            assert all(r == [] for rid, data in nxt for r in [handle(rid, lambda c, data=data: c.receive(data))])
            server.open_input(inp)
            nxt = [
                m
                for i in range(n)
                for r in handle(i, lambda c, i=i: c.provide_input(inp, xs[i]))
                for m in server.receive(r)
            ]
        out = nxt
    assert server.stage == "done" and server.survivors == tuple(range(n))
    np.testing.assert_array_equal(dequantize(server.result, inp.fixed_point), np.sum(xs, axis=0))
    want = {"init", "advertised", "shared", "masked", "signed", "done"} | ({"ready"} if mode == "late" else set())
    assert want <= states
    proof = server.proof()
    for i in range(n):  # the stored "done" client still checks the sum proof against its own view
        np.testing.assert_array_equal(load_client(stored[i], full, priv[i]).verify_sum(proof), server.result)
