"""The CKKS client and server machines (sans-I/O, :mod:`..machine`): the server adds ciphertexts it cannot
decrypt; a key-holding client decrypts only a sum it has checked.

Scheme: Cheon, Kim, Kim, Song, "Homomorphic Encryption for Arithmetic of Approximate Numbers", ASIACRYPT 2017
(CKKS), via TenSEAL / Microsoft SEAL. Stages (``CKKS_STAGES``)::

    advertise  client → server    AdvertiseKeys: a fresh X25519 key c_pk, Ed25519-signed (bound to the spec digest)
               server → holder    KeysBroadcast: the signed advertisements of the fallback decryptors
    handoff    holder → server    PublicContext (public key only), signed by the key holder
                                  ContextHandoff per fallback: the secret context under AES-256-GCM with key
                                  HKDF(X25519(c_holder, c_j)) — only the ``spec.fallbacks`` get it
                                  SignedInput: the holder's own input
               server → fallback  KeysBroadcast(the holder's signed advertisement) + ContextHandoff
               server → others    PublicContext (as the holder signed it; each client checks the signature, so a
                                  server cannot hand it a context of its own and read its input)
    input      client → server    SignedInput: clip to [−c, c], weight, batch over ⌈d / slots⌉ ciphertexts;
                                  Ed25519 signature over SHA-256 of the chunks, bound to session, round, sender
    decrypt    server → survivor  ConsistencyRequest(U)          (server stage ``confirm``)
               survivor → server  ConsistencySignature over (session, round, spec digest, U), once per round
               server → decryptor DecryptRequest: U, a quorum of signatures, the signed digests, the uploads
                                  (``verify="recompute"``) and the server's sum
               decryptor → server DecryptedSum: decrypted, **flooded** (σ of :func:`.params.flood_sigma`) and
                                  randomised-rounded to the step, signed by the decryptor

Transitions (``CKKSClient.TRANSITIONS`` / ``CKKSServer.TRANSITIONS``)::

    client state  message            handler        server stage  accepts                                   handler
    advertised    KeysBroadcast      _on_keys       advertise     AdvertiseKeys                             _on_advert
    advertised    PublicContext      _on_public     handoff       PublicContext, ContextHandoff, SignedInput  _on_public, _on_handoff, _on_input
    keyed         ContextHandoff     _on_handoff    input         SignedInput                               _on_input
    uploaded      ConsistencyRequest _on_confirm    confirm       ConsistencySignature                      _on_confirmation
    confirmed     DecryptRequest     _on_decrypt    decrypt       DecryptedSum                              _on_decrypted

The decryptor is the key holder or, when it does not answer (or lies) before the ``decrypt`` deadline, a
fallback that confirmed U. **Who can read what** (measured in tests/securesum/test_attack_ckks.py::test_who_can_read_an_upload_with_the_server):
the coordinator alone learns only the decrypted sum; the coordinator together with one of the
``1 + len(spec.fallbacks)`` key-holding sites of a round reads every site's individual upload of that round
at CKKS precision; together with any other site it learns nothing more (that site holds a public context,
which cannot decrypt). SecAgg+ tolerates c colluders; CKKS tolerates none among its key holders.

What the decryptor checks before it decrypts (against a *malicious* server): only the survivor set U it
confirmed itself, only with ≥ ``quorum`` valid survivor-set signatures from distinct members of U (default a
majority of all n), only if |U| ≥ ``min_survivors``, only if each survivor's digest carries that client's
signature for this round (its own digest must be the one it signed); with ``verify="recompute"`` it re-adds
the signed uploads and refuses unless the server's sum is byte-identical. This prevents decrypting a single
client's ciphertext, a sum over fewer than ``min_survivors``, any other combination of uploads, a ciphertext of
another round, and two different survivor sets in one round. It does not prevent (i) collusion with a key
holder (above); (ii) differencing when ``quorum`` ≤ n/2 or c colluders sign two sets with 2·quorum − n ≤ c;
(iii) colluding clients that upload known vectors so the sum exposes one honest input; (iv) a server that
controls the identity keys; (v) combining sums of different rounds over the same inputs. ``verify="signatures"``
decrypts the server's sum as sent (cheaper; sound only against an honest-but-curious server). The coordinator
refuses a release outside ``M + spec.release_bound`` and a DecryptedSum that its decryptor did not sign.
"""

from __future__ import annotations

