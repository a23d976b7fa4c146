"""Issue 25 item 1: the task digest is bound into every sum; a server that equivocates on it unmasks nobody.

The attack: the coordinator sends one site (the victim) another request than the others — e.g. a scale of
1e300 so that the victim's upload dominates the sum — and announces a spec whose ``task_digest`` is that
request's digest, while the others get the honest request and its digest. Every signature of the round covers
the spec digest, so the victim's messages verify for nobody else and the others' verify not for the victim.

Executed against the real client machines with the worst relay we can write: a **blind relay** that forwards
every message to everybody it could concern and checks nothing (so no honest server check helps), and a
**split server** that runs one honest server machine per digest, with c colluding sites that sign under both
digests. Measured: nobody reveals a single unmask share of a round in which any two sites held different
digests unless one digest group alone reaches the quorum (2q > n + c: at most one can), the victim never sends
a masked input, and a 4-site round with one victim aborts before any unmask share is revealed. The same for
CKKS: the victim never encrypts its input under a context signed for another digest.
"""

import os

import numpy as np
import pytest

from securefed.errors import AuthenticationError, ConfigError, DecodeError, ProtocolError, SecureFedError
from securefed.securesum import crypto
from securefed.securesum.graph import choose_parameters
from securefed.securesum.machine import drive_round
from securefed.securesum.messages import (
    ConsistencyRequest,
    EncryptedShares,
    ForwardedShares,
    KeyEntry,
    KeysBroadcast,
    MaskedInput,
    ShareItem,
    SignatureEntry,
    UnmaskRequest,
    UnmaskResponse,
    decode,
    encode,
)
from securefed.securesum.quantize import plan_fixed_point
from securefed.securesum.runner import MESSAGE_STAGE
from securefed.securesum.secagg import DEFAULT_TIMEOUTS, NO_TASK, STAGES, RoundSpec, decode_spec, encode_spec
from securefed.securesum.secagg_client import SecAggClient
from securefed.securesum.secagg_server import SecAggServer
from securefed.securesum.task import check_task_digest, task_digest

_KEYS: dict = {}
D = 5


def identities(n):
    if n not in _KEYS:
        keys = [crypto.ed25519_keypair() for _ in range(n)]
        _KEYS[n] = (tuple(k for k, _ in keys), tuple(p for _, p in keys))
    return _KEYS[n]


def specs(n, tasks):
    """One spec per task digest, identical in every other field (the same session and round)."""
    gp = choose_parameters(n)
    sid = os.urandom(16)
    fp = plan_fixed_point(100.0, np.ones(n), modulus_bits=32, fractional_bits=4)
    return gp, [
        RoundSpec(
            sid,
            0,
            n,
            gp.degree,
            gp.threshold,
            sid,
            D,
            fp,
            identities(n)[1],
            tuple(DEFAULT_TIMEOUTS.items()),
            gp.quorum,
            False,
            t,
        )
        for t in tasks
    ]


HONEST = task_digest({"task": "cells", "scale": 1.0, "centres": np.zeros((3, 2))})
FORGED = task_digest({"task": "cells", "scale": 1e300, "centres": np.zeros((3, 2))})


# ---------------------------------------------------------------------------------------- the digest itself


def test_task_digest_is_canonical_and_names_every_field():
    a = {"task": "cells", "scale": 0.1, "centres": np.arange(6.0).reshape(3, 2), "noise": None, "bits": 16}
    assert task_digest(a) == task_digest(dict(reversed(list(a.items()))))  # key order does not matter
    changed = [
        dict(a, scale=0.1 + 2**-56),
        dict(a, centres=np.arange(6.0).reshape(2, 3)),
        dict(a, centres=np.arange(6, dtype=np.float32).reshape(3, 2)),
        dict(a, noise="distributed"),
        dict(a, bits=17),
        dict(a, extra=b""),
        {k: v for k, v in a.items() if k != "bits"},
    ]
    digests = {task_digest(a)} | {task_digest(c) for c in changed}
    assert len(digests) == len(changed) + 1  # every change of every field changes the digest
    with pytest.raises(ConfigError, match="task field"):
        task_digest({"task": object()})


