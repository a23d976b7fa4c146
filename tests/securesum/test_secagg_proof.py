"""Issue 24 item 2: aggregates a site can verify. The SecAgg+ server's sum proof, checked by every survivor.

The honest proof verifies at every survivor (with and without dropouts, fixed-point and integer rounds, both
schedules) and proves exactly the survivors' sum (checked against the plain sum of the inputs, not against the
server). Every forgery a coordinator can make of the total or of the evidence — one word of the total, another
count vector with the same total count, a survivor left out, a dropped client added, a seed or a mask key that
is not the committed one, a missing signature, an input changed to match a forged total — is detected by every
honest survivor, with the check that failed named.
"""

import dataclasses
import os

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from securefed.errors import DecodeError, ProtocolError
from securefed.securesum import crypto
from securefed.securesum import messages as M
from securefed.securesum.graph import choose_parameters
from securefed.securesum.machine import drive_round
from securefed.securesum.quantize import dequantize, integer_plan, plan_fixed_point
from securefed.securesum.runner import MESSAGE_STAGE
from securefed.securesum.secagg import DEFAULT_TIMEOUTS, STAGES, RoundSpec
from securefed.securesum.secagg_client import SecAggClient
from securefed.securesum.secagg_proof import SumProofError, verify_sum
from securefed.securesum.secagg_server import SecAggServer

_KEYS: dict = {}


def identities(n):
    if n not in _KEYS:
        keys = [crypto.ed25519_keypair() for _ in range(n)]
        _KEYS[n] = (tuple(k for k, _ in keys), tuple(p for _, p in keys))
    return _KEYS[n]


def run(n=8, d=12, drop=None, integer=False, xs=None, seed=0):
    gp = choose_parameters(n)
    sid = os.urandom(16)
    fp = integer_plan(24, n) if integer else plan_fixed_point(100.0, np.ones(n), modulus_bits=32, fractional_bits=0)
    spec = RoundSpec(
        sid,
        0,
        n,
        gp.degree,
        gp.threshold,
        sid,
        d,
        fp,
        identities(n)[1],
        tuple(DEFAULT_TIMEOUTS.items()),
        gp.quorum,
        integer,
    )
    rng = np.random.default_rng(seed)
    if xs is None:
        xs = [
            rng.integers(0, 1 << 24, d, dtype=np.uint64) if integer else rng.integers(-100, 101, d).astype(float)
            for _ in range(n)
        ]
    clients = [SecAggClient(spec, i, identities(n)[0][i], xs[i], 1.0, rng) for i in range(n)]
    server = SecAggServer(spec)
    out = drive_round(server, clients, MESSAGE_STAGE, STAGES, drop_at=drop or {})
    assert out.error is None, out.error
    return spec, server, clients, xs, out


def exact(spec, xs, survivors):
    if spec.integer:
        return np.array([sum(int(xs[u][j]) for u in survivors) % (1 << 24) for j in range(spec.length)])
    return np.sum([xs[u] for u in survivors], axis=0)


def honest_survivors(out, clients):
    return [u for u in out.survivors if clients[u].state == "done"]


def forge(proof: bytes, **changes) -> bytes:
    return M.encode(dataclasses.replace(M.decode(proof), **changes))


def refused_by_all(clients, survivors, proof, reasons):
    for u in survivors:
        with pytest.raises(SumProofError) as err:
            clients[u].verify_sum(proof)
        assert err.value.reason in reasons, (u, err.value)


# ------------------------------------------------------------------------------------------ honest


@pytest.mark.usefixtures("schedule")
@pytest.mark.parametrize("integer", [False, True])
@pytest.mark.parametrize("drop", [None, {7: "masked"}, {6: "share", 7: "consistency"}, {5: "unmask"}])
def test_the_honest_proof_verifies_at_every_survivor(integer, drop):
    spec, server, clients, xs, out = run(drop=drop, integer=integer)
    proof = server.proof()
    for u in honest_survivors(out, clients):
        words = clients[u].verify_sum(proof)
        np.testing.assert_array_equal(words, server.result)
        got = words.astype(np.int64) if integer else dequantize(words, spec.fixed_point)
        np.testing.assert_array_equal(got, exact(spec, xs, out.survivors))  # the plain sum, not the server's word
    if drop and "masked" in drop.values():  # a dropped client's masks had to be removed: its key is in the proof
        assert [e.owner for e in M.decode(proof).mask_keys] == [7]
    assert M.decode(proof).survivors == out.survivors


