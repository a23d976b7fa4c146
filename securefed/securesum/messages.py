"""Protocol messages (frozen dataclasses) and their versioned, length-checked byte codec.

Wire format of every message (all integers little-endian)::

    magic  b"SF"      2 bytes
    version           1 byte   (currently 2; any other value is refused — version 1 messages carried
                               no signatures on masked inputs, unmask responses or decrypted sums)
    type              1 byte   (the message class, see ``MESSAGE_TYPES``)
    session_id        16 bytes
    round_index       4 bytes  (uint32)
    body_length       4 bytes  (uint32; must equal the number of bytes that follow)
    body              fields in declaration order

Each body field is declared once, as ``name: Annotated[python type, kind]``, in wire order
(:func:`wire_fields` reads them). Field kinds: ``u8``/``u32``/``u64`` integers, ``f64``, fixed-size byte strings (``b32``, ``b64``),
``int33`` (a Shamir share, 33-byte big-endian), ``bytes`` (uint32 length + data), ``ids`` (uint32
count + uint32 each, strictly increasing), ``blobs`` (uint32 count + ``bytes`` each) and lists of
sub-records. Decoding is strict: wrong magic/version/type, a length that does not match, a field that
runs past the end, trailing bytes, unsorted id lists, or a session id / round other than the expected
one raise :class:`securefed.errors.DecodeError`. Nothing is ever silently truncated or padded.

Version 2 (issue 13): every client → server message that changes a result carries its sender's Ed25519
signature over the sender, the session, the round and the digest of the round spec (AdvertiseKeys with a
commitment to the self-mask seed, every share item, MaskedInput with the peer set it masked with,
ConsistencySignature, UnmaskResponse, PublicContext, SignedInput, DecryptedSum); the sender id is the
first body field of every client → server message (:func:`sender_of`), so a relay can check it against
the node a message came from.

Types 18 (:class:`BoundConsistencyRequest`, the late-bound SecAgg+ schedule's survivor set with every member's
signed input binding) and 19 (:class:`SumProof`, the evidence a survivor checks a released SecAgg+ total against)
were added without a version change: they are server → client, and a build that does not know them refuses them
as unknown types.
"""

from __future__ import annotations

import struct
import typing
from dataclasses import dataclass, fields
from typing import Annotated, ClassVar

from ..errors import DecodeError, ProtocolError

__all__ = [
    "VERSION",
    "MAGIC",
    "HEADER",
    "MESSAGE_TYPES",
    "encode",
    "decode",
    "decode_expected",
    "peek_header",
    "wire_fields",
    "KeyEntry",
    "ShareItem",
    "ShareValue",
    "SignatureEntry",
    "sender_of",
    "CLIENT_MESSAGES",
    "AdvertiseKeys",
    "KeysBroadcast",
    "EncryptedShares",
    "ForwardedShares",
    "MaskedInput",
    "ConsistencyRequest",
    "ConsistencySignature",
    "UnmaskRequest",
    "UnmaskResponse",
    "SharePlaintext",
    "ContextHandoff",
    "PublicContext",
    "EncryptedInput",
    "EncryptedSum",
    "DecryptedSum",
    "InputDigest",
    "InputEntry",
    "SignedInput",
    "DecryptRequest",
    "BoundConsistencyRequest",
    "ProofInput",
    "SecretEntry",
    "SumProof",
]

VERSION = 2
MAGIC = b"SF"
HEADER = struct.Struct("<2sBB16sII")
MAX_LIST = 1 << 24

# ----------------------------------------------------------------------------------------- records


@dataclass(frozen=True)
class KeyEntry:
    """One client's signed key advertisement (with its self-mask commitment), as relayed by the server."""

    sender: Annotated[int, "u32"]
    c_pk: Annotated[bytes, "b32"]
    s_pk: Annotated[bytes, "b32"]
    commit: Annotated[bytes, "b32"]
    signature: Annotated[bytes, "b64"]


