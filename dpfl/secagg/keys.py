"""X25519 key agreement and HKDF-SHA256 key derivation (the `cryptography` package).

Each client holds two key pairs per round: one to encrypt its Shamir shares to neighbours
(AES-GCM keys) and one for the pairwise mask seeds. A shared secret is never used directly:
HKDF binds it to a purpose label and the round id, so keys of different rounds and purposes
are independent.

Public keys are checked where they arrive (`check_public`): a key of small order (or one on the
twist with small order) would give an all-zero shared secret, so X25519 with a fixed clamped
scalar — a multiple of the cofactor 8 — maps exactly those keys to zero and rejects them.

Optional signatures (Ed25519) for the active-server model: with a PKI giving every client's
verification key, clients sign their advertised keys and the survivor list (`sign`, `verify`).
"""

from __future__ import annotations

from functools import lru_cache

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat, PublicFormat

from dpfl.errors import ProtocolError
from dpfl.rng import CryptoRNG

KEY_BYTES = 32
SIGNATURE_BYTES = 64
_PROBE = X25519PrivateKey.from_private_bytes(
    b"\x09" * KEY_BYTES
)  # any fixed key: clamping makes it a multiple of 8


def new_private_key(rng: CryptoRNG | None = None) -> X25519PrivateKey:
    """A fresh X25519 private key: from the OS, or from `rng` in a seeded simulation."""
    return X25519PrivateKey.generate() if rng is None else load_private(rng.bytes(KEY_BYTES))


def load_private(raw: bytes) -> X25519PrivateKey:
    if len(raw) != KEY_BYTES:
        raise ProtocolError(f"private key must be {KEY_BYTES} bytes, got {len(raw)}")
    return X25519PrivateKey.from_private_bytes(raw)


def private_bytes(key: X25519PrivateKey) -> bytes:
    return key.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())


def public_bytes(key: X25519PrivateKey) -> bytes:
    """Raw 32-byte public key."""
    return key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)


def check_public(pk: object, who: str) -> bytes:
    """`pk` if it is a usable X25519 public key (32 bytes, not of small order); else ProtocolError
    naming `who`."""
    if not isinstance(pk, bytes) or len(pk) != KEY_BYTES:
        raise ProtocolError(f"{who}: public keys must be {KEY_BYTES} bytes")
    if _small_order(pk):
        raise ProtocolError(f"{who}: public key of small order (all-zero shared secret), rejected")
    return pk


@lru_cache(maxsize=1 << 16)
def _small_order(pk: bytes) -> bool:
    """One exchange per distinct key (a round's k neighbours all check the same keys)."""
    try:
        _PROBE.exchange(X25519PublicKey.from_public_bytes(pk))
    except ValueError:
        return True
    return False


def new_signing_key() -> Ed25519PrivateKey:
    return Ed25519PrivateKey.generate()


def verification_bytes(key: Ed25519PrivateKey) -> bytes:
    return key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)


def sign(key: Ed25519PrivateKey, data: bytes) -> bytes:
    return key.sign(data)


def verify(public: bytes, signature: object, data: bytes) -> bool:
    """True iff `signature` is a valid Ed25519 signature of `data` under the raw key `public`."""
    if not isinstance(signature, bytes) or len(signature) != SIGNATURE_BYTES:
        return False
    try:
        Ed25519PublicKey.from_public_bytes(public).verify(signature, data)
    except (InvalidSignature, ValueError):
        return False
    return True


def agree(private: X25519PrivateKey, peer_public: bytes, purpose: str, round_id: int) -> bytes:
    """32-byte key shared by the two ends: HKDF-SHA256(X25519(private, peer), info=purpose|round)."""
    if not isinstance(peer_public, bytes) or len(peer_public) != KEY_BYTES:
        raise ProtocolError(f"public key must be {KEY_BYTES} bytes")
    try:
        shared = private.exchange(X25519PublicKey.from_public_bytes(peer_public))
    except ValueError as e:  # all-zero shared secret: a low-order public key
        raise ProtocolError(f"key agreement failed: {e}") from None
    info = f"dpfl-secagg/{purpose}/round={int(round_id)}".encode()
    return HKDF(algorithm=hashes.SHA256(), length=KEY_BYTES, salt=None, info=info).derive(shared)
