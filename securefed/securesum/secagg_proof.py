"""Aggregates a site can verify (issue 24 item 2): the SecAgg+ server's proof that the released total is the sum.

After a round the server holds exactly what it needs to compute the sum over the survivors U: their signed
masked inputs y_u, the self-mask seeds b_u it reconstructed (one per survivor) and the mask keys s_v of the
dropped clients a survivor masked with. The **proof** (:class:`~.messages.SumProof`, strict codec) is that
evidence, with the signatures that make it checkable by a site that trusts nothing but the identity keys:

* ``inputs``: every survivor's MaskedInput as signed (construction schedule: over the vector's hash and peer set
  with the full spec digest; late-bound: its input binding over the full digest);
* ``signatures``: ≥ q consistency signatures on U from distinct members — the survivor set the sites agreed on;
* ``keys``: the signed AdvertiseKeys of every survivor and every dropped client in a survivor's peer set (each
  carries the commitment H(b_u) and the mask public key s_pk the client signed at the start of the round);
* ``seeds`` b_u of the survivors and ``mask_keys`` s_v of those dropped clients, each checked against the owner's
  own signed commitment / public key;
* ``total``: the claimed sum.

:func:`verify_sum` checks all of it and **recomputes the unmasked sum itself** with the same arithmetic the
server runs (:func:`unmasked_sum`), then compares it word for word with the claimed total. Any discrepancy raises
:class:`SumProofError` naming what is wrong (``reason``: ``forged-total``, ``consistency-signatures``,
``seed-commitment``, ``mask-key``, ``input-signature``, ``peer-sets``, ``own-input``, ``survivor-set``, …) and,
where one exists, the client it concerns (``client``).

**What it reveals.** Nothing the coordinator does not already hold: the proof is a part of the server's view of
the round (masked inputs, keys, the secrets it reconstructed, signatures). A coalition of sites *without* the
server learns from it at most the server's view; the SecAgg+ threat model already covers the server's view
together with c sites' states (docs/threat-model-secure-sum.md §2), so a coalition of up to c sites holding
proofs learns nothing beyond the sum over U, which every survivor receives anyway. (b_u and s_v are single-use:
keys are fresh in every round.) A coalition of more than c sites is beyond the model with or without proofs.

**Cost.** The proof carries every survivor's masked vector: |U| · d · k/8 bytes (40 MB per site at N = 100,
d = 10⁵, 32-bit words) and its check costs about the server's own unmasking (BENCHMARKS.md, "Secure sums:
late-bound input, verifiable aggregates, blame"). The lighter variants are stated there.
"""

from __future__ import annotations

import numpy as np

from ..errors import AuthenticationError, DecodeError, ProtocolError
from . import crypto
from .messages import KeyEntry, ProofInput, SecretEntry, SumProof, decode, encode
from .quantize import dequantize, overflow_bound
from .secagg import (
    SCHEDULES,
    RoundSpec,
    advert_payload,
    bound_masked_payload,
    commitment,
    consistency_payload,
    input_hash,
    masked_payload,
    pair_info,
    self_info,
)

__all__ = ["SumProofError", "verify_sum", "build_proof", "unmasked_sum", "range_excess"]


class SumProofError(AuthenticationError):
    """A sum proof does not prove the released total. ``reason`` names the failed check, ``client`` the client it
    concerns (or None)."""

    def __init__(self, reason: str, message: str, client: int | None = None):
        super().__init__(f"sum proof refused ({reason}): {message}")
        self.reason, self.client = reason, client


# ------------------------------------------------------------------------------ the unmasking arithmetic


