"""SecAgg+ against a malicious server: the round spec, what every signature covers, and the protocol.

Protocol: Bonawitz et al., "Practical Secure Aggregation for Privacy-Preserving Machine Learning",
CCS 2017 (Fig. 4, the active-adversary variant with signatures and the consistency round), restricted to a
k-regular neighbour graph as in Bell et al., CCS 2020 (SecAgg+); with ``degree = n − 1`` it is classic SecAgg.
The client machine is :class:`~.secagg_client.SecAggClient`, the server machine
:class:`~.secagg_server.SecAggServer` (both built on :mod:`.machine`). Stages (``STAGES``)::

    advertise    client → server  AdvertiseKeys(c_pk, s_pk, commit = H(b_u)), signed
                 server → client  KeysBroadcast(signed keys of the recipient's live neighbours)
    share        client → server  EncryptedShares: per accepted neighbour v, AES-GCM under HKDF(X25519(c_u, c_v))
                                  of (Shamir share of b_u, Shamir share of s_u), the hashes h_b, h_s of both
                                  shares and u's signature over (u, v, H(ciphertext), h_b, h_s)
                 server → client  ForwardedShares (the items dealt to the recipient)
    masked       client → server  MaskedInput  y_u = q_u + PRG(b_u) + Σ_{v∈P_u} ±PRG(X25519(s_u, s_v))  mod 2^k
                                  with P_u (the dealers whose valid shares u holds), signed
                 server → client  ConsistencyRequest(U = survivors whose masked input is consistent)
    consistency  client → server  ConsistencySignature(Ed25519 over session, round, spec digest, U)
                 server → client  UnmaskRequest(U, every collected signature)
    unmask       client → server  UnmaskResponse: share of b_v for v ∈ U, share of s_v for v ∉ U, signed

and the server outputs ``Σ_{u∈U} q_u mod 2^k``. ``+`` is used when u < v and ``−`` when u > v, so pairwise masks
cancel between survivors; the server removes the self masks of survivors and the pairwise masks of dropped
clients (from reconstructed s_v) — Bonawitz et al. 2017, Eq. (1)–(3).

Threat model (docs/threat-model-secure-sum.md). The server may deviate arbitrarily and collude with up to
c sites. Every signature covers the session, the round, the sender and the SHA-256 digest of the round spec
(:attr:`RoundSpec.digest`) — including the ``task_digest`` of the request that shapes every upload — so two sites
shown different parameters cannot verify each other. **The server
can show different clients different survivor sets** — nothing in the transport stops it — but it gains
nothing: a client reveals shares only after ≥ q valid consistency signatures from distinct members of the
*same* set U (the global quorum, 2q > n + c; honest clients sign one set per round), so all honest revealers
saw one U, and each reveals exactly one kind of share per peer (b for members of U, s for the rest). A site
also refuses parameters under which both shares of one honest site could be collected without the quorum
(the share condition 2t > k + c, :func:`securefed.securesum.graph.check_parameters`) and survivor sets smaller
than its floor, before computing anything (:mod:`.threat`). It learns the sum over U only: each survivor
requires ≥ t of its masking partners in U, which keeps the honest survivors connected. Integrity: every message
that changes the result is signed; a share that does not match its dealer-signed hash is discarded and
names the revealer; a seed that does not match its commitment names the dealer (the round aborts with
blame); a peer set that disagrees with the server's view drops that survivor; the unmasked sum must lie in
its public range. A bad key or bad shares from one client make *that* client dropped (its neighbours leave it
out of their peer sets), not the round aborted.

Keys are fresh in every round. Reusing the mask key pair across rounds (with per-round HKDF derivation) is
**unsound**: if a client drops in round r the server reconstructs its mask secret key, which then unmasks
that client's inputs of every earlier round in which it survived (their self masks were revealed then).

**Two schedules** (``SCHEDULES``). In the *construction* schedule the full :class:`RoundSpec` is known when the
machines are built and every signature covers its digest. In the *late-bound* schedule (issue 26: the advertise
and share stages of the next K sums run before their inputs exist, so each dependent sum costs 3 round trips:
masked, consistency, unmask) the spec is split into its **setup part** (:class:`SetupSpec`: session, round, n,
degree, threshold, graph seed, identity keys, timeouts, quorum) and its **input part** (:class:`InputSpec`:
length, fixed-point plan, integer, task digest). AdvertiseKeys and share items are signed over the setup digest —
they depend on nothing the input shapes (fresh keys, a fresh seed, their Shamir shares); the client then waits in
``ready`` until ``provide_input``, the server until ``open_input``; the MaskedInput is signed over the **full**
digest of the joined spec (:func:`bound_masked_payload`, binding :func:`input_hash` of the vector and its peer
set), and so are the consistency and unmask signatures. Because the shares were dealt before any input part
existed, every site holds shares of every site's secrets whatever input part it is later shown; so before it
signs U a client checks, for **every** member of U, that member's signed binding to the same full digest
(:class:`~.messages.BoundConsistencyRequest`) — else a server could put in U a site that masked under another
input part and get its input, encoded as that other request asks, unmasked in the sum (the pairwise masks do not
depend on the input part). The consistency quorum of honest sites (2q > n + c) then agrees on one input part as
well as on one U before anything is revealed (docs/threat-model-secure-sum.md §2, "late-bound input").
"""