import json
import struct
import time

import numpy as np

from ...errors import AuthenticationError, ConfigError, DecodeError, ProtocolError, bad_value
from .. import crypto
from ..machine import StageClient, StageServer
from ..messages import (
    AdvertiseKeys,
    ConsistencyRequest,
    ConsistencySignature,
    ContextHandoff,
    DecryptedSum,
    DecryptRequest,
    InputDigest,
    InputEntry,
    KeyEntry,
    KeysBroadcast,
    PublicContext,
    SignatureEntry,
    SignedInput,
    encode,
)
from ..secagg import advert_payload, channel_key, share_aad
from . import context as cx
from .params import CKKSRoundSpec, gaussian_noise, randomized_round

__all__ = ["CKKSClient", "CKKSServer"]

_STATE_MAGIC = b"SFCKKS"
_STATE_VERSION = 2
_CLIENT_STATES = ("init", "advertised", "keyed", "uploaded", "confirmed", "done", "aborted")


class CKKSClient(StageClient):
    """One client's CKKS state machine. No I/O: ``start`` and ``receive`` return encoded messages.

    States: ``init`` → ``advertised`` → (``keyed``, fallback decryptors: the holder's key verified, the
    handoff awaited) → ``uploaded`` → ``confirmed`` (signed the survivor set, once) → ``done`` (the
    decryptor only); any violation → ``aborted`` (sends nothing further).

    Parameters
    ----------
    spec : CKKSRoundSpec
    client_id : int
    identity_key : Ed25519PrivateKey
        The client's signing key (public half ``spec.identity_keys[client_id]``).
    update : array_like
        The client's input (``spec.params.length`` values after ``ravel``).
    weight : float
        The client's own non-negative weight, applied after clipping (a site computes it from its own data).
    """

    TRANSITIONS = {
        "advertised": {KeysBroadcast: "_on_keys", PublicContext: "_on_public"},
        "keyed": {ContextHandoff: "_on_handoff"},
        "uploaded": {ConsistencyRequest: "_on_confirm"},
        "confirmed": {DecryptRequest: "_on_decrypt"},
    }

    def __init__(self, spec: CKKSRoundSpec, client_id: int, identity_key, update, weight: float = 1.0):
        if not 0 <= client_id < spec.n_clients:
            raise ConfigError(bad_value("client_id", client_id, f"use 0 <= client_id < {spec.n_clients}"))
        if np.size(update) != spec.params.length:
            raise ConfigError(bad_value("update.size", np.size(update), f"expected {spec.params.length} values"))
        if not (np.isfinite(weight) and weight >= 0):
            raise ConfigError(bad_value("weight", weight, "use a finite non-negative weight"))
        self.spec, self.id = spec, int(client_id)
        self._identity = identity_key
        self._update = np.asarray(update, dtype=np.float64).ravel().copy()
        if not np.all(np.isfinite(self._update)):
            raise ConfigError(bad_value("update", "non-finite values", "clients must upload finite numbers"))
        self._weight = float(weight)
        self.state = "init"
        self.clipped = 0
        self._c_sk: crypto.X25519PrivateKey | None = None
        self._c_pk: bytes | None = None
        self._holder_pk: bytes | None = None
        self._ctx = None
        self._digest: bytes | None = None
        self._survivors: tuple | None = None

    @property
    def is_key_holder(self) -> bool:
        return self.id == self.spec.key_holder

    @property
    def holds_secret(self) -> bool:
        """True while this client holds the CKKS secret key (key holder, or a fallback after its handoff)."""
        return self._ctx is not None and self._ctx.is_private()

    def _abort(self):
        self.state = "aborted"
        self._c_sk = self._ctx = self._update = None

    def start(self, now: float = 0.0) -> list[bytes]:
        """Stage ``advertise``: a fresh X25519 key pair, signed with the identity key."""
        self._begin()
        self._c_sk, c_pk = crypto.x25519_keypair()
        _, s_pk = crypto.x25519_keypair()  # the advertisement format carries two keys; CKKS uses only c_pk
        self._c_pk = c_pk
        return self._advertise(c_pk, s_pk, bytes(32))

    def _verify_entry(self, e: KeyEntry) -> None:
        spec = self.spec
        if not 0 <= e.sender < spec.n_clients:
            raise ProtocolError(f"client {self.id}: key advertisement of unknown client {e.sender}")
        crypto.verify(
            spec.identity_keys[e.sender],
            e.signature,
            advert_payload(spec.session_id, spec.round_index, e.sender, spec.digest, e.c_pk, e.s_pk, e.commit),
            what=f"client {e.sender}'s advertised key",
        )

    # -- stage handlers
    def _on_keys(self, msg: KeysBroadcast) -> list[bytes]:
        spec, kh = self.spec, self.spec.key_holder
        senders = [e.sender for e in msg.entries]
        if len(set(senders)) != len(senders):
            raise ProtocolError(f"client {self.id}: duplicate key advertisement in broadcast")
        if not self.is_key_holder:
            if self.id not in spec.fallbacks:
                raise ProtocolError(f"client {self.id}: not a decryptor of this round; it expects the public context")
            if senders != [kh]:
                raise ProtocolError(
                    f"client {self.id}: expected the key holder's ({kh}) advertisement only, got {senders}"
                )
            self._verify_entry(msg.entries[0])
            self._holder_pk = msg.entries[0].c_pk
            self.state = "keyed"
            return []
        if not set(senders) <= set(spec.fallbacks) | {self.id}:
            raise ProtocolError(
                f"client {self.id}: the broadcast names clients {senders}, not only this round's "
                f"fallback decryptors {list(spec.fallbacks)}; the secret key goes to nobody else"
            )
        out = []
        ctx = cx.make_context(spec.params)
        pub = cx.public_bytes(ctx)
        sig = crypto.sign(
            self._identity, cx.context_payload(spec.session_id, spec.round_index, self.id, spec.digest, pub)
        )
        out.append(encode(PublicContext(spec.session_id, spec.round_index, self.id, pub, sig)))
        secret = cx.secret_bytes(ctx)
        for e in msg.entries:
            if e.sender == self.id:
                if e.c_pk != self._c_pk:
                    raise AuthenticationError(f"client {self.id}: the broadcast carries a key it never advertised")
                continue
            try:
                self._verify_entry(e)
                if e.c_pk == self._c_pk:
                    raise AuthenticationError(f"client {e.sender} advertised the key holder's own key")
                key = channel_key(
                    crypto.x25519_shared(self._c_sk, e.c_pk), spec.session_id, spec.round_index, self.id, e.sender
                )
            except AuthenticationError:
                continue  # a bad advertisement: that fallback gets no key (it can still upload with the public one)
            ct = crypto.aead_encrypt(key, secret, share_aad(spec.session_id, spec.round_index, self.id, e.sender))
            out.append(encode(ContextHandoff(spec.session_id, spec.round_index, self.id, e.sender, ct)))
        self._c_sk = None
        self._ctx = ctx
        out.append(self._upload())
        return out

    def _on_public(self, msg: PublicContext) -> list[bytes]:
        spec, kh = self.spec, self.spec.key_holder
        if self.is_key_holder or msg.sender != kh:
            raise ProtocolError(f"client {self.id}: public context from client {msg.sender}, not the key holder {kh}")
        crypto.verify(
            spec.identity_keys[kh],
            msg.signature,
            cx.context_payload(spec.session_id, spec.round_index, kh, spec.digest, msg.context),
            what="the key holder's public context",
        )
        ctx = cx.load_public_context(msg.context)
        self._check_context(ctx)
        self._c_sk = None
        self._ctx = ctx
        return [self._upload()]

    def _check_context(self, ctx) -> None:
        if ctx.global_scale != 2.0**self.spec.params.scale_bits:
            raise ProtocolError(f"client {self.id}: the CKKS context has the wrong scale")

    def _on_handoff(self, msg: ContextHandoff) -> list[bytes]:
        spec, kh = self.spec, self.spec.key_holder
        if msg.sender != kh:
            raise ProtocolError(f"client {self.id}: key handoff from client {msg.sender}, not the key holder {kh}")
        key = channel_key(
            crypto.x25519_shared(self._c_sk, self._holder_pk), spec.session_id, spec.round_index, kh, self.id
        )
        secret = crypto.aead_decrypt(
            key,
            msg.ciphertext,
            share_aad(spec.session_id, spec.round_index, kh, self.id),
            what=f"client {self.id}: CKKS key handoff",
        )
        ctx = cx.load_context(secret, f"client {self.id}: the handed-off CKKS context")
        if not ctx.is_private():
            raise ProtocolError(f"client {self.id}: the handed-off context lacks the secret key")
        self._check_context(ctx)
        self._c_sk = None
        self._ctx = ctx
        return [self._upload()]

    def _upload(self) -> bytes:
        spec = self.spec
        c = spec.clip
        x = self._update
        self.clipped = int(np.count_nonzero(np.abs(x) > c))
        x = np.clip(x, -c, c) * self._weight
        chunks = cx.encrypt_vector(self._ctx, x, spec.params.slots)
        self._digest = cx.upload_digest(chunks)
        sig = crypto.sign(
            self._identity, cx.input_payload(spec.session_id, spec.round_index, self.id, self._digest, spec.digest)
        )
        self._update = None
        self.state = "uploaded"
        return encode(SignedInput(spec.session_id, spec.round_index, self.id, chunks, sig))

    def _on_confirm(self, msg: ConsistencyRequest) -> list[bytes]:
        """Sign the survivor set U — once per round, and only a U that contains this client's input."""
        spec = self.spec
        surv = self._survivor_set(msg.survivors, spec.min_survivors, AuthenticationError)
        self._survivors = surv
        self.state = "confirmed"
        sig = crypto.sign(self._identity, cx.survivors_payload(spec.session_id, spec.round_index, surv, spec.digest))
        return [encode(ConsistencySignature(spec.session_id, spec.round_index, self.id, sig))]

    def _on_decrypt(self, msg: DecryptRequest) -> list[bytes]:
        spec, p = self.spec, self.spec.params
        if not self.holds_secret:
            raise ProtocolError(f"client {self.id} holds no CKKS secret key; it decrypts nothing")
        surv = tuple(msg.survivors)
        if surv != self._survivors:
            raise AuthenticationError(
                f"client {self.id}: asked to decrypt over a survivor set other than the one it confirmed; refused"
            )
        signers = [e.signer for e in msg.signatures]
        if len(set(signers)) != len(signers) or not set(signers) <= set(surv):
            raise ProtocolError(f"client {self.id}: survivor-set signatures are duplicated or from non-survivors")
        payload = cx.survivors_payload(spec.session_id, spec.round_index, surv, spec.digest)
        for e in msg.signatures:
            crypto.verify(spec.identity_keys[e.signer], e.signature, payload, what=f"client {e.signer}'s survivor set")
        if len(signers) < spec.signatures_needed:
            raise AuthenticationError(
                f"client {self.id}: only {len(signers)} clients confirmed the survivor set, "
                f"{spec.signatures_needed} required; refused"
            )
        if tuple(d.sender for d in msg.digests) != surv:
            raise AuthenticationError(f"client {self.id}: signed digests do not match the survivor list; refused")
        digests = {}
        for d in msg.digests:
            crypto.verify(
                spec.identity_keys[d.sender],
                d.signature,
                cx.input_payload(spec.session_id, spec.round_index, d.sender, d.digest, spec.digest),
                what=f"client {d.sender}'s CKKS upload",
            )
            digests[d.sender] = d.digest
        if digests[self.id] != self._digest:
            raise AuthenticationError(f"client {self.id}: the digest of its own upload was replaced; refused")
        if spec.verify == "recompute":
            if tuple(e.sender for e in msg.uploads) != surv:
                raise AuthenticationError(f"client {self.id}: relayed uploads do not match the survivor list; refused")
            sums = None
            for e in msg.uploads:
                if len(e.chunks) != p.n_ciphertexts or cx.upload_digest(e.chunks) != digests[e.sender]:
                    raise AuthenticationError(
                        f"client {self.id}: client {e.sender}'s relayed upload does not match "
                        "its signed digest; refused"
                    )
                sums = cx.add_into(
                    sums,
                    cx.vectors(self._ctx, e.chunks, f"upload of client {e.sender}"),
                    f"upload of client {e.sender}",
                )
            mine = tuple(v.serialize() for v in sums)
            if mine != tuple(msg.chunks):
                raise AuthenticationError(
                    f"client {self.id}: the server's claimed sum is not the homomorphic sum of "
                    "the signed uploads; refused to decrypt"
                )
            vecs = sums
        else:
            if msg.uploads:
                raise ProtocolError(f"client {self.id}: uploads relayed in verify='signatures' mode")
            if len(msg.chunks) != p.n_ciphertexts:
                raise ProtocolError(f"client {self.id}: {len(msg.chunks)} sum ciphertexts, expected {p.n_ciphertexts}")
            vecs = cx.vectors(self._ctx, msg.chunks, "encrypted sum")
        raw = cx.decrypt_vectors(vecs, p.length)
        out = randomized_round(raw + gaussian_noise(p.length, spec.flood_sigma), p.step)
        self._ctx = None
        self.state = "done"
        data = out.astype("<f8").tobytes()
        sig = crypto.sign(
            self._identity, cx.decrypted_payload(spec.session_id, spec.round_index, self.id, spec.digest, p.step, data)
        )
        return [encode(DecryptedSum(spec.session_id, spec.round_index, self.id, p.step, data, sig))]

    # -- persistence between messages (a fresh process per message, e.g. a Flower ClientApp)
    def dump(self) -> bytes:
        """Serialise the live state (everything but spec and identity key) to bytes.

        The X25519 key is stored raw and the CKKS context as held (**with its secret key** on a key holder):
        the bytes must stay on the client (Flower keeps them in the SuperNode's per-run state on the site).
        """
        blobs = {}
        if self._c_sk is not None:
            blobs["c_sk"] = crypto.x25519_private_bytes(self._c_sk)
        if self._ctx is not None:
            blobs["ctx"] = cx.context_bytes(self._ctx)
        if self._update is not None:
            blobs["update"] = self._update.astype("<f8").tobytes()
        for k in ("_c_pk", "_holder_pk", "_digest"):
            if getattr(self, k, None) is not None:
                blobs[k] = getattr(self, k)
        head = json.dumps(
            {
                "v": _STATE_VERSION,
                "id": self.id,
                "state": self.state,
                "weight": self._weight,
                "clipped": self.clipped,
                "survivors": self._survivors,
                "blobs": [[k, len(b)] for k, b in blobs.items()],
            }
        ).encode()
        return _STATE_MAGIC + struct.pack("<I", len(head)) + head + b"".join(blobs.values())

    @classmethod
    def load(cls, blob: bytes, spec: CKKSRoundSpec, identity_key) -> "CKKSClient":
        """Rebuild the client saved by :meth:`dump` for ``spec`` with its identity key (strict)."""
        blob = bytes(blob)
        try:
            if not blob.startswith(_STATE_MAGIC):
                raise DecodeError("stored CKKS client state has a bad magic")
            n = struct.unpack_from("<I", blob, len(_STATE_MAGIC))[0]
            pos = len(_STATE_MAGIC) + 4
            head = json.loads(blob[pos : pos + n].decode())
            pos += n
            if head.get("v") != _STATE_VERSION:
                raise DecodeError(f"stored CKKS client state version {head.get('v')!r} is not {_STATE_VERSION}")
            blobs = {}
            for k, ln in head["blobs"]:
                if pos + ln > len(blob):
                    raise DecodeError("stored CKKS client state is truncated")
                blobs[k] = blob[pos : pos + ln]
                pos += ln
            if pos != len(blob):
                raise DecodeError("stored CKKS client state has trailing bytes")
        except (ValueError, KeyError, TypeError, struct.error) as exc:
            raise DecodeError(f"malformed stored CKKS client state: {exc}") from None
        c = cls.__new__(cls)
        c.spec, c._identity = spec, identity_key
        try:
            c.id, c.state, c._weight = int(head["id"]), str(head["state"]), float(head["weight"])
            c.clipped = int(head["clipped"])
            c._survivors = None if head.get("survivors") is None else tuple(int(u) for u in head["survivors"])
            c._c_sk = crypto.x25519_private_from_bytes(blobs["c_sk"]) if "c_sk" in blobs else None
            c._update = np.frombuffer(blobs["update"], dtype="<f8").astype(np.float64) if "update" in blobs else None
        except (ValueError, KeyError, TypeError) as exc:
            raise DecodeError(f"malformed stored CKKS client state: {exc}") from None
        if c.state not in _CLIENT_STATES or not 0 <= c.id < spec.n_clients:
            raise DecodeError(
                f"stored CKKS client state is for client {c.id} in state {c.state!r}, not a client of "
                f"this round's {spec.n_clients} in one of {', '.join(_CLIENT_STATES)}"
            )
        c._ctx = (
            cx.load_context(
                blobs["ctx"],
                "stored CKKS client state (the site's stored round state is corrupt — "
                "the round cannot continue on this site)",
            )
            if "ctx" in blobs
            else None
        )
        for k in ("_c_pk", "_holder_pk", "_digest"):
            setattr(c, k, blobs.get(k))
        return c