def unmasked_sum(
    spec: RoundSpec, inputs: dict, seeds: dict, mask_keys: dict, peer_sets: dict, s_pks: dict
) -> np.ndarray:
    """Σ_{u∈U} y_u − Σ_{u∈U} PRG(b_u) − Σ_{v dropped} Σ_{u∈U, v∈P_u} ±PRG(X25519(s_v, s_pk_u))  mod 2^k.

    Bonawitz et al. 2017, Eq. (1)–(3). ``inputs``: survivor → its masked words; ``seeds``: survivor → b_u;
    ``mask_keys``: dropped client → its X25519 private key; ``peer_sets``: survivor → P_u; ``s_pks``: client →
    its advertised mask public key. The server's result and every verifier's recomputation (one implementation).
    """
    fp, sid, rnd = spec.fixed_point, spec.session_id, spec.round_index
    acc = np.zeros(spec.length, dtype=fp.dtype)
    for u in sorted(inputs):
        np.add(acc, inputs[u], out=acc)
    buf = bytearray(acc.nbytes + 16)
    for u in sorted(seeds):
        crypto.add_mask_inplace(acc, seeds[u], session_id=sid, info=self_info(rnd, u), sign=-1, buf=buf)
    for v in sorted(mask_keys):
        for u in sorted(w for w in inputs if v in peer_sets[w]):
            shared = crypto.x25519_shared(mask_keys[v], s_pks[u])
            # survivor u added +m when u < v, −m when u > v: remove it
            crypto.add_mask_inplace(
                acc, shared, session_id=sid, info=pair_info(rnd, v, u), sign=-1 if u < v else +1, buf=buf
            )
    if fp.modulus_bits not in (32, 64):
        acc &= fp.dtype((1 << fp.modulus_bits) - 1)
    return acc


def range_excess(spec: RoundSpec, words: np.ndarray) -> tuple[float, float]:
    """(largest |word| of the centred sum, the public bound W·c·2^f + A); the sum is in range iff the first is not
    larger. Integer rounds have no range (the sum lives mod 2^k): (0, inf)."""
    fp = spec.fixed_point
    if spec.integer:
        return 0.0, float("inf")
    bound = overflow_bound(fp.clip, fp.fractional_bits, fp.weight_total, fp.active_clients)
    worst = float(np.max(np.abs(dequantize(words, fp)))) * fp.scale if words.size else 0.0
    return worst, bound


# ------------------------------------------------------------------------------------- build and verify


def build_proof(
    spec: RoundSpec,
    schedule: str,
    survivors: tuple,
    total: np.ndarray,
    masked: dict,
    signatures: tuple,
    adverts: dict,
    seeds: dict,
    mask_keys: dict,
) -> bytes:
    """Encode the proof (:class:`~.messages.SumProof`) from a finished server's evidence (``SecAggServer.proof``)."""
    fp = spec.fixed_point
    inputs = tuple(ProofInput(u, tuple(masked[u].peers), masked[u].data, masked[u].signature) for u in survivors)
    keys = tuple(
        KeyEntry(v, adverts[v].c_pk, adverts[v].s_pk, adverts[v].commit, adverts[v].signature)
        for v in sorted(set(survivors) | set(mask_keys))
    )
    return encode(
        SumProof(
            spec.session_id,
            spec.round_index,
            SCHEDULES.index(schedule),
            spec.digest,
            tuple(survivors),
            fp.modulus_bits,
            np.ascontiguousarray(total, dtype=fp.dtype).tobytes(),
            inputs,
            tuple(signatures),
            keys,
            tuple(SecretEntry(u, seeds[u]) for u in survivors),
            tuple(SecretEntry(v, crypto.x25519_private_bytes(mask_keys[v])) for v in sorted(mask_keys)),
        )
    )


def _check(cond: bool, reason: str, message: str, client: int | None = None) -> None:
    if not cond:
        raise SumProofError(reason, message, client)