def test_spec_encodes_as_before_without_a_task_and_round_trips_with_one():
    gp, (plain, tasked) = specs(4, [NO_TASK, HONEST])
    assert b"task" not in encode_spec(plain) and decode_spec(encode_spec(plain)) == plain
    assert decode_spec(encode_spec(tasked)).task_digest == HONEST and plain.digest != tasked.digest
    for bad in ('"' + "00" * 32 + '"', '"abcd"', "7"):
        raw = encode_spec(tasked).replace(('"' + HONEST.hex() + '"').encode(), bad.encode())
        with pytest.raises(DecodeError, match="task digest"):
            decode_spec(raw)
    with pytest.raises(ConfigError, match="task_digest"):
        RoundSpec(
            plain.session_id,
            0,
            4,
            gp.degree,
            gp.threshold,
            plain.graph_seed,
            D,
            plain.fixed_point,
            plain.identity_keys,
            plain.timeouts,
            gp.quorum,
            False,
            b"short",
        )
    with pytest.raises(ProtocolError, match="another request"):
        check_task_digest(tasked, {"task": "cells", "scale": 1e300, "centres": np.zeros((3, 2))})
    assert check_task_digest(tasked, {"task": "cells", "scale": 1.0, "centres": np.zeros((3, 2))}) == HONEST


# ------------------------------------------------------------------------------------ a blind relay


def blind_relay(spec_of, xs):
    """Forward every message to everybody it concerns, check nothing. Returns (errors, unmask senders,
    masked-input senders): what each client raised, who revealed shares, who sent a masked input."""
    n = len(spec_of)
    priv = identities(n)[0]
    ref = spec_of[0]
    clients = [SecAggClient(spec_of[i], i, priv[i], xs[i], 1.0, np.random.default_rng(i)) for i in range(n)]
    errors, alive = {}, set(range(n))

    def deliver(i, data):
        if i not in alive:
            return []
        try:
            return [decode(m) for m in clients[i].receive(data)]
        except SecureFedError as exc:
            errors[i] = f"{type(exc).__name__}: {exc}"
            alive.discard(i)
            return []

    adverts = {i: decode(clients[i].start()[0]) for i in range(n)}
    sid, rnd = ref.session_id, ref.round_index
    shares = {}
    for i in range(n):
        entries = tuple(
            KeyEntry(v, a.c_pk, a.s_pk, a.commit, a.signature)
            for v, a in sorted(adverts.items())
            if v in ref.neighbours[i]
        )
        for m in deliver(i, encode(KeysBroadcast(sid, rnd, i, entries))):
            assert isinstance(m, EncryptedShares)
            shares[i] = m
    masked = {}
    for i in range(n):
        items = tuple(
            ShareItem(v, it.ciphertext, it.h_b, it.h_s, it.signature)
            for v, m in sorted(shares.items())
            for it in m.items
            if it.peer == i
        )
        for m in deliver(i, encode(ForwardedShares(sid, rnd, i, items))):
            assert isinstance(m, MaskedInput)
            masked[i] = m
    surv = tuple(sorted(masked))
    sigs = {}
    for i in surv:
        for m in deliver(i, encode(ConsistencyRequest(sid, rnd, i, surv))):
            sigs[i] = m.signature
    revealed = set()
    entries = tuple(SignatureEntry(v, s) for v, s in sorted(sigs.items()))
    for i in sorted(sigs):
        for m in deliver(i, encode(UnmaskRequest(sid, rnd, i, surv, entries))):
            assert isinstance(m, UnmaskResponse)
            revealed.add(i)
    return errors, revealed, set(masked)


def test_blind_relay_four_sites_one_victim_round_aborts_before_any_unmask_share():
    _, (honest, forged) = specs(4, [HONEST, FORGED])
    xs = [np.ones(D) for _ in range(4)]
    # control: the same relay with one digest completes (the test can fail)
    errors, revealed, masked = blind_relay([honest] * 4, xs)
    assert errors == {} and revealed == {0, 1, 2, 3}
    errors, revealed, masked = blind_relay([honest, honest, honest, forged], xs)
    assert revealed == set() and masked == set()  # nothing revealed, nobody even masked an input
    assert "only 0 usable neighbours" in errors[3]  # the victim verifies nobody's keys
    assert all("usable neighbours" in errors[i] for i in range(3))  # t = 3 but only 2 peers verify