@dataclass(frozen=True)
class ShareItem:
    """A dealer's AES-GCM share ciphertext for one holder (``peer`` = the holder when the dealer sends it,
    the dealer when the server forwards it), the hashes of the two shares inside and the dealer's
    signature over (dealer, holder, SHA-256 of the ciphertext, both hashes)."""

    peer: Annotated[int, "u32"]
    ciphertext: Annotated[bytes, "bytes"]
    h_b: Annotated[bytes, "b32"]
    h_s: Annotated[bytes, "b32"]
    signature: Annotated[bytes, "b64"]


@dataclass(frozen=True)
class ShareValue:
    """A revealed Shamir share of ``owner``'s secret (x = the revealer's id + 1)."""

    owner: Annotated[int, "u32"]
    value: Annotated[int, "int33"]


@dataclass(frozen=True)
class SignatureEntry:
    """``signer``'s Ed25519 signature over the survivor set (consistency check)."""

    signer: Annotated[int, "u32"]
    signature: Annotated[bytes, "b64"]


# ---------------------------------------------------------------------------------------- messages


@dataclass(frozen=True)
class _Message:
    """The header fields every message carries (outside the body); each subclass declares its body fields."""

    TYPE: ClassVar[int] = 0
    session_id: bytes
    round_index: int


@dataclass(frozen=True)
class AdvertiseKeys(_Message):
    """Stage 0, client → server: X25519 keys ``c_pk`` (channel) and ``s_pk`` (masks), a commitment to the
    self-mask seed (SecAgg+; zeros in CKKS), Ed25519-signed."""

    TYPE: ClassVar[int] = 1
    sender: Annotated[int, "u32"]
    c_pk: Annotated[bytes, "b32"]
    s_pk: Annotated[bytes, "b32"]
    commit: Annotated[bytes, "b32"]
    signature: Annotated[bytes, "b64"]


@dataclass(frozen=True)
class KeysBroadcast(_Message):
    """Stage 0, server → client: the signed advertisements of the recipient's live neighbours."""

    TYPE: ClassVar[int] = 2
    recipient: Annotated[int, "u32"]
    entries: Annotated[tuple, KeyEntry]


@dataclass(frozen=True)
class EncryptedShares(_Message):
    """Stage 1, client → server: one signed share item per live neighbour it accepted."""

    TYPE: ClassVar[int] = 3
    sender: Annotated[int, "u32"]
    items: Annotated[tuple, ShareItem]


@dataclass(frozen=True)
class ForwardedShares(_Message):
    """Stage 1, server → client: the share items addressed to the recipient (``peer`` = dealer)."""

    TYPE: ClassVar[int] = 4
    recipient: Annotated[int, "u32"]
    items: Annotated[tuple, ShareItem]


@dataclass(frozen=True)
class MaskedInput(_Message):
    """Stage 2, client → server: the masked, quantised vector (``bits``-bit little-endian words), the
    peers it masked with (whose shares it holds), signed."""

    TYPE: ClassVar[int] = 5
    sender: Annotated[int, "u32"]
    bits: Annotated[int, "u8"]
    data: Annotated[bytes, "bytes"]
    peers: Annotated[tuple, "ids"]
    signature: Annotated[bytes, "b64"]


@dataclass(frozen=True)
class ConsistencyRequest(_Message):
    """Stage 3, server → client: the survivor set U3 (clients whose masked input arrived)."""

    TYPE: ClassVar[int] = 6
    recipient: Annotated[int, "u32"]
    survivors: Annotated[tuple, "ids"]


@dataclass(frozen=True)
class ConsistencySignature(_Message):
    """Stage 3, client → server: Ed25519 signature over (session, round, spec digest, U3)."""

    TYPE: ClassVar[int] = 7
    sender: Annotated[int, "u32"]
    signature: Annotated[bytes, "b64"]


@dataclass(frozen=True)
class UnmaskRequest(_Message):
    """Stage 4, server → client: U3 again plus every collected consistency signature (≥ the quorum)."""

    TYPE: ClassVar[int] = 8
    recipient: Annotated[int, "u32"]
    survivors: Annotated[tuple, "ids"]
    signatures: Annotated[tuple, SignatureEntry]


@dataclass(frozen=True)
class UnmaskResponse(_Message):
    """Stage 4, client → server: self-mask shares of surviving peers, key shares of dropped peers, signed."""

    TYPE: ClassVar[int] = 9
    sender: Annotated[int, "u32"]
    self_shares: Annotated[tuple, ShareValue]
    key_shares: Annotated[tuple, ShareValue]
    signature: Annotated[bytes, "b64"]