def verify_sum(
    proof: bytes,
    spec: RoundSpec,
    own_client_id: int,
    *,
    schedule: str | None = None,
    survivors=None,
    own_input_hash: bytes | None = None,
) -> np.ndarray:
    """Check a sum proof and return the total words it proves (= the server's result), or raise SumProofError.

    Parameters
    ----------
    proof : bytes
        ``SecAggServer.proof()``.
    spec : RoundSpec
        The verifier's own full spec of the round (late-bound: ``setup.bind(input_spec)``).
    own_client_id : int
        The verifier; it must be a survivor (only survivors receive a proof).
    schedule : {"construction", "late"}, optional
        The verifier's schedule; the proof's must match.
    survivors : tuple, optional
        The survivor set the verifier signed; the proof's must be the same.
    own_input_hash : bytes, optional
        :func:`~.secagg.input_hash` of the masked input the verifier sent; its entry in the proof must match.

    ``SecAggClient.verify_sum(proof)`` passes all of these from the client's own state.
    """
    if not isinstance(spec, RoundSpec):
        raise ProtocolError(f"verify_sum needs the full RoundSpec of the round, not {type(spec).__name__}")
    try:
        p = decode(proof, session_id=spec.session_id, round_index=spec.round_index, expected=SumProof)
    except DecodeError as exc:
        raise SumProofError("malformed", str(exc)) from None
    n, fp = spec.n_clients, spec.fixed_point
    _check(p.digest == spec.digest, "spec", "the proof is for another round spec (digest differs)")
    _check(p.schedule < len(SCHEDULES), "schedule", f"unknown schedule {p.schedule}")
    sched = SCHEDULES[p.schedule]
    _check(
        schedule is None or sched == schedule,
        "schedule",
        f"the proof is for the {sched!r} schedule, this site ran {schedule!r}",
    )
    key_digest = spec.digest if sched == "construction" else spec.setup.digest
    U = tuple(p.survivors)
    _check(all(0 <= u < n for u in U), "survivor-set", "the survivor set names unknown clients")
    _check(
        own_client_id in U,
        "own-input",
        f"client {own_client_id} is not in the proof's survivor set {list(U)}",
        own_client_id,
    )
    _check(
        survivors is None or U == tuple(survivors),
        "survivor-set",
        f"the proof's survivor set {list(U)} is not the one this site signed {list(survivors or ())}",
    )
    _check(p.bits == fp.modulus_bits, "malformed", f"{p.bits}-bit words, the spec has {fp.modulus_bits}")
    nbytes = spec.length * np.dtype(fp.dtype).itemsize
    _check(len(p.total) == nbytes, "malformed", f"the total has {len(p.total)} bytes, expected {nbytes}")
    _check_consistency_signatures(p, spec, U)
    inputs, peer_sets = _proved_inputs(p, spec, U, sched, nbytes, own_client_id, own_input_hash)
    dropped = sorted(set().union(*peer_sets.values()) - set(U))
    adverts, seeds, mask_keys = _proved_secrets(p, spec, key_digest, U, dropped)
    # recompute the sum and compare
    acc = unmasked_sum(spec, inputs, seeds, mask_keys, peer_sets, {v: a.s_pk for v, a in adverts.items()})
    worst, bound = range_excess(spec, acc)
    _check(
        worst <= bound, "out-of-range", f"the recomputed sum lies outside its public range ({worst:.3g} > {bound:.3g})"
    )
    claimed = np.frombuffer(p.total, dtype=fp.dtype)
    diff = np.flatnonzero(claimed != acc)
    _check(
        diff.size == 0,
        "forged-total",
        f"the released total differs from the sum of the survivors' inputs at "
        f"{diff.size} of {spec.length} coordinates (first: {diff[:5].tolist()})",
    )
    return acc


def _check_consistency_signatures(p: SumProof, spec: RoundSpec, U: tuple) -> None:
    """The survivor set ``U`` is the one the sites agreed on: >= q valid signatures from distinct members."""
    sid, rnd = spec.session_id, spec.round_index
    signers = [s.signer for s in p.signatures]
    _check(
        len(set(signers)) == len(signers) and set(signers) <= set(U),
        "consistency-signatures",
        "consistency signatures are duplicated or from non-survivors",
    )
    payload = consistency_payload(sid, rnd, spec.digest, U)
    for s in p.signatures:
        try:
            crypto.verify(spec.identity_keys[s.signer], s.signature, payload, what=f"client {s.signer}'s survivor set")
        except AuthenticationError:
            raise SumProofError(
                "consistency-signatures", f"client {s.signer}'s signature is not on this survivor set", s.signer
            ) from None
    q = spec.signatures_needed
    _check(
        len(signers) >= q,
        "consistency-signatures",
        f"only {len(signers)} signatures on the survivor set, the quorum is {q}: a signature is missing",
    )