from __future__ import annotations

import functools
import hashlib
import json
import struct
from dataclasses import dataclass, field

from ..errors import ConfigError, DecodeError, bad_value
from . import crypto
from .graph import harary_graph
from .quantize import FixedPoint
from .task import NO_TASK

__all__ = [
    "STAGES",
    "DEFAULT_TIMEOUTS",
    "NO_TASK",
    "SCHEDULES",
    "RoundSpec",
    "SetupSpec",
    "InputSpec",
    "SecAggClient",
    "SecAggServer",
    "encode_spec",
    "decode_spec",
    "encode_setup",
    "decode_setup",
    "encode_input",
    "decode_input",
    "input_hash",
    "bound_masked_payload",
    "advert_payload",
    "commitment",
    "share_hash",
    "share_item_payload",
    "masked_payload",
    "consistency_payload",
    "unmask_payload",
    "share_aad",
    "channel_key",
    "pair_info",
    "self_info",
]

STAGES = ("advertise", "share", "masked", "consistency", "unmask")
#: "construction": the input is known when the machines are built and every stage signs the full spec digest
#: (the schedule of every release before the late-bound one); "late": advertise and share sign the setup part
#: only, the input part is bound after the share stage (module docstring)
SCHEDULES = ("construction", "late")
DEFAULT_TIMEOUTS = {"advertise": 30.0, "share": 30.0, "masked": 120.0, "consistency": 30.0, "unmask": 60.0}
SPEC_VERSION = 2
PART_VERSION = 1
_ZERO32 = NO_TASK  # a spec without a task digest encodes exactly as before the field existed


def _pack(*values: int) -> bytes:
    return struct.pack(f"<{len(values)}Q", *values)


def _h(*parts: bytes) -> bytes:
    h = hashlib.sha256()
    for p in parts:
        h.update(p)
    return h.digest()


# ---------------------------------------------------------------------------------- what is signed


def advert_payload(
    session: bytes, rnd: int, sender: int, digest: bytes, c_pk: bytes, s_pk: bytes, commit: bytes = _ZERO32
) -> bytes:
    """Bytes an AdvertiseKeys signature covers: session, round, sender, spec digest, both keys, commitment."""
    return b"securefed/advertise/v2|" + session + _pack(rnd, sender) + digest + c_pk + s_pk + commit


def commitment(session: bytes, rnd: int, u: int, seed: bytes) -> bytes:
    """SHA-256 commitment to client u's self-mask seed b_u (checked against the reconstructed seed)."""
    return _h(b"securefed/b-commit/v2|", session, _pack(rnd, u), seed)


