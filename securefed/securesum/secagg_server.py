"""The SecAgg+ server machine (sans-I/O; the protocol and its threat model are in :mod:`.secagg`).

Transitions (``SecAggServer.TRANSITIONS``; a stage closes when every expected client answered or at its
deadline, :class:`~.machine.StageServer`)::

    stage        accepts               handler          closes with
    advertise    AdvertiseKeys         _on_advert       U1 (pruned: ≥ t live neighbours) → KeysBroadcast
    share        EncryptedShares       _on_shares       U2 (pruned: ≥ t holders and ≥ t dealers) → ForwardedShares
    ready        nothing               —                (late-bound schedule) open_input(input part) → masked
    masked       MaskedInput           _on_masked       U (consistent peer sets, ≥ t partners in U) → ConsistencyRequest
                                                        (late-bound: BoundConsistencyRequest, with every binding)
    consistency  ConsistencySignature  _on_signature    ≥ q signers → UnmaskRequest(U, all signatures)
    unmask       UnmaskResponse        _on_unmask       checked reconstruction, range check → result (done)

A server built with a :class:`~.secagg.SetupSpec` (or with a full spec and ``schedule="late"``, which binds its own
input part at once) runs the late-bound schedule: it verifies advertisements over the setup digest, waits in
``ready`` with no deadline after the share stage, and from :meth:`SecAggServer.open_input` on verifies everything
over the full digest of the joined spec (:mod:`.secagg`, "Two schedules").

What the server checks, so that a wrong sum is never output (the threat model is in :mod:`.secagg`):

* an advertisement with an invalid or low-order X25519 key is refused (the client is dropped);
* a survivor's signed peer set P_u must lie within the peers it dealt to and the dealers forwarded to it;
  when u masked with v but v left u out (v found u's shares bad), u is dropped — its pairwise masks are
  then removed with its reconstructed mask key, exactly as for a client that dropped after masking;
* every revealed share must match the hash its dealer signed for that holder (else it is discarded and the
  revealer recorded in :attr:`rejected`); a self-mask seed reconstructed from matching shares must match
  the dealer's commitment, a mask key its advertised public key — else the round aborts naming the dealer
  (:attr:`blame`); the unmasked sum must lie in the fixed-point plan's range (a guard bit makes a seed other
  than the committed one fail this with probability ≥ 1/2 per coordinate).

Who is named when a round breaks (issue 25 item 6; docs/threat-model-secure-sum.md §5): a client whose *signed*
masked input has the wrong word size or length, or (k < 32) words ≥ 2^k that no honest encoder produces, is
named in :attr:`blame`, its input discarded and its messages refused from then on, and the round goes on without
it. A masked input with valid words but a value out of range underneath cannot be attributed without opening a
site's masked input: the round aborts ("sum withheld") naming the survivors as :attr:`suspects`.

After a completed round, :meth:`SecAggServer.proof` returns the evidence every survivor can check the released
total against (:mod:`.secagg_proof`); :meth:`SecAggServer.forget` drops it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import AuthenticationError, ConfigError, ProtocolError, bad_value
from . import crypto, shamir
from .machine import StageServer, UnexpectedMessageError
from .messages import (
    AdvertiseKeys,
    BoundConsistencyRequest,
    ConsistencyRequest,
    ConsistencySignature,
    EncryptedShares,
    ForwardedShares,
    InputDigest,
    KeyEntry,
    KeysBroadcast,
    MaskedInput,
    ShareItem,
    SignatureEntry,
    UnmaskRequest,
    UnmaskResponse,
    sender_of,
)
from .secagg import (
    SCHEDULES,
    STAGES,
    InputSpec,
    RoundSpec,
    SetupSpec,
    advert_payload,
    bound_masked_payload,
    commitment,
    consistency_payload,
    input_hash,
    masked_payload,
    share_hash,
    unmask_payload,
)
from .quantize import dequantize
from .secagg_proof import build_proof, range_excess, unmasked_sum

__all__ = ["SecAggServer"]


def _prune(alive: set, ok) -> set:
    """Largest subset in which ``ok(u, subset)`` holds for every member (iterated removal)."""
    alive = set(alive)
    changed = True
    while changed:
        changed = False
        for u in sorted(alive):
            if not ok(u, alive):
                alive.discard(u)
                changed = True
    return alive


class SecAggServer(StageServer):
    """The SecAgg+ server state machine. No I/O and no sleeping: the caller passes ``now``.

    ``receive(data, now)`` and ``tick(now)`` return ``[(recipient, bytes), …]``. Refused messages are
    recorded in :attr:`rejected` and discarded without aborting the round (a client cannot sabotage others);
    a round that cannot complete raises :class:`ProtocolAbortedError` (:class:`ProtocolTimeoutError` when a
    deadline caused it) *before* any share is requested that could not lead to the sum, and the server
    discards everything it holds (fail closed, :class:`~.machine.StageServer`).
    """

    TRANSITIONS = {
        "advertise": {AdvertiseKeys: "_on_advert"},
        "share": {EncryptedShares: "_on_shares"},
        "masked": {MaskedInput: "_on_masked"},
        "consistency": {ConsistencySignature: "_on_signature"},
        "unmask": {UnmaskResponse: "_on_unmask"},
    }
    FIRST_STAGE = "advertise"
    NAME = "server"
    STAGES = STAGES

    #: the schedule of a server built with a full spec and ``schedule=None``
    SCHEDULE = "construction"

    def __init__(self, spec: RoundSpec | SetupSpec, now: float = 0.0, schedule: str | None = None):
        full = isinstance(spec, RoundSpec)
        if not full and not isinstance(spec, SetupSpec):
            raise ConfigError(
                bad_value("spec", type(spec).__name__, "give a RoundSpec or (late-bound input) a SetupSpec")
            )
        schedule = ("late" if not full else self.SCHEDULE) if schedule is None else schedule
        if schedule not in SCHEDULES or (not full and schedule != "late"):
            raise ConfigError(bad_value("schedule", schedule, f"use one of {SCHEDULES}; a SetupSpec runs 'late'"))
        super().__init__(spec if schedule == "construction" else spec.setup, now)
        self.schedule = schedule
        self._key_digest = self.spec.digest  # what AdvertiseKeys (and share items) are signed over
        self._pending = spec.input_spec if (full and schedule == "late" and isinstance(spec, RoundSpec)) else None
        self.received: dict[int, Any] = {}  # this stage's message of each client (its class depends on the stage)
        self._keys: dict[int, AdvertiseKeys] = {}
        self._bindings: dict[int, bytes] = {}
        self._masked: dict[int, MaskedInput] = {}
        self._signatures: tuple = ()
        self._evidence: dict | None = None
        self._convicted: set = set()
        #: un-identifiable failure (an in-encoding masked input whose value is out of range): the sites any of
        #: which could be responsible — the survivors; () otherwise
        self.suspects: tuple = ()
        self._probe = crypto.x25519_keypair()[0]

    def receive(self, data: bytes, now: float = 0.0) -> list[tuple[int, bytes]]:
        if self.stage == "ready":  # between the share stage and open_input no client message is expected
            self._reject(
                sender_of(data),
                UnexpectedMessageError(
                    "server in stage 'ready' (waiting for the input part): no client message expected; discarded"
                ),
            )
            return []
        convicted = len(self._convicted)
        out = super().receive(data, now)
        if len(self._convicted) > convicted and not self.done and self._stage_complete():
            return self._guarded(now, False)  # the named client was the last one the stage waited for
        return out

    def open_input(self, input_spec: InputSpec, now: float = 0.0) -> list[tuple[int, bytes]]:
        """Late-bound schedule: bind the input part after the share stage (stage ``ready`` → ``masked``, with the
        ``masked`` deadline from ``now``). The server then expects the clients' MaskedInputs signed over the full
        digest of the joined spec; the coordinator sends each site the same input part with its request. Returns
        ``[]`` (nothing to relay). Any error aborts the machine (fail closed)."""
        try:
            if self.schedule != "late" or self.stage != "ready":
                raise ProtocolError(
                    f"server: open_input is for a late-bound round in stage 'ready', not a "
                    f"{self.schedule!r} round in stage {self.stage!r}"
                )
            spec = self.spec.bind(input_spec)
        except Exception as exc:
            self._abort_on(exc)
            raise
        self.spec = spec
        self.stage = "masked"
        self.deadline = now + spec.timeout("masked")
        self.received = {}
        return []

    def _clear(self) -> None:
        self.received = {}
        self._keys = {}
        self._inputs: dict[int, np.ndarray] = {}
        self._items: dict[int, dict] = {}
        self._masked, self._evidence = {}, None

    def _stage_complete(self) -> bool:
        return set(self.received) | self._convicted >= self.expected  # nothing more is accepted from a named client

    def _accept(self, msg) -> None:
        u = msg.sender
        if u in self._convicted:
            raise ProtocolError(f"server: client {u} was named for a signed deviation; its messages are refused")
        if u not in self.expected:
            raise ProtocolError(f"server: client {u} is not expected in stage {self.stage!r}; discarded")
        if u in self.received:
            raise ProtocolError(f"server: duplicate {type(msg).__name__} from client {u} (replay); discarded")

    # ------------------------------------------------------------------------ validation of one message
    def _on_advert(self, msg: AdvertiseKeys) -> None:
        spec = self.spec
        self._accept(msg)
        crypto.verify(
            spec.identity_keys[msg.sender],
            msg.signature,
            advert_payload(
                spec.session_id, spec.round_index, msg.sender, self._key_digest, msg.c_pk, msg.s_pk, msg.commit
            ),
            what=f"client {msg.sender}'s advertised keys",
        )
        if msg.c_pk == msg.s_pk:
            raise AuthenticationError(f"server: client {msg.sender} advertised one key twice; discarded")
        for pk in (msg.c_pk, msg.s_pk):
            crypto.x25519_shared(self._probe, pk)  # invalid / low-order keys (all-zero secret) raise
        taken = {k for a in self.received.values() for k in (a.c_pk, a.s_pk)}
        if {msg.c_pk, msg.s_pk} & taken:
            raise AuthenticationError(f"server: client {msg.sender} advertised another client's key; discarded")
        self.received[msg.sender] = msg

    def _on_shares(self, msg: EncryptedShares) -> None:
        self._accept(msg)
        u, t = msg.sender, self.spec.threshold
        peers = [it.peer for it in msg.items]
        allowed = self.spec.neighbours[u] & self._u1
        if peers != sorted(set(peers)) or not set(peers) <= allowed:
            raise ProtocolError(
                f"server: client {u} dealt shares to {peers}, not a sorted subset of its live "
                f"neighbours {sorted(allowed)}; discarded"
            )
        if len(peers) < t:
            raise ProtocolError(f"server: client {u} dealt to only {len(peers)} neighbours (threshold {t}); discarded")
        self.received[u] = msg

    def _on_masked(self, msg: MaskedInput) -> None:
        spec, fp, u = self.spec, self.spec.fixed_point, msg.sender
        self._accept(msg)
        nbytes = spec.length * np.dtype(fp.dtype).itemsize
        binding = input_hash(msg.data, msg.peers)
        if self.schedule == "construction":
            payload = masked_payload(spec.session_id, spec.round_index, spec.digest, u, msg.bits, msg.data, msg.peers)
        else:
            payload = bound_masked_payload(spec.session_id, spec.round_index, spec.digest, u, msg.bits, binding)
        crypto.verify(spec.identity_keys[u], msg.signature, payload, what=f"client {u}'s masked input")
        # signed by u: from here on a malformed vector is u's own, provable deviation (issue 25 item 6)
        k = fp.modulus_bits
        if msg.bits != k:
            self._convict(u, f"signed a masked input of {msg.bits}-bit words, the spec has {k}")
        if len(msg.data) != nbytes:
            self._convict(u, f"signed a masked input of {len(msg.data)} bytes, the spec has {nbytes}")
        if k not in (32, 64) and np.any(np.frombuffer(msg.data, dtype=fp.dtype) >> fp.dtype(k)):
            self._convict(
                u,
                f"signed a masked input with words >= 2^{k}, which no honest encoder produces (masked "
                f"words are reduced mod 2^{k})",
            )
        allowed = self._dealt[u] & self._dealers[u]
        if not set(msg.peers) <= allowed:
            raise ProtocolError(
                f"server: client {u} claims to have masked with {sorted(set(msg.peers) - allowed)}, "
                "with whom it exchanged no shares; discarded (client dropped)"
            )
        if len(msg.peers) < spec.threshold:
            raise ProtocolError(f"server: client {u} masked with only {len(msg.peers)} peers; discarded")
        self._bindings[u] = binding
        self.received[u] = msg

    def _convict(self, u: int, why: str) -> None:
        """``u`` provably deviated (its own signature is the evidence): name it in :attr:`blame`, refuse every further
        message from it, and discard this one (``u`` is then treated as dropped; the round goes on without it)."""
        if u not in self.blame:
            self.blame = tuple(self.blame) + (u,)
        self._convicted.add(u)
        raise ProtocolError(
            f"server: client {u} {why}; discarded and client {u} named (blame), the round goes on without it"
        )

    def _on_signature(self, msg: ConsistencySignature) -> None:
        spec = self.spec
        self._accept(msg)
        crypto.verify(
            spec.identity_keys[msg.sender],
            msg.signature,
            consistency_payload(spec.session_id, spec.round_index, spec.digest, self._u3),
            what=f"client {msg.sender}'s survivor set",
        )
        self.received[msg.sender] = msg

    def _on_unmask(self, msg: UnmaskResponse) -> None:
        spec, w = self.spec, msg.sender
        self._accept(msg)
        crypto.verify(
            spec.identity_keys[w],
            msg.signature,
            unmask_payload(spec.session_id, spec.round_index, spec.digest, w, msg.self_shares, msg.key_shares),
            what=f"client {w}'s unmask response",
        )
        held = self._peer_sets[w]
        want_self = sorted(held & set(self._u3))
        want_key = sorted(held - set(self._u3))
        if [s.owner for s in msg.self_shares] != want_self or [s.owner for s in msg.key_shares] != want_key:
            raise ProtocolError(f"server: client {w} revealed shares for the wrong peers; discarded")
        self.received[w] = msg

    # ------------------------------------------------------------------------ stage transitions
    def _advance(self, stage: str, now: float, expected: set) -> None:
        self.dropped_at[self.stage] = tuple(sorted(self.expected - set(self.received)))
        self.stage = stage
        # "ready" (late-bound schedule): no deadline while the coordinator has no input part to bind
        self.deadline = float("inf") if stage == "ready" else now + self.spec.timeout(stage)
        self.expected = set(expected)
        self.received = {}

    def _holders(self, u: int, among: set) -> set:
        """The live clients that hold valid shares of client u (u is in their signed peer set)."""
        return {w for w in among if u in self._peer_sets.get(w, ())}

    def _needed_ok(self, live: set, timed_out: bool, what: str) -> None:
        """Every client whose secret the unmasking needs keeps ≥ t holders of valid shares among ``live``."""
        t, u3 = self.spec.threshold, set(self._u3)
        for u in sorted(self._u2):
            if u not in u3 and not self._holders(u, u3):
                continue  # dropped and nobody in U masked with it: nothing to recover
            n_live = len(self._holders(u, live))
            if n_live < t:
                self._fail(
                    f"client {u} keeps only {n_live} live holders of its shares at stage {what!r} (threshold {t})",
                    timed_out,
                )

    def _close(self, now: float, timed_out: bool) -> list[tuple[int, bytes]]:
        spec, sid, rnd, t = self.spec, self.spec.session_id, self.spec.round_index, self.spec.threshold
        nb = spec.neighbours
        out: list = []
        if self.stage == "advertise":
            u1 = _prune(set(self.received), lambda u, s: len(nb[u] & s) >= t)
            if not u1:
                self._fail(
                    f"only {len(self.received)} clients advertised valid keys; none keeps {t} live neighbours",
                    timed_out,
                )
            self._keys = {u: self.received[u] for u in u1}
            self._u1 = u1
            self._advance("share", now, u1)
            for u in sorted(u1):
                entries = tuple(
                    KeyEntry(v, self._keys[v].c_pk, self._keys[v].s_pk, self._keys[v].commit, self._keys[v].signature)
                    for v in sorted(nb[u] & u1)
                )
                self._send(out, u, KeysBroadcast(sid, rnd, u, entries))
        elif self.stage == "share":
            dealt = {u: {it.peer for it in self.received[u].items} for u in self.received}
            u2 = _prune(set(dealt), lambda u, s: len(dealt[u] & s) >= t and len({v for v in s if u in dealt[v]}) >= t)
            if not u2:
                self._fail(f"only {len(self.received)} clients shared keys; none keeps {t} live holders", timed_out)
            self._u2 = u2
            self._dealt = {u: dealt[u] & u2 for u in u2}
            self._dealers = {u: {v for v in u2 if u in dealt[v]} for u in u2}
            self._items = {u: {it.peer: it for it in self.received[u].items} for u in u2}
            late = self.schedule == "late"
            self._advance("ready" if late else "masked", now, u2)  # late: wait for the input part (open_input)
            for u in sorted(u2):
                items = tuple(
                    ShareItem(
                        v,
                        self._items[v][u].ciphertext,
                        self._items[v][u].h_b,
                        self._items[v][u].h_s,
                        self._items[v][u].signature,
                    )
                    for v in sorted(self._dealers[u])
                )
                self._send(out, u, ForwardedShares(sid, rnd, u, items))
            if late and self._pending is not None:  # built with the full spec: bind the input part at once
                pending, self._pending = self._pending, None
                self.open_input(pending, now)
        elif self.stage == "masked":
            sent = dict(self.received)
            self._peer_sets = {u: set(m.peers) for u, m in sent.items()}
            # u masked with v but v left u out (u's shares were bad for v): drop u; its masks with v are then
            # removed with its reconstructed key, as for a client that dropped after masking
            accused = {u for u in sent for v in self._peer_sets[u] if v in sent and u not in self._peer_sets[v]}
            u3 = _prune(set(sent) - accused, lambda u, s: len(self._peer_sets[u] & s) >= t)
            self.accused = tuple(sorted(accused))
            if not u3:
                self._fail("no consistent masked input arrived", timed_out)
            q = spec.signatures_needed
            if len(u3) < q:
                self._fail(f"only {len(u3)} consistent masked inputs, the quorum is {q}", timed_out)
            self._u3 = tuple(sorted(u3))
            fp = spec.fixed_point
            self._masked = {u: sent[u] for u in self._u3}  # kept for the sum proof
            self._inputs = {u: np.frombuffer(sent[u].data, dtype=fp.dtype) for u in self._u3}
            self._needed_ok(u3, timed_out, "masked")
            self._advance("consistency", now, u3)
            left_out = set(sent) - u3  # sent a masked input that is not consistent: dropped after masking
            self.dropped_at["masked"] = tuple(sorted(set(self.dropped_at["masked"]) | left_out))
            if self.schedule == "construction":
                for u in self._u3:
                    self._send(out, u, ConsistencyRequest(sid, rnd, u, self._u3))
            else:  # every member's signed binding of its masked input to the full digest, for every signer to check
                bindings = tuple(InputDigest(u, self._bindings[u], sent[u].signature) for u in self._u3)
                for u in self._u3:
                    self._send(out, u, BoundConsistencyRequest(sid, rnd, u, self._u3, bindings))
        elif self.stage == "consistency":
            signers = set(self.received)
            q = spec.signatures_needed
            if len(signers) < q:
                self._fail(f"only {len(signers)} survivors confirmed the survivor set, the quorum is {q}", timed_out)
            self._needed_ok(signers, timed_out, "consistency")
            sigs = tuple(SignatureEntry(v, self.received[v].signature) for v in sorted(signers))
            self._signatures = sigs
            self._advance("unmask", now, signers)
            for u in sorted(signers):
                self._send(out, u, UnmaskRequest(sid, rnd, u, self._u3, sigs))
        elif self.stage == "unmask":
            self._finish(timed_out)
        return out

    def _points(self, owner: int, kind: bytes) -> list:
        """Revealed shares of ``owner``'s secret that match the hash its dealer signed for each revealer."""
        sid, rnd = self.spec.session_id, self.spec.round_index
        pts = []
        for w, msg in sorted(self.received.items()):
            lst = msg.self_shares if kind == b"b" else msg.key_shares
            for s in lst:
                if s.owner != owner:
                    continue
                item = self._items[owner][w]
                want = item.h_b if kind == b"b" else item.h_s
                if share_hash(sid, rnd, owner, w, kind, s.value) == want:
                    pts.append((w + 1, s.value))
                else:
                    self.rejected.append(
                        (
                            w,
                            AuthenticationError(
                                f"server: client {w} revealed a share of client {owner}'s secret that does not match the "
                                "hash its dealer signed; share discarded"
                            ),
                        )
                    )
        return pts

    def _finish(self, timed_out: bool) -> None:
        spec, t = self.spec, self.spec.threshold
        sid, rnd = spec.session_id, spec.round_index
        u3 = set(self._u3)
        self.dropped_at[self.stage] = tuple(sorted(self.expected - set(self.received)))
        seeds, mask_keys = {}, {}
        for u in self._u3:
            pts = self._points(u, b"b")
            if len(pts) < t:
                self._fail(f"only {len(pts)} valid shares of client {u}'s self-mask seed (threshold {t})", timed_out)
            b = shamir.int_to_secret(shamir.reconstruct(pts, t), strict=False)
            if b is None or commitment(sid, rnd, u, b) != self._keys[u].commit:
                self.blame = (u,)
                self._fail(
                    f"client {u} dealt shares of a self-mask seed other than the one it committed to (its "
                    "signed share hashes are the evidence); exclude it and rerun",
                    False,
                    "sum withheld",
                )
            seeds[u] = b
        for u in sorted(self._u2 - u3):
            if not self._holders(u, u3):
                continue  # nobody in U masked with it: nothing to remove
            pts = self._points(u, b"s")
            if len(pts) < t:
                self._fail(f"only {len(pts)} valid shares of client {u}'s mask key (threshold {t})", timed_out)
            raw = shamir.int_to_secret(shamir.reconstruct(pts, t), strict=False)
            s_sk = None if raw is None else crypto.x25519_private_from_bytes(raw)
            if s_sk is None or crypto.x25519_public_bytes(s_sk) != self._keys[u].s_pk:
                self.blame = (u,)
                self._fail(
                    f"client {u} dealt shares of a mask key other than the one it advertised (its signed "
                    "share hashes are the evidence); exclude it and rerun",
                    False,
                    "sum withheld",
                )
            mask_keys[u] = s_sk
        acc = unmasked_sum(
            spec, self._inputs, seeds, mask_keys, self._peer_sets, {v: a.s_pk for v, a in self._keys.items()}
        )
        worst, bound = range_excess(spec, acc)
        if worst > bound:  # integer inputs: the sum lives mod 2^k (the encoder bounds its wrap), no range
            self.suspects = self._u3
            outside = int(np.count_nonzero(np.abs(dequantize(acc, spec.fixed_point)) * spec.fixed_point.scale > bound))
            self._fail(
                f"the unmasked sum lies outside its public range at {outside} of {spec.length} coordinates "
                f"(|word| {worst:.3g} > {bound:.3g}): the masked input of at least one survivor encodes a value "
                "no honest site sends (garbage under honest-looking words, or masked with a seed other than the "
                "one it committed to). Which one is not identifiable without opening a site's masked input, "
                "which would expose an honest site's input (docs/threat-model-secure-sum.md §5); sites that could "
                f"be responsible: {list(self._u3)} (SecAggServer.suspects). Do not rerun this sum over a subset "
                "of them",
                False,
                "sum withheld",
            )
        self.result = acc
        self.survivors = self._u3
        self.stage = "done"
        self.received = {}
        self._evidence = {"seeds": seeds, "mask_keys": mask_keys}
        self._inputs = {}

    def proof(self) -> bytes:
        """The proof that :attr:`result` is the sum over the survivors (:mod:`.secagg_proof`; the same bytes for every
        survivor). Only after the round is ``done``; :meth:`forget` drops the evidence it is built from."""
        if self.stage != "done" or self._evidence is None:
            raise ProtocolError(
                f"server: no sum proof in stage {self.stage!r} (a proof exists only for a completed "
                "round whose evidence was not forgotten)"
            )
        ev = self._evidence
        return build_proof(
            self.spec,
            self.schedule,
            self._u3,
            self.result,
            self._masked,
            self._signatures,
            self._keys,
            ev["seeds"],
            ev["mask_keys"],
        )

    def forget(self) -> None:
        """Drop the evidence kept for :meth:`proof` (the survivors' masked inputs: |U|·d words)."""
        self._evidence, self._masked = None, {}
