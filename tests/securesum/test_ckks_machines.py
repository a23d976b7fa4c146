"""CKKS client/server state machines: stage by stage, dropouts, faults, the decryptor's check, persistence,
who holds the secret key (the key holder and one fallback only), decryption hygiene (the step, the flood, the
range check)."""

import dataclasses
import math

import numpy as np
import pytest

from securefed.errors import (
    AuthenticationError,
    ConfigError,
    DecodeError,
    ProtocolAbortedError,
    ProtocolError,
    ProtocolTimeoutError,
)
from securefed.securesum import crypto
from securefed.securesum import ckks
from securefed.securesum.ckks import CKKSClient, CKKSRoundSpec, CKKSServer
from securefed.securesum.messages import (
    AdvertiseKeys,
    ConsistencyRequest,
    ConsistencySignature,
    ContextHandoff,
    DecryptedSum,
    DecryptRequest,
    KeysBroadcast,
    PublicContext,
    SignedInput,
    decode,
    encode,
    peek_header,
)

N_CLIENTS, LENGTH, CLIP = 3, 40, 1.0


@pytest.fixture(scope="module")
def setup():
    keys = [crypto.ed25519_keypair() for _ in range(N_CLIENTS)]
    params = ckks.choose_ckks_parameters(LENGTH, 1e-6, 10.0, N_CLIENTS)
    assert params.scale_bits >= 60  # the scale is raised until the CKKS error is a float64 quantity
    rng = np.random.default_rng(0)
    ups = [rng.uniform(-1.5, 1.5, LENGTH) for _ in range(N_CLIENTS)]
    return keys, params, ups


def _spec(setup, **kw):
    keys, params, _ = setup
    base = dict(
        session_id=b"s" * 16,
        round_index=3,
        n_clients=N_CLIENTS,
        key_holder=0,
        params=params,
        clip=CLIP,
        identity_keys=tuple(p for _, p in keys),
        min_survivors=2,
        max_abs_sum=10.0,
    )
    base.update(kw)
    return CKKSRoundSpec(**base)


def _roundtrip(c: CKKSClient) -> CKKSClient:
    """What a Flower site does between two messages: the machine to bytes and back."""
    return CKKSClient.load(c.dump(), c.spec, c._identity)


def _run_to_decrypt(setup, spec, weights=(1.0, 2.0, 0.5)):
    """Drive every stage by hand (with a dump/load before every message); stop at the DecryptRequest."""
    keys, _, ups = setup
    clients = [CKKSClient(spec, i, keys[i][0], ups[i], weights[i]) for i in range(N_CLIENTS)]
    server = CKKSServer(spec, 0.0)
    # advertise
    adverts = [c.start() for c in clients]
    assert all(len(a) == 1 and peek_header(a[0])[0] is AdvertiseKeys for a in adverts)
    out = []
    for a in adverts:
        out += server.receive(a[0])
    assert server.stage == "handoff" and [rid for rid, _ in out] == [0]
    kb = decode(out[0][1], expected=KeysBroadcast)
    assert [e.sender for e in kb.entries] == [0, 1]  # the key holder learns only its fallback's key
    # handoff: the key holder generates the key, hands it to its one fallback and uploads its own input
    clients[0] = _roundtrip(clients[0])
    replies = clients[0].receive(out[0][1])
    kinds = [peek_header(r)[0] for r in replies]
    assert kinds == [PublicContext, ContextHandoff, SignedInput]
    out = []
    for r in replies:
        out += server.receive(r)
    assert server.stage == "input" and server._ctx.is_private() is False
    assert [(rid, peek_header(d)[0]) for rid, d in out] == [(1, KeysBroadcast), (1, ContextHandoff), (2, PublicContext)]
    # input: the fallback gets the holder's signed key, then its handoff; client 2 the signed public context
    uploads = []
    for rid, data in out:
        clients[rid] = _roundtrip(clients[rid])
        got = clients[rid].receive(data)
        if peek_header(data)[0] is KeysBroadcast:
            assert got == [] and clients[rid].state == "keyed"
            assert len(decode(data).entries) == 1  # only the key holder's advertisement
        else:
            assert clients[rid].state == "uploaded" and peek_header(got[0])[0] is SignedInput
            uploads += got
    assert clients[1].holds_secret and not clients[2].holds_secret and clients[0].holds_secret
    assert server.receive(uploads[0]) == [] and server.stage == "input"
    confirm = server.receive(uploads[1])
    # confirm: every survivor signs the survivor set U once; a quorum of signatures travels to the decryptor
    assert server.stage == "confirm" and [rid for rid, _ in confirm] == [0, 1, 2]
    req = []
    for rid, data in confirm:
        clients[rid] = _roundtrip(clients[rid])
        sig = clients[rid].receive(data)
        assert clients[rid].state == "confirmed" and peek_header(sig[0])[0] is ConsistencySignature
        req += server.receive(sig[0])
    assert server.stage == "decrypt" and [rid for rid, _ in req] == [0]
    return clients, server, req[0][1]