def share_hash(session: bytes, rnd: int, dealer: int, holder: int, kind: bytes, value: int) -> bytes:
    """SHA-256 of one Shamir share (``kind`` b"b" or b"s"), bound to dealer and holder; hides the share (a
    uniform 257-bit field element) and lets the server check a revealed share against the dealer's signature."""
    return _h(b"securefed/share/v2|", session, _pack(rnd, dealer, holder), kind, value.to_bytes(33, "big"))


def share_item_payload(
    session: bytes, rnd: int, digest: bytes, dealer: int, holder: int, ciphertext: bytes, h_b: bytes, h_s: bytes
) -> bytes:
    """Bytes a dealer signs for one share item: who to whom, the ciphertext's hash and both share hashes."""
    return b"securefed/share-item/v2|" + session + _pack(rnd, dealer, holder) + digest + _h(ciphertext) + h_b + h_s


def masked_payload(session: bytes, rnd: int, digest: bytes, sender: int, bits: int, data: bytes, peers) -> bytes:
    """Bytes a MaskedInput signature covers: the vector's hash and the peer set it was masked with."""
    ids = tuple(peers)
    return b"securefed/masked/v2|" + session + _pack(rnd, sender, bits) + digest + _h(data) + _pack(len(ids), *ids)


def input_hash(data: bytes, peers) -> bytes:
    """SHA-256 binding a masked vector to the peer set it was masked with (the late schedule's input binding)."""
    ids = tuple(peers)
    return _h(b"securefed/masked-input/v1|", _h(data), _pack(len(ids), *ids))


def bound_masked_payload(session: bytes, rnd: int, digest: bytes, sender: int, bits: int, binding: bytes) -> bytes:
    """Bytes a MaskedInput signature covers in the late-bound schedule: the **full** spec digest (setup and input
    part) and :func:`input_hash` of the vector and its peer set — short enough that the server forwards every
    survivor's binding to every signer (:class:`~.messages.BoundConsistencyRequest`)."""
    return b"securefed/masked-bound/v1|" + session + _pack(rnd, sender, bits) + digest + binding


def consistency_payload(session: bytes, rnd: int, digest: bytes, survivors) -> bytes:
    """Bytes a consistency signature covers: the exact survivor set U of this round."""
    ids = tuple(survivors)
    return b"securefed/consistency/v2|" + session + digest + _pack(rnd, len(ids), *ids)


def unmask_payload(session: bytes, rnd: int, digest: bytes, sender: int, self_shares, key_shares) -> bytes:
    """Bytes an UnmaskResponse signature covers: the hash of both revealed share lists."""
    h = hashlib.sha256()
    for tag, lst in ((b"b", self_shares), (b"s", key_shares)):
        h.update(tag + _pack(len(lst)))
        for s in lst:
            h.update(_pack(s.owner) + s.value.to_bytes(33, "big"))
    return b"securefed/unmask/v2|" + session + _pack(rnd, sender) + digest + h.digest()


def share_aad(session: bytes, rnd: int, sender: int, recipient: int) -> bytes:
    """AES-GCM associated data of a share ciphertext: session, round, sender, recipient."""
    return b"securefed/share/v2|" + session + _pack(rnd, sender, recipient)


def channel_key(shared: bytes, session: bytes, rnd: int, a: int, b: int) -> bytes:
    """HKDF-SHA256 of an X25519 secret into the AES-256-GCM key of the (a, b) channel for this round."""
    lo, hi = min(a, b), max(a, b)
    return crypto.hkdf(shared, salt=session, info=b"securefed/channel/v1|" + _pack(rnd, lo, hi))


def pair_info(rnd: int, a: int, b: int) -> bytes:
    lo, hi = min(a, b), max(a, b)
    return b"pair|" + _pack(rnd, lo, hi)