# ================================================================================================ server


class CKKSServer(StageServer):
    """The CKKS server state machine (module docstring). No I/O and no sleeping: the caller passes ``now``.

    ``receive(data, now)`` and ``tick(now)`` return ``[(recipient, bytes), …]``; refused messages are recorded
    in :attr:`rejected` without aborting the round; a round that cannot complete raises
    :class:`ProtocolAbortedError` (:class:`ProtocolTimeoutError` when a deadline caused it) and the machine is
    aborted (:class:`~..machine.StageServer`). The server only ever holds the public context.
    """

    TRANSITIONS = {
        "advertise": {AdvertiseKeys: "_on_advert"},
        "handoff": {PublicContext: "_on_public", ContextHandoff: "_on_handoff", SignedInput: "_on_input"},
        "input": {SignedInput: "_on_input"},
        "confirm": {ConsistencySignature: "_on_confirmation"},
        "decrypt": {DecryptedSum: "_on_decrypted"},
    }
    FIRST_STAGE = "advertise"
    NAME = "server"
    ROUND_NAME = "CKKS round"
    CLIENT_STAGE = {"confirm": "decrypt", "done": "decrypt", "aborted": "decrypt"}

    def __init__(self, spec: CKKSRoundSpec, now: float = 0.0):
        super().__init__(spec, now)
        self.decryptor: int | None = None
        self.sum_seconds = 0.0
        self._probe = crypto.x25519_keypair()[0]
        self._adverts: dict[int, AdvertiseKeys] = {}
        self._ctx = None
        self._public: PublicContext | None = None
        self._handoffs: dict[int, ContextHandoff] = {}
        self._inputs: dict[int, SignedInput] = {}
        self._digests: dict[int, bytes] = {}
        self._sum: list | None = None
        self._candidates: list = []
        self._confirmations: dict[int, bytes] = {}
        self._liar: int | None = None

    def _fail(self, reason: str, timed_out: bool, what: str = "nothing decrypted"):
        super()._fail(reason, timed_out, what)

    def _clear(self) -> None:
        self._inputs, self._sum, self._handoffs = {}, None, {}

    # -- message validation (reject without aborting)
    def _on_advert(self, msg):
        spec = self.spec
        if msg.sender in self._adverts:
            raise ProtocolError(f"server: duplicate AdvertiseKeys from client {msg.sender} (replay); discarded")
        crypto.verify(
            spec.identity_keys[msg.sender],
            msg.signature,
            advert_payload(spec.session_id, spec.round_index, msg.sender, spec.digest, msg.c_pk, msg.s_pk, msg.commit),
            what=f"client {msg.sender}'s advertised key",
        )
        crypto.x25519_shared(self._probe, msg.c_pk)  # invalid / low-order keys raise: that client is left out
        self._adverts[msg.sender] = msg

    def _on_public(self, msg):
        spec = self.spec
        if msg.sender != spec.key_holder or self._ctx is not None:
            raise ProtocolError(f"server: unexpected PublicContext from client {msg.sender}; discarded")
        crypto.verify(
            spec.identity_keys[msg.sender],
            msg.signature,
            cx.context_payload(spec.session_id, spec.round_index, msg.sender, spec.digest, msg.context),
            what="the key holder's public context",
        )
        try:
            ctx = cx.load_public_context(msg.context)
        except AuthenticationError:
            self._fail("the key holder sent a context holding the secret key; the server discarded it", False)
        if ctx.global_scale != 2.0**spec.params.scale_bits:
            raise ProtocolError("server: public context has the wrong scale; discarded")
        self._ctx, self._public = ctx, msg

    def _on_handoff(self, msg):
        kh = self.spec.key_holder
        if msg.sender != kh or msg.recipient not in self.spec.fallbacks or msg.recipient not in self._adverts:
            raise ProtocolError(f"server: key handoff {msg.sender} → {msg.recipient} is not expected; discarded")
        if msg.recipient in self._handoffs:
            raise ProtocolError(f"server: duplicate key handoff for client {msg.recipient}; discarded")
        self._handoffs[msg.recipient] = msg

    def _on_input(self, msg):
        spec, u = self.spec, msg.sender
        allowed = {spec.key_holder} if self.stage == "handoff" else set(self.expected) | set(self._inputs)
        if u not in allowed:
            raise ProtocolError(f"server: client {u} holds no key in stage {self.stage!r}; upload discarded")
        if u in self._inputs:
            raise ProtocolError(f"server: duplicate upload from client {u} (replay); discarded")
        if self._ctx is None:
            raise ProtocolError(f"server: upload from client {u} before the public context; discarded")
        if len(msg.chunks) != spec.params.n_ciphertexts:
            raise DecodeError(
                f"server: client {u} uploaded {len(msg.chunks)} ciphertexts, expected "
                f"{spec.params.n_ciphertexts}; discarded"
            )
        digest = cx.upload_digest(msg.chunks)
        crypto.verify(
            spec.identity_keys[u],
            msg.signature,
            cx.input_payload(spec.session_id, spec.round_index, u, digest, spec.digest),
            what=f"client {u}'s CKKS upload",
        )
        t0 = time.perf_counter()
        vecs = cx.vectors(self._ctx, msg.chunks, f"server: upload of client {u}")
        if self._sum is not None and len(vecs) != len(self._sum):
            raise ProtocolError(f"server: client {u} uploaded {len(vecs)} ciphertexts; discarded")
        self._sum = cx.add_into(self._sum, vecs, f"server: upload of client {u}")
        self.sum_seconds += time.perf_counter() - t0
        self._inputs[u] = msg
        self._digests[u] = digest

    def _on_confirmation(self, msg):
        spec, u = self.spec, msg.sender
        if u not in self.expected:
            raise ProtocolError(f"server: survivor-set signature from client {u}, not a survivor; discarded")
        if u in self._confirmations:
            raise ProtocolError(f"server: duplicate survivor-set signature from client {u} (replay); discarded")
        crypto.verify(
            spec.identity_keys[u],
            msg.signature,
            cx.survivors_payload(spec.session_id, spec.round_index, self.survivors, spec.digest),
            what=f"client {u}'s survivor set",
        )
        self._confirmations[u] = msg.signature

    def _on_decrypted(self, msg):
        spec, p = self.spec, self.spec.params
        if msg.sender != self.decryptor or self.result is not None:
            raise ProtocolError(
                f"server: DecryptedSum from client {msg.sender}, asked client {self.decryptor}; discarded"
            )
        if msg.step != p.step or len(msg.data) != 8 * p.length:
            raise DecodeError(f"server: decrypted sum of client {msg.sender} has the wrong step or size; discarded")
        crypto.verify(
            spec.identity_keys[msg.sender],
            msg.signature,
            cx.decrypted_payload(spec.session_id, spec.round_index, msg.sender, spec.digest, msg.step, msg.data),
            what=f"client {msg.sender}'s decrypted sum",
        )
        out = np.frombuffer(msg.data, dtype="<f8").astype(np.float64)
        limit = spec.max_abs_sum + spec.release_bound
        if not np.all(np.isfinite(out)) or float(np.max(np.abs(out))) > limit:
            # signed by the decryptor, so provably its own lie: blame it and ask the next key holder at once
            self.blame = tuple(self.blame) + (msg.sender,)
            self.rejected.append(
                (
                    msg.sender,
                    ProtocolError(
                        f"server: client {msg.sender}'s decrypted sum lies outside |sum| <= {limit:.6g} (M + the stated "
                        "release error); discarded, the next key holder is asked"
                    ),
                )
            )
            self._liar = msg.sender
            return
        self.result = out

    def _stage_complete(self) -> bool:
        kh = self.spec.key_holder
        if self.stage == "advertise":
            return set(self._adverts) >= self.expected
        if self.stage == "handoff":
            want = set(self.spec.fallbacks) & set(self._adverts)
            return self._ctx is not None and set(self._handoffs) >= want and kh in self._inputs
        if self.stage == "input":
            return set(self._inputs) >= self.expected
        if self.stage == "confirm":
            return set(self._confirmations) >= self.expected
        return self.result is not None or self._liar is not None

    # -- stage transitions
    def _advance(self, stage: str, now: float, expected: set, got: set) -> None:
        self.dropped_at[self.stage] = tuple(sorted(self.expected - got))
        self.stage = stage
        self.deadline = now + self.spec.timeout(stage)
        self.expected = set(expected)

    def _decrypt_request(self, out: list, now: float) -> None:
        spec = self.spec
        d = self._candidates.pop(0)
        self.decryptor = d
        surv = self.survivors
        sigs = tuple(SignatureEntry(u, s) for u, s in sorted(self._confirmations.items()))
        digests = tuple(InputDigest(u, self._digests[u], self._inputs[u].signature) for u in surv)
        uploads = tuple(InputEntry(u, self._inputs[u].chunks) for u in surv) if spec.verify == "recompute" else ()
        self.expected = {d}
        self.deadline = now + spec.timeout("decrypt")
        self._send(
            out, d, DecryptRequest(spec.session_id, spec.round_index, d, surv, sigs, digests, uploads, self._sum_chunks)
        )

    def _close(self, now: float, timed_out: bool) -> list[tuple[int, bytes]]:
        spec, sid, rnd, kh = self.spec, self.spec.session_id, self.spec.round_index, self.spec.key_holder
        out: list = []
        if self.stage == "advertise":
            if kh not in self._adverts:
                self._fail(
                    f"the key holder (client {kh}) dropped before generating the key; nothing was encrypted", False
                )
            if len(self._adverts) < spec.min_survivors:
                self._fail(
                    f"only {len(self._adverts)} clients advertised keys, min_survivors is {spec.min_survivors}",
                    timed_out,
                )
            entries = tuple(
                KeyEntry(v, a.c_pk, a.s_pk, a.commit, a.signature)
                for v, a in sorted(self._adverts.items())
                if v == kh or v in spec.fallbacks
            )
            self._advance("handoff", now, {kh}, set(self._adverts))
            self._send(out, kh, KeysBroadcast(sid, rnd, kh, entries))
        elif self.stage == "handoff":
            if self._ctx is None:
                self._fail(f"the key holder (client {kh}) dropped before handing off the key", False)
            a = self._adverts[kh]
            holder = (KeyEntry(kh, a.c_pk, a.s_pk, a.commit, a.signature),)
            self._advance("input", now, set(self._adverts) - set(self._inputs), {kh} & set(self._adverts))
            for j in sorted(set(self._adverts) - {kh}):
                if j in self._handoffs:
                    self._send(out, j, KeysBroadcast(sid, rnd, j, holder))
                    self._send(out, j, self._handoffs[j])
                else:
                    self._send(out, j, self._public)
            if not self.expected:
                return out + self._close(now, timed_out=False)
        elif self.stage == "input":
            surv = tuple(sorted(self._inputs))
            if len(surv) < spec.min_survivors:
                self._fail(
                    f"only {len(surv)} encrypted inputs arrived, min_survivors is {spec.min_survivors}", timed_out
                )
            t0 = time.perf_counter()
            self._sum_chunks = tuple(v.serialize() for v in self._sum)
            self.sum_seconds += time.perf_counter() - t0
            if cx.can_decrypt(self._ctx, self._sum_chunks[0]):  # pragma: no cover - would mean the server holds the key
                self._fail("the server context decrypted a ciphertext", False)
            self.survivors = surv
            self._advance("confirm", now, set(surv), set(self._inputs))
            for u in surv:
                self._send(out, u, ConsistencyRequest(sid, rnd, u, surv))
        elif self.stage == "confirm":
            signers = sorted(self._confirmations)
            self.dropped_at["confirm"] = tuple(sorted(self.expected - set(signers)))
            if len(signers) < spec.signatures_needed:
                self._fail(
                    f"only {len(signers)} survivors confirmed the survivor set, {spec.signatures_needed} "
                    "required (quorum)",
                    timed_out,
                )
            keyed = {kh} | set(self._handoffs)
            self._candidates = [d for d in spec.decryptors if d in keyed and d in self._confirmations]
            if not self._candidates:
                self._fail("no client holding the CKKS key confirmed the survivor set", timed_out)
            self.stage = "decrypt"
            self._decrypt_request(out, now)
        elif self.stage == "decrypt":
            if self.result is not None:
                self.dropped_at["decrypt"] = tuple(sorted(self.dropped_at.get("decrypt", ())))
                self.stage = "done"
                self._inputs, self._sum, self._handoffs = {}, None, {}
            else:
                self._liar = None
                self.dropped_at["decrypt"] = tuple(sorted(set(self.dropped_at.get("decrypt", ())) | {self.decryptor}))
                if not self._candidates:
                    self._fail("no client holding the CKKS key survived to decrypt the sum", timed_out)
                self._decrypt_request(out, now)
        return out
