"""Codec: round trips, strict refusals and fuzzing (hypothesis)."""

import dataclasses
import os
import struct

import pytest
from hypothesis import given, settings, strategies as st

from securefed.errors import DecodeError
from securefed.securesum import messages as M

SID = bytes(range(16))
ids = st.integers(0, 2**32 - 1)
b32 = st.binary(min_size=32, max_size=32)
b64 = st.binary(min_size=64, max_size=64)
blob = st.binary(max_size=64)
share = st.integers(0, 2**257)
sorted_ids = st.lists(st.integers(0, 10_000), unique=True, max_size=12).map(lambda xs: tuple(sorted(xs)))
rnd = st.integers(0, 2**32 - 1)
sess = st.binary(min_size=16, max_size=16)

ITEMS = st.lists(st.builds(M.ShareItem, ids, blob, b32, b32, b64), max_size=4).map(tuple)
MESSAGES = st.one_of(
    st.builds(M.AdvertiseKeys, sess, rnd, ids, b32, b32, b32, b64),
    st.builds(
        M.KeysBroadcast, sess, rnd, ids, st.lists(st.builds(M.KeyEntry, ids, b32, b32, b32, b64), max_size=4).map(tuple)
    ),
    st.builds(M.EncryptedShares, sess, rnd, ids, ITEMS),
    st.builds(M.ForwardedShares, sess, rnd, ids, ITEMS),
    st.builds(M.MaskedInput, sess, rnd, ids, st.integers(0, 255), blob, sorted_ids, b64),
    st.builds(M.ConsistencyRequest, sess, rnd, ids, sorted_ids),
    st.builds(M.ConsistencySignature, sess, rnd, ids, b64),
    st.builds(
        M.UnmaskRequest,
        sess,
        rnd,
        ids,
        sorted_ids,
        st.lists(st.builds(M.SignatureEntry, ids, b64), max_size=3).map(tuple),
    ),
    st.builds(
        M.UnmaskResponse,
        sess,
        rnd,
        ids,
        st.lists(st.builds(M.ShareValue, ids, share), max_size=3).map(tuple),
        st.lists(st.builds(M.ShareValue, ids, share), max_size=3).map(tuple),
        b64,
    ),
    st.builds(M.SharePlaintext, sess, rnd, ids, ids, share, share),
    st.builds(M.ContextHandoff, sess, rnd, ids, ids, blob),
    st.builds(M.PublicContext, sess, rnd, ids, blob, b64),
    st.builds(M.EncryptedInput, sess, rnd, ids, st.lists(blob, max_size=3).map(tuple)),
    st.builds(M.EncryptedSum, sess, rnd, ids, sorted_ids, st.lists(blob, max_size=3).map(tuple)),
    st.builds(M.DecryptedSum, sess, rnd, ids, st.floats(allow_nan=False), blob, b64),
)


@settings(max_examples=300, deadline=None)
@given(MESSAGES)
def test_round_trip(msg):
    data = M.encode(msg)
    assert M.decode(data) == msg
    assert M.decode(data, session_id=msg.session_id, round_index=msg.round_index, expected=type(msg)) == msg


@settings(max_examples=300, deadline=None)
@given(MESSAGES, st.data())
def test_mutations_are_refused_or_reencode_identically(msg, data):
    """Flip, cut or extend bytes: decoding either raises DecodeError or yields a message that re-encodes exactly."""
    raw = bytearray(M.encode(msg))
    op = data.draw(st.sampled_from(["flip", "cut", "extend"]))
    if op == "flip":
        i = data.draw(st.integers(0, len(raw) - 1))
        raw[i] ^= data.draw(st.integers(1, 255))
    elif op == "cut":
        raw = raw[: data.draw(st.integers(0, len(raw) - 1))]
    else:
        raw += data.draw(st.binary(min_size=1, max_size=8))
    try:
        out = M.decode(bytes(raw))
    except DecodeError:
        return
    assert M.encode(out) == bytes(raw)
    assert op == "flip"  # a cut or an extension can never decode


def _decode_or_typed_error(raw: bytes):
    """Decode ``raw``: a DecodeError (the typed refusal) gives None; anything that decodes must re-encode to exactly
    ``raw`` and decode again to the same message. Any other exception fails the test."""
    try:
        msg = M.decode(raw)
    except DecodeError:
        return None
    assert M.encode(msg) == raw
    assert M.decode(M.encode(msg)) == msg
    return msg


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_random_bytes_never_crash(raw):
    _decode_or_typed_error(raw)