@dataclass(frozen=True)
class SharePlaintext(_Message):
    """The plaintext inside a share ciphertext (never sent in the clear)."""

    TYPE: ClassVar[int] = 10
    sender: Annotated[int, "u32"]
    recipient: Annotated[int, "u32"]
    self_share: Annotated[int, "int33"]
    key_share: Annotated[int, "int33"]


@dataclass(frozen=True)
class ContextHandoff(_Message):
    """CKKS, key holder → client (relayed by the server): the secret TenSEAL context under AES-GCM."""

    TYPE: ClassVar[int] = 11
    sender: Annotated[int, "u32"]
    recipient: Annotated[int, "u32"]
    ciphertext: Annotated[bytes, "bytes"]


@dataclass(frozen=True)
class PublicContext(_Message):
    """CKKS, key holder → server (and, forwarded, → every client without the secret key): the public
    TenSEAL context (no secret key), signed by the key holder."""

    TYPE: ClassVar[int] = 12
    sender: Annotated[int, "u32"]
    context: Annotated[bytes, "bytes"]
    signature: Annotated[bytes, "b64"]


@dataclass(frozen=True)
class EncryptedInput(_Message):
    """CKKS, client → server: the client's vector as a list of serialised CKKS ciphertexts."""

    TYPE: ClassVar[int] = 13
    sender: Annotated[int, "u32"]
    chunks: Annotated[tuple, "blobs"]


@dataclass(frozen=True)
class EncryptedSum(_Message):
    """CKKS, server → key holder: the homomorphic sum, one ciphertext per chunk."""

    TYPE: ClassVar[int] = 14
    recipient: Annotated[int, "u32"]
    survivors: Annotated[tuple, "ids"]
    chunks: Annotated[tuple, "blobs"]


@dataclass(frozen=True)
class DecryptedSum(_Message):
    """CKKS, decryptor → server: the decrypted sum, flooded and rounded to the stated ``step`` (float64
    words), signed by the decryptor."""

    TYPE: ClassVar[int] = 15
    sender: Annotated[int, "u32"]
    step: Annotated[float, "f64"]
    data: Annotated[bytes, "bytes"]
    signature: Annotated[bytes, "b64"]


@dataclass(frozen=True)
class InputDigest:
    """``sender``'s Ed25519 signature over the SHA-256 digest of its upload: CKKS, the ciphertext chunks; SecAgg+
    (late-bound schedule), :func:`~.secagg.input_hash` of its masked vector and peer set, signed with the full
    spec digest (:func:`~.secagg.bound_masked_payload`)."""

    sender: Annotated[int, "u32"]
    digest: Annotated[bytes, "b32"]
    signature: Annotated[bytes, "b64"]


@dataclass(frozen=True)
class InputEntry:
    """CKKS: one client's uploaded ciphertext chunks, relayed to the decryptor for re-summation."""

    sender: Annotated[int, "u32"]
    chunks: Annotated[tuple, "blobs"]


@dataclass(frozen=True)
class SignedInput(_Message):
    """CKKS, client → server: serialised CKKS ciphertext chunks, Ed25519-signed (over their digest)."""

    TYPE: ClassVar[int] = 16
    sender: Annotated[int, "u32"]
    chunks: Annotated[tuple, "blobs"]
    signature: Annotated[bytes, "b64"]


@dataclass(frozen=True)
class DecryptRequest(_Message):
    """CKKS, server → decryptor: the survivors, their signatures over the survivor set, their signed
    upload digests, (optionally) the uploads themselves and the server's homomorphic sum."""

    TYPE: ClassVar[int] = 17
    recipient: Annotated[int, "u32"]
    survivors: Annotated[tuple, "ids"]
    signatures: Annotated[tuple, SignatureEntry]
    digests: Annotated[tuple, InputDigest]
    uploads: Annotated[tuple, InputEntry]
    chunks: Annotated[tuple, "blobs"]


