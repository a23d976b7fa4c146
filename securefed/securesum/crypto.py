"""Cryptographic building blocks of securefed's secure aggregation (thin layer over pyca/cryptography).

Everything secret here comes from ``os.urandom`` (never from a seeded PRNG). The primitives are:

* **Key agreement** — X25519 (RFC 7748); the raw shared secret is never used directly but passed through
  HKDF-SHA256 (RFC 5869) with the session id as salt and an ``info`` string that names the purpose,
  the round and the two parties, so every derived key is single-use (Bonawitz et al. 2017, §4).
* **Authenticated channel** — AES-256-GCM with a fresh 96-bit random nonce; the associated data binds
  session id, round, sender and recipient, so a ciphertext cannot be moved to another round, session
  or pair of clients.
* **Identity** — Ed25519 long-term keys; every advertised key-agreement key is signed, so the server
  cannot substitute its own keys (the "malicious server key swap" of Bonawitz et al. 2017, §6).
* **Mask expansion** — AES-256-CTR keystream under a key HKDF-derived from the full 256-bit seed,
  the session id, the round and the purpose, generated in bulk into a reusable buffer and viewed as
  ``uint32``/``uint64`` words (no per-element Python work). Flower's SecAgg+ instead folds seeds to
  32 bits and expands them with a non-cryptographic PRNG; securefed does neither.
"""

from __future__ import annotations

import functools
import os
import struct

import numpy as np
from cryptography.exceptions import InvalidSignature, InvalidTag
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from ..errors import AuthenticationError

__all__ = [
    "SEED_BYTES",
    "hkdf",
    "x25519_keypair",
    "x25519_private_from_bytes",
    "x25519_public_bytes",
    "x25519_shared",
    "ed25519_keypair",
    "ed25519_public_bytes",
    "sign",
    "verify",
    "aead_encrypt",
    "aead_decrypt",
    "expand_mask",
    "keystream_words",
]

SEED_BYTES = 32
_RAW = serialization.Encoding.Raw
_RAW_PUB = serialization.PublicFormat.Raw
_RAW_PRIV = serialization.PrivateFormat.Raw
_NOENC = serialization.NoEncryption()


def hkdf(ikm: bytes, *, salt: bytes, info: bytes, length: int = 32) -> bytes:
    """HKDF-SHA256 extract-and-expand (RFC 5869, §2.2–2.3)."""
    return HKDF(algorithm=hashes.SHA256(), length=length, salt=salt, info=info).derive(ikm)


def x25519_keypair() -> tuple[X25519PrivateKey, bytes]:
    """A fresh X25519 key pair from the OS entropy source; returns (private key, 32-byte public key)."""
    sk = X25519PrivateKey.generate()
    return sk, x25519_public_bytes(sk)


def x25519_public_bytes(sk: X25519PrivateKey) -> bytes:
    """The raw 32-byte public key of ``sk``."""
    return sk.public_key().public_bytes(_RAW, _RAW_PUB)


def x25519_private_bytes(sk: X25519PrivateKey) -> bytes:
    """The raw 32-byte private scalar of ``sk`` (what SecAgg Shamir-shares for dropout recovery)."""
    return sk.private_bytes(_RAW, _RAW_PRIV, _NOENC)


def x25519_private_from_bytes(raw: bytes) -> X25519PrivateKey:
    """Load a raw 32-byte X25519 private key."""
    return X25519PrivateKey.from_private_bytes(raw)


def x25519_shared(sk: X25519PrivateKey, peer_public: bytes) -> bytes:
    """The raw X25519 shared secret (RFC 7748 §6.1); raises AuthenticationError on a bad public key."""
    try:
        shared = sk.exchange(X25519PublicKey.from_public_bytes(peer_public))
    except ValueError as exc:  # all-zero output: small-order point supplied by an attacker
        raise AuthenticationError(f"peer X25519 public key is invalid: {exc}") from None
    return shared


def ed25519_keypair() -> tuple[Ed25519PrivateKey, bytes]:
    """A fresh Ed25519 identity key; returns (private key, 32-byte public key)."""
    sk = Ed25519PrivateKey.generate()
    return sk, ed25519_public_bytes(sk)


def ed25519_public_bytes(sk: Ed25519PrivateKey) -> bytes:
    """The raw 32-byte Ed25519 public key of ``sk``."""
    return sk.public_key().public_bytes(_RAW, _RAW_PUB)


def sign(sk: Ed25519PrivateKey, message: bytes) -> bytes:
    """Ed25519 signature (RFC 8032), 64 bytes."""
    return sk.sign(message)


