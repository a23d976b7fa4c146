"""The SecAgg+ client machine (sans-I/O; the protocol and its threat model are in :mod:`.secagg`).

Transitions (``SecAggClient.TRANSITIONS``)::

    state        message                  handler                → state      sends
    init         (start)                  start                    advertised   AdvertiseKeys(c_pk, s_pk, H(b_u))
    advertised   KeysBroadcast            _on_keys                 shared       EncryptedShares (one item per accepted peer)
    shared       ForwardedShares          _on_shares               masked       MaskedInput(y_u, P_u)
                                                                   ready        (late-bound: nothing until provide_input)
    ready        (provide_input)          provide_input            masked       MaskedInput(y_u, P_u)
    masked       ConsistencyRequest       _on_consistency          signed       ConsistencySignature(U)
                 BoundConsistencyRequest  _on_bound_consistency    signed       ConsistencySignature(U) (late-bound)
    signed       UnmaskRequest            _on_unmask               done         UnmaskResponse
    any          any violation            —                        aborted      nothing, ever again

**Two schedules** (``SCHEDULES``). *construction* (the default and every earlier release): the client is built
with the full :class:`~.secagg.RoundSpec` and its input, signs the full spec digest at every stage and sends its
masked input right after ForwardedShares. *late* (input bound after the share stage, issue 26): the client is
built with the :class:`~.secagg.SetupSpec` only — fresh keys and seed exactly as before — signs the setup digest at
advertise and share, and after ForwardedShares waits in ``ready``, sending nothing, until
:meth:`SecAggClient.provide_input` gives it the input part (:class:`~.secagg.InputSpec`: length, fixed-point plan,
integer, task digest) and its input; from then on ``self.spec`` is the joined full spec and the masked input, the
consistency and the unmask signatures cover the full digest. Before it signs the survivor set U it checks, for
every member of U, that member's signed binding of its masked input to the same full digest
(:class:`~.messages.BoundConsistencyRequest`). A client built with a full spec and ``schedule="late"`` runs the
late schedule and provides its own input as soon as it is ``ready`` (the in-process runner and the tests use it).

A peer whose advertisement is bad (signature, reused or invalid X25519 key) or whose share item is bad
(signature, AES-GCM tag, plaintext, a share that does not match its signed hash) is left out — not
dealt to, not masked with, not in P_u — and the client goes on while ≥ t peers remain; the server drops
a client that others left out (:mod:`.secagg_server`). What only the server can cause in this client's own
message (another recipient, duplicate or foreign entries, a survivor set without the quorum) aborts.
"""

from __future__ import annotations

import os

import numpy as np

from ..errors import AuthenticationError, ConfigError, ProtocolAbortedError, ProtocolError, SecureFedError, bad_value
from . import crypto, shamir
from .graph import check_parameters
from .machine import StageClient
from .messages import (
    BoundConsistencyRequest,
    ConsistencyRequest,
    ConsistencySignature,
    EncryptedShares,
    ForwardedShares,
    KeysBroadcast,
    MaskedInput,
    SharePlaintext,
    ShareItem,
    ShareValue,
    UnmaskRequest,
    UnmaskResponse,
    decode,
    encode,
)
from .quantize import check_random_state, integer_words, quantize
from .secagg import (
    SCHEDULES,
    InputSpec,
    RoundSpec,
    SetupSpec,
    advert_payload,
    bound_masked_payload,
    channel_key,
    commitment,
    consistency_payload,
    decode_input,
    encode_input,
    input_hash,
    masked_payload,
    pair_info,
    self_info,
    share_aad,
    share_hash,
    share_item_payload,
    unmask_payload,
)

__all__ = ["SecAggClient"]


def _check_update(spec, update, weight: float):
    """The client's input for the input part ``spec`` (a RoundSpec or an InputSpec): size, and for an integer
    round words mod 2^k with weight 1. Raises ConfigError / DataError; returns the value to quantise."""
    if np.size(update) != spec.length:
        raise ConfigError(bad_value("update.size", np.size(update), f"expected {spec.length} values"))
    if spec.integer:
        if float(weight) != 1.0:
            raise ConfigError(
                bad_value(
                    "weight", weight, "an integer round takes inputs already weighted by their encoder: pass weight 1"
                )
            )
        return integer_words(update, spec.fixed_point)  # refused here, before any key is made or any mask computed
    return update