@dataclass(frozen=True)
class BoundConsistencyRequest(_Message):
    """Stage 3 of a late-bound SecAgg+ round, server → client: the survivor set U and, for every member of U in
    order, its signed input binding (:class:`InputDigest`: the hash of its masked vector and peer set, signed over
    the full spec digest). A client signs U only if every member bound its masked input to the same full digest
    — the setup was shared before the input part existed, so without this a server could put in U a site that
    masked under another input part (docs/threat-model-secure-sum.md §2, late-bound input)."""

    TYPE: ClassVar[int] = 18
    recipient: Annotated[int, "u32"]
    survivors: Annotated[tuple, "ids"]
    inputs: Annotated[tuple, InputDigest]


@dataclass(frozen=True)
class ProofInput:
    """A survivor's masked input inside a :class:`SumProof`, as it signed it (sender, peer set, words, signature)."""

    sender: Annotated[int, "u32"]
    peers: Annotated[tuple, "ids"]
    data: Annotated[bytes, "bytes"]
    signature: Annotated[bytes, "b64"]


@dataclass(frozen=True)
class SecretEntry:
    """A secret the server reconstructed, inside a :class:`SumProof`: a survivor's self-mask seed b_u or a dropped
    client's X25519 mask key s_v (raw 32 bytes), checked by every verifier against what ``owner`` committed to."""

    owner: Annotated[int, "u32"]
    secret: Annotated[bytes, "b32"]


@dataclass(frozen=True)
class SumProof(_Message):
    """SecAgg+, server → every survivor after the round: everything needed to recompute the released sum and check
    it against the survivors' own signatures (:mod:`.secagg_proof`). ``schedule`` 0 = construction, 1 = late-bound;
    ``digest`` the full spec digest; ``total`` the claimed sum (``bits``-bit words); ``inputs`` the survivors'
    signed masked inputs (in the order of ``survivors``); ``signatures`` the consistency signatures on U (≥ q);
    ``keys`` the signed advertisements of every survivor and every dropped client a survivor masked with;
    ``seeds`` b_u of every survivor; ``mask_keys`` s_v of every such dropped client."""

    TYPE: ClassVar[int] = 19
    schedule: Annotated[int, "u8"]
    digest: Annotated[bytes, "b32"]
    survivors: Annotated[tuple, "ids"]
    bits: Annotated[int, "u8"]
    total: Annotated[bytes, "bytes"]
    inputs: Annotated[tuple, ProofInput]
    signatures: Annotated[tuple, SignatureEntry]
    keys: Annotated[tuple, KeyEntry]
    seeds: Annotated[tuple, SecretEntry]
    mask_keys: Annotated[tuple, SecretEntry]


MESSAGE_TYPES = {
    cls.TYPE: cls
    for cls in (
        AdvertiseKeys,
        KeysBroadcast,
        EncryptedShares,
        ForwardedShares,
        MaskedInput,
        ConsistencyRequest,
        ConsistencySignature,
        UnmaskRequest,
        UnmaskResponse,
        SharePlaintext,
        ContextHandoff,
        PublicContext,
        EncryptedInput,
        EncryptedSum,
        DecryptedSum,
        SignedInput,
        DecryptRequest,
        BoundConsistencyRequest,
        SumProof,
    )
}

#: Messages a client sends (sender id first in the body); the rest are server → client (recipient first).
CLIENT_MESSAGES = (
    AdvertiseKeys,
    EncryptedShares,
    MaskedInput,
    ConsistencySignature,
    UnmaskResponse,
    ContextHandoff,
    PublicContext,
    EncryptedInput,
    DecryptedSum,
    SignedInput,
)

_WIRE_FIELDS: dict[type, tuple] = {}


def wire_fields(cls: type) -> tuple:
    """``((name, kind), …)``: ``cls``'s body fields in wire order, read (once) from the ``Annotated`` kinds of
    its dataclass fields (the header's ``session_id`` and ``round_index`` carry none)."""
    out = _WIRE_FIELDS.get(cls)
    if out is None:
        hints = typing.get_type_hints(cls, include_extras=True)
        out = _WIRE_FIELDS[cls] = tuple(
            (f.name, hints[f.name].__metadata__[0]) for f in fields(cls) if getattr(hints[f.name], "__metadata__", None)
        )
    return out