# ------------------------------------------------------------------------------------------ forged


def test_a_forged_total_one_word_changed_is_detected_by_every_survivor():
    _, server, clients, _, out = run(drop={7: "masked"})
    proof = server.proof()
    total = bytearray(M.decode(proof).total)
    total[4] ^= 1
    refused_by_all(clients, out.survivors, forge(proof, total=bytes(total)), {"forged-total"})


def test_a_wrong_count_vector_with_the_same_total_count_is_detected():
    """A cells round: each site uploads its record counts per cell; the coordinator releases another count
    vector with the same total (one record moved between cells) — every survivor detects it."""
    n, d = 6, 5
    rng = np.random.default_rng(3)
    counts = [np.bincount(rng.integers(0, d, 40), minlength=d).astype(float) for _ in range(n)]
    spec, server, clients, _, out = run(n=n, d=d, xs=counts)
    proof = server.proof()
    fake = np.frombuffer(M.decode(proof).total, dtype=np.uint32).copy()
    fake[0] += 1
    fake[1] -= 1
    assert dequantize(fake, spec.fixed_point).sum() == sum(c.sum() for c in counts)
    refused_by_all(clients, out.survivors, forge(proof, total=fake.tobytes()), {"forged-total"})


def test_a_forged_total_backed_by_a_changed_input_is_detected():
    _, server, clients, _, out = run()
    p = M.decode(proof := server.proof())
    total = np.frombuffer(p.total, dtype=np.uint32).copy()
    total[0] += 5
    e = p.inputs[2]
    data = np.frombuffer(e.data, dtype=np.uint32).copy()
    data[0] += 5  # the recomputed sum would now match the forged total
    inputs = p.inputs[:2] + (dataclasses.replace(e, data=data.tobytes()),) + p.inputs[3:]
    bad = forge(proof, total=total.tobytes(), inputs=inputs)
    refused_by_all(clients, [u for u in out.survivors if u != 2], bad, {"input-signature"})
    with pytest.raises(SumProofError, match="own-input|another masked input"):
        clients[2].verify_sum(bad)


def test_a_proof_that_drops_a_survivor_is_detected():
    spec, server, clients, _, out = run()
    p = M.decode(proof := server.proof())
    v = 3

    def keep(lst, f):
        return tuple(e for e in lst if f(e) != v)

    bad = forge(
        proof,
        survivors=tuple(u for u in p.survivors if u != v),
        inputs=keep(p.inputs, lambda e: e.sender),
        seeds=keep(p.seeds, lambda e: e.owner),
        signatures=keep(p.signatures, lambda e: e.signer),
        keys=keep(p.keys, lambda e: e.sender),
    )
    with pytest.raises(SumProofError) as err:
        clients[v].verify_sum(bad)
    assert err.value.reason in ("own-input", "survivor-set")
    refused_by_all(clients, [u for u in out.survivors if u != v], bad, {"survivor-set", "consistency-signatures"})
    # even against a verifier that does not know the set it signed: the signatures are on the true set
    with pytest.raises(SumProofError, match="consistency-signatures"):
        verify_sum(bad, spec, 0)


def test_a_proof_that_adds_a_dropped_client_is_detected():
    spec, server, clients, _, out = run(drop={7: "masked", 6: "advertise"})
    p = M.decode(proof := server.proof())
    # 6 dropped at advertise: no survivor masked with it; the server adds a key of its own for it
    sk, pk = crypto.x25519_keypair()
    extra_key = M.KeyEntry(6, pk, pk, bytes(32), bytes(64))
    bad = forge(
        proof,
        keys=tuple(sorted(p.keys + (extra_key,), key=lambda e: e.sender)),
        mask_keys=tuple(
            sorted(p.mask_keys + (M.SecretEntry(6, crypto.x25519_private_bytes(sk)),), key=lambda e: e.owner)
        ),
    )
    refused_by_all(clients, out.survivors, bad, {"advertisement", "mask-key"})
    # 7 dropped after the share stage: the server moves it into U with an input it made up
    fake = M.ProofInput(7, tuple(range(6)), bytes(len(p.inputs[0].data)), bytes(64))
    bad = forge(proof, survivors=p.survivors + (7,), inputs=p.inputs + (fake,))
    refused_by_all(clients, out.survivors, bad, {"consistency-signatures", "survivor-set"})
    with pytest.raises(SumProofError, match="consistency-signatures"):
        verify_sum(bad, spec, 0)