def self_info(rnd: int, u: int) -> bytes:
    return b"self|" + _pack(rnd, u)


# ------------------------------------------------------------------------------------------ the spec


def _check_setup(spec) -> None:
    """The checks of the setup part, shared by :class:`RoundSpec` and :class:`SetupSpec` (same messages)."""
    if not isinstance(spec.session_id, bytes) or len(spec.session_id) != 16:
        raise ConfigError(bad_value("session_id", spec.session_id, "use 16 random bytes"))
    if not 0 <= spec.round_index < 2**32:
        raise ConfigError(bad_value("round_index", spec.round_index, "use an integer in [0, 2^32)"))
    if len(spec.identity_keys) != spec.n_clients:
        raise ConfigError(
            bad_value("identity_keys", len(spec.identity_keys), f"give {spec.n_clients} Ed25519 public keys")
        )
    if not 1 <= spec.threshold <= spec.degree:
        raise ConfigError(bad_value("threshold", spec.threshold, f"use 1 <= threshold <= degree = {spec.degree}"))
    if not 0 <= spec.quorum <= spec.n_clients:
        raise ConfigError(bad_value("quorum", spec.quorum, f"use 0 (majority) or 1..{spec.n_clients}"))
    tmo = dict(spec.timeouts)
    if set(tmo) != set(STAGES) or any(not (v > 0) for v in tmo.values()):
        raise ConfigError(bad_value("timeouts", tmo, f"give a positive number of seconds for each of {STAGES}"))


def _check_input(spec) -> None:
    """The checks of the input part, shared by :class:`RoundSpec` and :class:`InputSpec`."""
    if spec.length < 1:
        raise ConfigError(bad_value("length", spec.length, "vectors need at least one coordinate"))
    if not isinstance(spec.fixed_point, FixedPoint):
        raise ConfigError(bad_value("fixed_point", spec.fixed_point, "give a quantize.FixedPoint plan"))
    if not isinstance(spec.task_digest, bytes) or len(spec.task_digest) != 32:
        raise ConfigError(
            bad_value(
                "task_digest",
                spec.task_digest,
                "use 32 bytes (SHA-256 of the request's fields, securefed.securesum.task.task_digest) or NO_TASK",
            )
        )


class _SetupMixin:
    """What a machine needs of the setup part: the neighbour graph, timeouts and the quorum."""

    timeouts: tuple
    quorum: int
    n_clients: int

    def timeout(self, stage: str) -> float:
        return dict(self.timeouts)[stage]

    @property
    def signatures_needed(self) -> int:
        """q: consistency signatures from distinct members of U a revealer requires."""
        return self.quorum or self.n_clients // 2 + 1