def _proved_inputs(
    p: SumProof, spec: RoundSpec, U: tuple, sched: str, nbytes: int, own_client_id: int, own_input_hash: bytes | None
) -> tuple[dict, dict]:
    """Every survivor's masked input (``nbytes`` long), checked as it signed it (and, for the verifier, as it sent
    it), with peer sets that are ≥ t of its neighbours and mutual; returns ({survivor: words}, {survivor: peer set})."""
    sid, rnd, fp = spec.session_id, spec.round_index, spec.fixed_point
    _check(tuple(e.sender for e in p.inputs) == U, "inputs", "the masked inputs do not match the survivor set")
    inputs, peer_sets = {}, {}
    for e in p.inputs:
        u = e.sender
        _check(len(e.data) == nbytes, "inputs", f"client {u}'s masked input has {len(e.data)} bytes", u)
        _check(
            set(e.peers) <= spec.neighbours[u] and len(e.peers) >= spec.threshold,
            "peer-sets",
            f"client {u}'s peer set {list(e.peers)} is not ≥ t of its neighbours",
            u,
        )
        binding = input_hash(e.data, e.peers)
        if u == own_client_id and own_input_hash is not None:
            _check(
                binding == own_input_hash,
                "own-input",
                "the proof carries another masked input than the one this site sent",
                u,
            )
        pl = (
            masked_payload(sid, rnd, spec.digest, u, p.bits, e.data, e.peers)
            if sched == "construction"
            else bound_masked_payload(sid, rnd, spec.digest, u, p.bits, binding)
        )
        try:
            crypto.verify(spec.identity_keys[u], e.signature, pl, what=f"client {u}'s masked input")
        except AuthenticationError:
            raise SumProofError("input-signature", f"client {u}'s masked input is not the one it signed", u) from None
        words = np.frombuffer(e.data, dtype=fp.dtype)
        if fp.modulus_bits not in (32, 64):
            _check(
                not np.any(words >> fp.dtype(fp.modulus_bits)),
                "inputs",
                f"client {u}'s masked input has words >= 2^{fp.modulus_bits}",
                u,
            )
        inputs[u], peer_sets[u] = words, set(e.peers)
    for u in U:
        for v in peer_sets[u] & set(U):
            _check(
                u in peer_sets[v], "peer-sets", f"survivor {u} masked with survivor {v}, which did not mask with {u}", u
            )
    return inputs, peer_sets


def _proved_secrets(p: SumProof, spec: RoundSpec, key_digest: bytes, U: tuple, dropped: list):
    """The signed advertisements, the survivors' self-mask seeds and the dropped clients' mask keys of a proof,
    each checked against what its owner signed or committed to (raises SumProofError)."""
    sid, rnd = spec.session_id, spec.round_index
    # the keys every client signed at the start of the round
    _check(
        tuple(k.sender for k in p.keys) == tuple(sorted(set(U) | set(dropped))),
        "advertisement",
        "the advertisements are not exactly those of the survivors and the dropped clients they masked with",
    )
    adverts = {}
    for k in p.keys:
        try:
            crypto.verify(
                spec.identity_keys[k.sender],
                k.signature,
                advert_payload(sid, rnd, k.sender, key_digest, k.c_pk, k.s_pk, k.commit),
                what=f"client {k.sender}'s advertised keys",
            )
        except AuthenticationError:
            raise SumProofError(
                "advertisement", f"client {k.sender}'s advertisement is not the one it signed", k.sender
            ) from None
        adverts[k.sender] = k
    # the secrets the server reconstructed, against what their owners committed to
    _check(tuple(e.owner for e in p.seeds) == U, "seed-commitment", "the self-mask seeds do not match the survivor set")
    seeds = {}
    for e in p.seeds:
        _check(
            commitment(sid, rnd, e.owner, e.secret) == adverts[e.owner].commit,
            "seed-commitment",
            f"client {e.owner}'s self-mask seed does not match the commitment it signed",
            e.owner,
        )
        seeds[e.owner] = e.secret
    _check(
        tuple(e.owner for e in p.mask_keys) == tuple(dropped),
        "mask-key",
        f"the mask keys are for clients "
        f"{[e.owner for e in p.mask_keys]}, the dropped clients the survivors masked with are {dropped}",
    )
    mask_keys = {}
    for e in p.mask_keys:
        try:
            sk = crypto.x25519_private_from_bytes(e.secret)
        except ValueError:
            raise SumProofError("mask-key", f"client {e.owner}'s mask key is not an X25519 key", e.owner) from None
        _check(
            crypto.x25519_public_bytes(sk) == adverts[e.owner].s_pk,
            "mask-key",
            f"client {e.owner}'s mask key does not match the public key it signed",
            e.owner,
        )
        mask_keys[e.owner] = sk
    return adverts, seeds, mask_keys