def test_secrets_not_matching_their_commitments_are_detected():
    _, server, clients, _, out = run(drop={7: "masked"})
    p = M.decode(proof := server.proof())
    seeds = (dataclasses.replace(p.seeds[0], secret=os.urandom(32)),) + p.seeds[1:]
    refused_by_all(clients, out.survivors, forge(proof, seeds=seeds), {"seed-commitment"})
    mask_keys = (dataclasses.replace(p.mask_keys[0], secret=os.urandom(32)),)
    refused_by_all(clients, out.survivors, forge(proof, mask_keys=mask_keys), {"mask-key"})
    refused_by_all(clients, out.survivors, forge(proof, mask_keys=()), {"mask-key"})  # a needed key left out


def test_a_missing_signature_is_detected():
    spec, server, clients, _, out = run()
    p = M.decode(proof := server.proof())
    q = spec.signatures_needed
    refused_by_all(clients, out.survivors, forge(proof, signatures=p.signatures[: q - 1]), {"consistency-signatures"})
    forged_sig = (dataclasses.replace(p.signatures[0], signature=bytes(64)),) + p.signatures[1:]
    refused_by_all(clients, out.survivors, forge(proof, signatures=forged_sig), {"consistency-signatures"})


def test_a_proof_of_another_round_or_malformed_is_refused():
    _, server, clients, _, _ = run()
    _, other, _, _, _ = run()
    with pytest.raises(SumProofError, match="malformed"):
        clients[0].verify_sum(other.proof())  # another session
    with pytest.raises(SumProofError, match="malformed"):
        clients[0].verify_sum(server.proof()[:-1])
    with pytest.raises(SumProofError, match="spec"):
        clients[0].verify_sum(forge(server.proof(), digest=bytes(32)))
    with pytest.raises(SumProofError, match="schedule"):
        clients[0].verify_sum(forge(server.proof(), schedule=1))


def test_proof_only_after_done_and_until_forgotten():
    spec, server, _, _, _ = run()
    server.forget()
    with pytest.raises(ProtocolError, match="no sum proof"):
        server.proof()
    with pytest.raises(ProtocolError, match="no sum proof"):
        SecAggServer(spec).proof()
    with pytest.raises(ProtocolError, match="after the round"):
        SecAggClient(spec, 0, identities(8)[0][0], np.zeros(12)).verify_sum(b"")


# ------------------------------------------------------------------------------------------ codec

b32 = st.binary(min_size=32, max_size=32)
b64 = st.binary(min_size=64, max_size=64)
ids = st.integers(0, 2**32 - 1)
sorted_ids = st.lists(st.integers(0, 10_000), unique=True, max_size=8).map(lambda xs: tuple(sorted(xs)))
PROOFS = st.builds(
    M.SumProof,
    st.binary(min_size=16, max_size=16),
    st.integers(0, 2**32 - 1),
    st.integers(0, 255),
    b32,
    sorted_ids,
    st.integers(0, 255),
    st.binary(max_size=64),
    st.lists(st.builds(M.ProofInput, ids, sorted_ids, st.binary(max_size=32), b64), max_size=3).map(tuple),
    st.lists(st.builds(M.SignatureEntry, ids, b64), max_size=3).map(tuple),
    st.lists(st.builds(M.KeyEntry, ids, b32, b32, b32, b64), max_size=3).map(tuple),
    st.lists(st.builds(M.SecretEntry, ids, b32), max_size=3).map(tuple),
    st.lists(st.builds(M.SecretEntry, ids, b32), max_size=3).map(tuple),
)


@settings(max_examples=200, deadline=None)
@given(PROOFS, st.data())
def test_sum_proof_round_trips_and_mutations_are_refused_or_reencode(msg, data):
    raw = M.encode(msg)
    assert M.decode(raw) == msg
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
