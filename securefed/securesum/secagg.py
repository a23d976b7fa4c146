"""SecAgg+ client and server state machines (sans-I/O: feed a message, get messages back).

Protocol: Bonawitz et al., "Practical Secure Aggregation for Privacy-Preserving Machine Learning",
CCS 2017 (Fig. 4, the malicious-server variant with signatures and a consistency check), restricted to
a k-regular neighbour graph as in Bell et al., CCS 2020 (SecAgg+). With ``degree = n − 1`` it is
classic SecAgg. Stages (``STAGES``)::

    advertise    client → server  AdvertiseKeys(c_pk, s_pk, Ed25519 signature)
                 server → client  KeysBroadcast(signed keys of the recipient's live neighbours)
    share        client → server  EncryptedShares: for each live neighbour v, AES-GCM under
                                  HKDF(X25519(c_u, c_v)) of (Shamir share of b_u, Shamir share of s_u)
                 server → client  ForwardedShares
    masked       client → server  MaskedInput  y_u = q_u + PRG(b_u) + Σ_{v∈P_u} ±PRG(X25519(s_u, s_v))  mod 2^k
                 server → client  ConsistencyRequest(U3 = clients whose masked input arrived)
    consistency  client → server  ConsistencySignature(Ed25519 over session, round, U3)
                 server → client  UnmaskRequest(U3, ≥ t neighbour signatures)
    unmask       client → server  UnmaskResponse: share of b_v for v ∈ U3, share of s_v for v ∉ U3

and the server outputs ``Σ_{u∈U3} q_u mod 2^k``. ``+`` is used when u < v and ``−`` when u > v, so
pairwise masks cancel between survivors; the server removes the self masks of survivors and the pairwise
masks of dropped clients (from reconstructed s_v) — Bonawitz et al. 2017, Eq. (1)–(3).

Threat model (state it in every report). The server is honest-but-curious about values; with the
signatures and the consistency check it also cannot swap keys or show different clients different
survivor sets. It learns only the sum of the survivors' inputs as long as fewer than ``t`` of a
client's neighbours collude with it (and the graph of honest survivors stays connected, which the
parameter choice in :mod:`.graph` guarantees with probability ≥ 1 − 2^−σ). A client never reveals both
kinds of share for one peer (the consistency rule) and refuses to unmask if it is itself declared
dropped. Any violation (bad signature, tampered ciphertext, replayed / reordered / wrong-round message,
equivocation) puts the client in an aborted state; it sends nothing further.

Keys are fresh in every round. Reusing the mask key pair across rounds (with per-round HKDF
derivation) is **unsound**: if a client drops in round r the server reconstructs its mask secret key,
which then unmasks that client's inputs of every earlier round in which it survived (their self
masks were revealed then). securefed therefore runs key agreement per round; its cost (≈ 3 public-key
operations per neighbour) is small next to mask expansion.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass, field

import numpy as np

from ..errors import (AuthenticationError, ConfigError, DecodeError, ProtocolAbortedError, ProtocolError,
                      ProtocolTimeoutError, bad_value)
from . import crypto, shamir
from .graph import harary_graph
from .messages import (AdvertiseKeys, ConsistencyRequest, ConsistencySignature, EncryptedShares,
                       ForwardedShares, KeyEntry, KeysBroadcast, MaskedInput, ShareCipher, SharePlaintext,
                       ShareValue, SignatureEntry, UnmaskRequest, UnmaskResponse, decode, decode_expected, encode)
from .quantize import FixedPoint, quantize

__all__ = ["STAGES", "DEFAULT_TIMEOUTS", "RoundSpec", "SecAggClient", "SecAggServer"]

STAGES = ("advertise", "share", "masked", "consistency", "unmask")
DEFAULT_TIMEOUTS = {"advertise": 30.0, "share": 30.0, "masked": 120.0, "consistency": 30.0, "unmask": 60.0}


def _pack(*values: int) -> bytes:
    return struct.pack(f"<{len(values)}Q", *values)


def advert_payload(session: bytes, rnd: int, sender: int, c_pk: bytes, s_pk: bytes) -> bytes:
    """Bytes an AdvertiseKeys signature covers (domain-separated; binds session, round, sender)."""
    return b"securefed/advertise/v1|" + session + _pack(rnd, sender) + c_pk + s_pk


def consistency_payload(session: bytes, rnd: int, survivors) -> bytes:
    """Bytes a consistency signature covers: the exact survivor set U3 of this round."""
    ids = tuple(survivors)
    return b"securefed/consistency/v1|" + session + _pack(rnd, len(ids), *ids)


def share_aad(session: bytes, rnd: int, sender: int, recipient: int) -> bytes:
    """AES-GCM associated data of a share ciphertext: session, round, sender, recipient."""
    return b"securefed/share/v1|" + session + _pack(rnd, sender, recipient)


def channel_key(shared: bytes, session: bytes, rnd: int, a: int, b: int) -> bytes:
    """HKDF-SHA256 of an X25519 secret into the AES-256-GCM key of the (a, b) channel for this round."""
    lo, hi = min(a, b), max(a, b)
    return crypto.hkdf(shared, salt=session, info=b"securefed/channel/v1|" + _pack(rnd, lo, hi))


def pair_info(rnd: int, a: int, b: int) -> bytes:
    lo, hi = min(a, b), max(a, b)
    return b"pair|" + _pack(rnd, lo, hi)


def self_info(rnd: int, u: int) -> bytes:
    return b"self|" + _pack(rnd, u)


@dataclass(frozen=True)
class RoundSpec:
    """Public parameters of one round, known to every party out of band.

    ``identity_keys[i]`` is client i's long-term Ed25519 public key (a PKI or the simulator distributes
    them). ``neighbours`` is derived from ``(n_clients, degree, graph_seed)``.
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
    neighbours: tuple = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        if not isinstance(self.session_id, bytes) or len(self.session_id) != 16:
            raise ConfigError(bad_value("session_id", self.session_id, "use 16 random bytes"))
        if not 0 <= self.round_index < 2**32:
            raise ConfigError(bad_value("round_index", self.round_index, "use an integer in [0, 2^32)"))
        if len(self.identity_keys) != self.n_clients:
            raise ConfigError(bad_value("identity_keys", len(self.identity_keys), f"give {self.n_clients} Ed25519 public keys"))
        if not 1 <= self.threshold <= self.degree:
            raise ConfigError(bad_value("threshold", self.threshold, f"use 1 <= threshold <= degree = {self.degree}"))
        if self.length < 1:
            raise ConfigError(bad_value("length", self.length, "vectors need at least one coordinate"))
        tmo = dict(self.timeouts)
        if set(tmo) != set(STAGES) or any(not (v > 0) for v in tmo.values()):
            raise ConfigError(bad_value("timeouts", tmo, f"give a positive number of seconds for each of {STAGES}"))
        object.__setattr__(self, "neighbours", tuple(harary_graph(self.n_clients, self.degree, self.graph_seed)))

    def timeout(self, stage: str) -> float:
        return dict(self.timeouts)[stage]