def test_stage_by_stage_with_state_persistence_sum_within_precision(setup):
    _, params, ups = setup
    spec = _spec(setup)
    clients, server, req = _run_to_decrypt(setup, spec)
    clients[0] = _roundtrip(clients[0])
    res = clients[0].receive(req)
    assert clients[0].state == "done" and clients[0]._ctx is None
    assert server.receive(res[0]) == [] and server.stage == "done"
    w = np.array([1.0, 2.0, 0.5])
    exact = sum(wi * np.clip(u, -CLIP, CLIP) for wi, u in zip(w, ups))
    assert np.max(np.abs(server.result - exact)) < spec.release_bound
    assert np.allclose(server.result / params.step, np.round(server.result / params.step))  # on the stated grid
    assert server.survivors == (0, 1, 2) and server.decryptor == 0
    assert sum(c.clipped for c in clients) == sum(int(np.sum(np.abs(u) > CLIP)) for u in ups) > 0
    with pytest.raises(ProtocolAbortedError):  # a client decrypts at most once
        clients[0].receive(req)


def test_server_context_cannot_decrypt_and_refuses_private_context(setup):
    spec = _spec(setup)
    clients, server, req = _run_to_decrypt(setup, spec)
    m = decode(req)
    assert not ckks.can_decrypt(server._ctx, m.chunks[0])
    # a key holder that sends its secret context to the server: the server refuses and aborts
    srv = CKKSServer(spec)
    for i in range(N_CLIENTS):
        srv.receive(CKKSClient(spec, i, setup[0][i][0], setup[2][i]).start()[0])
    priv = ckks._secret_bytes(ckks._make_context(spec.params))
    sig = crypto.sign(setup[0][0][0], ckks.context_payload(spec.session_id, spec.round_index, 0, spec.digest, priv))
    with pytest.raises(ProtocolAbortedError, match="secret key"):
        srv.receive(encode(PublicContext(spec.session_id, spec.round_index, 0, priv, sig)))
    assert srv.stage == "aborted"


def _forged(req: bytes, **changes) -> bytes:
    return encode(dataclasses.replace(decode(req), **changes))


def test_decryptor_refuses_single_ciphertext_and_other_server_forgeries(setup):
    spec = _spec(setup)
    clients, server, req = _run_to_decrypt(setup, spec)
    m = decode(req)
    one = m.uploads[1].chunks
    forgeries = {
        "single client's ciphertext": dict(chunks=one),
        "sum over one client": dict(
            survivors=(0,), digests=m.digests[:1], uploads=m.uploads[:1], chunks=m.uploads[0].chunks
        ),
        "omits the decryptor": dict(survivors=(1, 2), digests=m.digests[1:], uploads=m.uploads[1:]),
        "set it did not confirm": dict(
            survivors=(0, 1), signatures=m.signatures[:2], digests=m.digests[:2], uploads=m.uploads[:2]
        ),
        "below the quorum": dict(signatures=m.signatures[:1]),
        "forged set signature": dict(
            signatures=(m.signatures[0], dataclasses.replace(m.signatures[1], signature=bytes(64)))
        ),
        "relayed upload swapped": dict(
            uploads=(m.uploads[0], m.uploads[1], dataclasses.replace(m.uploads[2], chunks=one))
        ),
        "forged digest": dict(
            digests=(m.digests[0], m.digests[1], dataclasses.replace(m.digests[2], digest=b"\0" * 32))
        ),
    }
    for what, change in forgeries.items():
        c = _roundtrip(clients[0])
        with pytest.raises(AuthenticationError):
            c.receive(_forged(req, **change))
        assert c.state == "aborted", what
    # the server's own forgery of an upload (encrypted under the public key) is not signed by any client
    c = _roundtrip(clients[0])
    fake = ckks.encrypt_vector(server._ctx, np.zeros(LENGTH), spec.params.slots)
    with pytest.raises(AuthenticationError):
        c.receive(_forged(req, uploads=(m.uploads[0], m.uploads[1], dataclasses.replace(m.uploads[2], chunks=fake))))
    # the honest request still decrypts
    assert peek_header(_roundtrip(clients[0]).receive(req)[0])[0] is DecryptedSum