@functools.lru_cache(maxsize=4096)
def _ed25519_public(public: bytes) -> Ed25519PublicKey:
    """Parsed identity keys are long-term: parse each once."""
    return Ed25519PublicKey.from_public_bytes(public)


def verify(public: bytes, signature: bytes, message: bytes, *, what: str) -> None:
    """Verify an Ed25519 signature or raise :class:`AuthenticationError` naming ``what`` failed."""
    try:
        _ed25519_public(bytes(public)).verify(signature, message)
    except (InvalidSignature, ValueError):
        raise AuthenticationError(f"signature on {what} does not verify: key swap or forgery; round aborted") from None


def aead_encrypt(key: bytes, plaintext: bytes, aad: bytes) -> bytes:
    """AES-256-GCM encryption; output is ``nonce (12 bytes) || ciphertext || tag``."""
    nonce = os.urandom(12)
    return nonce + AESGCM(key).encrypt(nonce, plaintext, aad)


def aead_decrypt(key: bytes, blob: bytes, aad: bytes, *, what: str) -> bytes:
    """AES-256-GCM decryption; raises :class:`AuthenticationError` if the tag or the AAD do not match."""
    if len(blob) < 12 + 16:
        raise AuthenticationError(f"{what}: ciphertext of {len(blob)} bytes is too short for AES-GCM")
    try:
        return AESGCM(key).decrypt(blob[:12], blob[12:], aad)
    except InvalidTag:
        raise AuthenticationError(f"{what}: AES-GCM tag does not verify (tampered, replayed or misrouted)") from None


_ZERO_NONCE = bytes(16)
_zero_cache = {"buf": b""}


def _zeros(nbytes: int) -> memoryview:
    buf = _zero_cache["buf"]
    if len(buf) < nbytes:
        buf = bytes(max(nbytes, 2 * len(buf)))
        _zero_cache["buf"] = buf
    return memoryview(buf)[:nbytes]


def keystream_words(key: bytes, count: int, dtype=np.uint64, out: bytearray | None = None) -> np.ndarray:
    """Raw AES-256-CTR keystream (counter from 0) viewed as ``count`` little-endian words of ``dtype``.

    The keystream is produced in one bulk ``update_into`` call (no per-element Python work). ``key``
    must be single-use (HKDF-derived per seed, session, round and purpose), which is why a constant
    zero counter block is safe here (NIST SP 800-38A, Appendix B: counter blocks must be unique per key).
    """
    itemsize = np.dtype(dtype).itemsize
    nbytes = count * itemsize
    if out is None or len(out) < nbytes + 15:
        out = bytearray(nbytes + 15)
    enc = Cipher(algorithms.AES(key), modes.CTR(_ZERO_NONCE)).encryptor()
    enc.update_into(_zeros(nbytes), out)
    return np.frombuffer(out, dtype=dtype, count=count)


def expand_mask(seed: bytes, *, session_id: bytes, info: bytes, count: int, dtype=np.uint64) -> np.ndarray:
    """Expand a 256-bit seed into ``count`` uniform words: AES-256-CTR under HKDF(seed, session, info).

    Bonawitz et al. 2017 (§4, "PRG") require a cryptographically secure PRG seeded with the full
    secret; the round index and purpose go into ``info`` so every round gets fresh, independent masks.
    Returns a new writable array.
    """
    if len(seed) != SEED_BYTES:
        raise AuthenticationError(f"mask seed has {len(seed)} bytes; a 256-bit (32-byte) seed is required")
    key = hkdf(seed, salt=session_id, info=b"securefed/mask/v1|" + info)
    return keystream_words(key, count, dtype).copy()


def add_mask_inplace(
    acc: np.ndarray, seed: bytes, *, session_id: bytes, info: bytes, sign: int, buf: bytearray
) -> None:
    """``acc += sign · PRG(seed)`` in the ring of ``acc.dtype`` (wrapping is the modular arithmetic).

    Uses the caller's reusable ``buf`` for the keystream so expansion runs at cipher speed.
    """
    key = hkdf(seed, salt=session_id, info=b"securefed/mask/v1|" + info)
    words = keystream_words(key, acc.size, acc.dtype, out=buf)
    if sign > 0:
        np.add(acc, words, out=acc)
    else:
        np.subtract(acc, words, out=acc)


def pack_ids(*values: int) -> bytes:
    """Fixed-width encoding of small integers for HKDF ``info`` / AAD strings."""
    return struct.pack(f"<{len(values)}Q", *values)
