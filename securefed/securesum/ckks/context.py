"""TenSEAL helpers and the bytes every CKKS signature covers. TenSEAL is imported on first use only."""

from __future__ import annotations

import hashlib

import numpy as np

from ...errors import AuthenticationError, DecodeError, ProtocolError
from .. import crypto
from .params import CKKSParams

__all__ = [
    "tenseal",
    "make_context",
    "public_bytes",
    "secret_bytes",
    "context_bytes",
    "load_public_context",
    "load_context",
    "can_decrypt",
    "encrypt_vector",
    "sum_ciphertexts",
    "decrypt_vectors",
    "vectors",
    "add_into",
    "upload_digest",
    "input_payload",
    "survivors_payload",
    "context_payload",
    "decrypted_payload",
]

_pack = crypto.pack_ids


def tenseal():
    """The TenSEAL module (imported here, so that SecAgg+-only runs never load it)."""
    import tenseal as ts

    return ts


def make_context(p: CKKSParams):
    ts = tenseal()
    ctx = ts.context(
        ts.SCHEME_TYPE.CKKS, poly_modulus_degree=p.poly_modulus_degree, coeff_mod_bit_sizes=list(p.coeff_mod_bit_sizes)
    )
    ctx.global_scale = 2.0**p.scale_bits
    return ctx


def public_bytes(ctx) -> bytes:
    return ctx.serialize(save_public_key=True, save_secret_key=False, save_galois_keys=False, save_relin_keys=False)


def secret_bytes(ctx) -> bytes:
    return ctx.serialize(save_public_key=True, save_secret_key=True, save_galois_keys=False, save_relin_keys=False)


def context_bytes(ctx) -> bytes:
    """A context as it is held: with its secret key if it has one."""
    return secret_bytes(ctx) if ctx.is_private() else public_bytes(ctx)


def load_context(data: bytes, what: str):
    """Load a TenSEAL context; corrupt or foreign bytes are a :class:`DecodeError` naming ``what``."""
    try:
        return tenseal().context_from(bytes(data))
    except (ValueError, RuntimeError, TypeError) as exc:
        raise DecodeError(f"{what}: the TenSEAL context does not load ({exc})") from None


def load_public_context(data: bytes):
    """Load a context that must not carry the secret key (the server's, a non-key-holder's)."""
    ctx = load_context(data, "public context")
    if ctx.is_private():
        raise AuthenticationError(
            "a party that must not decrypt was handed a context holding the CKKS secret key; refused"
        )
    return ctx


def can_decrypt(ctx, ciphertext: bytes) -> bool:
    """True if ``ctx`` decrypts ``ciphertext`` (a public context must never do so)."""
    try:
        tenseal().ckks_vector_from(ctx, ciphertext).decrypt()
    except ValueError:
        return False
    return True


def encrypt_vector(ctx, x: np.ndarray, slots: int) -> tuple:
    """Batch ``x`` over ⌈len/slots⌉ CKKS ciphertexts (serialised)."""
    ts = tenseal()
    return tuple(ts.ckks_vector(ctx, x[i : i + slots].tolist()).serialize() for i in range(0, x.size, slots))


def vectors(ctx, chunks, what: str) -> list:
    """Deserialise ciphertext chunks under ``ctx``; a malformed chunk is a :class:`DecodeError`."""
    ts = tenseal()
    try:
        return [ts.ckks_vector_from(ctx, bytes(c)) for c in chunks]
    except (ValueError, RuntimeError, TypeError) as exc:
        raise DecodeError(f"{what}: not a CKKS ciphertext for this context ({exc})") from None


def add_into(sums: list | None, vecs: list, what: str) -> list:
    if sums is None:
        return vecs
    if len(vecs) != len(sums):
        raise ProtocolError(f"{what}: {len(vecs)} ciphertexts, expected {len(sums)}")
    try:
        for a, b in zip(sums, vecs):
            a.add_(b)
    except (ValueError, RuntimeError, TypeError) as exc:
        raise DecodeError(f"{what}: ciphertexts cannot be added ({exc})") from None
    return sums


def sum_ciphertexts(pub_ctx, uploads: list) -> tuple:
    """Slot-wise homomorphic sum of several clients' chunk lists (server side, public context only)."""
    sums = None
    for chunks in uploads:
        sums = add_into(sums, vectors(pub_ctx, chunks, "upload"), "upload")
    return tuple(v.serialize() for v in sums)


def decrypt_vectors(vecs, length: int) -> np.ndarray:
    """Raw decryption of CKKS vectors (never released as is: see :func:`.params.gaussian_noise`)."""
    return np.concatenate([np.asarray(v.decrypt(), dtype=np.float64) for v in vecs])[:length]


# ----------------------------------------------------------------------------------- what is signed


def upload_digest(chunks) -> bytes:
    """SHA-256 over a ciphertext upload (domain-separated, each chunk length-prefixed): what a client signs."""
    h = hashlib.sha256(b"securefed/ckks-chunks/v1|" + _pack(len(chunks)))
    for c in chunks:
        h.update(_pack(len(c)))
        h.update(c)
    return h.digest()


def input_payload(session: bytes, rnd: int, sender: int, digest: bytes, spec_digest: bytes = b"") -> bytes:
    """Bytes a SignedInput signature covers: session, round, sender, spec digest and the upload digest."""
    return b"securefed/ckks-input/v2|" + session + _pack(rnd, sender) + spec_digest + digest


def survivors_payload(session: bytes, rnd: int, survivors, spec_digest: bytes = b"") -> bytes:
    """Bytes a CKKS survivor-set signature covers: session, round, spec digest and the exact set U."""
    ids = tuple(survivors)
    return b"securefed/ckks-survivors/v2|" + session + spec_digest + _pack(rnd, len(ids), *ids)


def context_payload(session: bytes, rnd: int, sender: int, spec_digest: bytes, context: bytes) -> bytes:
    """Bytes the key holder signs for its public context (so no server can hand a client its own key)."""
    return (
        b"securefed/ckks-public-context/v2|"
        + session
        + _pack(rnd, sender)
        + spec_digest
        + hashlib.sha256(context).digest()
    )


def decrypted_payload(session: bytes, rnd: int, sender: int, spec_digest: bytes, step: float, data: bytes) -> bytes:
    """Bytes a decryptor signs for its DecryptedSum."""
    return (
        b"securefed/ckks-decrypted/v2|"
        + session
        + _pack(rnd, sender)
        + spec_digest
        + np.float64(step).tobytes()
        + hashlib.sha256(data).digest()
    )