def test_signatures_mode_is_cheaper_but_trusts_the_server_sum(setup):
    """Documented limitation: verify='signatures' checks signatures and count only, so a malicious server
    that swaps in a single client's ciphertext gets it decrypted (recompute mode refuses, test above)."""
    spec = _spec(setup, verify="signatures")
    clients, server, req = _run_to_decrypt(setup, spec)
    m = decode(req)
    assert m.uploads == ()  # only digests travel
    # too few survivors is still refused
    with pytest.raises(AuthenticationError):
        _roundtrip(clients[0]).receive(_forged(req, survivors=(0,), digests=m.digests[:1]))
    one = ckks.encrypt_vector(clients[1]._ctx, np.full(LENGTH, 0.25), spec.params.slots)
    out = decode(_roundtrip(clients[0]).receive(_forged(req, chunks=one))[0], expected=DecryptedSum)
    assert np.max(np.abs(np.frombuffer(out.data) - 0.25)) < spec.release_bound


@pytest.mark.parametrize("stage", ckks.CKKS_STAGES)
@pytest.mark.parametrize("who", [0, 2])
def test_dropout_at_every_stage(setup, stage, who):
    keys, params, ups = setup
    priv, pub = [k for k, _ in keys], [p for _, p in keys]
    out = ckks.run_ckks_round(
        params, priv, pub, ups, np.ones(N_CLIENTS), CLIP, drop_at={who: stage}, key_holder=0, max_abs_sum=10.0
    )
    if who == 0 and stage in ("advertise", "handoff"):
        assert isinstance(out.error, ProtocolAbortedError) and out.total is None
        assert "key holder" in str(out.error)
        return
    assert out.error is None
    surv = out.survivors
    expect = tuple(range(N_CLIENTS)) if stage == "decrypt" else tuple(i for i in range(N_CLIENTS) if i != who)
    assert surv == expect
    # the key holder gone at input or decrypt: its one fallback (client 1) decrypts
    assert out.decryptor == (1 if (who == 0 and stage in ("input", "decrypt")) else 0)
    exact = sum(np.clip(ups[i], -CLIP, CLIP) for i in surv)
    assert np.max(np.abs(out.total - exact)) < ckks.release_error_bound(params.step, 1e-6, LENGTH)


def test_round_aborts_below_min_survivors_quorum_or_when_no_decryptor_is_left(setup):
    keys, params, ups = setup
    priv, pub = [k for k, _ in keys], [p for _, p in keys]
    kw = dict(max_abs_sum=10.0)
    out = ckks.run_ckks_round(params, priv, pub, ups, np.ones(3), CLIP, drop_at={1: "input", 2: "handoff"}, **kw)
    assert isinstance(out.error, ProtocolTimeoutError) and "min_survivors" in str(out.error)
    out = ckks.run_ckks_round(params, priv, pub, ups, np.ones(3), CLIP, drop_at={1: "decrypt", 2: "decrypt"}, **kw)
    assert isinstance(out.error, ProtocolTimeoutError) and "quorum" in str(out.error)
    assert out.dropped_at["confirm"] == (1, 2)
    # min_survivors = quorum = 1 lets a lone client's sum through (explicit opt-in only)
    out = ckks.run_ckks_round(
        params, priv, pub, ups, np.ones(3), CLIP, drop_at={1: "input", 2: "input"}, min_survivors=1, quorum=1, **kw
    )
    assert out.error is None and out.survivors == (0,)
    # both key holders confirmed, then neither answers the decryption request: tried in turn, then aborted —
    # client 2 holds no secret key and is never asked
    _, server, _ = _run_to_decrypt(setup, _spec(setup))
    asked = [server.decryptor]
    ((rid, data),) = server.tick(1e9)
    assert peek_header(data)[0] is DecryptRequest
    asked.append(rid)
    with pytest.raises(ProtocolTimeoutError, match="no client holding the CKKS key"):
        server.tick(2e9)
    assert asked == [0, 1] and server.stage == "aborted"