_FIXED = {"b32": 32, "b64": 64}
_INTS = {"u8": struct.Struct("<B"), "u32": struct.Struct("<I"), "u64": struct.Struct("<Q"), "f64": struct.Struct("<d")}
_U32 = _INTS["u32"]


# ------------------------------------------------------------------------------------------ encode


def _enc_field(kind, value, out: list, name: str) -> None:
    if isinstance(kind, type):
        items = tuple(value)
        out.append(_U32.pack(len(items)))
        for item in items:
            if not isinstance(item, kind):
                raise DecodeError(f"field {name!r} holds {type(item).__name__}, expected {kind.__name__}")
            for fname, fkind in wire_fields(kind):
                _enc_field(fkind, getattr(item, fname), out, f"{name}.{fname}")
    elif kind in _INTS:
        try:
            out.append(_INTS[kind].pack(value))
        except struct.error:
            raise DecodeError(f"field {name!r}={value!r} does not fit {kind}") from None
    elif kind in _FIXED:
        if not isinstance(value, (bytes, bytearray)) or len(value) != _FIXED[kind]:
            raise DecodeError(f"field {name!r} must be exactly {_FIXED[kind]} bytes")
        out.append(bytes(value))
    elif kind == "int33":
        if not isinstance(value, int) or not 0 <= value < 1 << 264:
            raise DecodeError(f"field {name!r} must be an integer share below 2^264")
        out.append(value.to_bytes(33, "big"))
    elif kind == "bytes":
        out.append(_U32.pack(len(value)))
        out.append(bytes(value))
    elif kind == "blobs":
        out.append(_U32.pack(len(value)))
        for blob in value:
            out.append(_U32.pack(len(blob)))
            out.append(bytes(blob))
    elif kind == "ids":
        ids = tuple(value)
        if any(b <= a for a, b in zip(ids, ids[1:])):
            raise DecodeError(f"field {name!r} must be a strictly increasing id list")
        out.append(_U32.pack(len(ids)))
        out.append(struct.pack(f"<{len(ids)}I", *ids))
    else:  # pragma: no cover - schema error
        raise DecodeError(f"unknown field kind {kind!r}")


def encode(msg) -> bytes:
    """Encode a message dataclass to bytes (see the module docstring for the format)."""
    cls = type(msg)
    if MESSAGE_TYPES.get(getattr(cls, "TYPE", None)) is not cls:
        raise DecodeError(f"cannot encode {cls.__name__}: not a securefed protocol message")
    if not isinstance(msg.session_id, (bytes, bytearray)) or len(msg.session_id) != 16:
        raise DecodeError("session_id must be exactly 16 bytes")
    parts: list[bytes] = []
    for name, kind in wire_fields(cls):
        _enc_field(kind, getattr(msg, name), parts, name)
    body = b"".join(parts)
    try:
        head = HEADER.pack(MAGIC, VERSION, cls.TYPE, bytes(msg.session_id), msg.round_index, len(body))
    except struct.error:
        raise DecodeError(f"round_index={msg.round_index!r} does not fit uint32") from None
    return head + body


# ------------------------------------------------------------------------------------------ decode


class _Reader:
    __slots__ = ("buf", "pos")

    def __init__(self, buf: memoryview, pos: int):
        self.buf, self.pos = buf, pos

    def take(self, n: int, name: str) -> memoryview:
        end = self.pos + n
        if n < 0 or end > len(self.buf):
            raise DecodeError(f"field {name!r} runs past the end of the message ({n} bytes wanted)")
        out = self.buf[self.pos : end]
        self.pos = end
        return out

    def count(self, name: str) -> int:
        n = _U32.unpack(self.take(4, name))[0]
        if n > MAX_LIST:
            raise DecodeError(f"field {name!r} claims {n} entries; the limit is {MAX_LIST}")
        return n