@settings(max_examples=500, deadline=None)
@given(
    st.sampled_from(sorted(M.MESSAGE_TYPES)), st.integers(0, 300).flatmap(lambda n: st.binary(min_size=n, max_size=n))
)  # lengths spread evenly
def test_random_bodies_behind_a_valid_header_decode_exactly_or_raise_decode_error(mtype, body):
    """Random bytes almost never start with the magic; here the header is valid (magic, version, a real type, the
    body length) and only the body is random, so the field decoders themselves are fuzzed."""
    raw = M.HEADER.pack(M.MAGIC, M.VERSION, mtype, SID, 7, len(body)) + body
    msg = _decode_or_typed_error(raw)
    if msg is not None:
        assert type(msg) is M.MESSAGE_TYPES[mtype] and msg.session_id == SID and msg.round_index == 7
        if body:  # the same body cut short by one byte: the last field runs past the end
            cut = M.HEADER.pack(M.MAGIC, M.VERSION, mtype, SID, 7, len(body) - 1) + body[:-1]
            assert _decode_or_typed_error(cut) is None


def test_some_random_body_does_decode():
    """The fuzz above is not vacuous: a body of the right shape behind a valid header decodes (and re-encodes)."""
    body = struct.pack("<I", 3) + struct.pack("<I", 2) + struct.pack("<II", 1, 4)  # recipient 3, survivors (1, 4)
    raw = M.HEADER.pack(M.MAGIC, M.VERSION, M.ConsistencyRequest.TYPE, SID, 7, len(body)) + body
    assert _decode_or_typed_error(raw) == M.ConsistencyRequest(SID, 7, 3, (1, 4))


def _sample():
    return M.encode(M.ConsistencyRequest(SID, 7, 3, (0, 1, 5)))


def test_unknown_version_refused():
    """Version 1 (unsigned masked inputs, unmask responses and decrypted sums) and any other version are refused."""
    assert M.VERSION == 2
    for v in (1, 3):
        raw = bytearray(_sample())
        raw[2] = v
        with pytest.raises(DecodeError, match="version"):
            M.decode(bytes(raw))


def test_sender_of_reads_the_sender_of_client_messages_only():
    sig = M.ConsistencySignature(SID, 0, 7, b"s" * 64)
    assert M.sender_of(M.encode(sig)) == 7
    assert M.sender_of(_sample()) is None  # a server → client message names a recipient, not a sender
    assert M.sender_of(b"junk") is None and M.sender_of(M.encode(sig)[:10]) is None


def test_wrong_length_and_trailing_bytes_refused():
    raw = _sample()
    with pytest.raises(DecodeError, match="length"):
        M.decode(raw + b"\x00")
    # consistent header length but a body with an extra byte after the last field
    body = raw[M.HEADER.size :] + b"\x00"
    head = M.HEADER.pack(M.MAGIC, M.VERSION, M.ConsistencyRequest.TYPE, SID, 7, len(body))
    with pytest.raises(DecodeError, match="trailing"):
        M.decode(head + body)
    with pytest.raises(DecodeError):
        M.decode(raw[:-2])


def test_wrong_round_session_and_type_refused():
    raw = _sample()
    with pytest.raises(DecodeError, match="round 7"):
        M.decode(raw, round_index=8)
    with pytest.raises(DecodeError, match="session"):
        M.decode(raw, session_id=os.urandom(16))
    with pytest.raises(DecodeError, match="expected"):
        M.decode(raw, expected=M.MaskedInput)


def test_unsorted_ids_and_oversized_fields_refused():
    body = struct.pack("<I", 3) + struct.pack("<I", 2) + struct.pack("<2I", 5, 1)
    head = M.HEADER.pack(M.MAGIC, M.VERSION, M.ConsistencyRequest.TYPE, SID, 0, len(body))
    with pytest.raises(DecodeError, match="increasing"):
        M.decode(head + body)
    with pytest.raises(DecodeError):
        M.encode(M.AdvertiseKeys(SID, 0, 1, b"short", b"x" * 32, b"c" * 32, b"s" * 64))
    with pytest.raises(DecodeError):
        M.encode(M.AdvertiseKeys(SID, 2**32, 1, b"x" * 32, b"x" * 32, b"c" * 32, b"s" * 64))


def test_messages_are_frozen():
    msg = M.ConsistencySignature(SID, 0, 1, b"s" * 64)
    with pytest.raises(dataclasses.FrozenInstanceError):
        msg.sender = 2