@pytest.mark.parametrize(
    "kind,err",
    [
        ("ciphertext", AuthenticationError),
        ("signature", None),
        ("replay", ckks.UnexpectedMessageError),
        ("reorder", ckks.UnexpectedMessageError),
        ("wrong_session", DecodeError),
        ("truncate", DecodeError),
    ],
)
def test_tampered_messages_cost_the_fallback_its_key_never_the_sum(setup, kind, err):
    """A forged or broken key handoff reaches the fallback decryptor: it refuses it with a typed error and is
    dropped (or, for a forged key in the holder's broadcast, never gets the secret key and uploads under the
    public one); the key holder decrypts the others' exact sum."""
    keys, params, ups = setup
    out = ckks.run_ckks_round(
        params, [k for k, _ in keys], [p for _, p in keys], ups, np.ones(3), CLIP, tamper=kind, max_abs_sum=10.0
    )
    assert out.error is None and out.decryptor == 0
    exact = sum(np.clip(ups[i], -CLIP, CLIP) for i in out.survivors)
    assert np.max(np.abs(out.total - exact)) < ckks.release_error_bound(params.step, 1e-6, LENGTH)
    if err is None:
        assert out.client_errors == {} and out.survivors == (0, 1, 2)
    else:
        assert list(out.client_errors) == [1] and out.client_errors[1].startswith(err.__name__)
    if err is ckks.UnexpectedMessageError:  # a well-formed message out of order is a ProtocolError, not a DecodeError
        assert "replayed or reordered" in out.client_errors[1]


def test_unexpected_message_type_is_typed_and_other_session_or_round_stays_decode_error(setup):
    spec = _spec(setup)
    keys, _, ups = setup
    # client: a DecryptRequest while it waits for the key broadcast
    c = CKKSClient(spec, 1, keys[1][0], ups[1])
    c.start()
    req = encode(DecryptRequest(spec.session_id, spec.round_index, 1, (), (), (), (), ()))
    with pytest.raises(ckks.UnexpectedMessageError, match="got DecryptRequest, expected KeysBroadcast"):
        c.receive(req)
    assert c.state == "aborted"
    # the same wrong type from another round is reported as a wrong round (DecodeError), as messages.decode does
    c = CKKSClient(spec, 1, keys[1][0], ups[1])
    c.start()
    stale = encode(DecryptRequest(spec.session_id, spec.round_index + 1, 1, (), (), (), (), ()))
    with pytest.raises(DecodeError, match="round") as ei:
        c.receive(stale)
    assert type(ei.value) is DecodeError
    # server: a stale survivor-set signature in the advertise stage is discarded, typed, without aborting
    server = CKKSServer(spec)
    sig = encode(ConsistencySignature(spec.session_id, spec.round_index, 1, bytes(64)))
    assert server.receive(sig) == []
    assert isinstance(server.rejected[-1][1], ckks.UnexpectedMessageError)
    assert "server in stage 'advertise'" in str(server.rejected[-1][1]) and server.stage == "advertise"


def test_server_rejects_bad_uploads_without_aborting(setup):
    spec = _spec(setup)
    keys, _, ups = setup
    clients = [CKKSClient(spec, i, keys[i][0], ups[i]) for i in range(N_CLIENTS)]
    server = CKKSServer(spec)
    out = []
    for c in clients:
        out += server.receive(c.start()[0])
    replies = clients[0].receive(out[0][1])

    def refused(data, kind, what=""):
        before = len(server.rejected)
        assert server.receive(data) == []
        assert len(server.rejected) == before + 1 and isinstance(server.rejected[-1][1], kind), server.rejected[-1]
        assert what in str(server.rejected[-1][1])

    refused(replies[-1], ProtocolError)  # an upload before the public context
    for r in replies:
        out = server.receive(r) or out
    refused(replies[-1], ProtocolError, "duplicate")
    up1 = None
    for rid, data in out:
        got = clients[rid].receive(data)
        up1 = got[0] if rid == 1 and got else up1
    m = decode(up1)
    refused(encode(dataclasses.replace(m, signature=bytes(64))), AuthenticationError)
    refused(encode(dataclasses.replace(m, chunks=m.chunks + m.chunks)), DecodeError)
    assert server.stage == "input"
    server.receive(up1)  # the genuine upload is still accepted
    assert server.stage == "input" and server.tick(1.0) == []
    req = server.tick(1e9)  # client 2 silent: the stage closes at its deadline
    assert server.stage == "confirm" and server.survivors == (0, 1) and server.dropped_at["input"] == (2,)
    assert [decode(d, expected=ConsistencyRequest).survivors for _, d in req] == [(0, 1), (0, 1)]