def _dec_field(kind, r: _Reader, name: str):
    if isinstance(kind, type):
        n = r.count(name)
        items = []
        for _ in range(n):
            vals = {fname: _dec_field(fkind, r, f"{name}.{fname}") for fname, fkind in wire_fields(kind)}
            items.append(kind(**vals))
        return tuple(items)
    if kind in _INTS:
        st = _INTS[kind]
        return st.unpack(r.take(st.size, name))[0]
    if kind in _FIXED:
        return bytes(r.take(_FIXED[kind], name))
    if kind == "int33":
        return int.from_bytes(r.take(33, name), "big")
    if kind == "bytes":
        return bytes(r.take(r.count(name), name))
    if kind == "blobs":
        return tuple(bytes(r.take(r.count(name), name)) for _ in range(r.count(name)))
    if kind == "ids":
        n = r.count(name)
        ids = struct.unpack(f"<{n}I", r.take(4 * n, name))
        if any(b <= a for a, b in zip(ids, ids[1:])):
            raise DecodeError(f"field {name!r} is not a strictly increasing id list")
        return tuple(ids)
    raise DecodeError(f"unknown field kind {kind!r}")  # pragma: no cover


def peek_header(data: bytes) -> tuple[type, bytes, int]:
    """Parse and check only the header; returns (message class, session id, round index)."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise DecodeError(f"expected bytes, got {type(data).__name__}")
    if len(data) < HEADER.size:
        raise DecodeError(f"message of {len(data)} bytes is shorter than the {HEADER.size}-byte header")
    magic, version, mtype, session, rnd, body_len = HEADER.unpack_from(data, 0)
    if magic != MAGIC:
        raise DecodeError(f"bad magic {magic!r}; not a securefed protocol message")
    if version != VERSION:
        raise DecodeError(f"unknown codec version {version}; this build speaks version {VERSION}")
    cls = MESSAGE_TYPES.get(mtype)
    if cls is None:
        raise DecodeError(f"unknown message type {mtype}")
    if body_len != len(data) - HEADER.size:
        raise DecodeError(f"body length field says {body_len} bytes but {len(data) - HEADER.size} follow")
    return cls, bytes(session), rnd


def decode(data: bytes, *, session_id: bytes | None = None, round_index: int | None = None, expected=None):
    """Strictly decode ``data``; check session, round and (optionally) the message class(es).

    Raises
    ------
    DecodeError
        On any malformation, trailing bytes, or a session / round / type other than expected.
    """
    cls, session, rnd = peek_header(data)
    if session_id is not None and session != session_id:
        raise DecodeError("message belongs to another session; refused")
    if round_index is not None and rnd != round_index:
        raise DecodeError(f"message is for round {rnd}, expected round {round_index}; refused")
    if expected is not None:
        allowed = expected if isinstance(expected, tuple) else (expected,)
        if cls not in allowed:
            raise DecodeError(f"got {cls.__name__}, expected {' or '.join(c.__name__ for c in allowed)}")
    r = _Reader(memoryview(data), HEADER.size)
    vals = {name: _dec_field(kind, r, name) for name, kind in wire_fields(cls)}
    if r.pos != len(data):
        raise DecodeError(f"{len(data) - r.pos} trailing bytes after {cls.__name__}")
    return cls(session_id=session, round_index=rnd, **vals)


def sender_of(data) -> int | None:
    """The sender id a client → server message names (its first body field), or None if ``data`` is not a
    well-framed client message. A relay compares it with the node the message came from."""
    try:
        cls = peek_header(data)[0]
    except DecodeError:
        return None
    if cls not in CLIENT_MESSAGES or len(data) < HEADER.size + 4:
        return None
    return _U32.unpack_from(data, HEADER.size)[0]


def decode_expected(data: bytes, spec, expected, where: str, why: str, error=ProtocolError):
    """:func:`decode` for a state machine: ``spec``'s session and round, one of the ``expected`` classes.

    A well-formed message of this session and round whose type is not expected (a replayed, reordered
    or stale message) raises ``error`` (a :class:`ProtocolError` subclass: a protocol fault, not a
    malformed message) as ``"{where}: got X, expected Y ({why})"``; a wrong session or round and any
    malformation raise :class:`DecodeError` as in :func:`decode` (checked first, same precedence).
    """
    allowed = expected if isinstance(expected, tuple) else (expected,)
    cls, session, rnd = peek_header(data)
    if session == spec.session_id and rnd == spec.round_index and cls not in allowed:
        raise error(f"{where}: got {cls.__name__}, expected {' or '.join(c.__name__ for c in allowed)} ({why})")
    return decode(data, session_id=spec.session_id, round_index=spec.round_index, expected=allowed)