# ================================================================================================ client


class SecAggClient:
    """One client's SecAgg+ state machine. No I/O: ``start`` and ``receive`` return encoded messages.

    Parameters
    ----------
    spec : RoundSpec
    client_id : int
    identity_key : Ed25519PrivateKey
        The client's long-term signing key (its public half is ``spec.identity_keys[client_id]``).
    update : array_like
        The client's input (``spec.length`` values after ``ravel``).
    weight : float
        Public weight, folded in before quantisation (see :mod:`.quantize`).
    random_state : None | int | Generator
        Generator for stochastic rounding only (statistics, not secrets).
    min_survivors : int
        The client refuses to sign a survivor set smaller than this (so it never helps unmask a sum over
        fewer clients). Differential privacy with distributed noise sets it to the plan's t: a sum over
        fewer survivors would carry less noise than the site's ε was accounted for.
    """

    def __init__(self, spec: RoundSpec, client_id: int, identity_key, update, weight: float = 1.0, random_state=None,
                 min_survivors: int = 1):
        from .quantize import check_random_state

        if not 0 <= client_id < spec.n_clients:
            raise ConfigError(bad_value("client_id", client_id, f"use 0 <= client_id < {spec.n_clients}"))
        if np.size(update) != spec.length:
            raise ConfigError(bad_value("update.size", np.size(update), f"expected {spec.length} values"))
        if isinstance(min_survivors, bool) or not isinstance(min_survivors, (int, np.integer)) or \
                not 1 <= min_survivors <= spec.n_clients:
            raise ConfigError(bad_value("min_survivors", min_survivors, f"use an integer in [1, {spec.n_clients}]"))
        self.spec, self.id = spec, client_id
        self.min_survivors = int(min_survivors)
        self._identity = identity_key
        self._update = update
        self._weight = float(weight)
        self._rng = check_random_state(random_state)
        self.state = "init"
        self.clipped = 0
        self._neighbours = spec.neighbours[client_id]
        self._peers_keys: dict[int, tuple[bytes, bytes]] = {}
        self._held: dict[int, tuple[int, int]] = {}
        self._revealed: dict[int, str] = {}
        self._survivors: tuple | None = None

    # -- helpers
    def _abort(self):
        self.state = "aborted"
        self._c_sk = self._s_sk = self._b = None
        self._held = {}
        self._update = None

    def start(self, now: float = 0.0) -> list[bytes]:
        """Stage ``advertise``: fresh X25519 key pairs, signed with the identity key."""
        if self.state != "init":
            self._abort()
            raise ProtocolError(f"client {self.id}: start() called twice; aborted")
        self._c_sk, c_pk = crypto.x25519_keypair()
        self._s_sk, s_pk = crypto.x25519_keypair()
        self._c_pk, self._s_pk = c_pk, s_pk
        sig = crypto.sign(self._identity, advert_payload(self.spec.session_id, self.spec.round_index, self.id, c_pk, s_pk))
        self.state = "advertised"
        return [encode(AdvertiseKeys(self.spec.session_id, self.spec.round_index, self.id, c_pk, s_pk, sig))]

    def receive(self, data: bytes, now: float = 0.0) -> list[bytes]:
        """Consume one server message; return the reply (possibly empty). Any violation aborts."""
        if self.state in ("aborted", "done"):
            raise ProtocolAbortedError(f"client {self.id} is {self.state} and accepts no further messages")
        handlers = {"advertised": (KeysBroadcast, self._on_keys), "shared": (ForwardedShares, self._on_shares),
                    "masked": (ConsistencyRequest, self._on_consistency), "signed": (UnmaskRequest, self._on_unmask)}
        expected, handler = handlers.get(self.state, (None, None))
        try:
            if expected is None:
                raise ProtocolError(f"client {self.id}: no message expected in state {self.state!r}")
            msg = decode_expected(data, self.spec, expected, f"client {self.id} in state {self.state!r}",
                                  "replayed or reordered message")
            if msg.recipient != self.id:
                raise ProtocolError(f"client {self.id} received a message addressed to client {msg.recipient}")
            return handler(msg)
        except Exception:
            self._abort()
            raise

    # -- stage handlers
    def _on_keys(self, msg: KeysBroadcast) -> list[bytes]:
        spec, t = self.spec, self.spec.threshold
        senders = [e.sender for e in msg.entries]
        if len(set(senders)) != len(senders):
            raise ProtocolError(f"client {self.id}: duplicate key advertisement in broadcast")
        for e in msg.entries:
            if e.sender not in self._neighbours:
                raise ProtocolError(f"client {self.id}: broadcast contains client {e.sender}, not a neighbour")
            crypto.verify(spec.identity_keys[e.sender], e.signature,
                          advert_payload(spec.session_id, spec.round_index, e.sender, e.c_pk, e.s_pk),
                          what=f"client {e.sender}'s advertised keys")
            if e.c_pk == e.s_pk or e.c_pk in (self._c_pk, self._s_pk) or e.s_pk in (self._c_pk, self._s_pk):
                raise AuthenticationError(f"client {self.id}: client {e.sender} advertised reused keys")
            self._peers_keys[e.sender] = (e.c_pk, e.s_pk)
        if len(msg.entries) < t:
            raise ProtocolAbortedError(f"client {self.id}: only {len(msg.entries)} live neighbours, threshold is {t}")
        peers = sorted(self._peers_keys)
        self._b = os.urandom(crypto.SEED_BYTES)
        xs = [v + 1 for v in peers]
        b_shares = shamir.share(shamir.secret_to_int(self._b), xs, t)
        s_shares = shamir.share(shamir.secret_to_int(crypto.x25519_private_bytes(self._s_sk)), xs, t)
        items = []
        self._chan = {}
        for v, bs, ss in zip(peers, b_shares, s_shares):
            key = channel_key(crypto.x25519_shared(self._c_sk, self._peers_keys[v][0]), spec.session_id,
                              spec.round_index, self.id, v)
            self._chan[v] = key
            pt = encode(SharePlaintext(spec.session_id, spec.round_index, self.id, v, bs, ss))
            items.append(ShareCipher(v, crypto.aead_encrypt(key, pt, share_aad(spec.session_id, spec.round_index, self.id, v))))
        self._c_sk = None
        self.state = "shared"
        return [encode(EncryptedShares(spec.session_id, spec.round_index, self.id, tuple(items)))]

    def _on_shares(self, msg: ForwardedShares) -> list[bytes]:
        spec, t = self.spec, self.spec.threshold
        senders = [it.peer for it in msg.items]
        if len(set(senders)) != len(senders):
            raise ProtocolError(f"client {self.id}: duplicate share ciphertexts")
        for it in msg.items:
            if it.peer not in self._chan:
                raise ProtocolError(f"client {self.id}: shares from client {it.peer}, whose keys it never received")
            pt = crypto.aead_decrypt(self._chan[it.peer], it.ciphertext,
                                     share_aad(spec.session_id, spec.round_index, it.peer, self.id),
                                     what=f"client {self.id}: shares from client {it.peer}")
            sp = decode(pt, session_id=spec.session_id, round_index=spec.round_index, expected=SharePlaintext)
            if sp.sender != it.peer or sp.recipient != self.id:
                raise AuthenticationError(f"client {self.id}: share plaintext names the wrong parties")
            self._held[it.peer] = (sp.self_share, sp.key_share)
        if len(self._held) < t:
            raise ProtocolAbortedError(f"client {self.id}: shares from only {len(self._held)} neighbours, threshold is {t}")
        self._chan = {}
        # masked input
        fp = spec.fixed_point
        acc, self.clipped = quantize(self._update, self._weight, fp, self._rng)
        buf = bytearray(acc.nbytes + 16)
        crypto.add_mask_inplace(acc, self._b, session_id=spec.session_id, info=self_info(spec.round_index, self.id),
                                sign=+1, buf=buf)
        for v in sorted(self._held):
            shared = crypto.x25519_shared(self._s_sk, self._peers_keys[v][1])
            crypto.add_mask_inplace(acc, shared, session_id=spec.session_id, info=pair_info(spec.round_index, self.id, v),
                                    sign=+1 if self.id < v else -1, buf=buf)
        if fp.modulus_bits not in (32, 64):
            acc &= fp.dtype((1 << fp.modulus_bits) - 1)
        self._b = self._s_sk = None
        self._update = None
        self.state = "masked"
        return [encode(MaskedInput(spec.session_id, spec.round_index, self.id, fp.modulus_bits, acc.tobytes()))]

    def _on_consistency(self, msg: ConsistencyRequest) -> list[bytes]:
        spec = self.spec
        if self.id not in msg.survivors:
            raise ProtocolAbortedError(f"client {self.id} is declared dropped; it will not take part in unmasking")
        if any(not 0 <= s < spec.n_clients for s in msg.survivors):
            raise ProtocolError(f"client {self.id}: survivor list names unknown clients")
        if len(set(msg.survivors)) < self.min_survivors:
            raise ProtocolAbortedError(f"client {self.id} refuses to sign a survivor set of {len(set(msg.survivors))} "
                                       f"clients: it unmasks only sums over at least {self.min_survivors}")
        self._survivors = tuple(msg.survivors)
        sig = crypto.sign(self._identity, consistency_payload(spec.session_id, spec.round_index, self._survivors))
        self.state = "signed"
        return [encode(ConsistencySignature(spec.session_id, spec.round_index, self.id, sig))]

    def _on_unmask(self, msg: UnmaskRequest) -> list[bytes]:
        spec, t = self.spec, self.spec.threshold
        if tuple(msg.survivors) != self._survivors:
            raise AuthenticationError(f"client {self.id}: server changed the survivor set after the consistency check")
        signers = [s.signer for s in msg.signatures]
        if len(set(signers)) != len(signers):
            raise ProtocolError(f"client {self.id}: duplicate consistency signatures")
        payload = consistency_payload(spec.session_id, spec.round_index, self._survivors)
        good = 0
        for s in msg.signatures:
            if s.signer not in self._survivors:
                raise ProtocolError(f"client {self.id}: consistency signature from non-survivor {s.signer}")
            if s.signer in self._neighbours and good < t:  # t valid neighbour signatures suffice
                crypto.verify(spec.identity_keys[s.signer], s.signature, payload, what=f"client {s.signer}'s survivor set")
                good += 1
        if good < t:
            raise ProtocolAbortedError(f"client {self.id}: only {good} neighbours confirmed the survivor set, threshold is {t}")
        surv = set(self._survivors)
        self_shares, key_shares = [], []
        for v in sorted(self._held):
            kind = "self" if v in surv else "key"
            if self._revealed.get(v, kind) != kind:  # consistency rule: never both kinds for one peer
                raise ProtocolError(f"client {self.id}: asked for both share kinds of client {v}; refused")
            self._revealed[v] = kind
            bs, ss = self._held[v]
            (self_shares if kind == "self" else key_shares).append(ShareValue(v, bs if kind == "self" else ss))
        self.state = "done"
        self._held = {}
        return [encode(UnmaskResponse(spec.session_id, spec.round_index, self.id, tuple(self_shares), tuple(key_shares)))]