def test_client_state_codec_round_trip_and_strictness(setup):
    spec = _spec(setup)
    keys, _, ups = setup
    c = CKKSClient(spec, 1, keys[1][0], ups[1])
    c.start()
    blob = c.dump()
    back = CKKSClient.load(blob, spec, keys[1][0])
    assert back.state == "advertised" and np.array_equal(back._update, ups[1])
    assert crypto.x25519_public_bytes(back._c_sk) == c._c_pk
    for bad in (blob[:-1], b"XX" + blob[2:], blob + b"\0"):
        with pytest.raises(DecodeError):
            CKKSClient.load(bad, spec, keys[1][0])


def _reblob(blob: bytes, head_change=None, blob_change=None) -> bytes:
    """Rewrite a dumped client state (header JSON and/or one named blob), keeping the framing valid."""
    import json
    import struct

    magic = ckks._STATE_MAGIC
    n = struct.unpack_from("<I", blob, len(magic))[0]
    pos = len(magic) + 4
    head = json.loads(blob[pos : pos + n].decode())
    pos += n
    blobs = {}
    for k, ln in head["blobs"]:
        blobs[k] = blob[pos : pos + ln]
        pos += ln
    if blob_change:
        blobs.update(blob_change)
    head.update(head_change or {})
    head["blobs"] = [[k, len(b)] for k, b in blobs.items()]
    raw = json.dumps(head).encode()
    return magic + struct.pack("<I", len(raw)) + raw + b"".join(blobs.values())


def test_stored_state_with_corrupt_tenseal_context_is_a_decode_error(setup):
    """A stored secret context that TenSEAL cannot load: DecodeError naming the context, not a TenSEAL trace."""
    spec = _spec(setup)
    clients, _, _ = _run_to_decrypt(setup, spec)
    blob = clients[1].dump()
    assert CKKSClient.load(blob, spec, setup[0][1][0])._ctx.is_private()  # the genuine state loads
    for bad_ctx in (b"", b"\x00" * 64, ckks._secret_bytes(clients[1]._ctx)[:200]):
        with pytest.raises(DecodeError, match="TenSEAL context does not load"):
            CKKSClient.load(_reblob(blob, blob_change={"ctx": bad_ctx}), spec, setup[0][1][0])
    for change, what in ((dict(state="hacked"), "state"), (dict(id=7), "client 7"), (dict(weight="x"), "malformed")):
        with pytest.raises(DecodeError, match=what):
            CKKSClient.load(_reblob(blob, head_change=change), spec, setup[0][1][0])
    with pytest.raises(DecodeError, match="malformed"):
        CKKSClient.load(_reblob(blob, blob_change={"c_sk": b"short"}), spec, setup[0][1][0])


def test_spec_codec_round_trip_and_strictness(setup):
    spec = _spec(setup, verify="signatures", min_survivors=3)
    assert ckks.decode_ckks_spec(ckks.encode_ckks_spec(spec)) == spec
    raw = ckks.encode_ckks_spec(spec)
    for bad in (raw.replace(b'"v": 2', b'"v": 1'), b"{nope", raw.replace(b"[4096,", b"[2048,"), b"[]"):
        with pytest.raises(DecodeError):
            ckks.decode_ckks_spec(bad)
    with pytest.raises(Exception, match="verify"):
        _spec(setup, verify="trust-me")
    # parameters no party may use are refused with the reason (a ConfigError, not a malformed spec)
    tiny = ckks.encode_ckks_spec(spec).replace(repr(spec.params.step).encode(), repr(2.0**-60).encode())
    with pytest.raises(ConfigError, match="below 2\\^6 x the CKKS error"):
        ckks.decode_ckks_spec(tiny)