def test_blind_relay_ten_sites_the_victim_reveals_nothing_and_is_in_no_sum():
    n = 10
    _, (honest, forged) = specs(n, [HONEST, FORGED])
    errors, revealed, masked = blind_relay([honest] * (n - 1) + [forged], [np.ones(D)] * n)
    assert set(errors) == {n - 1} and "only 0 usable neighbours" in errors[n - 1]
    assert n - 1 not in masked and n - 1 not in revealed  # the victim never masked its input
    assert revealed == set(range(n - 1))  # the others complete a round without the victim


# ------------------------------------------------------------------------------------ a split server


def split_round(n, group_b: set, colluders: set):
    """One honest server machine per digest: group B (and the colluders, who run a second machine under B's
    digest with the same identity key) on FORGED, the rest (and the colluders) on HONEST. Returns the two
    outcomes: the most an equivocating server gets out of the round."""
    _, (honest, forged) = specs(n, [HONEST, FORGED])
    priv = identities(n)[0]
    rng = np.random.default_rng(0)
    xs = [rng.integers(-100, 100, D).astype(float) for _ in range(n)]
    out = {}
    for name, spec, members in (("A", honest, set(range(n)) - group_b), ("B", forged, group_b)):
        members = members | colluders
        clients = [SecAggClient(spec, i, priv[i], xs[i], 1.0, rng) for i in range(n)]
        drop = {i: "advertise" for i in range(n) if i not in members}
        out[name] = drive_round(SecAggServer(spec), clients, MESSAGE_STAGE, STAGES, drop_at=drop)
    return out