@dataclass(frozen=True)
class RoundSpec(_SetupMixin):
    """Public parameters of one round, announced by the server and checked by every site.

    ``identity_keys[i]`` is client i's Ed25519 public key. ``neighbours`` is derived from
    ``(n_clients, degree, graph_seed)``. ``quorum`` (q) is the number of consistency signatures from
    distinct members of the survivor set every revealer requires (0: a majority ⌊n/2⌋ + 1, safe against a
    server alone; sites require 2q > n + c, :mod:`.threat`). :attr:`digest` — SHA-256 of the encoded spec —
    is inside every signature of the round.

    ``integer``: the clients' inputs are already integers mod ``2^k`` (``k = fixed_point.modulus_bits``), e.g. the
    distributed discrete Gaussian / Skellam encoder of :mod:`securefed.accounting.distributed`; no fixed-point
    codec, no clipping, no clip count, and the sum is released mod ``2^k`` (its wrap-around is the input
    mechanism's accounted event, so the server's range check does not apply).

    ``task_digest``: 32 bytes naming *what* the sites sum — the SHA-256 the coordinator's request computes over
    every field that shapes a site's upload (:func:`securefed.securesum.task.task_digest`); 32 zero bytes
    (:data:`NO_TASK`) mean "none" and encode exactly as a spec without the field. It enters :attr:`digest`, so
    every signature of the round covers it: two sites shown different task digests cannot verify each other's
    messages, and honest sites reveal shares only under a quorum that signed *their* digest
    (docs/threat-model-secure-sum.md §2, "one digest per sum"). A site recomputes it from its own request and
    refuses a spec whose ``task_digest`` differs, before computing anything.

    A spec is the join of its **setup part** (:attr:`setup`, a :class:`SetupSpec`: what the advertise and share
    stages need) and its **input part** (:attr:`input_spec`, an :class:`InputSpec`: length, fixed-point plan,
    integer, task digest). In the late-bound schedule (:mod:`.secagg_client`) the two are announced separately
    and :meth:`SetupSpec.bind` joins them; the joined spec encodes and digests exactly as one built whole.
    """

    session_id: bytes
    round_index: int
    n_clients: int
    degree: int
    threshold: int
    graph_seed: bytes
    length: int
    fixed_point: FixedPoint
    identity_keys: tuple
    timeouts: tuple = tuple(DEFAULT_TIMEOUTS.items())
    quorum: int = 0
    integer: bool = False
    task_digest: bytes = _ZERO32
    neighbours: tuple = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        _check_setup(self)
        _check_input(self)
        object.__setattr__(self, "neighbours", tuple(harary_graph(self.n_clients, self.degree, self.graph_seed)))

    @functools.cached_property
    def digest(self) -> bytes:
        """SHA-256 of the encoded spec; every signature of the round covers it (late schedule: from the masked
        input on)."""
        return _h(b"securefed/secagg-spec/v2|", encode_spec(self))

    @functools.cached_property
    def setup(self) -> SetupSpec:
        """The setup part (signed at advertise and share in the late-bound schedule)."""
        return SetupSpec(
            self.session_id,
            self.round_index,
            self.n_clients,
            self.degree,
            self.threshold,
            self.graph_seed,
            self.identity_keys,
            self.timeouts,
            self.quorum,
        )

    @property
    def input_spec(self) -> InputSpec:
        """The input part (bound after the share stage in the late-bound schedule)."""
        return InputSpec(self.length, self.fixed_point, self.integer, self.task_digest)


@dataclass(frozen=True)
class SetupSpec(_SetupMixin):
    """The setup part of a round: everything the advertise and share stages depend on, nothing that depends on
    the input (no length, fixed-point plan, integer flag or task digest). :attr:`digest` (domain-separated from
    :attr:`RoundSpec.digest`) is what a late-bound round's AdvertiseKeys and share items are signed over; the
    masked input, consistency and unmask signatures cover the full digest of :meth:`bind` (setup + input part).
    """

    session_id: bytes
    round_index: int
    n_clients: int
    degree: int
    threshold: int
    graph_seed: bytes
    identity_keys: tuple
    timeouts: tuple = tuple(DEFAULT_TIMEOUTS.items())
    quorum: int = 0
    neighbours: tuple = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        _check_setup(self)
        object.__setattr__(self, "neighbours", tuple(harary_graph(self.n_clients, self.degree, self.graph_seed)))

    @functools.cached_property
    def digest(self) -> bytes:
        """SHA-256 of the encoded setup part (the advertise and share signatures of the late-bound schedule)."""
        return _h(b"securefed/secagg-setup/v1|", encode_setup(self))

    @property
    def setup(self) -> SetupSpec:
        return self

    def bind(self, input_spec: InputSpec) -> RoundSpec:
        """The full spec of the round: this setup part joined with ``input_spec``."""
        if not isinstance(input_spec, InputSpec):
            raise ConfigError(bad_value("input_spec", type(input_spec).__name__, "give an InputSpec (decode_input)"))
        return RoundSpec(
            self.session_id,
            self.round_index,
            self.n_clients,
            self.degree,
            self.threshold,
            self.graph_seed,
            input_spec.length,
            input_spec.fixed_point,
            self.identity_keys,
            self.timeouts,
            self.quorum,
            input_spec.integer,
            input_spec.task_digest,
        )