def test_aggregator_drives_the_machines_in_both_verify_modes():
    rng = np.random.default_rng(1)
    ups = [rng.uniform(-1, 1, (5, 7)) for _ in range(3)]
    exact = sum(ups)
    for mode in ckks.VERIFY_MODES:
        res = ckks.CKKSAggregator(clip_range=1.0, verify=mode).aggregate(ups)
        assert res.total.shape == (5, 7) and np.max(np.abs(res.total - exact)) < res.details["error_bound"]
        assert res.details["verify"] == mode and res.details["decryptor"] == 0 and res.details["fallbacks"] == [1]
    from securefed.errors import ConfigError

    with pytest.raises(ConfigError, match="min_survivors"):
        ckks.CKKSAggregator(clip_range=1.0, min_survivors=4).aggregate(ups)
    with pytest.raises(ConfigError, match="verify"):
        ckks.CKKSAggregator(clip_range=1.0, verify="none")
    with pytest.raises(ConfigError, match="quorum"):
        ckks.CKKSAggregator(clip_range=1.0, quorum=4).aggregate(ups)


def test_ckks_error_stays_below_the_flood_shift_so_the_release_bound_holds():
    """The parameter choice's claims, checked on raw (unflooded) decryptions of sums of 8 clients: the CKKS
    error stays below step/64 and below E = e_max + 2 ulp(M), the shift the flood σ is sized for."""
    n, d = 8, 4096
    params = ckks.choose_ckks_parameters(d, 1e-6, float(n), n)
    ctx = ckks._make_context(params)
    rng = np.random.default_rng(3)
    xs = [rng.uniform(-1, 1, d) for _ in range(n)]
    total = ckks.sum_ciphertexts(ctx, [ckks.encrypt_vector(ctx, x, params.slots) for x in xs])
    raw = np.concatenate([np.asarray(ckks.ts.ckks_vector_from(ctx, c).decrypt()) for c in total])
    exact = np.array([math.fsum(col) for col in np.array(xs).T])
    err = np.max(np.abs(raw[:d] - exact))
    assert err <= params.step / 64 and err <= ckks.flood_shift(params.scale_bits, n, float(n))


def test_no_two_survivor_sets_can_be_decrypted_in_one_round(setup):
    """Differencing attack: the server shows client 1 the set U2 = {0, 1} and clients 0, 2 the set
    U1 = {0, 1, 2}, hoping for Dec(U1) − Dec(U2) = x_2. Honest clients sign one set each, and the
    majority quorum (2 of 3) lets at most one set through: U2 gathers a single signature."""
    spec = _spec(setup)
    keys, _, ups = setup
    clients, server, req = _run_to_decrypt(setup, spec)
    # replay the confirm stage with fresh machines of this round's state, split views
    m = decode(req)
    c1 = CKKSClient.load(clients[1].dump(), spec, keys[1][0])
    c1.state, c1._survivors = "uploaded", None  # client 1 as it was before confirming
    u2 = (0, 1)
    sig1 = decode(c1.receive(encode(ConsistencyRequest(spec.session_id, spec.round_index, 1, u2)))[0]).signature
    from securefed.securesum.messages import SignatureEntry

    forged = dataclasses.replace(
        m,
        recipient=1,
        survivors=u2,
        signatures=(SignatureEntry(1, sig1),),
        digests=m.digests[:2],
        uploads=m.uploads[:2],
    )
    with pytest.raises(AuthenticationError, match="confirmed"):
        c1.receive(encode(forged))
    # client 0's signature is over U1, so it cannot be moved onto U2
    c1 = CKKSClient.load(clients[1].dump(), spec, keys[1][0])
    c1.state, c1._survivors = "uploaded", None
    c1.receive(encode(ConsistencyRequest(spec.session_id, spec.round_index, 1, u2)))
    with pytest.raises(AuthenticationError):
        c1.receive(encode(dataclasses.replace(forged, signatures=(m.signatures[0], SignatureEntry(1, sig1)))))
    # and a client signs only once per round
    with pytest.raises(ProtocolError):
        _roundtrip(clients[2]).receive(encode(ConsistencyRequest(spec.session_id, spec.round_index, 2, (0, 2))))