# ================================================================================================ server


def _prune(alive: set, neighbours, t: int) -> set:
    """Largest subset where every member keeps ≥ t neighbours inside the subset (iterated removal)."""
    alive = set(alive)
    changed = True
    while changed:
        changed = False
        for u in sorted(alive):
            if len(neighbours[u] & alive) < t:
                alive.discard(u)
                changed = True
    return alive


class SecAggServer:
    """The SecAgg+ server state machine. No I/O and no sleeping: the caller passes ``now``.

    ``receive(data, now)`` and ``tick(now)`` return ``[(recipient, bytes), …]``. A stage closes when
    every expected client has answered or, on ``tick``, when its deadline (``spec.timeouts``) passed.
    Messages the server rejects (malformed, duplicate, stale, from an unexpected client) raise a
    :class:`ProtocolError` and are discarded; they do not abort the round (a client cannot sabotage
    others). A round that cannot complete raises :class:`ProtocolAbortedError` (or
    :class:`ProtocolTimeoutError` when a deadline caused it) *before* any share is requested that could
    not lead to the sum, and the server discards everything it holds.
    """

    def __init__(self, spec: RoundSpec, now: float = 0.0):
        self.spec = spec
        self.stage = "advertise"
        self.deadline = now + spec.timeout("advertise")
        self.expected = set(range(spec.n_clients))
        self.received: dict[int, object] = {}
        self.bytes_in: dict[int, int] = {}
        self.bytes_out: dict[int, int] = {}
        self.dropped_at: dict[str, tuple] = {}
        self.result: np.ndarray | None = None
        self.survivors: tuple = ()
        self.error: Exception | None = None
        self._keys: dict[int, AdvertiseKeys] = {}

    @property
    def done(self) -> bool:
        return self.stage in ("done", "aborted")

    def receive(self, data: bytes, now: float = 0.0) -> list[tuple[int, bytes]]:
        if self.done:
            raise ProtocolError(f"server is {self.stage}; message discarded")
        expected = {"advertise": AdvertiseKeys, "share": EncryptedShares, "masked": MaskedInput,
                    "consistency": ConsistencySignature, "unmask": UnmaskResponse}[self.stage]
        msg = decode_expected(data, self.spec, expected, f"server in stage {self.stage!r}",
                              "stale, replayed or reordered; discarded")
        u = msg.sender
        if u not in self.expected:
            raise ProtocolError(f"server: client {u} is not expected in stage {self.stage!r}; discarded")
        if u in self.received:
            raise ProtocolError(f"server: duplicate {type(msg).__name__} from client {u} (replay); discarded")
        self._validate(msg)
        self.received[u] = msg
        self.bytes_in[u] = self.bytes_in.get(u, 0) + len(data)
        if set(self.received) >= self.expected:
            return self._close(now, timed_out=False)
        return []

    def tick(self, now: float) -> list[tuple[int, bytes]]:
        """Close the current stage if its deadline has passed."""
        if self.done or now < self.deadline:
            return []
        return self._close(now, timed_out=True)

    # -- validation of single messages (reject without aborting)
    def _validate(self, msg) -> None:
        spec = self.spec
        if isinstance(msg, AdvertiseKeys):
            crypto.verify(spec.identity_keys[msg.sender], msg.signature,
                          advert_payload(spec.session_id, spec.round_index, msg.sender, msg.c_pk, msg.s_pk),
                          what=f"client {msg.sender}'s advertised keys")
        elif isinstance(msg, EncryptedShares):
            want = sorted(spec.neighbours[msg.sender] & self._u1)
            if [it.peer for it in msg.items] != want:
                raise ProtocolError(f"server: client {msg.sender} sent shares for {[it.peer for it in msg.items]}, expected {want}")
        elif isinstance(msg, MaskedInput):
            fp = spec.fixed_point
            if msg.bits != fp.modulus_bits or len(msg.data) != spec.length * np.dtype(fp.dtype).itemsize:
                raise DecodeError(f"server: masked input of client {msg.sender} has the wrong size or modulus")
        elif isinstance(msg, ConsistencySignature):
            crypto.verify(spec.identity_keys[msg.sender], msg.signature,
                          consistency_payload(spec.session_id, spec.round_index, self._u3),
                          what=f"client {msg.sender}'s survivor set")
        elif isinstance(msg, UnmaskResponse):
            peers = self._peers[msg.sender]
            want_self = sorted(peers & set(self._u3))
            want_key = sorted(peers - set(self._u3))
            if [s.owner for s in msg.self_shares] != want_self or [s.owner for s in msg.key_shares] != want_key:
                raise ProtocolError(f"server: client {msg.sender} revealed shares for the wrong peers")

    # -- stage transitions
    def _fail(self, reason: str, timed_out: bool):
        self.stage = "aborted"
        self.received = {}
        self._keys = {}
        err = (ProtocolTimeoutError if timed_out else ProtocolAbortedError)(
            f"round {self.spec.round_index} aborted, nothing revealed: {reason}")
        self.error = err
        raise err

    def _advance(self, stage: str, now: float, expected: set) -> None:
        self.dropped_at[self.stage] = tuple(sorted(self.expected - set(self.received)))
        self.stage = stage
        self.deadline = now + self.spec.timeout(stage)
        self.expected = set(expected)
        self.received = {}

    def _send(self, out: list, rid: int, msg) -> None:
        data = encode(msg)
        self.bytes_out[rid] = self.bytes_out.get(rid, 0) + len(data)
        out.append((rid, data))

    def _needed_ok(self, holders: set, now, timed_out, what: str) -> None:
        """Every client whose secret the unmasking needs keeps ≥ t share holders in ``holders``."""
        t = self.spec.threshold
        for u in sorted(self._u2):
            if u not in self._u3 and not (self._peers[u] & set(self._u3)):
                continue  # dropped and nobody masked with it: nothing to recover
            live = len(self._peers[u] & holders)
            if live < t:
                self._fail(f"client {u} keeps only {live} live neighbours holding its shares at stage {what!r} "
                           f"(threshold {t})", timed_out)

    def _close(self, now: float, timed_out: bool) -> list[tuple[int, bytes]]:
        spec, sid, rnd, t = self.spec, self.spec.session_id, self.spec.round_index, self.spec.threshold
        nb = spec.neighbours
        out: list = []
        if self.stage == "advertise":
            u1 = _prune(set(self.received), nb, t)
            if not u1:
                self._fail(f"only {len(self.received)} clients advertised keys; none keeps {t} live neighbours", timed_out)
            self._keys = {u: self.received[u] for u in u1}
            self._u1 = u1
            self._advance("share", now, u1)
            for u in sorted(u1):
                entries = tuple(KeyEntry(v, self._keys[v].c_pk, self._keys[v].s_pk, self._keys[v].signature)
                                for v in sorted(nb[u] & u1))
                self._send(out, u, KeysBroadcast(sid, rnd, u, entries))
        elif self.stage == "share":
            u2 = _prune(set(self.received), nb, t)
            if not u2:
                self._fail(f"only {len(self.received)} clients shared keys; none keeps {t} live neighbours", timed_out)
            shares = {u: {it.peer: it.ciphertext for it in self.received[u].items} for u in u2}
            self._u2 = u2
            self._peers = {u: nb[u] & u2 for u in u2}
            self._advance("masked", now, u2)
            for u in sorted(u2):
                items = tuple(ShareCipher(v, shares[v][u]) for v in sorted(self._peers[u]))
                self._send(out, u, ForwardedShares(sid, rnd, u, items))
        elif self.stage == "masked":
            self._u3 = tuple(sorted(self.received))
            if not self._u3:
                self._fail("no masked input arrived", timed_out)
            dt = spec.fixed_point.dtype
            self._inputs = {u: np.frombuffer(self.received[u].data, dtype=dt) for u in self._u3}
            self._needed_ok(set(self._u3), now, timed_out, "masked")
            self._advance("consistency", now, set(self._u3))
            for u in self._u3:
                self._send(out, u, ConsistencyRequest(sid, rnd, u, self._u3))
        elif self.stage == "consistency":
            u4 = set(self.received)
            self._needed_ok(u4, now, timed_out, "consistency")
            sigs = {u: self.received[u].signature for u in u4}
            self._advance("unmask", now, u4)
            for u in sorted(u4):
                entries = tuple(SignatureEntry(v, sigs[v]) for v in sorted((nb[u] | {u}) & u4))
                self._send(out, u, UnmaskRequest(sid, rnd, u, self._u3, entries))
        elif self.stage == "unmask":
            self._needed_ok(set(self.received), now, timed_out, "unmask")
            self._finish()
        return out

    def _finish(self) -> None:
        spec, t = self.spec, self.spec.threshold
        sid, rnd, fp = spec.session_id, spec.round_index, spec.fixed_point
        u3 = set(self._u3)
        self_pts: dict[int, list] = {}
        key_pts: dict[int, list] = {}
        for v, msg in sorted(self.received.items()):
            for s in msg.self_shares:
                self_pts.setdefault(s.owner, []).append((v + 1, s.value))
            for s in msg.key_shares:
                key_pts.setdefault(s.owner, []).append((v + 1, s.value))
        acc = np.zeros(spec.length, dtype=fp.dtype)
        for u in self._u3:
            np.add(acc, self._inputs[u], out=acc)
        buf = bytearray(acc.nbytes + 16)
        for u in self._u3:
            b = shamir.int_to_secret(shamir.reconstruct(self_pts.get(u, []), t))
            crypto.add_mask_inplace(acc, b, session_id=sid, info=self_info(rnd, u), sign=-1, buf=buf)
        for u in sorted(self._u2 - u3):
            partners = sorted(self._peers[u] & u3)
            if not partners:
                continue
            raw = shamir.int_to_secret(shamir.reconstruct(key_pts.get(u, []), t))
            s_sk = crypto.x25519_private_from_bytes(raw)
            if crypto.x25519_public_bytes(s_sk) != self._keys[u].s_pk:
                self._fail(f"reconstructed mask key of client {u} does not match its advertised key (bad shares)", False)
            for v in partners:
                shared = crypto.x25519_shared(s_sk, self._keys[v].s_pk)
                # survivor v added +m when v < u, −m when v > u: remove it
                crypto.add_mask_inplace(acc, shared, session_id=sid, info=pair_info(rnd, u, v),
                                        sign=-1 if v < u else +1, buf=buf)
        if fp.modulus_bits not in (32, 64):
            acc &= fp.dtype((1 << fp.modulus_bits) - 1)
        self.dropped_at[self.stage] = tuple(sorted(self.expected - set(self.received)))
        self.result = acc
        self.survivors = self._u3
        self.stage = "done"
        self.received = {}
        self._inputs = {}