@dataclass(frozen=True)
class InputSpec:
    """The input part of a round: what the input shapes (vector length, fixed-point plan or integer words, the
    task digest of the request). Given to the client with its input (``SecAggClient.provide_input``) and to the
    server (``SecAggServer.open_input``) after the share stage of a late-bound round."""

    length: int
    fixed_point: FixedPoint
    integer: bool = False
    task_digest: bytes = _ZERO32

    def __post_init__(self):
        _check_input(self)


def _fp_list(fp: FixedPoint) -> list:
    return [fp.clip, fp.fractional_bits, fp.modulus_bits, fp.active_clients, fp.weight_total]


def encode_spec(spec: RoundSpec) -> bytes:
    """The public round parameters as JSON bytes (byte strings hex-encoded)."""
    doc = {
        "v": SPEC_VERSION,
        "session_id": spec.session_id.hex(),
        "round_index": spec.round_index,
        "n_clients": spec.n_clients,
        "degree": spec.degree,
        "threshold": spec.threshold,
        "quorum": spec.quorum,
        "graph_seed": spec.graph_seed.hex(),
        "length": spec.length,
        "fixed_point": _fp_list(spec.fixed_point),
        "identity_keys": [k.hex() for k in spec.identity_keys],
        "timeouts": [[k, v] for k, v in spec.timeouts],
    }
    if spec.integer:  # only then: a fixed-point spec encodes (and digests) exactly as before
        doc["input"] = "integer"
    if spec.task_digest != _ZERO32:  # likewise: a spec without a task digest encodes as before
        doc["task"] = spec.task_digest.hex()
    return json.dumps(doc, sort_keys=True).encode()


def encode_setup(spec: SetupSpec) -> bytes:
    """The setup part as JSON bytes (``"part": "setup"``; byte strings hex-encoded)."""
    doc = {
        "v": PART_VERSION,
        "part": "setup",
        "session_id": spec.session_id.hex(),
        "round_index": spec.round_index,
        "n_clients": spec.n_clients,
        "degree": spec.degree,
        "threshold": spec.threshold,
        "quorum": spec.quorum,
        "graph_seed": spec.graph_seed.hex(),
        "identity_keys": [k.hex() for k in spec.identity_keys],
        "timeouts": [[k, v] for k, v in spec.timeouts],
    }
    return json.dumps(doc, sort_keys=True).encode()


def encode_input(spec: InputSpec) -> bytes:
    """The input part as JSON bytes (``"part": "input"``)."""
    doc = {"v": PART_VERSION, "part": "input", "length": spec.length, "fixed_point": _fp_list(spec.fixed_point)}
    if spec.integer:
        doc["input"] = "integer"
    if spec.task_digest != _ZERO32:
        doc["task"] = spec.task_digest.hex()
    return json.dumps(doc, sort_keys=True).encode()


def _decode_task(doc: dict) -> bytes:
    """The optional ``"task"`` field of an encoded spec: 64 hex digits, not all zero (zero is encoded by absence)."""
    if "task" not in doc:
        return _ZERO32
    raw = doc["task"]
    task = bytes.fromhex(raw) if isinstance(raw, str) else b""
    if len(task) != 32 or task == _ZERO32:
        raise DecodeError(f"round spec: task digest {raw!r} is not 32 non-zero bytes in hex")
    return task


def _load(data: bytes, what: str, version: int, keys: set, part: str | None = None) -> dict:
    doc = json.loads(bytes(data).decode())
    if not isinstance(doc, dict) or doc.get("v") != version:
        raise DecodeError(f"{what} version {doc.get('v') if isinstance(doc, dict) else None!r} is not {version}")
    if part is not None and doc.get("part") != part:
        raise DecodeError(f"{what}: this is a {doc.get('part')!r} part, expected {part!r}")
    unknown = set(doc) - keys
    if unknown:
        raise DecodeError(f"{what}: unknown fields {sorted(unknown)}")
    return doc