class SecAggClient(StageClient):
    """One client's SecAgg+ state machine. No I/O: ``start``, ``receive`` and ``provide_input`` return encoded
    messages.

    Parameters
    ----------
    spec : RoundSpec or SetupSpec
        A full spec (schedule ``construction``, or ``late`` with ``schedule="late"``), or the setup part only
        (schedule ``late``: the input comes later through :meth:`provide_input`).
    client_id : int
    identity_key : Ed25519PrivateKey
        The client's signing key (its public half is ``spec.identity_keys[client_id]``).
    update : array_like, optional
        The client's input (``spec.length`` values after ``ravel``); required with a full spec, refused with a
        setup part.
    weight : float
        The client's own weight, folded in before quantisation (see :mod:`.quantize`). A site computes it
        from its own data (:meth:`securefed.federation.site.SiteWorker.weight`), never from the server.
    random_state : None | int | Generator
        Generator for stochastic rounding only (statistics, not secrets).
    min_survivors : int
        The client refuses to sign a survivor set smaller than this (nor smaller than the quorum).
    colluders : int, optional
        c, the colluding sites this client assumes: with it the client refuses a spec that fails
        :func:`securefed.securesum.graph.check_parameters` (2t > k + c, 2q > n + c, t ≥ 2, …) at construction.
        None (in-process aggregators, tests): the spec's parameters are taken as given.
    schedule : {"construction", "late"}, optional
        None: ``"late"`` for a setup part, else the class attribute ``SCHEDULE`` (``"construction"``).
    """

    TRANSITIONS = {
        "advertised": {KeysBroadcast: "_on_keys"},
        "shared": {ForwardedShares: "_on_shares"},
        "masked": {ConsistencyRequest: "_on_consistency", BoundConsistencyRequest: "_on_bound_consistency"},
        "signed": {UnmaskRequest: "_on_unmask"},
    }
    #: the schedule of a client built with a full spec and ``schedule=None``
    SCHEDULE = "construction"

    def __init__(
        self,
        spec: RoundSpec | SetupSpec,
        client_id: int,
        identity_key,
        update=None,
        weight: float = 1.0,
        random_state=None,
        min_survivors: int = 1,
        colluders: int | None = None,
        schedule: str | None = None,
    ):
        full = isinstance(spec, RoundSpec)
        if not full and not isinstance(spec, SetupSpec):
            raise ConfigError(
                bad_value("spec", type(spec).__name__, "give a RoundSpec or (late-bound input) a SetupSpec")
            )
        schedule = ("late" if not full else self.SCHEDULE) if schedule is None else schedule
        if schedule not in SCHEDULES or (not full and schedule != "late"):
            raise ConfigError(bad_value("schedule", schedule, f"use one of {SCHEDULES}; a SetupSpec runs 'late'"))
        if not 0 <= client_id < spec.n_clients:
            raise ConfigError(bad_value("client_id", client_id, f"use 0 <= client_id < {spec.n_clients}"))
        if full and update is None:
            raise ConfigError(
                bad_value(
                    "update",
                    None,
                    "a client built with a full RoundSpec needs its input; build "
                    "it with the SetupSpec (spec.setup) to provide the input later",
                )
            )
        if not full and update is not None:
            raise ConfigError(
                bad_value(
                    "update",
                    "an array",
                    "a late-bound client gets its input through "
                    "provide_input(input_spec, update, weight), not at construction",
                )
            )
        if full:
            update = _check_update(spec, update, weight)
        if (
            isinstance(min_survivors, bool)
            or not isinstance(min_survivors, (int, np.integer))
            or not 1 <= min_survivors <= spec.n_clients
        ):
            raise ConfigError(bad_value("min_survivors", min_survivors, f"use an integer in [1, {spec.n_clients}]"))
        if colluders is not None:
            problems = check_parameters(
                spec.n_clients,
                spec.degree,
                spec.threshold,
                spec.signatures_needed,
                int(colluders),
                complete_up_to=0,
                min_threshold=1,
            )
            if problems:
                raise ProtocolError(f"client {client_id} refuses the round: " + "; ".join(problems))
        self.id = int(client_id)
        self.schedule = schedule
        self.spec = spec if schedule == "construction" else spec.setup
        self._key_digest = self.spec.digest  # what the advertise and share stages sign (full or setup digest)
        self.min_survivors = max(int(min_survivors), spec.signatures_needed)
        self._identity = identity_key
        self._update = update if schedule == "construction" else None
        self._weight = float(weight)
        # late schedule built with the full spec: the input part and the input, provided as soon as ready
        self._pending = (
            (encode_input(spec.input_spec), update)
            if (full and schedule == "late" and isinstance(spec, RoundSpec))
            else None
        )
        self._rng = check_random_state(random_state)
        self.state = "init"
        self.clipped = 0
        self._neighbours = spec.neighbours[client_id]
        self._peers_keys: dict[int, tuple[bytes, bytes]] = {}
        self._dealt: set = set()
        self._held: dict[int, tuple[int, int]] = {}
        self._excluded: dict[int, str] = {}
        self._masked_with: tuple = ()
        self._survivors: tuple | None = None
        self._input_hash: bytes | None = None
        self._bound_digest: bytes | None = spec.digest if schedule == "construction" else None

    # -- helpers
    def _abort(self):
        self.state = "aborted"
        self._c_sk = self._s_sk = self._b = None
        self._held = {}
        self._update = None
        self._pending = None

    def _exclude(self, v: int, why: str) -> None:
        self._excluded.setdefault(v, why)

    def start(self, now: float = 0.0) -> list[bytes]:
        """Stage ``advertise``: fresh X25519 key pairs and self-mask seed; keys and seed commitment signed."""
        self._begin()
        spec = self.spec
        self._c_sk, c_pk = crypto.x25519_keypair()
        self._s_sk, s_pk = crypto.x25519_keypair()
        self._c_pk, self._s_pk = c_pk, s_pk
        self._b = os.urandom(crypto.SEED_BYTES)
        return self._advertise(c_pk, s_pk, commitment(spec.session_id, spec.round_index, self.id, self._b))

    # -- stage handlers
    def _on_keys(self, msg: KeysBroadcast) -> list[bytes]:
        spec, t = self.spec, self.spec.threshold
        sid, rnd = spec.session_id, spec.round_index
        senders = [e.sender for e in msg.entries]
        if len(set(senders)) != len(senders):
            raise ProtocolError(f"client {self.id}: duplicate key advertisement in broadcast")
        chan: dict[int, bytes] = {}
        for e in msg.entries:
            if e.sender not in self._neighbours:
                raise ProtocolError(f"client {self.id}: broadcast contains client {e.sender}, not a neighbour")
            try:
                crypto.verify(
                    spec.identity_keys[e.sender],
                    e.signature,
                    advert_payload(sid, rnd, e.sender, self._key_digest, e.c_pk, e.s_pk, e.commit),
                    what=f"client {e.sender}'s advertised keys",
                )
                if e.c_pk == e.s_pk or {e.c_pk, e.s_pk} & {self._c_pk, self._s_pk}:
                    raise AuthenticationError(f"client {e.sender} advertised reused keys")
                crypto.x25519_shared(self._s_sk, e.s_pk)  # low-order / invalid keys raise here
                chan[e.sender] = channel_key(crypto.x25519_shared(self._c_sk, e.c_pk), sid, rnd, self.id, e.sender)
            except SecureFedError as exc:
                self._exclude(e.sender, f"{type(exc).__name__}: {exc}")
                continue
            self._peers_keys[e.sender] = (e.c_pk, e.s_pk)
        peers = sorted(chan)
        if len(peers) < t:
            raise ProtocolAbortedError(f"client {self.id}: only {len(peers)} usable neighbours, threshold is {t}")
        xs = [v + 1 for v in peers]
        b_shares = shamir.share(shamir.secret_to_int(self._b), xs, t)
        s_shares = shamir.share(shamir.secret_to_int(crypto.x25519_private_bytes(self._s_sk)), xs, t)
        items = []
        for v, bs, ss in zip(peers, b_shares, s_shares):
            pt = encode(SharePlaintext(sid, rnd, self.id, v, bs, ss))
            ct = crypto.aead_encrypt(chan[v], pt, share_aad(sid, rnd, self.id, v))
            h_b = share_hash(sid, rnd, self.id, v, b"b", bs)
            h_s = share_hash(sid, rnd, self.id, v, b"s", ss)
            sig = crypto.sign(self._identity, share_item_payload(sid, rnd, self._key_digest, self.id, v, ct, h_b, h_s))
            items.append(ShareItem(v, ct, h_b, h_s, sig))
        self._chan = chan
        self._dealt = set(peers)
        self.state = "shared"
        return [encode(EncryptedShares(sid, rnd, self.id, tuple(items)))]

    def _open_item(self, it: ShareItem) -> tuple[int, int]:
        """Verify one forwarded item from dealer ``it.peer`` and return its two shares (or raise)."""
        spec, sid, rnd, u = self.spec, self.spec.session_id, self.spec.round_index, it.peer
        crypto.verify(
            spec.identity_keys[u],
            it.signature,
            share_item_payload(sid, rnd, self._key_digest, u, self.id, it.ciphertext, it.h_b, it.h_s),
            what=f"client {u}'s share item",
        )
        pt = crypto.aead_decrypt(
            self._chan[u],
            it.ciphertext,
            share_aad(sid, rnd, u, self.id),
            what=f"client {self.id}: shares from client {u}",
        )
        sp = decode(pt, session_id=sid, round_index=rnd, expected=SharePlaintext)
        if sp.sender != u or sp.recipient != self.id:
            raise AuthenticationError(f"client {self.id}: share plaintext names {sp.sender} → {sp.recipient}")
        if (
            share_hash(sid, rnd, u, self.id, b"b", sp.self_share) != it.h_b
            or share_hash(sid, rnd, u, self.id, b"s", sp.key_share) != it.h_s
        ):
            raise AuthenticationError(f"client {u}'s shares do not match the hashes it signed")
        return sp.self_share, sp.key_share

    def _on_shares(self, msg: ForwardedShares) -> list[bytes]:
        t = self.spec.threshold
        dealers = [it.peer for it in msg.items]
        if len(set(dealers)) != len(dealers):
            raise ProtocolError(f"client {self.id}: duplicate share items in ForwardedShares")
        if any(u not in self._neighbours for u in dealers):
            raise ProtocolError(f"client {self.id}: share items from non-neighbours")
        for it in msg.items:
            if it.peer not in self._dealt:
                continue  # a peer this client left out at the key stage: never held, never masked with
            try:
                self._held[it.peer] = self._open_item(it)
            except SecureFedError as exc:
                self._exclude(it.peer, f"{type(exc).__name__}: {exc}")
        for v in self._dealt - set(self._held):
            self._exclude(v, "its shares did not arrive")
        if len(self._held) < t:
            raise ProtocolAbortedError(
                f"client {self.id}: valid shares from only {len(self._held)} neighbours, threshold is {t}"
            )
        self._chan, self._c_sk = {}, None  # the channel keys are done with once the shares are open
        if self.schedule == "construction":
            return self._mask()
        self.state = "ready"
        if self._pending is not None:  # built with the full spec: bind the input part now
            raw, update = self._pending
            self._pending = None
            return self._bind(decode_input(raw), update, self._weight)
        return []

    def provide_input(
        self, input_spec: InputSpec, update, weight: float = 1.0, now: float = 0.0, *, min_survivors: int | None = None
    ) -> list[bytes]:
        """Late-bound schedule, state ``ready``: bind the input part, quantise and mask ``update`` and return the
        MaskedInput (signed over the full digest of the joined spec). Allowed exactly once; in any other state
        the client aborts (a second masked input of one round would give the server the difference of two
        inputs under one mask). A bad ``update``, ``weight`` or ``min_survivors`` raises ConfigError / DataError
        with nothing sent and the client still ``ready``.

        ``min_survivors`` raises (never lowers) the floor on the survivor set this client will sign, for floors
        that depend on the input part (e.g. a DP plan's t + dp-colluders under distributed noise)."""
        if self.schedule != "late" or self.state != "ready":
            state = self.state
            self._abort()
            raise ProtocolError(
                f"client {self.id}: provide_input is for a late-bound client in state 'ready', not a "
                f"{self.schedule!r} client in state {state!r}; aborted"
            )
        if not isinstance(input_spec, InputSpec):
            raise ConfigError(bad_value("input_spec", type(input_spec).__name__, "give an InputSpec (decode_input)"))
        n = self.spec.n_clients
        if min_survivors is not None and (
            isinstance(min_survivors, bool)
            or not isinstance(min_survivors, (int, np.integer))
            or not 1 <= min_survivors <= n
        ):
            raise ConfigError(bad_value("min_survivors", min_survivors, f"use an integer in [1, {n}]"))
        update = _check_update(input_spec, update, weight)
        if min_survivors is not None:
            self.min_survivors = max(self.min_survivors, int(min_survivors))
        return self._bind(input_spec, update, float(weight))

    def _bind(self, input_spec: InputSpec, update, weight: float) -> list[bytes]:
        spec = self.spec.bind(input_spec)
        if self.min_survivors > spec.n_clients:  # pragma: no cover - checked at construction on the same n
            raise ConfigError(bad_value("min_survivors", self.min_survivors, f"use at most {spec.n_clients}"))
        self.spec, self._update, self._weight = spec, update, weight
        self._bound_digest = spec.digest
        return self._mask()

    def _mask(self) -> list[bytes]:
        """The masked input y_u = q_u + PRG(b_u) + Σ ±PRG(s_uv) of the full spec, signed."""
        spec = self.spec
        fp = spec.fixed_point
        if spec.integer:  # already integers mod 2^k (the weight was folded in by the encoder): no codec, no clip count
            q, self.clipped = integer_words(self._update, fp), 0
        else:
            q, self.clipped = quantize(self._update, self._weight, fp, self._rng)
        acc = q.copy()
        buf = bytearray(acc.nbytes + 16)
        crypto.add_mask_inplace(
            acc, self._b, session_id=spec.session_id, info=self_info(spec.round_index, self.id), sign=+1, buf=buf
        )
        peers = tuple(sorted(self._held))
        for v in peers:
            shared = crypto.x25519_shared(self._s_sk, self._peers_keys[v][1])
            crypto.add_mask_inplace(
                acc,
                shared,
                session_id=spec.session_id,
                info=pair_info(spec.round_index, self.id, v),
                sign=+1 if self.id < v else -1,
                buf=buf,
            )
        if fp.modulus_bits not in (32, 64):
            acc &= fp.dtype((1 << fp.modulus_bits) - 1)
        data = acc.tobytes()
        self._input_hash = input_hash(data, peers)
        if self.schedule == "construction":
            payload = masked_payload(
                spec.session_id, spec.round_index, spec.digest, self.id, fp.modulus_bits, data, peers
            )
        else:
            payload = bound_masked_payload(
                spec.session_id, spec.round_index, spec.digest, self.id, fp.modulus_bits, self._input_hash
            )
        sig = crypto.sign(self._identity, payload)
        self._b = self._s_sk = self._c_sk = None
        self._update = None
        self._masked_with = peers
        self.state = "masked"
        return [encode(MaskedInput(spec.session_id, spec.round_index, self.id, fp.modulus_bits, data, peers, sig))]

    def _sign_survivors(self, surv: tuple) -> list[bytes]:
        spec, t = self.spec, self.spec.threshold
        partners = set(self._masked_with) & set(surv)
        if len(partners) < t:
            raise ProtocolAbortedError(
                f"client {self.id} refuses to sign: only {len(partners)} of its masking "
                f"partners are survivors (threshold {t}); its input would be exposed in a "
                "partial sum"
            )
        self._survivors = surv
        sig = crypto.sign(self._identity, consistency_payload(spec.session_id, spec.round_index, spec.digest, surv))
        self.state = "signed"
        return [encode(ConsistencySignature(spec.session_id, spec.round_index, self.id, sig))]

    def _on_consistency(self, msg: ConsistencyRequest) -> list[bytes]:
        if self.schedule != "construction":
            raise ProtocolError(
                f"client {self.id}: a late-bound round's survivor set must come with every member's "
                "signed input binding (BoundConsistencyRequest); refused"
            )
        return self._sign_survivors(self._survivor_set(msg.survivors, self.min_survivors))

    def _on_bound_consistency(self, msg: BoundConsistencyRequest) -> list[bytes]:
        """Late-bound schedule: sign U only if every member of U signed its masked input over this client's full
        spec digest — the setup (and the shares) were common to every input part the server could have announced,
        so this is what keeps a site that masked under another input part out of the sum honest sites unmask."""
        if self.schedule != "late":
            raise ProtocolError(f"client {self.id}: input bindings are for late-bound rounds; refused")
        spec = self.spec
        surv = self._survivor_set(msg.survivors, self.min_survivors)
        if tuple(e.sender for e in msg.inputs) != surv:
            raise ProtocolError(
                f"client {self.id}: the input bindings name {[e.sender for e in msg.inputs]}, not the "
                f"survivor set {list(surv)}; refused"
            )
        bits = spec.fixed_point.modulus_bits
        for e in msg.inputs:
            if e.sender == self.id and e.digest != self._input_hash:
                raise AuthenticationError(
                    f"client {self.id}: the server replaced the binding of its own masked input; refused"
                )
            crypto.verify(
                spec.identity_keys[e.sender],
                e.signature,
                bound_masked_payload(spec.session_id, spec.round_index, spec.digest, e.sender, bits, e.digest),
                what=f"client {e.sender}'s masked-input binding (another input part or a forgery)",
            )
        return self._sign_survivors(surv)

    def _on_unmask(self, msg: UnmaskRequest) -> list[bytes]:
        spec, q = self.spec, self.spec.signatures_needed
        if tuple(msg.survivors) != self._survivors:
            raise AuthenticationError(f"client {self.id}: server changed the survivor set after the consistency check")
        signers = [s.signer for s in msg.signatures]
        if len(set(signers)) != len(signers):
            raise ProtocolError(f"client {self.id}: duplicate consistency signatures")
        surv = set(self._survivors)
        if not set(signers) <= surv:
            raise ProtocolError(f"client {self.id}: consistency signature from a non-survivor")
        payload = consistency_payload(spec.session_id, spec.round_index, spec.digest, self._survivors)
        good = 0
        for s in sorted(msg.signatures, key=lambda e: e.signer):
            if good >= q:
                break  # the quorum is reached: no need to verify more
            crypto.verify(spec.identity_keys[s.signer], s.signature, payload, what=f"client {s.signer}'s survivor set")
            good += 1
        if good < q:
            raise ProtocolAbortedError(
                f"client {self.id}: only {good} members confirmed the survivor set, the quorum is {q}; nothing revealed"
            )
        self_shares, key_shares = [], []
        for v in sorted(self._held):  # one kind per peer: b for survivors, s for the others — never both
            bs, ss = self._held[v]
            if v in surv:
                self_shares.append(ShareValue(v, bs))
            else:
                key_shares.append(ShareValue(v, ss))
        sig = crypto.sign(
            self._identity,
            unmask_payload(spec.session_id, spec.round_index, spec.digest, self.id, self_shares, key_shares),
        )
        self.state = "done"
        self._held = {}
        return [
            encode(
                UnmaskResponse(spec.session_id, spec.round_index, self.id, tuple(self_shares), tuple(key_shares), sig)
            )
        ]

    def verify_sum(self, proof: bytes) -> np.ndarray:
        """After the round (``done``): check the server's :meth:`~.secagg_server.SecAggServer.proof` against this
        client's own view — its spec, schedule, the survivor set it signed and the masked input it sent — and
        return the total words it proves, or raise :class:`~.secagg_proof.SumProofError` naming what is wrong."""
        from .secagg_proof import verify_sum

        if self.state != "done":
            raise ProtocolError(
                f"client {self.id}: a sum proof is checked after the round, not in state {self.state!r}"
            )
        return verify_sum(
            proof,
            self.spec,
            self.id,
            schedule=self.schedule,
            survivors=self._survivors,
            own_input_hash=self._input_hash,
        )