@pytest.mark.parametrize("n", [4, 5, 8, 10])
def test_split_server_at_most_one_digest_reveals_and_a_lone_victim_never_does(n):
    gp = choose_parameters(n)
    Z = set(range(gp.colluders))
    H = [i for i in range(n) if i not in Z]
    cases = [{H[-1]}] + [set(H[-a:]) for a in {len(H) // 2, (len(H) + 1) // 2, gp.quorum - len(Z)} if 0 < a < len(H)]
    for group_b in cases:
        out = split_round(n, group_b, Z)
        assert min(out["A"].revealed, out["B"].revealed) == 0, (n, group_b)  # one digest at most
        for o in out.values():
            if o.revealed:
                assert o.error is None  # a group that reveals completes its own sum, over its own digest only
        if len(group_b) == 1:  # one victim: its round aborts before any share is revealed, nothing masked
            b, a, victim = out["B"], out["A"], next(iter(group_b))
            assert b.aborted and b.revealed == 0 and b.result is None and "advertised valid keys" in str(b.error)
            if n >= 5:  # the others (one dropout tolerated) complete a sum over their own digest, without the victim
                assert a.error is None and a.revealed > 0 and victim not in a.survivors


def test_split_server_every_split_of_the_counting_model_reveals_one_digest_at_most():
    """Exhaustive over the splits of the honest sites into two digest groups (the colluders sign both): a group
    reveals only with q signatures from its own members plus colluders; 2q > n + c leaves room for one."""
    for n in range(3, 11):
        for c in range(3):
            try:
                gp = choose_parameters(n, colluders=c)
            except SecureFedError:
                continue
            for k in range(n - c + 1):
                a, b = n - c - k, k
                assert not (a + c >= gp.quorum and b + c >= gp.quorum), (n, c, k)


# ---------------------------------------------------------------------------------------------- CKKS


def _ckks(n=4, d=8):
    from securefed.securesum.ckks import CKKSClient, CKKSRoundSpec, choose_ckks_parameters

    params = choose_ckks_parameters(d, 1e-6, float(n), n)
    sid = os.urandom(16)
    honest, forged = (
        CKKSRoundSpec(sid, 0, n, 0, params, 1.0, identities(n)[1], max_abs_sum=float(n), task_digest=t)
        for t in (HONEST, FORGED)
    )
    xs = [np.random.default_rng(i).uniform(-1, 1, d) for i in range(n)]
    return CKKSClient, honest, forged, xs, params


def test_ckks_spec_encodes_as_before_without_a_task_and_round_trips_with_one():
    from securefed.securesum.ckks import decode_ckks_spec, encode_ckks_spec

    _, honest, _, _, _ = _ckks()
    plain = type(honest)(
        **{
            f: getattr(honest, f)
            for f in ("session_id", "round_index", "n_clients", "key_holder", "params", "clip", "identity_keys")
        },
        max_abs_sum=4.0,
    )
    assert b"task" not in encode_ckks_spec(plain) and decode_ckks_spec(encode_ckks_spec(plain)) == plain
    assert decode_ckks_spec(encode_ckks_spec(honest)).task_digest == HONEST and plain.digest != honest.digest
    with pytest.raises(DecodeError, match="task digest"):
        decode_ckks_spec(encode_ckks_spec(honest).replace(HONEST.hex().encode(), b"00" * 32))


def test_ckks_victim_never_encrypts_under_a_context_signed_for_another_digest():
    from securefed.securesum.ckks import CKKSServer
    from securefed.securesum.ckks.params import CKKS_STAGES
    from securefed.securesum.ckks.runner import MESSAGE_STAGE as CKKS_MESSAGE_STAGE
    from securefed.securesum.messages import PublicContext, SignedInput, peek_header

    CKKSClient, honest, forged, xs, _ = _ckks()
    priv = identities(4)[0]
    # the victim (client 3, not a key holder) holds the forged spec; watch what the key holder publishes
    clients = [CKKSClient(forged if i == 3 else honest, i, priv[i], xs[i]) for i in range(4)]
    seen = {}

    def watch(direction, who, data):
        cls = peek_header(data)[0]
        if direction == "up" and cls is PublicContext:
            seen["ctx"] = data
        if direction == "up" and cls is SignedInput:
            seen.setdefault("uploads", set()).add(who)
        return [data]

    out = drive_round(CKKSServer(honest), clients, CKKS_MESSAGE_STAGE, CKKS_STAGES, intercept=watch)
    assert out.error is None and 3 not in out.survivors and 3 not in seen["uploads"]  # the server refused its keys
    assert any("client 3" in r and "signature" in r for r in out.rejected)
    # a malicious relay hands the victim the holder's public context anyway: refused, nothing encrypted
    victim = CKKSClient(forged, 3, priv[3], xs[3])
    victim.start()
    with pytest.raises(AuthenticationError, match="public context"):
        victim.receive(seen["ctx"])
    assert victim.state == "aborted" and victim._update is None


def test_ckks_key_holder_shown_another_digest_round_aborts_before_any_upload():
    from securefed.securesum.ckks import CKKSServer
    from securefed.securesum.ckks.params import CKKS_STAGES
    from securefed.securesum.ckks.runner import MESSAGE_STAGE as CKKS_MESSAGE_STAGE
    from securefed.securesum.messages import PublicContext

    CKKSClient, honest, forged, xs, _ = _ckks()
    priv = identities(4)[0]
    clients = [CKKSClient(forged if i == 0 else honest, i, priv[i], xs[i]) for i in range(4)]
    out = drive_round(CKKSServer(honest), clients, CKKS_MESSAGE_STAGE, CKKS_STAGES)
    assert out.aborted and out.result is None and "key holder" in str(out.error)
    # a blind relay forwards the holder's context (signed under the forged digest) to the others: every one
    # refuses it and encrypts nothing
    holder = CKKSClient(forged, 0, priv[0], xs[0])
    adv = decode(holder.start()[0])
    reply = holder.receive(
        encode(KeysBroadcast(forged.session_id, 0, 0, (KeyEntry(0, adv.c_pk, adv.s_pk, adv.commit, adv.signature),)))
    )
    ctx = next(m for m in reply if decode(m).__class__ is PublicContext)
    for i in (1, 2, 3):
        c = CKKSClient(honest, i, priv[i], xs[i])
        c.start()
        if i in honest.fallbacks:  # a fallback waits for the holder's key first: its advertisement is refused
            with pytest.raises(AuthenticationError):
                c.receive(
                    encode(
                        KeysBroadcast(
                            honest.session_id, 0, i, (KeyEntry(0, adv.c_pk, adv.s_pk, adv.commit, adv.signature),)
                        )
                    )
                )
        else:
            with pytest.raises(AuthenticationError, match="public context"):
                c.receive(ctx)
        assert c.state == "aborted"