def _fp(doc: dict) -> FixedPoint:
    clip, f, k, active, wt = doc["fixed_point"]
    return FixedPoint(float(clip), int(f), int(k), int(active), float(wt))


def _keys(doc: dict) -> tuple:
    keys = tuple(bytes.fromhex(h) for h in doc["identity_keys"])
    if any(len(x) != 32 for x in keys):
        raise DecodeError("round spec: identity keys must be 32 bytes")
    return keys


def _input_kind(doc: dict) -> bool:
    if doc.get("input", "fixed-point") not in ("fixed-point", "integer"):
        raise DecodeError(f"round spec: unknown input kind {doc.get('input')!r}")
    return doc.get("input") == "integer"


def _strict(decode):
    @functools.wraps(decode)
    def wrapped(data: bytes):
        try:
            return decode(data)
        except DecodeError:
            raise
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise DecodeError(f"malformed round spec: {exc}") from None

    return wrapped


_SPEC_KEYS = {
    "v",
    "session_id",
    "round_index",
    "n_clients",
    "degree",
    "threshold",
    "quorum",
    "graph_seed",
    "length",
    "fixed_point",
    "identity_keys",
    "timeouts",
    "input",
    "task",
}
_SETUP_KEYS = {
    "v",
    "part",
    "session_id",
    "round_index",
    "n_clients",
    "degree",
    "threshold",
    "quorum",
    "graph_seed",
    "identity_keys",
    "timeouts",
}
_INPUT_KEYS = {"v", "part", "length", "fixed_point", "input", "task"}


def _timeouts(doc: dict) -> tuple:
    return tuple((str(a), float(b)) for a, b in doc["timeouts"])


@_strict
def decode_spec(data: bytes) -> RoundSpec:
    """Strict inverse of :func:`encode_spec` (DecodeError on any unknown version or malformed field)."""
    doc = _load(data, "round spec", SPEC_VERSION, _SPEC_KEYS)
    fp, keys, integer, task = _fp(doc), _keys(doc), _input_kind(doc), _decode_task(doc)
    return RoundSpec(
        bytes.fromhex(doc["session_id"]),
        int(doc["round_index"]),
        int(doc["n_clients"]),
        int(doc["degree"]),
        int(doc["threshold"]),
        bytes.fromhex(doc["graph_seed"]),
        int(doc["length"]),
        fp,
        keys,
        _timeouts(doc),
        int(doc["quorum"]),
        integer,
        task,
    )


@_strict
def decode_setup(data: bytes) -> SetupSpec:
    """Strict inverse of :func:`encode_setup`."""
    doc = _load(data, "setup part", PART_VERSION, _SETUP_KEYS, "setup")
    return SetupSpec(
        bytes.fromhex(doc["session_id"]),
        int(doc["round_index"]),
        int(doc["n_clients"]),
        int(doc["degree"]),
        int(doc["threshold"]),
        bytes.fromhex(doc["graph_seed"]),
        _keys(doc),
        _timeouts(doc),
        int(doc["quorum"]),
    )


@_strict
def decode_input(data: bytes) -> InputSpec:
    """Strict inverse of :func:`encode_input`."""
    doc = _load(data, "input part", PART_VERSION, _INPUT_KEYS, "input")
    return InputSpec(int(doc["length"]), _fp(doc), _input_kind(doc), _decode_task(doc))


def __getattr__(name):  # the machines live in their own modules (issue 12: one shape per protocol)
    if name == "SecAggClient":
        from .secagg_client import SecAggClient

        return SecAggClient
    if name == "SecAggServer":
        from .secagg_server import SecAggServer

        return SecAggServer
    raise AttributeError(name)
